// Matrix products and row lookups on packed weights (any WFormat).
// Shapes: x is [M, w.cols] f32 row-major; y is [M, w.rows] f32 row-major; y = x · Wᵀ.
// The reference versions are scalar and obviously correct; the fast versions (threads + SIMD)
// must agree with them (tests/quant) and are what the CPU backend calls.
#pragma once
#include <cstdint>

#include "quant/weight.h"

namespace g4 {

// Exact dequantization of row r into out[0, w.cols) (f32).
void dequant_row(const WeightView& w, int64_t r, float* out);

void matmul_ref(const float* x, int64_t M, const WeightView& w, float* y);
void matmul_fast(const float* x, int64_t M, const WeightView& w, float* y);

}  // namespace g4
