// gguf_matmul_f32 (dequantize + f32 dot) and gguf_matmul_fast (int8 activations + integer block
// dot products), both threaded over output rows; activation quantization (gguf_act.h).
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "quant/gguf_act.h"
#include "quant/gguf_amx.h"
#include "quant/gguf_blocks.h"
#include "quant/gguf_quant.h"
#include "quant/matmul.h"
#include "core/dtype.h"

namespace g4 {
namespace gguf {

namespace {

// Round to nearest, ties to even (as ggml's nearest_int), for |v| <= 127.5.
inline int round_q(float v) { return int(std::nearbyint(v)); }

}  // namespace

// Quantizes n values to int8, q = round(x * 127/amax), exactly as ggml does for the activations
// of its dot products, and returns the block scale as ggml stores it (0 for an all-zero block):
// for Q8_0 blocks (n = 32) amax/127 rounded to f16, for Q8_K super-blocks (n = 256) 1/(127/amax).
float quantize_block(const float* x, int n, int8_t* q) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0) {
    std::fill(q, q + n, int8_t(0));
    return 0.f;
  }
  const float id = 127.f / amax;
  for (int i = 0; i < n; ++i) q[i] = int8_t(std::clamp(round_q(x[i] * id), -127, 127));
  return act_block_scale(n, amax, id);
}

void quantize_act_k(const float* x, int64_t M, int64_t cols, Layout layout, ActK* a) {
  const int64_t nsb = cols / QKK;
  a->nsb = nsb;
  a->qs.resize(size_t(M * nsb * QKK));
  a->d.resize(size_t(M * nsb));
  a->bs16.resize(size_t(M * nsb * 16));
  a->bs32.resize(size_t(M * nsb * 8));
  static constexpr int kPermPos[8] = {0, 2, 1, 3, 4, 6, 5, 7};  // sub-block s -> slot
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t i = 0; i < nsb; ++i) {
      const int64_t k = m * nsb + i;
      int8_t q[QKK];
      a->d[k] = quantize_block(x + m * cols + i * QKK, QKK, q);
      int16_t* b16 = &a->bs16[k * 16];
      int16_t* b32 = &a->bs32[k * 8];
      for (int g = 0; g < 16; ++g) {
        int s = 0;
        for (int l = 0; l < 16; ++l) s += q[16 * g + l];
        b16[g] = int16_t(s);
      }
      for (int s = 0; s < 8; ++s) b32[s] = int16_t(b16[2 * s] + b16[2 * s + 1]);
      int8_t* dst = &a->qs[k * QKK];
      if (layout == Layout::KPerm) {
        for (int s = 0; s < 8; ++s) std::copy(q + 32 * s, q + 32 * s + 32, dst + 32 * kPermPos[s]);
      } else {
        std::copy(q, q + QKK, dst);
      }
    }
  }
}

void quantize_act_pair(const float* x, int64_t M, int64_t cols, int bias, ActPair* a) {
  const int64_t nb = cols / QK, np = (nb + 1) / 2;
  a->npair = np;
  a->qs.resize(size_t(M * np * 64));
  a->dx.resize(size_t(M * np * 16));
  a->init.resize(size_t(M * np * 16));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t p = 0; p < np; ++p) {
      const int64_t k = m * np + p;
      int8_t* qs = &a->qs[k * 64];
      float* dx = &a->dx[k * 16];
      int32_t* init = &a->init[k * 16];
      std::fill(init, init + 16, 0);
      for (int h = 0; h < 2; ++h) {
        const int64_t blk = 2 * p + h;
        int8_t q[QK] = {};
        float d = 0;
        if (blk < nb) d = quantize_block(x + m * cols + blk * QK, QK, q);
        int sum = 0;
        for (int l = 0; l < QK; ++l) sum += q[l];
        std::copy(q, q + 32, qs + 32 * h);
        std::fill(dx + 8 * h, dx + 8 * h + 8, d);
        init[8 * h] = -bias * sum;
      }
    }
  }
}

bool cpu_has_avx512_vnni() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                         cpu_has_f16c() && __builtin_cpu_supports("fma");
  return ok;
}

}  // namespace gguf

namespace {

// Rows per parallel_for chunk so that a chunk streams at least ~16 KiB of weights (~1 µs of
// work; the pool hands a region over in well under that).
int64_t min_rows_per_chunk(const WeightView& w, int64_t M) {
  const int64_t bytes = std::max<int64_t>(1, w.row_bytes * std::max<int64_t>(1, M));
  return std::max<int64_t>(1, (int64_t(16) << 10) / bytes);
}

float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[k + j] * b[k + j];
  for (; k < n; ++k) acc[0] += a[k] * b[k];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

}  // namespace

void gguf_matmul_f32(const float* x, int64_t M, const WeightView& w, float* y) {
  G4_CHECK(gguf_validate(w, "gguf_matmul_f32").is_ok());
  if (M <= 0) return;
  auto body = [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> row;
    row.resize(size_t(w.cols));
    for (int64_t r = r0; r < r1; ++r) {
      gguf_dequant_row(w, r, row.data());
      for (int64_t m = 0; m < M; ++m) y[m * w.rows + r] = dot_f32(x + m * w.cols, row.data(), w.cols);
    }
  };
  parallel_for(w.rows, std::ref(body), min_rows_per_chunk(w, M));  // std::ref: no std::function allocation
}

void gguf_matmul_fast(const float* x, int64_t M, const WeightView& w, float* y) {
  using namespace gguf;
  G4_CHECK(gguf_validate(w, "gguf_matmul_fast").is_ok());
  if (M <= 0) return;
  if (!cpu_has_avx512_vnni()) {
    gguf_matmul_f32(x, M, w, y);
    return;
  }
  const bool amx = M >= amx_min_rows(w.fmt) && amx_enabled();
  if (amx || batch_invariant()) {
    // Batch-invariant mode: below the AMX switch-over (or without AMX) the VNNI kernel with
    // matmul_amx's per-element chain, so every row's result is the same at any M.
    thread_local ActAmx a;
    quantize_act_amx(x, M, w.cols, gguf_block_size(w.fmt), &a);
    if (amx) matmul_amx(w.fmt, w, a, M, y);
    else matmul_amx_order(w.fmt, w, a, M, y);
    return;
  }
  const int64_t chunk = min_rows_per_chunk(w, M);
  switch (w.fmt) {
    case WFormat::GgufQ4_K:
    case WFormat::GgufQ5_K:
    case WFormat::GgufQ6_K: {
      thread_local ActK a;
      quantize_act_k(x, M, w.cols, w.fmt == WFormat::GgufQ6_K ? Layout::KNatural : Layout::KPerm, &a);
      const ActK* ap = &a;  // the caller's buffer: workers have their own (empty) thread_local
      auto body = [&w, ap, M, y](int64_t r0, int64_t r1) {
        rows_k_avx512(w.data, w.row_bytes, w.fmt, *ap, M, r0, r1, y, w.rows);
      };
      parallel_for(w.rows, std::ref(body), chunk);
      break;
    }
    default: {
      thread_local ActPair a;
      const int bias = w.fmt == WFormat::GgufQ8_0 ? 128 : w.fmt == WFormat::GgufQ4_0 ? 8 : 16;
      quantize_act_pair(x, M, w.cols, bias, &a);
      const ActPair* ap = &a;
      auto body = [&w, ap, M, y](int64_t r0, int64_t r1) {
        rows_pair_avx512(w.data, w.row_bytes, w.fmt, w.cols / QK, *ap, M, r0, r1, y, w.rows);
      };
      parallel_for(w.rows, std::ref(body), chunk);
      break;
    }
  }
}

}  // namespace g4
