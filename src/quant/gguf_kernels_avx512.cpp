// AVX-512 VNNI integer dot-product kernels for GGUF weights against int8 activations
// (gguf_act.h). Compiled with -mavx512{f,bw,vl,dq,vnni} -mf16c -mfma; called only after
// cpu_has_avx512_vnni(). Mirrors ggml's ggml_vec_dot_{q4_K,q5_K,q6_K,q8_0,q4_0,q5_0}_q8_* in
// meaning (same block math), with llama.cpp's tricks: unsigned weight codes times signed
// activations (vpmaddubsw / vpdpbusd), sub-block scales applied with vpdpwssd, the codes' offset
// (Q6_K's -32, Q4_0's -8, ...) and the K-quant mins folded in through precomputed activation sums.
// Each weight block is unpacked once and reused for up to 4 activation rows.
// GCC 12 flags its own _mm512_undefined_* helpers inside the intrinsics headers as uninitialized.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "quant/gguf_act.h"
#include "quant/gguf_blocks.h"

namespace g4::gguf {
namespace {

constexpr int MT = 4;  // activation rows per weight-block unpack
// Decode (M = 1) prefetches the K-quant row this many rows ahead (4 measured best of 1-8 on the
// bench_kernels GgufQ4K_Stream case; the hardware prefetchers alone streamed 11.8 GB/s).
constexpr int64_t kPrefetchRows = 4;

inline float f16(const uint8_t* p) { return _cvtsh_ss(rd16(p)); }

inline float hsum128(__m128 v) {
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  v = _mm_add_ss(v, _mm_movehdup_ps(v));
  return _mm_cvtss_f32(v);
}

// Index vectors for vpermw: 32 int16 lanes, lanes 0-15 take element a, 16-31 element b.
inline __m512i idx_pair16(int a, int b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(short(a))),
                            _mm256_set1_epi16(short(b)), 1);
}

// ---- Q4_K / Q5_K -----------------------------------------------------------------------------
// Unpacked super-block: W[v] = 64 unsigned codes for sub-blocks (a, b) of kSub[v]; S[v] = their
// scales as int16 per maddubs lane; mins as 8 int16.
template <bool Q5, int NM>
void row_q45k(const uint8_t* row, const ActK& a, int64_t m0, float* y, int64_t ldy) {
  const int64_t nsb = a.nsb;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i idx[4] = {idx_pair16(0, 2), idx_pair16(1, 3), idx_pair16(4, 6), idx_pair16(5, 7)};
  __m512 acc[NM];
  __m128 accm[NM];
  #pragma GCC unroll 4
  for (int m = 0; m < NM; ++m) acc[m] = _mm512_setzero_ps(), accm[m] = _mm_setzero_ps();
  const int bb = Q5 ? kQ5_KBytes : kQ4_KBytes;
  for (int64_t i = 0; i < nsb; ++i) {
    const uint8_t* b = row + i * bb;
    const float d = f16(b), dmin = f16(b + 2);
    // get_scale_min_k4 for all 8 sub-blocks at once (llama.cpp's kmask trick).
    uint32_t u[4];
    std::memcpy(u, b + 4, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
    const uint32_t mins_lo = u[1] & 0x3f3f3f3f;
    u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    u[0] &= 0x3f3f3f3f;
    u[2] = mins_lo;
    const __m128i sc8 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, int(u[1]), int(u[0])));
    const __m128i mn8 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, int(u[3]), int(u[2])));
    const __m512i scb = _mm512_broadcast_i32x4(sc8);
    __m512i S[4], W[4];
    #pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) S[v] = _mm512_permutexvar_epi16(idx[v], scb);
    const uint8_t* qs = b + (Q5 ? 48 : 16);
    const __m512i v0 = _mm512_loadu_si512(qs), v1 = _mm512_loadu_si512(qs + 64);
    W[0] = _mm512_and_si512(v0, m4);
    W[1] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
    W[2] = _mm512_and_si512(v1, m4);
    W[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
    if constexpr (Q5) {
      const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(b + 16)));
      const __m512i s16 = _mm512_set1_epi8(16);
      static constexpr int kA[4] = {0, 1, 4, 5};
      #pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        const __m512i sel = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << kA[v])),
                                               _mm256_set1_epi8(char(1 << (kA[v] + 2))), 1);
        W[v] = _mm512_mask_add_epi8(W[v], _mm512_test_epi8_mask(H, sel), W[v], s16);
      }
    }
    #pragma GCC unroll 4
    for (int m = 0; m < NM; ++m) {
      const int64_t k = (m0 + m) * nsb + i;
      const int8_t* xq = &a.qs[k * QKK];
      __m512i s0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                       _mm512_maddubs_epi16(W[0], _mm512_loadu_si512(xq)), S[0]);
      __m512i s1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                       _mm512_maddubs_epi16(W[1], _mm512_loadu_si512(xq + 64)), S[1]);
      s0 = _mm512_dpwssd_epi32(s0, _mm512_maddubs_epi16(W[2], _mm512_loadu_si512(xq + 128)), S[2]);
      s1 = _mm512_dpwssd_epi32(s1, _mm512_maddubs_epi16(W[3], _mm512_loadu_si512(xq + 192)), S[3]);
      const float dx = a.d[k];
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_set1_ps(d * dx), acc[m]);
      const __m128i mb = _mm_madd_epi16(mn8, _mm_loadu_si128((const __m128i*)&a.bs32[k * 8]));
      accm[m] = _mm_fmadd_ps(_mm_cvtepi32_ps(mb), _mm_set1_ps(dmin * dx), accm[m]);
    }
  }
  #pragma GCC unroll 4
  for (int m = 0; m < NM; ++m) y[m * ldy] = _mm512_reduce_add_ps(acc[m]) - hsum128(accm[m]);
}

// ---- Q6_K --------------------------------------------------------------------------------------
template <int NM>
void row_q6k(const uint8_t* row, const ActK& a, int64_t m0, float* y, int64_t ldy) {
  const int64_t nsb = a.nsb;
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  const __m512i shl = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4);  // s=0 bits 0-1, s=1 bits 2-3 -> 4-5
  const __m512i shr = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);  // s=2 bits 4-5, s=3 bits 6-7 -> 4-5
  __m512i idx[4];
  #pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    idx[j] = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16(short(4 * j + 1)), _mm_set1_epi16(short(4 * j)))),
        _mm256_set_m128i(_mm_set1_epi16(short(4 * j + 3)), _mm_set1_epi16(short(4 * j + 2))), 1);
  }
  __m512 acc[NM];
  #pragma GCC unroll 4
  for (int m = 0; m < NM; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nsb; ++i) {
    const uint8_t* b = row + i * kQ6_KBytes;
    const float d = f16(b + 208);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + 192)));
    const __m512i scz = _mm512_castsi256_si512(sc16);
    __m512i S[4], W[4];
    #pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) S[j] = _mm512_permutexvar_epi16(idx[j], scz);
    #pragma GCC unroll 4
    for (int h = 0; h < 2; ++h) {
      const __m512i v = _mm512_loadu_si512(b + 64 * h);
      const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(b + 128 + 32 * h)));
      // A | (B & C): imm 0xF8
      W[2 * h] = _mm512_ternarylogic_epi32(_mm512_and_si512(v, m4), _mm512_sllv_epi64(H, shl), m30, 0xF8);
      W[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                                               _mm512_srlv_epi64(H, shr), m30, 0xF8);
    }
    #pragma GCC unroll 4
    for (int m = 0; m < NM; ++m) {
      const int64_t k = (m0 + m) * nsb + i;
      const int8_t* xq = &a.qs[k * QKK];
      __m512i s0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                       _mm512_maddubs_epi16(W[0], _mm512_loadu_si512(xq)), S[0]);
      __m512i s1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                       _mm512_maddubs_epi16(W[1], _mm512_loadu_si512(xq + 64)), S[1]);
      s0 = _mm512_dpwssd_epi32(s0, _mm512_maddubs_epi16(W[2], _mm512_loadu_si512(xq + 128)), S[2]);
      s1 = _mm512_dpwssd_epi32(s1, _mm512_maddubs_epi16(W[3], _mm512_loadu_si512(xq + 192)), S[3]);
      // codes are q+32: subtract 32 * sum_g sc_g * bsum16_g
      const __m256i c = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i*)&a.bs16[k * 16]));
      const __m512i s = _mm512_sub_epi32(_mm512_add_epi32(s0, s1),
                                         _mm512_zextsi256_si512(_mm256_slli_epi32(c, 5)));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(d * a.d[k]), acc[m]);
    }
  }
  #pragma GCC unroll 4
  for (int m = 0; m < NM; ++m) y[m * ldy] = _mm512_reduce_add_ps(acc[m]);
}

// ---- Q8_0 / Q4_0 / Q5_0: blocks in pairs ----------------------------------------------------------
// Unpacks the blocks at b0, b1 into 64 unsigned codes (PairA order) and their scales per lane.
template <int FMT>  // FMT: 0 = Q8_0, 1 = Q4_0, 2 = Q5_0
struct PairUnpack {
  const __m512i m4 = _mm512_set1_epi8(0x0F), x80 = _mm512_set1_epi8(char(0x80)), s16 = _mm512_set1_epi8(16);
  const __m512i didx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i dup = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0), nib = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
  static constexpr int bb = FMT == 0 ? kQ8_0Bytes : FMT == 1 ? kQ4_0Bytes : kQ5_0Bytes;

  inline __m512i codes(const uint8_t* b0, const uint8_t* b1) const {
    if constexpr (FMT == 0) {
      const __m512i W = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(b0 + 2))),
                                           _mm256_loadu_si256((const __m256i*)(b1 + 2)), 1);
      return _mm512_xor_si512(W, x80);  // signed -> unsigned (+128)
    } else {
      // [qs0 | qs0 | qs1 | qs1] >> [0, 4, 0, 4] & 15: both blocks in value order (layout PairA).
      constexpr int off = FMT == 1 ? 2 : 6;
      const __m256i v = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(b0 + off))),
          _mm_loadu_si128((const __m128i*)(b1 + off)), 1);
      __m512i W = _mm512_and_si512(_mm512_srlv_epi64(_mm512_permutexvar_epi64(dup, _mm512_castsi256_si512(v)), nib), m4);
      if constexpr (FMT == 2) {
        const __mmask64 k = _mm512_kunpackd(__mmask64(rd32(b1 + 2)), __mmask64(rd32(b0 + 2)));
        W = _mm512_mask_add_epi8(W, k, W, s16);
      }
      return W;
    }
  }
  inline __m512 scales(const uint8_t* b0, const uint8_t* b1) const {
    const uint32_t dd = uint32_t(rd16(b0)) | uint32_t(rd16(b1)) << 16;
    return _mm512_permutexvar_ps(didx, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(int(dd)))));
  }
};

template <int FMT, int NM>
void row_pair(const uint8_t* row, int64_t nblocks, const ActPair& a, int64_t m0, float* y, int64_t ldy) {
  const PairUnpack<FMT> u;
  constexpr int bb = PairUnpack<FMT>::bb;
  const int64_t np = a.npair;
  __m512 acc[NM];
  #pragma GCC unroll 4
  for (int m = 0; m < NM; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t p = 0; p < np; ++p) {
    const uint8_t* b0 = row + 2 * p * bb;
    const uint8_t* b1 = 2 * p + 1 < nblocks ? b0 + bb : b0;  // odd tail: activations are zero
    const __m512i W = u.codes(b0, b1);
    const __m512 dw = u.scales(b0, b1);
    #pragma GCC unroll 4
    for (int m = 0; m < NM; ++m) {
      const int64_t k = (m0 + m) * np + p;
      const __m512i s = _mm512_dpbusd_epi32(_mm512_loadu_si512(&a.init[k * 16]), W, _mm512_loadu_si512(&a.qs[k * 64]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_loadu_ps(&a.dx[k * 16])), acc[m]);
    }
  }
  #pragma GCC unroll 4
  for (int m = 0; m < NM; ++m) y[m * ldy] = _mm512_reduce_add_ps(acc[m]);
}

// M = 1, two weight rows per pass (decode): the activation loads are shared by both rows.
template <int FMT>
void rows2_pair(const uint8_t* r0, const uint8_t* r1, int64_t nblocks, const ActPair& a, float* y) {
  const PairUnpack<FMT> u;
  constexpr int bb = PairUnpack<FMT>::bb;
  const int64_t np = a.npair, full = nblocks / 2;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  auto step = [&](int64_t p, int64_t o1) __attribute__((always_inline)) {
    const __m512i xi = _mm512_loadu_si512(&a.init[p * 16]), xq = _mm512_loadu_si512(&a.qs[p * 64]);
    const __m512 dx = _mm512_loadu_ps(&a.dx[p * 16]);
    const uint8_t* a0 = r0 + 2 * p * bb;
    const uint8_t* a1 = r1 + 2 * p * bb;
    const __m512i s0 = _mm512_dpbusd_epi32(xi, u.codes(a0, a0 + o1), xq);
    const __m512i s1 = _mm512_dpbusd_epi32(xi, u.codes(a1, a1 + o1), xq);
    acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(u.scales(a0, a0 + o1), dx), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(u.scales(a1, a1 + o1), dx), acc1);
  };
  for (int64_t p = 0; p < full; ++p) step(p, bb);
  if (full < np) step(full, 0);  // odd block count: the pair's second activation block is zero
  y[0] = _mm512_reduce_add_ps(acc0);
  y[1] = _mm512_reduce_add_ps(acc1);
}

template <class F>
void tile_rows(int64_t M, F&& f) {
  int64_t m0 = 0;
  for (; m0 + MT <= M; m0 += MT) f(std::integral_constant<int, MT>{}, m0);
  switch (M - m0) {
    case 3: f(std::integral_constant<int, 3>{}, m0); break;
    case 2: f(std::integral_constant<int, 2>{}, m0); break;
    case 1: f(std::integral_constant<int, 1>{}, m0); break;
    default: break;
  }
}

}  // namespace

void rows_k_avx512(const void* w_data, int64_t row_bytes, WFormat fmt, const ActK& a, int64_t M,
                   int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const uint8_t* end = static_cast<const uint8_t*>(w_data) + r1 * row_bytes;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(w_data) + r * row_bytes;
    if (M == 1) {  // decode streams the weights once: software prefetch kPrefetchRows ahead
      const uint8_t* pf0 = row + kPrefetchRows * row_bytes;
      for (const uint8_t* pf = pf0; pf < std::min(pf0 + row_bytes, end); pf += 64)
        _mm_prefetch(reinterpret_cast<const char*>(pf), _MM_HINT_T0);
    }
    tile_rows(M, [&](auto nm, int64_t m0) {
      constexpr int NM = decltype(nm)::value;
      float* yo = y + m0 * ldy + r;
      if (fmt == WFormat::GgufQ4_K) row_q45k<false, NM>(row, a, m0, yo, ldy);
      else if (fmt == WFormat::GgufQ5_K) row_q45k<true, NM>(row, a, m0, yo, ldy);
      else row_q6k<NM>(row, a, m0, yo, ldy);
    });
  }
}

void rows_pair_avx512(const void* w_data, int64_t row_bytes, WFormat fmt, int64_t nblocks,
                      const ActPair& a, int64_t M, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const uint8_t* base = static_cast<const uint8_t*>(w_data);
  int64_t r = r0;
  if (M == 1) {
    // Software prefetch of the next row pair: on the lm head (680-byte rows, 178 MB) it lifts the
    // streamed bandwidth by about 13 % over the hardware prefetchers alone (bench, 2 threads).
    const uint8_t* end = base + r1 * row_bytes;
    for (; r + 2 <= r1; r += 2) {
      const uint8_t* p0 = base + r * row_bytes;
      for (const uint8_t* pf = p0 + 2 * row_bytes; pf < std::min(p0 + 4 * row_bytes, end); pf += 64)
        _mm_prefetch(reinterpret_cast<const char*>(pf), _MM_HINT_T0);
      if (fmt == WFormat::GgufQ8_0) rows2_pair<0>(p0, p0 + row_bytes, nblocks, a, y + r);
      else if (fmt == WFormat::GgufQ4_0) rows2_pair<1>(p0, p0 + row_bytes, nblocks, a, y + r);
      else rows2_pair<2>(p0, p0 + row_bytes, nblocks, a, y + r);
    }
  }
  for (; r < r1; ++r) {
    const uint8_t* row = base + r * row_bytes;
    tile_rows(M, [&](auto nm, int64_t m0) {
      constexpr int NM = decltype(nm)::value;
      float* yo = y + m0 * ldy + r;
      if (fmt == WFormat::GgufQ8_0) row_pair<0, NM>(row, nblocks, a, m0, yo, ldy);
      else if (fmt == WFormat::GgufQ4_0) row_pair<1, NM>(row, nblocks, a, m0, yo, ldy);
      else row_pair<2, NM>(row, nblocks, a, m0, yo, ldy);
    });
  }
}

}  // namespace g4::gguf
