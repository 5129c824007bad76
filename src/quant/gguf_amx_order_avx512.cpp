// matmul_amx_order (gguf_amx.h): matmul_amx's floating-point chain per output element, with the
// integer chunk dot products done by AVX-512 VNNI instead of AMX tiles. Batch-invariant mode runs
// it below the AMX switch-over (decode), so a sequence's rows never depend on the batch size.
//
// Layout: a group of 16 weight rows is decoded once (decode_row_chunked, chunk-major: the 16 rows'
// codes of chunk c are contiguous) and offset to unsigned (w + 128). For one activation row and
// chunk c, vpdpbusd gives Σ (w+128)·x per row in 8 (CK = 32) or 4 (CK = 16) lanes; a transpose-add
// tree turns the 16 rows' lanes into one vector of 16 exact sums, and I = sum - 128·Σx. Then, as
// matmul_amx: acc = fma(float(I) * dx, scale, acc) and, for Q4_K/Q5_K, acc -= sx * min.
#include <immintrin.h>

// GCC 12's own AVX-512 intrinsic bodies start from an undefined vector and trip
// -Wmaybe-uninitialized when inlined here; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "core/thread_pool.h"
#include "quant/gguf_amx.h"
#include "quant/gguf_blocks.h"
#include "quant/gguf_quant.h"

namespace g4::gguf {
namespace {

// A[q] (q < 4) hold, in 128-bit chunk j, four partial sums of row 4q + j. Returns the 16 row
// totals in row order.
inline __m512i rows_from_chunks(const __m512i* A) {
  const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(A[0], A[1]), _mm512_unpackhi_epi32(A[0], A[1]));
  const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(A[2], A[3]), _mm512_unpackhi_epi32(A[2], A[3]));
  const __m512i r = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
  // r's lane 4j + q holds row 4q + j.
  const __m512i idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_epi32(idx, r);
}

// Σ (w+128)·x over one chunk for the 16 rows whose unsigned codes start at u.
template <int CK>
inline __m512i chunk_sums(const uint8_t* u, const int8_t* x) {
  __m512i A[4];
  if constexpr (CK == 32) {
    const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
    for (int q = 0; q < 4; ++q) {  // rows 4q..4q+3: two 64-byte loads of two rows each
      const __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(u + 128 * q), xv);
      const __m512i b = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(u + 128 * q + 64), xv);
      A[q] = _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, 0x88), _mm512_shuffle_i32x4(a, b, 0xDD));
    }
  } else {
    const __m512i xv = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    for (int q = 0; q < 4; ++q)
      A[q] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(u + 64 * q), xv);
  }
  return rows_from_chunks(A);
}

template <int CK>
void group_rows(const uint8_t* u, const float* scale_t, const float* mn_t, bool mins, int64_t nch,
                const int8_t* xq, const int32_t* xsum, const ActAmx& a, int64_t m, float* out16) {
  const int64_t t = m / 16, mi = m % 16;
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < nch; ++c) {
    const __m512i s = chunk_sums<CK>(u + c * 16 * CK, xq + c * CK);
    const __m512i I = _mm512_sub_epi32(s, _mm512_set1_epi32(128 * xsum[c]));
    const int64_t k = (t * a.nblk + c * CK / QK) * 16 + mi;
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(I), _mm512_set1_ps(a.dx[size_t(k)]));
    acc = _mm512_fmadd_ps(v, _mm512_loadu_ps(scale_t + c * 16), acc);
    if (mins) acc = _mm512_fnmadd_ps(_mm512_set1_ps(a.sx[size_t(k)]), _mm512_loadu_ps(mn_t + c * 16), acc);
  }
  _mm512_storeu_ps(out16, acc);
}

// Q8_0 at M = 1 (the lm head at decode): no decode pass, the 16 rows' blocks are read in place.
// Same integer sums and the same float chain as group_rows<32> on decoded codes.
void group_q8_0_m1(const uint8_t* base, int64_t row_bytes, int64_t nr, int64_t nch, const int8_t* xq,
                   const int32_t* xsum, const ActAmx& a, int64_t mi, int64_t t, float* out16) {
  const uint8_t* rp[16];
  for (int n = 0; n < 16; ++n) rp[n] = base + std::min<int64_t>(n, nr - 1) * row_bytes;  // pad rows repeat
  alignas(64) int32_t off[16];
  for (int n = 0; n < 16; ++n) off[n] = int32_t(rp[n] - base);
  const __m512i offs = _mm512_load_si512(off);
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < nch; ++c) {
    const int64_t boff = c * kQ8_0Bytes;
    const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + c * QK)));
    __m512i A[4];
    for (int q = 0; q < 4; ++q) {
      auto pair = [&](int n) {
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rp[n] + boff + 2));
        const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rp[n + 1] + boff + 2));
        return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), flip);
      };
      const __m512i x0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pair(4 * q), xv);
      const __m512i x1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pair(4 * q + 2), xv);
      A[q] = _mm512_add_epi32(_mm512_shuffle_i32x4(x0, x1, 0x88), _mm512_shuffle_i32x4(x0, x1, 0xDD));
    }
    const __m512i I = _mm512_sub_epi32(rows_from_chunks(A), _mm512_set1_epi32(128 * xsum[c]));
    const __m512i h = _mm512_i32gather_epi32(offs, base + boff, 1);  // low 16 bits: the f16 scale
    const __m512 scale = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
    const int64_t k = (t * a.nblk + c) * 16 + mi;
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(I), _mm512_set1_ps(a.dx[size_t(k)]));
    acc = _mm512_fmadd_ps(v, scale, acc);
  }
  _mm512_storeu_ps(out16, acc);
}

}  // namespace

void matmul_amx_order(WFormat f, const WeightView& w, const ActAmx& a, int64_t M, float* y) {
  const int ck = amx_chunk(f);
  const int64_t cols = w.cols, nch = cols / ck, ngroups = (w.rows + 15) / 16, nb = cols / QK;
  const bool mins = f == WFormat::GgufQ4_K || f == WFormat::GgufQ5_K;
  // Activation codes back in value order (from the AMX B layout) and their per-chunk sums.
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<int32_t> xsum;
  xq.resize(size_t(M * cols));
  xsum.resize(size_t(M * nch));
  for (int64_t m = 0; m < M; ++m) {
    const int64_t t = m / 16, mi = m % 16;
    int8_t* row = &xq[size_t(m * cols)];
    for (int64_t b = 0; b < nb; ++b) {
      const int8_t* src = &a.xb[size_t((t * nb + b) * 512 + mi * 4)];
      for (int j = 0; j < 8; ++j) std::memcpy(row + b * QK + 4 * j, src + 64 * j, 4);
    }
    for (int64_t c = 0; c < nch; ++c) {
      int32_t s = 0;
      for (int j = 0; j < ck; ++j) s += row[c * ck + j];
      xsum[size_t(m * nch + c)] = s;
    }
  }
  const int8_t* xqp = xq.data();
  const int32_t* xsp = xsum.data();
  if (f == WFormat::GgufQ8_0 && M == 1) {
    auto body1 = [&, xqp, xsp](int64_t g0, int64_t g1) {
      alignas(64) float out[16];
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t r0 = g * 16, nr = std::min<int64_t>(16, w.rows - r0);
        const uint8_t* base = static_cast<const uint8_t*>(w.data) + r0 * w.row_bytes;
        if (g + 1 < g1)
          for (int64_t k = 0; k < 16 * w.row_bytes; k += 64)
            _mm_prefetch(reinterpret_cast<const char*>(base + 16 * w.row_bytes + k), _MM_HINT_T0);
        group_q8_0_m1(base, w.row_bytes, nr, nch, xqp, xsp, a, 0, 0, out);
        std::memcpy(y + r0, out, size_t(nr) * 4);
      }
    };
    parallel_for(ngroups, std::ref(body1));
    return;
  }
  auto body = [&, xqp, xsp](int64_t g0, int64_t g1) {
    thread_local std::vector<int8_t> codes;
    thread_local std::vector<float> scale, mn, scale_t, mn_t;
    codes.resize(size_t(16 * cols));
    scale.resize(size_t(16 * nch));
    mn.resize(size_t(16 * nch));
    scale_t.resize(size_t(16 * nch));
    mn_t.resize(size_t(16 * nch));
    alignas(64) float out[16];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t r0 = g * 16, nr = std::min<int64_t>(16, w.rows - r0);
      decode_group16(f, w, r0, codes.data(), scale.data(), mn.data(), g + 1 < g1);
      for (int64_t n = 0; n < 16; ++n)
        for (int64_t c = 0; c < nch; ++c) {
          scale_t[size_t(c * 16 + n)] = scale[size_t(n * nch + c)];
          mn_t[size_t(c * 16 + n)] = mn[size_t(n * nch + c)];
        }
      const __m512i flip = _mm512_set1_epi8(char(0x80));  // signed code -> code + 128
      for (size_t i = 0; i < codes.size(); i += 64) {
        __m512i* p = reinterpret_cast<__m512i*>(&codes[i]);
        _mm512_storeu_si512(p, _mm512_xor_si512(_mm512_loadu_si512(p), flip));
      }
      const uint8_t* u = reinterpret_cast<const uint8_t*>(codes.data());
      for (int64_t m = 0; m < M; ++m) {
        const int8_t* xm = xqp + m * cols;
        const int32_t* sm = xsp + m * nch;
        if (ck == 32) {
          group_rows<32>(u, scale_t.data(), mn_t.data(), mins, nch, xm, sm, a, m, out);
        } else {
          group_rows<16>(u, scale_t.data(), mn_t.data(), mins, nch, xm, sm, a, m, out);
        }
        std::memcpy(y + m * w.rows + r0, out, size_t(nr) * 4);
      }
    }
  };
  parallel_for(ngroups, std::ref(body));
}

}  // namespace g4::gguf
