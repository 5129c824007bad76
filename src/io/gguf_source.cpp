// GgufSource: canonical weight names -> GGUF tensors, viewed in place (see gguf_source.h).
#include "io/gguf_source.h"

#include <cstring>

#include "core/dtype.h"

namespace g4 {

namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

struct Rename {
  std::string_view canonical;  // suffix after "layers.N."
  std::string_view gguf;       // suffix after "blk.N."
};
constexpr Rename kLayerRenames[] = {
    {"self_attn.q_proj", "attn_q.weight"},
    {"self_attn.k_proj", "attn_k.weight"},
    {"self_attn.v_proj", "attn_v.weight"},
    {"self_attn.o_proj", "attn_output.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    {"mlp.gate_proj", "ffn_gate.weight"},
    {"mlp.up_proj", "ffn_up.weight"},
    {"mlp.down_proj", "ffn_down.weight"},
    {"experts.switch_glu.gate_proj", "ffn_gate_exps.weight"},
    {"experts.switch_glu.up_proj", "ffn_up_exps.weight"},
    {"experts.switch_glu.down_proj", "ffn_down_exps.weight"},
    // Gemma 4 (llama.cpp gguf-py constants for MODEL_ARCH.GEMMA4).
    {"pre_feedforward_layernorm_2.weight", "pre_ffw_norm_2.weight"},
    {"post_feedforward_layernorm_1.weight", "post_ffw_norm_1.weight"},
    {"post_feedforward_layernorm_2.weight", "post_ffw_norm_2.weight"},
    {"router.proj", "ffn_gate_inp.weight"},
    {"router.scale", "ffn_gate_inp.scale"},
    {"router.per_expert_scale", "ffn_down_exps.scale"},
    {"per_layer_input_gate", "inp_gate.weight"},
    {"per_layer_projection", "proj.weight"},
    {"post_per_layer_input_norm.weight", "post_norm.weight"},
    {"layer_scalar", "layer_output_scale.weight"},
};

// Gemma 4 files store each layer's expert gate and up projections as one tensor
// blk.N.ffn_gate_up_exps ne = {d, 2I, E}: expert e's gate rows, then its up rows (llama.cpp
// build_moe_ffn splits gate_up into [0, I) and [I, 2I)).
constexpr std::string_view kGateUpFused = "ffn_gate_up_exps.weight";

std::string shape_str(const GgufTensor& t) {
  std::string s = "[";
  for (size_t d = 0; d < t.ne.size(); ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "]";
}

}  // namespace

std::optional<WFormat> wformat_from_ggml(uint32_t ggml_type) {
  switch (GgmlType(ggml_type)) {
    case GgmlType::F32: return WFormat::F32;
    case GgmlType::F16: return WFormat::F16;
    case GgmlType::BF16: return WFormat::BF16;
    case GgmlType::Q4_0: return WFormat::GgufQ4_0;
    case GgmlType::Q5_0: return WFormat::GgufQ5_0;
    case GgmlType::Q8_0: return WFormat::GgufQ8_0;
    case GgmlType::Q4_K: return WFormat::GgufQ4_K;
    case GgmlType::Q5_K: return WFormat::GgufQ5_K;
    case GgmlType::Q6_K: return WFormat::GgufQ6_K;
    default: return std::nullopt;
  }
}

std::string gguf_name_for(std::string_view c) {
  if (c == "embed_tokens") return "token_embd.weight";
  if (c == "lm_head") return "output.weight";
  if (c == "norm.weight") return "output_norm.weight";
  if (c == "embed_tokens_per_layer") return "per_layer_token_embd.weight";
  if (c == "per_layer_model_projection") return "per_layer_model_proj.weight";
  if (c == "per_layer_projection_norm.weight") return "per_layer_proj_norm.weight";
  if (!starts_with(c, "layers.")) return "";
  std::string_view rest = c.substr(7);
  size_t dot = rest.find('.');
  if (dot == std::string_view::npos || dot == 0) return "";
  std::string_view idx = rest.substr(0, dot);
  for (char ch : idx)
    if (ch < '0' || ch > '9') return "";
  std::string_view suffix = rest.substr(dot + 1);
  for (const Rename& r : kLayerRenames)
    if (suffix == r.canonical) return "blk." + std::string(idx) + "." + std::string(r.gguf);
  return "";
}

Result<const GgufTensor*> GgufSource::resolve(std::string_view canonical) const {
  std::string name = gguf_name_for(canonical);
  if (name.empty())
    return err("%s: no GGUF tensor name for canonical weight %.*s", file_->path().c_str(),
               int(canonical.size()), canonical.data());
  const GgufTensor* t = file_->tensor(name);
  if (!t && canonical == "lm_head") t = file_->tensor("token_embd.weight");  // tied embeddings
  if (!t)
    return err("%s: missing tensor %s (for %.*s)", file_->path().c_str(), name.c_str(),
               int(canonical.size()), canonical.data());
  return t;
}

bool GgufSource::has(std::string_view canonical) const {
  std::string name = gguf_name_for(canonical);
  return !name.empty() && file_->tensor(name) != nullptr;
}

Result<WeightView> GgufSource::matrix(std::string_view module, int64_t rows, int64_t cols) const {
  return stacked_matrix(module, 0, 0, rows, cols);
}

// count == 0: a plain 2-D matrix ne = {cols, rows}; else matrix `index` of ne = {cols, rows, count}.
Result<WeightView> GgufSource::stacked_matrix(std::string_view module, int64_t index,
                                              int64_t count, int64_t rows, int64_t cols) const {
  // The gate or up half of a fused gate_up expert tensor: the same view over rows [0, 2I) of
  // each expert with the half's offset.
  int64_t half = -1;
  const GgufTensor* t = nullptr;
  if (count > 0) {
    const bool gate = module.ends_with("experts.switch_glu.gate_proj");
    if (gate || module.ends_with("experts.switch_glu.up_proj")) {
      const std::string name = gguf_name_for(module);  // "blk.N.ffn_{gate,up}_exps.weight"
      const size_t blk_end = name.find('.', 4) + 1;      // after "blk.N."
      if ((t = file_->tensor(name.substr(0, blk_end) + std::string(kGateUpFused))) != nullptr) half = gate ? 0 : 1;
    }
  }
  if (!t) {
    G4_ASSIGN_OR_RETURN(t, resolve(module));
  }
  const int64_t stored_rows = half >= 0 ? 2 * rows : rows;
  const char* P = file_->path().c_str();
  bool ok = t->n_dims() >= 2 && t->ne[0] == cols && t->ne[1] == stored_rows;
  if (count == 0) {
    for (int d = 2; d < t->n_dims(); ++d) ok = ok && t->ne[d] == 1;
  } else {
    ok = ok && t->n_dims() >= 3 && t->ne[2] == count;
    for (int d = 3; d < t->n_dims(); ++d) ok = ok && t->ne[d] == 1;
  }
  if (!ok) {
    std::string want = count ? "[" + std::to_string(cols) + ", " + std::to_string(stored_rows) + ", " +
                                   std::to_string(count) + "]"
                             : "[" + std::to_string(cols) + ", " + std::to_string(rows) + "]";
    return err("%s: tensor %s has ggml shape %s, expected %s", P, t->name.c_str(),
               shape_str(*t).c_str(), want.c_str());
  }
  if (count && (index < 0 || index >= count))
    return err("%s: tensor %s: expert index %lld out of range [0, %lld)", P, t->name.c_str(),
               (long long)index, (long long)count);
  std::optional<WFormat> fmt = wformat_from_ggml(t->type);
  if (!fmt)
    return err("%s: unsupported ggml type %s for tensor %s", P, ggml_type_name(t->type).c_str(),
               t->name.c_str());
  WeightView v;
  v.fmt = *fmt;
  v.rows = rows;
  v.cols = cols;
  v.row_bytes = t->row_bytes();
  v.data = t->data + (uint64_t(index) * uint64_t(stored_rows) + uint64_t(half > 0 ? rows : 0)) *
                         uint64_t(v.row_bytes);
  return v;
}

Result<std::vector<float>> read_float_tensor(const GgufFile& file, const GgufTensor& tensor, int64_t n) {
  const GgufTensor* t = &tensor;
  const char* P = file.path().c_str();
  if (t->n_elements != n)
    return err("%s: tensor %s has %lld elements %s, expected %lld", P, t->name.c_str(),
               (long long)t->n_elements, shape_str(*t).c_str(), (long long)n);
  DType dt;
  switch (GgmlType(t->type)) {
    case GgmlType::F32: dt = DType::F32; break;
    case GgmlType::F16: dt = DType::F16; break;
    case GgmlType::BF16: dt = DType::BF16; break;
    default:
      return err("%s: unsupported ggml type %s for vector tensor %s (expected F32/F16/BF16)", P,
                 ggml_type_name(t->type).c_str(), t->name.c_str());
  }
  std::vector<float> out(static_cast<size_t>(n));
  size_t es = dtype_size(dt);
  for (int64_t i = 0; i < n; ++i) {
    // The data section may be unaligned for the element type; copy through memcpy.
    uint32_t raw = 0;
    std::memcpy(&raw, t->data + size_t(i) * es, es);
    out[size_t(i)] = load_float(&raw, dt, 0);
  }
  return out;
}

Result<std::vector<float>> GgufSource::vector(std::string_view tensor, int64_t n) const {
  G4_ASSIGN_OR_RETURN(const GgufTensor* t, resolve(tensor));
  return read_float_tensor(*file_, *t, n);
}

std::string GgufSource::describe() const {
  return "GGUF v" + std::to_string(file_->version()) + " " + file_->path() + " (" +
         std::to_string(file_->tensors().size()) + " tensors)";
}

}  // namespace g4
