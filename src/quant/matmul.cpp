// Reference dequantization / matmul for F32, F16, BF16 and MLX affine weights, plus the dispatch
// of matmul_fast to the best kernel for this CPU. GGUF formats go to gguf_quant.h.
// Mirrors MLX: ops.cpp `dequantize` (w = scale*q + bias, product rounded before the add; checked
// bit-for-bit against mlx.core.dequantize by tests/quant/mlx_vectors_test.cpp).
#include "quant/matmul.h"
#include "quant/gguf_amx.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "quant/gguf_quant.h"
#include "quant/matmul_internal.h"

namespace g4 {
namespace {

bool is_gguf(WFormat f) { return f >= WFormat::GgufQ4_0; }

// Value q of element i of an MLX bit stream (LSB first, little-endian bytes; spec §3.4).
// Reads only the bytes that hold bits [i*b, (i+1)*b), so it never reads past the row.
inline uint32_t mlx_q(const uint8_t* row, int64_t i, int b) {
  int64_t bit = i * b;
  int64_t byte = bit >> 3;
  int shift = int(bit & 7);
  uint32_t v = row[byte] >> shift;
  if (shift + b > 8) v |= uint32_t(row[byte + 1]) << (8 - shift);
  return v & ((1u << b) - 1u);
}

}  // namespace

Status validate_weight(const WeightView& w, const char* name) {
  if (!w.valid()) return err("%s: empty weight view", name);
  switch (w.fmt) {
    case WFormat::F32:
    case WFormat::F16:
    case WFormat::BF16: {
      int64_t es = w.fmt == WFormat::F32 ? 4 : 2;
      if (w.row_bytes < w.cols * es || w.row_bytes % es != 0)
        return err("%s: row_bytes %lld too small for %lld %s columns", name, (long long)w.row_bytes,
                   (long long)w.cols, std::string(wformat_name(w.fmt)).c_str());
      return Status::ok();
    }
    case WFormat::MlxAffine: {
      if (w.bits != 2 && w.bits != 3 && w.bits != 4 && w.bits != 5 && w.bits != 6 && w.bits != 8)
        return err("%s: unsupported MLX quantization bits %d", name, w.bits);
      if (w.group_size != 32 && w.group_size != 64 && w.group_size != 128)
        return err("%s: unsupported MLX group size %d", name, w.group_size);
      if (w.cols % w.group_size != 0)
        return err("%s: %lld columns not a multiple of group size %d", name, (long long)w.cols,
                   w.group_size);
      if (w.row_bytes < w.cols * w.bits / 8 || w.row_bytes % 4 != 0)
        return err("%s: row_bytes %lld does not hold %lld %d-bit values", name,
                   (long long)w.row_bytes, (long long)w.cols, w.bits);
      if (!w.scales || !w.biases) return err("%s: missing scales or biases", name);
      if (w.scale_dtype != DType::F32 && w.scale_dtype != DType::F16 && w.scale_dtype != DType::BF16)
        return err("%s: scales dtype %s is not f32/f16/bf16", name,
                   std::string(dtype_name(w.scale_dtype)).c_str());
      return Status::ok();
    }
    default:
      return Status::ok();  // GGUF formats: validated by their loader (gguf_quant.h)
  }
}

// Never contract scale*q + bias into an FMA (MLX rounds the product), whatever the build flags.
__attribute__((optimize("fp-contract=off"))) void dequant_row(const WeightView& w, int64_t r, float* out) {
  const uint8_t* row = detail::row_ptr(w, r);
  switch (w.fmt) {
    case WFormat::F32:
      std::memcpy(out, row, size_t(w.cols) * 4);
      return;
    // 16-bit rows may sit at odd addresses (safetensors data offsets need only be byte-aligned):
    // load_float copies each value out.
    case WFormat::F16:
      for (int64_t c = 0; c < w.cols; ++c) out[c] = load_float(row, DType::F16, size_t(c));
      return;
    case WFormat::BF16:
      for (int64_t c = 0; c < w.cols; ++c) out[c] = load_float(row, DType::BF16, size_t(c));
      return;
    case WFormat::MlxAffine: {
      const int64_t ng = detail::groups_per_row(w);
      for (int64_t k = 0; k < ng; ++k) {
        const float s = load_float(w.scales, w.scale_dtype, size_t(r * ng + k));
        const float b = load_float(w.biases, w.scale_dtype, size_t(r * ng + k));
        for (int64_t c = k * w.group_size; c < (k + 1) * w.group_size; ++c) {
          // Two roundings, as MLX: this file is built without FMA, so no contraction happens.
          const float p = s * float(mlx_q(row, c, w.bits));
          out[c] = p + b;
        }
      }
      return;
    }
    default:
      gguf_dequant_row(w, r, out);
      return;
  }
}

void dequant_row_native(const WeightView& w, int64_t r, float* out) {
  if (w.fmt != WFormat::MlxAffine || w.scale_dtype == DType::F32) {
    dequant_row(w, r, out);
    return;
  }
  const uint8_t* row = detail::row_ptr(w, r);
  const int64_t ng = detail::groups_per_row(w);
  const bool bf = w.scale_dtype == DType::BF16;
  auto rt = [bf](float v) { return bf ? round_bf16(v) : round_f16(v); };
  for (int64_t k = 0; k < ng; ++k) {
    const float s = load_float(w.scales, w.scale_dtype, size_t(r * ng + k));
    const float b = load_float(w.biases, w.scale_dtype, size_t(r * ng + k));
    for (int64_t c = k * w.group_size; c < (k + 1) * w.group_size; ++c)
      out[c] = rt(rt(s * float(mlx_q(row, c, w.bits))) + b);  // each MLX op rounds to T
  }
}

void matmul_ref(const float* x, int64_t M, const WeightView& w, float* y) {
  std::vector<float> wr(size_t(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    dequant_row(w, r, wr.data());
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * w.cols;
      double acc = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) acc += double(xm[c]) * double(wr[c]);
      y[m * w.rows + r] = float(acc);
    }
  }
}

namespace {
bool g_batch_invariant = false;
}  // namespace
void set_batch_invariant(bool on) { g_batch_invariant = on; }
bool batch_invariant() { return g_batch_invariant; }

void matmul_fast(const float* x, int64_t M, const WeightView& w, float* y) {
  if (M <= 0 || w.rows <= 0) return;
  if (is_gguf(w.fmt)) {
    gguf_matmul_fast(x, M, w, y);
    return;
  }
  if (detail::cpu_has_avx512()) {
    if (detail::amx_supports(w, M) && detail::amx_available()) {
      detail::matmul_amx(x, M, w, y);
      return;
    }
    detail::matmul_avx512(x, M, w, y);
  } else if (detail::cpu_has_avx2()) {
    detail::matmul_avx2(x, M, w, y);
  } else {
    detail::matmul_portable(x, M, w, y);
  }
}

namespace detail {

bool cpu_has_avx512() {
  static const bool ok = [] {
    if (const char* e = std::getenv("G4_NO_AVX512"); e && std::strcmp(e, "0") != 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma") && cpu_has_f16c();
  }();
  return ok;
}

bool cpu_has_avx2() {
  static const bool ok = [] {
    if (const char* e = std::getenv("G4_NO_AVX2"); e && std::strcmp(e, "0") != 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  }();
  return ok;
}

void matmul_portable(const float* x, int64_t M, const WeightView& w, float* y) {
  constexpr int64_t NB = 4;  // weight rows dequantized per buffer fill
  const int64_t cols = w.cols;
  const int64_t tiles = (w.rows + NB - 1) / NB;
  const int64_t min_chunk = std::max<int64_t>(1, 16384 / (cols * NB * std::max<int64_t>(M, 1)));
  parallel_for(tiles, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> buf;
    if (buf.size() < size_t(NB * cols)) buf.resize(size_t(NB * cols));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t * NB, nr = std::min(NB, w.rows - r0);
      for (int64_t i = 0; i < nr; ++i) dequant_row(w, r0 + i, buf.data() + i * cols);
      for (int64_t m = 0; m < M; ++m) {
        const float* xm = x + m * cols;
        for (int64_t i = 0; i < nr; ++i) {
          const float* wr = buf.data() + i * cols;
          float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          int64_t c = 0;
          for (; c + 8 <= cols; c += 8)
            for (int j = 0; j < 8; ++j) s[j] += xm[c + j] * wr[c + j];
          for (; c < cols; ++c) s[c & 7] += xm[c] * wr[c];
          y[m * w.rows + r0 + i] = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
        }
      }
    }
  }, min_chunk);
}

}  // namespace detail
}  // namespace g4
