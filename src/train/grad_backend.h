// Reverse-mode differentiation of the model's own forward (model/model.cpp): a backend that
// computes every op in plain f32 (training follows the model's definition, not the inference
// kernels' roundings) and, once armed, records the ops of a forward on a tape,
// so that backward() runs each op's vector-Jacobian product in reverse order. Training thus has
// no forward of its own: every architecture change to Model::forward is differentiated as it is.
//
// Gradients live beside the memory they belong to: each f32 buffer this backend allocated gets a
// gradient buffer of its size on first use, and an op's backward reads and clears the gradient of
// what it wrote, then adds into the gradients of what it read. That is exact under the in-place
// updates and reused scratch buffers of the forward: a value's gradient is collected from the ops
// that read it before the op that overwrote it is reached.
//
// Gradient checkpointing per layer (Backend::begin_layer): the recording forward keeps, per
// layer, only the bytes its ops read that were written before the layer began (its inputs: the
// residual stream, the per-layer inputs, a shared layer's donor K/V). backward() takes the layers
// last to first: it writes their inputs back, runs the layer's ops again keeping what their
// backwards need, then runs those backwards. Memory: the layers' inputs plus one layer's
// intermediates (attention weights [heads, T, T] per sequence included).
//
// The arithmetic and memory are a GradArith's (backend/grad_arith.h): host f32 by default, or a
// device's kernels on its memory; the tape is the same for both.
//
// What it takes: f32 activations (P is ignored: always f32), unquantized unpaged KV caches, each
// sequence's forward from position 0 while recording (a training sequence is one chunk), no
// image blocks. Registered parameters (add_param) are f32 matrices read by matmul or lora_delta
// (the LoRA matrices): their gradients accumulate into the caller's buffers. Recording starts at
// the first op that reads one (nothing before it can carry a gradient to them).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/grad_arith.h"

namespace g4::train {

// The host arithmetic: f32 on host memory, over a reference backend (HostBackend's forward ops).
std::unique_ptr<GradArith> make_host_grad_arith();

class GradBackend final : public Backend {
 public:
  // On the host arithmetic (make_host_grad_arith), or on `arith`'s memory and kernels.
  GradBackend();
  explicit GradBackend(std::unique_ptr<GradArith> arith);
  ~GradBackend() override;

  // The base backend's name, for messages ("copying weights to cuda training").
  std::string name() const override { return base_.name() + " training"; }
  bool supports_precision(ActPrecision P) const override { return P == ActPrecision::F32; }
  bool on_device() const override { return base_.on_device(); }
  void sync() override { base_.sync(); }
  WeightView place_weight(const WeightView& w) override { return base_.place_weight(w); }
  void release_weight(const WeightView& placed) override { base_.release_weight(placed); }
  void place_stack(std::initializer_list<WeightView*> parts, StackUse use) override { base_.place_stack(parts, use); }
  ExpertStack place_experts(const ExpertStack& s) override { return base_.place_experts(s); }

  // Registers an f32 weight matrix by its data: y = x·Wᵀ (matmul) then adds dyᵀ·x into grad
  // [W.rows, W.cols] (the arith's memory) during backward(). grad must outlive the registration
  // (clear_params).
  void add_param(const void* weight_data, float* grad);
  // b[0, n) = 0 (f32; the arith's memory).
  void zero(const Buf& b, size_t n) { arith_.zero(b.f32(), n); }
  void clear_params() { params_.clear(); }
  // The next forward is recorded (from its first parameter read on), dropping any earlier tape.
  void arm();
  // Adds g[0, n) (host memory) into the gradient of the f32 buffer b (d loss / d b, the backward's
  // seed).
  void seed_grad(const Buf& b, const float* g, size_t n);
  // The LM head's next-token loss over the f32 rows x [M, E.cols] (grad_arith.h lm_head_loss),
  // E placed here; with `train`, weight · its gradient is added into x's gradient (the backward's
  // seed).
  double head_loss(const Buf& x, int M, const WeightView& E, float cap, const std::vector<int32_t>& targets,
                   float weight, bool train);
  // Back through the recorded forward (see above): parameter gradients accumulate; the tape and
  // every activation gradient are dropped afterwards.
  void backward();

  Buf alloc(DType t, size_t n) override;
  void free(void* p) override;
  using Backend::free;
  void read_bytes(const Buf& src, size_t bytes, void* dst) override { base_.read_bytes(src, bytes, dst); }
  void write_bytes(const void* src, size_t bytes, const Buf& dst) override;
  void copy_bytes(const Buf& src, size_t bytes, const Buf& dst) override;
  void begin_layer(int l) override;

  void embed(const WeightView& E, const Buf& ids, int n, float scale, ActPrecision P, const Buf& out) override;
  void matmul(const Buf& x, int M, const WeightView& W, ActPrecision P, const Buf& y) override;
  // One recorded op when both matrices are registered parameters (the composition's otherwise):
  // the delta adds into y in place, so y's gradient passes through, and the backward forms the
  // parameters' and x's gradients from it (GradArith::lora_bwd) without the [M, out] temporaries.
  void lora_delta(const Buf& x, int M, const LoraDelta& d, const Buf& t, const Buf& z, const Buf& y,
                  ActPrecision P) override;
  void rms_norm(const Buf& x, int rows, int dim, const float* w, float eps, ActPrecision P, const Buf& y) override;
  void rope(const Buf& x, int rows, int heads, int head_dim, int pos0, const RopeTable& t, ActPrecision P) override;
  void kv_write(const AttnSeq& s, const Buf& k, const Buf& v) override;
  bool supports_kv_quant() const override { return false; }
  bool supports_image_blocks() const override { return false; }
  void attention(const Buf& q, int H, const std::vector<AttnSeq>& seqs, float scale, ActPrecision P,
                 const Buf& out) override;
  void gelu_mul(const Buf& gate, const Buf& up, size_t n, ActPrecision P, const Buf& out) override;
  // The tanh GELU as gelu_mul: training differentiates the model's function, of which ggml's f16
  // table is an inference rounding.
  void gelu_mul_ggml(const Buf& gate, const Buf& up, size_t n, const Buf& out) override;
  void add(const Buf& a, const Buf& b, size_t n, ActPrecision P, const Buf& y) override;
  void scale(const Buf& a, float s, size_t n, ActPrecision P, const Buf& y) override;
  void softcap(const Buf& x, size_t n, float cap, ActPrecision P) override;
  void gather_rows(const Buf& src, const Buf& idx, int n, int dim, const Buf& dst) override;
  void copy_cols(const Buf& src, int rows, int src_dim, int off, int n, const Buf& dst) override;
  void dropout(const Buf& x, size_t n, float p, uint64_t seed, const Buf& y) override;
  void router_topk(const Buf& scores, int rows, int E, int k, const float* per_expert_scale, ActPrecision P,
                   const Buf& idx, const Buf& weights) override;
  void moe_experts(const Buf& x, int rows, int d, const Buf& idx, const Buf& w, int k,
                   const ExpertStack& gate, const ExpertStack& up, const ExpertStack& down, ActPrecision P,
                   const Buf& out) override;

 private:
  struct Region {
    const uint8_t* p = nullptr;
    size_t bytes = 0;
  };
  // One recorded op: the memory it reads and writes, its forward (keep: also save what its
  // backward needs) and its backward (which drops those saves).
  struct Op {
    std::vector<Region> reads, writes;
    std::function<void(bool keep)> fwd;
    std::function<void()> bwd;
  };
  struct Saved {
    Region r;
    ArithBlock bytes;
  };
  // The ops between two checkpoints and the inputs they read from before it.
  struct Segment {
    std::vector<Op> ops;
    std::vector<Saved> inputs;
    std::vector<Region> written;
  };
  struct Alloc {
    size_t bytes = 0;
    DType dtype = DType::F32;
    ArithBlock grad;  // empty until a gradient reaches it
  };
  // What an op's forward keeps for its backward (shared by the two closures).
  using Kept = std::shared_ptr<ArithBlock>;

  // Runs op's forward; when recording, first saves the segment's inputs among its reads.
  void exec(Op op);
  void start_recording();
  // The gradient of the n f32 elements at b (created zeroed when create), or null: not an f32
  // buffer of this backend, or (create false) no gradient yet.
  float* grad(const Buf& b, bool create);
  // Copies and clears the gradient of b's n elements (the output's, in a backward); empty: none.
  ArithBlock take_grad(const Buf& b, size_t n);
  // n zeroed floats / a copy of n floats, in the arith's memory.
  ArithBlock zeros(size_t n) { return ArithBlock(arith_, n * 4, true); }
  void keep(const Kept& k, const float* p, size_t n);
  static Kept kept() { return std::make_shared<ArithBlock>(); }
  // The slots (rows of KvBuffer::row_floats) of positions pos0 .. pos0 + n - 1 of a cache.
  static std::vector<int64_t> cache_slots(const KvBuffer& kv, int pos0, int n);
  static Region region(const Buf& b, size_t elems) { return {static_cast<const uint8_t*>(b.data), elems * b.elem_bytes()}; }
  // The K (value false) or V rows of positions pos0 .. pos0 + n - 1 of a cache, merged.
  static std::vector<Region> cache_rows(const KvBuffer& kv, bool value, int pos0, int n);

  std::unique_ptr<GradArith> owned_;
  GradArith& arith_;
  Backend& base_;
  std::map<const uint8_t*, Alloc> allocs_;  // by first byte
  std::map<const void*, float*> params_;
  bool armed_ = false, recording_ = false;
  std::vector<Segment> segs_;
};

}  // namespace g4::train
