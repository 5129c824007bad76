// The CUDA backend (first version): every dense op of backend.h as a simple, correct f32 kernel
// (cuda_kernels.cu), weights copied to device memory once at load (place_weight), activations
// and KV caches in device memory, one device, the default stream. Not yet: bf16 activations,
// mixture-of-experts ops (the loader refuses MoE checkpoints on this backend), fast kernels,
// CUDA graphs. Every CUDA call is checked; a failure aborts with the call and CUDA's message.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
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

class CudaBackend final : public Backend {
 public:
  ~CudaBackend() override {
    for (void* p : owned_) cudaFree(p);
    if (scratch_) cudaFree(scratch_);
  }
  std::string name() const override { return "cuda"; }
  bool supports_precision(ActPrecision P) const override { return P == ActPrecision::F32; }

  WeightView place_weight(const WeightView& w) override {
    WeightView d = w;
    d.data = upload(w.data, view_data_bytes(w));
    if (const size_t sb = view_scale_bytes(w)) {
      d.scales = upload(w.scales, sb);
      d.biases = upload(w.biases, sb);
    }
    return d;
  }

  float* alloc(size_t n) override { return static_cast<float*>(raw_alloc(std::max<size_t>(n, 1) * 4)); }
  int32_t* alloc_i32(size_t n) override { return static_cast<int32_t*>(raw_alloc(std::max<size_t>(n, 1) * 4)); }
  void free(void* p) override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!owned_.erase(p)) return;
    }
    G4_CUDA(cudaFree(p));
  }
  void to_host(const float* src, size_t n, float* dst) override {
    if (n) G4_CUDA(cudaMemcpy(dst, src, n * 4, cudaMemcpyDeviceToHost));
  }
  void from_host(const float* src, size_t n, float* dst) override {
    if (n) G4_CUDA(cudaMemcpy(dst, src, n * 4, cudaMemcpyHostToDevice));
  }
  void copy(const float* src, size_t n, float* dst) override {
    if (n) G4_CUDA(cudaMemcpy(dst, src, n * 4, cudaMemcpyDeviceToDevice));
  }

  void embed(const WeightView& E, const int32_t* ids, int n, float scale, ActPrecision P, float* out) override {
    f32_only(P);
    cuda::embed(dev(E), ids, n, scale, out);
    G4_CUDA_LAUNCHED();
  }
  void matmul(const float* x, int M, const WeightView& W, ActPrecision P, float* y) override {
    f32_only(P);
    cuda::matmul(x, M, dev(W), y);
    G4_CUDA_LAUNCHED();
  }
  void rms_norm(const float* x, int rows, int dim, const float* w, float eps, ActPrecision P, float* y) override {
    f32_only(P);
    cuda::rms_norm(x, rows, dim, w, eps, y);
    G4_CUDA_LAUNCHED();
  }
  void rope(float* x, int rows, int heads, int head_dim, int pos0, const RopeTable& t, ActPrecision P) override {
    f32_only(P);
    cuda::rope(x, rows, heads, head_dim, pos0, inv_freq_on_device(t), t.position_scale);
    G4_CUDA_LAUNCHED();
  }
  void kv_write(const AttnSeq& s, const float* k, const float* v) override {
    const KvBuffer& kv = s.kv;
    const int row = kv.n_kv_heads * kv.head_dim;
    cuda::kv_write(k, v, s.row0, s.n, s.pos0, row, kv.capacity, kv.window, kv.k, kv.v);
    G4_CUDA_LAUNCHED();
    for (int t = 0; t < s.n; ++t) {  // positions are host bookkeeping (backend.h)
      const int pos = s.pos0 + t;
      const int slot = kv.window > 0 ? pos % kv.capacity : pos;
      G4_CHECK(slot < kv.capacity);
      kv.pos[slot] = pos;
    }
  }
  void attention(const float* q, int H, const std::vector<AttnSeq>& seqs, float scale, ActPrecision P,
                 float* out) override {
    f32_only(P);
    for (const AttnSeq& s : seqs) {
      const KvBuffer& kv = s.kv;
      const int max_pos = kv.window > 0 ? std::min(kv.window, s.pos0 + s.n) : s.pos0 + s.n;
      float* scratch = scratch_floats(size_t(s.n) * H * size_t(max_pos));
      const cuda::AttnArgs a{s.row0, s.n, s.pos0, kv.k, kv.v, kv.capacity, kv.n_kv_heads, kv.head_dim, kv.window};
      cuda::attention(q, H, a, scale, scratch, max_pos, out);
      G4_CUDA_LAUNCHED();
    }
  }
  void gelu_mul(const float* gate, const float* up, size_t n, ActPrecision P, float* out) override {
    f32_only(P);
    cuda::gelu_mul(gate, up, n, out);
    G4_CUDA_LAUNCHED();
  }
  void gelu_mul_ggml(const float* gate, const float* up, size_t n, float* out) override {
    cuda::gelu_mul_ggml(gate, up, n, gelu_table(), out);
    G4_CUDA_LAUNCHED();
  }
  void add(const float* a, const float* b, size_t n, ActPrecision P, float* y) override {
    f32_only(P);
    cuda::add(a, b, n, y);
    G4_CUDA_LAUNCHED();
  }
  void scale(const float* a, float s, size_t n, ActPrecision P, float* y) override {
    f32_only(P);
    cuda::scale(a, s, n, y);
    G4_CUDA_LAUNCHED();
  }
  void softcap(float* x, size_t n, float cap, ActPrecision P) override {
    f32_only(P);
    cuda::softcap(x, n, cap);
    G4_CUDA_LAUNCHED();
  }
  void gather_rows(const float* src, const int32_t* idx, int n, int dim, float* dst) override {
    cuda::gather_rows(src, idx, n, dim, dst);
    G4_CUDA_LAUNCHED();
  }
  void copy_cols(const float* src, int rows, int src_dim, int off, int n, float* dst) override {
    cuda::copy_cols(src, rows, src_dim, off, n, dst);
    G4_CUDA_LAUNCHED();
  }
  void router_topk(const float*, int, int, int, const float*, ActPrecision, int32_t*, float*) override {
    G4_CHECK(false && "cuda backend: MoE routing is not implemented (the loader refuses MoE models)");
  }
  void moe_experts(const float*, int, int, const int32_t*, const float*, int, const std::vector<WeightView>&,
                   const std::vector<WeightView>&, const std::vector<WeightView>&, ActPrecision, float*) override {
    G4_CHECK(false && "cuda backend: MoE experts are not implemented (the loader refuses MoE models)");
  }
  void sync() override { G4_CUDA(cudaDeviceSynchronize()); }

 private:
  static void f32_only(ActPrecision P) {
    G4_CHECK(P == ActPrecision::F32 && "cuda backend: f32 activations only (callers check supports_precision)");
  }
  void* raw_alloc(size_t bytes) {
    void* p = nullptr;
    G4_CUDA(cudaMalloc(&p, bytes));
    std::lock_guard<std::mutex> lock(mu_);
    owned_.insert(p);
    return p;
  }
  void* upload(const void* host, size_t bytes) {
    void* d = raw_alloc(std::max<size_t>(bytes, 1));
    if (bytes) G4_CUDA(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
  }
  // One device copy per RoPE table (the Model keeps its tables for its lifetime); the host
  // contents are kept beside it, so a table whose address is reused is uploaded again.
  const float* inv_freq_on_device(const RopeTable& t) {
    std::lock_guard<std::mutex> lock(mu_);
    RopeCopy& c = rope_[t.inv_freq.data()];
    if (c.dev && c.host == t.inv_freq) return c.dev;
    if (c.dev && c.host.size() != t.inv_freq.size()) {
      G4_CUDA(cudaFree(c.dev));
      owned_.erase(c.dev);
      c.dev = nullptr;
    }
    if (!c.dev) {
      void* d = nullptr;
      G4_CUDA(cudaMalloc(&d, std::max<size_t>(t.inv_freq.size(), 1) * 4));
      owned_.insert(d);
      c.dev = static_cast<float*>(d);
    }
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
  // Attention scores: one buffer that only grows (kernels on the default stream run in order,
  // so reusing it between launches is safe).
  float* scratch_floats(size_t n) {
    if (n > scratch_n_) {
      if (scratch_) G4_CUDA(cudaFree(scratch_));
      G4_CUDA(cudaMalloc(&scratch_, n * 4));
      scratch_n_ = n;
    }
    return scratch_;
  }

  std::mutex mu_;
  std::unordered_set<void*> owned_;
  struct RopeCopy {
    std::vector<float> host;
    float* dev = nullptr;
  };
  std::unordered_map<const float*, RopeCopy> rope_;
  const uint16_t* gelu_ = nullptr;
  float* scratch_ = nullptr;
  size_t scratch_n_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = std::string("no usable CUDA device (") + (e != cudaSuccess ? cudaGetErrorString(e) : "none found") + ")";
    return nullptr;
  }
  return std::make_unique<CudaBackend>();
}

}  // namespace g4
