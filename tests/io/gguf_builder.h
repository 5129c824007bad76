// Test helper: writes GGUF images byte by byte (independent of the reader under test), following
// the format description in llama.cpp docs/gguf.md.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace g4::test {

struct GgufBytes {
  std::vector<uint8_t> b;
  template <class T>
  void put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
  }
  void u8(uint8_t v) { put(v); }
  void u32(uint32_t v) { put(v); }
  void u64(uint64_t v) { put(v); }
  void i64(int64_t v) { put(v); }
  void str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void pad_to(size_t align) {
    while (b.size() % align) b.push_back(0);
  }
  size_t size() const { return b.size(); }
};

// Value type ids (gguf.h).
enum : uint32_t { T_U8 = 0, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY,
                  T_U64, T_I64, T_F64 };

struct TensorSpec {
  std::string name;
  uint32_t type;
  std::vector<int64_t> ne;
  std::vector<uint8_t> data;   // exactly nbytes
  int64_t offset = -1;         // -1: next aligned position
};

// A whole file: header, the kv section written by `kv` (which must write n_kv entries), the
// tensor infos, padding, and the tensor data. The file ends right after the last tensor's data.
struct GgufImage {
  uint32_t version = 3;
  uint64_t n_kv = 0;
  GgufBytes kv;  // raw kv entries
  std::vector<TensorSpec> tensors;
  size_t alignment = 32;

  std::vector<uint8_t> build() const {
    GgufBytes o;
    o.b = {'G', 'G', 'U', 'F'};
    o.u32(version);
    o.u64(tensors.size());
    o.u64(n_kv);
    o.b.insert(o.b.end(), kv.b.begin(), kv.b.end());
    std::vector<uint64_t> offs;
    uint64_t next = 0;
    for (const auto& t : tensors) {
      uint64_t off = t.offset >= 0 ? uint64_t(t.offset) : next;
      offs.push_back(off);
      next = (off + t.data.size() + alignment - 1) / alignment * alignment;
    }
    for (size_t k = 0; k < tensors.size(); ++k) {
      const auto& t = tensors[k];
      o.str(t.name);
      o.u32(uint32_t(t.ne.size()));
      for (int64_t d : t.ne) o.i64(d);
      o.u32(t.type);
      o.u64(offs[k]);
    }
    o.pad_to(alignment);
    size_t base = o.size();
    size_t end = base;
    for (size_t k = 0; k < tensors.size(); ++k)
      if (!tensors[k].data.empty()) end = std::max(end, base + offs[k] + tensors[k].data.size());
    o.b.resize(end, 0);
    for (size_t k = 0; k < tensors.size(); ++k)
      if (!tensors[k].data.empty()) std::memcpy(o.b.data() + base + offs[k], tensors[k].data.data(), tensors[k].data.size());
    return o.b;
  }
};

// kv helpers
inline void kv_u32(GgufImage& im, const std::string& k, uint32_t v) {
  im.kv.str(k); im.kv.u32(T_U32); im.kv.u32(v); ++im.n_kv;
}
inline void kv_f32(GgufImage& im, const std::string& k, float v) {
  im.kv.str(k); im.kv.u32(T_F32); im.kv.put(v); ++im.n_kv;
}
inline void kv_str(GgufImage& im, const std::string& k, const std::string& v) {
  im.kv.str(k); im.kv.u32(T_STRING); im.kv.str(v); ++im.n_kv;
}
inline void kv_bool(GgufImage& im, const std::string& k, bool v) {
  im.kv.str(k); im.kv.u32(T_BOOL); im.kv.u8(v ? 1 : 0); ++im.n_kv;
}
inline void kv_str_array(GgufImage& im, const std::string& k, const std::vector<std::string>& v) {
  im.kv.str(k); im.kv.u32(T_ARRAY); im.kv.u32(T_STRING); im.kv.u64(v.size());
  for (const auto& s : v) im.kv.str(s);
  ++im.n_kv;
}

inline std::vector<uint8_t> filled(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + i * 7);
  return v;
}

}  // namespace g4::test
