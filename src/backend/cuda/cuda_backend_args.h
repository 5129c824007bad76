// The CUDA backend's argument plumbing (the CudaBackend files only): backend views and buffers turned
// into the kernels' argument structs, checked; a launch's step key (cuda_step.h) from its
// arguments; the KV cache's host-side position bookkeeping; the shape tests that pick a kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string_view>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mma_small.h"
#include "backend/cuda/cuda_step.h"
#include "core/status.h"

namespace g4::cuda_args {

inline size_t view_data_bytes(const WeightView& w) { return size_t(w.rows) * size_t(w.row_bytes); }
inline size_t view_scale_bytes(const WeightView& w) {
  if (w.fmt != WFormat::MlxAffine || w.group_size <= 0) return 0;
  return size_t(w.rows) * size_t(w.cols / w.group_size) * dtype_size(w.scale_dtype);
}

inline cuda::DevWeight dev(const WeightView& w) {
  cuda::DevWeight d{};  // value-initialized: its bytes are part of a step's key
  d.fmt = w.fmt;
  d.rows = w.rows;
  d.cols = w.cols;
  d.row_bytes = w.row_bytes;
  d.data = static_cast<const uint8_t*>(w.data);
  d.bits = w.bits;
  d.group_size = w.group_size;
  d.scales = w.scales;
  d.biases = w.biases;
  d.scale_dtype = w.scale_dtype;
  return d;
}

// The key words of one launch argument (cuda_step.h): pointers by address, numbers by value
// (floats by their bits), enums by value, the kernels' argument structs by their bytes.
template <class T>
void add_key(cuda::StepRecorder& rec, const T& v) {
  if constexpr (std::is_pointer_v<T>) {
    rec.key(reinterpret_cast<uintptr_t>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    const float f = float(v);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    rec.key(bits);
  } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
    rec.key(uint64_t(int64_t(v)));
  } else {
    static_assert(std::is_trivially_copyable_v<T>, "launch arguments are plain values");
    uint64_t w[(sizeof(T) + 7) / 8] = {};
    std::memcpy(w, &v, sizeof(T));
    for (uint64_t x : w) rec.key(x);
  }
}
inline uint64_t name_key(std::string_view op) { return std::hash<std::string_view>{}(op); }

// A device-to-device copy as a launcher (Backend::copy_bytes): a kernel (cuda::copy_bytes says why).
inline void copy_device(cudaStream_t s, const void* src, size_t bytes, void* dst) { cuda::copy_bytes(s, src, bytes, dst); }

// A buffer that must be f32 (logits, router weights, top-k outputs).
inline float* F(const Buf& b) {
  if (!b) return nullptr;
  G4_CHECK(b.dtype == DType::F32 && "cuda backend: an f32 buffer expected");
  return static_cast<float*>(b.data);
}
// The activation type shared by buffers (F32 or BF16; the kernels' T, cuda_act.cuh), checked.
inline DType act_type(std::initializer_list<const Buf*> bufs) {
  DType t = DType::Unknown;
  for (const Buf* b : bufs) {
    if (!*b) continue;
    G4_CHECK((b->dtype == DType::F32 || b->dtype == DType::BF16) && "cuda backend: activations are f32 or bf16");
    G4_CHECK((t == DType::Unknown || t == b->dtype) && "cuda backend: activation buffers of different dtypes");
    t = b->dtype;
  }
  return t == DType::Unknown ? DType::F32 : t;
}
inline int32_t* I(const Buf& b) {
  if (!b) return nullptr;
  G4_CHECK(b.dtype == DType::I32 && "cuda backend: an I32 buffer expected");
  return static_cast<int32_t*>(b.data);
}

// A KV buffer's quantized storage as the kernels take it (bits 0: plain rows).
inline cuda::KvQuantArgs quant_args(const KvBuffer& kv) {
  cuda::KvQuantArgs q{};
  if (!kv.quantized()) return q;
  q.bits = kv.quant.bits;
  q.group = kv.quant.group_size;
  q.group_shift = q.group == 32 ? 5 : q.group == 64 ? 6 : 7;  // validate_kv_options: 32, 64 or 128
  q.bf16_params = kv.quant.bf16_params;
  q.kq = kv.kq;
  q.vq = kv.vq;
  q.ks = kv.ks;
  q.kb = kv.kb;
  q.vs = kv.vs;
  q.vb = kv.vb;
  return q;
}
// A paged cache's log2(positions per block) as the kernels take it (0: not paged).
inline int block_shift(const KvBuffer& kv) {
  int s = 0;
  while (kv.paged() && (1 << s) < kv.block) ++s;
  G4_CHECK((!kv.paged() || (1 << s) == kv.block) && "cuda backend: KV blocks of a power-of-two size");
  return s;
}
// The cache slots a write fills record their positions (host bookkeeping, backend.h).
inline void record_positions(const AttnSeq& s) {
  const KvBuffer& kv = s.kv;
  for (int t = 0; t < s.n; ++t) {
    const int pos = s.pos0 + t;
    const int64_t slot = kv_slot(kv, pos);
    G4_CHECK(slot >= 0 && slot < kv.stored_slots());
    kv.pos[slot] = pos;
  }
}

// Whether every held expert's device rows start on 16-byte boundaries (the data, row_bytes and
// the stride between experts).
inline bool rows16(const ExpertStack& s) {
  const cuda::DevWeight d = dev(s.base);
  return ((reinterpret_cast<uintptr_t>(d.data) | uintptr_t(d.row_bytes) | uintptr_t(s.stride)) & 15) == 0;
}
// Whether an input norm of M rows of `cols` fits the matmul kernels' shared memory (or there is none).
inline bool norm_fits(const InputNorm& norm, int M, int64_t cols) {
  return !norm.w || cuda::matmul_norm_smem(M, cols) <= 40 * 1024;
}
// Whether M rows of x into `cols`-wide weights take the few-row tensor-core kernel
// (cuda_mma_small.h: its input normed beforehand, its epilogues separate launches).
inline bool small_rows(const Buf& x, int M, int64_t cols) {
  return cuda::small_mma_rows(act_type({&x}), M, cols);
}

}  // namespace g4::cuda_args
