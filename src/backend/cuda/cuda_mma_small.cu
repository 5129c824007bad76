// Few-row matmuls on bf16 tensor cores (cuda_mma_small.h): y = x · wᵀ for 2 to 32 activation rows.
//
// The weights are the MMA's A operand (16 weight rows per m16n8k16 tile) and the activation rows
// its B operand (8 rows per n tile), so one pass over a weight row serves every activation row
// and a decode step of M sequences reads its weights once, as a single sequence's GEMV does.
//
// Block: 16 weight rows of one weight (or of gate and up), 8 warps splitting the reduction: warp w
// takes work items w, w + 8, ..., an item being a chunk of kChunk columns (one K-quant super-block,
// else 128 columns) of one weight. A warp copies its next items' bytes of the 16 rows into shared
// memory (cp.async, 16-byte coalesced copies, a ring of 2-4 buffers) while it decodes the current
// one from there: decoding straight from global memory reads bytes scattered over 16 rows, which the
// load units serve a sector at a time. The warps' f32 partial sums meet in shared memory, added in
// warp order (no dependence on timing), and a row's outputs depend on that row's activations only
// (the same bits in any batch of 2 to 32).
//
// Per 128-column step lane (g, t) decodes 32-value unit t of rows g and g + 8 (dequant32, rounded
// to bf16) and holds them as its A fragments: inside a step the columns are taken in a permuted
// order, the same for both operands (a dot product does not depend on it), in which the MMA's k
// positions {2t, 2t+1, 2t+8, 2t+9} of k-chunk c are the lane's physical columns 32t + 4c + {0..3}.
// Its activations for the step are then 64 contiguous bytes of each of its rows.
//
// Q4_K, Q6_K and Q8_0 units (the GGUF Q4_K_M / Q8_0 files' formats) are decoded from words, Q4_K
// in bf16 arithmetic (q4k_pairs); the other formats through dequant32's byte reads.
//
// Before waiting on the previous kernel (PDL), the block asks L2 for its 16 rows (contiguous
// bytes), so every resident block's weights are on their way at once.
#include "backend/cuda/cuda_mma_small.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_cp_async.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_dequant8.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mma_bf16.cuh"

namespace g4::cuda {
namespace {

constexpr int kRows = 16;     // weight rows per block (the MMA's m)
constexpr int kWarps = 8;     // warps per block, splitting the reduction
constexpr int kStep = 128;    // columns per MMA step (4 units a row)
constexpr int kThreads = kWarps * 32;

// Columns a warp stages at once: whole blocks of every format (a K-quant super-block, else a step).
__host__ __device__ constexpr int chunk_cols(WFormat f) {
  return f == WFormat::GgufQ4_K || f == WFormat::GgufQ5_K || f == WFormat::GgufQ6_K ? 256 : kStep;
}
template <WFormat F>
constexpr int kChunk = chunk_cols(F);

// A chunk's bytes per row (every format's bytes for kChunk columns are contiguous), and the
// shared slot one row's copy takes: the 16-byte aligned words that cover it.
inline __host__ __device__ int64_t chunk_bytes(const DevWeight& w, int chunk) { return w.row_bytes / (w.cols / chunk); }
inline __host__ __device__ int slot_bytes(int64_t cb) { return int((cb + 15) / 16 * 16 + 16); }
// Chunk buffers a warp keeps in flight (a ring): as many as fit kStageBytes a block, 2 to 4. A
// warp's next items are all on their way while it decodes one, so its run costs about one memory
// latency, not one per item (gate/up of a 2560-wide layer: 3 items a warp).
constexpr int kStageBytes = 96 * 1024;
inline __host__ __device__ int ring_stages(int slot) {
  const int s = kStageBytes / (kWarps * kRows * slot);
  return s < 2 ? 2 : s > 4 ? 4 : s;
}
// Dynamic shared memory of a launch: per warp, ring_stages chunk buffers of 16 row slots; the
// end-of-block reduction [warp][n tile · 4 accumulators · 32 lanes] f32 reuses it.
inline size_t launch_smem(int slot, int nt) {
  const size_t bufs = size_t(kWarps) * ring_stages(slot) * kRows * slot, red = size_t(kWarps) * nt * 128 * 4;
  return bufs > red ? bufs : red;
}

// Waits until at most stages - 1 of this thread's copy groups are pending (the oldest has landed).
__device__ inline void cp_async_wait_ring(int stages) {
  if (stages <= 2) cp_async_wait<1>();
  else if (stages == 3) cp_async_wait<2>();
  else cp_async_wait<3>();
}

// The block's weight row n0 + r, clamped to the matrix (rows past it are computed, never stored).
__device__ inline int64_t clamp_row(const DevWeight& w, int64_t n0, int r) {
  return n0 + r < w.rows ? n0 + r : w.rows - 1;
}

// Copies chunk c of the block's 16 rows into buf (row r at r · slot), each as the aligned 16-byte
// words covering it (w.data is 16-byte aligned; the 16 bytes of slack after every uploaded weight
// cover the last row's end).
__device__ inline void stage_chunk(const DevWeight& w, int64_t n0, int64_t c, int64_t cb, int slot, uint8_t* buf,
                                   int lane) {
  const int words = slot / 16;
  for (int e = lane; e < kRows * words; e += 32) {
    const int r = e / words, k = e % words;
    const uint8_t* src = w.data + clamp_row(w, n0, r) * w.row_bytes + c * cb;
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(src) & ~uintptr_t(15);
    if (a0 + 16 * uintptr_t(k) < reinterpret_cast<uintptr_t>(src + cb))
      cp_async16(buf + r * slot + 16 * k, reinterpret_cast<const void*>(a0 + 16 * uintptr_t(k)));
  }
}

// Byte i of v minus kBias, as an exact float, without an int-to-float conversion (Hopper issues
// conversions at an eighth of the FP32 rate, and they bounded these kernels): one PRMT makes the
// float whose bits are 0x4B0000xx, 2^23 + byte exactly, and one FADD takes 2^23 + kBias off.
template <int i, int kBias>
__device__ inline float byte_value(uint32_t v) {
  return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440 + i)) - (8388608.f + kBias);
}

// The 32 bytes at p (any alignment; shared memory with at least 3 readable bytes after them) as
// 8 little-endian words: 9 aligned word loads and funnel shifts instead of 32 byte loads.
__device__ inline void ld32_unaligned(const uint8_t* p, uint32_t* out) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
  const unsigned sh = unsigned(a & 3) * 8;
  uint32_t prev = w[0];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t next = w[i + 1];
    out[i] = __funnelshift_r(prev, next, sh);
    prev = next;
  }
}

// Q6_K unit t (0..7) of the super-block at b, dequant32's values: (d · scale) · (q - 32), q from
// 4 low bits (ql) and 2 high bits (qh), read as words.
__device__ inline void q6k_pairs(const uint8_t* b, int t, uint32_t* a) {
  const int h = t / 4, s = t % 4;
  const float d = ld_half(b + 208);
  const float d0 = d * float(int8_t(b[192 + 2 * t])), d1 = d * float(int8_t(b[192 + 2 * t + 1]));
  uint32_t ql[8], qh[8];
  ld32_unaligned(b + 64 * h + 32 * (s & 1), ql);
  ld32_unaligned(b + 128 + 32 * h, qh);
  const int lo_shift = (s >> 1) * 4, hi_shift = 2 * s;
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // values 4i .. 4i+3 (the first 16 with d0)
    const uint32_t q = ((ql[i] >> lo_shift) & 0x0F0F0F0Fu) | (((qh[i] >> hi_shift) & 0x03030303u) << 4);
    const float sc = i < 4 ? d0 : d1;
    a[2 * i] = pack_bf16(sc * byte_value<0, 32>(q), sc * byte_value<1, 32>(q));
    a[2 * i + 1] = pack_bf16(sc * byte_value<2, 32>(q), sc * byte_value<3, 32>(q));
  }
}

// Q8_0 block at b (34 bytes: f16 scale, 32 int8 quants), dequant32's values d · q.
__device__ inline void q80_pairs(const uint8_t* b, uint32_t* a) {
  const float d = ld_half(b);
  uint32_t q[8];
  ld32_unaligned(b + 2, q);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t v = q[i] ^ 0x80808080u;  // int8 b as the byte b + 128
    a[2 * i] = pack_bf16(d * byte_value<0, 128>(v), d * byte_value<1, 128>(v));
    a[2 * i + 1] = pack_bf16(d * byte_value<2, 128>(v), d * byte_value<3, 128>(v));
  }
}

// Unit u (of the row) of row r decoded from its staged copy of chunk c, rounded to bf16 pairs:
// a[i] = (v[2i], v[2i+1]).
template <WFormat F>
__device__ inline void decode_pairs(const DevWeight& w, int64_t n0, int r, int64_t c, int64_t cb, int slot,
                                    const uint8_t* buf, int64_t u, uint32_t* a) {
  const int64_t row = clamp_row(w, n0, r);
  const uint8_t* src = w.data + row * w.row_bytes + c * cb;
  if constexpr (F == WFormat::GgufQ4_K) {  // one super-block a chunk, staged at the slot's start
    q4k_pairs(buf + r * slot, int(u % 8), a);
    return;
  }
  const uint8_t* chunk = buf + r * slot + (reinterpret_cast<uintptr_t>(src) & 15);  // the staged chunk
  if constexpr (F == WFormat::GgufQ6_K) {  // one super-block a chunk
    q6k_pairs(chunk, int(u % 8), a);
    return;
  }
  if constexpr (F == WFormat::GgufQ8_0) {  // four 34-byte blocks a chunk
    q80_pairs(chunk + (u % 4) * 34, a);
    return;
  }
  // dequant32 addresses a unit from its row's start: the staged chunk stands at offset c · cb.
  const uint8_t* base = chunk - c * cb;
  float v[32];
  dequant32<F>(base, w, row, u, v);
#pragma unroll
  for (int i = 0; i < 16; ++i) a[i] = pack_bf16(v[2 * i], v[2 * i + 1]);
}

// c += A · Bᵀ over one step for the n tiles below M: the lane's A words for rows g (a0) and g + 8
// (a1), its activation row 8j + g's 32 columns at col read from global memory (L1/L2-resident:
// every block reads the same few rows).
template <int kNT>
__device__ inline void step_mma(const uint32_t* a0, const uint32_t* a1, const bf16* x, int64_t K, int64_t col,
                                int M, int g, float (*acc)[4]) {
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    if (8 * j >= M) break;
    const int m = 8 * j + g;
    uint32_t xb[16] = {};
    if (m < M) {
      const uint4* p = reinterpret_cast<const uint4*>(x + int64_t(m) * K + col);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint4 v = p[q];
        xb[4 * q] = v.x, xb[4 * q + 1] = v.y, xb[4 * q + 2] = v.z, xb[4 * q + 3] = v.w;
      }
    }
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const uint32_t af[4] = {a0[2 * c], a1[2 * c], a0[2 * c + 1], a1[2 * c + 1]};
      const uint32_t bf[2] = {xb[2 * c], xb[2 * c + 1]};
      mma_bf16(acc[j], af, bf);
    }
  }
}

// The block's sums of acc over its warps, element e (tid, tid + kThreads, ...) into out[] in
// warp order. Element e: n tile j = e / 128, accumulator h = e / 32 % 4, lane e % 32.
template <int kNT>
__device__ inline void block_reduce(const float (*acc)[4], float* red, float* out) {
  constexpr int E = kNT * 128;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // the chunk buffers (or the previous reduction) are no longer read
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int h = 0; h < 4; ++h) red[warp * E + (j * 4 + h) * 32 + lane] = acc[j][h];
  __syncthreads();
#pragma unroll
  for (int k = 0; k < (E + kThreads - 1) / kThreads; ++k) {
    const int e = threadIdx.x + k * kThreads;
    float s = 0.f;
    if (e < E)
      for (int wp = 0; wp < kWarps; ++wp) s += red[wp * E + e];
    out[k] = s;
  }
}

template <WFormat F, int kAct, int kNT>
__global__ void __launch_bounds__(kThreads, 2) small_mma_kernel(MatArgs a) {
  constexpr int kMats = kAct ? 2 : 1;
  constexpr int E = kNT * 128, kPer = (E + kThreads - 1) / kThreads;
  extern __shared__ uint4 smem_words[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_words);
  int i = 0;
  while (i + 1 < a.n && blockIdx.x >= a.first[i + 1]) ++i;
  const DevWeight& w = a.w[i];
  const int64_t n0 = int64_t(blockIdx.x - a.first[i]) * kRows;
  const int64_t nrows = w.rows - n0 < kRows ? w.rows - n0 : kRows;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) prefetch_l2(w.data + n0 * w.row_bytes, size_t(nrows * w.row_bytes));
  if (kAct && tid == 32) prefetch_l2(a.w2.data + n0 * a.w2.row_bytes, size_t(nrows * a.w2.row_bytes));
  pdl_enter_streaming();

  const int64_t K = w.cols, cb = chunk_bytes(w, kChunk<F>);
  const int slot = slot_bytes(cb);
  const int stages = ring_stages(slot);
  uint8_t* bufs = smem + size_t(warp) * stages * kRows * slot;  // [stages][16 rows][slot]
  const bf16* x = static_cast<const bf16*>(a.x);
  const int M = a.M, g = lane >> 2, t = lane & 3;
  float acc[kNT][4] = {}, acc2[kNT][4] = {};
  // Work item j: chunk j / kMats of weight j % kMats (gate and up alternate), so that the 2 x 10
  // chunks of a 2560-wide gate/up pair spread over the 8 warps as 3 / 2, not as 2 / 1 pairs.
  const int64_t items = K / kChunk<F> * kMats;
  auto is_up = [&](int64_t item) { return kAct != 0 && item % kMats != 0; };  // warp-uniform
  auto weight = [&](int64_t item) -> const DevWeight& { return is_up(item) ? a.w2 : w; };
  auto stage = [&](int64_t item, int b) {  // one copy group per item (empty past the last)
    if (item < items) stage_chunk(weight(item), n0, item / kMats, cb, slot, bufs + b * kRows * slot, lane);
    cp_async_commit();
  };
  for (int b = 0; b < stages; ++b) stage(warp + int64_t(b) * kWarps, b);
  int b = 0;
  for (int64_t item = warp; item < items; item += kWarps) {
    cp_async_wait_ring(stages);  // this lane's copies of this item have landed
    __syncwarp();                // and every lane's
    const int64_t c = item / kMats;
    const bool second = is_up(item);
    const DevWeight& wi = weight(item);
    const uint8_t* b0 = bufs + b * kRows * slot;
#pragma unroll
    for (int s = 0; s < kChunk<F> / kStep; ++s) {
      const int64_t u = (c * kChunk<F> + s * kStep) / 32 + t;
      const int64_t col = c * kChunk<F> + s * kStep + 32 * t;
      uint32_t a0[16], a1[16];
      decode_pairs<F>(wi, n0, g, c, cb, slot, b0, u, a0);
      decode_pairs<F>(wi, n0, g + 8, c, cb, slot, b0, u, a1);
      if (second) step_mma<kNT>(a0, a1, x, K, col, M, g, acc2);
      else step_mma<kNT>(a0, a1, x, K, col, M, g, acc);
    }
    __syncwarp();  // every lane is done with buffer b before it is refilled
    stage(item + int64_t(stages) * kWarps, b);
    b = b + 1 == stages ? 0 : b + 1;
  }

  float* red = reinterpret_cast<float*>(smem);
  float sum[kPer], up[kPer];
  block_reduce<kNT>(acc, red, sum);
  if constexpr (kAct != 0) block_reduce<kNT>(acc2, red, up);
  void* y = a.y[i];
  const bool y_f32 = a.yt == DType::F32;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int e = tid + k * kThreads;
    const int j = e / 128, h = (e / 32) % 4, l = e % 32;
    const int64_t n = n0 + (l >> 2) + (h >= 2 ? 8 : 0);
    const int m = 8 * j + 2 * (l & 3) + (h & 1);
    if (e >= E || m >= M || n >= w.rows) continue;
    float v = sum[k];
    if constexpr (kAct == 1) v = gelu_tanh_mul(v, up[k]);
    if constexpr (kAct == 2) v = gelu_ggml_mul(v, up[k], a.table);
    store_out(y, int64_t(m) * w.rows + n, v, y_f32);
  }
}

// The most dynamic shared memory a launch asks for: the ring's budget (or two BF16 / F16 chunks of
// 256 bytes a row, below it), more than the largest reduction.
constexpr size_t kMaxSmem = kStageBytes;

template <WFormat F, int kAct, int kNT>
void launch_nt(cudaStream_t s, const MatArgs& a, unsigned blocks, size_t smem) {
  static const bool sized = [] {  // past 48 KiB a kernel must ask for its dynamic shared memory
    return cudaFuncSetAttribute(small_mma_kernel<F, kAct, kNT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(kMaxSmem)) == cudaSuccess;
  }();
  (void)sized;  // a refusal shows as the launch's error (G4_CUDA_LAUNCHED)
  launch_kernel(small_mma_kernel<F, kAct, kNT>, blocks, kThreads, smem, s, a);
}

template <WFormat F, int kAct>
void launch_fmt(cudaStream_t s, MatArgs a, int M) {
  if constexpr (F == WFormat::F32) {
    return;  // not taken (small_mma_applies)
  } else {
    unsigned blocks = 0;
    int slot = 0;
    for (int i = 0; i < a.n; ++i) {
      a.first[i] = blocks;
      blocks += unsigned((a.w[i].rows + kRows - 1) / kRows);
      const int si = slot_bytes(chunk_bytes(a.w[i], kChunk<F>));
      slot = si > slot ? si : slot;
    }
    a.first[a.n] = blocks;
    a.M = M;
    const int tiles = (M + 7) / 8, nt = tiles <= 1 ? 1 : tiles <= 2 ? 2 : 4;
    const size_t smem = launch_smem(slot, nt);
    if (nt == 1) launch_nt<F, kAct, 1>(s, a, blocks, smem);
    else if (nt == 2) launch_nt<F, kAct, 2>(s, a, blocks, smem);
    else launch_nt<F, kAct, 4>(s, a, blocks, smem);
  }
}

template <int kAct>
void launch_any(cudaStream_t s, const MatArgs& a, int M) {
  with_format(a.w[0].fmt, [&](auto f) { launch_fmt<decltype(f)::value, kAct>(s, a, M); });
}

}  // namespace

bool small_mma_applies(const MatArgs& a, int M) {
  if (a.norm_w || a.resid || a.pre_y || a.defer_post || a.n < 1 || a.n > 3 ||
      reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<uintptr_t>(a.w2.data) % 16 != 0)
    return false;
  for (int i = 0; i < a.n; ++i) {
    const DevWeight& w = a.w[i];
    const int chunk = chunk_cols(w.fmt);
    if (!small_mma_rows(a.xt, M, w.cols) || w.fmt == WFormat::F32 || w.cols % chunk != 0 ||
        reinterpret_cast<uintptr_t>(w.data) % 16 != 0 || w.row_bytes % (w.cols / chunk) != 0 ||
        slot_bytes(chunk_bytes(w, chunk)) > 256 + 16)
      return false;
  }
  return true;
}

void small_mma(cudaStream_t s, const MatArgs& a, int M, int act) {
  if (act == 1) launch_any<1>(s, a, M);
  else if (act == 2) launch_any<2>(s, a, M);
  else launch_any<0>(s, a, M);
}

}  // namespace g4::cuda
