#include "runtime/prompt_store.h"

#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "core/atomic_file.h"

namespace g4 {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'G', '4', 'P', 'R', 'O', 'M', 'P', 'T'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxKey = 1 << 16, kMaxTokens = 1 << 24;
constexpr size_t kMaxQueuedBytes = size_t(2) << 30;  // about a second of disk writes

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
bool get(std::string_view& s, T* v) {
  if (s.size() < sizeof(T)) return false;
  std::memcpy(v, s.data(), sizeof(T));
  s.remove_prefix(sizeof(T));
  return true;
}
uint32_t crc(const void* p, size_t n, uint32_t c = 0) {
  const auto* b = static_cast<const Bytef*>(p);
  c = c ? c : uint32_t(crc32(0L, Z_NULL, 0));
  while (n > 0) {  // zlib takes uInt lengths
    const uInt k = uInt(std::min<size_t>(n, size_t(1) << 30));
    c = uint32_t(crc32(c, b, k));
    b += k;
    n -= k;
  }
  return c;
}
std::string entry_name(const std::vector<int32_t>& tokens) {
  const size_t h = std::hash<std::string_view>{}(
      std::string_view(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(int32_t)));
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016zx-%zu.g4kv", h, tokens.size());
  return buf;
}
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
bool starts_with(const std::vector<int32_t>& whole, const std::vector<int32_t>& part) {
  return part.size() <= whole.size() && std::equal(part.begin(), part.end(), whole.begin());
}

// Header fields up to the checksum; false (with why) when `s` does not begin a whole header.
struct Header {
  std::string key;
  uint32_t n_tokens = 0, checksum = 0;
  uint64_t state_bytes = 0;
};
bool parse_header(std::string_view& s, Header* h, std::string* why) {
  uint32_t version = 0, key_len = 0;
  if (s.size() < sizeof kMagic || std::memcmp(s.data(), kMagic, sizeof kMagic) != 0) {
    *why = "not a prompt-cache entry";
    return false;
  }
  s.remove_prefix(sizeof kMagic);
  if (!get(s, &version) || !get(s, &key_len)) {
    *why = "the header ends early";
    return false;
  }
  if (version != kVersion) {
    *why = "format version " + std::to_string(version) + ", this build reads " + std::to_string(kVersion);
    return false;
  }
  if (key_len > kMaxKey || s.size() < key_len) {
    *why = "the header ends early";
    return false;
  }
  h->key.assign(s.data(), key_len);
  s.remove_prefix(key_len);
  if (!get(s, &h->n_tokens) || !get(s, &h->state_bytes) || !get(s, &h->checksum)) {
    *why = "the header ends early";
    return false;
  }
  if (h->n_tokens == 0 || h->n_tokens > kMaxTokens) {
    *why = "it holds " + std::to_string(h->n_tokens) + " tokens";
    return false;
  }
  return true;
}

}  // namespace

std::string encode_prompt_entry(const std::string& key, const std::vector<int32_t>& tokens,
                                const std::vector<uint8_t>& state) {
  std::string s(kMagic, sizeof kMagic);
  put(s, kVersion);
  put(s, uint32_t(key.size()));
  s += key;
  put(s, uint32_t(tokens.size()));
  put(s, uint64_t(state.size()));
  const size_t tb = tokens.size() * sizeof(int32_t);
  put(s, crc(state.data(), state.size(), crc(tokens.data(), tb)));
  s.append(reinterpret_cast<const char*>(tokens.data()), tb);
  s.append(reinterpret_cast<const char*>(state.data()), state.size());
  return s;
}

bool decode_prompt_entry(const std::string& bytes, const std::string& key, std::vector<int32_t>* tokens,
                         std::vector<uint8_t>* state, std::string* why) {
  std::string_view s(bytes);
  Header h;
  if (!parse_header(s, &h, why)) return false;
  if (h.key != key) {
    *why = "made for another model or other options (" + h.key + ")";
    return false;
  }
  const size_t tb = size_t(h.n_tokens) * sizeof(int32_t);
  if (s.size() != tb + h.state_bytes) {
    *why = "it holds " + std::to_string(s.size()) + " bytes after its header, not " + std::to_string(tb + h.state_bytes);
    return false;
  }
  if (crc(s.data() + tb, h.state_bytes, crc(s.data(), tb)) != h.checksum) {
    *why = "its checksum does not match its contents";
    return false;
  }
  tokens->resize(h.n_tokens);
  std::memcpy(tokens->data(), s.data(), tb);
  state->assign(s.begin() + ptrdiff_t(tb), s.end());
  return true;
}

PromptStore::PromptStore(std::string dir, std::string key, size_t max_bytes,
                         std::function<void(const std::string&)> warn)
    : dir_(std::move(dir)), key_(std::move(key)), max_bytes_(max_bytes), warn_(std::move(warn)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) warn_(dir_ + ": cannot create the prompt-cache folder: " + ec.message());
  scan();
  writer_ = std::thread([this] { writer_loop(); });
}

PromptStore::~PromptStore() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

// Reads every *.g4kv file's header and tokens (not its state: load checks that).
void PromptStore::scan() {
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file() || it->path().extension() != ".g4kv") continue;
    const std::string path = it->path().string();
    std::ifstream f(path, std::ios::binary);
    std::string head(sizeof kMagic + 8 + kMaxKey + 16, '\0');
    f.read(head.data(), std::streamsize(head.size()));
    head.resize(size_t(f.gcount()));
    std::string_view s(head);
    Header h;
    std::string why;
    if (!parse_header(s, &h, &why)) {
      warn_(path + ": skipped: " + why);
      continue;
    }
    if (h.key != key_) continue;  // another model's or options' entry: not ours to read or remove
    Entry e;
    e.path = path;
    e.tokens.resize(h.n_tokens);
    const size_t hdr = head.size() - s.size();
    f.clear();
    f.seekg(std::streamoff(hdr));
    f.read(reinterpret_cast<char*>(e.tokens.data()), std::streamsize(e.tokens.size() * sizeof(int32_t)));
    if (size_t(f.gcount()) != e.tokens.size() * sizeof(int32_t)) {
      warn_(path + ": skipped: the file ends early");
      continue;
    }
    e.bytes = size_t(fs::file_size(it->path(), ec));
    e.written_ns = int64_t(
        std::chrono::duration_cast<std::chrono::nanoseconds>(fs::last_write_time(it->path(), ec).time_since_epoch())
            .count());
    index_.push_back(std::move(e));
  }
  if (ec) warn_(dir_ + ": cannot list the prompt-cache folder: " + ec.message());
  std::sort(index_.begin(), index_.end(), [](const Entry& a, const Entry& b) { return a.written_ns > b.written_ns; });
}

void PromptStore::load(size_t budget, const std::function<bool(std::vector<int32_t>, std::vector<uint8_t>)>& take) {
  std::vector<Entry> entries;
  {
    std::lock_guard<std::mutex> lk(mu_);
    entries = index_;  // newest first
  }
  size_t used = 0;
  for (const Entry& e : entries) {
    if (used + e.bytes > budget) continue;
    std::ifstream f(e.path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<int32_t> tokens;
    std::vector<uint8_t> state;
    std::string why;
    if (!decode_prompt_entry(bytes, key_, &tokens, &state, &why)) {
      warn_(e.path + ": skipped: " + why);
      std::lock_guard<std::mutex> lk(mu_);
      index_.erase(std::remove_if(index_.begin(), index_.end(), [&](const Entry& x) { return x.path == e.path; }),
                   index_.end());
      continue;
    }
    used += e.bytes;
    if (!take(std::move(tokens), std::move(state))) break;
  }
}

void PromptStore::save(std::vector<int32_t> tokens, std::vector<uint8_t> state) {
  if (tokens.empty()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (queued_bytes_ + state.size() > kMaxQueuedBytes) {
      warn_("prompt cache: the disk is behind; an entry of " + std::to_string(tokens.size()) + " tokens is not saved");
      return;
    }
    queued_bytes_ += state.size();
    queue_.push_back(Pending{std::move(tokens), std::move(state)});
  }
  cv_.notify_all();
}

void PromptStore::flush() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
}

void PromptStore::writer_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, nothing left to write
    Pending p = std::move(queue_.front());
    queue_.pop_front();
    queued_bytes_ -= p.state.size();
    busy_ = true;
    lk.unlock();
    write(std::move(p));
    lk.lock();
    busy_ = false;
    idle_cv_.notify_all();
  }
}

void PromptStore::write(Pending p) {
  const std::string bytes = encode_prompt_entry(key_, p.tokens, p.state);
  if (bytes.size() > max_bytes_) return;  // larger than the whole budget
  const std::string path = (fs::path(dir_) / entry_name(p.tokens)).string();
  if (Status st = write_file_atomic(path, bytes); !st) {
    warn_("prompt cache: " + st.message());
    return;
  }
  std::vector<std::string> remove;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // The same path (the same tokens) is replaced; an entry that begins the new one is redundant.
    auto redundant = [&](const Entry& e) { return e.path == path || starts_with(p.tokens, e.tokens); };
    for (const Entry& e : index_)
      if (redundant(e) && e.path != path) remove.push_back(e.path);
    index_.erase(std::remove_if(index_.begin(), index_.end(), redundant), index_.end());
    index_.insert(index_.begin(), Entry{path, std::move(p.tokens), bytes.size(), now_ns()});
    size_t total = 0;
    for (const Entry& e : index_) total += e.bytes;
    while (total > max_bytes_ && index_.size() > 1) {
      total -= index_.back().bytes;
      remove.push_back(index_.back().path);
      index_.pop_back();
    }
  }
  std::error_code ec;
  for (const std::string& r : remove) fs::remove(r, ec);
}

size_t PromptStore::bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t t = 0;
  for (const Entry& e : index_) t += e.bytes;
  return t;
}

size_t PromptStore::entries() const {
  std::lock_guard<std::mutex> lk(mu_);
  return index_.size();
}

}  // namespace g4
