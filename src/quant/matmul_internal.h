// Internal contracts between matmul.cpp (dispatch + reference) and the ISA-specific kernel files.
// Shapes as in matmul.h: x [M, w.cols] f32, y [M, w.rows] f32, y = x · Wᵀ. Formats here are the
// non-GGUF ones (F32, F16, BF16, MlxAffine). Tests call each path directly to compare it with
// matmul_ref on odd sizes.
#pragma once
#include <cstdint>

#include "quant/weight.h"

namespace g4::detail {

// Row r of an MlxAffine matrix: packed stream, and scale/bias of group k.
inline const uint8_t* row_ptr(const WeightView& w, int64_t r) {
  return static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
}
inline int64_t groups_per_row(const WeightView& w) { return w.cols / w.group_size; }

// True when this CPU can run the *_avx512.cpp kernels (F, BW, VL, DQ, FMA, F16C), and the
// environment variable G4_NO_AVX512 is unset or "0".
bool cpu_has_avx512();

// True when this CPU can run the *_avx2.cpp kernels (AVX2, FMA, F16C), and G4_NO_AVX2 is unset
// or "0".
bool cpu_has_avx2();
// AVX2 path for CPUs without AVX-512 (matmul_avx2.cpp): direct kernels on the packed rows for
// every M, 8 values per step, per-group scale·Σ(x·q) + bias·Σx.
void matmul_avx2(const float* x, int64_t M, const WeightView& w, float* y);

// Portable (no ISA flags) path: dequantizes NB rows at a time into a per-thread buffer with
// dequant_row, then f32 dot products with 8 partial sums; threads over rows.
void matmul_portable(const float* x, int64_t M, const WeightView& w, float* y);

// AVX-512 path (only call when cpu_has_avx512()). M <= 16: reads the packed rows directly
// (LUT / shift-mask unpacking in registers, fp32 FMA), up to 4 x rows per pass over a block of
// L1-resident rows; M > 16: dequantizes 4 rows at a time into a buffer and runs a 4x4
// register-blocked f32 micro-kernel over all x rows.
void matmul_avx512(const float* x, int64_t M, const WeightView& w, float* y);
// SIMD dequantization of one row; bit-identical to dequant_row (scale*q then + bias, no FMA).
void dequant_row_avx512(const WeightView& w, int64_t r, float* out);

// AMX-BF16 prefill path (matmul_amx_avx512.cpp): true when the CPU has AMX-TILE, AMX-BF16 and
// AVX512-BF16, the kernel granted tile state, and G4_NO_AMX is unset or "0".
bool amx_available();
// Shapes the AMX path takes: M >= 8, cols % 32 == 0, MlxAffine or BF16 weights.
bool amx_supports(const WeightView& w, int64_t M);
// y = x · Wᵀ with x split into three bf16 parts (exact), f32 accumulation; only call when
// amx_available() && amx_supports(w, M).
void matmul_amx(const float* x, int64_t M, const WeightView& w, float* y);

}  // namespace g4::detail
