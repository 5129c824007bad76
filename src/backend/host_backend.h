// Backends whose memory is host RAM. HostBackend implements every op with plain scalar loops
// (the obviously-correct reference semantics); the fast CPU backend derives from it and replaces
// the hot ops (matmul, attention, moe) with threaded SIMD versions that tests compare against these.
#pragma once
#include <mutex>
#include <unordered_set>

#include "backend/backend.h"

namespace g4 {

// MLX's CPU quantized matmul in bf16 (mlx backend/cpu/quantized.cpp _qmm_t with T = bfloat16):
// each weight is dequantized in bf16 as bf16(bf16(scale*q) + bias), each product x*w is rounded
// to bf16 and accumulated IN BF16, column by column. Slow; used only when P == BF16 on MLX
// affine weights, which is the parity mode against mlx-lm on the CPU (verified bit-exact).
void matmul_mlx_bf16_emulation(const float* x, int M, const WeightView& W, float* y);
// MLX's CPU bf16 gemm (float weights): products accumulated sequentially in f32, then rounded.
void matmul_mlx_float_bf16_emulation(const float* x, int M, const WeightView& W, float* y);
// The parity-mode matmul for formats MLX checkpoints use (MLX affine, BF16/F16/F32).
inline bool is_mlx_parity_format(WFormat f) {
  return f == WFormat::MlxAffine || f == WFormat::BF16 || f == WFormat::F16 || f == WFormat::F32;
}
void matmul_mlx_bf16_parity(const float* x, int M, const WeightView& W, float* y);
// mx.dequantize of one row in bf16: bf16(bf16(scale*q) + bias) per element.
void dequant_row_mlx_bf16(const WeightView& W, int64_t r, float* out);

// ggml's GELU lookup table (Backend::gelu_mul_ggml): entry h = f16(gelu_tanh(f32(h))) for every
// f16 bit pattern h, computed as llama.cpp's build computes it.
const std::vector<uint16_t>& ggml_gelu_f16_table();

// Head g of the K (value=false) or V row held in `slot`: a pointer into the f32 cache, or, for a
// quantized cache, that row dequantized exactly (dequant_row: scale*q + bias in f32, as MLX's
// quantized matmul sees it) into buf [head_dim].
const float* kv_head_row(const KvBuffer& kv, bool value, int slot, int g, float* buf);

// Rounds p[0, n) to bf16 in place when P == BF16.
void round_activations(float* p, size_t n, ActPrecision P);
inline float rnd(float x, ActPrecision P) { return P == ActPrecision::BF16 ? round_bf16(x) : x; }

class HostBackend : public Backend {
 public:
  ~HostBackend() override;
  Buf alloc(DType t, size_t n) override;
  void free(void* p) override;
  using Backend::free;
  void read_bytes(const Buf& src, size_t bytes, void* dst) override;
  void write_bytes(const void* src, size_t bytes, const Buf& dst) override;
  void copy_bytes(const Buf& src, size_t bytes, const Buf& dst) override;

  void embed(const WeightView& E, const Buf& ids, int n, float scale, ActPrecision P, const Buf& out) override;
  void matmul(const Buf& x, int M, const WeightView& W, ActPrecision P, const Buf& y) override;
  void rms_norm(const Buf& x, int rows, int dim, const float* w, float eps, ActPrecision P, const Buf& y) override;
  void rope(const Buf& x, int rows, int heads, int head_dim, int pos0, const RopeTable& t, ActPrecision P) override;
  void kv_write(const AttnSeq& s, const Buf& k, const Buf& v) override;
  bool supports_kv_quant() const override { return true; }
  void attention(const Buf& q, int H, const std::vector<AttnSeq>& seqs, float scale, ActPrecision P,
                 const Buf& out) override;
  void gelu_mul(const Buf& gate, const Buf& up, size_t n, ActPrecision P, const Buf& out) override;
  void gelu_mul_ggml(const Buf& gate, const Buf& up, size_t n, const Buf& out) override;
  void add(const Buf& a, const Buf& b, size_t n, ActPrecision P, const Buf& y) override;
  void scale(const Buf& a, float s, size_t n, ActPrecision P, const Buf& y) override;
  void softcap(const Buf& x, size_t n, float cap, ActPrecision P) override;
  void gather_rows(const Buf& src, const Buf& idx, int n, int dim, const Buf& dst) override;
  void copy_cols(const Buf& src, int rows, int src_dim, int off, int n, const Buf& dst) override;
  void router_topk(const Buf& scores, int rows, int E, int k, const float* per_expert_scale, ActPrecision P,
                   const Buf& idx, const Buf& weights) override;
  void moe_experts(const Buf& x, int rows, int d, const Buf& idx, const Buf& w, int k,
                   const ExpertStack& gate, const ExpertStack& up, const ExpertStack& down, ActPrecision P,
                   const Buf& out) override;

 public:
  bool supports_image_blocks() const override { return true; }

 protected:
  // Attention for one (sequence, query row, head) over the keys at positions keys.lo..keys.hi
  // (visible_keys): the scalar kernel both backends share.
  static void attend_one(const float* q, const KvBuffer& kv, int kv_head, KeyRange keys, float scale,
                         ActPrecision P, float* scratch, float* out);

 private:
  std::mutex mu_;
  std::unordered_set<void*> owned_;
};

}  // namespace g4
