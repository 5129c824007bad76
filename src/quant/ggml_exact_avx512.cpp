// llama.cpp-exact GGUF matmuls (ggml_exact.h). Compiled with AVX-512 and -ffp-contract=off: every
// fused multiply-add below is explicit, in the place llama.cpp's kernel has one. Integer partial
// sums are exact, so only the grouping of the floating-point steps has to match; each kernel's
// comment names the llama.cpp routine whose per-element arithmetic it reproduces.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/ggml_exact.h"
#include "quant/gguf_act.h"
#include "quant/gguf_blocks.h"
#include "quant/gguf_quant.h"

namespace g4::ggml_exact {
using namespace g4::gguf;

namespace {

// hsum_float_8 (ggml x86 quants.c) and llamafile's hsum(__m256): (hi + lo), then pairs.
inline float hsum8(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// Exact Σ u[i] * s[i] over 32 / 16 values (u unsigned codes, s signed activation codes).
inline int32_t dot_u8_s8_32(const uint8_t* u, const int8_t* s) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u));
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  return hsum_i32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b));
}
inline int32_t dot_u8_s8_16(const uint8_t* u, const int8_t* s) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i p = _mm_dpbusd_epi32(_mm_setzero_si128(), a, b);
  __m128i t = _mm_add_epi32(p, _mm_unpackhi_epi64(p, p));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  return _mm_cvtsi128_si32(t);
}

// ---- activations, quantized as llama.cpp quantizes src1 -------------------------------------

struct Act32 {  // quantize_row_q8_0: per 32 values int8 codes and the f16-rounded scale
  int64_t nb = 0;
  std::vector<int8_t> q;  // [M][nb][32]
  std::vector<float> d;   // [M][nb]
};
struct Act256 {  // quantize_row_q8_K: per 256 values codes, scale and 16 sums of 16 codes
  int64_t nb = 0;
  std::vector<int8_t> q;      // [M][nb][256]
  std::vector<float> d;       // [M][nb]
  std::vector<int32_t> bsum;  // [M][nb][16]
};

void quantize32(const float* x, int64_t M, int64_t cols, Act32* a) {
  a->nb = cols / QK;
  a->q.resize(size_t(M * cols));
  a->d.resize(size_t(M * a->nb));
  for (int64_t k = 0; k < M * a->nb; ++k) a->d[k] = quantize_block(x + k * QK, QK, &a->q[k * QK]);
}

void quantize256(const float* x, int64_t M, int64_t cols, Act256* a) {
  a->nb = cols / QKK;
  a->q.resize(size_t(M * cols));
  a->d.resize(size_t(M * a->nb));
  a->bsum.resize(size_t(M * a->nb * 16));
  for (int64_t k = 0; k < M * a->nb; ++k) {
    int8_t* q = &a->q[k * QKK];
    a->d[k] = quantize_block(x + k * QKK, QKK, q);
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += q[16 * g + l];
      a->bsum[k * 16 + g] = s;
    }
  }
}

// ---- weight rows, decoded to codes and scales ------------------------------------------------

// Q8_0 / Q5_0 / Q4_0 block b of a row: signed codes w[32] (value = dw * w) and dw.
void decode_q0(WFormat f, const uint8_t* blk, int8_t* w, float* dw) {
  *dw = rdf16(blk);
  if (f == WFormat::GgufQ8_0) {
    std::memcpy(w, blk + 2, 32);
  } else if (f == WFormat::GgufQ5_0) {
    const uint32_t qh = rd32(blk + 2);
    const uint8_t* qs = blk + 6;
    for (int j = 0; j < 16; ++j) {
      w[j] = int8_t(((qs[j] & 15) | (((qh >> j) & 1) << 4)) - 16);
      w[j + 16] = int8_t(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
    }
  } else {  // Q4_0
    const uint8_t* qs = blk + 2;
    for (int j = 0; j < 16; ++j) {
      w[j] = int8_t((qs[j] & 15) - 8);
      w[j + 16] = int8_t((qs[j] >> 4) - 8);
    }
  }
}

// Q6_K super-block: unsigned codes u[256] in [0, 64) in value order, int8 scales per 16, dx.
void decode_q6k(const uint8_t* blk, uint8_t* u, int8_t* sc, float* dx) {
  const uint8_t* ql = blk;
  const uint8_t* qh = blk + 128;
  std::memcpy(sc, blk + 192, 16);
  *dx = rdf16(blk + 208);
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t hb = qh[32 * h + l];
      uint8_t* o = u + 128 * h;
      o[l] = uint8_t((ql[64 * h + l] & 15) | ((hb & 3) << 4));
      o[l + 32] = uint8_t((ql[64 * h + l + 32] & 15) | (((hb >> 2) & 3) << 4));
      o[l + 64] = uint8_t((ql[64 * h + l] >> 4) | (((hb >> 4) & 3) << 4));
      o[l + 96] = uint8_t((ql[64 * h + l + 32] >> 4) | (((hb >> 6) & 3) << 4));
    }
  }
}

// Q4_K super-block: codes u[256] in [0, 16) in value order, 6-bit scales and mins per 32, d, dmin.
void decode_q4k(const uint8_t* blk, uint8_t* u, uint8_t* sc, uint8_t* mn, float* dx, float* dmin) {
  *dx = rdf16(blk);
  *dmin = rdf16(blk + 2);
  for (int s = 0; s < 8; ++s) scale_min_k4(s, blk + 4, &sc[s], &mn[s]);
  const uint8_t* qs = blk + 16;
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      u[64 * c + l] = qs[32 * c + l] & 15;
      u[64 * c + 32 + l] = qs[32 * c + l] >> 4;
    }
  }
}

// ---- kernels (one weight row against all M activation rows) ----------------------------------

// tinyBLAS_Q0_AVX::gemm / ggml_vec_dot_q{8,5,4}_0_q8_0 (AVX2 bodies).
void row_q0(const WeightView& w, int64_t r, const Act32& a, int64_t M, float* y) {
  thread_local std::vector<int8_t> wq;
  thread_local std::vector<float> wd;
  const int64_t nb = a.nb, bb = gguf_block_bytes(w.fmt);
  wq.resize(size_t(nb * QK));
  wd.resize(size_t(nb));
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
  for (int64_t b = 0; b < nb; ++b) decode_q0(w.fmt, row + b * bb, &wq[b * QK], &wd[b]);
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* aq = &a.q[m * nb * QK];
    const float* ad = &a.d[m * nb];
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&wq[b * QK]));
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + b * QK));
      const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x),
                                            _mm256_sign_epi8(v, x));
      const float d = wd[b] * ad[b];
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc);
    }
    y[m * w.rows + r] = hsum8(acc);
  }
}

struct Q6Row {
  std::vector<uint8_t> u;
  std::vector<int8_t> sc;
  std::vector<float> dx;
};

void decode_q6k_row(const WeightView& w, int64_t r, int64_t nb, Q6Row* o) {
  o->u.resize(size_t(nb * QKK));
  o->sc.resize(size_t(nb * 16));
  o->dx.resize(size_t(nb));
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
  for (int64_t i = 0; i < nb; ++i) decode_q6k(row + i * kQ6_KBytes, &o->u[i * QKK], &o->sc[i * 16], &o->dx[i]);
}

// ggml_vec_dot_q6_K_q8_K (AVX2 body), for M < 8.
void row_q6k_vecdot(const WeightView& w, int64_t r, const Act256& a, int64_t M, float* y) {
  thread_local Q6Row x;
  const int64_t nb = a.nb;
  decode_q6k_row(w, r, nb, &x);
  for (int64_t m = 0; m < M; ++m) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      const int64_t k = m * nb + i;
      const float d = a.d[k] * x.dx[i];
      const uint8_t* u = &x.u[i * QKK];
      const int8_t* q = &a.q[k * QKK];
      const int8_t* sc = &x.sc[i * 16];
      const int32_t* bs = &a.bsum[k * 16];
      __m256i isum = _mm256_setzero_si256();
      for (int c = 0; c < 8; ++c) {  // 32-value chunks; lanes 0-3 use scale 2c, lanes 4-7 2c+1
        const __m256i p = _mm256_dpbusd_epi32(
            _mm256_setzero_si256(), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + 32 * c)),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * c)));
        const __m256i s = _mm256_setr_epi32(sc[2 * c], sc[2 * c], sc[2 * c], sc[2 * c], sc[2 * c + 1],
                                            sc[2 * c + 1], sc[2 * c + 1], sc[2 * c + 1]);
        isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(p, s));
      }
      alignas(32) int32_t sub[8];
      for (int L = 0; L < 8; ++L) sub[L] = 32 * (bs[2 * L] * sc[2 * L] + bs[2 * L + 1] * sc[2 * L + 1]);
      isum = _mm256_sub_epi32(isum, _mm256_load_si256(reinterpret_cast<const __m256i*>(sub)));
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    }
    y[m * w.rows + r] = hsum8(acc);
  }
}

// The tiled matmul's VNNI microkernel (tiled-kernel.cpp), for M >= 8: per super-block the exact
// integer dot S = Σ scale * (code - 32) * q8; out = fma(float(S) * dx, dy, out) (GCC contracts the
// kernel's _mm512_add_ps(buf, _mm512_mul_ps(result, d1)) into one fma).
void row_q6k_tiled(const WeightView& w, int64_t r, const Act256& a, int64_t M, float* y) {
  thread_local Q6Row x;
  const int64_t nb = a.nb;
  decode_q6k_row(w, r, nb, &x);
  for (int64_t m = 0; m < M; ++m) {
    float out = 0.f;
    for (int64_t i = 0; i < nb; ++i) {
      const int64_t k = m * nb + i;
      int32_t S = 0;
      for (int s = 0; s < 16; ++s) {
        const int32_t raw = dot_u8_s8_16(&x.u[i * QKK + 16 * s], &a.q[k * QKK + 16 * s]);
        S += int32_t(x.sc[i * 16 + s]) * (raw - 32 * a.bsum[k * 16 + s]);
      }
      const float t = float(S) * x.dx[i];
      out = std::fma(t, a.d[k], out);  // the build fuses the epilogue's buf + result * d1
    }
    y[m * w.rows + r] = out;
  }
}

// ggml_gemm_q4_K_8x8_q8_K (per_pair = true: one fma per 64 values, rows in the 4-row groups) and
// ggml_gemv_q4_K_8x8_q8_K (per_pair = false: one fma per 256 values, the remaining rows).
void row_q4k(const WeightView& w, int64_t r, const Act256& a, int64_t M, int64_t gemm_rows,
             float* y) {
  thread_local std::vector<uint8_t> u;
  thread_local std::vector<uint8_t> sc, mn;
  thread_local std::vector<float> dx, dmin;
  const int64_t nb = a.nb;
  u.resize(size_t(nb * QKK));
  sc.resize(size_t(nb * 8));
  mn.resize(size_t(nb * 8));
  dx.resize(size_t(nb));
  dmin.resize(size_t(nb));
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
  for (int64_t i = 0; i < nb; ++i)
    decode_q4k(row + i * kQ4_KBytes, &u[i * QKK], &sc[i * 8], &mn[i * 8], &dx[i], &dmin[i]);
  for (int64_t m = 0; m < M; ++m) {
    const bool per_pair = m < gemm_rows;
    float acc = 0.f, acc_min = 0.f;
    for (int64_t i = 0; i < nb; ++i) {
      const int64_t k = m * nb + i;
      const float dy = a.d[k];
      const float ds = dx[i] * dy, dm = dmin[i] * dy;
      int32_t I = 0, Imin = 0;
      for (int s = 0; s < 8; ++s) {
        I += int32_t(sc[i * 8 + s]) * dot_u8_s8_32(&u[i * QKK + 32 * s], &a.q[k * QKK + 32 * s]);
        Imin += int32_t(mn[i * 8 + s]) * (a.bsum[k * 16 + 2 * s] + a.bsum[k * 16 + 2 * s + 1]);
        if (per_pair && (s & 1)) {
          acc = std::fma(float(I), ds, acc);
          acc_min = std::fma(float(Imin), dm, acc_min);
          I = Imin = 0;
        }
      }
      if (!per_pair) {
        acc = std::fma(float(I), ds, acc);
        acc_min = std::fma(float(Imin), dm, acc_min);
      }
    }
    y[m * w.rows + r] = acc - acc_min;
  }
}

}  // namespace

bool supports(const WeightView& w) {
  switch (w.fmt) {
    case WFormat::GgufQ8_0:
    case WFormat::GgufQ5_0:
    case WFormat::GgufQ4_0:
    case WFormat::GgufQ6_K: return true;
    case WFormat::GgufQ4_K: return w.rows % 8 == 0;  // llama.cpp repacks it to q4_K_8x8
    default: return false;
  }
}

void matmul(const float* x, int64_t M, const WeightView& w, float* y) {
  G4_CHECK(supports(w) && gguf_validate(w, "ggml_exact::matmul").is_ok());
  if (M <= 0) return;
  const int64_t chunk = std::max<int64_t>(1, (int64_t(16) << 10) / std::max<int64_t>(1, w.row_bytes));
  if (gguf_block_size(w.fmt) == QK) {
    thread_local Act32 a;
    quantize32(x, M, w.cols, &a);
    const Act32* ap = &a;  // the caller's buffer: workers have their own thread_local
    auto body = [&w, ap, M, y](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) row_q0(w, r, *ap, M, y);
    };
    parallel_for(w.rows, std::ref(body), chunk);
    return;
  }
  thread_local Act256 a;
  quantize256(x, M, w.cols, &a);
  const Act256* ap = &a;
  const int64_t gemm_rows = M - M % 4;
  auto body = [&w, ap, M, gemm_rows, y](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (w.fmt == WFormat::GgufQ4_K) {
        row_q4k(w, r, *ap, M, gemm_rows, y);
      } else if (M >= 8) {
        row_q6k_tiled(w, r, *ap, M, y);
      } else {
        row_q6k_vecdot(w, r, *ap, M, y);
      }
    }
  };
  parallel_for(w.rows, std::ref(body), chunk);
}

}  // namespace g4::ggml_exact
