// llama.cpp-exact GGUF matmuls (ggml_exact.h). Compiled with AVX-512 and -ffp-contract=off: every
// fused multiply-add below is explicit, in the place llama.cpp's kernel has one. Integer partial
// sums are exact whatever the grouping, so the kernels compute them the fastest way (unsigned
// codes with a bias fix-up, 512-bit dot products, scales applied before the reduction); only the
// floating-point chain of each output element has to be llama.cpp's, and each kernel's comment
// names the llama.cpp routine whose chain it reproduces.
#include <immintrin.h>

// GCC 12's own AVX-512 intrinsic bodies start from an undefined vector and trip
// -Wmaybe-uninitialized when inlined here; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

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

inline __m512i bcast256(const void* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
}
inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
inline __m512i dot_u8_s8(__m512i u, __m512i s) { return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s); }
// 16 int32 lanes: lanes 4j..4j+3 = v[j] (j < 4).
inline __m512i spread4(int a, int b, int c, int d) {
  return _mm512_set_epi32(d, d, d, d, c, c, c, c, b, b, b, b, a, a, a, a);
}
// 16 int32 lanes: lanes 0-7 = a, 8-15 = b.
inline __m512i spread8(int a, int b) {
  return _mm512_inserti32x8(_mm512_set1_epi32(a), _mm256_set1_epi32(b), 1);
}

// The four lane sums of v[0..3] (exact integers, so the grouping is free): out[j] = Σ lanes of v[j].
inline void reduce4_epi32(const __m512i* v, int32_t* out) {
  const __m512i a = _mm512_add_epi32(_mm512_shuffle_i32x4(v[0], v[1], 0x44), _mm512_shuffle_i32x4(v[0], v[1], 0xEE));
  const __m512i b = _mm512_add_epi32(_mm512_shuffle_i32x4(v[2], v[3], 0x44), _mm512_shuffle_i32x4(v[2], v[3], 0xEE));
  __m512i c = _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, 0x88), _mm512_shuffle_i32x4(a, b, 0xDD));
  c = _mm512_add_epi32(c, _mm512_shuffle_epi32(c, _MM_PERM_BADC));
  c = _mm512_add_epi32(c, _mm512_shuffle_epi32(c, _MM_PERM_CDAB));
  alignas(64) int32_t t[16];
  _mm512_store_si512(t, c);
  out[0] = t[0], out[1] = t[4], out[2] = t[8], out[3] = t[12];
}

// ---- activations, quantized as llama.cpp quantizes src1 -------------------------------------

struct Act32 {  // quantize_row_q8_0: per 32 values int8 codes and the f16-rounded scale
  int64_t nb = 0;
  std::vector<int8_t> q;      // [M][nb][32]
  std::vector<float> d;       // [M][nb]
  std::vector<int32_t> init;  // [M][nb][8]: -bias * (codes 4L..4L+3 summed), lane L
};
struct Act256 {  // quantize_row_q8_K: per 256 values codes, scale and 16 sums of 16 codes
  int64_t nb = 0;
  std::vector<int8_t> q;      // [M][nb][256]
  std::vector<float> d;       // [M][nb]
  std::vector<int32_t> bsum;  // [M][nb][16]
};

void quantize32(const float* x, int64_t M, int64_t cols, int bias, Act32* a) {
  a->nb = cols / QK;
  a->q.resize(size_t(M * cols));
  a->d.resize(size_t(M * a->nb));
  a->init.resize(size_t(M * a->nb * 8));
  for (int64_t k = 0; k < M * a->nb; ++k) {
    a->d[k] = quantize_block(x + k * QK, QK, &a->q[k * QK]);
    for (int L = 0; L < 8; ++L) {
      const int8_t* q = &a->q[k * QK + 4 * L];
      a->init[k * 8 + L] = -bias * (q[0] + q[1] + q[2] + q[3]);
    }
  }
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

// ---- weight rows, decoded to unsigned codes and scales ----------------------------------------

// Q8_0 / Q5_0 / Q4_0 block: the 32 codes as unsigned bytes u = code + bias (128, 16, 8), in
// value order. Σ code·a = Σ u·a - bias·Σ a, per 4-value lane exactly.
int bias_q0(WFormat f) { return f == WFormat::GgufQ8_0 ? 128 : f == WFormat::GgufQ5_0 ? 16 : 8; }

inline __m256i unsigned_codes_q0(WFormat f, const uint8_t* blk) {
  if (f == WFormat::GgufQ8_0)
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)),
                            _mm256_set1_epi8(char(0x80)));
  const uint8_t* qs = blk + (f == WFormat::GgufQ5_0 ? 6 : 2);
  const __m128i n = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i lo_hi = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(n, 4), n), _mm256_set1_epi8(15));
  if (f == WFormat::GgufQ4_0) return lo_hi;
  // Q5_0: bit j of qh is the fifth bit of value j.
  const __m256i qh = _mm256_set1_epi32(int(rd32(blk + 2)));
  const __m256i spread = _mm256_shuffle_epi8(
      qh, _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_or_si256(lo_hi, _mm256_and_si256(set, _mm256_set1_epi8(16)));
}

// Q6_K super-block: unsigned codes u[256] in [0, 64) in value order (ggml's dequantize_row_q6_K
// layout), int8 scales per 16 values, dx.
void decode_q6k(const uint8_t* blk, uint8_t* u, int8_t* sc, float* dx) {
  const __m256i m4 = _mm256_set1_epi8(15);
  for (int h = 0; h < 2; ++h) {
    const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
    const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
    const __m256i c0 = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                       _mm256_slli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(3)), 4));
    const __m256i c1 = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                       _mm256_slli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(12)), 2));
    const __m256i c2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                       _mm256_and_si256(hb, _mm256_set1_epi8(48)));
    const __m256i c3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_srli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(char(0xC0))), 2));
    __m256i* o = reinterpret_cast<__m256i*>(u + 128 * h);
    _mm256_storeu_si256(o, c0);
    _mm256_storeu_si256(o + 1, c1);
    _mm256_storeu_si256(o + 2, c2);
    _mm256_storeu_si256(o + 3, c3);
  }
  std::memcpy(sc, blk + 192, 16);
  *dx = _cvtsh_ss(rd16(blk + 208));
}

// Q4_K super-block: codes u[256] in [0, 16) in value order, 6-bit scales and mins per 32, d, dmin.
void decode_q4k(const uint8_t* blk, uint8_t* u, uint8_t* sc, uint8_t* mn, float* dx, float* dmin) {
  *dx = _cvtsh_ss(rd16(blk));
  *dmin = _cvtsh_ss(rd16(blk + 2));
  for (int s = 0; s < 8; ++s) scale_min_k4(s, blk + 4, &sc[s], &mn[s]);
  const __m256i m4 = _mm256_set1_epi8(15);
  for (int c = 0; c < 4; ++c) {  // sub-blocks 2c (low nibbles) and 2c+1 (high nibbles)
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + 64 * c), _mm256_and_si256(v, m4));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + 64 * c + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
  }
}

// ---- kernels ---------------------------------------------------------------------------------

// tinyBLAS_Q0_AVX::gemm / ggml_vec_dot_q{8,5,4}_0_q8_0 (AVX2 bodies): per output 8 f32 lanes,
// lane L += (dw*da) * Σ code·a over values 4L..4L+3 by one fma per block, then hsum8. Weight
// rows r and r+1 share one 512-bit chain (lanes 0-7 row r, 8-15 row r+1) and NM activation rows
// are done per pass over the decoded weights; each lane's chain is the one llama.cpp runs.
template <int NM>
void q0_tile(const uint8_t* u, const float* dwv, int64_t nb, const Act32& a, int64_t m0,
             __m512* acc) {
  for (int j = 0; j < NM; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m512i U = load512(u + b * 64);
    const __m512 DW = _mm512_loadu_ps(dwv + b * 16);
    for (int j = 0; j < NM; ++j) {
      const int64_t k = (m0 + j) * nb + b;
      const __m512i s = _mm512_dpbusd_epi32(bcast256(&a.init[k * 8]), U, bcast256(&a.q[k * QK]));
      const __m512 d = _mm512_mul_ps(DW, _mm512_set1_ps(a.d[k]));
      acc[j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[j]);
    }
  }
}

void rows_q0(const WeightView& w, int64_t r, int64_t r1, const Act32& a, int64_t M, float* y) {
  const int64_t nb = a.nb, bb = gguf_block_bytes(w.fmt);
  const bool two = r + 1 < r1;
  thread_local std::vector<uint8_t> u;  // [nb][64]: row r's codes | row r+1's codes per block
  thread_local std::vector<float> dwv;  // [nb][16]: row r's scale x8 | row r+1's x8
  u.resize(size_t(nb * 64));
  dwv.resize(size_t(nb * 16));
  const uint8_t* row0 = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
  const uint8_t* row1 = two ? row0 + w.row_bytes : row0;
  for (int64_t k = 0; k < w.row_bytes * 2; k += 64)  // the next pair, ahead of use
    _mm_prefetch(reinterpret_cast<const char*>(row0 + 2 * w.row_bytes + k), _MM_HINT_T0);
  for (int64_t b = 0; b < nb; ++b) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&u[b * 64]), unsigned_codes_q0(w.fmt, row0 + b * bb));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&u[b * 64 + 32]), unsigned_codes_q0(w.fmt, row1 + b * bb));
    _mm512_storeu_ps(&dwv[b * 16], _mm512_insertf32x8(_mm512_set1_ps(_cvtsh_ss(rd16(row0 + b * bb))),
                                                      _mm256_set1_ps(_cvtsh_ss(rd16(row1 + b * bb))), 1));
  }
  __m512 acc[4];
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const int64_t nm = std::min<int64_t>(4, M - m0);
    switch (nm) {
      case 4: q0_tile<4>(u.data(), dwv.data(), nb, a, m0, acc); break;
      case 3: q0_tile<3>(u.data(), dwv.data(), nb, a, m0, acc); break;
      case 2: q0_tile<2>(u.data(), dwv.data(), nb, a, m0, acc); break;
      default: q0_tile<1>(u.data(), dwv.data(), nb, a, m0, acc); break;
    }
    for (int64_t j = 0; j < nm; ++j) {
      y[(m0 + j) * w.rows + r] = hsum8(_mm512_castps512_ps256(acc[j]));
      if (two) y[(m0 + j) * w.rows + r + 1] = hsum8(_mm512_extractf32x8_ps(acc[j], 1));
    }
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

// ggml_vec_dot_q6_K_q8_K (AVX2 body), for M < 8: per super-block 8 int32 lanes, lane L = Σ over
// the 32-value chunks c of scale * Σ code·q8 over values 32c+4L..32c+4L+3 (scale 2c for L < 4,
// 2c+1 otherwise), minus 32 * (bsum[2L]*sc[2L] + bsum[2L+1]*sc[2L+1]); lane += (dy*dx) * lane by
// fma; hsum8 at the end. Two chunks per 512-bit dot product (lanes 8-15 = the odd chunk).
void row_q6k_vecdot(const WeightView& w, int64_t r, const Act256& a, int64_t M, float* y) {
  thread_local Q6Row x;
  const int64_t nb = a.nb;
  decode_q6k_row(w, r, nb, &x);
  for (int64_t m = 0; m < M; ++m) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      const int64_t k = m * nb + i;
      const uint8_t* u = &x.u[i * QKK];
      const int8_t* q = &a.q[k * QKK];
      const int8_t* sc = &x.sc[i * 16];
      const int32_t* bs = &a.bsum[k * 16];
      __m512i isum = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) {  // chunks 2p and 2p+1
        const __m512i d = dot_u8_s8(load512(u + 64 * p), load512(q + 64 * p));
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(d, spread4(sc[4 * p], sc[4 * p + 1], sc[4 * p + 2], sc[4 * p + 3])));
      }
      __m256i lanes = _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti32x8_epi32(isum, 1));
      alignas(32) int32_t sub[8];
      for (int L = 0; L < 8; ++L) sub[L] = 32 * (bs[2 * L] * sc[2 * L] + bs[2 * L + 1] * sc[2 * L + 1]);
      lanes = _mm256_sub_epi32(lanes, _mm256_load_si256(reinterpret_cast<const __m256i*>(sub)));
      const float d = a.d[k] * x.dx[i];
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
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
      const uint8_t* u = &x.u[i * QKK];
      const int8_t* q = &a.q[k * QKK];
      const int8_t* sc = &x.sc[i * 16];
      __m512i acc = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) {  // values 64p..64p+63: sub-blocks 4p..4p+3, 4 lanes each
        const __m512i d = dot_u8_s8(load512(u + 64 * p), load512(q + 64 * p));
        acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(d, spread4(sc[4 * p], sc[4 * p + 1], sc[4 * p + 2], sc[4 * p + 3])));
      }
      int32_t S = _mm512_reduce_add_epi32(acc);
      for (int s = 0; s < 16; ++s) S -= 32 * int32_t(sc[s]) * a.bsum[k * 16 + s];
      const float t = float(S) * x.dx[i];
      out = std::fma(t, a.d[k], out);
    }
    y[m * w.rows + r] = out;
  }
}

// ggml_gemm_q4_K_8x8_q8_K (rows m < gemm_rows: one fma per 64 values, acc += float(I) * (dx*dy),
// mins likewise into a second sum; out = acc - mins) and ggml_gemv_q4_K_8x8_q8_K (the remaining
// rows: the same with one fma per 256 values).
void row_q4k(const WeightView& w, int64_t r, const Act256& a, int64_t M, int64_t gemm_rows,
             float* y) {
  thread_local std::vector<uint8_t> u;
  thread_local std::vector<uint8_t> sc, mn;
  thread_local std::vector<float> dx, dmin;
  thread_local std::vector<int32_t> scv;  // [nb][4][16]: scale of sub-block 2c (x8) | 2c+1 (x8)
  const int64_t nb = a.nb;
  u.resize(size_t(nb * QKK));
  scv.resize(size_t(nb * 64));
  sc.resize(size_t(nb * 8));
  mn.resize(size_t(nb * 8));
  dx.resize(size_t(nb));
  dmin.resize(size_t(nb));
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
  for (int64_t i = 0; i < nb; ++i)
    decode_q4k(row + i * kQ4_KBytes, &u[i * QKK], &sc[i * 8], &mn[i * 8], &dx[i], &dmin[i]);
  for (int64_t i = 0; i < nb; ++i)
    for (int c = 0; c < 4; ++c) _mm512_storeu_si512(&scv[size_t((i * 4 + c) * 16)], spread8(sc[i * 8 + 2 * c], sc[i * 8 + 2 * c + 1]));
  for (int64_t m = 0; m < M; ++m) {
    const bool per_pair = m < gemm_rows;
    float acc = 0.f, acc_min = 0.f;
    for (int64_t i = 0; i < nb; ++i) {
      const int64_t k = m * nb + i;
      const float dy = a.d[k];
      const float ds = dx[i] * dy, dm = dmin[i] * dy;
      const uint8_t* m8 = &mn[i * 8];
      const int32_t* bs = &a.bsum[k * 16];
      __m512i scaled[4];
      int32_t I[4];
      for (int c = 0; c < 4; ++c) {  // sub-blocks 2c (lanes 0-7) and 2c+1 (lanes 8-15)
        const __m512i d = dot_u8_s8(load512(&u[i * QKK + 64 * c]), load512(&a.q[k * QKK + 64 * c]));
        scaled[c] = _mm512_mullo_epi32(d, load512(&scv[size_t((i * 4 + c) * 16)]));
      }
      reduce4_epi32(scaled, I);
      if (per_pair) {
        for (int c = 0; c < 4; ++c) {
          const int32_t imin = m8[2 * c] * (bs[4 * c] + bs[4 * c + 1]) + m8[2 * c + 1] * (bs[4 * c + 2] + bs[4 * c + 3]);
          acc = std::fma(float(I[c]), ds, acc);
          acc_min = std::fma(float(imin), dm, acc_min);
        }
      } else {
        int32_t imin = 0;
        for (int s = 0; s < 8; ++s) imin += m8[s] * (bs[2 * s] + bs[2 * s + 1]);
        acc = std::fma(float(I[0] + I[1] + I[2] + I[3]), ds, acc);
        acc_min = std::fma(float(imin), dm, acc_min);
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
  // Chunks of >= ~16 KiB of weights, an even number of rows (the Q0 kernel pairs rows).
  const int64_t chunk = std::max<int64_t>(2, ((int64_t(16) << 10) / std::max<int64_t>(1, w.row_bytes) + 1) & ~int64_t(1));
  if (gguf_block_size(w.fmt) == QK) {
    thread_local Act32 a;
    quantize32(x, M, w.cols, bias_q0(w.fmt), &a);
    const Act32* ap = &a;  // the caller's buffer: workers have their own thread_local
    auto body = [&w, ap, M, y](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r += 2) rows_q0(w, r, r1, *ap, M, y);
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
  parallel_for(w.rows, std::ref(body), std::max<int64_t>(1, chunk / 2));
}

}  // namespace g4::ggml_exact
