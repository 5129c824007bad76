// Decode GEMVs (M = 1) on int8 activations (cuda_q8.cuh): one launch prepares the activation row
// (the input norm, when the matmul has one, then the int8 blocks), the next dots every weight row
// with it. Each lane takes whole units of a row (64 values of a K-quant super-block, a 32-value
// block of the 32-value formats, 8 floats of bf16 / f16 / f32 rows), loads the unit's bytes in as
// few wide loads as its alignment allows and reduces codes against x with dp4a; `lpr` lanes share
// a row (a power of two: short rows give a warp several rows), and their partial sums meet by
// shuffles. What a unit computes equals Σ dequant(w)[c] · x_q8[c] over its columns (the slow
// reference the CUDA op tests compare it with); only the f32 summation order differs.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kquant_dot.cuh"
#include "backend/cuda/cuda_matmul_common.cuh"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_q8.cuh"
#include "backend/cuda/cuda_q8_store.cuh"
#include "backend/cuda/cuda_gemv_q8.h"
#include "backend/cuda/cuda_launch.cuh"

namespace g4::cuda {
namespace {

// ---- the activation row -------------------------------------------------------------------------

// Grid (ceil(cols / 32 / kPrepWarps), rows): row blockIdx.y of x [rows, cols] (f32 or bf16;
// normed with norm_w when set) into o (cuda_q8.cuh), warp w of block b quantizing the 32-value
// block kPrepWarps b + w. With a norm every block sums the row's squares itself (the same loop in
// every block, so every block finds the same factor). IEEE operations throughout (no
// contraction), so the host reference of the tests rounds identically.
constexpr int kPrepWarps = 8;
__global__ void __launch_bounds__(kPrepWarps * kWarp) q8_prepare_kernel(const void* x, bool bf, int cols,
                                                                        const float* norm_w, float eps, Q8Act o) {
  pdl_enter();
  __shared__ float red[32];
  x = static_cast<const uint8_t*>(x) + int64_t(blockIdx.y) * cols * (bf ? 2 : 4);
  o = q8_row(o, blockIdx.y, cols);
  float inv = 1.f;
  if (norm_w) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) {
      const float4 v = ld4x(x, 4 * int64_t(i), bf);
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = block_sum(ss, red);
    inv = 1.0f / sqrtf(ss / float(cols) + eps);
  }
  const int lane = threadIdx.x % kWarp, b = blockIdx.x * kPrepWarps + threadIdx.x / kWarp;
  if (b >= cols / 32) return;
  const int c = 32 * b + lane;
  float v = ldx(x, c, bf);
  if (norm_w) v = __fmul_rn(__fmul_rn(v, inv), norm_w[c]);
  q8_store_block(v, c, lane, o);
}

// matmul_norm_add's second half after an int8 GEMV, row blockIdx.x of y and resid ([rows, n]) by
// one block whose threads each hold kPostPer values in registers (all loads in flight at once):
// resid[c] += y[c] · inv_rms(y) · pw[c] over a row of n <= kPostMax values, stored in the
// activation type, then (scale != 1) resid[c] *= scale rounded again, as a separate scale launch
// rounds it. With o.q set (a deferred epilogue fused with the next matmul's prepare), the stored
// row is then normed with norm_w (when set) and cut into int8 blocks as q8_prepare_kernel does
// (n % 32 == 0; thread t holds values t + 1024 k, so each warp's lanes hold whole 32-value
// blocks). A row's arithmetic is the same whatever the grid's row count.
constexpr int kPostThreads = 1024, kPostPer = 8, kPostMax = kPostThreads * kPostPer;
__global__ void __launch_bounds__(kPostThreads) post_add_prepare_kernel(const void* y, const float* pw, float peps,
                                                                        float scale, void* resid, bool bf,
                                                                        int n, const float* norm_w, float eps,
                                                                        Q8Act o) {
  pdl_enter();
  __shared__ float red[32];
  const int64_t row_off = int64_t(blockIdx.x) * n * (bf ? 2 : 4);
  y = static_cast<const uint8_t*>(y) + row_off;
  resid = static_cast<uint8_t*>(resid) + row_off;
  if (o.q) o = q8_row(o, blockIdx.x, n);
  float v[kPostPer], ss = 0.f;
#pragma unroll
  for (int k = 0; k < kPostPer; ++k) {
    const int c = threadIdx.x + k * kPostThreads;
    v[k] = c < n ? ldx(y, c, bf) : 0.f;
    ss += v[k] * v[k];
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(n) + peps);
  float ss2 = 0.f;
#pragma unroll
  for (int k = 0; k < kPostPer; ++k) {
    const int c = threadIdx.x + k * kPostThreads;
    if (c >= n) continue;
    store_out(resid, c, ldx(resid, c, bf) + v[k] * inv * pw[c], !bf);
    if (scale != 1.f) store_out(resid, c, ldx(resid, c, bf) * scale, !bf);
    v[k] = ldx(resid, c, bf);  // the stored value, as the next kernel would read it
    ss2 += v[k] * v[k];
  }
  if (!o.q) return;  // the post-norm alone
  float inv2 = 1.f;
  if (norm_w) {
    ss2 = block_sum(ss2, red);
    inv2 = 1.0f / sqrtf(ss2 / float(n) + eps);
  }
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int k = 0; k < kPostPer; ++k) {
    const int c = threadIdx.x + k * kPostThreads;
    if (c - lane >= n) break;  // the warp's block lies past the row (n % 32 == 0: all lanes agree)
    float x = v[k];
    if (norm_w) x = __fmul_rn(__fmul_rn(x, inv2), norm_w[c]);
    q8_store_block(x, c, lane, o);
  }
}

// ---- loads --------------------------------------------------------------------------------------

// kWords little-endian words of the 4 kWords bytes at p (p 2-byte aligned: Q6_K, Q8_0, Q4_0 and
// Q5_0 blocks), from kWords + 1 aligned words and funnel shifts. Reads up to 4 bytes past them
// (within the block, or the upload's slack).
template <int kWords>
__device__ __forceinline__ void ld_a2(const uint8_t* p, uint32_t* w) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* base = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
  const uint32_t sh = uint32_t(a & 3) * 8;
  uint32_t v[kWords + 1];
#pragma unroll
  for (int k = 0; k <= kWords; ++k) v[k] = __ldg(base + k);
#pragma unroll
  for (int k = 0; k < kWords; ++k) w[k] = __funnelshift_r(v[k], v[k + 1], sh);
}
__device__ __forceinline__ void ld_words16(const uint8_t* p, uint32_t* w) {  // p 16-byte aligned
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
}
// The 32 int8 activations of block b as eight words.
__device__ __forceinline__ void ld_x32(const Q8Act& x, int64_t b, uint32_t* w) {
  ld_words16(reinterpret_cast<const uint8_t*>(x.q + 32 * b), w);
  ld_words16(reinterpret_cast<const uint8_t*>(x.q + 32 * b + 16), w + 4);
}
// Bit i of the low 4 bits of t moved to bit 0 of byte i.
__device__ __forceinline__ uint32_t spread4(uint32_t t) { return ((t & 15u) * 0x00204081u) & 0x01010101u; }

// ---- one unit of a row, per format ---------------------------------------------------------------

template <WFormat F, int kBits>
struct Unit;  // kVals: values per unit; dot(row, w, r, u, x): the unit's share of the row's dot

// Q4_K / Q5_K: unit j (0..3) of a super-block is its sub-block pair 2j, 2j + 1 (64 values).
template <WFormat F>
struct KUnit {
  static constexpr int kVals = 64;
  static constexpr bool q5 = F == WFormat::GgufQ5_K;
  __device__ static float dot(const uint8_t* row, const DevWeight&, int64_t, int64_t u, const Q8Act& x) {
    const int64_t sb = u >> 2;
    const int j = int(u & 3);
    const uint8_t* b = row + sb * (q5 ? 176 : 144);
    const uint4 h = __ldg(reinterpret_cast<const uint4*>(b));  // d, dmin | 12 bytes of scales and mins
    uint32_t c[8], xa[8], xb[8], qh[8];
    ld_words16(b + (q5 ? 48 : 16) + 32 * j, c);
    ld_words16(b + (q5 ? 48 : 16) + 32 * j + 16, c + 4);
    if constexpr (q5) {
      ld_words16(b + 16, qh);
      ld_words16(b + 32, qh + 4);
    }
    const int64_t xb0 = sb * 8 + 2 * j;
    ld_x32(x, xb0, xa);
    ld_x32(x, xb0 + 1, xb);
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      uint32_t lo = c[k] & 0x0F0F0F0Fu, hi = (c[k] >> 4) & 0x0F0F0F0Fu;
      if constexpr (q5) {
        lo |= ((qh[k] >> (2 * j)) & 0x01010101u) << 4;
        hi |= ((qh[k] >> (2 * j + 1)) & 0x01010101u) << 4;
      }
      s0 = dp4a_us(lo, xa[k], s0);
      s1 = dp4a_us(hi, xb[k], s1);
    }
    int sc0, m0, sc1, m1;
    scale_min_k4_words(2 * j, h.y, h.z, h.w, &sc0, &m0);
    scale_min_k4_words(2 * j + 1, h.y, h.z, h.w, &sc1, &m1);
    const float d = __half2float(__ushort_as_half(uint16_t(h.x))), dmin = __half2float(__ushort_as_half(uint16_t(h.x >> 16)));
    return d * (float(sc0) * x.d[xb0] * float(s0) + float(sc1) * x.d[xb0 + 1] * float(s1)) -
           dmin * (float(m0) * x.s[xb0] + float(m1) * x.s[xb0 + 1]);
  }
};
template <int B>
struct Unit<WFormat::GgufQ4_K, B> : KUnit<WFormat::GgufQ4_K> {};
template <int B>
struct Unit<WFormat::GgufQ5_K, B> : KUnit<WFormat::GgufQ5_K> {};

// Q6_K (210 bytes, 2-byte aligned): unit (h, t) = u & 3 covers ql[64h + 32t ..+32] (low nibbles:
// values 128h + 32t + l, high nibbles: 128h + 64 + 32t + l) with the 2-bit highs of qh[32h ..+32]
// (bits 2t and 2t + 4); int8 scales per 16 values; codes are q - 32.
template <int B>
struct Unit<WFormat::GgufQ6_K, B> {
  static constexpr int kVals = 64;
  __device__ static float dot(const uint8_t* row, const DevWeight&, int64_t, int64_t u, const Q8Act& x) {
    const int64_t sb = u >> 2;
    const int h = int(u >> 1) & 1, t = int(u & 1);
    const uint8_t* b = row + sb * 210;
    uint32_t ql[8], qh[8], xa[8], xb[8];
    ld_a2<8>(b + 64 * h + 32 * t, ql);
    ld_a2<8>(b + 128 + 32 * h, qh);
    const int64_t xba = sb * 8 + 4 * h + t, xbb = xba + 2;
    ld_x32(x, xba, xa);
    ld_x32(x, xbb, xb);
    int sa[2] = {0, 0}, sb2[2] = {0, 0}, xsa[2] = {0, 0}, xsb[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t va = (ql[k] & 0x0F0F0F0Fu) | (((qh[k] >> (2 * t)) & 0x03030303u) << 4);
      const uint32_t vb = ((ql[k] >> 4) & 0x0F0F0F0Fu) | (((qh[k] >> (2 * t + 4)) & 0x03030303u) << 4);
      sa[k >> 2] = dp4a_us(va, xa[k], sa[k >> 2]);
      sb2[k >> 2] = dp4a_us(vb, xb[k], sb2[k >> 2]);
      xsa[k >> 2] = dp4a_ss(0x01010101u, xa[k], xsa[k >> 2]);
      xsb[k >> 2] = dp4a_ss(0x01010101u, xb[k], xsb[k >> 2]);
    }
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * h + 2 * t);
    const float d = ld_half(b + 208);
    const float ia = float(sc[0]) * float(sa[0] - 32 * xsa[0]) + float(sc[1]) * float(sa[1] - 32 * xsa[1]);
    const float ib = float(sc[4]) * float(sb2[0] - 32 * xsb[0]) + float(sc[5]) * float(sb2[1] - 32 * xsb[1]);
    return d * (x.d[xba] * ia + x.d[xbb] * ib);
  }
};

// Q8_0 (34 bytes: f16 d, 32 int8), Q4_0 (18: d, 16 bytes of nibbles, q - 8), Q5_0 (22: d, 32 high
// bits, 16 bytes of nibbles, q - 16): one block per unit.
template <int B>
struct Unit<WFormat::GgufQ8_0, B> {
  static constexpr int kVals = 32;
  __device__ static float dot(const uint8_t* row, const DevWeight&, int64_t, int64_t u, const Q8Act& x) {
    const uint8_t* b = row + u * 34;
    uint32_t q[8], xw[8];
    ld_a2<8>(b + 2, q);
    ld_x32(x, u, xw);
    int s = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) s = dp4a_ss(q[k], xw[k], s);
    return ld_half(b) * x.d[u] * float(s);
  }
};
template <int B>
struct Unit<WFormat::GgufQ4_0, B> {
  static constexpr int kVals = 32;
  __device__ static float dot(const uint8_t* row, const DevWeight&, int64_t, int64_t u, const Q8Act& x) {
    const uint8_t* b = row + u * 18;
    uint32_t q[4], xw[8];
    ld_a2<4>(b + 2, q);
    ld_x32(x, u, xw);
    int s = 0, sx = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      s = dp4a_us(q[k] & 0x0F0F0F0Fu, xw[k], s);
      s = dp4a_us((q[k] >> 4) & 0x0F0F0F0Fu, xw[k + 4], s);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) sx = dp4a_ss(0x01010101u, xw[k], sx);
    return ld_half(b) * x.d[u] * float(s - 8 * sx);
  }
};
template <int B>
struct Unit<WFormat::GgufQ5_0, B> {
  static constexpr int kVals = 32;
  __device__ static float dot(const uint8_t* row, const DevWeight&, int64_t, int64_t u, const Q8Act& x) {
    const uint8_t* b = row + u * 22;
    uint32_t q[4], xw[8];
    ld_a2<4>(b + 6, q);
    const uint32_t qh = uint32_t(reinterpret_cast<const uint16_t*>(b + 2)[0]) |
                        (uint32_t(reinterpret_cast<const uint16_t*>(b + 2)[1]) << 16);
    ld_x32(x, u, xw);
    int s = 0, sx = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t lo = (q[k] & 0x0F0F0F0Fu) | (spread4(qh >> (4 * k)) << 4);
      const uint32_t hi = ((q[k] >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * k)) << 4);
      s = dp4a_us(lo, xw[k], s);
      s = dp4a_us(hi, xw[k + 4], s);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) sx = dp4a_ss(0x01010101u, xw[k], sx);
    return ld_half(b) * x.d[u] * float(s - 16 * sx);
  }
};

// MLX affine, kBits per value: a unit is 32 values (4 kBits bytes, word aligned), inside one group
// (group sizes are powers of two from 32); w = scale · q + bias, so the unit adds
// scale · d · Σ q q_x + bias · s.
template <int kBits>
struct MlxUnit {
  static constexpr int kVals = 32;
  __device__ static float dot(const uint8_t* row, const DevWeight& w, int64_t r, int64_t u, const Q8Act& x) {
    uint32_t xw[8];
    ld_x32(x, u, xw);
    int s = 0;
    if constexpr (kBits == 4) {
      uint32_t q[4];
      ld_words16(row + 16 * u, q);
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // word k: values 8k .. 8k + 7, low nibble first
        const uint32_t xe = __byte_perm(xw[2 * k], xw[2 * k + 1], 0x6420), xo = __byte_perm(xw[2 * k], xw[2 * k + 1], 0x7531);
        s = dp4a_us(q[k] & 0x0F0F0F0Fu, xe, s);
        s = dp4a_us((q[k] >> 4) & 0x0F0F0F0Fu, xo, s);
      }
    } else if constexpr (kBits == 8) {
      uint32_t q[8];
      ld_words16(row + 32 * u, q);
      ld_words16(row + 32 * u + 16, q + 4);
#pragma unroll
      for (int k = 0; k < 8; ++k) s = dp4a_us(q[k], xw[k], s);
    } else {
      const uint32_t* p = reinterpret_cast<const uint32_t*>(row + 4 * kBits * u);
      uint32_t words[kBits];
#pragma unroll
      for (int k = 0; k < kBits; ++k) words[k] = __ldg(p + k);
      uint32_t packed[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
      for (int i = 0; i < 32; ++i) {  // value i: stream bits [i kBits, (i + 1) kBits)
        const int bit = i * kBits, wi = bit >> 5, sh = bit & 31;
        uint32_t v = words[wi] >> sh;
        if (sh + kBits > 32) v |= words[wi + 1] << (32 - sh);
        packed[i >> 2] |= (v & ((1u << kBits) - 1u)) << (8 * (i & 3));
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) s = dp4a_us(packed[k], xw[k], s);
    }
    // Group of unit u in row r, by shifts (group sizes are powers of two, q8_gemv_supports): a
    // 64-bit division here cost more than the unit's dots.
    const int ushift = __ffs(w.group_size) - 6;  // log2(units per group)
    const int64_t g = r * (w.cols >> (ushift + 5)) + (u >> ushift);
    return ld_scale(w.scales, w.scale_dtype, g) * x.d[u] * float(s) + ld_scale(w.biases, w.scale_dtype, g) * x.s[u];
  }
};
template <int B>
struct Unit<WFormat::MlxAffine, B> : MlxUnit<B> {};

// bf16 / f16 / f32 weights: 8 values per unit against the f32 row xf.
template <WFormat F>
struct FloatUnit {
  static constexpr int kVals = 8;
  __device__ static float dot(const uint8_t* row, const DevWeight&, int64_t, int64_t u, const Q8Act& x) {
    const float4 x0 = __ldg(reinterpret_cast<const float4*>(x.xf + 8 * u));
    const float4 x1 = __ldg(reinterpret_cast<const float4*>(x.xf + 8 * u + 4));
    float wv[8];
    if constexpr (F == WFormat::F32) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(row) + 2 * u), b = __ldg(reinterpret_cast<const float4*>(row) + 2 * u + 1);
      wv[0] = a.x, wv[1] = a.y, wv[2] = a.z, wv[3] = a.w, wv[4] = b.x, wv[5] = b.y, wv[6] = b.z, wv[7] = b.w;
    } else {
      const uint4 q = __ldg(reinterpret_cast<const uint4*>(row) + u);
      const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (F == WFormat::BF16) {
          wv[2 * k] = __uint_as_float(qw[k] << 16);
          wv[2 * k + 1] = __uint_as_float(qw[k] & 0xffff0000u);
        } else {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&qw[k]));
          wv[2 * k] = f.x;
          wv[2 * k + 1] = f.y;
        }
      }
    }
    return x0.x * wv[0] + x0.y * wv[1] + x0.z * wv[2] + x0.w * wv[3] + x1.x * wv[4] + x1.y * wv[5] + x1.z * wv[6] +
           x1.w * wv[7];
  }
};
template <int B>
struct Unit<WFormat::BF16, B> : FloatUnit<WFormat::BF16> {};
template <int B>
struct Unit<WFormat::F16, B> : FloatUnit<WFormat::F16> {};
template <int B>
struct Unit<WFormat::F32, B> : FloatUnit<WFormat::F32> {};

// ---- the GEMV ----------------------------------------------------------------------------------

constexpr int kQ8Warps = 4;  // warps per block
constexpr int kQ8Cols = 8;   // prepared rows a block of a multi-row launch dots each weight row with

// y[i][m][r] = w[i][r] · x[m] for the a.n weights of the launch (blocks [first[i], first[i+1])
// take weight i, kQ8Warps * 32 / lpr rows each) and the a.M prepared rows (blockIdx.y: rows
// kCols·blockIdx.y onward, at most kCols of them, each weight unit loaded once for them all).
// kAct != kPlain: gelu(w[0][r] · x) * (w2[r] · x). a.resid (a.M == 1 only): matmul_norm_add's
// epilogue by the last block (cuda_matmul_common.cuh).
// Row m's arithmetic (its units in the same lanes, summed in the same order, the same shuffle
// tree) depends on lpr and the weights only: the same bits at any a.M and either kCols (the CUDA
// op tests check it; batch-invariant decode rests on it).
template <WFormat F, int kBits, int kAct, int kCols>
__global__ void __launch_bounds__(kQ8Warps * kWarp) q8_gemv_kernel(MatArgs a, Q8Act x, int lpr) {
  using U = Unit<F, kBits>;
  int i = 0;
  while (i + 1 < a.n && blockIdx.x >= a.first[i + 1]) ++i;
  const DevWeight& w = a.w[i];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t r0 = int64_t(blockIdx.x - a.first[i]) * kQ8Warps * (kWarp / lpr);
  const int64_t r = r0 + (int64_t(warp) * kWarp + lane) / lpr;
  if (threadIdx.x == 0 && blockIdx.y == 0 && r0 < w.rows) {  // this block's weight rows, while the kernels before it finish
    const int64_t n = min(int64_t(kQ8Warps * (kWarp / lpr)), w.rows - r0);
    prefetch_l2(w.data + r0 * w.row_bytes, size_t(n * w.row_bytes));
    if constexpr (kAct != kPlain) prefetch_l2(a.w2.data + r0 * a.w2.row_bytes, size_t(n * a.w2.row_bytes));
  }
  pdl_enter_streaming();
  const int sub = lane % lpr;
  const int64_t nu = w.cols / U::kVals;
  const int m0 = int(blockIdx.y) * kCols, nm = min(kCols, a.M - m0);
  float acc[kCols], acc2[kCols];
#pragma unroll
  for (int m = 0; m < kCols; ++m) acc[m] = acc2[m] = 0.f;
  if (r < w.rows) {
    const uint8_t* row = w.data + r * w.row_bytes;
    const uint8_t* row2 = a.w2.data + r * a.w2.row_bytes;
#pragma unroll(kCols == 1 ? 4 : 1)
    for (int64_t u = sub; u < nu; u += lpr) {
#pragma unroll
      for (int m = 0; m < kCols; ++m) {
        if (m >= nm) break;
        const Q8Act xm = kCols == 1 ? x : q8_row(x, m0 + m, w.cols);
        acc[m] += U::dot(row, w, r, u, xm);
        if constexpr (kAct != kPlain) acc2[m] += U::dot(row2, a.w2, r, u, xm);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kCols; ++m) {
    for (int o = lpr / 2; o > 0; o >>= 1) {
      acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
      if constexpr (kAct != kPlain) acc2[m] += __shfl_xor_sync(0xffffffffu, acc2[m], o);
    }
    if (r < w.rows && sub == 0 && m < nm) {
      float v = acc[m];
      if constexpr (kAct == kGelu) v = gelu_tanh_mul(acc[m], acc2[m]);
      if constexpr (kAct == kGeluGgml) v = gelu_ggml_mul(acc[m], acc2[m], a.table);
      store_out(a.y[i], int64_t(m0 + m) * w.rows + r, v, a.yt == DType::F32);
    }
  }
  if (kCols == 1 && a.resid) residual_epilogue(a, a.y[0], a.w[0].rows);
}

// The routed experts (MoeMatArgs, cuda_moe.h): grid (row blocks, items); item i dots expert
// e = idx[i]'s rows with prepared x row i / x_div. kAct: kPlain or kGelu (tanh form).
template <WFormat F, int kBits, int kAct>
__global__ void __launch_bounds__(kQ8Warps * kWarp) q8_moe_kernel(MoeMatArgs a, int lpr) {
  pdl_enter_streaming();
  using U = Unit<F, kBits>;
  const int item = blockIdx.y, e = a.idx[item];
  const DevWeight& w = a.w[e];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t r = (int64_t(blockIdx.x) * kQ8Warps + warp) * (kWarp / lpr) + lane / lpr;
  const int sub = lane % lpr;
  const int64_t nu = w.cols / U::kVals;
  const Q8Act x = q8_row(a.q8, item / a.x_div, w.cols);
  float acc = 0.f, acc2 = 0.f;
  if (r < w.rows) {
    const uint8_t* row = w.data + r * w.row_bytes;
#pragma unroll 2
    for (int64_t u = sub; u < nu; u += lpr) acc += U::dot(row, w, r, u, x);
    if constexpr (kAct != kPlain) {
      const DevWeight& w2 = a.w2[e];
      const uint8_t* row2 = w2.data + r * w2.row_bytes;
#pragma unroll 2
      for (int64_t u = sub; u < nu; u += lpr) acc2 += U::dot(row2, w2, r, u, x);
    }
  }
  for (int o = lpr / 2; o > 0; o >>= 1) {
    acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if constexpr (kAct != kPlain) acc2 += __shfl_xor_sync(0xffffffffu, acc2, o);
  }
  if (r < w.rows && sub == 0)
    store_out(a.y, int64_t(item) * w.rows + r, kAct != kPlain ? gelu_tanh_mul(acc, acc2) : acc, a.xt == DType::F32);
}

template <WFormat F, int kBits>
constexpr int unit_vals() {
  return Unit<F, kBits>::kVals;
}

// Lanes per row (a power of two, 4..32) for `rows` rows of `units` units of `vals` values: the most
// lanes that keep at least 85 % of them busy in the row's last round of units (a short row gives a
// warp several rows), but never so few that the launch has under kMinWarps warps to hide memory
// latency with. K-quant units (64 values, the longest dot per unit) take at least 16 lanes on rows
// of 32 units or more: at the E4B gate / up shape (40 units) the 85 % rule gave 8, and 16 measured
// faster on an H100 (stop 45, bench_cuda_gemv --lanes): Q4_K 11.8 -> 10.2 us, Q6_K 17.6 -> 15.7,
// the fused gate + up launch Q4_K 13.5 -> 13.1, Q6_K 28.8 -> 22.7.
constexpr int64_t kMinWarps = 16 * 132;
int lanes_per_row(int64_t units, int64_t rows, int vals) {
  int lpr = 4;
  for (int l = kWarp; l > 4; l /= 2) {
    const int64_t rounds = (units + l - 1) / l;
    if (units * 100 >= rounds * l * 85) {
      lpr = l;
      break;
    }
  }
  if (vals >= 64 && units >= 32) lpr = std::max(lpr, 16);
  while (lpr < kWarp && rows * lpr / kWarp < kMinWarps) lpr *= 2;
  return lpr;
}

template <WFormat F, int kBits, int kCols>
void gemv_act(cudaStream_t s, const MatArgs& a, int act, dim3 grid, int lpr) {
  if (act == kGelu) launch_kernel(q8_gemv_kernel<F, kBits, kGelu, kCols>, grid, kQ8Warps * kWarp, 0, s, a, a.q8, lpr);
  else if (act == kGeluGgml) launch_kernel(q8_gemv_kernel<F, kBits, kGeluGgml, kCols>, grid, kQ8Warps * kWarp, 0, s, a, a.q8, lpr);
  else launch_kernel(q8_gemv_kernel<F, kBits, kPlain, kCols>, grid, kQ8Warps * kWarp, 0, s, a, a.q8, lpr);
}

// The GEMV launch over a.M prepared rows. lpr comes from the weights' shape alone, never from
// a.M, so that a row's bits do not depend on the rows beside it.
template <WFormat F, int kBits>
void gemv_launch(cudaStream_t s, MatArgs a, int M, int act, int lanes) {
  int64_t rows = 0;
  for (int i = 0; i < a.n; ++i) rows += a.w[i].rows;
  const int lpr = lanes > 0 ? lanes : lanes_per_row(a.w[0].cols / unit_vals<F, kBits>(), rows, unit_vals<F, kBits>());
  const int rows_per_block = kQ8Warps * (kWarp / lpr);
  unsigned blocks = 0;
  for (int i = 0; i < a.n; ++i) {
    a.first[i] = blocks;
    blocks += blocks_for(a.w[i].rows, rows_per_block);
  }
  a.first[a.n] = blocks;
  a.M = M;
  a.norm_w = nullptr;  // applied by the prepare launch
  const bool post = a.resid && a.w[0].rows <= kPostMax;
  void* resid = a.resid;
  if (post) a.resid = nullptr;  // the post-norm kernel below (or a later prepare) instead of the last-block epilogue
  if (M == 1) gemv_act<F, kBits, 1>(s, a, act, dim3(blocks), lpr);
  else gemv_act<F, kBits, kQ8Cols>(s, a, act, dim3(blocks, unsigned(blocks_for(M, kQ8Cols))), lpr);
  if (post && !a.defer_post)
    post_norm_add(s, a.y[0], resid, a.xt, int(a.w[0].rows), a.post_w, a.post_eps, M);
}

template <WFormat F, int kBits>
void moe_launch(cudaStream_t s, const MoeMatArgs& a, int items, int per_token, int64_t rows, int act) {
  // Lanes per row from one token's items, so that a token's bits do not depend on the tokens beside it.
  const int lpr = lanes_per_row(a.w0.cols / unit_vals<F, kBits>(), rows * per_token, unit_vals<F, kBits>());
  const dim3 grid(blocks_for(rows, kQ8Warps * (kWarp / lpr)), unsigned(items));
  if (act == kGelu) launch_kernel(q8_moe_kernel<F, kBits, kGelu>, grid, kQ8Warps * kWarp, 0, s, a, lpr);
  else launch_kernel(q8_moe_kernel<F, kBits, kPlain>, grid, kQ8Warps * kWarp, 0, s, a, lpr);
}

// Calls launch(integral_constant<int, kBits>) with the MLX bits of F (0 for other formats).
template <WFormat F, class Fn>
void with_bits(int bits, Fn&& launch) {
  if constexpr (F == WFormat::MlxAffine) {
    switch (bits) {
      case 2: return launch(std::integral_constant<int, 2>{});
      case 3: return launch(std::integral_constant<int, 3>{});
      case 4: return launch(std::integral_constant<int, 4>{});
      case 5: return launch(std::integral_constant<int, 5>{});
      case 6: return launch(std::integral_constant<int, 6>{});
      default: return launch(std::integral_constant<int, 8>{});
    }
  } else {
    launch(std::integral_constant<int, 0>{});
  }
}

template <WFormat F>
void gemv_fmt(cudaStream_t s, const MatArgs& a, int M, int act, int lanes) {
  with_bits<F>(a.w[0].bits, [&](auto b) { gemv_launch<F, decltype(b)::value>(s, a, M, act, lanes); });
}

}  // namespace

void q8_prepare(cudaStream_t s, const void* x, DType xt, int rows, int64_t cols, const float* norm_w, float eps,
                const Q8Act& o) {
  const dim3 grid(blocks_for(cols / 32, kPrepWarps), unsigned(rows));
  launch_kernel(q8_prepare_kernel, grid, kPrepWarps * kWarp, 0, s, x, xt == DType::BF16, int(cols), norm_w, eps, o);
}

bool q8_gemv_supports(const DevWeight& w) {
  if (w.cols % 32 != 0 || w.cols > kQ8MaxCols) return false;
  const uintptr_t base = reinterpret_cast<uintptr_t>(w.data);
  switch (w.fmt) {
    case WFormat::GgufQ4_K:
    case WFormat::GgufQ5_K:  // 144 / 176-byte super-blocks: 16-byte aligned from a 16-byte aligned base
      return base % 16 == 0 && w.row_bytes % 16 == 0;
    case WFormat::GgufQ6_K:
    case WFormat::GgufQ8_0:
    case WFormat::GgufQ4_0:
    case WFormat::GgufQ5_0:
      return base % 4 == 0;
    case WFormat::MlxAffine:  // groups of a power of two from 32 (mlx: 32, 64, 128)
      if (w.group_size < 32 || (w.group_size & (w.group_size - 1)) != 0 || w.cols % w.group_size != 0) return false;
      if (w.bits != 2 && w.bits != 3 && w.bits != 4 && w.bits != 5 && w.bits != 6 && w.bits != 8) return false;
      return base % 16 == 0 && (w.bits == 4 || w.bits == 8 ? w.row_bytes % 16 == 0 : w.row_bytes % 4 == 0);
    case WFormat::BF16:
    case WFormat::F16:
    case WFormat::F32:
      return base % 16 == 0 && w.row_bytes % 16 == 0;
  }
  return false;
}

bool q8_post_deferrable(const DevWeight& w) { return q8_gemv_supports(w) && w.rows <= kPostMax; }

void post_norm_add(cudaStream_t s, const void* y, void* resid, DType t, int n, const float* w, float eps, int rows) {
  launch_kernel(post_add_prepare_kernel, unsigned(rows), kPostThreads, 0, s, y, w, eps, 1.f, resid, t == DType::BF16,
                n, static_cast<const float*>(nullptr), 0.f, Q8Act{});
}

bool q8_gemv_takes(const MatArgs& a, int act) {
  if (!a.q8.q) return false;
  for (int i = 0; i < a.n; ++i)
    if (!q8_gemv_supports(a.w[i]) || a.w[i].fmt != a.w[0].fmt || a.w[i].cols != a.w[0].cols) return false;
  return act == kPlain || (q8_gemv_supports(a.w2) && a.w2.fmt == a.w[0].fmt && a.w2.bits == a.w[0].bits);
}

bool q8_prepare_fusable(const MatArgs& a, bool gelu) {
  return q8_gemv_takes(a, gelu ? kGelu : kPlain) && a.w[0].cols <= kPostMax;
}

bool q8_gemv(cudaStream_t s, const MatArgs& a, int M, int act) {
  if (!q8_gemv_takes(a, act) || M < 1 || int64_t(M) * a.w[0].cols > kQ8MaxValues) return false;
  if (M > 1 && a.resid && a.w[0].rows > kPostMax) return false;  // the last-block epilogue is for one row
  if (a.prepared) {  // a.q8 holds x's int8 form already (MatArgs::prepared)
  } else if (a.pre_y) {
    launch_kernel(post_add_prepare_kernel, unsigned(M), kPostThreads, 0, s, a.pre_y, a.pre_w, a.pre_eps, a.pre_scale,
                  const_cast<void*>(a.x), a.xt == DType::BF16, int(a.w[0].cols), a.norm_w, a.eps, a.q8);
  } else {
    q8_prepare(s, a.x, a.xt, M, a.w[0].cols, a.norm_w, a.eps, a.q8);
  }
  q8_gemv_prepared(s, a, M, act);
  return true;
}

void q8_gemv_prepared(cudaStream_t s, const MatArgs& a, int M, int act, int lanes) {
  bool same_bits = true;
  for (int i = 1; i < a.n; ++i) same_bits = same_bits && a.w[i].bits == a.w[0].bits;
  with_format(a.w[0].fmt, [&](auto f) {
    constexpr WFormat F = decltype(f)::value;
    if (same_bits || a.resid) {
      gemv_fmt<F>(s, a, M, act, lanes);
    } else {  // MLX mixed precision inside one q/k/v launch: a launch per weight
      for (int i = 0; i < a.n; ++i) {
        MatArgs one = a;
        one.n = 1;
        one.w[0] = a.w[i];
        one.y[0] = a.y[i];
        gemv_fmt<F>(s, one, M, act, lanes);
      }
    }
  });
}

bool q8_moe_matmul(cudaStream_t s, const MoeMatArgs& a, int items, int per_token, int64_t rows, bool gelu) {
  const int x_rows = (items + a.x_div - 1) / a.x_div;
  if (!a.q8.q || !q8_gemv_supports(a.w0) || int64_t(x_rows) * a.w0.cols > kQ8MaxValues) return false;
  // One kernel dots gate and up with the same unit: both must have w0's format and bits.
  if (gelu && (a.w20.fmt != a.w0.fmt || a.w20.bits != a.w0.bits || !q8_gemv_supports(a.w20))) return false;
  q8_prepare(s, a.x, a.xt, x_rows, a.w0.cols, nullptr, 0.f, a.q8);
  with_format(a.w0.fmt, [&](auto f) {
    constexpr WFormat F = decltype(f)::value;
    with_bits<F>(a.w0.bits, [&](auto b) { moe_launch<F, decltype(b)::value>(s, a, items, per_token, rows, gelu ? kGelu : kPlain); });
  });
  return true;
}

}  // namespace g4::cuda
