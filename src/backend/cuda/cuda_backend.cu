// The CUDA backend: every op of backend.h as a kernel launch on one Device (cuda_device.h), weights
// copied to device memory once at load (place_weight), activations and KV caches as typed device
// buffers (backend/buffer.h) of BackendOptions::activations (f32 by default, or bf16; kernels
// accumulate in f32, logits are f32). The parts live in their own files: the device
// (cuda_device.h), its memory (cuda_alloc.h), step recording and graph replay (cuda_step.h), the
// profiling and timing observers (cuda_observers.h), the kernels by concern (cuda_kernels.h), the
// prefill GEMMs on cuBLAS (cuda_blas.h) and the argument plumbing (cuda_backend_args.h).
//
// Every op goes through launch(name, launcher, args...): the launcher is a cuda:: function and
// args are exactly what it is called with, so a recorded step's key (cuda_step.h) is derived from
// the launch itself: its name and the value of every argument (pointers by address, structs by
// their bytes; argument structs are value-initialized, so their padding is zero). A decode step is
// one graph launch, with no host sync before the logits are read, MoE layers included (their
// prefill still routes through the host, a sync per MoE layer). Every CUDA call is checked; a failure aborts with the
// call and CUDA's message. Options come from the CLI (BackendOptions); G4_CUDA_SKIP=name,name
// (ablation timings: those launches never run, results are wrong) is the one debug switch read
// from the environment.
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
#include "backend/host_backend.h"
#include "backend/moe_host_routed.h"
#include "core/status.h"
#include "parallel/communicator.h"

namespace g4 {
namespace {

using namespace cuda_args;  // NOLINT: the backend's own argument helpers

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opt) : opt_(opt), dev_(opt.device), mem_(dev_), tables_(mem_) {
    // Row-exact (batch-invariant) steps run without graphs: with 48 batch-invariant streams one
    // stream's tokens differed when its steps were replayed from graphs, while the same steps
    // launched directly are exact (docs/cuda-notes.md, stops 39 and 41). G4_CUDA_GRAPH_DEBUG
    // records them anyway (cuda_step.h).
    const bool graphs = opt.graphs && (!opt.row_exact || cuda::graph_debug() > 0);
    rec_ = std::make_unique<cuda::StepRecorder>(dev_.stream(), graphs);
    seqs_ = std::make_unique<cuda::SeqTables>(*rec_, mem_, [this](const int32_t* host, size_t n, int32_t* d) {
      from_host(host, n, Buf(d, DType::I32, int64_t(n), dev_.id()));
    });
    cuda::set_tensor_cores(opt.tensor_cores);
    if (opt.profile) profile_ = cuda::make_op_profile();
    if (opt.timing) timer_ = cuda::make_step_timer();
    if (opt.activations == DType::BF16 && opt.int8_dots) q8_ = cuda::q8_act_in(mem_.alloc(cuda::q8_scratch_bytes()));
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
  bool prefill_on_blas() const { return blas_ != nullptr; }

  WeightView place_weight(const WeightView& w) override {
    dev_.make_current();
    WeightView d = w;
    d.data = mem_.upload(w.data, view_data_bytes(w));
    if (const size_t sb = view_scale_bytes(w)) {
      d.scales = mem_.upload(w.scales, sb);
      d.biases = mem_.upload(w.biases, sb);
    }
    return d;
  }
  void release_weight(const WeightView& w) override {
    dev_.make_current();
    flush_pending();
    rec_->flush();
    dev_.sync();  // no launch in flight reads it
    if (blas_) blas_->forget(w.data, size_t(w.rows) * size_t(w.cols), mem_);
    for (const void* p : {w.data, w.scales, w.biases}) mem_.free(const_cast<void*>(p), /*deferred=*/false);
  }

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
  void read_bytes(const Buf& src_b, size_t bytes, void* dst) override {
    dev_.make_current();
    flush_pending();
    rec_->flush();
    if (!bytes) return;
    if (bytes > bounce_n_) {  // pinned bounce buffer: a full-speed copy, then a host memcpy
      if (bounce_) G4_CUDA(cudaFreeHost(bounce_));
      G4_CUDA(cudaMallocHost(&bounce_, bytes));
      bounce_n_ = bytes;
    }
    G4_CUDA(cudaMemcpyAsync(bounce_, src_b.data, bytes, cudaMemcpyDeviceToHost, dev_.stream()));
    dev_.sync();
    std::memcpy(dst, bounce_, bytes);
    if (timer_) timer_->output_read();
  }
  void write_bytes(const void* src, size_t bytes, const Buf& dst_b) override {
    dev_.make_current();
    flush_pending();
    void* dst = dst_b.data;
    if (!bytes || rec_->stage_copy(src, bytes, dst)) return;
    rec_->flush();
    G4_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, dev_.stream()));
    dev_.sync();  // src may go away when this returns
  }
  void copy_bytes(const Buf& src_b, size_t bytes, const Buf& dst_b) override {
    if (!bytes) return;
    launch("copy", copy_device, static_cast<const void*>(src_b.data), bytes, dst_b.data);
  }

  void embed(const WeightView& E, const Buf& ids_b, int n, float scale, ActPrecision P, const Buf& out_b) override {
    const int32_t* ids = I(ids_b);
    void* out = out_b.data;
    const DType t = act_type({&out_b});
    const cuda::DevWeight e = dev(E);
    step_rows_ = n;  // every forward step starts with its embedding: the step's row count
    launch("embed", cuda::embed, e, ids, n, scale, out, t);
  }
  void matmul(const Buf& x_b, int M, const WeightView& W, ActPrecision P, const Buf& y_b) override {
    const void* x = x_b.data;
    void* y = y_b.data;
    const DType xt = act_type({&x_b}), yt = act_type({&y_b});
    G4_CHECK((yt == xt || yt == DType::F32) && "cuda matmul: y is of x's type or f32");
    const cuda::DevWeight w = dev(W);
    if (profile_) label_ = "matmul " + std::to_string(w.rows) + "x" + std::to_string(w.cols) + " M=" + std::to_string(M);
    // Op 20 ("big_matmul", >= 64Ki rows: the LM head) only to tell it apart in G4_CUDA_SKIP ablations.
    const char* op = w.rows >= 65536 ? "big_matmul" : "matmul";
    if (q8_rows(M, w) && pending_.y && x == pending_.resid) {  // may take the deferred epilogue
      cuda::MatArgs a = mat_args(x_b, InputNorm{}, M, w);
      a.yt = yt;
      a.n = 1;
      a.w[0] = w;
      a.y[0] = y;
      pending_.take_into(a, M, false);
      if (a.pre_y) return launch(op, cuda::matmuls, a, M);
    }
    if (M > 1 && blas_ && !q8_rows(M, w)) {
      cuda::MatArgs a = mat_args(x_b, InputNorm{}, M, w);
      a.yt = yt;
      a.n = 1;
      a.w[0] = w;
      a.y[0] = y;
      if (launch_blas(op, a, M, 0)) return;
    }
    const cuda::Q8Act q8 = q8_rows(M, w) ? q8_ : cuda::Q8Act{};
    launch(op, cuda::matmul, x, xt, M, w, y, yt, q8);
  }
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
  void rope(const Buf& x_b, int rows, int heads, int head_dim, int pos0, const RopeTable& t, ActPrecision P) override {
    void* x = x_b.data;
    const DType at = act_type({&x_b});
    const float* inv = tables_.inv_freq(t.inv_freq);
    const float ps = t.position_scale;
    const cuda::Dyn p = rec_->dyn(pos0);
    launch("rope", cuda::rope, x, rows, heads, head_dim, p, inv, ps, at);
  }
  bool supports_kv_quant() const override { return true; }
  bool supports_image_blocks() const override { return true; }
  void kv_write(const AttnSeq& s, const Buf& k_b, const Buf& v_b) override {
    const KvBuffer& kv = s.kv;
    const int hk = kv.n_kv_heads, hd = kv.head_dim, row0 = s.row0, n = s.n, cap = kv.capacity, win = kv.window;
    const void *k = k_b.data, *v = v_b.data;
    void *kc = kv.k.data, *vc = kv.v.data;
    const DType t = act_type({&k_b, &v_b, &kv.k, &kv.v});
    const cuda::KvQuantArgs q = quant_args(kv);
    const cuda::Dyn p = rec_->dyn(s.pos0);
    const int32_t* table = kv.table;
    const int shift = block_shift(kv);
    launch("kv_write", cuda::kv_write, k, v, row0, n, p, hk, hd, cap, win, table, shift, kc, vc, q, t);
    record_positions(s);
  }
  void attention(const Buf& q_b, int H, const std::vector<AttnSeq>& seqs, float scale, ActPrecision P,
                 const Buf& out_b) override {
    const void* q = q_b.data;
    void* out = out_b.data;
    const DType t = act_type({&q_b, &out_b});
    // Prefill-sized sequences: the tensor-core kernel, one launch each; the rest (decode rows):
    // one launch over all of them.
    std::vector<AttnSeq> batch;
    for (const AttnSeq& sq : seqs) {
      const KvBuffer& kv = sq.kv;
      G4_CHECK(kv.head_dim <= 512 && "cuda attention: head_dim above 512");
      G4_CHECK(kv.quantized() || act_type({&kv.k, &kv.v}) == t);
      cuda::AttnArgs a{};  // value-initialized: its bytes are part of the step's key
      a.row0 = sq.row0;
      a.n = sq.n;
      a.k = kv.k.data;
      a.v = kv.v.data;
      a.capacity = kv.capacity;
      a.n_kv_heads = kv.n_kv_heads;
      a.head_dim = kv.head_dim;
      a.window = kv.window;
      a.table = kv.table;
      a.block_shift = block_shift(kv);
      a.quant = quant_args(kv);
      a.t = t;
      // Row-exact: a prompt chunk's rows on the decode kernel too, so a row's bits do not depend
      // on the chunk it came in (a prefix-cache hit moves the chunk boundaries).
      if (!cuda::flash_attention_applies(a) || (opt_.row_exact && sq.n <= kRowExactMaxRows)) {
        batch.push_back(sq);
        continue;
      }
      a.pos0 = rec_->dyn(sq.pos0);
      a.blocks = sq.blocks ? seqs_->blocks(sq.blocks, sq.n) : nullptr;
      launch("flash_attention", cuda::flash_attention, q, H, a, scale, out);
    }
    if (batch.empty()) return;
    const KvBuffer& kv0 = batch[0].kv;
    cuda::AttnBatch a{};
    a.tab = seqs_->table(batch);
    a.rows = cuda::batch_rows(batch);
    a.n_kv_heads = kv0.n_kv_heads;
    a.head_dim = kv0.head_dim;
    a.quant_bits = kv0.quant.bits;
    a.t = t;
    // Splits from static bounds (capacity, window), so a recorded step replays at any position.
    // An image block can reach past a sliding window (never past the ring, which holds the call).
    int max_visible = 1;
    for (const AttnSeq& sq : batch) {
      const KvBuffer& kv = sq.kv;
      G4_CHECK(kv.n_kv_heads == kv0.n_kv_heads && kv.head_dim == kv0.head_dim && kv.quantized() == kv0.quantized());
      max_visible = std::max(max_visible, kv.window > 0 && !sq.blocks ? std::min(kv.window, kv.capacity) : kv.capacity);
    }
    // Row-exact: one split count for every row whatever its batch (the batch's largest cache, which
    // sets the count otherwise, changes with the batch).
    const int splits = opt_.row_exact ? cuda::kAttnMaxSplits : cuda::attention_splits(a.rows, H, max_visible);
    const int D = a.head_dim;
    float* partial = splits > 1 ? static_cast<float*>(partial_.get(mem_, size_t(a.rows) * H * splits * (D + 2) * 4, dev_)) : nullptr;
    unsigned* counters = splits > 1 ? static_cast<unsigned*>(counters_.get(mem_, size_t(a.rows) * H * sizeof(unsigned), dev_, true)) : nullptr;
    launch("attention", cuda::attention, q, H, a, scale, splits, partial, counters, out);
  }
  void gelu_mul(const Buf& gate_b, const Buf& up_b, size_t n, ActPrecision P, const Buf& out_b) override {
    const void *gate = gate_b.data, *up = up_b.data;
    void* out = out_b.data;
    const DType t = act_type({&gate_b, &up_b, &out_b});
    launch("gelu_mul", cuda::gelu_mul, gate, up, n, out, t);
  }
  void gelu_mul_ggml(const Buf& gate_b, const Buf& up_b, size_t n, const Buf& out_b) override {
    const void *gate = gate_b.data, *up = up_b.data;
    void* out = out_b.data;
    const DType at = act_type({&gate_b, &up_b, &out_b});
    const uint16_t* t = tables_.gelu_table();
    launch("gelu_mul_ggml", cuda::gelu_mul_ggml, gate, up, n, t, out, at);
  }
  void add(const Buf& a_b, const Buf& b_b, size_t n, ActPrecision P, const Buf& y_b) override {
    const void *a = a_b.data, *b = b_b.data;
    void* y = y_b.data;
    const DType t = act_type({&a_b, &b_b, &y_b});
    launch("add", cuda::add, a, b, n, y, t);
  }
  void scale(const Buf& a_b, float f, size_t n, ActPrecision P, const Buf& y_b) override {
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
  void all_reduce(Communicator& c, const Buf& y_b, size_t n) override {
    if (!c.on_device()) return Backend::all_reduce(c, y_b, n);
    Communicator* comm = &c;
    void* y = y_b.data;
    const DType t = y_b.dtype;
    launch("all_reduce", cuda::collective_all_reduce, comm, y, n, t);
  }
  void all_gather(Communicator& c, const Buf& send_b, size_t n, const Buf& recv_b) override {
    if (!c.on_device()) return Backend::all_gather(c, send_b, n, recv_b);
    Communicator* comm = &c;
    const void* send = send_b.data;
    void* recv = recv_b.data;
    const DType t = send_b.dtype;
    launch("all_gather", cuda::collective_all_gather, comm, send, n, t, recv);
  }
  void place_cols(const Buf& src_b, int rows, int n, const Buf& dst_b, int dst_dim, int off) override {
    G4_CHECK(src_b.dtype == dst_b.dtype && off >= 0 && off + n <= dst_dim && "place_cols: shapes or dtypes");
    const void* src = src_b.data;
    void* dst = dst_b.data;
    const size_t es = dtype_size(src_b.dtype);
    launch("place_cols", cuda::place_cols, src, rows, n, dst, dst_dim, off, es);
  }
  void norm_add(const Buf& x_b, const Buf& o_b, int rows, int dim, const float* w, float eps,
                ActPrecision P) override {
    void *x = x_b.data, *o = o_b.data;
    const DType t = act_type({&x_b, &o_b});
    launch("norm_add", cuda::norm_add, x, o, rows, dim, w, eps, t);
  }
  void norm_rope(const Buf& x_b, int heads, int head_dim, const float* w, float eps, const std::vector<AttnSeq>& seqs,
                 const RopeTable& t, ActPrecision P) override {
    const DType at = act_type({&x_b});
    const float* inv = tables_.inv_freq(t.inv_freq);
    const float ps = t.position_scale;
    for (const AttnSeq& sq : seqs) {
      void* xs = x_b.at(int64_t(sq.row0) * heads * head_dim).data;
      const int n = sq.n;
      const cuda::Dyn p = rec_->dyn(sq.pos0);
      launch("norm_rope", cuda::norm_rope, xs, n, heads, head_dim, w, eps, p, inv, ps, at);
    }
  }
  void matmul_norm_add(const Buf& x_b, int M, const WeightView& W, const Buf& y_b, const Buf& resid_b,
                       const float* w, float eps, ActPrecision P, const LoraApply* lora) override {
    if (lora) {  // the adapters' products between the matmul and the norm: the separate ops
      Backend::matmul_norm_add(x_b, M, W, y_b, resid_b, w, eps, P, lora);
      return;
    }
    // Batched decode on the few-row tensor-core kernel or cuBLAS (no fused epilogue): the norm_add
    // is left pending for the next op (the next input norm takes it: PendingPost).
    if (batched_rows(x_b, M, dev(W))) {
      matmul(x_b, M, W, P, y_b);
      pending_ = cuda::PendingPost{y_b.data, resid_b.data, act_type({&x_b, &y_b, &resid_b}), int(W.rows), w, eps, M};
      return;
    }
    // The int8 GEMVs (one row, or the rows of a row-exact launch) leave the post-norm pending.
    const bool defer = q8_rows(M, dev(W)) && cuda::q8_post_deferrable(dev(W));
    // Prefill: the row-parallel norm_add kernel after the matmul.
    if (M > cuda::kEpilogueMaxRows && !defer) {
      Backend::matmul_norm_add(x_b, M, W, y_b, resid_b, w, eps, P);
      return;
    }
    void *y_scratch = y_b.data, *x_resid = resid_b.data;
    cuda::MatArgs a = mat_args(x_b, InputNorm{}, M, dev(W));
    G4_CHECK(act_type({&x_b, &y_b, &resid_b}) == a.xt);
    a.n = 1;
    a.w[0] = dev(W);
    a.y[0] = y_scratch;
    a.resid = x_resid;
    a.post_w = w;
    a.post_eps = eps;
    a.counter = static_cast<unsigned*>(epilogue_counter_.get(mem_, sizeof(unsigned), dev_, true));
    if (profile_) label_ = "matmul_norm_add " + std::to_string(W.rows) + "x" + std::to_string(W.cols) + " M=" +
                      std::to_string(M);
    a.defer_post = defer;
    launch("matmul_norm_add", cuda::matmuls, a, M);
    if (defer) pending_ = cuda::PendingPost{y_scratch, x_resid, a.xt, int(W.rows), w, eps, M, 1.f, true};
  }
  void attn_prep(const Buf& q_b, int H, const Buf& k_b, const Buf& v_b, int Hk, int head_dim, const float* q_norm_w,
                 const float* k_norm_w, bool v_norm, float eps, const std::vector<AttnSeq>& seqs, const RopeTable& t,
                 ActPrecision P) override {
    if (seqs.empty()) return;
    const bool has_k = bool(k_b);
    const DType at = act_type({&q_b, &k_b, &v_b});
    for (const AttnSeq& sq : seqs) {
      const KvBuffer& kv = sq.kv;
      if (!has_k) continue;
      if (!kv.quantized()) G4_CHECK(act_type({&kv.k, &kv.v}) == at);
      G4_CHECK(kv.n_kv_heads == Hk && kv.head_dim == head_dim);
      if (kv.quantized()) G4_CHECK(head_dim <= 512 && head_dim % kv.quant.group_size == 0);
    }
    cuda::AttnPrepArgs a{};
    a.t = at;
    a.q = q_b.data;
    a.k = has_k ? k_b.data : nullptr;
    a.v = has_k ? v_b.data : nullptr;
    a.H = H;
    a.Hk = has_k ? Hk : 0;
    a.head_dim = head_dim;
    a.q_norm_w = q_norm_w;
    a.k_norm_w = k_norm_w;
    a.v_norm = v_norm;
    a.eps = eps;
    a.inv_freq = tables_.inv_freq(t.inv_freq);
    a.position_scale = t.position_scale;
    a.tab = seqs_->table(seqs);
    const int rows = cuda::batch_rows(seqs);
    launch("attn_prep", cuda::attn_prep, a, rows);
    if (has_k)
      for (const AttnSeq& sq : seqs) record_positions(sq);
  }
  void norm_matmuls(const Buf& x_b, int M, const InputNorm& norm, std::initializer_list<MatOut> outs,
                    ActPrecision P) override {
    if (outs.size() == 0) return;
    for (const MatOut& o : outs)
      if (o.lora) {  // the adapters read the normed input: the separate ops
        Backend::norm_matmuls(x_b, M, norm, outs, P);
        return;
      }
    const int64_t cols = outs.begin()->w->cols;
    bool q8 = true;  // every weight on the int8 GEMVs (their prepare norms the rows)
    for (const MatOut& o : outs) q8 = q8 && q8_rows(M, dev(*o.w));
    if (!q8 && !blas_rows(x_b, M, cols) && !small_rows(x_b, M, cols) &&
        !norm_fits(norm, M, cols)) {  // too wide to norm in shared memory
      Backend::norm_matmuls(x_b, M, norm, outs, P);
      return;
    }
    // One launch per run of consecutive weights of one format (q/k/v usually share theirs).
    cuda::MatArgs a = normed_args(x_b, M, norm, *outs.begin()->w, P);
    for (auto it = outs.begin(); it != outs.end(); ++it) {
      G4_CHECK(act_type({&it->y}) == a.xt);
      a.w[a.n] = dev(*it->w);
      a.y[a.n] = it->y.data;
      ++a.n;
      const auto next = it + 1;
      if (next == outs.end() || a.n == 3 || next->w->fmt != it->w->fmt || next->w->cols != it->w->cols) {
        launch_matmuls(a, M);
        a.n = 0;
      }
    }
  }
  void gate_up_gelu(const Buf& x_b, int M, const InputNorm& norm, const WeightView& G, const WeightView& U,
                    bool ggml_table, ActPrecision P, const Buf& gate_b, const Buf& up_b, const LoraApply* lora_gate,
                    const LoraApply* lora_up) override {
    if (lora_gate || lora_up || G.fmt != U.fmt || G.rows != U.rows || G.cols != U.cols || G.group_size != U.group_size || G.bits != U.bits ||
        G.scale_dtype != U.scale_dtype ||
        (!q8_rows(M, dev(G)) && !blas_rows(x_b, M, G.cols) &&
         !small_rows(x_b, M, G.cols) && !norm_fits(norm, M, G.cols))) {
      Backend::gate_up_gelu(x_b, M, norm, G, U, ggml_table, P, gate_b, up_b, lora_gate, lora_up);  // separate launches
      return;
    }
    void* gate_out = gate_b.data;
    cuda::MatArgs a = normed_args(x_b, M, norm, G, P);
    G4_CHECK(act_type({&gate_b}) == a.xt);
    a.n = 1;
    a.w[0] = dev(G);
    a.w2 = dev(U);
    a.y[0] = gate_out;
    a.table = ggml_table ? tables_.gelu_table() : nullptr;
    pending_.take_into(a, M, true);
    if (profile_) label_ = "gate_up_gelu " + std::to_string(G.rows) + "x" + std::to_string(G.cols) + " M=" + std::to_string(M);
    if (launch_blas("gate_up_gelu", a, M, a.table ? 2 : 1)) return;
    launch("gate_up_gelu", cuda::gate_up_gelu, a, M);
  }
  void top_k(const Buf& x_b, int rows, int n, int k, const Buf& vals_b, const Buf& idx_b, const Buf& lse_b) override {
    const float* x = F(x_b);
    float *vals = F(vals_b), *lse = F(lse_b);
    int32_t* idx = I(idx_b);
    G4_CHECK(k > 0 && k <= n && k <= 1024);
    launch("top_k", cuda::top_k, x, rows, n, k, vals, idx, lse);
  }
  void mask_logits(const Buf& x_b, int n, const Buf& allow_b, const Buf& rows_b, int count) override {
    launch("mask_logits", cuda::mask_logits, F(x_b), n, reinterpret_cast<const uint32_t*>(I(allow_b)), I(rows_b),
           count);
  }
  void argmax(const Buf& x_b, int rows, int n, const Buf& out_b) override {
    const float* x = F(x_b);
    int32_t* out = I(out_b);
    // Per-row 64-bit slots, then per-row counters: zeros that the kernel leaves zero.
    if (size_t(rows) > argmax_rows_) argmax_rows_ = size_t(rows);
    auto* slots = static_cast<unsigned long long*>(argmax_.get(mem_, argmax_rows_ * 12, dev_, true));
    auto* counters = reinterpret_cast<unsigned*>(slots + argmax_rows_);
    launch("argmax", cuda::argmax, x, rows, n, slots, counters, out);
  }
  // MoE (26B-A4B), on the device without a host sync: decode (rows <= kMoeDeviceRows) runs the
  // routed experts' GEMVs (cuda_moe.cu), reading only the chosen experts' rows, so the step
  // replays as one graph; prefill with bf16 activations groups the items by expert on the device
  // and runs grouped tensor-core GEMMs (cuda_moe_grouped.cu). Otherwise (f32 activations, mixed
  // formats) the routing comes back to the host, which runs one matmul per expert.
  static constexpr int kMoeDeviceRows = 8;  // kRowExactMaxRows when row-exact
  void router_topk(const Buf& scores, int rows, int E, int k, const float* per_expert_scale, ActPrecision P,
                   const Buf& idx, const Buf& weights) override {
    if (cuda::router_topk_applies(E, k)) {
      const void* sc = scores.data;
      const DType st = act_type({&scores});
      launch("router_topk", cuda::router_topk, sc, st, rows, E, k, per_expert_scale, I(idx), F(weights));
      return;
    }
    std::vector<float> hs(size_t(rows) * E), hp(static_cast<size_t>(E)), hw(size_t(rows) * k);
    std::vector<int32_t> hi(size_t(rows) * k);
    to_host(scores, hs.size(), hs.data());
    to_host(per_expert_scale, hp.size(), hp.data());
    host_ops_->router_topk(hs.data(), rows, E, k, hp.data(), P, hi.data(), hw.data());  // the reference's rule
    from_host(hi.data(), hi.size(), idx);
    from_host(hw.data(), hw.size(), weights);
  }
  void moe_experts(const Buf& x, int rows, int d, const Buf& idx, const Buf& w_b, int k,
                   const std::vector<WeightView>& gate, const std::vector<WeightView>& up,
                   const std::vector<WeightView>& down, ActPrecision P, const Buf& out_b) override {
    if (one_format(gate, gate[0].fmt) && one_format(up, gate[0].fmt) && one_format(down, down[0].fmt) &&
        moe_experts_on_device(x, rows, d, idx, w_b, k, gate, up, down, out_b))
      return;
    const Buf y = host_moe_.run(*this, x, rows, d, idx, k, gate, up, down, P);
    const void* yv = y.data;
    const float* w = F(w_b);
    void* out = out_b.data;
    const DType t = act_type({&y, &out_b});
    launch("moe_combine", cuda::moe_combine, yv, w, rows, k, d, out, t);
  }
  void sync() override {
    dev_.make_current();
    flush_pending();
    rec_->flush();
    dev_.sync();
    mem_.collect();
  }
  void begin_step() override {
    dev_.make_current();   // the calling thread's GPU (a tensor-parallel rank runs on a thread of its own)
    if (profile_) return;  // profiled ops run one by one
    rec_->begin();         // waits for the previous step
    seqs_->begin_step();
    mem_.collect();
    if (timer_) timer_->step_begin();
  }
  void end_step() override {
    dev_.make_current();
    seqs_->end_step();
    flush_pending();
    if (timer_) timer_->step_logged(dev_.stream());
    rec_->end();
    if (timer_) timer_->step_launched(dev_.stream());
  }

 private:
  cuda::PendingPost pending_;      // a matmul_norm_add's post-norm (cuda_pending.h)
  cuda::PendingCombine combine_;   // the device MoE path's combination (cuda_pending.h)
  static constexpr int kPdlMaxRows = 64;
  int step_rows_ = 0;  // rows of the step being logged (embed sets it)
  // The pending epilogues no op took, launched alone (before every launch, host copy, sync and
  // step end).
  void flush_pending() {
    if (combine_) {
      const cuda::PendingCombine c = combine_;
      combine_ = cuda::PendingCombine{};
      launch("moe_combine", cuda::moe_combine, c.y, c.w, c.rows, c.k, c.d, c.out, c.t);
    }
    if (!pending_) return;
    const cuda::PendingPost p = pending_;
    pending_ = cuda::PendingPost{};
    const void* y = p.y;
    if (p.q8) launch("post_norm_add", cuda::post_norm_add, y, p.resid, p.t, p.n, p.w, p.eps, p.rows);
    else launch("norm_add", cuda::norm_add, p.resid, y, p.rows, p.n, p.w, p.eps, p.t);
    if (p.scale != 1.f)
      launch("scale", cuda::scale, static_cast<const void*>(p.resid), p.scale, size_t(p.rows) * p.n, p.resid, p.t);
  }

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
                             const std::vector<WeightView>& gate, const std::vector<WeightView>& up,
                             const std::vector<WeightView>& down, const Buf& out_b) {
    const int items = rows * k, E = int(gate.size());
    const int64_t hidden = held_expert_width(gate);
    if (hidden == 0) return false;  // no expert held here: the host-routed path's zeros
    const DType t = act_type({&x, &out_b});
    void* h = moe_h_.get(mem_, size_t(items) * size_t(hidden) * dtype_size(t), dev_);
    void* y = moe_dy_.get(mem_, size_t(items) * size_t(d) * dtype_size(t), dev_);
    const bool decode = rows <= (opt_.row_exact ? kRowExactMaxRows : kMoeDeviceRows);
    cuda::MoeMatArgs a{};
    a.x = x.data;
    a.xt = t;
    a.x_div = k;
    a.w = experts_.table(gate);
    a.w2 = experts_.table(up);
    a.idx = I(idx);
    a.y = h;
    a.w0 = dev(cuda::ExpertTables::first_held(gate));
    a.w20 = dev(cuda::ExpertTables::first_held(up));
    a.q8 = decode ? q8_ : cuda::Q8Act{};
    cuda::MoeMatArgs b{};
    b.x = h;
    b.xt = t;
    b.x_div = 1;
    b.w = experts_.table(down);
    b.idx = I(idx);
    b.y = y;
    b.w0 = dev(cuda::ExpertTables::first_held(down));
    b.q8 = a.q8;
    if (decode) {
      launch("moe_gate_up", cuda::moe_matmul, a, items, k, hidden, gate[0].fmt, true);
      launch("moe_down", cuda::moe_matmul, b, items, k, int64_t(d), down[0].fmt, false);
    } else {
      if (!cuda::moe_grouped_applies(a, E, hidden) || !cuda::moe_grouped_applies(b, E, d)) return false;
      a.rows16 = rows16(gate) && rows16(up);  // the grouped kernels' Q4_K word loads (prefill only)
      b.rows16 = rows16(down);
      const size_t slots = cuda::moe_group_slots(items, E), blocks = size_t(cuda::moe_group_max_blocks(items, E));
      auto* g0 = static_cast<int32_t*>(moe_groups_.get(mem_, (slots + blocks + 1) * sizeof(int32_t), dev_));
      const cuda::MoeGroups g{g0, g0 + slots, g0 + slots + blocks};
      launch("moe_group", cuda::moe_group, static_cast<const int32_t*>(I(idx)), items, E, g);
      if (profile_) label_ = "moe_gate_up grouped M=" + std::to_string(rows);
      launch("moe_gate_up", cuda::moe_grouped_matmul, a, g, items, E, hidden, gate[0].fmt, true);
      if (profile_) label_ = "moe_down grouped M=" + std::to_string(rows);
      launch("moe_down", cuda::moe_grouped_matmul, b, g, items, E, int64_t(d), down[0].fmt, false);
    }
    // The combination is left pending: moe_exit takes it into its kernel (else the next launch
    // runs it first, flush_pending).
    combine_ = cuda::PendingCombine{y, F(w_b), out_b.data, rows, k, d, t};
    return true;
  }
  // A matmul launch's arguments over M rows of input x into weights like w; the outputs are of
  // x's type. The int8 GEMVs' scratch is set where they take the launch (q8_rows).
  cuda::MatArgs mat_args(const Buf& x, const InputNorm& norm, int M, const cuda::DevWeight& w) const {
    cuda::MatArgs a{};
    a.x = x.data;
    a.xt = act_type({&x});
    a.yt = a.xt;
    a.norm_w = norm.w;
    a.eps = norm.eps;
    if (q8_rows(M, w)) a.q8 = q8_;
    return a;
  }
  // A decode row (M = 1) into K-quant matmuls: normed once into norm.scratch by one small kernel,
  // instead of by each of the matmul's thousands of blocks in its prologue (which cost more than
  // the weights' reads). Returns the matmul's arguments: the scratch read as is, or x normed in
  // the kernel (always for the int8 GEMVs, which norm in their prepare launch).
  // Rows for the few-row tensor-core kernel (no input norm of its own) are normed into
  // norm.scratch the same way.
  cuda::MatArgs normed_args(const Buf& x, int M, const InputNorm& norm, const WeightView& W, ActPrecision P) {
    if (norm.w && norm.scratch && batched_rows(x, M, dev(W))) {
      if (pending_.y && !pending_.q8 && pending_.rows == M && pending_.resid == x.data && pending_.n == W.cols &&
          pending_.t == act_type({&x, &norm.scratch})) {  // the pending residual update, then this norm
        const cuda::PendingPost p = pending_;
        pending_ = cuda::PendingPost{};
        void* xn = norm.scratch.data;
        launch("norm_add_norm", cuda::norm_add_norm, p.resid, p.y, p.rows, p.n, p.w, p.eps, p.scale, norm.w, norm.eps,
               xn, p.t);
      } else {
        rms_norm(x, M, int(W.cols), norm.w, norm.eps, P, norm.scratch);
      }
      return mat_args(norm.scratch, InputNorm{}, M, dev(W));
    }
    if (M != 1 || !norm.w || !norm.scratch || (W.fmt != WFormat::GgufQ4_K && W.fmt != WFormat::GgufQ6_K) ||
        (q8_.q && cuda::q8_gemv_supports(dev(W))))
      return mat_args(x, norm, M, dev(W));
    rms_norm(x, 1, int(W.cols), norm.w, norm.eps, P, norm.scratch);
    return mat_args(norm.scratch, InputNorm{}, M, dev(W));
  }
  void launch_matmuls(cuda::MatArgs a, int M) {
    pending_.take_into(a, M, false);
    if (profile_) label_ = "matmuls x" + std::to_string(a.n) + " " + std::to_string(a.w[0].rows) + "x" +
                           std::to_string(a.w[0].cols) + " M=" + std::to_string(M);
    if (launch_blas("norm_matmuls", a, M, 0)) return;
    launch("norm_matmuls", cuda::matmuls, a, M);
  }
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
  bool launch_blas(const char* op, const cuda::MatArgs& a, int M, int act) {
    if (a.q8.q) return false;  // the int8 GEMVs' rows (q8_rows)
    const int cached_min = opt_.blas_cached_min_rows > 0 ? opt_.blas_cached_min_rows : cuda::kBlasCachedMinRows;
    if (!blas_ || !blas_->applies(a, M, std::min(cached_min, cuda::kBlasMinRows))) return false;
    if (opt_.bf16_weight_cache_gib > 0)  // before the launch is logged: the copies exist when it runs
      blas_->cache_weights(dev_.stream(), a, act, mem_, size_t(opt_.bf16_weight_cache_gib) << 30);
    if (M < cuda::kBlasMinRows && !blas_->reads_bf16(a, act)) return false;
    launch(op, cuda::blas_matmuls, static_cast<const cuda::Blas*>(blas_.get()), a, M, act);
    return true;
  }
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
  cuda::GrowBuffer moe_h_, moe_dy_;  // device MoE: the items' gated hidden rows and expert outputs
  cuda::GrowBuffer moe_groups_;      // prefill MoE: the items grouped by expert (cuda::MoeGroups)
  cuda::ExpertTables experts_{mem_, dev_};  // the device MoE's expert arrays (zero experts for other ranks')
  size_t argmax_rows_ = 0;
  cuda::Q8Act q8_{};  // the int8 decode scratch (bf16 activations with int8_dots), or all null
  std::unique_ptr<cuda::Blas> blas_;  // prefill GEMMs on cuBLAS (bf16 activations), or null
  float* bounce_ = nullptr;
  size_t bounce_n_ = 0;
};

}  // namespace

bool cuda_step_counts(const Backend& be, CudaStepCounts* out) {
  const auto* cb = dynamic_cast<const CudaBackend*>(&be);
  if (!cb) return false;
  const cuda::StepRecorder::Counts c = cb->step_counts();
  *out = CudaStepCounts{c.replayed, c.captured, c.direct};
  return true;
}

bool cuda_prefill_on_blas(const Backend& be) {
  const auto* cb = dynamic_cast<const CudaBackend*>(&be);
  return cb && cb->prefill_on_blas();
}

std::unique_ptr<Backend> make_cuda_backend(std::string* why, const BackendOptions& opt) {
  if (!cuda::device_usable(opt.device, why)) return nullptr;
  if (opt.activations != DType::F32 && opt.activations != DType::BF16) {
    if (why) *why = "activations are stored as f32 or bf16";
    return nullptr;
  }
  return std::make_unique<CudaBackend>(opt);
}

}  // namespace g4
