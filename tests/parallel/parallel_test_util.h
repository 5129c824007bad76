// Test helpers for tensor parallelism: ranks as threads, random weights in the formats the sharded
// layers are checked with, and the relative error measure max |Δ| / max |ref|.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "parallel/communicator.h"
#include "quant/affine_quantize.h"
#include "../quant/gguf_test_util.h"
#include "../quant/quant_test_util.h"

namespace g4::test {

// Runs fn(comm) on one thread per communicator of the group and waits for all of them.
inline void run_ranks(std::vector<std::unique_ptr<Communicator>>& group,
                      const std::function<void(Communicator&)>& fn) {
  std::vector<std::thread> threads;
  for (auto& c : group) threads.emplace_back([&fn, &c] { fn(*c); });
  for (auto& t : threads) t.join();
}

// The weight formats the tensor-parallel layers are checked with.
enum class TpFormat { F32, BF16, Q8_0, Q4_K, Q6_K, Mlx4g64 };

inline std::string tp_format_name(TpFormat f) {
  switch (f) {
    case TpFormat::F32: return "F32";
    case TpFormat::BF16: return "BF16";
    case TpFormat::Q8_0: return "Q8_0";
    case TpFormat::Q4_K: return "Q4_K";
    case TpFormat::Q6_K: return "Q6_K";
    case TpFormat::Mlx4g64: return "Mlx4g64";
  }
  return "?";
}

// A random GGUF matrix [rows, cols] of format f: random blocks with finite f16 scales.
inline OwnedWeight random_gguf(WFormat f, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<uint8_t> blocks = random_blocks(f, rows, cols, rng);
  OwnedWeight o;
  o.data.resize(blocks.size() / 4 + 1);
  std::memcpy(o.data.data(), blocks.data(), blocks.size());
  o.view = WeightView{f, rows, cols, o.data.data(), gguf_row_bytes(f, cols)};
  return o;
}

// A random [rows, cols] matrix in format f. Float formats: N(0, 1) values (BF16 rounded); MLX:
// N(0, 1) values through affine_quantize (4 bits, groups of 64, f32 scales); GGUF: random_gguf.
inline OwnedWeight random_weight(TpFormat f, int64_t rows, int64_t cols, uint32_t seed) {
  switch (f) {
    case TpFormat::Q8_0: return random_gguf(WFormat::GgufQ8_0, rows, cols, seed);
    case TpFormat::Q4_K: return random_gguf(WFormat::GgufQ4_K, rows, cols, seed);
    case TpFormat::Q6_K: return random_gguf(WFormat::GgufQ6_K, rows, cols, seed);
    case TpFormat::F32: return random_float(rows, cols, WFormat::F32, seed);
    case TpFormat::BF16: return random_float(rows, cols, WFormat::BF16, seed);
    case TpFormat::Mlx4g64: break;
  }
  const int bits = 4, group = 64;
  const std::vector<float> v = random_x(rows * cols, seed);
  OwnedWeight o;
  o.data.resize(v.size() * bits / 32);
  o.scales.resize(v.size() / group * 4);
  o.biases.resize(v.size() / group * 4);
  affine_quantize(v.data(), v.size(), bits, group, false, reinterpret_cast<uint8_t*>(o.data.data()),
                  reinterpret_cast<float*>(o.scales.data()), reinterpret_cast<float*>(o.biases.data()));
  o.view = mlx_affine_view(o.data.data(), rows, cols, bits, group, o.scales.data(), o.biases.data(), DType::F32);
  return o;
}

// The two matrices a and b (same format and columns) stacked along rows: [a.rows + b.rows, cols].
inline OwnedWeight stack_rows(const WeightView& a, const WeightView& b) {
  OwnedWeight o;
  const size_t da = size_t(a.rows * a.row_bytes), db = size_t(b.rows * b.row_bytes);
  o.data.resize((da + db + 3) / 4);
  std::memcpy(o.data.data(), a.data, da);
  std::memcpy(reinterpret_cast<uint8_t*>(o.data.data()) + da, b.data, db);
  o.view = a;
  o.view.rows = a.rows + b.rows;
  o.view.data = o.data.data();
  if (a.fmt == WFormat::MlxAffine) {
    const size_t row_sb = size_t(a.cols / a.group_size) * dtype_size(a.scale_dtype);
    for (auto [dst, pa, pb] : {std::tuple{&o.scales, a.scales, b.scales}, std::tuple{&o.biases, a.biases, b.biases}}) {
      dst->resize(row_sb * size_t(a.rows + b.rows));
      std::memcpy(dst->data(), pa, row_sb * size_t(a.rows));
      std::memcpy(dst->data() + row_sb * size_t(a.rows), pb, row_sb * size_t(b.rows));
    }
    o.view.scales = o.scales.data();
    o.view.biases = o.biases.data();
  }
  return o;
}

// max |a - b| / max |b| (b the reference).
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return den > 0 ? num / den : num;
}

// "cpu_Q4_K_2ranks": a test-case name for a backend, format and rank count.
inline std::string tp_case_name(const std::string& backend, TpFormat f, int ranks) {
  return backend + "_" + tp_format_name(f) + "_" + std::to_string(ranks) + "ranks";
}

// A backend of the given kind ("cpu" or "reference"): each rank makes its own.
inline std::unique_ptr<Backend> backend_of(const std::string& kind) {
  return kind == "cpu" ? make_cpu_backend() : make_reference_backend();
}

}  // namespace g4::test
