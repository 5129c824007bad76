// Buf: a typed view of backend memory (activations, caches, index lists), the currency of the
// Backend interface (backend.h). It carries the element type, the extent and where the memory is;
// it owns nothing (the backend that allocated the memory frees it).
//
// Views of caller memory: a Buf made from a host pointer (float*, int32_t*) is host memory of
// unknown extent (n = 0). Host backends take such views (tests and host callers pass vectors'
// data() directly); device backends refuse them where they need their own memory.
// Element access: host code asks for the typed pointer (f32(), i32()), which checks the dtype, so
// nothing reads bf16 storage as floats or ints as floats.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"

namespace g4 {

struct Buf {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t n = 0;     // elements; 0: unknown (a view of caller memory)
  int device = -1;   // -1: host memory; >= 0: memory of that GPU

  Buf() = default;
  Buf(void* p, DType t, int64_t count, int dev) : data(p), dtype(t), n(count), device(dev) {}
  // Host memory views (implicit: host callers pass plain arrays).
  Buf(float* p) : data(p), dtype(DType::F32) {}                                // NOLINT
  Buf(const float* p) : data(const_cast<float*>(p)), dtype(DType::F32) {}      // NOLINT
  Buf(int32_t* p) : data(p), dtype(DType::I32) {}                              // NOLINT
  Buf(const int32_t* p) : data(const_cast<int32_t*>(p)), dtype(DType::I32) {}  // NOLINT
  Buf(std::nullptr_t) {}                                                       // NOLINT

  explicit operator bool() const { return data != nullptr; }
  bool on_host() const { return device < 0; }
  size_t elem_bytes() const { return dtype_size(dtype); }
  // The view that starts `elems` elements in (same dtype and device).
  Buf at(int64_t elems) const {
    Buf b = *this;
    b.data = static_cast<uint8_t*>(data) + elems * int64_t(elem_bytes());
    b.n = n > elems ? n - elems : 0;
    return b;
  }
  // Typed host access (checked: the dtype must match).
  float* f32() const {
    G4_CHECK(dtype == DType::F32 && "Buf::f32 on a buffer of another dtype");
    return static_cast<float*>(data);
  }
  int32_t* i32() const {
    G4_CHECK(dtype == DType::I32 && "Buf::i32 on a buffer of another dtype");
    return static_cast<int32_t*>(data);
  }
  template <class T>
  T* as() const { return static_cast<T*>(data); }
};

}  // namespace g4
