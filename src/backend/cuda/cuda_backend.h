// The CUDA backend: every op of backend.h as a kernel launch on one Device (cuda_device.h), weights
// copied to device memory once at load (place_weight), activations and KV caches as typed device
// buffers (backend/buffer.h) of BackendOptions::activations (bf16 by default, f32 with `--dtype f32`;
// kernels accumulate in f32, logits are f32). The parts live in their own files: the device
// (cuda_device.h), its memory (cuda_alloc.h), step recording and graph replay (cuda_step.h), the
// profiling and timing observers (cuda_observers.h), the kernels by concern (cuda_kernels.h), the
// prefill GEMMs on cuBLAS (cuda_blas.h) and the argument plumbing (cuda_backend_args.h).
//
// Every op goes through launch(name, launcher, args...): the launcher is a cuda:: function and
// args are exactly what it is called with, so a recorded step's key (cuda_step.h) is derived from
// the launch itself: its name and the value of every argument (pointers by address, structs by
// their bytes; argument structs are value-initialized, so their padding is zero). A decode step is
// one graph launch, with no host sync before the logits are read, MoE layers included (their
// prefill with f32 activations still routes through the host, a sync per MoE layer). Every CUDA
// call is checked; a failure aborts with the call and CUDA's message. Options come from the CLI (BackendOptions); G4_CUDA_SKIP=name,name
// (ablation timings: those launches never run, results are wrong) is the one debug switch read
// from the environment.
//
// The class is declared here and defined over three files: cuda_backend.cu (memory, steps,
// collectives and the small ops), cuda_backend_matmul.cu (the matmul family and its launch plans)
// and cuda_backend_attention_moe.cu (RoPE, KV writes, attention and the MoE ops). Internal to them.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_alloc.h"
#include "backend/cuda/cuda_backend_args.h"
#include "backend/cuda/cuda_blas.h"
#include "backend/cuda/cuda_seq_tables.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_collectives.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_expert_tables.h"
#include "backend/cuda/cuda_mma_small.h"
#include "backend/cuda/cuda_flash_attention.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_observers.h"
#include "backend/cuda/cuda_pending.h"
#include "backend/cuda/cuda_step.h"
#include "backend/cuda/cuda_token_mask.h"
#include "backend/cuda/cuda_weight_plans.h"
#include "backend/host_backend.h"
#include "backend/moe_host_routed.h"
#include "core/status.h"
#include "parallel/communicator.h"

namespace g4::cuda_impl {

using namespace cuda_args;  // NOLINT: the backend's own argument helpers

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opt) : opt_(opt), dev_(opt.device), mem_(dev_), tables_(mem_) {
    // Row-exact (batch-invariant) steps are recorded as graphs too (docs/cuda-notes.md, stops 39,
    // 41 and 47: the serve-level check that failed with them passes since graphs stopped being
    // destroyed mid-run).
    rec_ = std::make_unique<cuda::StepRecorder>(dev_.stream(), opt.graphs);
    seqs_ = std::make_unique<cuda::SeqTables>(*rec_, mem_, [this](const int32_t* host, size_t n, int32_t* d) {
      from_host(host, n, Buf(d, DType::I32, int64_t(n), dev_.id()));
    });
    cuda::set_tensor_cores(opt.tensor_cores);
    if (opt.profile) profile_ = cuda::make_op_profile();
    if (opt.timing) timer_ = cuda::make_step_timer();
    if (opt.activations == DType::BF16 && opt.int8_dots) {
      q8_ = cuda::q8_act_in(mem_.alloc(cuda::q8_scratch_bytes()));
      q8_out_ = cuda::q8_act_in(mem_.alloc(cuda::q8_scratch_bytes()));
    }
    if (opt.activations == DType::BF16 && opt.blas && opt.tensor_cores) {
      std::string why;
      blas_ = cuda::Blas::create(mem_, &why);
      if (!blas_) std::fprintf(stderr, "cuda: %s; prefill matmuls on the tensor-core kernels\n", why.c_str());
    }
    if (const char* skip = std::getenv("G4_CUDA_SKIP")) {  // ablation: "attention,norm_add": never launch those
      std::string list = skip;
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        if (comma > at) skip_.insert(list.substr(at, comma - at));
        at = comma + 1;
      }
    }
  }
  ~CudaBackend() override {
    profile_.reset();
    timer_.reset();
    seqs_.reset();
    rec_.reset();  // waits for the stream
    mem_.collect();
    if (bounce_) cudaFreeHost(bounce_);
    if (reads_) cudaFreeHost(reads_);
    for (cudaEvent_t e : read_done_)
      if (e) cudaEventDestroy(e);
  }
  std::string name() const override { return "cuda"; }
  // Kernels compute in their buffers' dtype (activation_dtype()); the host backends' bf16 rounding
  // mode P is not emulated, and P is ignored.
  DType activation_dtype() const override { return opt_.activations; }
  // Buffers live in GPU memory: callers take the argmax / top k here instead of copying logits.
  bool on_device() const override { return true; }
  bool records_steps() const override { return rec_->graphs(); }
  int invariant_row_limit() const override { return opt_.row_exact && q8_.q ? kRowExactMaxRows : 0; }
  cuda::StepRecorder::Counts step_counts() const { return rec_->counts(); }
  // The GPU and stream every op runs on (work queued on it by others runs in op order).
  const cuda::Device& device() const { return dev_; }
  bool prefill_on_blas() const { return blas_ != nullptr; }

  WeightView place_weight(const WeightView& w) override;
  void release_weight(const WeightView& w) override;
  ExpertStack place_experts(const ExpertStack& s) override;
  void place_stack(std::initializer_list<WeightView*> parts, StackUse use) override;

  Buf alloc(DType t, size_t n) override {
    dev_.make_current();
    // Whole 4-byte words (byte buffers of quantized KV codes are read as words).
    return Buf(mem_.alloc((std::max<size_t>(n, 1) * dtype_size(t) + 3) / 4 * 4), t, int64_t(n), dev_.id());
  }
  using Backend::free;
  void free(void* p) override {
    dev_.make_current();
    mem_.free(p, /*deferred=*/rec_->active());
  }
  void read_bytes(const Buf& src_b, size_t bytes, void* dst) override;
  // Into pinned slots, completion marked by an event a slot (backend.h).
  void queue_read(const Buf& src_b, size_t bytes, int slot) override;
  void take_read(int slot, size_t bytes, void* dst) override;
  void write_bytes(const void* src, size_t bytes, const Buf& dst_b) override;
  void copy_bytes(const Buf& src_b, size_t bytes, const Buf& dst_b) override {
    if (!bytes) return;
    launch("copy", copy_device, static_cast<const void*>(src_b.data), bytes, dst_b.data);
  }

  void embed(const WeightView& E, const Buf& ids_b, int n, float scale, ActPrecision P, const Buf& out_b) override;
  void matmul(const Buf& x_b, int M, const WeightView& W, ActPrecision P, const Buf& y_b) override;
  void rms_norm(const Buf& x_b, int rows, int dim, const float* w, float eps, ActPrecision P,
                const Buf& y_b) override {
    const void* x = x_b.data;
    void* y = y_b.data;
    const DType t = act_type({&x_b, &y_b});
    launch("rms_norm", cuda::rms_norm, x, rows, dim, w, eps, y, t);
  }
  void moe_norms(const Buf& f_b, const Buf& x_b, int rows, int dim, const float* w_f, const float* w_r,
                 const float* w_x, float eps, ActPrecision P, const Buf& h1_b, const Buf& xr_b,
                 const Buf& xn_b) override {
    const void *f = f_b.data, *x = x_b.data;
    void *h1 = h1_b.data, *xr = xr_b.data, *xn = xn_b.data;
    const DType t = act_type({&f_b, &x_b, &h1_b, &xr_b, &xn_b});
    launch("moe_norms", cuda::moe_norms, f, x, rows, dim, w_f, w_r, w_x, eps, h1, xr, xn, t);
  }
  void moe_exit(const Buf& x_b, const Buf& h1_b, const Buf& h2_b, int rows, int dim, const float* w2, const float* w,
                float eps, float s, ActPrecision P, const Buf& f_b) override {
    void* x = x_b.data;
    const void *h1 = h1_b.data, *h2 = h2_b.data;
    const DType t = act_type({&x_b, &h1_b, &h2_b});
    const cuda::MoeCombine c = combine_.take_for(h2, rows, dim, t);  // computed in the kernel
    launch("moe_exit", cuda::moe_exit, x, h1, h2, c, rows, dim, w2, w, eps, s, t);
  }
  void rope(const Buf& x_b, int rows, int heads, int head_dim, int pos0, const RopeTable& t, ActPrecision P) override;
  bool supports_kv_quant() const override { return true; }
  bool supports_image_blocks() const override { return true; }
  void kv_write(const AttnSeq& s, const Buf& k_b, const Buf& v_b) override;
  void attention(const Buf& q_b, int H, const std::vector<AttnSeq>& seqs, float scale, ActPrecision P,
                 const Buf& out_b) override;
  void gelu_mul(const Buf& gate_b, const Buf& up_b, size_t n, ActPrecision P, const Buf& out_b) override {
    const void *gate = gate_b.data, *up = up_b.data;
    void* out = out_b.data;
    const cuda::PendingGeluMul g{gate, up, n, nullptr, out, act_type({&gate_b, &up_b, &out_b})};
    if (!hold_gelu_mul(g)) run_gelu_mul(g, cuda::Q8Act{}, 0);
  }
  void gelu_mul_ggml(const Buf& gate_b, const Buf& up_b, size_t n, const Buf& out_b) override {
    const void *gate = gate_b.data, *up = up_b.data;
    void* out = out_b.data;
    const cuda::PendingGeluMul g{gate, up, n, tables_.gelu_table(), out, act_type({&gate_b, &up_b, &out_b})};
    if (!hold_gelu_mul(g)) run_gelu_mul(g, cuda::Q8Act{}, 0);
  }
  void add(const Buf& a_b, const Buf& b_b, size_t n, ActPrecision P, const Buf& y_b) override {
    const void *a = a_b.data, *b = b_b.data;
    void* y = y_b.data;
    const DType t = act_type({&a_b, &b_b, &y_b});
    launch("add", cuda::add, a, b, n, y, t);
  }
  void scale(const Buf& a_b, float f, size_t n, ActPrecision P, const Buf& y_b) override {
    flush_held();  // older than the scale
    if (pending_.y && pending_.scale == 1.f && a_b.data == pending_.resid &&
        y_b.data == pending_.resid && n == size_t(pending_.rows) * size_t(pending_.n)) {
      pending_.scale = f;  // the pending residual, scaled in place: launched with it
      return;
    }
    const void* a = a_b.data;
    void* y = y_b.data;
    const DType t = act_type({&a_b, &y_b});
    launch("scale", cuda::scale, a, f, n, y, t);
  }
  void softcap(const Buf& x_b, size_t n, float cap, ActPrecision P) override {
    void* x = x_b.data;
    const DType t = act_type({&x_b});
    launch("softcap", cuda::softcap, x, n, cap, t);
  }
  void gather_rows(const Buf& src_b, const Buf& idx_b, int n, int dim, const Buf& dst_b) override {
    const void* src = src_b.data;
    const int32_t* idx = I(idx_b);
    void* dst = dst_b.data;
    const DType t = act_type({&src_b, &dst_b});
    launch("gather_rows", cuda::gather_rows, src, idx, n, dim, dst, t);
  }
  void copy_cols(const Buf& src_b, int rows, int src_dim, int off, int n, const Buf& dst_b) override {
    const void* src = src_b.data;
    void* dst = dst_b.data;
    const DType t = act_type({&src_b, &dst_b});
    launch("copy_cols", cuda::copy_cols, src, rows, src_dim, off, n, dst, t);
  }
  // A device group's collectives join the step like kernels (a captured step holds them as graph
  // nodes); a host group's go through host copies (Backend's defaults, which end the recording).
  void all_reduce(Communicator& c, const Buf& y_b, size_t n) override;
  void all_gather(Communicator& c, const Buf& send_b, size_t n, const Buf& recv_b) override;
  void place_cols(const Buf& src_b, int rows, int n, const Buf& dst_b, int dst_dim, int off) override;
  void norm_add(const Buf& x_b, const Buf& o_b, int rows, int dim, const float* w, float eps,
                ActPrecision P) override {
    void *x = x_b.data, *o = o_b.data;
    const DType t = act_type({&x_b, &o_b});
    launch("norm_add", cuda::norm_add, x, o, rows, dim, w, eps, t);
  }
  void norm_rope(const Buf& x_b, int heads, int head_dim, const float* w, float eps, const std::vector<AttnSeq>& seqs,
                 const RopeTable& t, ActPrecision P) override;
  void matmul_norm_add(const Buf& x_b, int M, const WeightView& W, const Buf& y_b, const Buf& resid_b,
                       const float* w, float eps, ActPrecision P, const LoraApply* lora) override;
  void attn_prep(const Buf& q_b, int H, const Buf& k_b, const Buf& v_b, int Hk, int head_dim, const float* q_norm_w,
                 const float* k_norm_w, bool v_norm, float eps, const std::vector<AttnSeq>& seqs, const RopeTable& t,
                 ActPrecision P) override;
  void norm_matmuls(const Buf& x_b, int M, const InputNorm& norm, std::initializer_list<MatOut> outs,
                    ActPrecision P) override;
  void gate_up_gelu(const Buf& x_b, int M, const InputNorm& norm, const WeightView& G, const WeightView& U,
                    bool ggml_table, ActPrecision P, const Buf& gate_b, const Buf& up_b, const LoraApply* lora_gate,
                    const LoraApply* lora_up) override;
  void top_k(const Buf& x_b, int rows, int n, int k, const Buf& vals_b, const Buf& idx_b, const Buf& lse_b) override {
    const float* x = F(x_b);
    float *vals = F(vals_b), *lse = F(lse_b);
    int32_t* idx = I(idx_b);
    G4_CHECK(k > 0 && k <= n && k <= 1024);
    const size_t bytes = cuda::top_k_scratch_bytes(rows, n, k);
    void* scratch = bytes ? top_k_.get(mem_, bytes, dev_) : nullptr;
    launch("top_k", cuda::top_k, x, rows, n, k, vals, idx, lse, scratch);
  }
  void draw_top(const Buf& vals_b, const Buf& idx_b, const Buf& lse_b, int rows, int k, const Buf& fparams_b,
                const Buf& iparams_b, const Buf& out_b) override {
    G4_CHECK(k > 0 && k <= 256 && "draw_top: at most 256 candidates a row on cuda");
    launch("draw_top", cuda::draw_top, F(vals_b), I(idx_b), F(lse_b), rows, k, F(fparams_b), I(iparams_b), I(out_b));
  }
  void mask_logits(const Buf& x_b, int n, const Buf& allow_b, const Buf& rows_b, int count) override {
    launch("mask_logits", cuda::mask_logits, F(x_b), n, reinterpret_cast<const uint32_t*>(I(allow_b)), I(rows_b),
           count);
  }
  void argmax(const Buf& x_b, int rows, int n, const Buf& out_b) override;
  // MoE (26B-A4B), on the device without a host sync: decode (rows <= kMoeDeviceRows) runs the
  // routed experts' GEMVs (cuda_moe.cu), reading only the chosen experts' rows, so the step
  // replays as one graph; prefill with bf16 activations groups the items by expert on the device
  // and runs grouped tensor-core GEMMs (cuda_moe_grouped.cu). Otherwise (f32 activations, mixed
  // formats) the routing comes back to the host, which runs one matmul per expert.
  static constexpr int kMoeDeviceRows = 8;  // kRowExactMaxRows when row-exact
  void router_topk(const Buf& scores, int rows, int E, int k, const float* per_expert_scale, ActPrecision P,
                   const Buf& idx, const Buf& weights) override;
  void moe_experts(const Buf& x, int rows, int d, const Buf& idx, const Buf& w_b, int k,
                   const ExpertStack& gate, const ExpertStack& up, const ExpertStack& down, ActPrecision P,
                   const Buf& out_b) override;
  void sync() override;
  void begin_step() override;
  void end_step() override;

 private:
  cuda::PendingPost pending_;      // a matmul_norm_add's post-norm (cuda_pending.h)
  cuda::PendingCombine combine_;   // the device MoE path's combination (cuda_pending.h)
  cuda::PendingAttention attn_;    // a decode attention launch held back for the op after it
  cuda::PendingAttnPrep prep_;     // a decode attn_prep launch held back for the attention after it
  cuda::PendingGeluMul gelu_;      // a decode-sized gelu_mul held back for the GEMV after it
  static constexpr int kPdlMaxRows = 64;
  int step_rows_ = 0;  // rows of the step being logged (embed sets it)
  // The pending epilogues and the held-back launch that no op took, launched alone (before every
  // launch, host copy, sync and step end), oldest first: a held-back launch is always the newest
  // (nothing is left pending while one is held without launching it first).
  void flush_pending() {
    if (!pending_ && !combine_ && !attn_ && !prep_ && !gelu_) return;
    const cuda::PendingPost p = pending_;
    const cuda::PendingCombine c = combine_;
    pending_ = cuda::PendingPost{};
    combine_ = cuda::PendingCombine{};
    if (p) {
      const void* y = p.y;
      if (p.q8) launch("post_norm_add", cuda::post_norm_add, y, p.resid, p.t, p.n, p.w, p.eps, p.rows);
      else launch("norm_add", cuda::norm_add, p.resid, y, p.rows, p.n, p.w, p.eps, p.t);
      if (p.scale != 1.f)
        launch("scale", cuda::scale, static_cast<const void*>(p.resid), p.scale, size_t(p.rows) * p.n, p.resid, p.t);
    }
    if (c) launch("moe_combine", cuda::moe_combine, c.y, c.w, c.rows, c.k, c.d, c.out, c.t);
    flush_held();
  }
  // The held-back launch (attention, attn_prep or gelu_mul: one at most), launched as it is, after
  // the older pending epilogues.
  void flush_held() {
    launch_prep(prep_);
    launch_gelu_mul(cuda::Q8Act{});
    if (!attn_) return;
    const cuda::PendingAttention h = attn_;
    attn_ = cuda::PendingAttention{};
    launch_attention(h, cuda::Q8Act{});
  }
  // A held attn_prep (p), launched on its own and emptied; nothing when p is empty.
  void launch_prep(cuda::PendingAttnPrep& p) {
    if (!p) return;
    const cuda::PendingAttnPrep run = p;
    p = cuda::PendingAttnPrep{};
    launch("attn_prep", cuda::attn_prep, run.a, run.rows);
  }
  // Holds g (decode sizes on the int8 path: what an int8 GEMV's prepare could take) after the
  // older pending epilogues; false when it is to be launched now.
  bool hold_gelu_mul(const cuda::PendingGeluMul& g) {
    if (!opt_.fuse_decode_ops || !q8_.q || !q8_out_.q || g.n == 0 || g.n % 32 != 0 ||
        g.n > size_t(cuda::kQ8MaxValues))
      return false;
    flush_pending();  // older than the held launch
    gelu_ = g;
    return true;
  }
  // The held gelu_mul, emptied: with q8.q set also writing its output's int8 form there (rows of
  // `cols` values); nothing when none is held.
  void launch_gelu_mul(const cuda::Q8Act& q8, int cols = 0) {
    if (!gelu_) return;
    const cuda::PendingGeluMul g = gelu_;
    gelu_ = cuda::PendingGeluMul{};
    run_gelu_mul(g, q8, cols);
  }
  // g's launch: gelu_mul, its ggml-table form (g.table), or with q8.q set the form that also writes
  // the output's int8 form (rows of `cols` values).
  void run_gelu_mul(const cuda::PendingGeluMul& g, const cuda::Q8Act& q8, int cols) {
    if (q8.q) launch("gelu_mul_prepare", cuda::gelu_mul_q8, g.gate, g.up, g.n, g.table, g.out, g.t, cols, q8);
    else if (g.table) launch("gelu_mul_ggml", cuda::gelu_mul_ggml, g.gate, g.up, g.n, g.table, g.out, g.t);
    else launch("gelu_mul", cuda::gelu_mul, g.gate, g.up, g.n, g.out, g.t);
  }
  void launch_attention(const cuda::PendingAttention& h, const cuda::Q8Act& q8) {
    launch("attention", cuda::attention, h.q, h.H, h.a, h.scale, h.splits, h.partial, h.counters, h.out, q8, h.prep);
  }
  // The op after a held-back attention or gelu_mul launch reads its output x (M rows) through
  // weight w with no input norm: launches it with its output's int8 form written into q8_out_,
  // and returns q8_out_ for the caller's launch (MatArgs::prepared); otherwise launches it as it
  // is, before anything the caller decides, and returns an empty Q8Act.
  cuda::Q8Act take_prepared(const void* x, int M, const cuda::DevWeight& w);

  // Runs fn(stream, args...) now, or logs it with its key when a step is being recorded. The key
  // is the name and every argument (add_key), so two launches replay as one graph exactly when
  // they would launch the same kernels on the same memory with the same scalars.
  template <class... P, class... A>
  void launch(const char* op, void (*fn)(cudaStream_t, P...), A&&... args) {
    static_assert(sizeof...(P) == sizeof...(A), "launch: one argument per launcher parameter");
    flush_pending();  // a deferred epilogue no op took goes first
    std::string label = std::move(label_);
    label_.clear();
    if (!skip_.empty() && skip_.count(op)) return;  // G4_CUDA_SKIP (timing ablations only)
    const std::tuple<std::decay_t<P>...> t(std::forward<A>(args)...);
    // PDL for decode-sized steps only: at prefill sizes, kernels scheduled early took SM room
    // from the running GEMMs (prefill 0.7-0.85x with it, decode 1.03-1.06x; docs/cuda-notes.md).
    const bool pdl = opt_.pdl && step_rows_ <= kPdlMaxRows;
    auto call = [fn, t, pdl](cudaStream_t s) {
      cuda::set_pdl_launches(pdl);
      std::apply([&](const auto&... v) { fn(s, v...); }, t);
      G4_CUDA_LAUNCHED();
    };
    if (rec_->active()) {
      rec_->key(name_key(op));
      std::apply([&](const auto&... v) { (add_key(*rec_, v), ...); }, t);
      rec_->add(std::move(call));
    } else if (profile_) {
      dev_.make_current();
      profile_->before(label.empty() ? op : label, dev_.stream());
      call(dev_.stream());
      profile_->after(dev_.stream());
    } else {
      dev_.make_current();
      call(dev_.stream());
    }
  }
  // h[item] = gelu(x·G_e) * (x·U_e), y[item] = h[item]·D_e for the rows * k routed (row, expert)
  // items, then out = the router-weighted sum over each row's k items. Decode rows: the GEMVs;
  // more rows: grouped GEMMs where they apply. False, launching nothing, where neither does.
  bool moe_experts_on_device(const Buf& x, int rows, int d, const Buf& idx, const Buf& w_b, int k,
                             const ExpertStack& gate, const ExpertStack& up, const ExpertStack& down,
                             const Buf& out_b);
  // A matmul launch's arguments over M rows of input x into weights like w; the outputs are of
  // x's type. The int8 GEMVs' scratch is set where they take the launch (q8_rows).
  cuda::MatArgs mat_args(const Buf& x, const InputNorm& norm, int M, const cuda::DevWeight& w) const;
  // A decode row (M = 1) into K-quant matmuls: normed once into norm.scratch by one small kernel,
  // instead of by each of the matmul's thousands of blocks in its prologue (which cost more than
  // the weights' reads). Returns the matmul's arguments: the scratch read as is, or x normed in
  // the kernel (always for the int8 GEMVs, which norm in their prepare launch).
  // Rows for the few-row tensor-core kernel (no input norm of its own) are normed into
  // norm.scratch the same way.
  cuda::MatArgs normed_args(const Buf& x, int M, const InputNorm& norm, const WeightView& W, ActPrecision P);
  void launch_matmuls(cuda::MatArgs a, int M);
  // How a's blocks fetch their weight rows (MatArgs::row_fetch), from BackendOptions::row_fetch
  // and the matmul launched before it; records a's weights as the launch now streaming. Called
  // right before each matmul launch.
  void plan_row_fetch(cuda::MatArgs& a);
  // The plan of a launch of a's weights (cuda_weight_plans.h), as placement chooses it.
  cuda::GemvPlan plan_gemv(const cuda::MatArgs& a) const;
  // The row-fetch bits a's weights and the options fix (all but kFetchL2).
  uint8_t fixed_row_fetch(const cuda::MatArgs& a) const;
  // Whether a launch of M rows into weight w takes the int8 GEMVs: one row (where w is not taken
  // they fall back by themselves), or, with BackendOptions::row_exact, up to kRowExactMaxRows rows
  // into a weight they take, each row computed as if alone.
  static constexpr int kRowExactMaxRows = 64;
  bool q8_rows(int M, const cuda::DevWeight& w) const {
    return q8_.q && (M == 1 || (opt_.row_exact && M <= kRowExactMaxRows && cuda::q8_gemv_supports(w)));
  }
  // Batched decode rows (2 to kPendingMaxRows) into weight w on the few-row kernel or
  // cuBLAS: their input norm runs as its own launch (fused with a pending residual update:
  // normed_args), their post-norm and residual add are left pending (matmul_norm_add).
  static constexpr int kPendingMaxRows = 64;
  bool batched_rows(const Buf& x, int M, const cuda::DevWeight& w) const {
    if (q8_rows(M, w)) return false;
    const int64_t cols = w.cols;
    return small_rows(x, M, cols) || (M <= kPendingMaxRows && blas_rows(x, M, cols));
  }
  // Whether M rows of x into `cols`-wide weights take the cuBLAS prefill path (Blas::applies for
  // the launches without an epilogue: their input norm then needs no shared memory).
  bool blas_rows(const Buf& x, int M, int64_t cols) const {
    return blas_ && act_type({&x}) == DType::BF16 && M >= cuda::kBlasMinRows && cols % 32 == 0 &&
           cols <= cuda::kBlasMaxCols;
  }
  // Launch a on cuBLAS (cuda_blas.h) when it applies; false: the caller launches its kernels.
  // From blas_cached_min_rows rows (below kBlasMinRows), only when every weight is read as bf16.
  bool launch_blas(const char* op, const cuda::MatArgs& a, int M, int act);
  BackendOptions opt_;
  cuda::Device dev_;
  cuda::DeviceAllocator mem_;
  cuda::DeviceTables tables_;
  std::unique_ptr<cuda::StepRecorder> rec_;
  std::unique_ptr<cuda::LaunchObserver> profile_;  // BackendOptions::profile
  std::unique_ptr<cuda::StepObserver> timer_;      // BackendOptions::timing
  std::string label_;                              // the profile label of the next launch (matmul shapes)
  std::unordered_set<std::string> skip_;           // G4_CUDA_SKIP: launch names never run
  std::unique_ptr<Backend> host_ops_ = make_reference_backend();  // MoE routing on the host
  HostRoutedMoe host_moe_;  // the MoE fallback: routing read back, a matmul per expert
  std::unique_ptr<cuda::SeqTables> seqs_;  // attention's per-step device tables
  // Scratch that kernels leave zero (counters, argmax slots) or overwrite (attention partials).
  cuda::GrowBuffer partial_, counters_, argmax_, epilogue_counter_;
  cuda::GrowBuffer top_k_;  // top_k's chunk candidates and partial sums
  cuda::GrowBuffer moe_h_, moe_dy_;  // device MoE: the items' gated hidden rows and expert outputs
  cuda::GrowBuffer moe_groups_;      // prefill MoE: the items grouped by expert (cuda::MoeGroups)
  cuda::ExpertTables experts_{mem_, dev_};  // the device MoE's expert arrays (zero experts for other ranks')
  cuda::WeightPlans plans_;  // the placed weights' GEMV plans
  size_t argmax_rows_ = 0;
  cuda::Q8Act q8_{};  // the int8 decode scratch (bf16 activations with int8_dots), or all null
  cuda::Q8Act q8_out_{};  // the int8 form a held-back attention writes of its output
  int64_t streamed_bytes_ = 0;  // the weights of the last matmul launch (plan_row_fetch)
  std::unique_ptr<cuda::Blas> blas_;  // prefill GEMMs on cuBLAS (bf16 activations), or null
  float* bounce_ = nullptr;
  size_t bounce_n_ = 0;
  uint8_t* reads_ = nullptr;  // queue_read's pinned slots, kReadSlots x kQueuedReadBytes (made at first use)
  cudaEvent_t read_done_[kReadSlots] = {};
};

}  // namespace g4::cuda_impl
