// The op set the model runs on, and the contract every backend (reference, fast CPU, later CUDA)
// implements. Model code (src/model) only calls these ops on buffers the backend allocated; it never
// reads activation memory itself, so a device backend can keep everything on the device.
//
// Conventions: activations are f32 buffers, row-major; "rows" are token positions of the batch.
// Every op takes the activation precision P: with P == BF16 each op rounds its output to bf16 the
// way MLX does when a model runs in bf16 (each intermediate of a composed op rounded as MLX does);
// with P == F32 nothing is rounded. Shapes are stated per op; all sizes are element counts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "quant/weight.h"

namespace g4 {

// Rotary frequencies of one layer kind: inv_freq[j] for pair j in [0, head_dim/2); pairs with
// inv_freq 0 do not rotate. position_scale multiplies positions (linear RoPE scaling: 1/factor).
struct RopeTable {
  std::vector<float> inv_freq;
  float position_scale = 1.f;
  RopeSpec spec;  // what the table was made from (backends that compute angles their own way)
};
// MLX-compatible frequency table for a layer (default, proportional or linear RoPE).
RopeTable make_rope_table(const RopeSpec& spec, int head_dim);

// One layer's K/V storage for one sequence: [capacity, n_kv_heads, head_dim] for K and V (backend
// memory), plus the absolute position held by each slot (-1 = empty; HOST memory on every
// backend, owned by the KV cache: the runtime reads it, kv_write records positions in it). Full layers: slot = position (capacity grows in
// the runtime's reserve step, never in decode). Sliding layers: a ring with
// capacity >= window + max_chunk - 1, slot = position % capacity, so memory is bounded by the window.
struct KvBuffer {
  float* k = nullptr;
  float* v = nullptr;
  int32_t* pos = nullptr;
  int capacity = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int window = 0;  // 0: full attention
};

// One sequence's slice of a batched attention call.
struct AttnSeq {
  int row0 = 0;       // first row of this sequence in the batch's q/out buffers
  int n = 0;          // number of new tokens (rows)
  int pos0 = 0;       // absolute position of the first new token
  KvBuffer kv;        // cache holding every key this sequence may attend to (new ones included)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Makes a weight matrix (a view into the mapped checkpoint) usable by this backend's matmul and
  // embed. Host backends use it in place (the default); a device backend copies it to device
  // memory it owns and returns a view of the copy. Called once per matrix at load.
  virtual WeightView place_weight(const WeightView& w) { return w; }
  // Whether the ops implement activation precision P (all of them do F32).
  virtual bool supports_precision(ActPrecision P) const { return true; }

  // Memory for activations and caches. Owned by the backend; valid until the backend dies.
  virtual float* alloc(size_t n_floats) = 0;
  virtual int32_t* alloc_i32(size_t n) = 0;
  virtual void free(void* p) = 0;
  // Copies n floats from a backend buffer to host memory / from host to a backend buffer /
  // between two backend buffers.
  virtual void to_host(const float* src, size_t n, float* dst) = 0;
  virtual void from_host(const float* src, size_t n, float* dst) = 0;
  virtual void copy(const float* src, size_t n, float* dst) = 0;

  // out[i, :] = dequant(E[ids[i], :]) * scale, rounded per P.  out: [n, E.cols].
  virtual void embed(const WeightView& E, const int32_t* ids, int n, float scale, ActPrecision P,
                     float* out) = 0;
  // y[M, W.rows] = x[M, W.cols] · Wᵀ (f32 accumulation), rounded per P.
  virtual void matmul(const float* x, int M, const WeightView& W, ActPrecision P, float* y) = 0;
  // RMSNorm over the last dim of x[rows, dim]: y = x / sqrt(mean(x²) + eps) · w (w may be null).
  // MLX bf16 rule: normalized value rounded to bf16, then multiplied by w and rounded again.
  virtual void rms_norm(const float* x, int rows, int dim, const float* w, float eps,
                        ActPrecision P, float* y) = 0;
  // In-place half-split RoPE on x[rows, heads, head_dim]; row r has position pos0 + r.
  virtual void rope(float* x, int rows, int heads, int head_dim, int pos0, const RopeTable& t,
                    ActPrecision P) = 0;
  // Writes k/v [n, n_kv_heads, head_dim] (rows row0..row0+n of the batch buffers) into the cache
  // slots of positions pos0..pos0+n-1.
  virtual void kv_write(const AttnSeq& s, const float* k, const float* v) = 0;
  // Causal (and windowed when kv.window > 0) attention for each sequence, scale `scale`, GQA:
  // q [rows, H, D] -> out [rows, H, D]. Query at position p sees cached keys at positions
  // p-window < k <= p (all k <= p when window == 0).
  virtual void attention(const float* q, int H, const std::vector<AttnSeq>& seqs, float scale,
                         ActPrecision P, float* out) = 0;
  // out = gelu_tanh(gate) * up, elementwise over n, MLX op order (spec §2.7).
  virtual void gelu_mul(const float* gate, const float* up, size_t n, ActPrecision P,
                        float* out) = 0;
  // out = gelu(gate) * up as ggml computes it (GeluImpl::GgmlF16Table, model/config.h): gate is
  // rounded to f16, gelu_tanh of that f16 value is computed in f32 and rounded to f16 (ggml's
  // 65536-entry table), then multiplied by up in f32; gate <= -10 gives 0, gate >= 10 gives
  // gate * up. Always f32 activations.
  virtual void gelu_mul_ggml(const float* gate, const float* up, size_t n, float* out) = 0;
  // y = a + b (elementwise, n).
  virtual void add(const float* a, const float* b, size_t n, ActPrecision P, float* y) = 0;
  // y = a * s (elementwise, n; s a scalar already rounded per P by the caller if needed).
  virtual void scale(const float* a, float s, size_t n, ActPrecision P, float* y) = 0;
  // y = tanh(x / cap) * cap elementwise.
  virtual void softcap(float* x, size_t n, float cap, ActPrecision P) = 0;
  // Copies rows: dst[i, :] = src[idx[i], :], dim columns.
  virtual void gather_rows(const float* src, const int32_t* idx, int n, int dim, float* dst) = 0;
  // dst[r, :] = src[r, off:off+n] for a row-strided view (src row length `src_dim`).
  virtual void copy_cols(const float* src, int rows, int src_dim, int off, int n, float* dst) = 0;
  // MoE router: for each row, top-k of scores[rows, E] -> idx [rows, k], weights
  // softmax(selected) * per_expert_scale[idx] (rounded per P).
  virtual void router_topk(const float* scores, int rows, int E, int k,
                           const float* per_expert_scale, ActPrecision P, int32_t* idx,
                           float* weights) = 0;
  // MoE experts (mlx-lm SwitchGLU + combine): for each row r and each of its k experts e = idx[r,j],
  // y_j = down_e(gelu_tanh(gate_e x_r) * up_e x_r); out[r] = sum_j w[r,j] * y_j (in P).
  // x [rows, d], out [rows, d]; gate/up/down hold one view per expert.
  virtual void moe_experts(const float* x, int rows, int d, const int32_t* idx, const float* w,
                           int k, const std::vector<WeightView>& gate,
                           const std::vector<WeightView>& up, const std::vector<WeightView>& down,
                           ActPrecision P, float* out) = 0;
  // Finishes outstanding work (no-op on the CPU).
  virtual void sync() {}
};

std::unique_ptr<Backend> make_reference_backend();
std::unique_ptr<Backend> make_cpu_backend();
// The llama.cpp-exact backend (backend/ggml): nullptr with *why set when this CPU cannot run it.
std::unique_ptr<Backend> make_ggml_backend(std::string* why);
// The CUDA backend (backend/cuda, built with -DG4_CUDA=ON): nullptr with *why set when this build
// has no CUDA or no usable GPU is present.
std::unique_ptr<Backend> make_cuda_backend(std::string* why);
// "reference" | "cpu" (default) | "ggml" | "cuda". Returns nullptr for an unknown name (or one this
// build or machine cannot run).
std::unique_ptr<Backend> make_backend(const std::string& name);

}  // namespace g4
