// AVX2 + FMA + F16C kernels for F32 / F16 / BF16 / MlxAffine weights, for CPUs without AVX-512
// (compiled with -mavx2 -mfma -mf16c; call only when detail::cpu_has_avx2()). Every M goes through
// the direct kernels: up to 4 x rows per pass over a block of L1-resident packed rows (the weights
// leave memory once), fp32 FMA, summation order the only difference from matmul_ref.
//
// MLX rows (spec §3.4) are read 8 values at a time: 8 values of b bits are b bytes, loaded as one
// 64-bit word (masked to b bytes), broadcast to both 128-bit lanes; vpshufb gives lane l the two
// bytes starting at byte (l*b)/8, a per-lane shift by (l*b)%8 and a mask leave q. 4-bit rows take
// 16 values from 8 bytes (low nibbles = even columns, high = odd; x pre-permuted to match).
// Per group: acc += x·float(q) (one FMA per 8 values), then y += scale·acc + bias·Σx.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/matmul_internal.h"

namespace g4::detail {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Bytes [0, n) of p as a 64-bit word (n <= 8), never reading past p + n.
inline uint64_t load_bytes(const uint8_t* p, int n) {
  uint64_t v = 0;
  std::memcpy(&v, p, size_t(n));
  return v;
}

struct Unpacker8 {
  __m256i shuf, shift, mask;
  int nbytes;
  explicit Unpacker8(int b) : nbytes(b) {
    alignas(32) uint8_t ctl[32];
    alignas(32) uint32_t sh[8];
    for (int l = 0; l < 8; ++l) {
      const int bit = l * b, idx = bit / 8;
      sh[l] = uint32_t(bit % 8);
      for (int k = 0; k < 4; ++k) {
        const int bi = idx + k;
        const uint8_t c = bi < 8 && k < 2 ? uint8_t(bi) : uint8_t(0x80);
        ctl[(l / 4) * 16 + (l % 4) * 4 + k] = c;
      }
    }
    shuf = _mm256_load_si256(reinterpret_cast<const __m256i*>(ctl));
    shift = _mm256_load_si256(reinterpret_cast<const __m256i*>(sh));
    mask = _mm256_set1_epi32((1 << b) - 1);
  }
  // q of the 8 values stored at p (b bytes), as f32. Reads 8 bytes when they lie before `end`
  // (the extra bytes are masked off), else exactly b bytes.
  inline __m256 q8(const uint8_t* p, const uint8_t* end) const {
    uint64_t word;
    if (p + 8 <= end) std::memcpy(&word, p, 8);
    else word = load_bytes(p, nbytes);
    const __m256i bv = _mm256_set1_epi64x(int64_t(word));
    const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(bv, shuf), shift), mask);
    return _mm256_cvtepi32_ps(q);
  }
};

inline __m256 load_w8(WFormat f, const uint8_t* row, int64_t c) {
  switch (f) {
    case WFormat::F16:
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
    case WFormat::BF16:
      return _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c))), 16));
    default:
      return _mm256_loadu_ps(reinterpret_cast<const float*>(row + 4 * c));
  }
}

template <int MR>
inline void float_row_dot(const float* x, int64_t ldx, const WeightView& w, int64_t r, float* y, int64_t ldy) {
  const uint8_t* row = row_ptr(w, r);
  const int64_t cols = w.cols;
  __m256 a0[MR], a1[MR];
  for (int m = 0; m < MR; ++m) a0[m] = a1[m] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    const __m256 wa = load_w8(w.fmt, row, c), wb = load_w8(w.fmt, row, c + 8);
    for (int m = 0; m < MR; ++m) {
      a0[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * ldx + c), wa, a0[m]);
      a1[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * ldx + c + 8), wb, a1[m]);
    }
  }
  float tail[MR] = {};
  for (; c < cols; ++c) {
    float wv;
    if (w.fmt == WFormat::F32) std::memcpy(&wv, row + 4 * c, 4);
    else {
      uint16_t h;
      std::memcpy(&h, row + 2 * c, 2);
      wv = w.fmt == WFormat::F16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
    for (int m = 0; m < MR; ++m) tail[m] += x[m * ldx + c] * wv;
  }
  for (int m = 0; m < MR; ++m) y[m * ldy] = hsum(_mm256_add_ps(a0[m], a1[m])) + tail[m];
}

// MLX row: per group, acc = Σ x·q (vector), then y += scale·acc + bias·Σx (xsum per group/row).
template <int MR, int B>
inline void mlx_row_dot(const float* x, int64_t ldx, const float* xsum, int64_t ldxs, const WeightView& w,
                        int64_t r, const Unpacker8& up, float* y, int64_t ldy) {
  const uint8_t* row = row_ptr(w, r);
  const uint8_t* row_end = row + w.cols * B / 8;
  const int64_t ng = groups_per_row(w), g = w.group_size;
  __m256 yv[MR];
  float ybias[MR];
  for (int m = 0; m < MR; ++m) {
    yv[m] = _mm256_setzero_ps();
    ybias[m] = 0.f;
  }
  const __m256i lo_mask = _mm256_set1_epi32(0xF);
  for (int64_t k = 0; k < ng; ++k) {
    __m256 a0[MR], a1[MR];
    for (int m = 0; m < MR; ++m) a0[m] = a1[m] = _mm256_setzero_ps();
    const int64_t c0 = k * g;
    for (int64_t c = c0; c < c0 + g; c += 16) {
      __m256 qa, qb;
      if constexpr (B == 4) {
        // 8 bytes = 16 values: low nibbles (even columns) pair with x[c..c+8), high with x[c+8..c+16).
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c / 2)));
        qa = _mm256_cvtepi32_ps(_mm256_and_si256(v, lo_mask));
        qb = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
      } else if constexpr (B == 8) {
        qa = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c))));
        qb = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c + 8))));
      } else {
        qa = up.q8(row + c / 8 * B, row_end);
        qb = up.q8(row + (c + 8) / 8 * B, row_end);
      }
      for (int m = 0; m < MR; ++m) {
        a0[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * ldx + c), qa, a0[m]);
        a1[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * ldx + c + 8), qb, a1[m]);
      }
    }
    const float s = load_float(w.scales, w.scale_dtype, size_t(r * ng + k));
    const float b = load_float(w.biases, w.scale_dtype, size_t(r * ng + k));
    const __m256 sv = _mm256_set1_ps(s);
    for (int m = 0; m < MR; ++m) {
      yv[m] = _mm256_fmadd_ps(sv, _mm256_add_ps(a0[m], a1[m]), yv[m]);
      ybias[m] += b * xsum[m * ldxs + k];
    }
  }
  for (int m = 0; m < MR; ++m) y[m * ldy] = hsum(yv[m]) + ybias[m];
}

template <int MR>
void direct_rows(const float* x, int64_t ldx, const float* xsum, int64_t ldxs, const WeightView& w,
                 int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (w.fmt != WFormat::MlxAffine) {
    for (int64_t r = r0; r < r1; ++r) float_row_dot<MR>(x, ldx, w, r, y + r, ldy);
    return;
  }
  const Unpacker8 up(w.bits);
  switch (w.bits) {
#define G4_CASE(B) \
  case B: for (int64_t r = r0; r < r1; ++r) mlx_row_dot<MR, B>(x, ldx, xsum, ldxs, w, r, up, y + r, ldy); break;
    G4_CASE(2) G4_CASE(3) G4_CASE(4) G4_CASE(5) G4_CASE(6) G4_CASE(8)
#undef G4_CASE
  }
}

}  // namespace

void matmul_avx2(const float* x, int64_t M, const WeightView& w, float* y) {
  const int64_t cols = w.cols, rows = w.rows;
  const float* xs = x;
  thread_local std::vector<float> xperm, xsum_buf;
  const float* xsum = nullptr;
  int64_t ldxs = 0;
  if (w.fmt == WFormat::MlxAffine) {
    if (w.bits == 4) {  // [even | odd] columns per 16-column chunk
      if (xperm.size() < size_t(M * cols)) xperm.resize(size_t(M * cols));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t c = 0; c < cols; c += 16)
          for (int j = 0; j < 8; ++j) {
            xperm[m * cols + c + j] = x[m * cols + c + 2 * j];
            xperm[m * cols + c + 8 + j] = x[m * cols + c + 2 * j + 1];
          }
      xs = xperm.data();
    }
    ldxs = groups_per_row(w);
    if (xsum_buf.size() < size_t(M * ldxs)) xsum_buf.resize(size_t(M * ldxs));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < ldxs; ++k) {
        float s = 0.f;
        for (int64_t c = k * w.group_size; c < (k + 1) * w.group_size; ++c) s += x[m * cols + c];
        xsum_buf[size_t(m * ldxs + k)] = s;
      }
    xsum = xsum_buf.data();
  }
  const int64_t min_chunk = std::max<int64_t>(1, 32768 / (cols * M));
  constexpr int64_t kRB = 8;
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t rb = r0; rb < r1; rb += kRB) {
      const int64_t re = std::min(r1, rb + kRB);
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const float* xm = xs + m0 * cols;
        const float* sm = xsum ? xsum + m0 * ldxs : nullptr;
        float* ym = y + m0 * rows;
        switch (std::min<int64_t>(4, M - m0)) {
          case 1: direct_rows<1>(xm, cols, sm, ldxs, w, rb, re, ym, rows); break;
          case 2: direct_rows<2>(xm, cols, sm, ldxs, w, rb, re, ym, rows); break;
          case 3: direct_rows<3>(xm, cols, sm, ldxs, w, rb, re, ym, rows); break;
          default: direct_rows<4>(xm, cols, sm, ldxs, w, rb, re, ym, rows); break;
        }
      }
    }
  }, min_chunk);
}

}  // namespace g4::detail
