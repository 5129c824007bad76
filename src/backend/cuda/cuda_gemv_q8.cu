// Decode GEMVs (M = 1) on int8 activations (cuda_q8.cuh): one launch prepares the activation row
// (the input norm, when the matmul has one, then the int8 blocks), the next dots every weight row
// with it. Each lane takes whole units of a row (cuda_q8_units.cuh), loads the unit's bytes in as
// few wide loads as its alignment allows and reduces codes against x with dp4a; `lpr` lanes share
// a row (a power of two: short rows give a warp several rows), and their partial sums meet by
// shuffles. What a unit computes equals Σ dequant(w)[c] · x_q8[c] over its columns (the slow
// reference the CUDA op tests compare it with); only the f32 summation order differs.
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kquant_dot.cuh"
#include "backend/cuda/cuda_matmul_common.cuh"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_q8.cuh"
#include "backend/cuda/cuda_q8_store.cuh"
#include "backend/cuda/cuda_q8_units.cuh"
#include "backend/cuda/cuda_stage_rows.cuh"
#include "backend/cuda/cuda_gemv_mma.h"
#include "backend/cuda/cuda_gemv_lanes.h"
#include "backend/cuda/cuda_gemv_q8.h"
#include "backend/cuda/cuda_launch.cuh"

namespace g4::cuda {
namespace {

using q8units::Mem;
using q8units::Unit;
using q8units::unit_dot;

// ---- the activation row -------------------------------------------------------------------------

// Grid (ceil(cols / 32 / kPrepWarps), rows): row blockIdx.y of x [rows, cols] (f32 or bf16;
// normed with norm_w when set) into o (cuda_q8.cuh), warp w of block b quantizing the 32-value
// block kPrepWarps b + w. With a norm every block sums the row's squares itself (the same loop in
// every block, so every block finds the same factor). IEEE operations throughout (no
// contraction), so the host reference of the tests rounds identically.
constexpr int kPrepWarps = 8;
__global__ void __launch_bounds__(kPrepWarps * kWarp) q8_prepare_kernel(const void* x, bool bf, int cols,
                                                                        const float* norm_w, float eps, Q8Act o) {
  const int lane = threadIdx.x % kWarp, b = blockIdx.x * kPrepWarps + threadIdx.x / kWarp;
  const int c = 32 * b + lane;
  const float nw = norm_w && b < cols / 32 ? norm_w[c] : 1.f;  // before the wait: never written during a step
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
  if (b >= cols / 32) return;
  float v = ldx(x, c, bf);
  if (norm_w) v = __fmul_rn(__fmul_rn(v, inv), nw);
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
// The 1024 threads (at ~58 registers: a whole SM's register file) also gate the next launch: the
// block becomes resident only once an SM has drained, at the tail of the GEMV before it, and only
// then releases the next GEMV, whose blocks prefetch their rows into L2 a few microseconds before
// they need them. A 256-thread block with the same bits was resident at once and slowed decode
// steps by 5-11 % (docs/cuda-log/stops-50-56.md, stop 54).
constexpr int kPostThreads = 1024, kPostPer = 8, kPostMax = kPostThreads * kPostPer;
__global__ void __launch_bounds__(kPostThreads) post_add_prepare_kernel(const void* y, const float* pw, float peps,
                                                                        float scale, void* resid, bool bf,
                                                                        int n, const float* norm_w, float eps,
                                                                        Q8Act o) {
  // The norm weights (never written during a step) are loaded before the wait, while the kernel
  // before this one finishes; then y and the residual: one memory round trip after the wait, not
  // one after each reduction.
  float v[kPostPer], r[kPostPer], g[kPostPer], nw[kPostPer], ss = 0.f;
#pragma unroll
  for (int k = 0; k < kPostPer; ++k) {
    const int c = threadIdx.x + k * kPostThreads;
    g[k] = c < n ? pw[c] : 0.f;
    nw[k] = c < n && norm_w ? norm_w[c] : 1.f;
  }
  pdl_enter();
  __shared__ float red[32];
  const int64_t row_off = int64_t(blockIdx.x) * n * (bf ? 2 : 4);
  y = static_cast<const uint8_t*>(y) + row_off;
  resid = static_cast<uint8_t*>(resid) + row_off;
  if (o.q) o = q8_row(o, blockIdx.x, n);
#pragma unroll
  for (int k = 0; k < kPostPer; ++k) {
    const int c = threadIdx.x + k * kPostThreads;
    v[k] = c < n ? ldx(y, c, bf) : 0.f;
    r[k] = c < n ? ldx(resid, c, bf) : 0.f;
  }
#pragma unroll
  for (int k = 0; k < kPostPer; ++k) ss += v[k] * v[k];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(n) + peps);
  float ss2 = 0.f;
#pragma unroll
  for (int k = 0; k < kPostPer; ++k) {
    const int c = threadIdx.x + k * kPostThreads;
    if (c >= n) continue;
    // Each value as stored (rounded to the activation type) is what the next kernel would read.
    v[k] = act_round(r[k] + v[k] * inv * g[k], bf);
    if (scale != 1.f) v[k] = act_round(v[k] * scale, bf);
    store_out(resid, c, v[k], !bf);
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
    if (norm_w) x = __fmul_rn(__fmul_rn(x, inv2), nw[k]);
    q8_store_block(x, c, lane, o);
  }
}

// ---- the GEMV ----------------------------------------------------------------------------------

// acc += Σ dot(unit u of row r, x) over the lane's units u = sub, sub + lpr, .. < nu, in that
// order, each unit's bytes asked for one round ahead: the lane's next unit is in flight while it
// dots the current one. The sum is the plain loops': the same bits. kRounded: each add rounded as
// written (__fadd_rn, q8_gemv_kernel's loop); else a plain += that may fuse with the unit's last
// multiply, as q8_moe_kernel's loop does.
template <class U, bool kRounded>
__device__ __forceinline__ void dot_units_ahead(const uint8_t* row, const DevWeight& w, int64_t r, int sub, int lpr,
                                                int64_t nu, const Q8Act& x, float& acc) {
  using UF = q8units::UnitFetch<U>;
  int64_t u = sub;
  typename UF::Raw cur;
  if (u < nu) cur = UF::template fetch<Mem::Global>(row, w, r, u);
#pragma unroll 2
  for (; u < nu; u += lpr) {
    // The last round fetches its own unit again (an L1 hit): no branch for the compiler to sink
    // the next unit's loads behind the current unit's arithmetic.
    const typename UF::Raw next = UF::template fetch<Mem::Global>(row, w, r, u + lpr < nu ? u + lpr : u);
    if constexpr (kRounded) acc = __fadd_rn(acc, U::dot(UF::unpack(cur, w, u), u, x));
    else acc += U::dot(UF::unpack(cur, w, u), u, x);
    cur = next;
  }
}

// Whether a one-row launch of format F (activation act, rows of `cols` values) fetches ahead when
// BackendOptions::gemv_ahead asks for it: plain launches of every format but Q6_K, on rows of at
// least kAheadMinCols. Measured per kernel (H100, stop 56, bench_cuda_gemv --ahead): it pays on
// long rows (31B down Q4_K 39.3 -> 31.3 us, 31B q / o Q4_K 16.4 -> 14.6, E4B down mlx4g64 11.4 ->
// 9.8) and loses on Q6_K, whose unit takes 24 loads (the E4B head 215 -> 247 us), and on the fused
// gate/up, whose two pipelines take 96 registers (31B Q4_K 49.4 -> 55.3 us). In the decode step
// with every plain non-Q6_K launch ahead: 31B -4.8 %, E4B even, E2B +0.8 %, 26B-A4B +1.5 % (their
// rows of 1536-2816 values, a unit or two a lane): hence the row length.
constexpr int64_t kAheadMinCols = 4096;
template <WFormat F>
constexpr bool ahead_format() {
  return F != WFormat::GgufQ6_K;
}
template <WFormat F>
bool ahead_pays(int act, int64_t cols) {
  return ahead_format<F>() && act == kPlain && cols >= kAheadMinCols;
}

constexpr int kQ8Warps = 4;  // warps per block
constexpr int kQ8Cols = 8;   // prepared rows a block of a multi-row launch dots each weight row with

// y[i][m][r] = w[i][r] · x[m] for the a.n weights of the launch (blocks [first[i], first[i+1])
// take weight i, kQ8Warps * 32 / lpr rows each) and the a.M prepared rows (blockIdx.y: rows
// kCols·blockIdx.y onward, at most kCols of them, each weight unit loaded and unpacked once for
// them all).
// kAct != kPlain: gelu(w[0][r] · x) * (w2[r] · x). a.resid (a.M == 1 only): matmul_norm_add's
// epilogue by the last block (cuda_matmul_common.cuh).
// Row m's arithmetic (its units in the same lanes, summed in the same order, the same shuffle
// tree) depends on lpr and the weights only: the same bits at any a.M and any kCols (the CUDA op
// tests check it; batch-invariant decode and the MMA GEMV, cuda_gemv_mma.cu, rest on it).
// S == Mem::Shared (kCols == 1): the block's rows are first copied into dynamic shared memory
// (cuda_stage_rows.cuh; q8_stage_bytes of it), the same arithmetic on the copy.
// kAhead (one plain row from global memory): each lane asks for its next unit before it dots the
// current one (dot_units_ahead).
template <WFormat F, int kBits, int kAct, int kCols, Mem S = Mem::Global, bool kAhead = false>
__global__ void __launch_bounds__(kQ8Warps * kWarp) q8_gemv_kernel(MatArgs a, Q8Act x, int lpr) {
  static_assert(!kAhead || (kCols == 1 && S == Mem::Global && kAct == kPlain), "kAhead: one plain row, global memory");
  using U = Unit<F, kBits>;
  int i = 0;
  while (i + 1 < a.n && blockIdx.x >= a.first[i + 1]) ++i;
  const DevWeight& w = a.w[i];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t r0 = int64_t(blockIdx.x - a.first[i]) * kQ8Warps * (kWarp / lpr);
  const int64_t r = r0 + (int64_t(warp) * kWarp + lane) / lpr;
  // With S == Mem::Shared, row r0's bytes at staged (w2's at staged2), the block's rows after it.
  [[maybe_unused]] const uint8_t *staged = nullptr, *staged2 = nullptr;
  [[maybe_unused]] __shared__ uint64_t stage_bar;
  if constexpr (S == Mem::Shared) {  // this block's weight rows, while the kernels before it finish
    extern __shared__ __align__(16) uint8_t stage[];
    const int64_t n = max(int64_t(0), min(int64_t(kQ8Warps * (kWarp / lpr)), w.rows - r0));
    RowSpan spans[2] = {row_span(w.data + r0 * w.row_bytes, size_t(n * w.row_bytes)),
                        row_span(a.w2.data + r0 * a.w2.row_bytes, kAct != kPlain ? size_t(n * a.w2.row_bytes) : 0)};
    stage_rows(spans, 2, stage, &stage_bar);
    staged = stage + spans[0].offset;
    staged2 = stage + spans[1].offset;
  } else if ((a.row_fetch & kFetchL2) && threadIdx.x == 0 && blockIdx.y == 0 && r0 < w.rows) {
    // this block's weight rows into L2, while the kernels before it finish
    const int64_t n = min(int64_t(kQ8Warps * (kWarp / lpr)), w.rows - r0);
    prefetch_l2(w.data + r0 * w.row_bytes, size_t(n * w.row_bytes));
    if constexpr (kAct != kPlain) prefetch_l2(a.w2.data + r0 * a.w2.row_bytes, size_t(n * a.w2.row_bytes));
  }
  pdl_enter_streaming();
  if constexpr (S == Mem::Shared) stage_wait(&stage_bar);
  const int sub = lane % lpr;
  const int64_t nu = w.cols / U::kVals;
  const int m0 = int(blockIdx.y) * kCols, nm = min(kCols, a.M - m0);
  float acc[kCols], acc2[kCols];
#pragma unroll
  for (int m = 0; m < kCols; ++m) acc[m] = acc2[m] = 0.f;
  if (r < w.rows && kAhead) {
    dot_units_ahead<U, true>(w.data + r * w.row_bytes, w, r, sub, lpr, nu, x, acc[0]);
  } else if (r < w.rows) {
    const uint8_t* row = S == Mem::Shared ? staged + (r - r0) * w.row_bytes : w.data + r * w.row_bytes;
    const uint8_t* row2 = S == Mem::Shared ? staged2 + (r - r0) * a.w2.row_bytes : a.w2.data + r * a.w2.row_bytes;
#pragma unroll(kCols == 1 ? 4 : kCols <= 4 ? 8 / kCols : 1)
    for (int64_t u = sub; u < nu; u += lpr) {
      const typename U::W q = U::template load<S>(row, w, r, u);  // once for every prepared row
      typename U::W q2;
      if constexpr (kAct != kPlain) q2 = U::template load<S>(row2, a.w2, r, u);
#pragma unroll
      for (int m = 0; m < kCols; ++m) {
        if (m >= nm) break;
        const Q8Act xm = kCols == 1 ? x : q8_row(x, m0 + m, w.cols);
        acc[m] = __fadd_rn(acc[m], U::dot(q, u, xm));  // as written: the MMA GEMV replays it
        if constexpr (kAct != kPlain) acc2[m] = __fadd_rn(acc2[m], U::dot(q2, u, xm));
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
// e = idx[i]'s rows with prepared x row i / x_div. kAct: kPlain or kGelu (tanh form). kAhead
// (a.ahead, plain launches where ahead_pays): each lane fetches its next unit before it dots the
// current one (dot_units_ahead).
template <WFormat F, int kBits, int kAct, bool kAhead = false>
__global__ void __launch_bounds__(kQ8Warps * kWarp) q8_moe_kernel(MoeMatArgs a, int lpr) {
  static_assert(!kAhead || kAct == kPlain, "kAhead: plain launches");
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
  if (r < w.rows && kAhead) {
    dot_units_ahead<U, false>(w.data + r * w.row_bytes, w, r, sub, lpr, nu, x, acc);
  } else if (r < w.rows) {
    const uint8_t* row = w.data + r * w.row_bytes;
#pragma unroll 2
    for (int64_t u = sub; u < nu; u += lpr) acc += unit_dot<U>(row, w, r, u, x);
    if constexpr (kAct != kPlain) {
      const DevWeight& w2 = a.w2[e];
      const uint8_t* row2 = w2.data + r * w2.row_bytes;
#pragma unroll 2
      for (int64_t u = sub; u < nu; u += lpr) acc2 += unit_dot<U>(row2, w2, r, u, x);
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

template <WFormat F, int kBits, int kCols>
void gemv_act(cudaStream_t s, const MatArgs& a, int act, dim3 grid, int lpr) {
  with_act(act, [&](auto A) {
    launch_kernel(q8_gemv_kernel<F, kBits, decltype(A)::value, kCols>, grid, kQ8Warps * kWarp, 0, s, a, a.q8, lpr);
  });
}

// The one-row GEMV from global memory: fetching ahead where a asks for it (kFetchAhead) and it
// pays (ahead_pays), else the plain loop.
template <WFormat F, int kBits>
void gemv_one_row(cudaStream_t s, const MatArgs& a, int act, unsigned blocks, int lpr) {
  if constexpr (ahead_format<F>()) {  // no ahead instance is compiled for the others
    if ((a.row_fetch & kFetchAhead) && ahead_pays<F>(act, a.w[0].cols))
      return launch_kernel(q8_gemv_kernel<F, kBits, kPlain, 1, Mem::Global, true>, dim3(blocks), kQ8Warps * kWarp, 0, s,
                           a, a.q8, lpr);
  }
  gemv_act<F, kBits, 1>(s, a, act, dim3(blocks), lpr);
}

// Shared memory a one-row GEMV block of lpr lanes a row stages its rows in: its weight's rows (the
// launch's widest) and, with an activation, w2's beside them.
size_t q8_stage_bytes(const MatArgs& a, int act, int lpr) {
  const int64_t rows = kQ8Warps * (kWarp / lpr);
  int64_t n0 = 0;
  for (int i = 0; i < a.n; ++i) n0 = std::max(n0, rows * a.w[i].row_bytes);
  return stage_bytes(size_t(n0), act != kPlain ? size_t(rows * a.w2.row_bytes) : 0);
}

// The one-row GEMV over rows staged in `stage` bytes of shared memory (kFetchShared).
template <WFormat F, int kBits, int kAct>
void gemv_staged(cudaStream_t s, const MatArgs& a, unsigned blocks, int lpr, size_t stage) {
  const auto kernel = q8_gemv_kernel<F, kBits, kAct, 1, Mem::Shared>;
  static std::atomic<uint64_t> opted_in{0};  // devices this kernel may take kStageMaxBytes on
  int dev = 0;
  G4_CUDA(cudaGetDevice(&dev));
  if (stage > 48 * 1024 && !(opted_in.load() >> dev & 1)) {
    G4_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kStageMaxBytes)));
    opted_in.fetch_or(uint64_t(1) << dev);
  }
  launch_kernel(kernel, dim3(blocks), kQ8Warps * kWarp, stage, s, a, a.q8, lpr);
}

// The GEMV launch over a.M prepared rows. lpr comes from the weights' shape alone, never from
// a.M, so that a row's bits do not depend on the rows beside it.
// The lanes a row of a's GEMV launch (act: Act) takes: `lanes` (a measurement's), else the
// placement's plan (a.lanes), else (both 0) gemv_row_lanes' rule, which the plan was chosen by; the
// fused Q4_K gate / up launch without the K-quant floor (cuda_gemv_lanes.h).
template <WFormat F, int kBits>
int gemv_lanes(const MatArgs& a, int act, int lanes) {
  if (lanes > 0) return lanes;
  if (a.lanes > 0) return a.lanes;
  int64_t rows = 0;
  for (int i = 0; i < a.n; ++i) rows += a.w[i].rows;
  const bool kquant_floor = !(act != kPlain && F == WFormat::GgufQ4_K);
  return gemv_row_lanes(a.w[0].cols / unit_vals<F, kBits>(), rows, unit_vals<F, kBits>(), kGemvMinWarps, kquant_floor);
}

template <WFormat F, int kBits>
void gemv_launch(cudaStream_t s, MatArgs a, int M, int act, int lanes) {
  const int lpr = gemv_lanes<F, kBits>(a, act, lanes);
  a.norm_w = nullptr;  // applied by the prepare launch
  const bool post = a.resid && a.w[0].rows <= kPostMax;
  void* resid = a.resid;
  if (post) a.resid = nullptr;  // the post-norm kernel below (or a later prepare) instead of the last-block epilogue
  if (M > 1 && a.mma_rows && q8_mma_takes(a, M, act)) {
    q8_mma_gemv(s, a, M, act, lpr);
  } else {
    const unsigned blocks = assign_row_blocks(a, kQ8Warps * (kWarp / lpr));
    a.M = M;
    const size_t stage = M == 1 && (a.row_fetch & kFetchShared) ? q8_stage_bytes(a, act, lpr) : 0;
    // kCols fitted to M (a speculative verify forward is 2 to 8 rows): no idle accumulators, and
    // deeper unrolling where fewer rows leave registers for it.
    if (stage > 0 && stage <= kStageMaxBytes)
      with_act(act, [&](auto A) { gemv_staged<F, kBits, decltype(A)::value>(s, a, blocks, lpr, stage); });
    else if (M == 1) gemv_one_row<F, kBits>(s, a, act, blocks, lpr);
    else if (M == 2) gemv_act<F, kBits, 2>(s, a, act, dim3(blocks), lpr);
    else if (M <= 4) gemv_act<F, kBits, 4>(s, a, act, dim3(blocks), lpr);
    else gemv_act<F, kBits, kQ8Cols>(s, a, act, dim3(blocks, unsigned(blocks_for(M, kQ8Cols))), lpr);
  }
  if (post && !a.defer_post)
    post_norm_add(s, a.y[0], resid, a.xt, int(a.w[0].rows), a.post_w, a.post_eps, M);
}

template <WFormat F, int kBits>
void moe_launch(cudaStream_t s, const MoeMatArgs& a, int items, int per_token, int64_t rows, int act) {
  // Lanes per row from one token's items, so that a token's bits do not depend on the tokens beside it.
  const int lpr = gemv_row_lanes(a.w0.cols / unit_vals<F, kBits>(), rows * per_token, unit_vals<F, kBits>(), kGemvMinWarps);
  const dim3 grid(blocks_for(rows, kQ8Warps * (kWarp / lpr)), unsigned(items));
  auto go = [&](auto kernel) { launch_kernel(kernel, grid, kQ8Warps * kWarp, 0, s, a, lpr); };
  if constexpr (ahead_format<F>()) {
    if (a.ahead && ahead_pays<F>(act, a.w0.cols)) return go(q8_moe_kernel<F, kBits, kPlain, true>);
  }
  act == kGelu ? go(q8_moe_kernel<F, kBits, kGelu>) : go(q8_moe_kernel<F, kBits, kPlain>);
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

int gemv_row_lanes(int64_t units, int64_t rows, int vals, int64_t min_warps, bool kquant_floor) {
  int lpr = 4;
  for (int l = kWarp; l > 4; l /= 2) {
    const int64_t rounds = (units + l - 1) / l;
    if (units * 100 >= rounds * l * 85) {
      lpr = l;
      break;
    }
  }
  if (kquant_floor && vals >= 64 && units >= 32) lpr = std::max(lpr, 16);
  while (lpr < kWarp && rows * lpr / kWarp < min_warps) lpr *= 2;
  return lpr;
}

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

// Whether the weights of launch a (and gate_up_gelu's second, act != kPlain) are of one format and
// width the int8 GEMV reads; with same_bits, of one bit width too.
static bool q8_weights_fit(const MatArgs& a, int act, bool same_bits) {
  for (int i = 0; i < a.n; ++i)
    if (!q8_gemv_supports(a.w[i]) || a.w[i].fmt != a.w[0].fmt || a.w[i].cols != a.w[0].cols ||
        (same_bits && a.w[i].bits != a.w[0].bits))
      return false;
  return act == kPlain || (q8_gemv_supports(a.w2) && a.w2.fmt == a.w[0].fmt && a.w2.bits == a.w[0].bits);
}

bool q8_gemv_takes(const MatArgs& a, int act) { return a.q8.q && q8_weights_fit(a, act, false); }

bool q8_prepare_fusable(const MatArgs& a, bool gelu) {
  return q8_gemv_takes(a, gelu ? kGelu : kPlain) && a.w[0].cols <= kPostMax;
}

// Whether q8_gemv launches a over M rows (q8_gemv_takes, and the rows fit the scratch and the
// epilogue).
static bool q8_gemv_applies(const MatArgs& a, int M, int act) {
  if (!q8_gemv_takes(a, act) || M < 1 || int64_t(M) * a.w[0].cols > kQ8MaxValues) return false;
  return !(M > 1 && a.resid && a.w[0].rows > kPostMax);  // the last-block epilogue is for one row
}

bool q8_gemv(cudaStream_t s, const MatArgs& a, int M, int act) {
  if (!q8_gemv_applies(a, M, act)) return false;
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

int q8_gemv_lanes(const MatArgs& a, int act) {
  if (!q8_weights_fit(a, act, true)) return 0;
  int lpr = 0;
  with_format(a.w[0].fmt, [&](auto f) {
    constexpr WFormat F = decltype(f)::value;
    with_bits<F>(a.w[0].bits, [&](auto b) { lpr = gemv_lanes<F, decltype(b)::value>(a, act, 0); });
  });
  return lpr;
}

size_t q8_stage_bytes_for(const MatArgs& a, int act, int lanes) {
  size_t bytes = 0;
  with_format(a.w[0].fmt, [&](auto f) {
    constexpr WFormat F = decltype(f)::value;
    with_bits<F>(a.w[0].bits, [&](auto b) { bytes = q8_stage_bytes(a, act, gemv_lanes<F, decltype(b)::value>(a, act, lanes)); });
  });
  return bytes;
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
