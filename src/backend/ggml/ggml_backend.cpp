// The `ggml` backend: Gemma 3 GGUF files computed the way llama.cpp's CPU backend computes them,
// bit for bit (llama-cpp-python 0.3.36, AVX-512 build; f32 KV cache, no flash attention). It is
// the parity mode for llama.cpp, as bf16 activations are the parity mode for mlx-lm: slower than
// `cpu` at prefill (each output keeps llama.cpp's chain of float operations, which rules out the
// AMX tiles), and exact only where llama.cpp's kernel choice is reproduced:
//   matmul     quant/ggml_exact.h for Q8_0/Q5_0/Q4_0/Q6_K/Q4_K(rows % 8 == 0); other weights fall
//              back to the scalar reference matmul (not llama.cpp-exact);
//   rms_norm, rope (default RoPE, NEOX pairs), attention: ggml_ops.h;
//   gelu_mul_ggml, embed, add, scale, kv_write: HostBackend's (elementwise, already exact).
// Activations must be f32 (GGUF's reference precision); the matmul's M and the attention's batch
// size are the llama.cpp ubatch size, so results match llama.cpp when the runtime feeds the same
// batches (a whole prompt at once, then one token per step).
#include <string>

#include "backend/ggml/ggml_ops.h"
#include "backend/host_backend.h"
#include "quant/ggml_exact.h"
#include "quant/gguf_act.h"

namespace g4 {
namespace {

class GgmlBackend final : public HostBackend {
 public:
  std::string name() const override { return "ggml"; }

  void matmul(const Buf& x, int M, const WeightView& W, ActPrecision P, const Buf& y) override {
    if (P == ActPrecision::F32 && ggml_exact::supports(W)) {
      ggml_exact::matmul(x.f32(), M, W, y.f32());
      return;
    }
    HostBackend::matmul(x, M, W, P, y);
  }

  void rms_norm(const Buf& x, int rows, int dim, const float* w, float eps, ActPrecision P,
                const Buf& y) override {
    if (P != ActPrecision::F32) return HostBackend::rms_norm(x, rows, dim, w, eps, P, y);
    ggml_ops::rms_norm(x.f32(), rows, dim, w, eps, y.f32());
  }

  void rope(const Buf& x, int rows, int heads, int head_dim, int pos0, const RopeTable& t,
            ActPrecision P) override {
    const RopeSpec& s = t.spec;
    if (P != ActPrecision::F32 || s.kind == RopeKind::Proportional) {
      return HostBackend::rope(x, rows, heads, head_dim, pos0, t, P);
    }
    const float freq_scale = s.kind == RopeKind::Linear && s.factor > 0 ? 1.0f / s.factor : 1.0f;
    ggml_ops::rope_neox(x.f32(), rows, heads, head_dim, pos0, s.theta, freq_scale);
  }

  // llama.cpp parity mode: its f32 KV cache only (MLX-style quantized KV is not llama.cpp's).
  bool supports_kv_quant() const override { return false; }
  bool supports_image_blocks() const override { return false; }  // llama.cpp's causal attention only

  void attention(const Buf& q, int H, const std::vector<AttnSeq>& seqs, float scale, ActPrecision P,
                 const Buf& out) override {
    bool ok = P == ActPrecision::F32;
    int rows = 0;
    for (const AttnSeq& s : seqs) {
      ok = ok && s.kv.head_dim % 64 == 0;
      rows += s.n;
    }
    if (!ok) return HostBackend::attention(q, H, seqs, scale, P, out);
    ggml_ops::attention(q.f32(), H, seqs, scale, rows, out.f32());
  }
};

}  // namespace

std::unique_ptr<Backend> make_ggml_backend(std::string* why) {
  // The reproduced kernels are llama.cpp's AVX-512 VNNI ones; they are written with the same
  // instructions, so another ISA could not give the same bits.
  if (!gguf::cpu_has_avx512_vnni() || !__builtin_cpu_supports("avx512dq")) {
    if (why) *why = "needs an x86-64 CPU with AVX-512 (F, BW, DQ, VL, VNNI): it reproduces llama.cpp's AVX-512 kernels";
    return nullptr;
  }
  return std::make_unique<GgmlBackend>();
}

}  // namespace g4
