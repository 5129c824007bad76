// The resolved model architecture: one ModelConfig plus one LayerSpec per layer. In core/ because
// io (which builds it), model and backend all read it; it depends on nothing but core.
// Built once from config.json (Gemma 4, any nesting) or from GGUF metadata (Gemma 3);
// forward code reads these fields and never re-derives patterns.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace g4 {

// The largest sliding window a config may declare: each sliding layer's KV ring is allocated up
// front with window + chunk - 1 slots (model/kv_cache.h), so the window bounds that allocation.
// Real checkpoints use 512-4096.
constexpr int kMaxSlidingWindow = 1 << 16;

enum class AttnKind : uint8_t { Sliding, Full };

enum class RopeKind : uint8_t {
  Default,       // inv_freq_j = base^(-2j/D), all D/2 pairs rotate
  Proportional,  // Gemma 4 full layers: first partial*D/2 pairs use base^(-2j/D) (exponent over the
                 // FULL D), the rest do not rotate; frequencies divided by `factor`
  Linear,        // Gemma 3 global layers: positions divided by `factor`
};

struct RopeSpec {
  RopeKind kind = RopeKind::Default;
  float theta = 10000.f;
  float partial_factor = 1.f;  // fraction of the head dim that rotates (Proportional)
  float factor = 1.f;          // scaling factor (Proportional: freqs*factor; Linear: pos/factor)
};

struct LayerSpec {
  AttnKind kind = AttnKind::Sliding;
  int head_dim = 256;
  int n_kv_heads = 1;
  int window = 0;             // sliding window W (keys k with q-k < W); 0 for full layers
  bool k_eq_v = false;        // full layer without v_proj: V is the raw K projection
  int kv_source = -1;         // -1: this layer owns its KV cache; else the donor layer index
  int mlp_width = 0;          // dense MLP intermediate size (double-wide already applied)
  bool moe = false;           // experts beside the dense MLP
  RopeSpec rope;
};

enum class NormStyle : uint8_t {
  Plain,      // Gemma 4: y = x/rms * w
  OnePlusW,   // Gemma 3 as stored by HF safetensors: y = x/rms * (1 + w)
};

// How the MLP's gelu_tanh(gate) * up is evaluated.
enum class GeluImpl : uint8_t {
  Tanh,          // in f32 (or bf16 per op, MLX's order): the checkpoints' own definition
  GgmlF16Table,  // llama.cpp's: through an f16 lookup table (Backend::gelu_mul_ggml); GGUF files
};

struct ModelConfig {
  std::string model_type;     // "gemma4_text", "gemma3", ...
  int hidden = 0;             // d
  int n_layers = 0;           // N
  int n_heads = 0;            // H (same on every layer)
  int vocab = 0;
  float rms_eps = 1e-6f;
  float query_scale = 1.f;    // SDPA scale (1.0 for Gemma 4; Gemma 3 uses query_pre_attn_scalar^-0.5)
  bool qk_norm = true;
  bool v_norm = true;         // weightless RMSNorm on V (Gemma 4)
  NormStyle norm_style = NormStyle::Plain;
  float final_softcap = 0.f;  // 0 = off
  GeluImpl gelu = GeluImpl::Tanh;
  // The activation precision of the format's reference engine, the default of the checking verbs
  // (logits, greedy): BF16 for MLX / HF checkpoints (mlx-lm runs them in bf16), F32 for GGUF files
  // (ggml computes in f32). The runtime engine always runs F32.
  ActPrecision reference_precision = ActPrecision::BF16;
  bool tie_embeddings = true;
  // Per-layer input embeddings (E2B/E4B). 0 = off.
  int ple_width = 0;
  int ple_vocab = 0;
  // MoE (26B-A4B).
  int n_experts = 0;
  int top_k_experts = 0;
  int moe_width = 0;
  int n_kv_shared = 0;        // trailing layers that reuse KV (first shared = n_layers - n_kv_shared)
  int max_positions = 0;
  std::vector<LayerSpec> layers;

  // Token ids from config.json / generation_config.json.
  std::vector<int> eos_ids;
  int bos_id = 2;
  int pad_id = 0;
  // The image soft-token id of a multimodal checkpoint (image_token_id; -1: text-only config).
  int image_token = -1;
  // use_bidirectional_attention == "vision" (12B/26B/31B): each run of image tokens attends within
  // itself bidirectionally, on full and sliding layers alike (spec §8.4).
  bool bidi_images = false;

  // Sampling defaults from generation_config.json, when present (<0 / 0 = absent).
  float gen_temperature = -1.f;
  int gen_top_k = 0;
  float gen_top_p = -1.f;

  int first_kv_shared() const { return n_layers - n_kv_shared; }
};

// Quantization of one module, from config.json's `quantization` block.
struct ModuleQuant {
  bool quantized = false;
  int bits = 0;
  int group_size = 0;
};

}  // namespace g4
