// The int8 GEMV of 2 or more prepared rows on the tensor cores (cuda_gemv_mma.h), for a
// speculative verify forward's 1 + N rows: the same bits as the dp4a GEMV (cuda_gemv_q8.cu) gives
// each row alone, at a fraction of its instructions.
//
// Why the bits can match: the dp4a GEMV's lane `sub` of a row sums its units u = sub, sub + lpr,
// ... in order, each unit's share computed from exact integer sums of code x int8 products
// (Unit::combine, every float operation rounded as written); the row's lpr lane sums then meet in
// a shuffle-xor tree (offsets lpr / 2 .. 1). Here the integer sums come from mma.sync (exact: s32
// accumulators, no saturation), and warp `s` of a block plays lane `sub = s` for the block's 16
// weight rows and 8 prepared rows at once: it calls the same combine on the same integers in the
// same unit order. The lpr partial sums meet in shared memory in the same tree.
//
// Fragments (PTX ISA, mma.m16n8k32 / m16n8k16 with 8-bit operands; g = lane / 4, t = lane % 4):
// A rows g and g + 8, B column (prepared row) g; thread t holds k slots {4t..4t+3} and, for k32,
// {16+4t..16+4t+3}. The integer sum is the same in any k order, so for k32 those 8 slots are the
// block's values 8t..8t+7 in both A and B (one 8-byte load each). C: c0 (row g, column 2t), c1
// (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_gemv_mma.h"
#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_q8.cuh"
#include "backend/cuda/cuda_q8_units.cuh"

namespace g4::cuda {
namespace {

using q8units::Unit;

constexpr int kTileRows = 16;   // weight rows of a block (the MMA's M)
constexpr int kTileCols = 8;    // prepared rows of a block (the MMA's N)
constexpr int kMmaWarps = 8;    // the most warps of a block; warp w plays lanes w, w + 8, ..
constexpr int kTile = kTileRows * kTileCols;

// c += a (16 x 32 unsigned bytes) · b (32 x 8 signed bytes).
__device__ __forceinline__ void mma_u8s8_k32(int* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                             uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// c += a (16 x 16 signed bytes) · b (16 x 8 signed bytes).
__device__ __forceinline__ void mma_s8s8_k16(int* c, uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a0), "r"(a1), "r"(b0));
}
// The 4 bytes at p (2-byte aligned) as a little-endian word.
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* base = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
  return __funnelshift_r(__ldg(base), __ldg(base + 1), uint32_t(a & 3) * 8);
}
__device__ __forceinline__ uint2 ld_u64(const void* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }

// The per-format step: unit u of weight rows ra, rb (thread rows g, g + 8) against prepared
// row xg (the thread's B column), then each of the thread's four (row, prepared row) pairs'
// shares (Unit::combine) added to acc[p] in order.
template <WFormat F>
struct MmaUnit;

// Q4_K / Q5_K: sub-blocks 2j and 2j + 1 of the unit, one k32 MMA each.
template <WFormat F>
struct KQuantMma {
  using U = Unit<F, 0>;
  __device__ static void add(const uint8_t* ra, const uint8_t* rb, int64_t u, const Q8Act& xg, const Q8Act* xp,
                             float* acc) {
    const int t = threadIdx.x % 4, j = int(u & 3);
    const int64_t sb = u >> 2;
    const int code_off = (U::q5 ? 48 : 16) + 32 * j + 8 * t;
    const uint8_t* rows[2] = {ra + sb * U::kBlockBytes, rb + sb * U::kBlockBytes};
    uint32_t lo[2][2], hi[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint2 c = ld_u64(rows[h] + code_off);
      const uint32_t cw[2] = {c.x, c.y};
      uint32_t qw[2] = {0, 0};
      if constexpr (U::q5) {
        const uint2 q = ld_u64(rows[h] + 16 + 8 * t);
        qw[0] = q.x, qw[1] = q.y;
      }
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        lo[h][k] = cw[k] & 0x0F0F0F0Fu;
        hi[h][k] = (cw[k] >> 4) & 0x0F0F0F0Fu;
        if constexpr (U::q5) {
          lo[h][k] |= ((qw[k] >> (2 * j)) & 0x01010101u) << 4;
          hi[h][k] |= ((qw[k] >> (2 * j + 1)) & 0x01010101u) << 4;
        }
      }
    }
    const int64_t xb0 = sb * 8 + 2 * j;
    const uint2 xa = ld_u64(xg.q + 32 * xb0 + 8 * t), xb = ld_u64(xg.q + 32 * (xb0 + 1) + 8 * t);
    int s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
    mma_u8s8_k32(s0, lo[0][0], lo[1][0], lo[0][1], lo[1][1], xa.x, xa.y);
    mma_u8s8_k32(s1, hi[0][0], hi[1][0], hi[0][1], hi[1][1], xb.x, xb.y);
    const typename U::Scales k[2] = {U::load_scales(ra, u), U::load_scales(rb, u)};
#pragma unroll
    for (int p = 0; p < 4; ++p) acc[p] = __fadd_rn(acc[p], U::combine(k[p >> 1], u, xp[p & 1], s0[p], s1[p]));
  }
};
template <>
struct MmaUnit<WFormat::GgufQ4_K> : KQuantMma<WFormat::GgufQ4_K> {};
template <>
struct MmaUnit<WFormat::GgufQ5_K> : KQuantMma<WFormat::GgufQ5_K> {};

// Q6_K: the unit's four 16-value groups (Unit::combine's i[0..3]), one k16 MMA each on the
// signed codes q - 32.
template <>
struct MmaUnit<WFormat::GgufQ6_K> {
  using U = Unit<WFormat::GgufQ6_K, 0>;
  __device__ static void add(const uint8_t* ra, const uint8_t* rb, int64_t u, const Q8Act& xg, const Q8Act* xp,
                             float* acc) {
    const int t = threadIdx.x % 4, h = int(u >> 1) & 1, ut = int(u & 1);
    const int64_t sb = u >> 2;
    // codes[row][group]: group 0 / 1: values 4t.. of va's halves; 2 / 3: of vb's.
    uint32_t codes[2][4];
    const uint8_t* rows[2] = {ra + sb * 210, rb + sb * 210};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t ql = ld_u32_a2(rows[r] + 64 * h + 32 * ut + 16 * half + 4 * t);
        const uint32_t qh = ld_u32_a2(rows[r] + 128 + 32 * h + 16 * half + 4 * t);
        const uint32_t va = (ql & 0x0F0F0F0Fu) | (((qh >> (2 * ut)) & 0x03030303u) << 4);
        const uint32_t vb = ((ql >> 4) & 0x0F0F0F0Fu) | (((qh >> (2 * ut + 4)) & 0x03030303u) << 4);
        codes[r][half] = __vsub4(va, 0x20202020u);
        codes[r][2 + half] = __vsub4(vb, 0x20202020u);
      }
    }
    const int64_t xba = U::x_block_a(u), xbb = xba + 2;
    const uint32_t xw[4] = {__ldg(reinterpret_cast<const uint32_t*>(xg.q + 32 * xba + 4 * t)),
                            __ldg(reinterpret_cast<const uint32_t*>(xg.q + 32 * xba + 16 + 4 * t)),
                            __ldg(reinterpret_cast<const uint32_t*>(xg.q + 32 * xbb + 4 * t)),
                            __ldg(reinterpret_cast<const uint32_t*>(xg.q + 32 * xbb + 16 + 4 * t))};
    int s[4][4] = {};  // s[group][pair]
#pragma unroll
    for (int gi = 0; gi < 4; ++gi) mma_s8s8_k16(s[gi], codes[0][gi], codes[1][gi], xw[gi]);
    const U::Scales k[2] = {U::load_scales(ra, u), U::load_scales(rb, u)};
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int i[4] = {s[0][p], s[1][p], s[2][p], s[3][p]};
      acc[p] = __fadd_rn(acc[p], U::combine(k[p >> 1], u, xp[p & 1], i));
    }
  }
};

// Grid (Σ_i row tiles of weight i, tiles of 8 prepared rows); block min(lpr, 8) warps. y[i][m][r] =
// w[i][r] · x[m] (kAct != kPlain: gelu(w[0] · x) * (w2 · x)), each (r, m) with the bits the dp4a
// GEMV at lpr lanes a row gives row m alone.
template <WFormat F, int kAct>
__global__ void __launch_bounds__(kMmaWarps * kWarp) q8_mma_kernel(MatArgs a, int lpr) {
  constexpr int kW = kAct != kPlain ? 2 : 1;
  __shared__ float part[kW][32][kTile];  // [weight][lane played][tile (row, prepared row)]
  int i = 0;
  while (i + 1 < a.n && blockIdx.x >= a.first[i + 1]) ++i;
  const DevWeight& w = a.w[i];
  const int64_t r0 = int64_t(blockIdx.x - a.first[i]) * kTileRows;
  if ((a.row_fetch & kFetchL2) && threadIdx.x == 0 && blockIdx.y == 0) {  // this block's weight rows, while the kernels before it finish
    const int64_t n = min(int64_t(kTileRows), w.rows - r0);
    prefetch_l2(w.data + r0 * w.row_bytes, size_t(n * w.row_bytes));
    if constexpr (kAct != kPlain) prefetch_l2(a.w2.data + r0 * a.w2.row_bytes, size_t(n * a.w2.row_bytes));
  }
  pdl_enter_streaming();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const int m0 = int(blockIdx.y) * kTileCols;
  const int64_t ra = min(r0 + g, w.rows - 1), rb = min(r0 + g + 8, w.rows - 1);  // tail rows: loaded, not stored
  const Q8Act xg = q8_row(a.q8, min(m0 + g, a.M - 1), w.cols);
  const Q8Act xp[2] = {q8_row(a.q8, min(m0 + 2 * t, a.M - 1), w.cols), q8_row(a.q8, min(m0 + 2 * t + 1, a.M - 1), w.cols)};
  const int64_t nu = w.cols / Unit<F, 0>::kVals;
  const int warps = int(blockDim.x) / kWarp;
  for (int s = warp; s < lpr; s += warps) {  // the dp4a GEMV's lane s of each row
    float acc[4] = {0.f, 0.f, 0.f, 0.f}, acc2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
    for (int64_t u = s; u < nu; u += lpr) {
      MmaUnit<F>::add(w.data + ra * w.row_bytes, w.data + rb * w.row_bytes, u, xg, xp, acc);
      if constexpr (kAct != kPlain)
        MmaUnit<F>::add(a.w2.data + ra * a.w2.row_bytes, a.w2.data + rb * a.w2.row_bytes, u, xg, xp, acc2);
    }
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int at = (g + 8 * (p >> 1)) * kTileCols + 2 * t + (p & 1);
      part[0][s][at] = acc[p];
      if constexpr (kAct != kPlain) part[kW - 1][s][at] = acc2[p];
    }
  }
  __syncthreads();
  for (int at = threadIdx.x; at < kTile; at += blockDim.x) {
    // The shuffle-xor tree of the dp4a GEMV: at offset o, lane l < o adds lane l + o's sum.
    for (int o = lpr / 2; o > 0; o >>= 1)
      for (int l = 0; l < o; ++l)
#pragma unroll
        for (int k = 0; k < kW; ++k) part[k][l][at] = __fadd_rn(part[k][l][at], part[k][l + o][at]);
    const int64_t r = r0 + at / kTileCols;
    const int m = m0 + at % kTileCols;
    if (r >= w.rows || m >= a.M) continue;
    float v = part[0][0][at];
    if constexpr (kAct == kGelu) v = gelu_tanh_mul(v, part[kW - 1][0][at]);
    if constexpr (kAct == kGeluGgml) v = gelu_ggml_mul(v, part[kW - 1][0][at], a.table);
    store_out(a.y[i], int64_t(m) * w.rows + r, v, a.yt == DType::F32);
  }
}

template <WFormat F>
void mma_launch(cudaStream_t s, MatArgs a, int M, int act, int lpr) {
  const unsigned blocks = assign_row_blocks(a, kTileRows);
  a.M = M;
  const dim3 grid(blocks, blocks_for(M, kTileCols));
  const int threads = std::min(lpr, kMmaWarps) * kWarp;
  with_act(act, [&](auto A) { launch_kernel(q8_mma_kernel<F, decltype(A)::value>, grid, threads, 0, s, a, lpr); });
}

}  // namespace

bool q8_mma_handles(const MatArgs& a, int act) {
  if (a.resid) return false;
  const WFormat f = a.w[0].fmt;
  if (f != WFormat::GgufQ4_K && f != WFormat::GgufQ5_K && f != WFormat::GgufQ6_K) return false;
  for (int i = 1; i < a.n; ++i)
    if (a.w[i].fmt != f) return false;
  return act == kPlain || a.w2.fmt == f;
}

bool q8_mma_takes(const MatArgs& a, int M, int act) {
  if (M < 2 || !a.mma_rows || !q8_mma_handles(a, act)) return false;
  if (a.mma_rows == kMmaWherePossible || M >= kMmaMinRows) return true;
  if (M < kMmaLargeMinRows || a.w[0].fmt == WFormat::GgufQ6_K) return false;
  int64_t values = 0;  // the largest weight of the launch
  for (int i = 0; i < a.n; ++i) values = std::max(values, a.w[i].rows * a.w[i].cols);
  return values >= kMmaLargeValues && (act == kPlain || values < kMmaLargeGeluValues);
}

void q8_mma_gemv(cudaStream_t s, const MatArgs& a, int M, int act, int lpr) {
  switch (a.w[0].fmt) {
    case WFormat::GgufQ4_K: return mma_launch<WFormat::GgufQ4_K>(s, a, M, act, lpr);
    case WFormat::GgufQ5_K: return mma_launch<WFormat::GgufQ5_K>(s, a, M, act, lpr);
    case WFormat::GgufQ6_K: return mma_launch<WFormat::GgufQ6_K>(s, a, M, act, lpr);
    default: break;
  }
}

}  // namespace g4::cuda
