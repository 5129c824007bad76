// AMX-BF16 prefill kernel for MlxAffine and BF16 weights, f32-exact up to summation order.
// Built with the AVX-512 flags (file name) plus AMX via the target pragma below; call only when
// amx_available() (CPUID AMX-TILE/AMX-BF16/AVX512-BF16 and the kernel granted XTILEDATA).
//
// Exactness: x is split as x = h + m + l with h, m, l bf16 (truncations of x and of the
// remainders; each remainder is exact in f32, and the last has <= 8 significant bits), so nothing
// of x is lost. MLX q values (<= 255) and BF16 weights are exact in bf16. Each product of two
// bf16 values is exact in f32 and AMX accumulates in f32, so y differs from matmul_ref only by
// f32 summation order. MLX groups: C_g = Σ_{k in g} q·x is accumulated per group and folded as
// y += scale·C_g + bias·Σ_{k in g} x (Σx from the original f32 x).
//
// Tiles: A = 16 weight rows x 32 columns (bf16, row-major buffer), B = x in the VNNI pair layout
// (16 column pairs x 16 x rows), C[n][m] = 16 weight rows x 16 x rows. A 2x2 block of C tiles
// covers 32 weight rows x 32 x rows; the 3 x parts reuse the same A tiles.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("amx-tile,amx-bf16,avx512bf16")
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/matmul_internal.h"
#include "quant/matmul.h"

namespace g4::detail {
namespace {

constexpr int kParts = 3;     // bf16 parts of x
constexpr int64_t kNB = 32;   // weight rows per block (2 A tiles)
constexpr int64_t kMB = 32;   // x rows per block pair (2 B tiles)

// Row stride (elements) of the A buffer: cols plus one cache line, so that the 16 rows of a tile
// do not all map to the same L1 set (a power-of-two stride would).
inline int64_t a_stride(int64_t cols) { return cols + 32; }

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void load_tile_config() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
}

// Bits of the bf16 parts of 16 floats: h = trunc(x), m = trunc(x - h), l = x - h - m.
inline void split3(__m512 x, __m512i out[3]) {
  const __m512i hi_mask = _mm512_set1_epi32(int(0xFFFF0000u));
  const __m512 h = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), hi_mask));
  const __m512 r1 = _mm512_sub_ps(x, h);
  const __m512 m = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r1), hi_mask));
  const __m512 l = _mm512_sub_ps(r1, m);
  out[0] = _mm512_srli_epi32(_mm512_castps_si512(h), 16);
  out[1] = _mm512_srli_epi32(_mm512_castps_si512(m), 16);
  out[2] = _mm512_srli_epi32(_mm512_castps_si512(l), 16);
}

// Per-call x preparation: VNNI B tiles for every (part, m block of 16, 32-column step), and Σx
// per (group, x row) for MLX.
struct XPrep {
  int64_t nmb = 0, nks = 0;
  std::vector<uint32_t> tiles;  // [part][mb][ks][k2 16][m 16]
  std::vector<float> xsum;      // [group][mb*16 + m]
  const uint32_t* tile(int p, int64_t mb, int64_t ks) const {
    return tiles.data() + ((size_t(p) * size_t(nmb) + size_t(mb)) * size_t(nks) + size_t(ks)) * 256;
  }
};

void prepare_x(const float* x, int64_t M, int64_t cols, int group, XPrep& xp) {
  xp.nmb = (M + 15) / 16;
  xp.nks = cols / 32;
  const int64_t mpad = xp.nmb * 16, ng = group > 0 ? cols / group : 0;
  xp.tiles.resize(size_t(kParts * xp.nmb * xp.nks) * 256);  // every entry written below
  xp.xsum.resize(size_t(ng * mpad));
  // x rows are independent: threads over rows (padding rows M..mpad are written as zeros).
  parallel_for(mpad, [&](int64_t m0, int64_t m1) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i even_idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd_idx = _mm512_add_epi32(even_idx, _mm512_set1_epi32(1));
    for (int64_t m = m0; m < m1; ++m) {
      const int64_t mb = m / 16, mi = m % 16;
      const bool pad = m >= M;
      for (int64_t ks = 0; ks < xp.nks; ++ks) {
        __m512i a[3], b[3];
        split3(pad ? _mm512_setzero_ps() : _mm512_loadu_ps(x + m * cols + ks * 32), a);
        split3(pad ? _mm512_setzero_ps() : _mm512_loadu_ps(x + m * cols + ks * 32 + 16), b);
        for (int p = 0; p < kParts; ++p) {
          // Pair j = (element 2j, element 2j+1): the low bf16 is the even element.
          const __m512i ev = _mm512_permutex2var_epi32(a[p], even_idx, b[p]);
          const __m512i od = _mm512_permutex2var_epi32(a[p], odd_idx, b[p]);
          const __m512i pair = _mm512_or_si512(ev, _mm512_slli_epi32(od, 16));
          uint32_t* t = const_cast<uint32_t*>(xp.tile(p, mb, ks));
          // Row k2 = j, column m: t[j*16 + mi].
          _mm512_i32scatter_epi32(t + mi, _mm512_slli_epi32(lane, 4), pair, 4);
        }
      }
      for (int64_t g = 0; g < ng; ++g) {
        __m512 s = _mm512_setzero_ps();
        if (!pad)
          for (int64_t c = g * group; c < (g + 1) * group; c += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + m * cols + c));
        xp.xsum[size_t(g * mpad + m)] = _mm512_reduce_add_ps(s);
      }
    }
  }, 16);
}

// q values of rows [r0, r0+nr) as bf16, zero rows up to kNB: buf[kNB][cols].
void fill_a_mlx(const WeightView& w, int64_t r0, int64_t nr, uint16_t* buf) {
  const int b = w.bits;
  const __mmask16 load_mask = b == 8 ? __mmask16(0xFFFF) : __mmask16((1u << (2 * b)) - 1u);
  alignas(64) uint8_t ctl[64];
  alignas(64) uint32_t sh[16];
  for (int l = 0; l < 16; ++l) {
    const int bit = l * b, idx = bit / 8;
    sh[l] = uint32_t(bit % 8);
    for (int k = 0; k < 4; ++k) ctl[l * 4 + k] = idx + k < 16 ? uint8_t(idx + k) : uint8_t(0x80);
  }
  const __m512i shuf = _mm512_load_si512(ctl), shift = _mm512_load_si512(sh);
  const __m512i mask = _mm512_set1_epi32((1 << b) - 1);
  // bf16 bits of 0..15 in the low / high half of a 32-bit lane (4-bit path).
  alignas(64) uint32_t lo_tab[16], hi_tab[16];
  for (int j = 0; j < 16; ++j) {
    lo_tab[j] = uint32_t(f32_to_bf16(float(j)));
    hi_tab[j] = lo_tab[j] << 16;
  }
  const __m512i bf16_lo = _mm512_load_si512(lo_tab), bf16_hi = _mm512_load_si512(hi_tab);
  for (int64_t i = 0; i < kNB; ++i) {
    uint16_t* out = buf + i * a_stride(w.cols);
    if (i >= nr) {
      std::memset(out, 0, size_t(w.cols) * 2);
      continue;
    }
    const uint8_t* row = row_ptr(w, r0 + i);
    if (b == 4) {
      // 16 bytes = 32 values; low nibble = even column, high = odd: one bf16 pair per byte.
      for (int64_t c = 0; c < w.cols; c += 32) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 2)));
        const __m512i lo = _mm512_permutexvar_epi32(v, bf16_lo);                      // low 4 bits index
        const __m512i hi = _mm512_permutexvar_epi32(_mm512_srli_epi32(v, 4), bf16_hi);
        _mm512_storeu_si512(out + c, _mm512_or_si512(lo, hi));
      }
      continue;
    }
    if (b == 8) {
      for (int64_t c = 0; c < w.cols; c += 32) {
        const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c))));
        const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c + 16))));
        _mm512_storeu_si512(out + c, (__m512i)_mm512_cvtne2ps_pbh(f1, f0));
      }
      continue;
    }
    for (int64_t c = 0; c < w.cols; c += 32) {
      __m512 f[2];
      for (int h = 0; h < 2; ++h) {
        const uint8_t* p = row + (c + 16 * h) / 16 * 2 * b;
        const __m512i bv = _mm512_broadcast_i32x4(_mm_maskz_loadu_epi8(load_mask, p));
        const __m512i q = _mm512_and_si512(_mm512_srlv_epi32(_mm512_shuffle_epi8(bv, shuf), shift), mask);
        f[h] = _mm512_cvtepi32_ps(q);
      }
      _mm512_storeu_si512(out + c, (__m512i)_mm512_cvtne2ps_pbh(f[1], f[0]));  // exact: q <= 255
    }
  }
}

void fill_a_bf16(const WeightView& w, int64_t r0, int64_t nr, uint16_t* buf) {
  for (int64_t i = 0; i < kNB; ++i) {
    if (i < nr) std::memcpy(buf + i * a_stride(w.cols), row_ptr(w, r0 + i), size_t(w.cols) * 2);
    else std::memset(buf + i * a_stride(w.cols), 0, size_t(w.cols) * 2);
  }
}

// One block of kNB weight rows against every x row.
void amx_block(const WeightView& w, int64_t r0, const XPrep& xp, int64_t M, float* y, uint16_t* abuf,
               float* acc /* [kNB][kMB] */, float* cbuf /* [4][16][16] */) {
  const int64_t cols = w.cols, nr = std::min(kNB, w.rows - r0);
  const bool mlx = w.fmt == WFormat::MlxAffine;
  if (mlx) fill_a_mlx(w, r0, nr, abuf);
  else fill_a_bf16(w, r0, nr, abuf);
  const int64_t lda = a_stride(cols) * 2;
  const int64_t g = mlx ? w.group_size : cols;
  const int64_t ng = cols / g, steps = g / 32;
  // Scales / biases of this block as f32, [group][row] (zero for padding rows).
  thread_local std::vector<float> sb;
  if (mlx) {
    sb.resize(size_t(ng * kNB * 2));
    for (int64_t n = 0; n < kNB; ++n)
      for (int64_t gi = 0; gi < ng; ++gi) {
        sb[size_t(gi * kNB * 2 + n)] = n < nr ? load_float(w.scales, w.scale_dtype, size_t((r0 + n) * ng + gi)) : 0.f;
        sb[size_t(gi * kNB * 2 + kNB + n)] = n < nr ? load_float(w.biases, w.scale_dtype, size_t((r0 + n) * ng + gi)) : 0.f;
      }
  }
  for (int64_t mp = 0; mp < xp.nmb; mp += 2) {
    const bool two = mp + 1 < xp.nmb;
    std::memset(acc, 0, sizeof(float) * kNB * kMB);
    for (int64_t gi = 0; gi < ng; ++gi) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t s = 0; s < steps; ++s) {
        const int64_t ks = gi * steps + s;
        _tile_loadd(4, abuf + ks * 32, lda);
        _tile_loadd(5, abuf + 16 * a_stride(cols) + ks * 32, lda);
        for (int p = 0; p < kParts; ++p) {
          _tile_loadd(6, xp.tile(p, mp, ks), 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(2, 5, 6);
          if (two) {
            _tile_loadd(7, xp.tile(p, mp + 1, ks), 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
      }
      // C tiles: 0 = (n 0-15, m 0-15), 1 = (n 0-15, m 16-31), 2 = (n 16-31, m 0-15), 3 = (n 16-31, m 16-31).
      _tile_stored(0, cbuf, 64);
      _tile_stored(2, cbuf + 512, 64);
      if (two) {
        _tile_stored(1, cbuf + 256, 64);
        _tile_stored(3, cbuf + 768, 64);
      }
      if (mlx) {
        const float* sc = sb.data() + gi * kNB * 2;
        const float* bi = sc + kNB;
        const float* xs = xp.xsum.data() + gi * xp.nmb * 16 + mp * 16;
        for (int mh = 0; mh < (two ? 2 : 1); ++mh) {
          const __m512 xsv = _mm512_loadu_ps(xs + mh * 16);
          for (int64_t n = 0; n < kNB; ++n) {
            const float* cr = cbuf + (n / 16 * 2 + mh) * 256 + (n % 16) * 16;
            float* ar = acc + n * kMB + mh * 16;
            __m512 a = _mm512_loadu_ps(ar);
            a = _mm512_fmadd_ps(_mm512_set1_ps(sc[n]), _mm512_loadu_ps(cr), a);
            a = _mm512_fmadd_ps(_mm512_set1_ps(bi[n]), xsv, a);
            _mm512_storeu_ps(ar, a);
          }
        }
      } else {
        for (int mh = 0; mh < (two ? 2 : 1); ++mh)
          for (int64_t n = 0; n < kNB; ++n) {
            const float* cr = cbuf + (n / 16 * 2 + mh) * 256 + (n % 16) * 16;
            float* ar = acc + n * kMB + mh * 16;
            _mm512_storeu_ps(ar, _mm512_add_ps(_mm512_loadu_ps(ar), _mm512_loadu_ps(cr)));
          }
      }
    }
    const int64_t m0 = mp * 16, mcount = std::min<int64_t>(two ? 32 : 16, M - m0);
    for (int64_t m = 0; m < mcount; ++m)
      for (int64_t n = 0; n < nr; ++n) y[(m0 + m) * w.rows + r0 + n] = acc[n * kMB + m];
  }
}

bool request_amx() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  const bool avx512_bf16 = a & (1u << 5);
  if (!(amx_bf16 && amx_tile && avx512_bf16)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

bool amx_available() {
  static const bool ok = [] {
    if (const char* e = std::getenv("G4_NO_AMX"); e && std::strcmp(e, "0") != 0) return false;
    return cpu_has_avx512() && request_amx();
  }();
  return ok;
}

// From 8 x rows on, the AMX path beats the direct AVX-512 kernels (measured on Sapphire Rapids:
// 2048x2048 4-bit, M=8: 1.0 ms vs 1.7 ms on one core); below, its fixed costs dominate.
constexpr int64_t kAmxMinM = 8;

bool amx_supports(const WeightView& w, int64_t M) {
  if ((M < kAmxMinM && !batch_invariant()) || w.cols % 32 != 0) return false;
  return w.fmt == WFormat::BF16 || (w.fmt == WFormat::MlxAffine && w.row_bytes % 4 == 0);
}

// x rows per pass: bounds the prepared x (3 bf16 parts: 6 bytes per element) for long prompts;
// each further pass re-reads the weights once.
constexpr int64_t kMChunk = 256;

void matmul_amx(const float* x, int64_t M, const WeightView& w, float* y) {
  thread_local XPrep caller_xp;  // the caller's; workers read it through this reference
  XPrep& xp = caller_xp;
  const int64_t nblocks = (w.rows + kNB - 1) / kNB;
  for (int64_t m0 = 0; m0 < M; m0 += kMChunk) {
    const int64_t mc = std::min(kMChunk, M - m0);
    prepare_x(x + m0 * w.cols, mc, w.cols, w.fmt == WFormat::MlxAffine ? w.group_size : 0, xp);
    float* yc = y + m0 * w.rows;
    parallel_for(nblocks, [&](int64_t b0, int64_t b1) {
      thread_local std::vector<uint16_t> abuf;
      thread_local std::vector<float> acc, cbuf;
      if (abuf.size() < size_t(kNB * a_stride(w.cols))) abuf.resize(size_t(kNB * a_stride(w.cols)));
      acc.resize(size_t(kNB * kMB));
      cbuf.resize(4 * 256);
      load_tile_config();
      for (int64_t b = b0; b < b1; ++b) amx_block(w, b * kNB, xp, mc, yc, abuf.data(), acc.data(), cbuf.data());
      _tile_release();
    }, 1);
  }
}

}  // namespace g4::detail
