// KV events over ZeroMQ, in the wire format vLLM publishes and llm-d's KV-cache indexer and NVIDIA
// Dynamo's KV router read (runtime/kv_events.h says what the events mean):
//   a PUB socket; each batch one 3-part message [topic, sequence (8-byte big-endian, from 0),
//   payload]; payload = msgpack array [ts (float64 UNIX seconds), [event, ...], data-parallel
//   rank (0)]; events are msgpack arrays, tag first:
//     ["BlockStored", [hash, ...], parent hash | nil, [token, ...], block_size, lora_id | nil,
//      medium, lora_name | nil]
//     ["BlockRemoved", [hash, ...], medium]
//     ["AllBlocksCleared"]
//   medium: "GPU" when the KV is in device memory, else "CPU".
// The endpoint is bound when it holds a wildcard ("tcp://*:5557") or is ipc:// / inproc://, else
// connected to (vLLM's rule). An optional ROUTER replay endpoint answers a request [start sequence
// (8-byte big-endian)] with every kept batch from there, as [sequence, payload] messages, then
// [-1 (8 bytes), empty]: a subscriber that saw a gap catches up.
//
// libzmq is opened at run time (libzmq.so.5): the binary runs without it, and only
// --kv-events-endpoint needs it (an error names the library when it is missing).
// Sockets live on the publisher's own thread; publish() only queues (a bounded queue: past
// max_queue batches the oldest is dropped and counted, as a router must never stall the engine).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "runtime/kv_events.h"

namespace g4::server {

struct KvEventsOptions {
  std::string endpoint;         // e.g. tcp://*:5557 (empty: no events)
  std::string replay_endpoint;  // e.g. tcp://*:5558 (empty: no replay)
  std::string topic;            // llm-d reads "kv@<pod>@<model>"
  std::string medium = "CPU";   // "GPU" for device KV
  int block_size = 16;          // tokens per block (vLLM's default)
  size_t replay_batches = 10000;
  size_t max_queue = 100000;
};

// The msgpack payload of one batch (the format above).
std::string encode_kv_event_batch(double ts, const std::vector<KvEvent>& events, const std::string& medium);

class KvEventPublisher : public KvEventSink {
 public:
  // Loads libzmq, opens the sockets (errors name the library or the endpoint and zmq's reason).
  static Result<std::shared_ptr<KvEventPublisher>> open(const KvEventsOptions& opt);
  ~KvEventPublisher() override;  // sends what is queued (for up to a second), closes
  void publish(std::vector<KvEvent> batch) override;
  uint64_t sent() const { return sent_.load(); }
  uint64_t dropped() const { return dropped_.load(); }

 private:
  struct Zmq;
  explicit KvEventPublisher(KvEventsOptions opt);
  void run(std::promise<Status>* ready);
  Status open_sockets();
  void send_batch(const std::vector<KvEvent>& batch);
  void serve_replay();

  KvEventsOptions opt_;
  std::unique_ptr<Zmq> zmq_;
  void* ctx_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;
  uint64_t seq_ = 0;
  std::deque<std::pair<uint64_t, std::string>> kept_;  // replay: (sequence, payload), oldest first
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<KvEvent>> queue_;
  bool stop_ = false;
  std::atomic<uint64_t> sent_{0}, dropped_{0};
  std::thread thread_;
};

}  // namespace g4::server
