// The Gemma 4 vision encoder (spec §8.2; mlx-vlm gemma4/vision.py, HF Gemma4VisionModel) and the
// embedder that projects its output into the text model (embed_vision):
//   x   = input_proj(2·(pixels − 0.5)) + T[0][x] + T[1][y]            per patch, T [2, P, d_v]
//   per layer (Gemma sandwich: input / post-attention / pre-FFW / post-FFW RMSNorm with weight):
//     q, k, v = clip(Linear(clip(xn)))  (ClippableLinear: scalar input and output bounds)
//     q, k: RMSNorm with weight over each head; v: RMSNorm without weight; 2-D RoPE (θ from
//     rope_parameters, default 100): the first half of each head rotates with the patch column,
//     the second half with the row, half-split pairs within each half; attention scale 1,
//     bidirectional over the image's patches; o = clip(Linear(clip(att)))
//     MLP: down(gelu_tanh(gate(xn)) · up(xn)), each a ClippableLinear
//   pool: the mean of each 3×3 block of patches (row-major over the pooled grid) · √d_v
//   standardize (26B/31B): (h − std_bias) · std_scale
//   embed_vision: RMSNorm without weight, then Linear(d_v → d_text)
// gemma4_unified (the 12B) has no encoder: VisionConfig::unified describes its embedder.
// One image's patches form one attention block (HF pads to the budget and masks the padding,
// which changes nothing). Runs on the model's backend: projections and norms through its ops,
// the RoPE, attention, clamps and pooling on the host.
#pragma once
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "io/weight_source.h"
#include "vision/preprocess.h"

namespace g4 {

struct VisionConfig {
  int hidden = 768;
  int intermediate = 3072;
  int layers = 16;
  int heads = 12;
  int kv_heads = 12;
  int head_dim = 64;
  int patch = 16;
  int pool = 3;
  int position_embedding_size = 10240;
  int default_soft_tokens = 280;  // vision_soft_tokens_per_image / default_output_length
  float rms_eps = 1e-6f;
  float rope_theta = 100.f;
  bool clipped_linears = false;
  bool standardize = false;
  int text_hidden = 0;
  // text_config.use_bidirectional_attention == "vision" (12B/26B/31B): the text model attends
  // bidirectionally within each image (Backend::supports_image_blocks).
  bool text_bidirectional_images = false;
  int image_token = 258880, boi_token = 255999, eoi_token = 258882;
  // gemma4_unified (12B): no encoder. Each soft token is one model_patch × model_patch patch
  // (48 = patch · pool): LayerNorm -> Linear(+bias) -> LayerNorm -> + P[x][0] + P[y][1] ->
  // LayerNorm (mlx-vlm VisionEmbedder; eps 1e-5, the library default that HF and mlx-vlm use),
  // then embed_vision from output_proj dims.
  bool unified = false;
  int model_patch = 48, mm_embed = 0, mm_posemb = 0, output_proj = 0;
};

// The vision_config of a nested gemma4 / gemma4_unified config.json (`file` names it in errors).
// Errors for a config without vision_config.
Result<VisionConfig> parse_vision_config(const std::string& config_json, const std::string& file);

class VisionEncoder {
 public:
  // Loads the vision tower and embed_vision of the checkpoint in `dir` onto `be`.
  static Result<std::unique_ptr<VisionEncoder>> load(const std::string& dir, Backend& be);
  // load() when `dir` is a checkpoint directory whose config.json has a vision_config and whose
  // tensors include the vision tower; null (no error) for text-only checkpoints and GGUF files.
  static Result<std::unique_ptr<VisionEncoder>> load_if_present(const std::string& dir, Backend& be);
  ~VisionEncoder();
  const VisionConfig& config() const { return cfg_; }

  // Soft tokens one image becomes (after pooling), for a patch grid.
  int soft_tokens(const PatchGrid& g) const { return cfg_.unified ? g.patches() : g.patches() / (cfg_.pool * cfg_.pool); }
  // Ok when prompts with images can run on the text model on backend `be`; else the reason.
  Status usable_for_prompts(const Backend& be) const;
  // Preprocesses an image with this encoder's patch and pool sizes and `max_soft_tokens`
  // (0: the config's default).
  Result<PatchGrid> patches(const RgbImage& img, int max_soft_tokens = 0) const;
  // Replaces each image token of `ids` (what a chat template writes per image) with
  // boi + soft_tokens[i] × image + eoi (HF Gemma4Processor). Error when the counts differ.
  Result<std::vector<int32_t>> expand_image_tokens(const std::vector<int32_t>& ids,
                                                   const std::vector<int>& soft_tokens) const;
  // The text-space features of one image: host [soft_tokens, text_hidden]. `pooled` (host, or
  // null) receives the encoder's pooled output before embed_vision [soft_tokens, hidden].
  Result<std::vector<float>> encode(const PatchGrid& g, std::vector<float>* pooled = nullptr);

 private:
  struct Clip {
    float in_min = -INFINITY, in_max = INFINITY, out_min = -INFINITY, out_max = INFINITY;
  };
  struct Layer {
    WeightView q, k, v, o, gate, up, down;
    Clip cq, ck, cv, co, cgate, cup, cdown;
    const float *q_norm = nullptr, *k_norm = nullptr;
    const float *input_ln = nullptr, *post_attn_ln = nullptr, *pre_ffw_ln = nullptr, *post_ffw_ln = nullptr;
  };
  VisionEncoder(VisionConfig c, Backend& be) : cfg_(c), be_(be) {}
  Result<std::vector<float>> encode_unified(const PatchGrid& g, std::vector<float>* pooled);
  // embed_vision: RMSNorm without weight over rows of x (backend, [n, width]), then the projection.
  std::vector<float> embed(const Buf& x, int n, int width);
  // y = clip(x·Wᵀ) with x clipped first (ClippableLinear), x [M, W.cols] backend buffers.
  void linear(const Buf& x, int M, const WeightView& W, const Clip& c, const Buf& y);
  float* vec(const std::vector<float>& v);

  VisionConfig cfg_;
  Backend& be_;
  std::shared_ptr<const WeightSource> src_;
  WeightView input_proj_, embed_proj_;
  std::vector<float> pos_table_;  // [2, P, hidden] host
  std::vector<float> std_bias_, std_scale_;
  // gemma4_unified: the embedder's LayerNorms (weight, bias), dense bias and position table.
  std::vector<float> ln1_w_, ln1_b_, ln2_w_, ln2_b_, lnp_w_, lnp_b_, dense_b_, posemb_;
  WeightView dense_;
  std::vector<Layer> layers_;
  std::vector<float*> owned_;
};

}  // namespace g4
