// Matrix products and row lookups on packed weights (any WFormat).
// Shapes: x is [M, w.cols] f32 row-major; y is [M, w.rows] f32 row-major; y = x · Wᵀ.
// The reference versions are scalar and obviously correct; the fast versions (threads + SIMD)
// must agree with them (tests/quant) and are what the CPU backend calls.
// MlxAffine (spec §3.4): bits in {2,3,4,5,6,8}, group_size in {32,64,128}, cols % group_size == 0,
// scales/biases f32/f16/bf16 (scales may be negative); w = scale*q + bias in f32.
#pragma once
#include <cstdint>

#include "core/status.h"
#include "quant/weight.h"

namespace g4 {

// Checks that a view's fields describe a matrix these functions can read (bits, group size,
// row_bytes, scale dtype). Call once at load time; the functions below assume a valid view.
// The error names `name` (the tensor).
Status validate_weight(const WeightView& w, const char* name);

// Exact dequantization of row r into out[0, w.cols) (f32). MlxAffine: bit-identical to
// mlx.core.dequantize with f32 scales (scale*q rounded to f32, then + bias).
void dequant_row(const WeightView& w, int64_t r, float* out);

// Row r as mlx.core.dequantize returns it in the scales' dtype T (what MLX's embedding lookup
// yields when the model runs in T): round_T(round_T(scale*q) + bias), as f32 values. Equal to
// dequant_row for f32 scales and for the float formats.
void dequant_row_native(const WeightView& w, int64_t r, float* out);

// Scalar reference: dequant_row per row, dot products accumulated in double.
void matmul_ref(const float* x, int64_t M, const WeightView& w, float* y);
// Threads (core/thread_pool.h) + SIMD on the packed data, never dequantizing a whole matrix.
// Picks, by runtime CPU check: AMX-BF16 for M >= 8 (MlxAffine/BF16, x split into 3 exact bf16
// parts), else AVX-512, else AVX2+FMA, else portable C++; GGUF formats go to gguf_matmul_fast.
// Non-GGUF results differ from matmul_ref only by f32 summation order (tests: |Δ| <= 2e-6·Σ|x·w|).
// G4_NO_AMX / G4_NO_AVX512 / G4_NO_AVX2 = 1 turn a path off (for comparisons).
void matmul_fast(const float* x, int64_t M, const WeightView& w, float* y);

// Batch-invariant numerics: when on, matmul_fast computes every row of y with the same
// per-element arithmetic whatever M is, so a sequence's logits do not depend on which other rows
// share the forward pass (continuous batching, chunked prefill, prefix-cache hits). GGUF: AMX
// tiles from the usual switch-over and, below it or without AMX, gguf_amx.h's matmul_amx_order
// (the AMX chain on VNNI; decode at nearly the speed of the default kernels). MlxAffine / float
// weights: their AMX path from M = 1 (slower decode). Off by default.
// Set before running; not synchronised with running matmuls.
void set_batch_invariant(bool on);
bool batch_invariant();

}  // namespace g4
