// Prompt caches on disk (`serve --prompt-cache DIR`): the prefix cache's entries (a token list and
// its KV state, KvCache::save_state) written to DIR so that a restarted server starts with them.
//
// One file an entry, DIR/<hash of the tokens>.g4kv, written atomically (core/atomic_file.h) by a
// writer thread, so the engine step only pays for copying the state to the host:
//   "G4PROMPT" (8 bytes), u32 format version, u32 key bytes, key, u32 tokens, u64 state bytes,
//   u32 CRC-32 (zlib) of the tokens' and the state's bytes, i32 tokens[], state.
// The key names the model file and every option the KV's numbers depend on (backend, activation
// dtype, KV quantization, adapters: cmd_serve's prompt_cache_key); an entry is only read back
// under the same key and format version. A file that is not whole, fails its checksum or holds
// another key is skipped with a warning and left as it is (it may be another server's); entries
// of this key are bounded in bytes on disk, the oldest written removed first, and an entry whose
// tokens begin a newer entry's is removed as the prefix cache drops it.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace g4 {

class PromptStore {
 public:
  // Lists DIR's entries of this key (creating DIR when missing); warnings go to `warn`.
  PromptStore(std::string dir, std::string key, size_t max_bytes, std::function<void(const std::string&)> warn);
  ~PromptStore();  // writes what is queued, then stops the writer
  PromptStore(const PromptStore&) = delete;
  PromptStore& operator=(const PromptStore&) = delete;

  // The entries read back whole and checked, newest first, while their states' bytes stay within
  // `budget`: take(tokens, state) for each; take returns false to stop.
  void load(size_t budget, const std::function<bool(std::vector<int32_t>, std::vector<uint8_t>)>& take);
  // Queues an entry for the writer (dropped, with a warning, when over a second of writes are queued).
  void save(std::vector<int32_t> tokens, std::vector<uint8_t> state);
  // Waits until the queue is written.
  void flush();

  size_t bytes() const;
  size_t entries() const;
  const std::string& dir() const { return dir_; }

 private:
  struct Entry {
    std::string path;
    std::vector<int32_t> tokens;
    size_t bytes = 0;  // the file's
    int64_t written_ns = 0;
  };
  struct Pending {
    std::vector<int32_t> tokens;
    std::vector<uint8_t> state;
  };
  void scan();
  void writer_loop();
  void write(Pending p);  // writer thread

  std::string dir_, key_;
  size_t max_bytes_;
  std::function<void(const std::string&)> warn_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::vector<Entry> index_;  // this key's entries on disk
  std::deque<Pending> queue_;
  size_t queued_bytes_ = 0;
  bool busy_ = false, stop_ = false;
  std::thread writer_;
};

// The entry file's bytes, and its parse (false with a reason when it is not a whole entry of
// this key); shared with the tests.
std::string encode_prompt_entry(const std::string& key, const std::vector<int32_t>& tokens,
                                const std::vector<uint8_t>& state);
bool decode_prompt_entry(const std::string& bytes, const std::string& key, std::vector<int32_t>* tokens,
                         std::vector<uint8_t>* state, std::string* why);

}  // namespace g4
