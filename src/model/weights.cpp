#include "model/weights.h"

#include <cmath>
#include <optional>
#include <string>

#include "core/progress.h"

namespace g4 {
namespace {

size_t view_bytes(const WeightView& w) {
  size_t b = size_t(w.rows) * size_t(w.row_bytes);
  if (w.fmt == WFormat::MlxAffine && w.group_size > 0)
    b += 2 * size_t(w.rows) * size_t(w.cols / w.group_size) * dtype_size(w.scale_dtype);
  return b;
}

struct Loader {
  const ModelConfig& cfg;
  const WeightSource& src;
  Backend& be;
  ModelWeights& mw;

  // The source's view of a matrix, not yet placed (place_stack places it with the others of its op).
  Status view(const std::string& name, int64_t rows, int64_t cols, WeightView& out) {
    auto r = src.matrix(name, rows, cols);
    if (!r) return Error{r.message()};
    out = r.value();
    mw.weight_bytes += view_bytes(out);
    return {};
  }
  Status mat(const std::string& name, int64_t rows, int64_t cols, WeightView& out) {
    G4_TRY(view(name, rows, cols, out));
    out = be.place_weight(out);
    return {};
  }
  // One projection of the routed experts, as one stack placed at once.
  Status experts(const std::string& name, int E, int64_t rows, int64_t cols, ExpertStack& out) {
    std::vector<WeightView> views(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      auto r = src.stacked_matrix(name, e, E, rows, cols);
      if (!r) return Error{r.message()};
      views[size_t(e)] = r.value();
      mw.weight_bytes += view_bytes(r.value());
    }
    G4_ASSIGN_OR_RETURN(ExpertStack s, stack_experts(views, name));
    out = be.place_experts(s);
    return {};
  }
  DeviceVec upload(const std::vector<float>& v) {
    const Buf p = be.alloc_f32(v.size());  // norm weights stay f32 on every backend
    be.from_host(v.data(), v.size(), p);
    return DeviceVec{p.f32(), int(v.size())};
  }
  // Loads a norm weight, applying the checkpoint's norm convention (1 + w for Gemma 3 HF style).
  Status norm(const std::string& name, int n, DeviceVec& out) {
    auto r = src.vector(name, n);
    if (!r) return Error{r.message()};
    std::vector<float> v = std::move(r).value();
    if (cfg.norm_style == NormStyle::OnePlusW)
      for (float& x : v) x += 1.f;
    out = upload(v);
    mw.weight_bytes += v.size() * 2;
    return {};
  }
};

}  // namespace

Result<ModelWeights> load_weights(const ModelConfig& cfg, const WeightSource& src, Backend& be) {
  ModelWeights mw;
  Loader L{cfg, src, be, mw};
  const int d = cfg.hidden, N = cfg.n_layers, P = cfg.ple_width, H = cfg.n_heads;
  G4_TRY(L.mat("embed_tokens", cfg.vocab, d, mw.embed));
  if (!cfg.tie_embeddings && src.has("lm_head")) {
    G4_TRY(L.mat("lm_head", cfg.vocab, d, mw.lm_head));
  } else {
    mw.lm_head = mw.embed;
  }
  G4_TRY(L.norm("norm.weight", d, mw.final_norm));
  if (P > 0) {
    G4_TRY(L.mat("embed_tokens_per_layer", cfg.ple_vocab, int64_t(N) * P, mw.embed_ple));
    G4_TRY(L.mat("per_layer_model_projection", int64_t(N) * P, d, mw.ple_model_proj));
    G4_TRY(L.norm("per_layer_projection_norm.weight", P, mw.ple_proj_norm));
  }
  mw.layers.resize(size_t(N));
  // A device backend copies every matrix into its memory here (seconds for tens of GB): a bar
  // counts the layers placed.
  std::optional<ProgressTask> placed;
  if (be.on_device()) placed.emplace("copying weights to " + be.name(), uint64_t(N), ProgressUnit::Iterations);
  for (int i = 0; i < N; ++i) {
    if (placed && i > 0) placed->add(1);
    const LayerSpec& ls = cfg.layers[size_t(i)];
    LayerWeights& lw = mw.layers[size_t(i)];
    const std::string p = "layers." + std::to_string(i) + ".";
    const int D = ls.head_dim, Hk = ls.n_kv_heads;
    // q, k and v (those the layer has) are one stack: the forward projects the normed input
    // through them in one op (Model's norm_matmuls); so are gate and up (gate_up_gelu).
    G4_TRY(L.view(p + "self_attn.q_proj", int64_t(H) * D, d, lw.q));
    if (ls.kv_source < 0) {
      G4_TRY(L.view(p + "self_attn.k_proj", int64_t(Hk) * D, d, lw.k));
      if (!ls.k_eq_v) G4_TRY(L.view(p + "self_attn.v_proj", int64_t(Hk) * D, d, lw.v));
    }
    be.place_stack({&lw.q, &lw.k, &lw.v}, StackUse::Outputs);
    G4_TRY(L.mat(p + "self_attn.o_proj", d, int64_t(H) * D, lw.o));
    if (cfg.qk_norm) G4_TRY(L.norm(p + "self_attn.q_norm.weight", D, lw.q_norm));
    if (ls.kv_source < 0 && cfg.qk_norm) G4_TRY(L.norm(p + "self_attn.k_norm.weight", D, lw.k_norm));
    G4_TRY(L.norm(p + "input_layernorm.weight", d, lw.input_ln));
    G4_TRY(L.norm(p + "post_attention_layernorm.weight", d, lw.post_attn_ln));
    G4_TRY(L.norm(p + "pre_feedforward_layernorm.weight", d, lw.pre_ffw_ln));
    G4_TRY(L.norm(p + "post_feedforward_layernorm.weight", d, lw.post_ffw_ln));
    G4_TRY(L.view(p + "mlp.gate_proj", ls.mlp_width, d, lw.gate));
    G4_TRY(L.view(p + "mlp.up_proj", ls.mlp_width, d, lw.up));
    be.place_stack({&lw.gate, &lw.up}, StackUse::Gated);
    G4_TRY(L.mat(p + "mlp.down_proj", d, ls.mlp_width, lw.down));
    if (ls.moe) {
      const int E = cfg.n_experts, I = cfg.moe_width;
      G4_TRY(L.mat(p + "router.proj", E, d, lw.router));
      auto sc = src.vector(p + "router.scale", d);
      if (!sc) return Error{sc.message()};
      // mlx-lm Router: rms_norm(x, scale * d^-0.5): the product is one parameter-sized op in T.
      const float root = float(std::pow(double(d), -0.5));
      std::vector<float> f32(static_cast<size_t>(d)), b16(static_cast<size_t>(d));
      for (int j = 0; j < d; ++j) {
        f32[size_t(j)] = sc.value()[size_t(j)] * root;
        b16[size_t(j)] = round_bf16(round_bf16(sc.value()[size_t(j)]) * round_bf16(root));
      }
      lw.router_norm_w[0] = L.upload(f32);
      lw.router_norm_w[1] = L.upload(b16);
      auto pes = src.vector(p + "router.per_expert_scale", E);
      if (!pes) return Error{pes.message()};
      lw.per_expert_scale_host = pes.value();
      lw.per_expert_scale = L.upload(pes.value());
      for (auto [name, rows, cols, stack] :
           {std::tuple{"experts.switch_glu.gate_proj", I, d, &lw.ex_gate},
            std::tuple{"experts.switch_glu.up_proj", I, d, &lw.ex_up},
            std::tuple{"experts.switch_glu.down_proj", d, I, &lw.ex_down}})
        G4_TRY(L.experts(p + name, E, rows, cols, *stack));
      G4_TRY(L.norm(p + "pre_feedforward_layernorm_2.weight", d, lw.pre_ffw_ln2));
      G4_TRY(L.norm(p + "post_feedforward_layernorm_1.weight", d, lw.post_ffw_ln1));
      G4_TRY(L.norm(p + "post_feedforward_layernorm_2.weight", d, lw.post_ffw_ln2));
    }
    if (P > 0) {
      G4_TRY(L.mat(p + "per_layer_input_gate", P, d, lw.ple_gate));
      G4_TRY(L.mat(p + "per_layer_projection", d, P, lw.ple_proj));
      G4_TRY(L.norm(p + "post_per_layer_input_norm.weight", d, lw.post_ple_ln));
    }
    if (src.has(p + "layer_scalar")) {
      auto s = src.vector(p + "layer_scalar", 1);
      if (!s) return Error{s.message()};
      lw.layer_scalar = s.value()[0];
    }
  }
  if (placed) placed->add(1);
  return mw;
}

}  // namespace g4
