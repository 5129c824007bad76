#include "server/kv_event_publisher.h"

#include <dlfcn.h>
#include <zmq.h>

#include <chrono>
#include <cstring>

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

namespace g4::server {

// The libzmq functions used, from the library opened at run time.
struct KvEventPublisher::Zmq {
  void* lib = nullptr;
  void* (*ctx_new)() = nullptr;
  int (*ctx_term)(void*) = nullptr;
  void* (*socket)(void*, int) = nullptr;
  int (*close)(void*) = nullptr;
  int (*setsockopt)(void*, int, const void*, size_t) = nullptr;
  int (*getsockopt)(void*, int, void*, size_t*) = nullptr;
  int (*bind)(void*, const char*) = nullptr;
  int (*connect)(void*, const char*) = nullptr;
  int (*send)(void*, const void*, size_t, int) = nullptr;
  int (*recv)(void*, void*, size_t, int) = nullptr;
  int (*poll)(zmq_pollitem_t*, int, long) = nullptr;
  int (*errno_)() = nullptr;
  const char* (*strerror)(int) = nullptr;

  ~Zmq() {
    if (lib) dlclose(lib);
  }
  Status load() {
    for (const char* name : {"libzmq.so.5", "libzmq.so"})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (!lib) return err("KV events need libzmq (libzmq.so.5; Debian: apt install libzmq5): %s", dlerror());
    auto sym = [this](const char* s, auto& fn) -> bool {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, s));
      return fn != nullptr;
    };
    if (!sym("zmq_ctx_new", ctx_new) || !sym("zmq_ctx_term", ctx_term) || !sym("zmq_socket", socket) ||
        !sym("zmq_close", close) || !sym("zmq_setsockopt", setsockopt) || !sym("zmq_getsockopt", getsockopt) ||
        !sym("zmq_bind", bind) || !sym("zmq_connect", connect) || !sym("zmq_send", send) ||
        !sym("zmq_recv", recv) || !sym("zmq_poll", poll) || !sym("zmq_errno", errno_) ||
        !sym("zmq_strerror", strerror))
      return err("KV events: libzmq lacks a function this build calls (%s)", dlerror());
    return {};
  }
  std::string last_error() const { return strerror(errno_()); }
};

namespace {

void pack_string(msgpack::packer<msgpack::sbuffer>& pk, const std::string& s) {
  pk.pack_str(uint32_t(s.size()));
  pk.pack_str_body(s.data(), uint32_t(s.size()));
}

void pack_hashes(msgpack::packer<msgpack::sbuffer>& pk, const std::vector<uint64_t>& hashes) {
  pk.pack_array(uint32_t(hashes.size()));
  for (uint64_t h : hashes) pk.pack_uint64(h);
}

std::string be64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((v >> (56 - 8 * i)) & 0xff);
  return s;
}

// vLLM's rule: bind where the endpoint names no single peer.
bool binds(const std::string& ep) {
  return ep.find('*') != std::string::npos || ep.find("::") != std::string::npos || ep.rfind("ipc://", 0) == 0 ||
         ep.rfind("inproc://", 0) == 0;
}

}  // namespace

std::string encode_kv_event_batch(double ts, const std::vector<KvEvent>& events, const std::string& medium) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(&buf);
  pk.pack_array(3);
  pk.pack_double(ts);
  pk.pack_array(uint32_t(events.size()));
  for (const KvEvent& e : events) {
    switch (e.kind) {
      case KvEvent::Kind::Stored:
        pk.pack_array(8);
        pack_string(pk, "BlockStored");
        pack_hashes(pk, e.hashes);
        if (e.has_parent) pk.pack_uint64(e.parent);
        else pk.pack_nil();
        pk.pack_array(uint32_t(e.tokens.size()));
        for (int32_t t : e.tokens) pk.pack_uint32(uint32_t(t));
        pk.pack_int(e.block_size);
        if (e.tag != 0) pk.pack_uint64(e.tag);
        else pk.pack_nil();
        pack_string(pk, medium);
        if (!e.lora_name.empty()) pack_string(pk, e.lora_name);
        else pk.pack_nil();
        break;
      case KvEvent::Kind::Removed:
        pk.pack_array(3);
        pack_string(pk, "BlockRemoved");
        pack_hashes(pk, e.hashes);
        pack_string(pk, medium);
        break;
      case KvEvent::Kind::Cleared:
        pk.pack_array(1);
        pack_string(pk, "AllBlocksCleared");
        break;
    }
  }
  pk.pack_int(0);  // data-parallel rank
  return std::string(buf.data(), buf.size());
}

KvEventPublisher::KvEventPublisher(KvEventsOptions opt) : opt_(std::move(opt)) {}

Result<std::shared_ptr<KvEventPublisher>> KvEventPublisher::open(const KvEventsOptions& opt) {
  if (opt.endpoint.empty()) return err("KV events: no endpoint given");
  if (opt.block_size < 1) return err("KV events: block size %d is not positive", opt.block_size);
  std::shared_ptr<KvEventPublisher> p(new KvEventPublisher(opt));
  p->zmq_ = std::make_unique<Zmq>();
  G4_TRY(p->zmq_->load());
  std::promise<Status> ready;
  std::future<Status> opened = ready.get_future();
  p->thread_ = std::thread([raw = p.get(), &ready] { raw->run(&ready); });
  Status st = opened.get();
  if (!st) {
    p->thread_.join();
    return Error{st.message()};
  }
  return p;
}

Status KvEventPublisher::open_sockets() {
  Zmq& z = *zmq_;
  ctx_ = z.ctx_new();
  if (!ctx_) return err("KV events: zmq_ctx_new failed: %s", z.last_error().c_str());
  pub_ = z.socket(ctx_, ZMQ_PUB);
  const int hwm = 100000, linger_ms = 1000;
  z.setsockopt(pub_, ZMQ_SNDHWM, &hwm, sizeof hwm);
  z.setsockopt(pub_, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
  const std::string& ep = opt_.endpoint;
  if ((binds(ep) ? z.bind(pub_, ep.c_str()) : z.connect(pub_, ep.c_str())) != 0)
    return err("KV events: cannot %s %s: %s", binds(ep) ? "bind" : "connect to", ep.c_str(), z.last_error().c_str());
  if (!opt_.replay_endpoint.empty()) {
    replay_ = z.socket(ctx_, ZMQ_ROUTER);
    const int zero = 0;
    z.setsockopt(replay_, ZMQ_LINGER, &zero, sizeof zero);
    if (z.bind(replay_, opt_.replay_endpoint.c_str()) != 0)
      return err("KV events: cannot bind the replay endpoint %s: %s", opt_.replay_endpoint.c_str(),
                 z.last_error().c_str());
  }
  return {};
}

void KvEventPublisher::run(std::promise<Status>* ready) {
  Status st = open_sockets();
  const bool ok = st.is_ok();
  ready->set_value(std::move(st));  // `ready` is gone after this
  if (ok) {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait_for(lock, std::chrono::milliseconds(replay_ ? 50 : 1000), [this] { return stop_ || !queue_.empty(); });
      while (!queue_.empty()) {
        std::vector<KvEvent> batch = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        send_batch(batch);
        lock.lock();
      }
      if (stop_) break;
      if (replay_) {
        lock.unlock();
        serve_replay();
        lock.lock();
      }
    }
  }
  Zmq& z = *zmq_;
  if (pub_) z.close(pub_);
  if (replay_) z.close(replay_);
  if (ctx_) z.ctx_term(ctx_);  // waits up to the PUB socket's linger for queued messages
  pub_ = replay_ = ctx_ = nullptr;
}

void KvEventPublisher::send_batch(const std::vector<KvEvent>& batch) {
  Zmq& z = *zmq_;
  const double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string payload = encode_kv_event_batch(ts, batch, opt_.medium);
  const std::string seq = be64(seq_);
  z.send(pub_, opt_.topic.data(), opt_.topic.size(), ZMQ_SNDMORE);
  z.send(pub_, seq.data(), seq.size(), ZMQ_SNDMORE);
  z.send(pub_, payload.data(), payload.size(), 0);
  ++sent_;
  if (replay_) {
    kept_.emplace_back(seq_, std::move(payload));
    if (kept_.size() > opt_.replay_batches) kept_.pop_front();
  }
  ++seq_;
}

// One replay request, when one is waiting: [identity, empty, start sequence].
void KvEventPublisher::serve_replay() {
  Zmq& z = *zmq_;
  zmq_pollitem_t item{replay_, 0, ZMQ_POLLIN, 0};
  if (z.poll(&item, 1, 0) <= 0 || !(item.revents & ZMQ_POLLIN)) return;
  std::vector<std::string> parts;
  for (int more = 1; more;) {
    char buf[256];
    const int n = z.recv(replay_, buf, sizeof buf, 0);
    if (n < 0) return;
    parts.emplace_back(buf, size_t(std::min<int>(n, int(sizeof buf))));
    size_t len = sizeof more;
    if (z.getsockopt(replay_, ZMQ_RCVMORE, &more, &len) != 0) return;
  }
  if (parts.size() != 3 || parts[2].size() != 8) return;  // not a replay request: ignored
  uint64_t start = 0;
  for (char c : parts[2]) start = (start << 8) | uint8_t(c);
  const std::string& id = parts[0];
  auto reply = [&](const std::string& seq, const std::string& payload) {
    z.send(replay_, id.data(), id.size(), ZMQ_SNDMORE);
    z.send(replay_, "", 0, ZMQ_SNDMORE);
    z.send(replay_, seq.data(), seq.size(), ZMQ_SNDMORE);
    z.send(replay_, payload.data(), payload.size(), 0);
  };
  for (const auto& [seq, payload] : kept_)
    if (seq >= start) reply(be64(seq), payload);
  reply(be64(~uint64_t(0)), "");  // -1: the end
}

void KvEventPublisher::publish(std::vector<KvEvent> batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= opt_.max_queue) {
      queue_.pop_front();
      ++dropped_;
    }
    queue_.push_back(std::move(batch));
  }
  cv_.notify_one();
}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

}  // namespace g4::server
