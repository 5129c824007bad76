// The f32 ops of llama.cpp's Gemma 3 graph as its CPU backend computes them (the `ggml` backend;
// reference build: llama-cpp-python 0.3.36, AVX-512, see quant/ggml_exact.h). Each function names
// the ggml routine whose floating-point order it reproduces. Needs AVX-512 (F/DQ); callers check.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace g4::ggml_ops {

// ggml_compute_forward_rms_norm_f32 (+ the MUL by w when w != null): per row, the sum of x*x
// (products in f32) accumulated in double, mean = float(sum / dim), s = 1/sqrtf(mean + eps),
// y = (x * s) * w.
void rms_norm(const float* x, int rows, int dim, const float* w, float eps, float* y);

// ggml_compute_forward_rope_f32, NEOX mode (pairs j, j + n_dims/2), n_dims = head_dim, no YaRN:
// theta_scale = powf(base, -2/n_dims); for pair i the angle freq_scale * (pos * theta_scale^i)
// with the power built by repeated f32 multiplication; cosf / sinf. x [rows, heads, head_dim],
// row r at position pos0 + r; in place.
void rope_neox(float* x, int rows, int heads, int head_dim, int pos0, float base, float freq_scale);

// llama.cpp's non-flash attention with an f32 KV cache (kq = K·(q*scale) by ggml_vec_dot_f32,
// soft_max_ext with ggml_v_expf and a double sum over 16-wide chunks, kqv by llamafile's f32
// tinyBLAS when the batch has >= 2 rows (batch_rows) and by ggml_vec_dot_f32 at one row).
// Shapes as Backend::attention.
void attention(const float* q, int H, const std::vector<AttnSeq>& seqs, float scale, int batch_rows,
               float* out);

}  // namespace g4::ggml_ops
