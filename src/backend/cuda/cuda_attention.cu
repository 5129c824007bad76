// Attention over the KV caches of a batch of sequences in one launch (flash-decoding with position
// splits; f32, bf16 or quantized rows). Prefill-sized sequences on a bf16 cache go to the
// tensor-core kernel instead (cuda_flash_attention.cu).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_head_norm.cuh"
#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_q8_store.cuh"

namespace g4::cuda {
namespace {

// Flash-decoding attention. Grid (a.rows * H, splits), kAttnWarps warps per block: block (launch
// row, head h, split) takes its share of the visible positions of that row (row t of sequence
// a.tab.seqs[a.tab.row_seq[launch row]]); warp w of it every kAttnWarps-th
// position; lane l holds dims l, l + 32, ... (kPer of them, coalesced loads; a quantized cache:
// dims l*kPer .. l*kPer+kPer-1, whose codes are contiguous words of one group). Each warp keeps an
// online softmax (running max m, sum l, weighted V sum); the warps merge through shared memory.
// One split writes the normalized output; several write (acc[D], m, l) partials, and the last
// block of each (row, head) to finish merges them. q8o.q set (head_dim % 32 == 0): the stored
// output rows [rows, H * head_dim] in int8 form too (cuda_q8_store.cuh), for the matmul after.
// prep.q set (attn_prep folded in: one row per sequence, its own position the last it sees, an
// unquantized cache): q is prep.q before its norm and RoPE; each block norms and ropes its q head
// into shared memory, and the blocks whose positions include the row's own also its K and V head
// (prep.k, prep.v, when the layer has them), the first query head of each KV group writing them
// into the cache slot; the row's own K/V are then read from shared memory (no block reads that
// slot). norm_rope_head / norm_v_head as attn_prep_kernel runs them: the same bits.
// kFold: the instance that runs with prep.q set. The others compile without the fold's prologue and
// its per-position choice of K/V source: carrying them cost +23 % of a decode step at a 512-token
// context (stop 51).
// Warps a block. The instance that folds attn_prep in runs the same 8, so its output adds in the
// same order as the plain one's; its head norms split their sums over attn_prep's 128 threads
// (inv_rms<kAttnPrepThreads>), so the caches and q get attn_prep's bits.
constexpr int kAttnWarps = 8;
// The fewest cache positions a split takes by default: with 8 warps, two rounds of kBatch
// positions a warp. Against 4 warps and 32 positions, device time a step at prompt 512: E2B
// -1.7 %, E4B -1.5 %, 26B-A4B -2.8 %, 31B -1.0 % (stop 60, H200; stop 59's H100: E2B -1.8 %,
// 26B-A4B -2.4 %); 8 warps at 32 positions alone cost 26B-A4B 2.6 %.
constexpr int kAttnSplitPositions = 64;

// Before the wait: split `split` of S's K and V rows of KV head g into L2, for the launch row lr of
// a contiguous or ring cache (no block table, no image block: both are read only after the wait).
// A hint, issued while the kernels before this one run; the loads after the wait then find the
// rows in L2 instead of DRAM. It never makes a load stale: a kernel of this step that writes a
// cache row (attn_prep, this row's own position) writes it through L2. Head rows that are not
// whole 16-byte words are left alone (the prefetch would widen past the cache's last row).
template <class T>
__device__ __forceinline__ void prefetch_split_kv(const SeqKv& sq, int lr, int g, const AttnBatch& a, int split, int S) {
  const int D = a.head_dim;
  if (sq.table || sq.blocks || (D * sizeof(T)) % 16 != 0) return;
  // The kernel's own split range (j0, j1 there), written apart: one inlined helper for both gave
  // the kernel more registers (head_dim 512, bf16: 145 -> 150; head_dim 256: 126 -> 128).
  const int pos = sq.pos0 + lr - sq.first;
  const int first = sq.window > 0 ? max(0, pos - sq.window + 1) : 0, n = pos - first + 1, per = (n + S - 1) / S;
  const int j0 = split * per, j1 = min(n, j0 + per);
  const int64_t row = int64_t(a.n_kv_heads) * D;
  for (int j = j0 + int(threadIdx.x); j < j1; j += blockDim.x) {
    const int64_t at = kv_slot(nullptr, 0, sq.capacity, sq.window, first + j) * row + int64_t(g) * D;
    prefetch_l2(static_cast<const T*>(sq.k) + at, size_t(D) * sizeof(T));
    prefetch_l2(static_cast<const T*>(sq.v) + at, size_t(D) * sizeof(T));
  }
}
template <int kPer, bool kQuant, bool kFold, class T>
__global__ void __launch_bounds__(kAttnWarps * kWarp) attention_kernel(const T* q, int H, AttnBatch a, float scale,
                                                                       float* partial, unsigned* counters, T* out,
                                                                       Q8Act q8o, AttnPrepArgs prep) {
  // The sequence table is written by the step's first copy node (or a synchronous upload), never
  // by a kernel: its entry is read before the wait, its two dependent loads off the step's path.
  const int lr = blockIdx.x / H, h = blockIdx.x % H, split = blockIdx.y, S = gridDim.y;
  const SeqKv sq = a.tab.seqs[a.tab.row_seq[lr]];
  if constexpr (!kQuant && !kFold) prefetch_split_kv<T>(sq, lr, h / (H / a.n_kv_heads), a, split, S);
  pdl_enter();
  __shared__ float sh_m[kAttnWarps], sh_l[kAttnWarps];
  __shared__ float sh_acc[kAttnWarps][kPer * kWarp];
  const int t = lr - sq.first, q_row = sq.row0 + t, capacity = sq.capacity, window = sq.window;
  const int pos = sq.pos0 + t, D = a.head_dim, g = h / (H / a.n_kv_heads);
  const KvQuantArgs qa = sq.quant;
  const T *const kc = static_cast<const T*>(sq.k), *const vc = static_cast<const T*>(sq.v);
  int first = window > 0 ? max(0, pos - window + 1) : 0, last_pos = pos;
  if (sq.blocks && sq.blocks[2 * t + 1] > 0) {  // the row's image block (visible_keys)
    first = min(first, sq.blocks[2 * t]);
    last_pos = max(last_pos, sq.blocks[2 * t + 1] - 1);
  }
  const int n = last_pos - first + 1, per = (n + S - 1) / S;
  const int j0 = split * per, j1 = min(n, j0 + per);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = int64_t(a.n_kv_heads) * D;
  const T* qh = q + (int64_t(q_row) * H + h) * D;
  __shared__ T s_q[kFold ? kPer * kWarp : 1], s_k[kFold ? kPer * kWarp : 1], s_v[kFold ? kPer * kWarp : 1];
  const bool own_kv = kFold && prep.k && j0 <= n - 1 && n - 1 < j1;
  if constexpr (kFold) {  // the folded attn_prep's heads into s_q, s_k, s_v
    __shared__ float s_red[32];
    const float fpos = float(pos) * prep.position_scale;
    const T* qr = static_cast<const T*>(prep.q) + (int64_t(q_row) * H + h) * D;
    const int64_t kv_row = (int64_t(q_row) * a.n_kv_heads + g) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
      s_q[i] = qr[i];
      if (own_kv) s_k[i] = static_cast<const T*>(prep.k)[kv_row + i], s_v[i] = static_cast<const T*>(prep.v)[kv_row + i];
    }
    __syncthreads();
    norm_rope_head<kAttnPrepThreads>(s_q, D, prep.q_norm_w, prep.eps, fpos, prep.inv_freq, static_cast<T*>(nullptr), s_red);
    if (own_kv) {
      const bool writer = h % (H / a.n_kv_heads) == 0;
      const int64_t at = (kv_slot(sq.table, sq.block_shift, capacity, window, pos) * a.n_kv_heads + g) * D;
      norm_rope_head<kAttnPrepThreads>(s_k, D, prep.k_norm_w, prep.eps, fpos, prep.inv_freq,
                     writer ? static_cast<T*>(sq.k) + at : static_cast<T*>(nullptr), s_red);
      norm_v_head<kAttnPrepThreads>(s_v, D, prep.v_norm, prep.eps, writer ? static_cast<T*>(sq.v) + at : static_cast<T*>(nullptr), s_red);
    }
    __syncthreads();
    qh = s_q;
  }
  auto dim = [lane](int i) { return kQuant ? lane * kPer + i : lane + kWarp * i; };
  float qv[kPer], acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = dim(i);
    qv[i] = d < D ? to_f(qh[d]) : 0.f;
    acc[i] = 0.f;
  }
  // kBatch positions per warp and iteration: their K and V rows are loaded into registers first,
  // so every load of the iteration is in flight at once (one memory latency per iteration).
  constexpr int kBatch = kPer <= 8 ? 4 : 2;
  float m = -INFINITY, l = 0.f;
  // The cache slot of visible position first + j. A ring's slots follow the positions on from
  // first's: one modulo a block instead of one a position (its dependent chain sat in every round).
  const int ring0 = window > 0 && !sq.table ? first % capacity : 0;
  auto slot_at = [&](int j) -> int64_t {
    if (window <= 0 || sq.table) return kv_slot(sq.table, sq.block_shift, capacity, window, first + j);
    const int r = ring0 + j;  // < 2 capacity where n <= capacity (the ring holds what a row sees)
    return r < capacity ? r : r - capacity < capacity ? r - capacity : r % capacity;
  };
  // This lane's values of one position's K and V rows (from the cache, or the folded row's own
  // from shared memory).
  auto load_kv = [&](const T* kr, const T* vr, float* kk, float* vv) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int d = lane + kWarp * i;
      kk[i] = d < D ? to_f(kr[d]) : 0.f;
      vv[i] = d < D ? to_f(vr[d]) : 0.f;
    }
  };
  for (int j = j0 + warp; j < j1; j += kAttnWarps * kBatch) {
    float kk[kBatch][kPer], vv[kBatch][kPer];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int jj = min(j + b * kAttnWarps, j1 - 1);  // past the end: a valid row, masked below
      const int p = first + jj;
      const int64_t slot = slot_at(jj);
      if constexpr (kQuant) {  // a quantized cache: this lane's kPer contiguous values of the row
        const int64_t hr = int64_t(slot) * a.n_kv_heads + g;
        kv_dequant_run<kPer>(qa.kq, qa.ks, qa.kb, qa, hr, D, lane * kPer, kk[b]);
        kv_dequant_run<kPer>(qa.vq, qa.vs, qa.vb, qa, hr, D, lane * kPer, vv[b]);
      } else if (kFold && own_kv && p == pos) {  // the row's own K/V, made above (whole warps)
        load_kv(s_k, s_v, kk[b], vv[b]);
      } else {
        load_kv(kc + int64_t(slot) * row + int64_t(g) * D, vc + int64_t(slot) * row + int64_t(g) * D, kk[b], vv[b]);
      }
    }
    float sc[kBatch], mn = m;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      float d = 0.f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) d += qv[i] * kk[b][i];
      sc[b] = d;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      sc[b] = j + b * kAttnWarps < j1 ? warp_sum(sc[b]) * scale : -INFINITY;
      mn = fmaxf(mn, sc[b]);
    }
    const float c = expf(m - mn);
    l *= c;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] *= c;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const float e = expf(sc[b] - mn);  // 0 for masked positions
      l += e;
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[i] += e * vv[b][i];
    }
    m = mn;
  }
  if (lane == 0) {
    sh_m[warp] = m;
    sh_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) sh_acc[warp][dim(i)] = acc[i];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sh_m[w]);
  float f[kAttnWarps], L = 0.f;
  for (int w = 0; w < kAttnWarps; ++w) {
    f[w] = sh_m[w] == -INFINITY ? 0.f : expf(sh_m[w] - M);
    L += sh_l[w] * f[w];
  }
  const int64_t rh = int64_t(q_row) * H + h;
  // Output value d of this (row, head), and its int8 form (whole warps: D % 32 == 0 with q8o).
  auto store = [&](int d, float v) {
    const T o = from_f<T>(v);
    out[rh * D + d] = o;
    if (q8o.q) q8_store_block(to_f(o), h * D + d, lane, q8_row(q8o, q_row, int64_t(H) * D));
  };
  if (S == 1) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float v = 0.f;
      for (int w = 0; w < kAttnWarps; ++w) v += sh_acc[w][d] * f[w];
      store(d, v / L);
    }
    return;
  }
  float* pp = partial + ((int64_t(blockIdx.x) * S) + split) * (D + 2);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float v = 0.f;
    for (int w = 0; w < kAttnWarps; ++w) v += sh_acc[w][d] * f[w];
    pp[d] = v;
  }
  if (threadIdx.x == 0) {
    pp[D] = M;
    pp[D + 1] = L;
  }
  // The last split block of this (row, head) to finish merges all partials (no second launch):
  // publish this block's partial, count it, and let the block that completes the count merge.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1u) == unsigned(S - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Each split's weight exp(m_s - M) / L, from the headers read in parallel (one thread each).
  const float* p0 = partial + int64_t(blockIdx.x) * S * (D + 2);
  __shared__ float sh_ms[kAttnMaxSplits], sh_ls[kAttnMaxSplits];
  if (threadIdx.x < S) {
    sh_ms[threadIdx.x] = __ldcg(p0 + threadIdx.x * (D + 2) + D);
    sh_ls[threadIdx.x] = __ldcg(p0 + threadIdx.x * (D + 2) + D + 1);
  }
  __syncthreads();
  float Mg = -INFINITY;
  for (int sp = 0; sp < S; ++sp) Mg = fmaxf(Mg, sh_ms[sp]);
  float Lg = 0.f;
  for (int sp = 0; sp < S; ++sp)
    if (sh_ms[sp] != -INFINITY) Lg += sh_ls[sp] * expf(sh_ms[sp] - Mg);
  __syncthreads();
  if (threadIdx.x < S) sh_ls[threadIdx.x] = sh_ms[threadIdx.x] == -INFINITY ? 0.f : expf(sh_ms[threadIdx.x] - Mg) / Lg;
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float v = 0.f;
#pragma unroll 8
    for (int sp = 0; sp < S; ++sp) v += __ldcg(p0 + sp * (D + 2) + d) * sh_ls[sp];
    store(d, v);
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0u;  // ready for the next launch (graph replays too)
}

// fn(kernel, tag): the attention_kernel instance for head_dim (its dims per lane rounded up to 1, 2,
// 4, 8 or 16), activation type t (tag: a value of it), a quantized cache, attn_prep folded in.
template <class Fn>
void with_attention_kernel(int head_dim, DType t, bool quant, bool fold, Fn&& fn) {
  const int per = (head_dim + kWarp - 1) / kWarp;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    auto pick = [&](auto per_lane) {
      constexpr int kPer = decltype(per_lane)::value;
      if (quant) fn(attention_kernel<kPer, true, false, T>, tag);
      else if (fold) fn(attention_kernel<kPer, false, true, T>, tag);
      else fn(attention_kernel<kPer, false, false, T>, tag);
    };
    if (per <= 1) pick(std::integral_constant<int, 1>{});
    else if (per <= 2) pick(std::integral_constant<int, 2>{});
    else if (per <= 4) pick(std::integral_constant<int, 4>{});
    else if (per <= 8) pick(std::integral_constant<int, 8>{});
    else pick(std::integral_constant<int, 16>{});  // head_dim <= 512 (spec)
  });
}

}  // namespace

int attention_resident_blocks(int head_dim, DType t, bool quant) {
  // The occupancy query once per instance (head_dim, type, quantized cache): every attention op of
  // every step asks. Ranks on threads of their own ask at once.
  static std::mutex mu;
  static std::map<std::tuple<int, DType, bool>, int> known;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(head_dim, t, quant);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int per_sm = 0;
  with_attention_kernel(head_dim, t, quant, false, [&](auto kernel, auto) {
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kAttnWarps * kWarp, 0);
  });
  return known[key] = (per_sm > 0 ? per_sm : 1) * sm_count();
}

int attention_splits(int n, int H, int max_visible, int positions, int resident) {
  if (n * H >= 128) return 1;  // enough blocks already
  const int per = positions > 0 ? positions : kAttnSplitPositions;
  int s = (max_visible + per - 1) / per;
  // No more blocks than the GPU holds at once: a second round of blocks repeats the whole chain of
  // memory round trips. 31B's sliding layers (32 heads, 16 splits, 2 blocks an SM) took 2 rounds;
  // at 8 splits its decode step ran 3.3 % faster (stop 61, H100).
  if (resident > 0) s = std::min(s, std::max(1, resident / (n * H)));
  return s < 1 ? 1 : (s > kAttnMaxSplits ? kAttnMaxSplits : s);
}

void attention(cudaStream_t s, const void* q_in, int H, const AttnBatch& a, float scale, int splits, float* partial,
               unsigned* counters, void* out_in, Q8Act q8_out, AttnPrepArgs prep) {
  if (a.rows <= 0) return;
  const bool quant = a.quant_bits > 0, fold = !quant && prep.q;
  const dim3 grid(unsigned(a.rows * H), unsigned(splits));
  with_attention_kernel(a.head_dim, a.t, quant, fold, [&](auto kernel, auto tag) {
    using T = decltype(tag);
    launch_kernel(kernel, grid, kAttnWarps * kWarp, 0, s, static_cast<const T*>(q_in), H, a, scale, partial, counters,
                  static_cast<T*>(out_in), q8_out, fold ? prep : AttnPrepArgs{});
  });
}

}  // namespace g4::cuda
