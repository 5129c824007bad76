// The fast CPU backend: threaded SIMD matrix products straight on the packed weights
// (quant/matmul_fast), attention parallel over (row, head), MoE experts grouped per expert.
// With f32 activations on AVX-512 CPUs, attention (per query row and KV group, K/V rows loaded
// once per group) and the elementwise ops (gelu, softcap, rms_norm, add) run SIMD kernels
// (cpu_kernels.h); with bf16 activations every op keeps HostBackend's MLX-exact scalar kernels.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cmath>
#include <functional>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/host_backend.h"
#include "core/thread_pool.h"
#include "quant/gguf_act.h"
#include "quant/gguf_blocks.h"
#include "quant/matmul.h"
#include "quant/matmul_internal.h"

namespace g4 {
namespace {

class CpuBackend final : public HostBackend {
 public:
  std::string name() const override { return "cpu"; }

  void matmul(const Buf& x_b, int M, const WeightView& W, ActPrecision P, const Buf& y_b) override {
    const float* x = x_b.f32();
    float* y = y_b.f32();
    if (P == ActPrecision::BF16 && is_mlx_parity_format(W.fmt)) {  // parity mode (host_backend.h)
      matmul_mlx_bf16_parity(x, M, W, y);
      return;
    }
    // Batch-invariant mode (quant/matmul.h) needs matmul_fast's row-exact kernels at every M.
    if (M == 1 && dynamic_ && !batch_invariant() && W.fmt != WFormat::MlxAffine &&
        W.rows * W.row_bytes >= (256 << 10)) {
      if (!gguf_decode_dynamic(x, W, y)) matmul_dynamic_rows(x, W, y);
    } else {
      matmul_fast(x, M, W, y);
    }
    round_activations(y, size_t(M) * W.rows, P);
  }

  // Decode (M = 1) matmul with dynamic row scheduling: the threads take chunks of weight rows
  // from a shared counter and run matmul_fast on each chunk's sub-view (nested parallel_for
  // runs inline), so a thread that falls behind (other processes, uneven memory latency) no
  // longer holds up the whole product with its static half. Per-row results are those of
  // matmul_fast (chunks start at even rows, keeping the kernels' row pairing). Not for MlxAffine
  // (its scales/biases would need offsetting too). G4_STATIC_SPLIT=1 turns it off.
  // The same dynamic schedule for GGUF weights on AVX-512 VNNI CPUs, quantizing the activation
  // row once (as gguf_matmul_fast does) instead of once per chunk, and running the row kernels
  // gguf_matmul_fast runs on each chunk. Returns false where it does not apply.
  bool gguf_decode_dynamic(const float* x, const WeightView& W, float* y) {
    using namespace gguf;
    if (!vnni_) return false;
    const bool kq = W.fmt == WFormat::GgufQ4_K || W.fmt == WFormat::GgufQ5_K || W.fmt == WFormat::GgufQ6_K;
    const bool pq = W.fmt == WFormat::GgufQ8_0 || W.fmt == WFormat::GgufQ4_0 || W.fmt == WFormat::GgufQ5_0;
    if (!kq && !pq) return false;
    thread_local ActK ak;
    thread_local ActPair ap;
    if (kq) {
      quantize_act_k(x, 1, W.cols, W.fmt == WFormat::GgufQ6_K ? Layout::KNatural : Layout::KPerm, &ak);
    } else {
      quantize_act_pair(x, 1, W.cols,
                        W.fmt == WFormat::GgufQ8_0 ? 128 : W.fmt == WFormat::GgufQ4_0 ? 8 : 16, &ap);
    }
    const ActK* akp = &ak;  // the caller's buffers: workers have their own (empty) thread_locals
    const ActPair* app = &ap;
    for_each_row_chunk(W, [&](int64_t r0, int64_t r1) {
      if (kq) rows_k_avx512(W.data, W.row_bytes, W.fmt, *akp, 1, r0, r1, y, W.rows);
      else rows_pair_avx512(W.data, W.row_bytes, W.fmt, W.cols / QK, *app, 1, r0, r1, y, W.rows);
    });
    return true;
  }

  void matmul_dynamic_rows(const float* x, const WeightView& W, float* y) {
    for_each_row_chunk(W, [&](int64_t r0, int64_t r1) {
      WeightView s = W;
      s.data = static_cast<const uint8_t*>(W.data) + r0 * W.row_bytes;
      s.rows = r1 - r0;
      matmul_fast(x, 1, s, y + r0);
    });
  }

  // The decode schedule both paths above share: every thread takes chunks of weight rows
  // [r0, r1) from one shared counter until none are left. Chunks start at even rows (the
  // kernels pair rows) and stream ~64 KiB of weights (512 KiB for matrices of 8 MiB and more).
  template <class Fn>
  static void for_each_row_chunk(const WeightView& W, Fn&& fn) {
    const int64_t bytes = W.rows * W.row_bytes;
    const int64_t target = bytes >= (8 << 20) ? (512 << 10) : (64 << 10);
    const int64_t chunk = std::max<int64_t>(2, target / W.row_bytes) & ~int64_t(1);
    std::atomic<int64_t> next{0};
    auto body = [&](int64_t, int64_t) {
      for (;;) {
        const int64_t r0 = next.fetch_add(chunk, std::memory_order_relaxed);
        if (r0 >= W.rows) return;
        fn(r0, std::min(W.rows, r0 + chunk));
      }
    };
    parallel_for(num_threads(), std::ref(body));
  }

  // True when the f32 SIMD kernels apply (checked once: cpu_has_avx512 reads the environment).
  bool simd(ActPrecision P) const { return P == ActPrecision::F32 && avx512_; }

  void gelu_mul(const Buf& gate, const Buf& up, size_t n, ActPrecision P, const Buf& out) override {
    if (!simd(P)) return HostBackend::gelu_mul(gate, up, n, P, out);
    cpu::gelu_mul_avx512(gate.f32(), up.f32(), n, out.f32());
  }
  void softcap(const Buf& x_b, size_t n, float cap, ActPrecision P) override {
    if (!simd(P)) return HostBackend::softcap(x_b, n, cap, P);
    float* x = x_b.f32();
    // Threads over the logits (V = 262144 per row at decode: tanh is ~0.3 ms on one core).
    auto body = [x, cap](int64_t b, int64_t e) { cpu::softcap_avx512(x + b, size_t(e - b), cap); };
    parallel_for(int64_t(n), std::ref(body), 16384);
  }
  void rms_norm(const Buf& x, int rows, int dim, const float* w, float eps, ActPrecision P,
                const Buf& y) override {
    if (!simd(P)) return HostBackend::rms_norm(x, rows, dim, w, eps, P, y);
    cpu::rms_norm_avx512(x.f32(), rows, dim, w, eps, y.f32());
  }
  void add(const Buf& a, const Buf& b, size_t n, ActPrecision P, const Buf& y) override {
    if (!simd(P)) return HostBackend::add(a, b, n, P, y);
    cpu::add_avx512(a.f32(), b.f32(), n, y.f32());
  }

  // HostBackend::rope with cos/sin computed once per (row, pair) instead of once per head:
  // the same std::cos/std::sin values, so the result is bit-identical to the reference.
  void rope(const Buf& x_b, int rows, int heads, int head_dim, int pos0, const RopeTable& t,
            ActPrecision P) override {
    if (P != ActPrecision::F32) return HostBackend::rope(x_b, rows, heads, head_dim, pos0, t, P);
    float* x = x_b.f32();
    const int half = head_dim / 2;
    thread_local std::vector<float> cs;
    cs.resize(size_t(2 * half));
    float* c = cs.data();
    float* sn = c + half;
    for (int r = 0; r < rows; ++r) {
      const float pos = float(pos0 + r) * t.position_scale;
      for (int j = 0; j < half; ++j) {
        const float th = pos * t.inv_freq[j];
        c[j] = std::cos(th);
        sn[j] = std::sin(th);
      }
      for (int h = 0; h < heads; ++h) {
        float* v = x + (int64_t(r) * heads + h) * head_dim;
        for (int j = 0; j < half; ++j) {
          if (t.inv_freq[j] == 0.f) continue;  // pairs that do not rotate stay as they are
          const float a = v[j], b = v[j + half];
          v[j] = a * c[j] - b * sn[j];
          v[j + half] = a * sn[j] + b * c[j];
        }
      }
    }
  }

  void attention(const Buf& q_b, int H, const std::vector<AttnSeq>& seqs, float scale, ActPrecision P,
                 const Buf& out_b) override {
    const float* q = q_b.f32();
    float* out = out_b.f32();
    bool fast = simd(P);
    for (const AttnSeq& s : seqs) fast = fast && s.kv.head_dim % 16 == 0 && H % s.kv.n_kv_heads == 0;
    if (fast) return attention_groups(q, H, seqs, scale, out);
    // Flatten (sequence, row, head) work items; each thread keeps its own score scratch.
    struct Item { int s, t; };
    std::vector<Item> items;
    int max_len = 1;
    for (int si = 0; si < int(seqs.size()); ++si) {
      for (int t = 0; t < seqs[si].n; ++t) items.push_back({si, t});
      max_len = std::max(max_len, seqs[si].pos0 + seqs[si].n + 1);
    }
    const int64_t n = int64_t(items.size()) * H;
    parallel_for(n, [&](int64_t b, int64_t e) {
      std::vector<float> scores(static_cast<size_t>(max_len));
      for (int64_t i = b; i < e; ++i) {
        const Item& it = items[size_t(i / H)];
        const int h = int(i % H);
        const AttnSeq& s = seqs[size_t(it.s)];
        const int D = s.kv.head_dim, group = H / s.kv.n_kv_heads;
        const size_t off = (size_t(s.row0 + it.t) * H + h) * D;
        attend_one(q + off, s.kv, h / group, visible_keys(s, it.t), scale, P, scores.data(), out + off);
      }
    });
  }

  // f32 SIMD attention: one work item per (sequence, row, KV head) covering that head's query
  // group. Items are visited in zig-zag order (first, last, second, ...) so that the contiguous
  // halves parallel_for hands to the threads hold equal causal work.
  void attention_groups(const float* q, int H, const std::vector<AttnSeq>& seqs, float scale,
                        float* out) {
    struct Item { int s, t, g; };
    std::vector<Item> items;
    size_t scratch = 1;
    for (int si = 0; si < int(seqs.size()); ++si) {
      const AttnSeq& s = seqs[size_t(si)];
      const int group = H / s.kv.n_kv_heads;
      const int keys = s.kv.window > 0 && !s.blocks ? std::min(s.kv.window, s.pos0 + s.n) : s.pos0 + s.n;
      scratch = std::max(scratch, size_t(group) * size_t(keys + 16));
      for (int t = 0; t < s.n; ++t)
        for (int g = 0; g < s.kv.n_kv_heads; ++g) items.push_back({si, t, g});
    }
    const int64_t n = int64_t(items.size());
    auto body = [&](int64_t b, int64_t e) {
      thread_local std::vector<float> sc;
      if (sc.size() < scratch) sc.resize(scratch);
      for (int64_t i = b; i < e; ++i) {
        const int64_t z = (i % 2 == 0) ? i / 2 : n - 1 - i / 2;  // zig-zag
        const Item& it = items[size_t(z)];
        const AttnSeq& s = seqs[size_t(it.s)];
        const int D = s.kv.head_dim, group = H / s.kv.n_kv_heads;
        const size_t off = (size_t(s.row0 + it.t) * H + size_t(it.g) * group) * D;
        cpu::attend_group_avx512(q + off, group, s.kv, it.g, visible_keys(s, it.t), scale, sc.data(), out + off);
      }
    };
    parallel_for(n, std::ref(body));  // std::ref: no std::function allocation
  }

  void moe_experts(const Buf& x_b, int rows, int d, const Buf& idx_b, const Buf& w_b, int k,
                   const ExpertStack& gate, const ExpertStack& up, const ExpertStack& down, ActPrecision P,
                   const Buf& out_b) override {
    const float *x = x_b.f32(), *w = w_b.f32();
    const int32_t* idx = idx_b.i32();
    float* out = out_b.f32();
    // Group the (row, slot) pairs by expert so each expert's weights run as one M-row matmul.
    const int E = gate.count;
    const int64_t I = gate.rows();
    std::vector<std::vector<int>> by_expert(static_cast<size_t>(E));
    for (int i = 0; i < rows * k; ++i) by_expert[size_t(idx[i])].push_back(i);
    std::vector<float> y(size_t(rows) * k * d);
    std::vector<float> xs, g, u, ys;
    for (int e = 0; e < E; ++e) {
      const auto& items = by_expert[size_t(e)];
      if (items.empty() || !gate.holds(e)) continue;  // (another rank's expert: its y rows stay 0)
      const int m = int(items.size());
      xs.resize(size_t(m) * d);
      for (int i = 0; i < m; ++i)
        std::copy_n(x + size_t(items[i] / k) * d, d, xs.begin() + size_t(i) * d);
      g.resize(size_t(m) * I);
      u.resize(size_t(m) * I);
      ys.resize(size_t(m) * d);
      matmul(xs.data(), m, gate.expert(e), P, g.data());
      matmul(xs.data(), m, up.expert(e), P, u.data());
      gelu_mul(g.data(), u.data(), g.size(), P, g.data());
      matmul(g.data(), m, down.expert(e), P, ys.data());
      for (int i = 0; i < m; ++i) std::copy_n(ys.begin() + size_t(i) * d, d, y.begin() + size_t(items[i]) * d);
    }
    for (int r = 0; r < rows; ++r) {
      float* o = out + size_t(r) * d;
      std::fill(o, o + d, 0.f);
      for (int j = 0; j < k; ++j) {
        const float wj = w[r * k + j];
        const float* yj = y.data() + size_t(r * k + j) * d;
        for (int i = 0; i < d; ++i) o[i] += rnd(wj * yj[i], P);
      }
      round_activations(o, size_t(d), P);
    }
  }

 private:
  const bool avx512_ = detail::cpu_has_avx512();
  const bool vnni_ = gguf::cpu_has_avx512_vnni();
  const bool dynamic_ = [] {
    const char* e = std::getenv("G4_STATIC_SPLIT");
    return !(e && std::string(e) != "0");
  }();
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& opt) {
  if (name == "cpu" || name.empty()) return make_cpu_backend();
  if (name == "reference") return make_reference_backend();
  if (name == "ggml") return make_ggml_backend(nullptr);
  if (name == "cuda") return make_cuda_backend(nullptr, opt);
  return nullptr;
}

}  // namespace g4
