// A weight matrix as stored on disk, viewed without copying: the logical matrix is
// [rows, cols] = [out_features, in_features], row-major, in one of several storage formats.
// Matrix products read this packed data directly; nothing dequantizes a whole matrix.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace g4 {

enum class WFormat : uint8_t {
  F32,
  F16,
  BF16,
  MlxAffine,  // MLX affine: uint32 words, `bits` per value, LSB-first bit stream per row;
              // w = scale * q + bias per group of `group_size` columns (spec §3.4).
  GgufQ4_0,
  GgufQ5_0,
  GgufQ8_0,
  GgufQ4_K,
  GgufQ5_K,
  GgufQ6_K,
};

std::string_view wformat_name(WFormat f);

struct WeightView {
  WFormat fmt = WFormat::F32;
  int64_t rows = 0;  // out features (or vocabulary size for an embedding table)
  int64_t cols = 0;  // in features (or embedding width)
  const void* data = nullptr;  // row r starts at (const uint8_t*)data + r * row_bytes
  int64_t row_bytes = 0;

  // MlxAffine only.
  int bits = 0;
  int group_size = 0;
  const void* scales = nullptr;  // [rows, cols / group_size] of scale_dtype
  const void* biases = nullptr;  // same shape and dtype as scales
  DType scale_dtype = DType::BF16;

  bool valid() const { return data != nullptr && rows > 0 && cols > 0; }
};

// A dense f32 matrix [rows, cols], rows back to back (the LoRA adapters' matrices).
inline WeightView f32_view(const float* data, int64_t rows, int64_t cols) {
  WeightView v;
  v.fmt = WFormat::F32;
  v.rows = rows;
  v.cols = cols;
  v.data = data;
  v.row_bytes = cols * 4;
  return v;
}

// An MLX affine matrix [rows, cols] over packed words and per-group scales/biases (spec §3.4):
// rows are rows*cols*bits/32 words long, back to back.
inline WeightView mlx_affine_view(const void* words, int64_t rows, int64_t cols, int bits,
                                  int group_size, const void* scales, const void* biases,
                                  DType scale_dtype) {
  WeightView v;
  v.fmt = WFormat::MlxAffine;
  v.rows = rows;
  v.cols = cols;
  v.data = words;
  v.row_bytes = cols * bits / 8;
  v.bits = bits;
  v.group_size = group_size;
  v.scales = scales;
  v.biases = biases;
  v.scale_dtype = scale_dtype;
  return v;
}

}  // namespace g4
