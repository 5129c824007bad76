// AMX-INT8 path of gguf_matmul_fast for prefill-sized M (Sapphire Rapids and later).
// Compiled with the *_avx512.cpp flags plus the AMX target below; called only after
// cpu_has_amx() (CPUID + the kernel's XTILEDATA permission).
//
// Scheme (all six formats): weights are the tile A operand, activations the B operand.
//  * A group of 16 weight rows is decoded once into signed int8 codes, chunk-major
//    (W[chunk][16][CK], so that one A tile is contiguous), with one f32
//    scale per chunk of CK values (CK = 32; 16 for Q6_K, whose sub-blocks are 16 wide) and, for
//    Q4_K / Q5_K, one f32 min per 32-chunk: w = scale * code - min (ggml's block math).
//  * x is quantized once per call (per 32 values, or per 256 for K-quants, d = amax/127) and
//    stored per 16-row tile in AMX's B layout (4 consecutive k of one row side by side).
//  * Per chunk: C[n][m] = sum_k W[n][k] * xq[m][k] (tdpbssd, int32, exact), then
//    acc[n][m] += C[n][m] * dx[m] * scale[n] - min[n] * dx[m] * sum_k xq[m][k] in f32.
#pragma GCC target("amx-tile,amx-int8")
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "core/thread_pool.h"
#include "quant/gguf_act.h"
#include "quant/gguf_amx.h"
#include "quant/gguf_blocks.h"
#include "quant/gguf_quant.h"

namespace g4::gguf {
namespace {

struct TileCfg {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles: 0-3 = C (16 x 16 int32); 4,5 = A (16 rows x CK bytes); 6,7 = B (CK/4 rows x 64 bytes).
void config_tiles(int ck) {
  TileCfg c;
  for (int t : {0, 1, 2, 3}) c.rows[t] = 16, c.colsb[t] = 64;
  for (int t : {4, 5}) c.rows[t] = 16, c.colsb[t] = uint16_t(ck);
  for (int t : {6, 7}) c.rows[t] = uint8_t(ck / 4), c.colsb[t] = 64;
  _tile_loadconfig(&c);
}

bool has_min(WFormat f) { return f == WFormat::GgufQ4_K || f == WFormat::GgufQ5_K; }

}  // namespace

int amx_chunk(WFormat f) { return f == WFormat::GgufQ6_K ? 16 : 32; }

void decode_row_chunked(WFormat f, const uint8_t* row, int64_t cols, int8_t* codes, int64_t cs,
                        float* scale, float* mn) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  switch (f) {
    case WFormat::GgufQ8_0:
    case WFormat::GgufQ4_0:
    case WFormat::GgufQ5_0: {
      const int bb = gguf_block_bytes(f);
      const __m256i off = _mm256_set1_epi8(f == WFormat::GgufQ4_0 ? 8 : 16), s16 = _mm256_set1_epi8(16);
      for (int64_t b = 0; b < cols / QK; ++b) {
        const uint8_t* p = row + b * bb;
        scale[b] = _cvtsh_ss(rd16(p));
        __m256i q;
        if (f == WFormat::GgufQ8_0) {
          q = _mm256_loadu_si256((const __m256i*)(p + 2));
        } else {
          const __m128i v = _mm_loadu_si128((const __m128i*)(p + (f == WFormat::GgufQ4_0 ? 2 : 6)));
          q = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1), m4);
          if (f == WFormat::GgufQ5_0) q = _mm256_mask_add_epi8(q, __mmask32(rd32(p + 2)), q, s16);
          q = _mm256_sub_epi8(q, off);
        }
        _mm256_storeu_si256((__m256i*)(codes + b * cs), q);
      }
      return;
    }
    case WFormat::GgufQ4_K:
    case WFormat::GgufQ5_K: {
      const bool q5 = f == WFormat::GgufQ5_K;
      const int bb = gguf_block_bytes(f);
      const __m256i s16 = _mm256_set1_epi8(16);
      for (int64_t i = 0; i < cols / QKK; ++i) {
        const uint8_t* b = row + i * bb;
        const float d = _cvtsh_ss(rd16(b)), dmin = _cvtsh_ss(rd16(b + 2));
        // get_scale_min_k4 for all 8 sub-blocks (llama.cpp's kmask trick), then d*sc and dmin*m.
        uint32_t u[4];
        std::memcpy(u, b + 4, 12);
        u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
        const uint32_t mins_lo = u[1] & 0x3f3f3f3f;
        u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
        u[0] &= 0x3f3f3f3f;
        u[2] = mins_lo;
        const __m256 vs = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, int(u[1]), int(u[0]))));
        const __m256 vm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, int(u[3]), int(u[2]))));
        _mm256_storeu_ps(scale + i * 8, _mm256_mul_ps(_mm256_set1_ps(d), vs));
        _mm256_storeu_ps(mn + i * 8, _mm256_mul_ps(_mm256_set1_ps(dmin), vm));
        const __m256i qh = _mm256_loadu_si256((const __m256i*)(b + 16));
        const uint8_t* qs = b + (q5 ? 48 : 16);
        int8_t* o = codes + i * 8 * cs;  // sub-block s is chunk 8i + s
        for (int c = 0; c < 4; ++c) {
          const __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
          __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
          if (q5) {
            lo = _mm256_mask_add_epi8(lo, _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(1 << (2 * c)))), lo, s16);
            hi = _mm256_mask_add_epi8(hi, _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(1 << (2 * c + 1)))), hi, s16);
          }
          _mm256_storeu_si256((__m256i*)(o + (2 * c) * cs), lo);
          _mm256_storeu_si256((__m256i*)(o + (2 * c + 1) * cs), hi);
        }
      }
      return;
    }
    case WFormat::GgufQ6_K: {
      const __m512i z4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), s32 = _mm512_set1_epi8(32);
      const __m512i shl = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4), shr = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
      for (int64_t i = 0; i < cols / QKK; ++i) {
        const uint8_t* b = row + i * kQ6_KBytes;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        const float d = _cvtsh_ss(rd16(b + 208));
        _mm512_storeu_ps(scale + i * 16, _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                               _mm_loadu_si128((const __m128i*)sc)))));
        int8_t* o = codes + i * 16 * cs;  // 16-value group g is chunk 16i + g
        for (int h = 0; h < 2; ++h) {
          const __m512i v = _mm512_loadu_si512(b + 64 * h);
          const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(b + 128 + 32 * h)));
          const __m512i q0 = _mm512_ternarylogic_epi32(_mm512_and_si512(v, z4), _mm512_sllv_epi64(H, shl), m30, 0xF8);
          const __m512i q1 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v, 4), z4),
                                                       _mm512_srlv_epi64(H, shr), m30, 0xF8);
          const __m512i c0 = _mm512_sub_epi8(q0, s32), c1 = _mm512_sub_epi8(q1, s32);
          int8_t* oh = o + 8 * h * cs;
          _mm_storeu_si128((__m128i*)(oh + 0 * cs), _mm512_extracti32x4_epi32(c0, 0));
          _mm_storeu_si128((__m128i*)(oh + 1 * cs), _mm512_extracti32x4_epi32(c0, 1));
          _mm_storeu_si128((__m128i*)(oh + 2 * cs), _mm512_extracti32x4_epi32(c0, 2));
          _mm_storeu_si128((__m128i*)(oh + 3 * cs), _mm512_extracti32x4_epi32(c0, 3));
          _mm_storeu_si128((__m128i*)(oh + 4 * cs), _mm512_extracti32x4_epi32(c1, 0));
          _mm_storeu_si128((__m128i*)(oh + 5 * cs), _mm512_extracti32x4_epi32(c1, 1));
          _mm_storeu_si128((__m128i*)(oh + 6 * cs), _mm512_extracti32x4_epi32(c1, 2));
          _mm_storeu_si128((__m128i*)(oh + 7 * cs), _mm512_extracti32x4_epi32(c1, 3));
        }
      }
      return;
    }
    default: return;
  }
}

void decode_group16(WFormat f, const WeightView& w, int64_t r0, int8_t* codes, float* scale, float* mn,
                    bool prefetch_next) {
  const int ck = amx_chunk(f);
  const int64_t cols = w.cols, nch = cols / ck, nr = std::min<int64_t>(16, w.rows - r0);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  for (int64_t n = 0; n < 16; ++n) {
    if (n < nr) {
      if (prefetch_next && r0 + 16 + n < w.rows) {
        const uint8_t* ahead = base + (r0 + 16 + n) * w.row_bytes;
        for (int64_t k = 0; k < w.row_bytes; k += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + k), _MM_HINT_T0);
      }
      decode_row_chunked(f, base + (r0 + n) * w.row_bytes, cols, codes + n * ck, 16 * ck, scale + n * nch, mn + n * nch);
    } else {
      for (int64_t c = 0; c < nch; ++c) std::memset(codes + c * 16 * ck + n * ck, 0, size_t(ck));
      std::fill(scale + n * nch, scale + (n + 1) * nch, 0.f);
      std::fill(mn + n * nch, mn + (n + 1) * nch, 0.f);
    }
  }
}

namespace {

// In-place transpose of a 16 x 16 f32 matrix held in 16 registers: four rounds that swap the
// off-diagonal b x b blocks (b = 8, 4, 2, 1) with vpermt2ps.
template <int B>
inline void swap_blocks(__m512 (&r)[16]) {
  alignas(64) int lo[16], hi[16];
  for (int j = 0; j < 16; ++j) {
    lo[j] = (j & B) == 0 ? j : 16 + (j - B);
    hi[j] = (j & B) == 0 ? j + B : 16 + j;
  }
  const __m512i il = _mm512_load_si512(lo), ih = _mm512_load_si512(hi);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    if (i & B) continue;
    const __m512 a = r[i], b = r[i + B];
    r[i] = _mm512_permutex2var_ps(a, il, b);
    r[i + B] = _mm512_permutex2var_ps(a, ih, b);
  }
}
inline void transpose16(__m512 (&r)[16]) {
  swap_blocks<8>(r);
  swap_blocks<4>(r);
  swap_blocks<2>(r);
  swap_blocks<1>(r);
}

}  // namespace

namespace {
bool g_amx_on = true;
int64_t g_amx_min_rows = 0;
}  // namespace
void set_amx_min_rows(int64_t m) { g_amx_min_rows = m; }
int64_t amx_min_rows(WFormat fmt) {
  if (g_amx_min_rows > 0) return g_amx_min_rows;
  switch (fmt) {
    case WFormat::GgufQ8_0: return 4;
    case WFormat::GgufQ4_0:
    case WFormat::GgufQ5_0: return 6;
    case WFormat::GgufQ6_K: return 10;
    default: return 8;
  }
}
void set_amx_enabled(bool on) { g_amx_on = on; }
bool amx_enabled() { return g_amx_on && cpu_has_amx(); }

bool cpu_has_amx() {
  static const bool ok = [] {
    // CPUID.(EAX=7, ECX=0):EDX bit 24 AMX-TILE, bit 25 AMX-INT8 (read directly: clang's
    // __builtin_cpu_supports has no AMX names).
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
    // Linux: ask for the XTILEDATA state (ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18).
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return ok;
}

void quantize_act_amx(const float* x, int64_t M, int64_t cols, int block, ActAmx* a) {
  const int64_t nb = cols / QK, nt = (M + 15) / 16;
  a->ntiles = nt;
  a->nblk = nb;
  a->xb.assign(size_t(nt * nb * 512), 0);
  a->dx.assign(size_t(nt * nb * 16), 0.f);
  a->sx.assign(size_t(nt * nb * 16), 0.f);
  for (int64_t m = 0; m < M; ++m) {
    const int64_t t = m / 16, mi = m % 16;
    for (int64_t c0 = 0; c0 < cols; c0 += block) {
      const float* xr = x + m * cols + c0;
      __m512 vmax = _mm512_setzero_ps();
      for (int i = 0; i < block; i += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(xr + i)));
      const float amax = _mm512_reduce_max_ps(vmax);
      const float id = amax > 0 ? 127.f / amax : 0.f;
      const float d = amax > 0 ? act_block_scale(block, amax, id) : 0.f;
      const __m512 vid = _mm512_set1_ps(id);
      for (int i0 = 0; i0 < block; i0 += QK) {
        const int64_t k = t * nb + (c0 + i0) / QK;
        // round half to even (MXCSR default), as nearbyint
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xr + i0), vid));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xr + i0 + 16), vid));
        const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        alignas(16) uint32_t dw[8];
        _mm_store_si128((__m128i*)dw, _mm512_cvtsepi32_epi8(q0));
        _mm_store_si128((__m128i*)(dw + 4), _mm512_cvtsepi32_epi8(q1));
        int8_t* dst = &a->xb[size_t(k * 512 + mi * 4)];
        for (int j = 0; j < 8; ++j) std::memcpy(dst + j * 64, &dw[j], 4);
        a->dx[size_t(k * 16 + mi)] = d;
        a->sx[size_t(k * 16 + mi)] = d * float(sum);
      }
    }
  }
}

void matmul_amx(WFormat f, const WeightView& w, const ActAmx& a, int64_t M, float* y) {
  const int ck = amx_chunk(f);
  const int64_t cols = w.cols, nch = cols / ck, ngroups = (w.rows + 15) / 16;
  const bool mins = has_min(f);
  auto body = [&](int64_t g0, int64_t g1) {
    thread_local std::vector<int8_t> codes;
    thread_local std::vector<float> scale, mn;
    codes.resize(size_t(16 * cols));
    scale.resize(size_t(nch * 16));
    mn.resize(size_t(nch * 16));
    config_tiles(ck);
    alignas(64) int32_t cbuf[4][16][16];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t r0 = g * 16, nr = std::min<int64_t>(16, w.rows - r0);
      decode_group16(f, w, r0, codes.data(), scale.data(), mn.data(), false);
      for (int64_t t = 0; t < a.ntiles; ++t) {
        __m512 acc[16];
#pragma GCC unroll 16
        for (int n = 0; n < 16; ++n) acc[n] = _mm512_setzero_ps();
        auto consume = [&](int32_t (*cb)[16], int64_t c) __attribute__((always_inline)) {
          const int64_t b = c * ck / QK;  // 32-block holding chunk c
          const __m512 dxv = _mm512_loadu_ps(&a.dx[size_t((t * a.nblk + b) * 16)]);
          const float* sc = &scale[size_t(c)];  // row n at sc[n * nch]
#pragma GCC unroll 16
          for (int n = 0; n < 16; ++n) {
            const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb[n])), dxv);
            acc[n] = _mm512_fmadd_ps(v, _mm512_set1_ps(sc[n * nch]), acc[n]);
          }
          if (mins) {
            const __m512 sxv = _mm512_loadu_ps(&a.sx[size_t((t * a.nblk + b) * 16)]);
            const float* m = &mn[size_t(c)];
#pragma GCC unroll 16
            for (int n = 0; n < 16; ++n) acc[n] = _mm512_fnmadd_ps(sxv, _mm512_set1_ps(m[n * nch]), acc[n]);
          }
        };
        auto bptr = [&](int64_t c) __attribute__((always_inline)) {
          const int64_t e = c * ck;  // first value of chunk c
          return &a.xb[size_t((t * a.nblk + e / QK) * 512 + (e % QK) / 4 * 64)];
        };
        // Software pipeline, 4 chunks deep: chunk c uses C tile c%4 and A/B tiles 4+c%2 / 6+c%2;
        // its product is stored and consumed (f32 epilogue) only after the products of the next
        // three chunks were issued, which hides the tile latencies.
#define G4_ISSUE(C, A, B, ch)                                        \
  if ((ch) < nch) {                                                  \
    _tile_loadd(A, &codes[size_t((ch) * 16 * ck)], ck);              \
    _tile_loadd(B, bptr(ch), 64);                                    \
    _tile_zero(C);                                                   \
    _tile_dpbssd(C, A, B);                                           \
  }
#define G4_STORE(C, ch) \
  if ((ch) < nch) _tile_stored(C, cbuf[C], 64);
#define G4_CONSUME(C, ch) \
  if ((ch) >= 0 && (ch) < nch) consume(cbuf[C], ch);
        // A stored product is read one step later, so its loads do not wait on the tile store.
        G4_ISSUE(0, 4, 6, 0)
        G4_ISSUE(1, 5, 7, 1)
        G4_ISSUE(2, 4, 6, 2)
        G4_ISSUE(3, 5, 7, 3)
        int64_t c = 0;
        for (; c < nch; c += 4) {
          G4_STORE(0, c)
          G4_ISSUE(0, 4, 6, c + 4)
          G4_CONSUME(3, c - 1)
          G4_STORE(1, c + 1)
          G4_ISSUE(1, 5, 7, c + 5)
          G4_CONSUME(0, c)
          G4_STORE(2, c + 2)
          G4_ISSUE(2, 4, 6, c + 6)
          G4_CONSUME(1, c + 1)
          G4_STORE(3, c + 3)
          G4_ISSUE(3, 5, 7, c + 7)
          G4_CONSUME(2, c + 2)
        }
        G4_CONSUME(3, c - 1)
#undef G4_STORE
#undef G4_CONSUME
#undef G4_ISSUE
        // acc[n][m] -> y[m0 + m][r0 + n]: transpose in registers, masked row stores.
        transpose16(acc);
        const int64_t m0 = t * 16, nm = std::min<int64_t>(16, M - m0);
        const __mmask16 keep = __mmask16((1u << nr) - 1);
#pragma GCC unroll 16
        for (int m = 0; m < 16; ++m)
          if (m < nm) _mm512_mask_storeu_ps(y + (m0 + m) * w.rows + r0, keep, acc[m]);
      }
    }
    _tile_release();
  };
  parallel_for(ngroups, std::ref(body));  // std::ref: no std::function allocation
}

}  // namespace g4::gguf
