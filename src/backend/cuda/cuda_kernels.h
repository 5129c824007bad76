// Launchers of the CUDA backend's kernels (cuda_kernels.cu). Every pointer is device memory and
// every shape is as in backend/backend.h; each launch goes to the given stream, in order.
// Activation buffers are `void*` of storage type `t` (DType F32 or BF16, cuda_act.cuh): kernels
// read them into f32, accumulate in f32 and round once on store. Norm weights, RoPE tables, the
// attention partials, router weights and logits (argmax, top_k) are always f32.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_attention_splits.h"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kv_quant.cuh"
#include "backend/cuda/cuda_q8.cuh"

namespace g4::cuda {

// A per-step scalar (a position): kernels read *ptr when it is set (a recorded step, whose graph
// replays with new values, cuda_step.h), else value.
struct Dyn {
  const int32_t* ptr;
  int value;
  int reserved = 0;
};
#ifdef __CUDACC__
__device__ inline int load(const Dyn& d) { return d.ptr ? *d.ptr : d.value; }
#endif

// One sequence's attention arguments for the prefill kernel (cuda_flash_attention.h; AttnSeq with
// device K/V pointers; quant.bits > 0: k and v are null and the rows are read from quant's codes).
struct AttnArgs {
  Dyn pos0;
  const void* k;  // [capacity, n_kv_heads, head_dim] of the activation type
  const void* v;
  KvQuantArgs quant;
  const int32_t* blocks = nullptr;  // device [n, 2] image blocks (backend.h AttnSeq::blocks), or null
  const int32_t* table = nullptr;   // paged cache: its block table (backend.h KvBuffer), or null
  int row0, n;
  int capacity, n_kv_heads, head_dim, window;
  int block_shift;       // paged: log2 of the positions per block
  DType t = DType::F32;  // q, k, v and out storage
  uint8_t reserved[3] = {};
};

#ifdef __CUDACC__
// The cache slot of position p (backend.h kv_slot): through the block table of a paged cache,
// else the ring slot of a sliding layer or the position itself.
__device__ inline int64_t kv_slot(const int32_t* table, int block_shift, int capacity, int window, int p) {
  if (table) return (int64_t(table[p >> block_shift]) << block_shift) | int64_t(p & ((1 << block_shift) - 1));
  return window > 0 ? p % capacity : p;
}
#endif

// One sequence of a batched attention or attn_prep launch. A launch's sequences sit in a device
// table staged with the step (SeqTable), so a recorded step replays with other sequences, caches
// and positions: only the launch's row count and the layer's shapes are part of its key.
struct SeqKv {
  int row0;      // the sequence's first row in q / k / v / out
  int first;     // its first row among the launch's rows
  int pos0;      // the position of its first row
  int capacity;  // cache slots (a ring when window > 0)
  int window;    // 0: full attention
  int block_shift;  // paged: log2 of the positions per block
  void* k;       // cache rows [capacity, n_kv_heads, head_dim] of the activation type (unquantized)
  void* v;
  KvQuantArgs quant;      // a quantized cache (quant.bits > 0): its codes, scales and biases
  const int32_t* blocks;  // device [n, 2] image blocks (backend.h AttnSeq::blocks), or null
  const int32_t* table;   // paged cache: its block table (backend.h KvBuffer), or null
};
// A launch's sequences in device memory: seqs[n_seqs], and row_seq[rows] (launch row -> sequence).
struct SeqTable {
  const SeqKv* seqs;
  const int32_t* row_seq;
};
// A batched decode attention launch: `rows` query rows of the table's sequences, all of one layer
// (n_kv_heads, head_dim; quant_bits: their caches' bits, 0 unquantized; t: q, k, v, out).
struct AttnBatch {
  SeqTable tab;
  int rows, n_kv_heads, head_dim, quant_bits;
  DType t;
  uint8_t reserved[7] = {};
};

// The activation a matmul applies: kGelu / kGeluGgml with a second weight w2 (MatArgs),
// gelu(x·wᵀ) * (x·w2ᵀ), tanh form or ggml's table.
enum Act { kPlain = 0, kGelu = 1, kGeluGgml = 2 };
// fn(std::integral_constant<int, act>{}): a kernel template's instance for a run-time Act.
template <class Fn>
void with_act(int act, Fn&& fn) {
  if (act == kGelu) fn(std::integral_constant<int, kGelu>{});
  else if (act == kGeluGgml) fn(std::integral_constant<int, kGeluGgml>{});
  else fn(std::integral_constant<int, kPlain>{});
}

// A matmul launch's arguments: y[i][M, w[i].rows] = xn · w[i]ᵀ for i < n (1..3 weights of one
// format and width), xn = x, or x RMS-normalized with norm_w when that is set. M, first: set by
// the launchers. x (and resid) of type xt; the y of type yt (xt, or F32 for the logits).
// (Fields grouped by size, so that the struct has no padding: its bytes are part of a step's key.)
struct MatArgs {
  const void* x;
  DevWeight w[3];
  void* y[3];
  DevWeight w2;            // gate_up_gelu: the up weight (same format and shape as w[0])
  const uint16_t* table;   // gate_up_gelu: ggml's gelu table, or null for MLX's tanh form
  const float* norm_w;     // null: x is used as is
  // matmul_norm_add: resid[M, w[0].rows] += rms_norm(y[0])·post_w once every block is done (the
  // last block to finish does it; counter: a zero that the kernel leaves zero). null: no epilogue.
  void* resid;
  const float* post_w;
  unsigned* counter;
  // Non-null: formats the int8 GEMVs take (q8_gemv_supports) are dotted with the activation
  // rows quantized into this scratch (cuda_q8.cuh, cuda_gemv_q8.cu); null: in f32. The backend
  // sets it at M = 1, and for the rows of a row-exact launch (BackendOptions::row_exact).
  Q8Act q8;
  // int8 GEMVs only (q8_post_deferrable). defer_post: with resid, leave the post-norm and residual
  // add out of this launch (the backend hands it to the next prepare, or launches it alone:
  // post_norm_add). pre_y: before this launch's input row is prepared, x = (x + rms_norm(pre_y)·pre_w)
  // · pre_scale over the row's pre_n values (a previous launch's deferred epilogue and the layer
  // scalar after it; x is that launch's resid), each step rounded as post_norm_add and scale
  // round it, in the same one-block kernel that then norms and quantizes x.
  const void* pre_y = nullptr;
  const float* pre_w = nullptr;
  unsigned first[4];
  int M;
  int n;
  // Set by the launch: warps that share one output row (K-quant rows at M = 1 split their
  // super-blocks among them; 1 elsewhere).
  int split = 1;
  int defer_post = 0;
  float eps;
  float post_eps;
  float pre_eps = 0.f;
  float pre_scale = 1.f;
  // int8 GEMVs only: a.q8 already holds x's int8 form (the decode attention wrote it, or the
  // launch before prepared the same rows: CudaBackend::take_prepared, norm_matmuls), so no
  // prepare launch.
  int prepared = 0;
  DType xt;
  DType yt;
  // int8 GEMVs of 2 or more prepared rows (a row-exact verify forward) in K-quant formats: on the
  // tensor cores (cuda_gemv_mma.h: kMmaByRule, kMmaWherePossible), the same bits as the dp4a GEMV.
  // 0: the dp4a GEMV.
  uint8_t mma_rows = 0;
  // int8 GEMVs: how the launch's blocks fetch their weight rows before the PDL wait (RowFetch
  // bits; CudaBackend::plan_row_fetch). kFetchL2: ask L2 for them, set where the weights fit the
  // L2 less those of the matmul launched before, which still streams while this launch's blocks
  // become resident; past that the early prefetch evicts rows of both launches before they are
  // read, and DRAM reads them twice (31B Q4_K_M: a decode step 4.8 % slower prefetching every
  // launch; docs/cuda-notes.md, stop 54). kFetchShared: a one-row GEMV copies each block's rows
  // into shared memory (cuda_stage_rows.cuh) where they fit kStageMaxBytes, then reads them there.
  // kFetchAhead: a one-row GEMV reading global memory has each lane fetch its next unit before
  // it dots the current one (q8_gemv_kernel's kAhead).
  uint8_t row_fetch = 0;
  // int8 GEMVs: the lanes that share a weight row, from the plan chosen when the weights were placed
  // (cuda_weight_plans.h); 0: gemv_row_lanes' rule at the launch. Either gives the same count.
  uint8_t lanes = 0;
  uint8_t reserved[7] = {};
};
enum RowFetch : uint8_t { kFetchL2 = 1, kFetchShared = 2, kFetchAhead = 4 };
// The weight bytes a launch of a reads: its a.n weights and (gate_up_gelu) w2.
inline int64_t weight_bytes(const MatArgs& a) {
  int64_t bytes = a.w2.rows * a.w2.row_bytes;
  for (int i = 0; i < a.n; ++i) bytes += a.w[i].rows * a.w[i].row_bytes;
  return bytes;
}
// Splits a's weights into blocks of `rows_per_block` rows each: a.first[i] = weight i's first block,
// a.first[a.n] = the launch's block count, which is returned.
inline unsigned assign_row_blocks(MatArgs& a, int64_t rows_per_block) {
  unsigned blocks = 0;
  for (int i = 0; i < a.n; ++i) {
    a.first[i] = blocks;
    blocks += unsigned((a.w[i].rows + rows_per_block - 1) / rows_per_block);
  }
  a.first[a.n] = blocks;
  return blocks;
}
// Whether a one-row matmul_norm_add into w runs on the int8 GEMVs with the separate post-norm
// kernel (q8 scratch set), so that its epilogue may be deferred (MatArgs::defer_post).
bool q8_post_deferrable(const DevWeight& w);
// Whether a one-row launch of a (gelu: gate_up_gelu; else matmuls) runs on the int8 GEMVs with
// its input row prepared by one block, so that a deferred epilogue may be fused into it (pre_y).
bool q8_prepare_fusable(const MatArgs& a, bool gelu);
// resid[r][n] += rms_norm(y[r][n])·w for r < rows: a deferred epilogue launched on its own (one
// block per row; a row's bits do not depend on rows).
void post_norm_add(cudaStream_t s, const void* y, void* resid, DType t, int n, const float* w, float eps, int rows);
// Whether the int8 decode GEMV takes weight w (format, bits, group, alignment, width).
bool q8_gemv_supports(const DevWeight& w);
// The shared memory a normed input of M rows (at most 8 per launch) takes; launches whose norm
// does not fit 48 KiB must norm separately.
size_t matmul_norm_smem(int M, int64_t cols);
// y[i] = norm(x) · w[i]ᵀ for a.n weights of one format and width, one launch (the kernel walks x
// in chunks of 8 rows); with a.resid, then the post-norm and residual add of y[0] (a.n == 1, and
// at most kEpilogueMaxRows rows: the last block finishes them one after another).
constexpr int kEpilogueMaxRows = 8;
void matmuls(cudaStream_t s, MatArgs a, int M);
// a.y[0][M, w[0].rows] = gelu(xn·w[0]ᵀ) * (xn·w2ᵀ) in one launch (gelu through a.table when set,
// else MLX's tanh form), xn = norm(x) as in matmuls.
void gate_up_gelu(cudaStream_t s, MatArgs a, int M);
// The device's SM count (the current device's, read once).
int sm_count();
// The tensor-core path (cuda_tc_matmul.cu) that matmuls / gate_up_gelu take for
// M >= kTcMinRows activation rows (prefill): the same products at f32 accuracy (3xTF32), without
// the resid epilogue (callers split prefill's post-norm off). act: 0 plain, 1 gelu (MLX), 2 gelu
// (ggml table). set_tensor_cores(false) (BackendOptions::tensor_cores, `--tensor-cores off`) turns
// it off for comparisons; the setting is process-wide.
constexpr int kTcMinRows = 32;
bool tc_matmul_applies(const MatArgs& a, int M);
void tc_matmul(cudaStream_t s, const MatArgs& a, int M, int act);
bool tc_matmul_disabled();
void set_tensor_cores(bool on);
void embed(cudaStream_t s, const DevWeight& e, const int32_t* ids, int n, float scale, void* out, DType t);
void rms_norm(cudaStream_t s, const void* x, int rows, int dim, const float* w, float eps, void* y, DType t);
// x[rows, dim] += rms_norm(o)·w.
void norm_add(cudaStream_t s, void* x, const void* o, int rows, int dim, const float* w, float eps, DType t);
// x[rows, dim] = (x + rms_norm(o)·w)·scale, then xn = rms_norm(x)·w2 (w2 null: unweighted): norm_add,
// scale and rms_norm in one launch, each rounded as alone.
void norm_add_norm(cudaStream_t s, void* x, const void* o, int rows, int dim, const float* w, float eps, float scale,
                   const float* w2, float eps2, void* xn, DType t);
// Backend::moe_norms in one launch: h1 = rms_norm(f)·w_f, xr = rms_norm(x)·w_r, xn = rms_norm(x)·w_x,
// each rounded as rms_norm alone.
void moe_norms(cudaStream_t s, const void* f, const void* x, int rows, int dim, const float* w_f, const float* w_r,
               const float* w_x, float eps, void* h1, void* xr, void* xn, DType t);
// Backend::moe_exit in one launch: x = (x + rms_norm(h1 + rms_norm(h2)·w2)·w)·scale, each step
// rounded as rms_norm, add, norm_add and scale alone. With c.y, h2 is first the combination of
// the routed experts' outputs as moe_combine makes it (c.y [rows, c.k, dim], c.w [rows, c.k]),
// not read (nor written).
struct MoeCombine {
  const void* y = nullptr;
  const float* w = nullptr;
  int k = 0;
  int reserved = 0;  // keeps the struct free of padding (its bytes are part of a step's key)
};
void moe_exit(cudaStream_t s, void* x, const void* h1, const void* h2, const MoeCombine& c, int rows, int dim,
              const float* w2, const float* w, float eps, float scale, DType t);
// Per-head rms_norm (weight w) then rope of rows at positions pos0.. (one sequence).
void norm_rope(cudaStream_t s, void* x, int rows, int heads, int head_dim, const float* w, float eps, Dyn pos0,
               const float* inv_freq, float position_scale, DType t);
// A batch's attention inputs (Backend::attn_prep), one launch: q [rows, H, D] normed (q_norm_w, or
// none) and roped in place; k [rows, Hk, D] likewise, then k and v (normed when v_norm) written
// into the cache slot of each row's position (the table's caches, rings among them; quantized
// into the sequence's quant rows when quant.bits > 0). Rows are the table's launch rows. Hk == 0:
// q only.
struct AttnPrepArgs {
  void *q, *k, *v;  // of type t, as the cache rows
  const float* q_norm_w;
  const float* k_norm_w;
  const float* inv_freq;
  SeqTable tab;
  int H, Hk, head_dim;
  float eps;
  float position_scale;
  bool v_norm;
  DType t;
  uint8_t reserved[2] = {};
};
void attn_prep(cudaStream_t s, const AttnPrepArgs& a, int rows);
void rope(cudaStream_t s, void* x, int rows, int heads, int head_dim, Dyn pos0, const float* inv_freq,
          float position_scale, DType t);
// k/v rows row0..row0+n-1 [Hk * head_dim each] into the cache slots of positions pos0.. (kc/vc,
// or quantized into quant's rows when quant.bits > 0).
// table / block_shift: a paged cache's block table (null: not paged).
void kv_write(cudaStream_t s, const void* k, const void* v, int row0, int n, Dyn pos0, int n_kv_heads, int head_dim,
              int capacity, int window, const int32_t* table, int block_shift, void* kc, void* vc,
              const KvQuantArgs& quant, DType t);
// Attention of a.rows query rows of a.tab's sequences in one launch (flash-decoding: online
// softmax, no score matrix). The visible positions of each (row, head) are cut into `splits`
// ranges run by separate blocks; with splits > 1, `partial` holds a.rows * H * splits *
// (head_dim + 2) floats and `counters` a.rows * H zeros (the kernel leaves them zero again).
// Prefill-sized sequences go to flash_attention (cuda_flash_attention.h) instead. q8_out set
// (head_dim % 32 == 0, bf16 activations): out's rows [.., H * head_dim] are also written in int8
// form (cuda_q8.cuh) for the matmul that reads them (MatArgs::prepared). prep.q set: attn_prep
// folded in (q, k, v as attn_prep takes them, before their norms and RoPE; one row per sequence
// whose own position is the last it sees, unquantized caches): the kernel does attn_prep's work for
// its rows with attn_prep's bits, except that q, k and v stay as they were (the cache gets the
// normed K/V); all-zero: q is ready.
void attention(cudaStream_t s, const void* q, int H, const AttnBatch& a, float scale, int splits, float* partial,
               unsigned* counters, void* out, Q8Act q8_out, AttnPrepArgs prep);
// The split count attention() takes: attention_splits (cuda_attention_splits.h).
// Blocks of attention()'s kernel for head_dim, activation type t and a quantized cache (or not)
// that the current device holds at once: resident blocks an SM times its SMs.
int attention_resident_blocks(int head_dim, DType t, bool quant);
// out[r] = first index of the largest non-NaN value of row r of x [rows, n] (0 for an all-NaN row).
// slots / counters: rows zeros each (the kernel leaves them zero).
void argmax(cudaStream_t s, const float* x, int rows, int n, unsigned long long* slots, unsigned* counters,
            int32_t* out);
// Backend::top_k (cuda_top_k.cu): per row of x [rows, n], the k (<= 1024, <= n) largest values
// (ties: lowest indices) into vals / idx [rows, k], unordered, and lse [rows]. scratch: device
// memory of top_k_scratch_bytes(rows, n, k) bytes (none when that is 0), overwritten.
size_t top_k_scratch_bytes(int rows, int n, int k);
void top_k(cudaStream_t s, const float* x, int rows, int n, int k, float* vals, int32_t* idx, float* lse,
           void* scratch);
// Backend::draw_top (k <= 256): out[r] = sampling/top_draw.h's draw_top of row r's candidates.
void draw_top(cudaStream_t s, const float* vals, const int32_t* idx, const float* lse, int rows, int k,
              const float* fparams, const int32_t* iparams, int32_t* out);
// dst[0, n) = src[0, n) on the device (no overlap), as a kernel: a recorded step's graph then holds
// no memcpy node, whose memory the driver keeps a reference to (a graph replayed after its copy's
// buffer was freed and another allocated at the same address faulted in cuGraphLaunch).
void copy_bytes(cudaStream_t s, const void* src, size_t n, void* dst);
void gelu_mul(cudaStream_t s, const void* gate, const void* up, size_t n, void* out, DType t);
void gelu_mul_ggml(cudaStream_t s, const void* gate, const void* up, size_t n, const uint16_t* table, void* out,
                   DType t);
// gelu_mul (table null) or gelu_mul_ggml over n = rows x cols values (cols % 32 == 0), also writing
// the output's int8 form into o for the int8 GEMV after it (its prepare launch skipped): the bits
// of the elementwise launch and q8_prepare (no norm) one after the other.
void gelu_mul_q8(cudaStream_t s, const void* gate, const void* up, size_t n, const uint16_t* table, void* out, DType t,
                 int cols, Q8Act o);
void add(cudaStream_t s, const void* a, const void* b, size_t n, void* y, DType t);
void scale(cudaStream_t s, const void* a, float f, size_t n, void* y, DType t);
void softcap(cudaStream_t s, void* x, size_t n, float cap, DType t);
void gather_rows(cudaStream_t s, const void* src, const int32_t* idx, int n, int dim, void* dst, DType t);
// MoE combine: out[r, :] = sum over j < k of w[r*k + j] * y[r*k + j, :], in j order (the
// reference's sum). y [rows*k, d], w [rows*k], out [rows, d].
void moe_combine(cudaStream_t s, const void* y, const float* w, int rows, int k, int d, void* out, DType t);
void copy_cols(cudaStream_t s, const void* src, int rows, int src_dim, int off, int n, void* dst, DType t);

}  // namespace g4::cuda
