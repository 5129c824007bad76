// Test helpers for tests/io: a temporary directory and a safetensors writer (format as in the
// safetensors spec: u64 LE header length, JSON header, data block), plus raw-byte writers for
// hostile files.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace g4test {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "g4io-XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    path_ = p ? p : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

 private:
  std::string path_;
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream o(path, std::ios::binary);
  o.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}
inline void write_text(const std::string& path, const std::string& s) {
  std::ofstream o(path, std::ios::binary);
  o << s;
}

inline std::vector<uint8_t> u64le(uint64_t v) {
  std::vector<uint8_t> b(8);
  for (int i = 0; i < 8; ++i) b[i] = uint8_t(v >> (8 * i));
  return b;
}

// A file image: header length, the header text as given, then `data`.
inline std::vector<uint8_t> raw_file(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> b = u64le(header.size());
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

struct T {
  std::string name;
  std::string dtype;  // safetensors dtype string
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
inline std::vector<uint8_t> bf16_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h = g4::f32_to_bf16(v[i]);
    std::memcpy(&b[2 * i], &h, 2);
  }
  return b;
}
// `n` bytes with a recognisable pattern (byte i = (seed + i) mod 251).
inline std::vector<uint8_t> pattern(size_t n, int seed = 0) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t((seed + i) % 251);
  return b;
}
inline int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}
inline size_t dsize(const std::string& dt) {
  if (dt == "F32" || dt == "U32" || dt == "I32") return 4;
  if (dt == "BF16" || dt == "F16" || dt == "U16" || dt == "I16") return 2;
  if (dt == "F64" || dt == "I64" || dt == "U64") return 8;
  return 1;
}
// Tensor of the given shape filled with the pattern (dtype-sized elements).
inline T pat(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, int seed = 0) {
  size_t n = size_t(numel(shape)) * dsize(dtype);
  return T{name, dtype, std::move(shape), pattern(n, seed)};
}

// A valid safetensors image with contiguous data in the given order, header padded to 8 bytes.
inline std::vector<uint8_t> st_image(const std::vector<T>& ts, const nlohmann::json& metadata = nullptr) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.is_null()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  std::vector<uint8_t> data;
  for (const auto& t : ts) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.data.size()}}};
    data.insert(data.end(), t.data.begin(), t.data.end());
    off += t.data.size();
  }
  std::string s = h.dump();
  while (s.size() % 8) s += ' ';
  return raw_file(s, data);
}
inline void write_st(const std::string& path, const std::vector<T>& ts, const nlohmann::json& metadata = nullptr) {
  write_bytes(path, st_image(ts, metadata));
}

}  // namespace g4test
