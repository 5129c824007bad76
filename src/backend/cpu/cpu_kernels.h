// SIMD kernels of the fast CPU backend for f32 activations (ActPrecision::F32 only: the bf16
// parity path keeps HostBackend's scalar kernels, which reproduce MLX's rounding). Each kernel
// computes the same math as the HostBackend op it replaces, in a different summation order
// (and with polynomial exp/tanh accurate to a few ulp), so results agree to ~1e-6 relative.
// Call the *_avx512 functions only when detail::cpu_has_avx512() (quant/matmul_internal.h).
#pragma once
#include <cstddef>

#include "backend/backend.h"

namespace g4::cpu {

// Attention of the `group` query heads that share KV head g, for one query row over the keys at
// positions keys.lo..keys.hi (visible_keys; HostBackend::attend_one for each of those heads, with
// K and V rows loaded once per group). q: [group, D] (consecutive heads), out: [group, D].
// scratch: >= group * (keys.hi - keys.lo + 1) floats, 64-byte aligned not required. Quantized caches: rows dequantized as kv_head_row does.
void attend_group_avx512(const float* q, int group, const KvBuffer& kv, int g, KeyRange keys, float scale,
                         float* scratch, float* out);

// out = gelu_tanh(gate) * up (HostBackend::gelu_mul with P == F32).
void gelu_mul_avx512(const float* gate, const float* up, size_t n, float* out);
// x = tanh(x / cap) * cap in place.
void softcap_avx512(float* x, size_t n, float cap);
// RMSNorm rows (HostBackend::rms_norm with P == F32); w may be null.
void rms_norm_avx512(const float* x, int rows, int dim, const float* w, float eps, float* y);
// y = a + b.
void add_avx512(const float* a, const float* b, size_t n, float* y);

}  // namespace g4::cpu
