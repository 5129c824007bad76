// The op set the model runs on, and the contract every backend (reference, fast CPU, ggml, CUDA)
// implements. Model code (src/model) only calls these ops on buffers the backend allocated; it never
// reads activation memory itself, so a device backend can keep everything on the device.
//
// Buffers are typed (buffer.h: Buf carries dtype, extent and device). Activations are row-major;
// "rows" are token positions of the batch; shapes are stated per op, sizes are element counts.
// Each backend stores activations in its activation_dtype(): f32 on the host backends, bf16 by
// default on CUDA (BackendOptions), where kernels read and write bf16 and accumulate in f32. Every
// op also takes the precision P, a host parity mode: with P == BF16 a host backend rounds each op's
// output to bf16 the way MLX does when a model runs in bf16 (each intermediate of a composed op
// rounded as MLX does); with P == F32 nothing is rounded. Device backends compute in their buffers'
// dtype and ignore P. Logits (the LM head's output) are f32 on every backend.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "backend/buffer.h"
#include "core/dtype.h"
#include "core/config.h"
#include "quant/expert_stack.h"
#include "quant/weight.h"

namespace g4 {

class Communicator;  // parallel/communicator.h

// Rotary frequencies of one layer kind: inv_freq[j] for pair j in [0, head_dim/2); pairs with
// inv_freq 0 do not rotate. position_scale multiplies positions (linear RoPE scaling: 1/factor).
struct RopeTable {
  std::vector<float> inv_freq;
  float position_scale = 1.f;
  RopeSpec spec;  // what the table was made from (backends that compute angles their own way)
};
// MLX-compatible frequency table for a layer (default, proportional or linear RoPE).
RopeTable make_rope_table(const RopeSpec& spec, int head_dim);

// One layer's K/V storage for one sequence: [slots, n_kv_heads, head_dim] for K and V (backend
// memory), plus the absolute position held by each slot (-1 = empty; HOST memory on every
// backend, owned by the KV cache: the runtime reads it, kv_write records positions in it). Where
// position p sits is kv_slot(): full layers: slot = position (capacity grows in the runtime's
// reserve step, never in decode). Sliding layers: a ring with capacity >= window + max_chunk - 1,
// slot = position % capacity, so memory is bounded by the window.
// Paged (block > 0; model/kv_pool.h): k, v and pos are one layer's arrays of a pool shared by
// every sequence ([pool_slots, ...]); position p sits in slot table[p / block] * block + p % block
// (table: this sequence's logical block -> pool block, in backend memory; table_host: the same
// on the host), for full and sliding layers alike. capacity is then the positions the table
// covers (a bound for launch shapes, not storage).
//
// Quantized KV (quant.bits > 0; backends with supports_kv_quant()): k and v are null and each
// slot's K and V rows are MLX affine codes instead (quant/affine_quantize.h, along head_dim):
// kq / vq [capacity, n_kv_heads, head_dim * bits / 8] bytes, ks / kb / vs / vb [capacity,
// n_kv_heads, head_dim / group_size] f32 scales and biases. k_view()/v_view() read them as
// MlxAffine matrices of capacity * n_kv_heads rows (row = slot * n_kv_heads + head).
struct KvQuant {
  int bits = 0;              // 0: f32 rows; else 2..8 (affine_quant_supported)
  int group_size = 64;       // divides head_dim
  bool bf16_params = false;  // scales and biases rounded to bf16 (MLX keeps the activations' dtype)
};
struct KvBuffer {
  Buf k, v;  // [capacity, n_kv_heads, head_dim] in the backend's activation dtype (unquantized)
  int32_t* pos = nullptr;
  int capacity = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int window = 0;  // 0: full attention
  KvQuant quant;
  uint8_t* kq = nullptr;
  uint8_t* vq = nullptr;
  float *ks = nullptr, *kb = nullptr, *vs = nullptr, *vb = nullptr;
  const int32_t* table = nullptr;       // paged: logical block -> pool block (backend memory)
  const int32_t* table_host = nullptr;  // paged: the same table in host memory
  int block = 0;                        // paged: positions per block (a power of two); 0: not paged
  int pool_slots = 0;                   // paged: slots of the pool's arrays

  bool quantized() const { return quant.bits > 0; }
  bool paged() const { return block > 0; }
  // Slots k / v / pos hold (the bound of every slot index).
  int64_t stored_slots() const { return paged() ? pool_slots : capacity; }
  size_t row_floats() const { return size_t(n_kv_heads) * size_t(head_dim); }
  // Quantized: bytes of codes / number of scales per slot.
  size_t row_code_bytes() const { return row_floats() * size_t(quant.bits) / 8; }
  size_t row_groups() const { return row_floats() / size_t(quant.group_size); }
  WeightView k_view() const { return quant_view(kq, ks, kb); }
  WeightView v_view() const { return quant_view(vq, vs, vb); }

 private:
  WeightView quant_view(const uint8_t* codes, const float* s, const float* b) const {
    return mlx_affine_view(codes, int64_t(capacity) * n_kv_heads, head_dim, quant.bits,
                           quant.group_size, s, b, DType::F32);
  }
};

// The slot holding position p (p within what the cache holds; paged: a mapped block).
inline int64_t kv_slot(const KvBuffer& kv, int p) {
  if (kv.paged()) return int64_t(kv.table_host[p / kv.block]) * kv.block + p % kv.block;
  return kv.window > 0 ? p % kv.capacity : p;
}

// One sequence's slice of a batched attention call.
struct AttnSeq {
  int row0 = 0;       // first row of this sequence in the batch's q/out buffers
  int n = 0;          // number of new tokens (rows)
  int pos0 = 0;       // absolute position of the first new token
  KvBuffer kv;        // cache holding every key this sequence may attend to (new ones included)
  // Bidirectional image blocks (Gemma 4 12B/26B/31B, use_bidirectional_attention = "vision"):
  // host [n, 2], for each new row the absolute positions [lo, hi) of the image block holding it
  // (hi == 0: none), or null. A row also sees every key of its block (all of them are among this
  // call's rows: callers never split a block across calls). Backends with
  // supports_image_blocks() only.
  const int32_t* blocks = nullptr;
};

// The keys row t of s attends to: positions lo..hi (inclusive). Causal, within the window for a
// sliding layer; widened to the row's image block (a contiguous union, as the block holds the row).
struct KeyRange {
  int lo, hi;
};
inline KeyRange visible_keys(const AttnSeq& s, int t) {
  const int pos = s.pos0 + t;
  KeyRange r{s.kv.window > 0 ? (pos - s.kv.window + 1 > 0 ? pos - s.kv.window + 1 : 0) : 0, pos};
  if (s.blocks && s.blocks[2 * t + 1] > 0) {
    if (s.blocks[2 * t] < r.lo) r.lo = s.blocks[2 * t];
    if (s.blocks[2 * t + 1] - 1 > r.hi) r.hi = s.blocks[2 * t + 1] - 1;
  }
  return r;
}

// An RMSNorm applied to an op's input first: x / sqrt(mean(x²) + eps) · w (w == nullptr: no norm).
// scratch [M, cols]: where a backend that materializes the normed input puts it (contents
// afterwards unspecified).
struct InputNorm {
  const float* w = nullptr;
  float eps = 0.f;
  Buf scratch;
};
// One adapted module's LoRA delta (model/lora.h): delta(x) = scale * (x · Aᵀ) · Bᵀ.
struct LoraDelta {
  WeightView a;  // F32 [r, in] = lora_aᵀ (backend weight)
  WeightView b;  // F32 [out, r] = lora_bᵀ
  float scale = 1.f;
  // Training only (Model::set_lora_dropout): the probability an input element is dropped, and the
  // module's number in its adapter, which its dropout masks are drawn from. 0 at inference.
  float dropout = 0.f;
  uint32_t id = 0;
};
// The rows of a forward that one adapter's delta applies to.
struct LoraRun {
  int row0 = 0, rows = 0;
  const LoraDelta* delta = nullptr;
};
// LoRA wrapping one module's matmul in a forward: y += each run's delta of x on its rows
// (Backend::add_lora), with the scratch the delta's products use: t [rows, rank], z [rows, out],
// and xd [rows, in] for training's dropout (dropout_seed != 0: Backend::dropout with the seed
// mixed with the module's id).
struct LoraApply {
  std::vector<LoraRun> runs;
  Buf t, z, xd;
  uint64_t dropout_seed = 0;
};
// How an op combines the weights of a placed stack (Backend::place_stack): each part into its own
// output (norm_matmuls over a layer's q, k, v), or the first part's product gating the second's
// (gate_up_gelu over gate, up).
enum class StackUse { Outputs, Gated };
// One projection of a shared input: y = input · Wᵀ (+ the adapters' deltas when lora is set).
struct MatOut {
  const WeightView* w;
  Buf y;
  const LoraApply* lora = nullptr;
};

// How a backend runs: the tuning and measuring switches the CLI passes (run, generate, serve,
// bench and the checking verbs), instead of environment variables read in constructors.
struct BackendOptions {
  // Activation storage on device backends: F32 (the default for now) or BF16 (`--dtype bf16`;
  // f32 accumulation in every kernel; with int8_dots the fast decode mode, 1.7x f32's E4B decode on
  // the H200). bf16 becomes the default once its accuracy contract has been checked on the
  // fixtures with the int8 dots (docs/cuda-notes.md). Host backends always store f32 (their bf16
  // is the rounding mode P).
  DType activations = DType::F32;
  bool graphs = true;        // CUDA: record each forward step and replay it as a CUDA graph
  bool tensor_cores = true;  // CUDA: prefill matmuls on the tensor cores
  // CUDA with bf16 activations and tensor_cores: prefill matmuls (>= 64 rows) on cuBLAS's bf16 GEMMs
  // over weights dequantized to bf16 (cuda_blas.h); off, or without cuBLAS: the 3xTF32 kernels.
  bool blas = true;
  // CUDA with cuBLAS: GiB of bf16 copies of the weights the cuBLAS launches read, made at a
  // weight's first such launch and kept, in place of dequantizing it at every launch (faster
  // prefill, and decode of 16+ streams on cuBLAS, for 4x a quantized weight's memory). 0: none.
  int bf16_weight_cache_gib = 0;
  // CUDA with cuBLAS: the fewest rows a launch whose weights all have bf16 copies (or are bf16)
  // runs on cuBLAS rather than the few-row kernel (cuda_mma_small.h). 0: kBlasCachedMinRows.
  int blas_cached_min_rows = 0;
  // CUDA: the fewest cache positions one block of a decode attention launch takes (the split of a
  // row's positions over blocks, merged by the last; cuda::attention_splits). 0: the built-in 64.
  // More where heads x splits would not fit one round of the GPU's resident blocks.
  // Row-exact launches always split kAttnMaxSplits ways.
  int attn_split_positions = 0;
  // CUDA with bf16 activations: decode matmuls (one row) dot the activation row quantized to int8
  // blocks of 32 (llama.cpp's q8_1 form, dp4a) instead of in f32. The f32 path never does.
  bool int8_dots = true;
  // CUDA: kernels launched with programmatic dependent launch (cuda_launch.cuh): each may be
  // scheduled while the one before it finishes, hiding the launch gap between a step's kernels.
  bool pdl = true;
  // CUDA with int8_dots: launches of one decode step share their int8 activation rows (the
  // output projection reads the rows the attention launch wrote, cuda_pending.h PendingAttention;
  // the per-layer input's projection those its gelu_mul wrote, PendingGeluMul; a q/k/v launch of
  // a second format reuses the first one's prepared rows) instead of each
  // preparing its own. Off: every matmul prepares its rows (`--cuda-fuse off`, for timing).
  bool fuse_decode_ops = true;
  // CUDA: a decode step's attn_prep (q/k norms, RoPE, the KV-cache write) is done by the attention
  // launch after it (one row per sequence, unquantized caches), the same bits, one launch fewer
  // per layer. Off by default until a lease measures it (`--cuda-fold-prep on`; docs/cuda-notes.md,
  // stop 49).
  bool fold_attn_prep = false;
  // CUDA with row_exact: the int8 GEMVs of 5 or more rows (a speculative verify forward of 1 + 4
  // or more tokens) into Q4_K / Q5_K / Q6_K weights, and of 4 rows into large Q4_K / Q5_K weights,
  // run on the int8 tensor cores (cuda_gemv_mma.h's rule) with the one-row bits; off: the dp4a
  // GEMV (`--cuda-int8-mma off`, for timing).
  bool int8_mma_rows = true;
  // CUDA int8 decode GEMVs: how a launch's blocks fetch their weight rows before the PDL wait
  // (`--cuda-row-fetch l2|shared|auto|none`). L2: ask L2 for them where they fit beside the
  // matmul launched before. Shared: one-row GEMVs copy each block's rows into shared memory with
  // the tensor memory accelerator and read them there (cuda_stage_rows.cuh); L2 elsewhere. None:
  // read them when used. Auto (the default): L2, and Q6_K launches whose blocks stage at most
  // kStageAutoBytes (cuda_gemv_q8.h) stage them, where staging measured faster. The same bits
  // whichever.
  enum class RowFetch { L2, Shared, None, Auto };
  RowFetch row_fetch = RowFetch::Auto;
  // CUDA int8 decode GEMVs of one row (rows read from global memory): each lane asks for its next
  // weight unit's bytes before it dots the current one, so a unit's load latency hides behind the
  // previous unit's arithmetic, where that pays (plain launches of rows of 4096 values or more,
  // every format but Q6_K: cuda_gemv_q8.cu's ahead_pays; `--cuda-gemv-ahead on|off`). The same
  // bits either way.
  bool gemv_ahead = true;
  // CUDA with bf16 activations and int8_dots: batch-invariant numerics (`--batch-invariant on`).
  // Every launch of up to 64 rows computes each row with the one-row arithmetic (the int8 GEMVs
  // over several prepared rows, per-row post-norms, attention splits and expert lanes chosen per
  // row), so a sequence's tokens do not depend on the rows beside it; larger launches keep their
  // fast kernels (their rows depend on the launch's row count), and the serving engine keeps its
  // forwards within 64 rows (invariant_row_limit).
  bool row_exact = false;
  bool profile = false;      // CUDA: every op timed by events; per-op table on stderr at exit
  bool timing = false;       // CUDA: host/device time per step; medians on stderr at exit
  int device = 0;            // CUDA: the GPU (CUDA device number) the backend runs on
  // Ranks of a tensor-parallel group the model is split over (parallel/tp_model.h), a backend
  // each; 1: one.
  int tensor_parallel = 1;
  // CUDA under tensor parallelism: rank r's GPU is devices[r] (`--devices 0,1`); empty: GPUs 0..N-1.
  std::vector<int> devices;
  // How the ranks exchange activations (`--collectives`): Auto takes NCCL for ranks on distinct GPUs
  // and the in-process host group otherwise (host backends, ranks sharing a GPU); Nccl also makes a
  // one-rank group (`--tensor-parallel 1 --collectives nccl`: the NCCL path checked on one GPU).
  enum class Collectives { Auto, Nccl, Host };
  Collectives collectives = Collectives::Auto;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Makes a weight matrix (a view into the mapped checkpoint) usable by this backend's matmul and
  // embed. Host backends use it in place (the default); a device backend copies it to device
  // memory it owns and returns a view of the copy. Called once per matrix at load.
  virtual WeightView place_weight(const WeightView& w) { return w; }
  // Gives back what place_weight took for a weight (`placed`: its return value): the device copy
  // and anything kept for it. Host backends hold nothing (the default). Only between forward
  // steps, once nothing will read the weight again (an unmounted LoRA adapter). Not for the parts
  // of a stack (place_stack): those live as long as the backend.
  virtual void release_weight(const WeightView& placed) { (void)placed; }
  // place_weight for the weights a forward multiplies by one input in one op, in the order the op
  // takes them, each replaced by its placed view; parts without data (a KV-shared layer's k and v)
  // are skipped. `use` says how the op combines them (StackUse). A device backend copies the parts
  // of one layout (format, width, bits, group) back to back into one allocation and chooses the
  // stack's kernel plan here, once, instead of at every launch. Host backends place each part as
  // place_weight does (the default).
  virtual void place_stack(std::initializer_list<WeightView*> parts, StackUse use) {
    (void)use;
    for (WeightView* w : parts)
      if (w->data) *w = place_weight(*w);
  }
  // place_weight for one projection of a layer's routed experts, as one tensor: a device backend
  // copies the held experts into one allocation, back to back, and prepares what its MoE kernels
  // index experts by. Host backends use the stack in place (the default).
  virtual ExpertStack place_experts(const ExpertStack& s) { return s; }
  // Whether the ops implement activation precision P (all of them do F32).
  virtual bool supports_precision(ActPrecision P) const { return true; }
  // The dtype activation buffers (and unquantized KV caches) are stored in.
  virtual DType activation_dtype() const { return DType::F32; }

  // Memory for activations, caches and index lists: n elements of dtype t. Owned by the backend;
  // valid until freed or the backend dies.
  virtual Buf alloc(DType t, size_t n) = 0;
  Buf alloc_act(size_t n) { return alloc(activation_dtype(), n); }
  Buf alloc_f32(size_t n) { return alloc(DType::F32, n); }
  Buf alloc_i32(size_t n) { return alloc(DType::I32, n); }
  // Frees memory this backend allocated (by its first byte; others' pointers are ignored).
  virtual void free(void* p) = 0;
  void free(const Buf& b) { free(b.data); }
  // Raw copies of `bytes` between a backend buffer and host memory / between backend buffers.
  virtual void read_bytes(const Buf& src, size_t bytes, void* dst) = 0;
  virtual void write_bytes(const void* src, size_t bytes, const Buf& dst) = 0;
  virtual void copy_bytes(const Buf& src, size_t bytes, const Buf& dst) = 0;
  // Typed copies of n elements, converting between the host type and the buffer's dtype
  // (f32 <-> f32 / bf16 / f16 storage; int32 <-> I32 only).
  void to_host(const Buf& src, size_t n, float* dst);
  void to_host(const Buf& src, size_t n, int32_t* dst);
  void from_host(const float* src, size_t n, const Buf& dst);
  void from_host(const int32_t* src, size_t n, const Buf& dst);
  // dst = src, n elements of the same dtype.
  void copy(const Buf& src, size_t n, const Buf& dst);

  // out[i, :] = dequant(E[ids[i], :]) * scale, rounded per P.  out: [n, E.cols]; ids: I32 [n].
  virtual void embed(const WeightView& E, const Buf& ids, int n, float scale, ActPrecision P, const Buf& out) = 0;
  // y[M, W.rows] = x[M, W.cols] · Wᵀ (f32 accumulation), rounded per P.
  virtual void matmul(const Buf& x, int M, const WeightView& W, ActPrecision P, const Buf& y) = 0;
  // RMSNorm over the last dim of x[rows, dim]: y = x / sqrt(mean(x²) + eps) · w (w may be null).
  // MLX bf16 rule: normalized value rounded to bf16, then multiplied by w and rounded again.
  virtual void rms_norm(const Buf& x, int rows, int dim, const float* w, float eps, ActPrecision P,
                        const Buf& y) = 0;
  // In-place half-split RoPE on x[rows, heads, head_dim]; row r has position pos0 + r.
  virtual void rope(const Buf& x, int rows, int heads, int head_dim, int pos0, const RopeTable& t,
                    ActPrecision P) = 0;
  // Writes k/v [n, n_kv_heads, head_dim] (rows row0..row0+n of the batch buffers) into the cache
  // slots of positions pos0..pos0+n-1 (quantized buffers: as affine_quantize codes of each row).
  virtual void kv_write(const AttnSeq& s, const Buf& k, const Buf& v) = 0;
  // Causal (and windowed when kv.window > 0) attention for each sequence, scale `scale`, GQA:
  // q [rows, H, D] -> out [rows, H, D]. Query at position p sees cached keys at positions
  // p-window < k <= p (all k <= p when window == 0), and its image block's (visible_keys).
  virtual void attention(const Buf& q, int H, const std::vector<AttnSeq>& seqs, float scale, ActPrecision P,
                         const Buf& out) = 0;
  // out = gelu_tanh(gate) * up, elementwise over n, MLX op order (spec §2.7).
  virtual void gelu_mul(const Buf& gate, const Buf& up, size_t n, ActPrecision P, const Buf& out) = 0;
  // out = gelu(gate) * up as ggml computes it (GeluImpl::GgmlF16Table, core/config.h): gate is
  // rounded to f16, gelu_tanh of that f16 value is computed in f32 and rounded to f16 (ggml's
  // 65536-entry table), then multiplied by up in f32; gate <= -10 gives 0, gate >= 10 gives
  // gate * up.
  virtual void gelu_mul_ggml(const Buf& gate, const Buf& up, size_t n, const Buf& out) = 0;
  // y = a + b (elementwise, n).
  virtual void add(const Buf& a, const Buf& b, size_t n, ActPrecision P, const Buf& y) = 0;
  // y = a * s (elementwise, n; s a scalar already rounded per P by the caller if needed).
  virtual void scale(const Buf& a, float s, size_t n, ActPrecision P, const Buf& y) = 0;
  // y = tanh(x / cap) * cap elementwise, in place.
  virtual void softcap(const Buf& x, size_t n, float cap, ActPrecision P) = 0;
  // Copies rows: dst[i, :] = src[idx[i], :], dim columns; idx: I32 [n].
  virtual void gather_rows(const Buf& src, const Buf& idx, int n, int dim, const Buf& dst) = 0;
  // dst[r, :] = src[r, off:off+n] for a row-strided view (src row length `src_dim`).
  virtual void copy_cols(const Buf& src, int rows, int src_dim, int off, int n, const Buf& dst) = 0;
  // MoE router: for each row, top-k of scores[rows, E] -> idx (I32) [rows, k], weights
  // softmax(selected) * per_expert_scale[idx] (rounded per P).
  virtual void router_topk(const Buf& scores, int rows, int E, int k, const float* per_expert_scale, ActPrecision P,
                           const Buf& idx, const Buf& weights) = 0;
  // MoE experts (mlx-lm SwitchGLU + combine): for each row r and each of its k experts e = idx[r,j],
  // y_j = down_e(gelu_tanh(gate_e x_r) * up_e x_r); out[r] = sum_j w[r,j] * y_j (in P).
  // x [rows, d], out [rows, d]; gate/up [E, I, d] and down [E, d, I] as placed stacks. An expert
  // the stacks do not hold is another rank's (expert parallelism, parallel/tp_source.h): its slots
  // add nothing, so out is this rank's part of the sum.
  virtual void moe_experts(const Buf& x, int rows, int d, const Buf& idx, const Buf& w, int k, const ExpertStack& gate,
                           const ExpertStack& up, const ExpertStack& down, ActPrecision P, const Buf& out) = 0;

  // y[M, out] += every run's adapter delta of x [M, in] on its rows (lora null: nothing), each
  // through lora_delta (after dropout when training).
  void add_lora(const LoraApply* lora, const Buf& x, const Buf& y, ActPrecision P);
  // y[M, d.b.rows] += d.scale · (x · d.aᵀ) · d.bᵀ, x [M, d.a.cols], as mlx-lm's LoRALinear adds it:
  // the two products in f32 (into the scratch t [M, rank] and z [M, out]), the scaled sum rounded
  // per P. The default is matmul, matmul, scale, add, which every backend can run; a training
  // backend records it as one op (train/grad_backend.h).
  virtual void lora_delta(const Buf& x, int M, const LoraDelta& d, const Buf& t, const Buf& z, const Buf& y,
                          ActPrecision P);
  // y[M, W.rows] = x · Wᵀ, then add_lora: a module's matmul with its adapters.
  void linear(const Buf& x, int M, const WeightView& W, const LoraApply* lora, ActPrecision P, const Buf& y) {
    matmul(x, M, W, P, y);
    add_lora(lora, x, y, P);
  }

  // Training's LoRA dropout (mlx-lm's nn.Dropout on an adapter's input; model/lora.h): y[i] =
  // x[i] / (1 - p) where dropout_keeps(seed, i, p), else 0, over n f32 elements. The default
  // works on host copies (host backends: in their memory).
  virtual void dropout(const Buf& x, size_t n, float p, uint64_t seed, const Buf& y);

  // Called by the model before the ops of each layer l (0 .. n_layers - 1) and with n_layers
  // before the final norm: a boundary where a recording backend may checkpoint
  // (train/grad_backend.h). Nothing elsewhere.
  virtual void begin_layer(int l) { (void)l; }

  // --- Fused ops: each has a default made of the ops above (fused_ops.cpp), which host backends
  // keep; a device backend runs each as one kernel, where launches cost more than the work. ---

  // x[rows, dim] += rms_norm(o)·w (a layer's post-norm and residual add). o is scratch: its
  // contents afterwards are unspecified.
  virtual void norm_add(const Buf& x, const Buf& o, int rows, int dim, const float* w, float eps, ActPrecision P);
  // x_resid[M, W.rows] += rms_norm(x·Wᵀ + lora)·w (a projection with its adapters, then the
  // layer's post-norm and residual add: o_proj and down_proj). y_scratch [M, W.rows]: the
  // projection (contents afterwards unspecified).
  virtual void matmul_norm_add(const Buf& x, int M, const WeightView& W, const Buf& y_scratch, const Buf& x_resid,
                               const float* w, float eps, ActPrecision P, const LoraApply* lora = nullptr);
  // Per-head RMSNorm (weight w [head_dim]) then RoPE of each sequence's rows at its positions:
  // x [rows, heads, head_dim], rows = sum of seqs' n, sequence i at rows seqs[i].row0...
  virtual void norm_rope(const Buf& x, int heads, int head_dim, const float* w, float eps,
                         const std::vector<AttnSeq>& seqs, const RopeTable& t, ActPrecision P);
  // A layer's attention inputs: q [rows, H, head_dim] per-head RMSNorm (weight q_norm_w; null: no
  // norm) then RoPE at each sequence's positions; with k (a layer that owns its KV; null: q only):
  // v [rows, Hk, head_dim] unweighted RMSNorm when v_norm, k normed (k_norm_w) and roped as q,
  // then k and v written into each sequence's cache seqs[i].kv as kv_write does. q, k and v hold
  // their normed (and roped) rows afterwards (the model's taps read them). rows = the sum of seqs' n.
  virtual void attn_prep(const Buf& q, int H, const Buf& k, const Buf& v, int Hk, int head_dim, const float* q_norm_w,
                         const float* k_norm_w, bool v_norm, float eps, const std::vector<AttnSeq>& seqs,
                         const RopeTable& t, ActPrecision P);
  // ys[i][M, Ws[i].rows] = rms_norm(x)·norm.w · Ws[i]ᵀ (+ its adapters) for each (W, y, lora) of
  // `outs` (one input's projections: the attention's q, k, v), x [M, cols]. norm.w == nullptr: x
  // as is. With adapters the normed input is in norm.scratch afterwards (their products read it).
  virtual void norm_matmuls(const Buf& x, int M, const InputNorm& norm, std::initializer_list<MatOut> outs,
                            ActPrecision P);
  // A MoE layer's three input norms (26B-A4B), rows of dim: h1 = rms_norm(f)·w_f (the dense
  // branch's post-norm), xr = rms_norm(x)·w_r (the router's input), xn = rms_norm(x)·w_x (the
  // experts' input). A null weight: no weight.
  virtual void moe_norms(const Buf& f, const Buf& x, int rows, int dim, const float* w_f, const float* w_r,
                         const float* w_x, float eps, ActPrecision P, const Buf& h1, const Buf& xr, const Buf& xn);
  // A MoE layer's exit, rows of dim: f = h1 + rms_norm(h2)·w2 (the experts' post-norm joining the
  // dense branch), x = (x + rms_norm(f)·w)·s (the layer's post-norm, residual add and, when the
  // layer scalar comes next, s; else 1). h2 and f are scratch (contents afterwards unspecified).
  virtual void moe_exit(const Buf& x, const Buf& h1, const Buf& h2, int rows, int dim, const float* w2,
                        const float* w, float eps, float s, ActPrecision P, const Buf& f);
  // The gated MLP's first half: gate_out = gelu(xn·Gᵀ + lora_gate) * (xn·Uᵀ + lora_up), xn =
  // rms_norm(x)·norm.w as in norm_matmuls, x [M, G.cols], gate_out and up_scratch [M, G.rows];
  // gelu per ggml's table (gelu_mul_ggml) or MLX's order (gelu_mul). up_scratch's contents
  // afterwards are unspecified.
  virtual void gate_up_gelu(const Buf& x, int M, const InputNorm& norm, const WeightView& G, const WeightView& U,
                            bool ggml_table, ActPrecision P, const Buf& gate_out, const Buf& up_scratch,
                            const LoraApply* lora_gate = nullptr, const LoraApply* lora_up = nullptr);

  // out (I32 [rows]) [r] = the first index of the largest non-NaN value of row r of the f32 x
  // [rows, n] (greedy decoding without moving the logits off the device). The default copies the
  // rows to the host.
  virtual void argmax(const Buf& x, int rows, int n, const Buf& out);
  // For each row of the f32 x [rows, n]: its k largest values (k <= n; equal values at the k-th:
  // the lowest indices) as vals (f32) / idx (I32) [rows, k] in no particular order, and lse (f32)
  // [rows] = log Σ exp(x) over the row (NaN entries count as -inf). What sampling with a top-k
  // bound needs (Sampler::sample_top), without moving the logits off the device. The default
  // copies the rows to the host.
  virtual void top_k(const Buf& x, int rows, int n, int k, const Buf& vals, const Buf& idx, const Buf& lse);
  // A token drawn where the logits are: out (I32 [rows]) [r] = sampling/top_draw.h's draw_top of
  // row r's k candidates (vals / idx [rows, k] and lse [rows], as top_k leaves them) with row r's
  // parameters (fparams F32 / iparams I32 [rows, kTopDrawFields]: pack_top_draw). Queued with the
  // step that made the logits, so the next step can read its token before the host has (runtime/
  // engine_ahead.cpp). The default works on host copies.
  virtual void draw_top(const Buf& vals, const Buf& idx, const Buf& lse, int rows, int k, const Buf& fparams,
                        const Buf& iparams, const Buf& out);
  // Constrained decoding: for each of the count masks, row rows[i] of x [*, n] (f32 logits) =
  // -inf where mask i (core/token_mask.h; allow: I32 [count, token_mask_words(n)]; rows: I32
  // [count], distinct) has the token's bit clear; other rows are left alone. Runs before argmax /
  // top_k, so a device samples under a grammar without copying the logits. The default works on
  // host copies.
  virtual void mask_logits(const Buf& x, int n, const Buf& allow, const Buf& rows, int count);
  // Collectives of a tensor-parallel group (parallel/communicator.h) on this backend's buffers, in
  // the order of its other ops (inside a recorded step too): y (n elements, its dtype) becomes the
  // sum over the ranks (in rank order for a host group; in NCCL's order for a device group,
  // nccl_communicator.h); recv = every rank's n elements of send, rank after rank. The
  // defaults wait for the backend (sync) and call the group's blocking collective, through host
  // copies when the buffers are device memory and the group a host one (ranks sharing a GPU: a
  // check, not a fast path). A device backend enqueues a device group's collectives on its stream.
  virtual void all_reduce(Communicator& c, const Buf& y, size_t n);
  virtual void all_gather(Communicator& c, const Buf& send, size_t n, const Buf& recv);
  // dst[r, off:off+n] = src[r, :] for r < rows (src [rows, n] contiguous, dst rows of dst_dim): the
  // inverse of copy_cols (a vocabulary shard's logits into the full rows).
  virtual void place_cols(const Buf& src, int rows, int n, const Buf& dst, int dst_dim, int off);
  // Whether buffers live in device memory (callers then prefer argmax to reading whole logits).
  virtual bool on_device() const { return false; }
  // The most rows a forward may have for each row to be computed exactly as it would be alone (the
  // rows of larger forwards depend on their row count only); 0: any number (host backends, whose
  // batch-invariant kernels are row-exact at every size), or no such promise (CUDA without
  // BackendOptions::row_exact). The serving engine cuts prompts into chunks of at most that many
  // rows and runs each step in forwards of at most that many rows.
  virtual int invariant_row_limit() const { return 0; }
  // Whether steps (begin_step .. end_step) are recorded and replayed as graphs, so that a step of a
  // row count seen before costs one launch: where it holds, the serving engine pads decode steps to
  // row buckets (Model::set_decode_padding).
  virtual bool records_steps() const { return false; }
  // Whether kv_write and attention take quantized KV buffers (KvBuffer::quant.bits > 0).
  virtual bool supports_kv_quant() const { return false; }
  // Whether attention takes bidirectional image blocks (AttnSeq::blocks).
  virtual bool supports_image_blocks() const { return false; }

  // Finishes outstanding work (no-op on the CPU).
  virtual void sync() {}
  // A read-back that does not wait for the work before it: queue_read copies `bytes` (at most
  // kQueuedReadBytes) of src into read slot `slot` (0 <= slot < kReadSlots) once the work queued
  // before it is done; take_read waits for that copy alone and moves its bytes to dst. So a caller
  // can queue the next step before reading the previous one's output (greedy decoding whose input
  // token stays on the device: Model::forward_queued). Both are called outside a step; a slot
  // holds one read until taken. The defaults copy at once (host backends finish each op before it
  // returns).
  static constexpr int kReadSlots = 2;
  static constexpr size_t kQueuedReadBytes = 4096;
  virtual void queue_read(const Buf& src, size_t bytes, int slot);
  virtual void take_read(int slot, size_t bytes, void* dst);
  // Bracket one forward step (Model::forward). Between them a device backend may hold its
  // launches back and run the step as a recorded graph (backend/cuda/cuda_step.h), so callers
  // neither allocate nor free buffers the step uses before end_step; from_host copies its source
  // at once; to_host ends the recording early. No-ops on host backends.
  virtual void begin_step() {}
  virtual void end_step() {}

 private:
  std::vector<uint8_t> read_slots_[kReadSlots];  // the default queue_read's copies
};

// Whether element i survives dropout of probability p under `seed` (Backend::dropout): a
// counter-based draw, so every backend and a backward pass see the same mask.
bool dropout_keeps(uint64_t seed, uint64_t i, float p);

std::unique_ptr<Backend> make_reference_backend();
std::unique_ptr<Backend> make_cpu_backend();
// The llama.cpp-exact backend (backend/ggml): nullptr with *why set when this CPU cannot run it.
std::unique_ptr<Backend> make_ggml_backend(std::string* why);
// The CUDA backend (backend/cuda, built with -DG4_CUDA=ON): nullptr with *why set when this build
// has no CUDA or no usable GPU is present.
std::unique_ptr<Backend> make_cuda_backend(std::string* why, const BackendOptions& opt = {});
// How the CUDA backend ran its forward steps so far (backend/cuda/cuda_step.h): replayed from a
// recorded graph, captured into a new one, or launched op by op. False (and *out untouched) when
// `be` is not the CUDA backend.
struct CudaStepCounts {
  long replayed = 0, captured = 0, direct = 0;
};
bool cuda_step_counts(const Backend& be, CudaStepCounts* out);
// Whether `be` is the CUDA backend running its prefill matmuls on cuBLAS (BackendOptions::blas, bf16
// activations, and libcublas found at run time).
bool cuda_prefill_on_blas(const Backend& be);
// "reference" | "cpu" (default) | "ggml" | "cuda". Returns nullptr for an unknown name (or one this
// build or machine cannot run). opt: the device backends' options (host backends ignore them).
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& opt = {});

}  // namespace g4
