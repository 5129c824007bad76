// GGUF (ggml) block-quantized weight formats: WFormat::GgufQ4_0, GgufQ5_0, GgufQ8_0, GgufQ4_K,
// GgufQ5_K, GgufQ6_K. A GGUF matrix [rows, cols] stores each row as cols / block_size blocks back to
// back (row r at (const uint8_t*)w.data + r * w.row_bytes); block layouts are ggml's
// (ggml-common.h; mirrored in numpy by the `gguf` package, gguf/quants.py).
// Shapes everywhere: x is [M, w.cols] f32 row-major; y is [M, w.rows] f32 row-major; y = x · Wᵀ.
#pragma once
#include <cstdint>

#include "core/status.h"
#include "quant/weight.h"

namespace g4 {

// True for the six Gguf* formats above.
bool is_gguf_format(WFormat f);
// Elements per block (32 or 256) and bytes per block; 0 for non-GGUF formats.
int gguf_block_size(WFormat f);
int gguf_block_bytes(WFormat f);
// Bytes of one row of `cols` values (cols must be a multiple of the block size), 0 otherwise.
int64_t gguf_row_bytes(WFormat f, int64_t cols);

// Checks a GGUF view before use (loader / validate_weight): known format, cols a multiple of the
// block size, row_bytes >= gguf_row_bytes, data set. The functions below G4_CHECK the same.
Status gguf_validate(const WeightView& w, const char* name);

// Exact dequantization of row r into out[0, w.cols), bit-identical to gguf.quants.dequantize
// (and to ggml's dequantize_row_*).
void gguf_dequant_row(const WeightView& w, int64_t r, float* out);

// Scalar reference: dequantizes each row and accumulates the dot product in double.
void gguf_matmul_ref(const float* x, int64_t M, const WeightView& w, float* y);

// Float-exact fast path: dequantizes each weight row once (per tile of x rows) and takes f32 dot
// products; multi-threaded over output rows. Differs from gguf_matmul_ref only by f32 rounding.
void gguf_matmul_f32(const float* x, int64_t M, const WeightView& w, float* y);

// Fast path (what the CPU backend calls): quantizes each row of x once per call to int8
// (d = amax/127 per 256 values for K-quants, per 32 otherwise, f32 scales; as ggml's Q8_K / Q8_0)
// and takes exact integer dot products per block, scaled in f32:
//   M >= 4..10 (gguf::amx_min_rows per format) with AMX-INT8 (Sapphire Rapids+): 16 weight rows
//          decoded to int8 once, 16x16 tiles
//          (gguf_amx_avx512.cpp);
//   else with AVX-512 VNNI: per-block vpmaddubsw/vpdpwssd/vpdpbusd kernels, each unpacked weight
//          block reused for 4 x rows (2 weight rows per pass at M = 1) (gguf_kernels_avx512.cpp);
//   else: the portable gguf_matmul_f32.
// Threaded over output rows. Error vs gguf_matmul_ref is the activation rounding only
// (normalized error ~0.5-0.8% on Gaussian x; tests bound it by 1e-2 and check the kernels
// against the reference applied to the rounded x to f32 accuracy).
// Thread-safe for concurrent calls (per-thread scratch), allocation-free after warm-up.
void gguf_matmul_fast(const float* x, int64_t M, const WeightView& w, float* y);

}  // namespace g4
