// AVX-512 kernels for F32 / F16 / BF16 / MlxAffine weights (compiled with -mavx512{f,bw,vl,dq};
// call only when detail::cpu_has_avx512()). Contracts in matmul_internal.h.
//
// MLX unpacking (spec §3.4: one LSB-first bit stream per row): 16 values of b bits occupy 2b
// bytes. They are loaded with a masked load (never past the row), broadcast to the four 128-bit
// lanes, and vpshufb picks for lane l the 4 bytes starting at byte (l*b)/8; a per-lane shift by
// (l*b)%8 leaves q in the low bits. For b <= 5 the dequantized value is then a table lookup
// (vpermps / vpermt2ps ignore the high index bits) into the group's 16 or 32 values
// scale*j + bias; for b = 6, 8 it is scale*float(q & mask) + bias. Either way each weight equals
// dequant_row's value bit for bit (product rounded, then the add).
// 4-bit decode takes 32 values from 16 bytes (low nibbles = even columns, high = odd) and pairs
// them with x pre-permuted per 32-column chunk to [even columns, odd columns].
// GCC 12 warns about its own _mm512_undefined_* helpers inside the intrinsic headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/matmul_internal.h"

namespace g4::detail {
namespace {

// scale*q + bias with the product rounded before the add (as dequant_row / MLX). The explicit
// rounding-mode multiply is a builtin GCC will not contract into an FMA with the add.
inline __m512 mul_add_rn(__m512 q, __m512 s, __m512 b) {
  return _mm512_add_ps(_mm512_mul_round_ps(q, s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), b);
}

// Per-bit-width constants of the generic unpack.
struct Unpacker {
  __m512i shuf, shift, mask;
  __mmask16 load_mask;
  explicit Unpacker(int b) {
    alignas(64) uint8_t ctl[64];
    alignas(64) uint32_t sh[16];
    for (int l = 0; l < 16; ++l) {
      const int bit = l * b, idx = bit / 8;
      sh[l] = uint32_t(bit % 8);
      for (int k = 0; k < 4; ++k) {
        const int bi = idx + k;
        ctl[l * 4 + k] = bi < 16 ? uint8_t(bi) : uint8_t(0x80);
      }
    }
    shuf = _mm512_load_si512(ctl);
    shift = _mm512_load_si512(sh);
    mask = _mm512_set1_epi32((1 << b) - 1);
    load_mask = __mmask16((1u << (2 * b)) - 1u);  // 2b bytes hold 16 values (b=8: all 16)
    if (b == 8) load_mask = 0xFFFF;
  }
  // Raw q values (high bits not yet masked) of the 16 values stored at p (2b bytes).
  inline __m512i raw(const uint8_t* p) const {
    __m128i v = _mm_maskz_loadu_epi8(load_mask, p);
    __m512i bv = _mm512_broadcast_i32x4(v);
    return _mm512_srlv_epi32(_mm512_shuffle_epi8(bv, shuf), shift);
  }
};

// The 16 (or 32 for b=5) dequantized values of one group, as lookup tables, or scale/bias.
template <int B>
struct GroupLut {
  __m512 t0, t1, s, bias;
  inline void set(float sc, float bi) {
    s = _mm512_set1_ps(sc);
    bias = _mm512_set1_ps(bi);
    if constexpr (B <= 5) {
      const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      const __m512i lo = _mm512_and_si512(iota, _mm512_set1_epi32((1 << (B < 4 ? B : 4)) - 1));
      t0 = mul_add_rn(_mm512_cvtepi32_ps(lo), s, bias);
      if constexpr (B == 5) {
        const __m512i hi = _mm512_add_epi32(iota, _mm512_set1_epi32(16));
        t1 = mul_add_rn(_mm512_cvtepi32_ps(hi), s, bias);
      }
    }
  }
  // Dequantized values from raw (unmasked) q.
  inline __m512 deq(__m512i q, __m512i mask) const {
    if constexpr (B <= 4) {
      return _mm512_permutexvar_ps(q, t0);
    } else if constexpr (B == 5) {
      return _mm512_permutex2var_ps(t0, q, t1);
    } else {
      return mul_add_rn(_mm512_cvtepi32_ps(_mm512_and_si512(q, mask)), s, bias);
    }
  }
};

// 16 dequantized values of row chunk starting at column c (c % 16 == 0) of an MLX row.
template <int B>
inline __m512 mlx_chunk(const uint8_t* row, int64_t c, const Unpacker& up, const GroupLut<B>& g) {
  if constexpr (B == 8) {
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c)));
    return mul_add_rn(_mm512_cvtepi32_ps(q), g.s, g.bias);
  } else {
    return g.deq(up.raw(row + c / 16 * 2 * B), up.mask);
  }
}

inline __m512 load_w16(WFormat f, const uint8_t* row, int64_t c, __mmask16 m) {
  switch (f) {
    case WFormat::F16:
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * c));
    case WFormat::BF16:
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, row + 2 * c)), 16));
    default:
      return _mm512_maskz_loadu_ps(m, row + 4 * c);
  }
}

inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u); }

// ---------------------------------------------------------------- dequantize one row (SIMD)

template <int B>
void dequant_mlx_row(const WeightView& w, int64_t r, float* out) {
  const Unpacker up(B);
  const uint8_t* row = row_ptr(w, r);
  const int64_t ng = groups_per_row(w), g = w.group_size;
  GroupLut<B> lut;
  for (int64_t k = 0; k < ng; ++k) {
    lut.set(load_float(w.scales, w.scale_dtype, size_t(r * ng + k)),
            load_float(w.biases, w.scale_dtype, size_t(r * ng + k)));
    for (int64_t c = k * g; c < (k + 1) * g; c += 16) _mm512_storeu_ps(out + c, mlx_chunk<B>(row, c, up, lut));
  }
}

void dequant_row_impl(const WeightView& w, int64_t r, float* out) {
  if (w.fmt == WFormat::MlxAffine) {
    switch (w.bits) {
      case 2: return dequant_mlx_row<2>(w, r, out);
      case 3: return dequant_mlx_row<3>(w, r, out);
      case 4: return dequant_mlx_row<4>(w, r, out);
      case 5: return dequant_mlx_row<5>(w, r, out);
      case 6: return dequant_mlx_row<6>(w, r, out);
      default: return dequant_mlx_row<8>(w, r, out);
    }
  }
  const uint8_t* row = row_ptr(w, r);
  for (int64_t c = 0; c < w.cols; c += 16) {
    const __mmask16 m = tail_mask(w.cols - c);
    _mm512_mask_storeu_ps(out + c, m, load_w16(w.fmt, row, c, m));
  }
}

// ---------------------------------------------------------------- direct kernels, M <= 4

// y[m*ldy] = x_m · row for MR x rows; x rows have stride ldx.
template <int MR, int B>
inline void mlx_row_dot(const float* x, int64_t ldx, const WeightView& w, int64_t r,
                        const Unpacker& up, float* y, int64_t ldy) {
  const uint8_t* row = row_ptr(w, r);
  const int64_t ng = groups_per_row(w), g = w.group_size;
  __m512 acc0[MR], acc1[MR];
  for (int m = 0; m < MR; ++m) acc0[m] = acc1[m] = _mm512_setzero_ps();
  GroupLut<B> lut;
  for (int64_t k = 0; k < ng; ++k) {
    lut.set(load_float(w.scales, w.scale_dtype, size_t(r * ng + k)),
            load_float(w.biases, w.scale_dtype, size_t(r * ng + k)));
    const int64_t c0 = k * g;
    {
      int64_t c = c0;
      for (; c + 32 <= c0 + g; c += 32) {
        const __m512 wa = mlx_chunk<B>(row, c, up, lut);
        const __m512 wb = mlx_chunk<B>(row, c + 16, up, lut);
        for (int m = 0; m < MR; ++m) {
          acc0[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + c), wa, acc0[m]);
          acc1[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + c + 16), wb, acc1[m]);
        }
      }
      if (c < c0 + g) {  // g % 32 == 16 cannot happen (g in {32,64,128}); kept for safety
        const __m512 wa = mlx_chunk<B>(row, c, up, lut);
        for (int m = 0; m < MR; ++m) acc0[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + c), wa, acc0[m]);
      }
    }
  }
  for (int m = 0; m < MR; ++m) y[m * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[m], acc1[m]));
}

// 4-bit rows: 64 columns per step (two 32-column chunks, each 16 bytes: low nibbles = even
// columns, high = odd; x pre-permuted to match), four accumulators per x row to cover the FMA
// latency. With group_size 32 the two chunks use consecutive groups' tables.
template <int MR>
inline void mlx4_row_dot(const float* x, int64_t ldx, const WeightView& w, int64_t r, float* y, int64_t ldy) {
  const uint8_t* row = row_ptr(w, r);
  const int64_t ng = groups_per_row(w), g = w.group_size, cols = w.cols;
  const int64_t sbase = r * ng;
  __m512 acc[4][MR];
  for (int j = 0; j < 4; ++j)
    for (int m = 0; m < MR; ++m) acc[j][m] = _mm512_setzero_ps();
  GroupLut<4> la, lb;
  auto chunk = [&](int64_t c, const GroupLut<4>& lut, __m512* a0, __m512* a1) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 2)));
    const __m512 wl = _mm512_permutexvar_ps(v, lut.t0);
    const __m512 wh = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut.t0);
    for (int m = 0; m < MR; ++m) {
      a0[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + c), wl, a0[m]);
      a1[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + c + 16), wh, a1[m]);
    }
  };
  int64_t c = 0;
  for (; c + 64 <= cols; c += 64) {
    const int64_t k = c / g;
    if (g == 32) {
      la.set(load_float(w.scales, w.scale_dtype, size_t(sbase + k)), load_float(w.biases, w.scale_dtype, size_t(sbase + k)));
      lb.set(load_float(w.scales, w.scale_dtype, size_t(sbase + k + 1)),
             load_float(w.biases, w.scale_dtype, size_t(sbase + k + 1)));
      chunk(c, la, acc[0], acc[1]);
      chunk(c + 32, lb, acc[2], acc[3]);
    } else {
      if (c % g == 0)
        la.set(load_float(w.scales, w.scale_dtype, size_t(sbase + k)), load_float(w.biases, w.scale_dtype, size_t(sbase + k)));
      chunk(c, la, acc[0], acc[1]);
      chunk(c + 32, la, acc[2], acc[3]);
    }
  }
  if (c < cols) {  // one 32-column chunk left (group_size 32, odd number of groups)
    const int64_t k = c / g;
    la.set(load_float(w.scales, w.scale_dtype, size_t(sbase + k)), load_float(w.biases, w.scale_dtype, size_t(sbase + k)));
    chunk(c, la, acc[0], acc[1]);
  }
  for (int m = 0; m < MR; ++m)
    y[m * ldy] = _mm512_reduce_add_ps(
        _mm512_add_ps(_mm512_add_ps(acc[0][m], acc[1][m]), _mm512_add_ps(acc[2][m], acc[3][m])));
}

template <int MR>
inline void float_row_dot(const float* x, int64_t ldx, const WeightView& w, int64_t r, float* y,
                          int64_t ldy) {
  const uint8_t* row = row_ptr(w, r);
  const int64_t cols = w.cols;
  __m512 acc0[MR], acc1[MR];
  for (int m = 0; m < MR; ++m) acc0[m] = acc1[m] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    const __m512 wa = load_w16(w.fmt, row, c, 0xFFFF);
    const __m512 wb = load_w16(w.fmt, row, c + 16, 0xFFFF);
    for (int m = 0; m < MR; ++m) {
      acc0[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + c), wa, acc0[m]);
      acc1[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + c + 16), wb, acc1[m]);
    }
  }
  for (; c < cols; c += 16) {
    const __mmask16 mk = tail_mask(cols - c);
    const __m512 wa = load_w16(w.fmt, row, c, mk);
    for (int m = 0; m < MR; ++m)
      acc0[m] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, x + m * ldx + c), wa, acc0[m]);
  }
  for (int m = 0; m < MR; ++m) y[m * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[m], acc1[m]));
}

template <int MR>
void direct_rows(const float* x, int64_t ldx, const WeightView& w, int64_t r0, int64_t r1, float* y,
                 int64_t ldy) {
  if (w.fmt != WFormat::MlxAffine) {
    for (int64_t r = r0; r < r1; ++r) float_row_dot<MR>(x, ldx, w, r, y + r, ldy);
    return;
  }
  if (w.bits == 4) {
    for (int64_t r = r0; r < r1; ++r) mlx4_row_dot<MR>(x, ldx, w, r, y + r, ldy);
    return;
  }
  const Unpacker up(w.bits);
  switch (w.bits) {
#define G4_CASE(B) \
  case B: for (int64_t r = r0; r < r1; ++r) mlx_row_dot<MR, B>(x, ldx, w, r, up, y + r, ldy); break;
    G4_CASE(2) G4_CASE(3) G4_CASE(5) G4_CASE(6) G4_CASE(8)
#undef G4_CASE
  }
}

// ---------------------------------------------------------------- tiled kernel, M > 4

// y[m*ldy + n] (+)= Σ_k x[m*ldx + k] * w[n*ldw + k] for m < MB, n < NB, k < K.
template <int MB, int NB>
void tile(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K, float* y, int64_t ldy,
          bool accumulate) {
  __m512 acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NB];
    for (int n = 0; n < NB; ++n) wv[n] = _mm512_loadu_ps(w + n * ldw + k);
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * ldx + k);
      for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_fmadd_ps(xv, wv[n], acc[m][n]);
    }
  }
  if (k < K) {
    const __mmask16 mk = tail_mask(K - k);
    __m512 wv[NB];
    for (int n = 0; n < NB; ++n) wv[n] = _mm512_maskz_loadu_ps(mk, w + n * ldw + k);
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(mk, x + m * ldx + k);
      for (int n = 0; n < NB; ++n) acc[m][n] = _mm512_fmadd_ps(xv, wv[n], acc[m][n]);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) {
      const float s = _mm512_reduce_add_ps(acc[m][n]);
      y[m * ldy + n] = accumulate ? y[m * ldy + n] + s : s;
    }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, bool);
constexpr TileFn kTiles[4][4] = {
    {tile<1, 1>, tile<1, 2>, tile<1, 3>, tile<1, 4>},
    {tile<2, 1>, tile<2, 2>, tile<2, 3>, tile<2, 4>},
    {tile<3, 1>, tile<3, 2>, tile<3, 3>, tile<3, 4>},
    {tile<4, 1>, tile<4, 2>, tile<4, 3>, tile<4, 4>},
};

constexpr int64_t kNB = 4;     // weight rows per tile (dequantized once, reused for all M rows)
constexpr int64_t kKB = 1024;  // columns per K block: 4 weight rows x 4 KiB stay in L1

void tiled(const float* x, int64_t M, const WeightView& w, float* y) {
  const int64_t cols = w.cols, rows = w.rows;
  const int64_t ntiles = (rows + kNB - 1) / kNB;
  const bool direct_f32 = w.fmt == WFormat::F32 && w.row_bytes % 4 == 0;
  parallel_for(ntiles, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> buf;
    const int64_t ldb = cols + 16;  // not a power of two: the 4 rows must not alias one L1 set
    if (!direct_f32 && buf.size() < size_t(kNB * ldb)) buf.resize(size_t(kNB * ldb));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t * kNB, nb = std::min(kNB, rows - r0);
      const float* wt;
      int64_t ldw;
      if (direct_f32) {
        wt = reinterpret_cast<const float*>(row_ptr(w, r0));
        ldw = w.row_bytes / 4;
      } else {
        for (int64_t i = 0; i < nb; ++i) dequant_row_impl(w, r0 + i, buf.data() + i * ldb);
        wt = buf.data();
        ldw = ldb;
      }
      for (int64_t k0 = 0; k0 < cols; k0 += kKB) {
        const int64_t K = std::min(kKB, cols - k0);
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
          const int64_t mb = std::min<int64_t>(4, M - m0);
          kTiles[mb - 1][nb - 1](x + m0 * cols + k0, cols, wt + k0, ldw, K, y + m0 * rows + r0, rows,
                                 k0 > 0);
        }
      }
    }
  }, 1);
}

}  // namespace

void dequant_row_avx512(const WeightView& w, int64_t r, float* out) { dequant_row_impl(w, r, out); }

// Up to this many x rows the direct kernels (4 x rows per pass over L1-resident packed rows) beat
// the dequantize-then-tile kernel; both run near the FMA bound.
constexpr int64_t kDirectMaxM = 16;

void matmul_avx512(const float* x, int64_t M, const WeightView& w, float* y) {
  if (M > kDirectMaxM) {
    tiled(x, M, w, y);
    return;
  }
  const int64_t cols = w.cols;
  const float* xs = x;
  thread_local std::vector<float> xperm;
  if (w.fmt == WFormat::MlxAffine && w.bits == 4) {
    // [even | odd] columns per 32-column chunk (cols % 32 == 0 since group_size >= 32).
    if (xperm.size() < size_t(M * cols)) xperm.resize(size_t(M * cols));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = 0; c < cols; c += 32)
        for (int j = 0; j < 16; ++j) {
          xperm[m * cols + c + j] = x[m * cols + c + 2 * j];
          xperm[m * cols + c + 16 + j] = x[m * cols + c + 2 * j + 1];
        }
    xs = xperm.data();
  }
  const int64_t rows = w.rows;
  const int64_t min_chunk = std::max<int64_t>(1, 32768 / (cols * M));
  // Rows in blocks of kRB so that a block's packed rows stay in L1 while every group of up to 4
  // x rows passes over them (weights leave memory once; x stays in L2).
  constexpr int64_t kRB = 8;
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t rb = r0; rb < r1; rb += kRB) {
      const int64_t re = std::min(r1, rb + kRB);
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const float* xm = xs + m0 * cols;
        float* ym = y + m0 * rows;
        switch (std::min<int64_t>(4, M - m0)) {
          case 1: direct_rows<1>(xm, cols, w, rb, re, ym, rows); break;
          case 2: direct_rows<2>(xm, cols, w, rb, re, ym, rows); break;
          case 3: direct_rows<3>(xm, cols, w, rb, re, ym, rows); break;
          default: direct_rows<4>(xm, cols, w, rb, re, ym, rows); break;
        }
      }
    }
  }, min_chunk);
}

}  // namespace g4::detail
