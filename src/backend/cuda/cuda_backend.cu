// The CUDA backend: every dense op of backend.h as an f32 kernel (cuda_kernels.cu), weights copied
// to device memory once at load (place_weight), activations and KV caches in device memory as typed
// buffers (backend/buffer.h) of BackendOptions::activations (f32 by default, or bf16; kernels
// accumulate in f32, logits are f32), one device, one stream of its own. Each forward step is recorded
// and, from its second sighting on, replayed as a CUDA graph (cuda_step.h): a decode step is one
// graph launch, with no host sync before the logits are read. Mixture-of-experts layers route
// through the host (a sync per MoE layer). Not yet: a grouped expert GEMM. Every
// CUDA call is checked; a failure aborts with the call and CUDA's message. Options come from the
// CLI (BackendOptions); G4_CUDA_SKIP=op,op (ablation timings: those ops are never launched, results
// are wrong) is the one debug switch read from the environment.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <type_traits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_step.h"
#include "backend/host_backend.h"
#include "core/status.h"

namespace g4 {
namespace {

void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: CUDA error in %s: %s\n", file, line, what, cudaGetErrorString(e));
  std::abort();
}
#define G4_CUDA(call) check((call), #call, __FILE__, __LINE__)
// After kernel launches: launch-configuration errors surface here, faults at the next sync.
#define G4_CUDA_LAUNCHED() check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

size_t view_data_bytes(const WeightView& w) { return size_t(w.rows) * size_t(w.row_bytes); }
size_t view_scale_bytes(const WeightView& w) {
  if (w.fmt != WFormat::MlxAffine || w.group_size <= 0) return 0;
  return size_t(w.rows) * size_t(w.cols / w.group_size) * dtype_size(w.scale_dtype);
}

cuda::DevWeight dev(const WeightView& w) {
  return cuda::DevWeight{w.fmt, w.rows, w.cols, w.row_bytes, static_cast<const uint8_t*>(w.data),
                         w.bits, w.group_size, w.scales, w.biases, w.scale_dtype};
}

// One signature word of a launch argument (cuda_step.h): pointers by address, floats by bits.
template <class T>
uint64_t word(T v) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<uintptr_t>(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    const float f = float(v);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    return bits;
  } else {
    return uint64_t(int64_t(v));
  }
}

// BackendOptions::profile: every op runs directly (no graphs), between two events; at exit, stderr gets
// the device time per op kind (matmuls per weight shape), largest first. For finding where a step's
// time goes; the per-op events themselves add launch gaps, so totals exceed a plain run's.
class OpProfile {
 public:
  ~OpProfile() {
    resolve();
    std::vector<std::pair<std::string, Acc>> rows(acc_.begin(), acc_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double total = 0;
    for (const auto& r : rows) total += r.second.ms;
    std::fprintf(stderr, "cuda profile: %.3f ms of device time in ops\n%-34s %8s %10s %9s %6s\n", total, "op", "calls",
                 "total ms", "us/call", "share");
    for (const auto& [k, a] : rows)
      std::fprintf(stderr, "%-34s %8ld %10.3f %9.2f %5.1f%%\n", k.c_str(), a.n, a.ms, 1e3 * a.ms / double(a.n),
                   100.0 * a.ms / total);
  }
  template <class F>
  void time(cudaStream_t s, std::string key, F&& f) {
    cudaEvent_t a, b;
    G4_CUDA(cudaEventCreate(&a));
    G4_CUDA(cudaEventCreate(&b));
    G4_CUDA(cudaEventRecord(a, s));
    f();
    G4_CUDA(cudaEventRecord(b, s));
    pending_.push_back({std::move(key), a, b});
    if (pending_.size() > 4096) resolve();
  }
  void resolve() {
    for (Pending& p : pending_) {
      G4_CUDA(cudaEventSynchronize(p.b));
      float ms = 0;
      G4_CUDA(cudaEventElapsedTime(&ms, p.a, p.b));
      Acc& a = acc_[p.key];
      a.ms += ms;
      ++a.n;
      cudaEventDestroy(p.a);
      cudaEventDestroy(p.b);
    }
    pending_.clear();
  }

 private:
  struct Pending {
    std::string key;
    cudaEvent_t a, b;
  };
  struct Acc {
    double ms = 0;
    long n = 0;
  };
  std::vector<Pending> pending_;
  std::map<std::string, Acc> acc_;
};

const char* op_name(uint64_t op) {
  static const char* names[] = {"?",   "copy",  "embed",   "matmul",      "rms_norm",   "rope",     "kv_write",
                                "attention", "gelu_mul", "gelu_mul_ggml", "add", "scale", "softcap", "gather_rows",
                                "copy_cols", "norm_add", "norm_rope", "gate_up_gelu", "norm_matmuls", "argmax", "big_matmul", "attn_prep",
                                "matmul_norm_add", "top_k", "moe_combine"};
  return op < sizeof(names) / sizeof(names[0]) ? names[op] : "?";
}

// A buffer that must be f32 (logits, router weights, top-k outputs).
float* F(const Buf& b) {
  if (!b) return nullptr;
  G4_CHECK(b.dtype == DType::F32 && "cuda backend: an f32 buffer expected");
  return static_cast<float*>(b.data);
}
// The activation type shared by buffers (F32 or BF16; the kernels' T, cuda_act.cuh), checked.
DType act_type(std::initializer_list<const Buf*> bufs) {
  DType t = DType::Unknown;
  for (const Buf* b : bufs) {
    if (!*b) continue;
    G4_CHECK((b->dtype == DType::F32 || b->dtype == DType::BF16) && "cuda backend: activations are f32 or bf16");
    G4_CHECK((t == DType::Unknown || t == b->dtype) && "cuda backend: activation buffers of different dtypes");
    t = b->dtype;
  }
  return t == DType::Unknown ? DType::F32 : t;
}
int32_t* I(const Buf& b) {
  if (!b) return nullptr;
  G4_CHECK(b.dtype == DType::I32 && "cuda backend: an I32 buffer expected");
  return static_cast<int32_t*>(b.data);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opt) : opt_(opt) {
    G4_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    rec_ = std::make_unique<cuda::StepRecorder>(stream_, opt.graphs);
    cuda::set_tensor_cores(opt.tensor_cores);
    G4_CUDA(cudaMalloc(&counter_, sizeof(unsigned)));
    G4_CUDA(cudaMemsetAsync(counter_, 0, sizeof(unsigned), stream_));
    if (opt.profile) prof_ = std::make_unique<OpProfile>();
    if (const char* skip = std::getenv("G4_CUDA_SKIP")) {  // ablation: "attention,norm_add": never launch those
      const std::string list = std::string(",") + skip + ",";
      for (uint64_t op = 1; op < 32; ++op)
        if (list.find(std::string(",") + op_name(op) + ",") != std::string::npos) skip_ |= 1u << op;
    }
    timing_ = opt.timing;
    if (timing_) {
      G4_CUDA(cudaEventCreate(&ev_[0]));
      G4_CUDA(cudaEventCreate(&ev_[1]));
    }
  }
  ~CudaBackend() override {
    if (timing_ && !t_wait_.empty()) {
      auto med = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.empty() ? 0.0 : 1e6 * v[v.size() / 2];
      };
      std::fprintf(stderr, "cuda timing: %zu steps, medians per step: host enqueue %.1f us, end_step %.1f us, "
                           "logits wait %.1f us, host between steps %.1f us; device time of the step's work %.1f "
                           "us\n", t_wait_.size(), med(t_enqueue_), med(t_end_), med(t_wait_), med(t_outside_),
                   med(t_gpu_));
    }
    prof_.reset();
    rec_.reset();  // waits for the stream
    free_retired();
    for (void* p : owned_) cudaFree(p);
    if (partial_) cudaFree(partial_);
    if (counters_) cudaFree(counters_);
    cudaFree(counter_);
    if (argmax_slots_) cudaFree(argmax_slots_);
    if (bounce_) cudaFreeHost(bounce_);
    cudaStreamDestroy(stream_);
  }
  std::string name() const override { return "cuda"; }
  // Kernels compute in their buffers' dtype (activation_dtype()); the host backends' bf16 rounding
  // mode P is not emulated, and P is ignored.
  DType activation_dtype() const override { return opt_.activations; }
  cuda::StepRecorder::Counts step_counts() const { return rec_->counts(); }

  WeightView place_weight(const WeightView& w) override {
    WeightView d = w;
    d.data = upload(w.data, view_data_bytes(w));
    if (const size_t sb = view_scale_bytes(w)) {
      d.scales = upload(w.scales, sb);
      d.biases = upload(w.biases, sb);
    }
    return d;
  }

  Buf alloc(DType t, size_t n) override {
    // Whole 4-byte words (byte buffers of quantized KV codes are read as words).
    return Buf(raw_alloc((std::max<size_t>(n, 1) * dtype_size(t) + 3) / 4 * 4), t, int64_t(n), 0);
  }
  using Backend::free;
  void free(void* p) override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!owned_.erase(p)) return;
    }
    if (rec_->active()) retired_.push_back(p);  // a logged launch may still use it
    else G4_CUDA(cudaFree(p));
  }
  void read_bytes(const Buf& src_b, size_t bytes, void* dst) override {
    rec_->flush();
    if (!bytes) return;
    if (bytes > bounce_n_) {  // pinned bounce buffer: a full-speed copy, then a host memcpy
      if (bounce_) G4_CUDA(cudaFreeHost(bounce_));
      G4_CUDA(cudaMallocHost(&bounce_, bytes));
      bounce_n_ = bytes;
    }
    G4_CUDA(cudaMemcpyAsync(bounce_, src_b.data, bytes, cudaMemcpyDeviceToHost, stream_));
    G4_CUDA(cudaStreamSynchronize(stream_));
    std::memcpy(dst, bounce_, bytes);
    if (timing_) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, ev_[0], ev_[1]) == cudaSuccess) t_gpu_.push_back(1e-3 * ms);
      t_wait_.push_back(seconds_since(t_mark_));
      t_mark_ = std::chrono::steady_clock::now();
    }
  }
  void write_bytes(const void* src, size_t bytes, const Buf& dst_b) override {
    void* dst = dst_b.data;
    if (!bytes || rec_->stage_copy(src, bytes, dst)) return;
    rec_->flush();
    G4_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    G4_CUDA(cudaStreamSynchronize(stream_));  // src may go away when this returns
  }
  void copy_bytes(const Buf& src_b, size_t bytes, const Buf& dst_b) override {
    if (!bytes) return;
    const void* src = src_b.data;
    void* dst = dst_b.data;
    launch([=](cudaStream_t s) { G4_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); }, 1, src,
           bytes, dst);
  }

  void embed(const WeightView& E, const Buf& ids_b, int n, float scale, ActPrecision P, const Buf& out_b) override {
    const int32_t* ids = I(ids_b);
    void* out = out_b.data;
    const DType t = act_type({&out_b});
    const cuda::DevWeight e = dev(E);
    launch([=](cudaStream_t s) { cuda::embed(s, e, ids, n, scale, out, t); }, 2, e.data, e.rows, e.cols, ids, n, scale,
           out, int(t));
  }
  void matmul(const Buf& x_b, int M, const WeightView& W, ActPrecision P, const Buf& y_b) override {
    const void* x = x_b.data;
    void* y = y_b.data;
    const DType xt = act_type({&x_b}), yt = act_type({&y_b});
    G4_CHECK((yt == xt || yt == DType::F32) && "cuda matmul: y is of x's type or f32");
    const cuda::DevWeight w = dev(W);
    if (prof_) key_ = "matmul " + std::to_string(w.rows) + "x" + std::to_string(w.cols) + " M=" + std::to_string(M);
    // Op 20 ("big_matmul", >= 64Ki rows: the LM head) only to tell it apart in G4_CUDA_SKIP ablations.
    launch([=](cudaStream_t s) { cuda::matmul(s, x, xt, M, w, y, yt); }, w.rows >= 65536 ? 20 : 3, x, M, w.data,
           w.rows, w.cols, y, int(xt), int(yt));
  }
  void rms_norm(const Buf& x_b, int rows, int dim, const float* w, float eps, ActPrecision P,
                const Buf& y_b) override {
    const void* x = x_b.data;
    void* y = y_b.data;
    const DType t = act_type({&x_b, &y_b});
    launch([=](cudaStream_t s) { cuda::rms_norm(s, x, rows, dim, w, eps, y, t); }, 4, x, rows, dim, w, eps, y, int(t));
  }
  void rope(const Buf& x_b, int rows, int heads, int head_dim, int pos0, const RopeTable& t, ActPrecision P) override {
    void* x = x_b.data;
    const DType at = act_type({&x_b});
    const float* inv = inv_freq_on_device(t);
    const float ps = t.position_scale;
    const cuda::Dyn p = rec_->dyn(pos0);
    launch([=](cudaStream_t s) { cuda::rope(s, x, rows, heads, head_dim, p, inv, ps, at); }, 5, x, rows, heads,
           head_dim, inv, ps, int(at));
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
    launch([=](cudaStream_t st) { cuda::kv_write(st, k, v, row0, n, p, hk, hd, cap, win, kc, vc, q, t); }, 6, k, v,
           row0, n, hk, hd, cap, win, kc, vc, q.bits, q.group, int(q.bf16_params), q.kq, q.vq, q.ks, q.kb, q.vs,
           q.vb, int(t));
    record_positions(s);
  }
  void attention(const Buf& q_b, int H, const std::vector<AttnSeq>& seqs, float scale, ActPrecision P,
                 const Buf& out_b) override {
    const void* q = q_b.data;
    void* out = out_b.data;
    const DType t = act_type({&q_b, &out_b});
    for (const AttnSeq& sq : seqs) {
      const KvBuffer& kv = sq.kv;
      G4_CHECK(kv.head_dim <= 512 && "cuda attention: head_dim above 512");
      // Splits from static bounds (capacity, window), so a recorded step replays at any position.
      // An image block can reach past a sliding window (never past the ring, which holds the call).
      const int max_visible = kv.window > 0 && !sq.blocks ? std::min(kv.window, kv.capacity) : kv.capacity;
      const int splits = cuda::attention_splits(sq.n, H, max_visible);
      float* partial = splits > 1 ? partial_floats(size_t(sq.n) * H * splits * (kv.head_dim + 2)) : nullptr;
      unsigned* counters = splits > 1 ? split_counters(size_t(sq.n) * H) : nullptr;
      G4_CHECK(kv.quantized() || act_type({&kv.k, &kv.v}) == t);
      const cuda::AttnArgs a{sq.row0, sq.n,        rec_->dyn(sq.pos0), kv.k.data,     kv.v.data,
                             kv.capacity, kv.n_kv_heads, kv.head_dim,   kv.window,     quant_args(kv),
                             sq.blocks ? device_blocks(sq.blocks, sq.n) : nullptr, t};
      const cuda::KvQuantArgs& qa = a.quant;
      launch([=](cudaStream_t s) { cuda::attention(s, q, H, a, scale, splits, partial, counters, out); }, 7, q, H,
             a.row0, a.n, a.k, a.v, a.capacity, a.n_kv_heads, a.head_dim, a.window, scale, splits, partial, counters,
             out, qa.bits, qa.group, qa.kq, qa.vq, qa.ks, qa.kb, qa.vs, qa.vb, a.blocks, int(t));
    }
  }
  void gelu_mul(const Buf& gate_b, const Buf& up_b, size_t n, ActPrecision P, const Buf& out_b) override {
    const void *gate = gate_b.data, *up = up_b.data;
    void* out = out_b.data;
    const DType t = act_type({&gate_b, &up_b, &out_b});
    launch([=](cudaStream_t s) { cuda::gelu_mul(s, gate, up, n, out, t); }, 8, gate, up, n, out, int(t));
  }
  void gelu_mul_ggml(const Buf& gate_b, const Buf& up_b, size_t n, const Buf& out_b) override {
    const void *gate = gate_b.data, *up = up_b.data;
    void* out = out_b.data;
    const DType at = act_type({&gate_b, &up_b, &out_b});
    const uint16_t* t = gelu_table();
    launch([=](cudaStream_t s) { cuda::gelu_mul_ggml(s, gate, up, n, t, out, at); }, 9, gate, up, n, t, out, int(at));
  }
  void add(const Buf& a_b, const Buf& b_b, size_t n, ActPrecision P, const Buf& y_b) override {
    const void *a = a_b.data, *b = b_b.data;
    void* y = y_b.data;
    const DType t = act_type({&a_b, &b_b, &y_b});
    launch([=](cudaStream_t s) { cuda::add(s, a, b, n, y, t); }, 10, a, b, n, y, int(t));
  }
  void scale(const Buf& a_b, float f, size_t n, ActPrecision P, const Buf& y_b) override {
    const void* a = a_b.data;
    void* y = y_b.data;
    const DType t = act_type({&a_b, &y_b});
    launch([=](cudaStream_t s) { cuda::scale(s, a, f, n, y, t); }, 11, a, f, n, y, int(t));
  }
  void softcap(const Buf& x_b, size_t n, float cap, ActPrecision P) override {
    void* x = x_b.data;
    const DType t = act_type({&x_b});
    launch([=](cudaStream_t s) { cuda::softcap(s, x, n, cap, t); }, 12, x, n, cap, int(t));
  }
  void gather_rows(const Buf& src_b, const Buf& idx_b, int n, int dim, const Buf& dst_b) override {
    const void* src = src_b.data;
    const int32_t* idx = I(idx_b);
    void* dst = dst_b.data;
    const DType t = act_type({&src_b, &dst_b});
    launch([=](cudaStream_t s) { cuda::gather_rows(s, src, idx, n, dim, dst, t); }, 13, src, idx, n, dim, dst, int(t));
  }
  void copy_cols(const Buf& src_b, int rows, int src_dim, int off, int n, const Buf& dst_b) override {
    const void* src = src_b.data;
    void* dst = dst_b.data;
    const DType t = act_type({&src_b, &dst_b});
    launch([=](cudaStream_t s) { cuda::copy_cols(s, src, rows, src_dim, off, n, dst, t); }, 14, src, rows, src_dim,
           off, n, dst, int(t));
  }
  void norm_add(const Buf& x_b, const Buf& o_b, int rows, int dim, const float* w, float eps,
                ActPrecision P) override {
    void *x = x_b.data, *o = o_b.data;
    const DType t = act_type({&x_b, &o_b});
    launch([=](cudaStream_t s) { cuda::norm_add(s, x, o, rows, dim, w, eps, t); }, 15, x, o, rows, dim, w, eps, int(t));
  }
  void norm_rope(const Buf& x_b, int heads, int head_dim, const float* w, float eps, const std::vector<AttnSeq>& seqs,
                 const RopeTable& t, ActPrecision P) override {
    const DType at = act_type({&x_b});
    const float* inv = inv_freq_on_device(t);
    const float ps = t.position_scale;
    for (const AttnSeq& sq : seqs) {
      void* xs = x_b.at(int64_t(sq.row0) * heads * head_dim).data;
      const int n = sq.n;
      const cuda::Dyn p = rec_->dyn(sq.pos0);
      launch([=](cudaStream_t s) { cuda::norm_rope(s, xs, n, heads, head_dim, w, eps, p, inv, ps, at); }, 16, xs, n,
             heads, head_dim, w, eps, inv, ps, int(at));
    }
  }
  void matmul_norm_add(const Buf& x_b, int M, const WeightView& W, const Buf& y_b, const Buf& resid_b,
                       const float* w, float eps, ActPrecision P) override {
    if (M > cuda::kEpilogueMaxRows) {  // prefill: the row-parallel norm_add kernel after the matmul
      Backend::matmul_norm_add(x_b, M, W, y_b, resid_b, w, eps, P);
      return;
    }
    const void* x = x_b.data;
    void *y_scratch = y_b.data, *x_resid = resid_b.data;
    cuda::MatArgs a = mat_args(x_b, InputNorm{});
    G4_CHECK(act_type({&x_b, &y_b, &resid_b}) == a.xt);
    a.n = 1;
    a.w[0] = dev(W);
    a.y[0] = y_scratch;
    a.resid = x_resid;
    a.post_w = w;
    a.post_eps = eps;
    a.counter = counter_;
    if (prof_) key_ = "matmul_norm_add " + std::to_string(W.rows) + "x" + std::to_string(W.cols) + " M=" +
                      std::to_string(M);
    launch([=](cudaStream_t s) { cuda::matmuls(s, a, M); }, 22, x, M, a.w[0].data, W.rows, W.cols, y_scratch, x_resid,
           w, eps, int(a.xt));
  }
  void attn_prep(const Buf& q_b, int H, const Buf& k_b, const Buf& v_b, int Hk, int head_dim, const float* q_norm_w,
                 const float* k_norm_w, bool v_norm, float eps, const std::vector<AttnSeq>& seqs, const RopeTable& t,
                 ActPrecision P) override {
    const bool has_k = bool(k_b);
    const DType at = act_type({&q_b, &k_b, &v_b});
    const float* inv = inv_freq_on_device(t);
    for (const AttnSeq& sq : seqs) {
      const KvBuffer& kv = sq.kv;
      cuda::AttnPrepArgs a{};
      a.t = at;
      a.q = q_b.at(int64_t(sq.row0) * H * head_dim).data;
      a.k = has_k ? k_b.at(int64_t(sq.row0) * Hk * head_dim).data : nullptr;
      a.v = has_k ? v_b.at(int64_t(sq.row0) * Hk * head_dim).data : nullptr;
      a.H = H;
      a.Hk = has_k ? Hk : 0;
      a.head_dim = head_dim;
      a.q_norm_w = q_norm_w;
      a.k_norm_w = k_norm_w;
      a.v_norm = v_norm;
      a.eps = eps;
      a.inv_freq = inv;
      a.position_scale = t.position_scale;
      a.kc = kv.k.data;
      a.vc = kv.v.data;
      if (has_k && !kv.quantized()) G4_CHECK(act_type({&kv.k, &kv.v}) == at);
      a.capacity = kv.capacity;
      a.window = kv.window;
      a.quant = quant_args(kv);
      if (has_k) G4_CHECK(kv.n_kv_heads == Hk && kv.head_dim == head_dim);
      if (has_k && a.quant.bits) G4_CHECK(head_dim <= 512 && head_dim % a.quant.group == 0);
      a.pos0 = rec_->dyn(sq.pos0);
      const int n = sq.n;
      const cuda::KvQuantArgs& qa = a.quant;
      launch([=](cudaStream_t s) { cuda::attn_prep(s, a, n); }, 21, a.q, a.k, a.v, H, a.Hk, head_dim, q_norm_w,
             k_norm_w, int(v_norm), eps, inv, t.position_scale, a.kc, a.vc, a.capacity, a.window, n, qa.bits, qa.group,
             int(qa.bf16_params), qa.kq, qa.vq, qa.ks, qa.kb, qa.vs, qa.vb, int(at));
      if (has_k) record_positions(sq);
    }
  }
  void norm_matmuls(const Buf& x_b, int M, const InputNorm& norm, std::initializer_list<MatOut> outs,
                    ActPrecision P) override {
    if (outs.size() == 0) return;
    if (!norm_fits(norm, M, outs.begin()->w->cols)) {  // too wide to norm in shared memory
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
                    bool ggml_table, ActPrecision P, const Buf& gate_b, const Buf& up_b) override {
    if (G.fmt != U.fmt || G.rows != U.rows || G.cols != U.cols || G.group_size != U.group_size || G.bits != U.bits ||
        G.scale_dtype != U.scale_dtype || !norm_fits(norm, M, G.cols)) {
      Backend::gate_up_gelu(x_b, M, norm, G, U, ggml_table, P, gate_b, up_b);  // separate launches
      return;
    }
    void* gate_out = gate_b.data;
    cuda::MatArgs a = normed_args(x_b, M, norm, G, P);
    G4_CHECK(act_type({&gate_b}) == a.xt);
    a.n = 1;
    a.w[0] = dev(G);
    a.w2 = dev(U);
    a.y[0] = gate_out;
    a.table = ggml_table ? gelu_table() : nullptr;
    if (prof_) key_ = "gate_up_gelu " + std::to_string(G.rows) + "x" + std::to_string(G.cols) + " M=" + std::to_string(M);
    launch([=](cudaStream_t s) { cuda::gate_up_gelu(s, a, M); }, 17, a.x, M, a.w[0].data, a.w2.data, G.rows, G.cols,
           a.table, gate_out, a.norm_w, a.eps, int(a.xt));
  }
  void top_k(const Buf& x_b, int rows, int n, int k, const Buf& vals_b, const Buf& idx_b, const Buf& lse_b) override {
    const float* x = F(x_b);
    float *vals = F(vals_b), *lse = F(lse_b);
    int32_t* idx = I(idx_b);
    G4_CHECK(k > 0 && k <= n && k <= 1024);
    launch([=](cudaStream_t s) { cuda::top_k(s, x, rows, n, k, vals, idx, lse); }, 23, x, rows, n, k, vals, idx, lse);
  }
  void argmax(const Buf& x_b, int rows, int n, const Buf& out_b) override {
    const float* x = F(x_b);
    int32_t* out = I(out_b);
    if (size_t(rows) > argmax_rows_) {  // per-row slots and counters, zero between launches
      if (argmax_slots_) retired_.push_back(argmax_slots_);
      G4_CUDA(cudaMalloc(&argmax_slots_, size_t(rows) * 12));
      G4_CUDA(cudaMemsetAsync(argmax_slots_, 0, size_t(rows) * 12, stream_));
      argmax_rows_ = size_t(rows);
    }
    auto* slots = static_cast<unsigned long long*>(argmax_slots_);
    auto* counters = reinterpret_cast<unsigned*>(slots + argmax_rows_);
    launch([=](cudaStream_t s) { cuda::argmax(s, x, rows, n, slots, counters, out); }, 19, x, rows, n, slots, out);
  }
  bool on_device() const override { return true; }
  // MoE (26B-A4B). The routing comes back to the host, which groups each expert's rows: a step
  // with MoE layers syncs there (it runs op by op after the first, not as a graph). Correct
  // first; a device-side grouped GEMM is what makes it fast.
  void router_topk(const Buf& scores, int rows, int E, int k, const float* per_expert_scale, ActPrecision P,
                   const Buf& idx, const Buf& weights) override {
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
    const int E = int(gate.size());
    const int64_t I = gate[0].rows;
    std::vector<int32_t> hidx(size_t(rows) * k);
    to_host(idx, hidx.size(), hidx.data());
    // Each expert's (row, slot) items, and where its outputs land in y (expert after expert).
    std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(E));
    for (int i = 0; i < rows * k; ++i) by_expert[size_t(hidx[size_t(i)])].push_back(i);
    const size_t n = size_t(rows) * k;
    if (n > moe_cap_) {  // grown outside any recorded step (to_host above left step mode)
      for (const Buf& p : {moe_xs_, moe_g_, moe_u_, moe_y_, moe_ys_, moe_ids_}) free(p);
      moe_xs_ = alloc_act(n * size_t(d));
      moe_g_ = alloc_act(n * size_t(I));
      moe_u_ = alloc_act(n * size_t(I));
      moe_ys_ = alloc_act(n * size_t(d));
      moe_y_ = alloc_act(n * size_t(d));
      moe_ids_ = alloc_i32(2 * n);
      moe_cap_ = n;
    }
    std::vector<int32_t> rows_of(n), back(n);  // gather source rows; y position of each item
    size_t at = 0;
    for (int e = 0; e < E; ++e)
      for (int32_t item : by_expert[size_t(e)]) {
        rows_of[at] = item / k;
        back[size_t(item)] = int32_t(at);
        ++at;
      }
    from_host(rows_of.data(), n, moe_ids_);
    from_host(back.data(), n, moe_ids_.at(int64_t(n)));
    gather_rows(x, moe_ids_, int(n), d, moe_xs_);
    at = 0;
    for (int e = 0; e < E; ++e) {
      const int m = int(by_expert[size_t(e)].size());
      if (!m) continue;
      const Buf xe = moe_xs_.at(int64_t(at) * d);
      matmul(xe, m, gate[size_t(e)], P, moe_g_);
      matmul(xe, m, up[size_t(e)], P, moe_u_);
      gelu_mul(moe_g_, moe_u_, size_t(m) * I, P, moe_g_);
      matmul(moe_g_, m, down[size_t(e)], P, moe_ys_.at(int64_t(at) * d));
      at += size_t(m);
    }
    gather_rows(moe_ys_, moe_ids_.at(int64_t(n)), int(n), d, moe_y_);  // back to (row, slot) order
    const void* yv = moe_y_.data;
    const float* w = F(w_b);
    void* out = out_b.data;
    const DType t = act_type({&moe_y_, &out_b});
    launch([=](cudaStream_t s) { cuda::moe_combine(s, yv, w, rows, k, d, out, t); }, 24, yv, w, rows, k, d, out,
           int(t));
  }
  void sync() override {
    rec_->flush();
    G4_CUDA(cudaStreamSynchronize(stream_));
    free_retired();
  }
  void begin_step() override {
    if (prof_) return;  // profiled ops run one by one
    rec_->begin();      // waits for the previous step
    free_retired();
    if (timing_) {
      if (!t_wait_.empty()) t_outside_.push_back(seconds_since(t_mark_));
      t_mark_ = std::chrono::steady_clock::now();
    }
  }
  void end_step() override {
    // This step's image blocks are forgotten (the next step's arrays may reuse the host
    // addresses) and freed once its work is done (free_retired: next begin_step or sync).
    for (const auto& b : blocks_) {
      std::lock_guard<std::mutex> lock(mu_);
      if (owned_.erase(b.second)) retired_.push_back(b.second);
    }
    blocks_.clear();
    if (timing_) {
      t_enqueue_.push_back(seconds_since(t_mark_));
      t_mark_ = std::chrono::steady_clock::now();
    }
    if (timing_) G4_CUDA(cudaEventRecord(ev_[0], stream_));
    rec_->end();
    if (timing_) {
      G4_CUDA(cudaEventRecord(ev_[1], stream_));
      t_end_.push_back(seconds_since(t_mark_));
      t_mark_ = std::chrono::steady_clock::now();
    }
  }

 private:
  // Runs f on the stream now, or logs it with its signature words when a step is being recorded.
  template <class F, class... A>
  void launch(F f, uint64_t op, A... args) {
    if (skip_ >> op & 1u) return;  // G4_CUDA_SKIP (timing ablations only: results are wrong)
    if (rec_->active()) {
      rec_->sig({op, word(args)...});
      rec_->add([f](cudaStream_t s) {
        f(s);
        G4_CUDA_LAUNCHED();
      });
    } else if (prof_) {
      prof_->time(stream_, key_.empty() ? op_name(op) : key_, [&] { f(stream_); });
      G4_CUDA_LAUNCHED();
      key_.clear();
    } else {
      f(stream_);
      G4_CUDA_LAUNCHED();
    }
  }
  // Whether an input norm of M rows of `cols` fits the matmul kernels' shared memory (or there is none).
  static bool norm_fits(const InputNorm& norm, int M, int64_t cols) {
    return !norm.w || cuda::matmul_norm_smem(M, cols) <= 40 * 1024;
  }
  // A matmul launch's arguments over input x; the outputs are of x's type.
  static cuda::MatArgs mat_args(const Buf& x, const InputNorm& norm) {
    cuda::MatArgs a{};
    a.x = x.data;
    a.xt = act_type({&x});
    a.yt = a.xt;
    a.norm_w = norm.w;
    a.eps = norm.eps;
    return a;
  }
  // A decode row (M = 1) into K-quant matmuls: normed once into norm.scratch by one small kernel,
  // instead of by each of the matmul's thousands of blocks in its prologue (which cost more than
  // the weights' reads). Returns the matmul's arguments: the scratch read as is, or x normed in
  // the kernel.
  cuda::MatArgs normed_args(const Buf& x, int M, const InputNorm& norm, const WeightView& W, ActPrecision P) {
    if (M != 1 || !norm.w || !norm.scratch || (W.fmt != WFormat::GgufQ4_K && W.fmt != WFormat::GgufQ6_K))
      return mat_args(x, norm);
    rms_norm(x, 1, int(W.cols), norm.w, norm.eps, P, norm.scratch);
    return mat_args(norm.scratch, InputNorm{});
  }
  void launch_matmuls(const cuda::MatArgs& a, int M) {
    if (prof_) key_ = "matmuls x" + std::to_string(a.n) + " " + std::to_string(a.w[0].rows) + "x" +
                      std::to_string(a.w[0].cols) + " M=" + std::to_string(M);
    const cuda::DevWeight& w0 = a.w[0];
    const cuda::DevWeight& w1 = a.n > 1 ? a.w[1] : a.w[0];
    const cuda::DevWeight& w2 = a.n > 2 ? a.w[2] : a.w[0];
    launch([=](cudaStream_t s) { cuda::matmuls(s, a, M); }, 18, a.x, M, a.n, a.norm_w, a.eps, w0.data, w0.rows,
           a.y[0], w1.data, w1.rows, a.y[a.n > 1 ? 1 : 0], w2.data, w2.rows, a.y[a.n > 2 ? 2 : 0], w0.cols, int(a.xt));
  }
  // A KV buffer's quantized storage as the kernels take it (bits 0: f32 rows).
  static cuda::KvQuantArgs quant_args(const KvBuffer& kv) {
    cuda::KvQuantArgs q;
    if (!kv.quantized()) return q;
    q.bits = kv.quant.bits;
    q.group = kv.quant.group_size;
    q.group_shift = q.group == 32 ? 5 : q.group == 64 ? 6 : 7;  // validate_kv_options: 32, 64 or 128
    q.bf16_params = kv.quant.bf16_params;
    q.kq = kv.kq;
    q.vq = kv.vq;
    q.ks = kv.ks;
    q.kb = kv.kb;
    q.vs = kv.vs;
    q.vb = kv.vb;
    return q;
  }
  // The cache slots a write fills record their positions (host bookkeeping, backend.h).
  static void record_positions(const AttnSeq& s) {
    const KvBuffer& kv = s.kv;
    for (int t = 0; t < s.n; ++t) {
      const int pos = s.pos0 + t;
      const int slot = kv.window > 0 ? pos % kv.capacity : pos;
      G4_CHECK(slot < kv.capacity);
      kv.pos[slot] = pos;
    }
  }
  void* raw_alloc(size_t bytes) {
    void* p = nullptr;
    G4_CUDA(cudaMalloc(&p, bytes));
    std::lock_guard<std::mutex> lock(mu_);
    owned_.insert(p);
    return p;
  }
  void* upload(const void* host, size_t bytes) {
    // 16 bytes of slack: staged matmuls copy whole 16-byte words (cuda_kernels.cu stage_rows).
    void* d = raw_alloc(bytes + 16);
    if (bytes) G4_CUDA(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
  }
  void free_retired() {
    for (void* p : retired_) G4_CUDA(cudaFree(p));
    retired_.clear();
  }
  // One device copy per RoPE table (the Model keeps its tables for its lifetime); the host
  // contents are kept beside it, so a table whose address is reused is uploaded again.
  const float* inv_freq_on_device(const RopeTable& t) {
    std::lock_guard<std::mutex> lock(mu_);
    RopeCopy& c = rope_[t.inv_freq.data()];
    if (c.dev && c.host == t.inv_freq) return c.dev;
    if (c.dev) {  // launches logged or in flight may still read the old table
      retired_.push_back(c.dev);
      owned_.erase(c.dev);
      c.dev = nullptr;
    }
    void* d = nullptr;
    G4_CUDA(cudaMalloc(&d, std::max<size_t>(t.inv_freq.size(), 1) * 4));
    owned_.insert(d);
    c.dev = static_cast<float*>(d);
    G4_CUDA(cudaMemcpy(c.dev, t.inv_freq.data(), t.inv_freq.size() * 4, cudaMemcpyHostToDevice));
    c.host = t.inv_freq;
    return c.dev;
  }
  const uint16_t* gelu_table() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!gelu_) {
      const std::vector<uint16_t>& t = ggml_gelu_f16_table();
      void* d = nullptr;
      G4_CUDA(cudaMalloc(&d, t.size() * 2));
      G4_CUDA(cudaMemcpy(d, t.data(), t.size() * 2, cudaMemcpyHostToDevice));
      owned_.insert(d);
      gelu_ = static_cast<const uint16_t*>(d);
    }
    return gelu_;
  }
  // Attention partials: one buffer that only grows; a replaced one is retired, since logged
  // launches of this step may still point at it.
  // A step's image blocks (AttnSeq::blocks) on the device, uploaded once per host array and step
  // (every layer's attention passes the same array).
  const int32_t* device_blocks(const int32_t* host, int n) {
    for (const auto& b : blocks_)
      if (b.first == host) return b.second;
    int32_t* d = I(alloc_i32(size_t(n) * 2));
    from_host(host, size_t(n) * 2, Buf(d, DType::I32, int64_t(n) * 2, 0));
    blocks_.push_back({host, d});
    return d;
  }
  float* partial_floats(size_t n) {
    if (n > partial_n_) {
      if (partial_) retired_.push_back(partial_);
      G4_CUDA(cudaMalloc(&partial_, n * 4));
      partial_n_ = n;
    }
    return partial_;
  }

  // Attention's per-(row, head) split counters: zeros that the kernel leaves zero; grows like the
  // partials; zeroed on the stream, ahead of every launch that uses it.
  unsigned* split_counters(size_t n) {
    if (n > counters_n_) {
      if (counters_) retired_.push_back(counters_);
      G4_CUDA(cudaMalloc(&counters_, n * sizeof(unsigned)));
      G4_CUDA(cudaMemsetAsync(counters_, 0, n * sizeof(unsigned), stream_));
      counters_n_ = n;
    }
    return counters_;
  }

  BackendOptions opt_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::StepRecorder> rec_;
  std::unique_ptr<OpProfile> prof_;  // BackendOptions::profile
  // BackendOptions::timing: host seconds per step spent logging ops, in end_step (graph launch or direct
  // launches), waiting for the logits (the device finishing the step, plus their copy), and between
  // the logits' arrival and the next step (the caller's own work: sampling).
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
  bool timing_ = false;
  uint32_t skip_ = 0;  // G4_CUDA_SKIP: op codes never launched
  std::chrono::steady_clock::time_point t_mark_;
  std::vector<double> t_enqueue_, t_end_, t_wait_, t_outside_, t_gpu_;
  cudaEvent_t ev_[2] = {nullptr, nullptr};  // around the step's launch (device time of its work)
  std::string key_;                  // the profile key of the op being launched (matmul shapes)
  std::mutex mu_;
  std::unordered_set<void*> owned_;
  std::unique_ptr<Backend> host_ops_ = make_reference_backend();  // MoE routing on the host
  Buf moe_xs_, moe_g_, moe_u_, moe_ys_, moe_y_, moe_ids_;
  size_t moe_cap_ = 0;
  std::vector<std::pair<const int32_t*, int32_t*>> blocks_;  // device_blocks of the current step
  std::vector<void*> retired_;  // freed by the caller during a step: cudaFree'd after it
  struct RopeCopy {
    std::vector<float> host;
    float* dev = nullptr;
  };
  std::unordered_map<const float*, RopeCopy> rope_;
  const uint16_t* gelu_ = nullptr;
  float* partial_ = nullptr;
  size_t partial_n_ = 0;
  unsigned* counters_ = nullptr;
  size_t counters_n_ = 0;
  unsigned* counter_ = nullptr;  // matmul_norm_add's block counter (zero between launches)
  void* argmax_slots_ = nullptr;  // argmax: rows 64-bit slots then rows counters
  size_t argmax_rows_ = 0;
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

std::unique_ptr<Backend> make_cuda_backend(std::string* why, const BackendOptions& opt) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = std::string("no usable CUDA device (") + (e != cudaSuccess ? cudaGetErrorString(e) : "none found") + ")";
    return nullptr;
  }
  if (opt.activations != DType::F32 && opt.activations != DType::BF16) {
    if (why) *why = "activations are stored as f32 or bf16";
    return nullptr;
  }
  return std::make_unique<CudaBackend>(opt);
}

}  // namespace g4
