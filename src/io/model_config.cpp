// config.json -> ModelConfig + QuantConfig. Mirrors mlx-lm gemma4_text.ModelArgs (defaults,
// layer_types derivation), gemma4.ModelArgs (nested wrapper), Attention/MLP constructors (per-layer
// geometry), Gemma4TextModel.previous_kvs (KV donors), utils.load_config (generation_config eos)
// and utils.load_model (quantization block).
#include "io/model_config.h"

#include "io/json_bounded.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace g4 {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string one_line(std::string m) {
  for (char& c : m)
    if (c == '\n' || c == '\r') c = ' ';
  return m;
}

Result<json> parse_json(std::string_view text, const std::string& label) {
  std::string why;
  auto j = parse_json_bounded<json>(text, JsonLimits{}, why);
  if (!j) return err("%s: not valid JSON: %s", label.c_str(), one_line(why).c_str());
  return std::move(*j);
}

// Typed field access on one JSON object; `prefix` is prepended to field names in errors
// ("text_config.").
struct Fields {
  const json& j;
  const std::string& file;
  std::string prefix;

  const json* get(const char* k) const {
    auto it = j.find(k);
    return it == j.end() ? nullptr : &*it;
  }
  bool has(const char* k) const { return get(k) != nullptr; }
  bool has_value(const char* k) const {
    auto* v = get(k);
    return v && !v->is_null();
  }
  Error type_error(const char* k, const char* want, const json& v) const {
    return err("%s: field '%s%s' must be %s (got %s)", file.c_str(), prefix.c_str(), k, want, v.type_name());
  }
  Error missing(const char* k) const {
    return err("%s: missing required field '%s%s'", file.c_str(), prefix.c_str(), k);
  }
  Error bad(const char* k, const char* why) const {
    return err("%s: field '%s%s' %s", file.c_str(), prefix.c_str(), k, why);
  }
  // Integer in [lo, hi]. `null_ok`: null counts as missing.
  Result<int> integer(const char* k, std::optional<int> def, int lo, int hi, bool null_ok = false) const {
    const json* v = get(k);
    if (!v || (null_ok && v->is_null())) {
      if (!def) return missing(k);
      return *def;
    }
    int64_t x;
    if (v->is_number_integer()) {
      x = v->get<int64_t>();
    } else if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() == std::floor(v->get<double>()) &&
               std::fabs(v->get<double>()) < 1e15) {
      x = int64_t(v->get<double>());  // 512.0 written by some tools
    } else {
      return type_error(k, "an integer", *v);
    }
    if (x < lo || x > hi)
      return err("%s: field '%s%s' = %lld is out of range [%d, %d]", file.c_str(), prefix.c_str(), k, (long long)x,
                 lo, hi);
    return int(x);
  }
  Result<double> number(const char* k, double def, bool null_ok = false) const {
    const json* v = get(k);
    if (!v || (null_ok && v->is_null())) return def;
    if (!v->is_number()) return type_error(k, "a number", *v);
    double x = v->get<double>();
    if (!std::isfinite(x)) return bad(k, "must be finite");
    return x;
  }
  Result<bool> boolean(const char* k, bool def) const {
    const json* v = get(k);
    if (!v || v->is_null()) return def;
    if (!v->is_boolean()) return type_error(k, "true or false", *v);
    return v->get<bool>();
  }
};

constexpr int kMaxDim = 1 << 22;  // generous bound on any width; keeps products inside int64

// eos_token_id: an int or a list of ints.
Result<std::vector<int>> token_list(const json& v, const std::string& file, const char* field) {
  std::vector<int> out;
  auto one = [&](const json& x) -> Status {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      return err("%s: field '%s' must be a token id or a list of token ids (got %s)", file.c_str(), field,
                 x.type_name());
    out.push_back(int(x.get<int64_t>()));
    return Status::ok();
  };
  if (v.is_array()) {
    for (const auto& x : v) G4_TRY(one(x));
  } else {
    G4_TRY(one(v));
  }
  return out;
}

// mlx-lm truthiness of generation_config's eos_token_id (`if eos := gen.get(...)`).
bool truthy(const json& v) {
  if (v.is_null()) return false;
  if (v.is_array() || v.is_object()) return !v.empty();
  if (v.is_number_integer()) return v.get<int64_t>() != 0;
  if (v.is_boolean()) return v.get<bool>();
  return true;
}

// One rope_parameters entry (mlx-lm rope_utils.initialize_rope).
Result<RopeSpec> parse_rope(const json* p, const std::string& file, const std::string& where) {
  RopeSpec r;
  r.theta = 10000.f;
  if (!p || p->is_null()) return r;
  if (!p->is_object()) return err("%s: field '%s' must be an object (got %s)", file.c_str(), where.c_str(), p->type_name());
  Fields f{*p, file, where + "."};
  std::string type = "default";
  const json* t = f.get("type");
  if (!t || t->is_null()) t = f.get("rope_type");
  if (t && !t->is_null()) {
    if (!t->is_string()) return f.type_error(f.has("type") ? "type" : "rope_type", "a string", *t);
    type = t->get<std::string>();
  }
  G4_ASSIGN_OR_RETURN(double theta, f.number("rope_theta", 10000.0));
  if (!(theta > 0)) return f.bad("rope_theta", "must be positive");
  r.theta = float(theta);
  if (type == "default") {
    r.kind = RopeKind::Default;
  } else if (type == "linear") {
    if (!f.has_value("factor")) return f.missing("factor");
    G4_ASSIGN_OR_RETURN(double factor, f.number("factor", 1.0));
    if (!(factor > 0)) return f.bad("factor", "must be positive");
    r.kind = RopeKind::Linear;
    r.factor = float(factor);
  } else if (type == "proportional") {
    G4_ASSIGN_OR_RETURN(double partial, f.number("partial_rotary_factor", 1.0));
    G4_ASSIGN_OR_RETURN(double factor, f.number("factor", 1.0));
    if (!(partial > 0 && partial <= 1)) return f.bad("partial_rotary_factor", "must be in (0, 1]");
    if (!(factor > 0)) return f.bad("factor", "must be positive");
    r.kind = RopeKind::Proportional;
    r.partial_factor = float(partial);
    r.factor = float(factor);
  } else {
    return err("%s: field '%s.rope_type' = '%s' is not supported (default, linear, proportional)", file.c_str(),
               where.c_str(), type.c_str());
  }
  return r;
}

Result<QuantConfig> parse_quant(const json& top, const json& text, const std::string& file) {
  QuantConfig q;
  const json* block = nullptr;
  std::string name;
  auto pick = [&](const json& o, const char* k, const char* label) {
    if (block || !o.is_object()) return;
    auto it = o.find(k);
    if (it != o.end() && !it->is_null()) {
      block = &*it;
      name = label;
    }
  };
  pick(top, "quantization", "quantization");
  pick(top, "quantization_config", "quantization_config");
  pick(text, "quantization_config", "text_config.quantization_config");
  if (!block) return q;
  if (!block->is_object())
    return err("%s: field '%s' must be an object (got %s)", file.c_str(), name.c_str(), block->type_name());
  Fields f{*block, file, name + "."};
  if (f.has_value("quant_method")) {
    const json& m = *f.get("quant_method");
    std::string s = m.is_string() ? m.get<std::string>() : m.dump();
    return err("%s: field '%s.quant_method' = '%s' is not supported (only MLX affine quantization)", file.c_str(),
               name.c_str(), s.c_str());
  }
  auto check_mode = [&](const Fields& ff) -> Status {
    if (!ff.has_value("mode")) return Status::ok();
    const json& m = *ff.get("mode");
    if (!m.is_string()) return ff.type_error("mode", "a string", m);
    if (m.get<std::string>() != "affine")
      return err("%s: field '%smode' = '%s' is not supported (only affine)", file.c_str(), ff.prefix.c_str(),
                 m.get<std::string>().c_str());
    return Status::ok();
  };
  auto check_bg = [&](const Fields& ff, int bits, int group) -> Status {
    if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
      return err("%s: field '%sbits' = %d is not supported (2, 3, 4, 5, 6 or 8)", file.c_str(), ff.prefix.c_str(), bits);
    if (group != 32 && group != 64 && group != 128)
      return err("%s: field '%sgroup_size' = %d is not supported (32, 64 or 128)", file.c_str(), ff.prefix.c_str(),
                 group);
    return Status::ok();
  };
  G4_TRY(check_mode(f));
  G4_ASSIGN_OR_RETURN(q.bits, f.integer("bits", std::nullopt, 1, 64));
  G4_ASSIGN_OR_RETURN(q.group_size, f.integer("group_size", std::nullopt, 1, 1 << 20));
  G4_TRY(check_bg(f, q.bits, q.group_size));
  q.present = true;
  for (auto it = block->begin(); it != block->end(); ++it) {
    const std::string& key = it.key();
    if (!it->is_object() && !it->is_boolean()) continue;  // scalar settings (bits, mode, ...)
    ModuleQuant mq;
    if (it->is_boolean()) {
      mq.quantized = it->get<bool>();
      if (mq.quantized) {
        mq.bits = q.bits;
        mq.group_size = q.group_size;
      }
    } else {
      Fields m{*it, file, name + "." + key + "."};
      G4_TRY(check_mode(m));
      G4_ASSIGN_OR_RETURN(mq.bits, m.integer("bits", 4, 1, 64, true));
      G4_ASSIGN_OR_RETURN(mq.group_size, m.integer("group_size", 64, 1, 1 << 20, true));
      G4_TRY(check_bg(m, mq.bits, mq.group_size));
      mq.quantized = true;
    }
    auto canon = canonical_name(key);
    if (!canon) {
      q.ignored.push_back(key);
      continue;
    }
    q.overrides[*canon] = mq;
  }
  return q;
}

}  // namespace

std::optional<std::string> canonical_name(std::string_view s) {
  static const std::string_view towers[] = {"vision_tower", "multi_modal_projector", "audio_tower",
                                            "embed_audio",  "embed_vision",          "vision_embedder"};
  auto starts = [](std::string_view a, std::string_view p) { return a.substr(0, p.size()) == p; };
  auto is_tower = [&](std::string_view r) {
    for (auto t : towers)
      if (starts(r, t) && (r.size() == t.size() || r[t.size()] == '.')) return true;
    return false;
  };
  if (starts(s, "language_model.model.")) return std::string(s.substr(21));
  if (starts(s, "model.language_model.")) return std::string(s.substr(21));
  if (starts(s, "language_model.")) return std::string(s.substr(15));
  if (starts(s, "model.")) s = s.substr(6);
  if (is_tower(s)) return std::nullopt;
  return std::string(s);
}

Result<LoadedConfig> parse_config(std::string_view config_json, std::string_view generation_json,
                                  const std::string& file, const std::string& gen_file) {
  G4_ASSIGN_OR_RETURN(json top, parse_json(config_json, file));
  if (!top.is_object()) return err("%s: expected a JSON object (got %s)", file.c_str(), top.type_name());
  LoadedConfig out;
  ModelConfig& c = out.model;
  Fields tf{top, file, ""};
  if (!tf.has("model_type")) return tf.missing("model_type");
  if (!top["model_type"].is_string()) return tf.type_error("model_type", "a string", top["model_type"]);
  c.model_type = top["model_type"].get<std::string>();

  // Nested wrapper (mlx-lm gemma4.ModelArgs.__post_init__).
  json text;
  std::string prefix;
  if (c.model_type == "gemma4" || c.model_type == "gemma4_unified") {
    out.multimodal = true;
    prefix = "text_config.";
    const json* tc = tf.get("text_config");
    if (tc && !tc->is_null() && !tc->is_object()) return tf.type_error("text_config", "an object", *tc);
    text = (tc && tc->is_object()) ? *tc : json::object();
    G4_ASSIGN_OR_RETURN(int vocab, tf.integer("vocab_size", 262144, 1, INT32_MAX));
    text["vocab_size"] = vocab;
    if (!text.contains("num_attention_heads")) text["num_attention_heads"] = 8;
    if (!text.contains("num_key_value_heads")) text["num_key_value_heads"] = 1;
  } else if (c.model_type == "gemma4_text" || c.model_type == "gemma4_unified_text") {
    text = top;
  } else {
    return err("%s: model_type '%s' is not supported here (gemma4, gemma4_unified, gemma4_text)", file.c_str(),
               c.model_type.c_str());
  }
  Fields f{text, file, prefix};

  // Scalars (mlx-lm gemma4_text.ModelArgs defaults).
  G4_ASSIGN_OR_RETURN(c.hidden, f.integer("hidden_size", std::nullopt, 1, kMaxDim));
  G4_ASSIGN_OR_RETURN(c.n_layers, f.integer("num_hidden_layers", std::nullopt, 1, 4096));
  G4_ASSIGN_OR_RETURN(int inter, f.integer("intermediate_size", std::nullopt, 1, kMaxDim));
  G4_ASSIGN_OR_RETURN(c.n_heads, f.integer("num_attention_heads", 8, 1, 4096));
  G4_ASSIGN_OR_RETURN(int head_dim, f.integer("head_dim", 256, 2, 1 << 16));
  G4_ASSIGN_OR_RETURN(int global_head_dim, f.integer("global_head_dim", 512, 0, 1 << 16, true));
  G4_ASSIGN_OR_RETURN(double eps, f.number("rms_norm_eps", 1e-6));
  if (!(eps > 0)) return f.bad("rms_norm_eps", "must be positive");
  c.rms_eps = float(eps);
  G4_ASSIGN_OR_RETURN(c.vocab, f.integer("vocab_size", 262144, 1, INT32_MAX));
  G4_ASSIGN_OR_RETURN(c.ple_vocab, f.integer("vocab_size_per_layer_input", 262144, 1, INT32_MAX));
  G4_ASSIGN_OR_RETURN(int n_kv, f.integer("num_key_value_heads", 1, 1, 4096));
  std::optional<int> n_kv_global;
  if (f.has_value("num_global_key_value_heads")) {
    G4_ASSIGN_OR_RETURN(int g, f.integer("num_global_key_value_heads", std::nullopt, 1, 4096));
    n_kv_global = g;
  }
  G4_ASSIGN_OR_RETURN(c.n_kv_shared, f.integer("num_kv_shared_layers", 20, 0, 4096));
  G4_ASSIGN_OR_RETURN(c.ple_width, f.integer("hidden_size_per_layer_input", 256, 0, kMaxDim, true));
  G4_ASSIGN_OR_RETURN(int window, f.integer("sliding_window", 512, 1, kMaxSlidingWindow));
  G4_ASSIGN_OR_RETURN(int pattern, f.integer("sliding_window_pattern", 5, 1, 4096));
  G4_ASSIGN_OR_RETURN(c.max_positions, f.integer("max_position_embeddings", 131072, 1, INT32_MAX));
  G4_ASSIGN_OR_RETURN(bool k_eq_v, f.boolean("attention_k_eq_v", false));
  if (f.has("final_logit_softcapping") && f.get("final_logit_softcapping")->is_null()) {
    c.final_softcap = 0.f;
  } else {
    G4_ASSIGN_OR_RETURN(double cap, f.number("final_logit_softcapping", 30.0));
    if (cap < 0) return f.bad("final_logit_softcapping", "must not be negative");
    c.final_softcap = float(cap);
  }
  G4_ASSIGN_OR_RETURN(bool double_wide, f.boolean("use_double_wide_mlp", true));
  G4_ASSIGN_OR_RETURN(bool moe, f.boolean("enable_moe_block", false));
  G4_ASSIGN_OR_RETURN(c.tie_embeddings, f.boolean("tie_word_embeddings", true));
  if (f.has_value("rope_traditional")) {
    G4_ASSIGN_OR_RETURN(bool trad, f.boolean("rope_traditional", false));
    if (trad) return f.bad("rope_traditional", "= true is not supported (Gemma 4 uses half-split RoPE)");
  }
  if (moe) {
    G4_ASSIGN_OR_RETURN(c.n_experts, f.integer("num_experts", std::nullopt, 1, 1 << 16, false));
    G4_ASSIGN_OR_RETURN(c.top_k_experts, f.integer("top_k_experts", std::nullopt, 1, 1 << 16, false));
    G4_ASSIGN_OR_RETURN(c.moe_width, f.integer("moe_intermediate_size", std::nullopt, 1, kMaxDim, false));
    if (c.top_k_experts > c.n_experts) return f.bad("top_k_experts", "exceeds num_experts");
  }
  if (head_dim % 2) return f.bad("head_dim", "must be even");
  if (global_head_dim % 2) return f.bad("global_head_dim", "must be even");
  if (c.n_kv_shared >= c.n_layers && c.n_kv_shared > 0)
    return err("%s: field '%snum_kv_shared_layers' = %d leaves no layer that owns a KV cache (num_hidden_layers = %d)",
               file.c_str(), prefix.c_str(), c.n_kv_shared, c.n_layers);

  // Gemma 4 constants.
  c.norm_style = NormStyle::Plain;
  c.qk_norm = true;
  c.v_norm = true;
  c.query_scale = 1.f;

  // layer_types, or mlx-lm's derivation from sliding_window_pattern.
  std::vector<AttnKind> kinds(c.n_layers);
  if (f.has_value("layer_types")) {
    const json& lt = *f.get("layer_types");
    if (!lt.is_array()) return f.type_error("layer_types", "a list of strings", lt);
    if (int(lt.size()) != c.n_layers)
      return err("%s: field '%slayer_types' has %zu entries but num_hidden_layers = %d", file.c_str(), prefix.c_str(),
                 lt.size(), c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) {
      const json& v = lt[i];
      if (v == "sliding_attention") kinds[i] = AttnKind::Sliding;
      else if (v == "full_attention") kinds[i] = AttnKind::Full;
      else
        return err("%s: field '%slayer_types[%d]' = %s is not sliding_attention or full_attention", file.c_str(),
                   prefix.c_str(), i, v.dump().c_str());
    }
  } else {
    for (int i = 0; i < c.n_layers; ++i) kinds[i] = (i % pattern == pattern - 1) ? AttnKind::Full : AttnKind::Sliding;
  }

  // rope_parameters per layer type; a given block replaces the default whole (mlx-lm).
  RopeSpec rope_s, rope_f;
  if (f.has_value("rope_parameters")) {
    const json& rp = *f.get("rope_parameters");
    if (!rp.is_object()) return f.type_error("rope_parameters", "an object", rp);
    auto get = [&](const char* k) -> const json* { auto it = rp.find(k); return it == rp.end() ? nullptr : &*it; };
    G4_ASSIGN_OR_RETURN(rope_s, parse_rope(get("sliding_attention"), file, prefix + "rope_parameters.sliding_attention"));
    G4_ASSIGN_OR_RETURN(rope_f, parse_rope(get("full_attention"), file, prefix + "rope_parameters.full_attention"));
  } else {
    rope_s.kind = RopeKind::Default;
    rope_s.theta = 10000.f;
    rope_f.kind = RopeKind::Proportional;
    rope_f.theta = 1000000.f;
    rope_f.partial_factor = 0.25f;
  }

  // per_layer_config (newer HF form): {"<layer>": {"head_dim": D, "num_key_value_heads": Hk}}.
  std::map<int, std::pair<std::optional<int>, std::optional<int>>> per_layer;
  const bool has_plc = f.has_value("per_layer_config");
  if (has_plc) {
    const json& plc = *f.get("per_layer_config");
    if (!plc.is_object()) return f.type_error("per_layer_config", "an object", plc);
    for (auto it = plc.begin(); it != plc.end(); ++it) {
      const std::string& k = it.key();
      char* end = nullptr;
      long idx = std::strtol(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0' || idx < 0 || idx >= c.n_layers)
        return err("%s: field '%sper_layer_config' has key '%s', not a layer index below %d", file.c_str(),
                   prefix.c_str(), k.c_str(), c.n_layers);
      if (!it->is_object()) return err("%s: field '%sper_layer_config.%s' must be an object (got %s)", file.c_str(),
                                       prefix.c_str(), k.c_str(), it->type_name());
      Fields lf{*it, file, prefix + "per_layer_config." + k + "."};
      auto& e = per_layer[int(idx)];
      if (lf.has_value("head_dim")) {
        G4_ASSIGN_OR_RETURN(int d, lf.integer("head_dim", std::nullopt, 2, 1 << 16));
        if (d % 2) return lf.bad("head_dim", "must be even");
        e.first = d;
      }
      if (lf.has_value("num_key_value_heads")) {
        G4_ASSIGN_OR_RETURN(int h, lf.integer("num_key_value_heads", std::nullopt, 1, 4096));
        e.second = h;
      }
    }
  }

  // Per-layer geometry (mlx-lm Attention.__init__, MLP.__init__, Gemma4TextModel.previous_kvs).
  const int M = c.n_layers - c.n_kv_shared;
  c.layers.resize(c.n_layers);
  int last_of_kind[2] = {-1, -1};
  for (int i = 0; i < c.n_layers; ++i) {
    LayerSpec& L = c.layers[i];
    L.kind = kinds[i];
    const bool full = L.kind == AttnKind::Full;
    L.k_eq_v = k_eq_v && full;
    if (has_plc) {
      auto it = per_layer.find(i);
      L.head_dim = (it != per_layer.end() && it->second.first) ? *it->second.first : head_dim;
      L.n_kv_heads = (it != per_layer.end() && it->second.second) ? *it->second.second : n_kv;
      if (full && f.has_value("global_head_dim") && global_head_dim && L.head_dim != global_head_dim)
        return err("%s: per_layer_config gives layer %d head_dim %d but global_head_dim is %d", file.c_str(), i,
                   L.head_dim, global_head_dim);
    } else {
      L.head_dim = (full && global_head_dim) ? global_head_dim : head_dim;
      L.n_kv_heads = (L.k_eq_v && n_kv_global) ? *n_kv_global : n_kv;
    }
    if (c.n_heads % L.n_kv_heads)
      return err("%s: layer %d has %d KV heads, which does not divide num_attention_heads = %d", file.c_str(), i,
                 L.n_kv_heads, c.n_heads);
    L.window = full ? 0 : window;
    L.rope = full ? rope_f : rope_s;
    const bool shared = i >= M;
    if (shared) {
      int donor = last_of_kind[full ? 1 : 0];
      if (donor < 0)
        return err("%s: KV-shared layer %d (%s) has no earlier %s layer among layers 0..%d to share with", file.c_str(),
                   i, full ? "full" : "sliding", full ? "full" : "sliding", M - 1);
      L.kv_source = donor;
      const LayerSpec& D = c.layers[donor];
      if (D.head_dim != L.head_dim || D.n_kv_heads != L.n_kv_heads)
        return err("%s: KV-shared layer %d (head_dim %d, %d KV heads) does not match its donor layer %d (%d, %d)",
                   file.c_str(), i, L.head_dim, L.n_kv_heads, donor, D.head_dim, D.n_kv_heads);
    } else {
      L.kv_source = -1;
      last_of_kind[full ? 1 : 0] = i;
    }
    const bool wide = double_wide && i >= M && M > 0 && c.n_kv_shared > 0;
    L.mlp_width = inter * (wide ? 2 : 1);
    L.moe = moe;
  }

  // Token ids: top-level first (mlx-lm reads the outer config), then text_config, then HF defaults.
  auto id_field = [&](const char* k, int def) -> Result<int> {
    for (const json* o : {&top, &text}) {
      auto it = o->find(k);
      if (it != o->end() && !it->is_null()) {
        if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX)
          return err("%s: field '%s%s' must be a token id (got %s)", file.c_str(), o == &top ? "" : prefix.c_str(), k,
                     it->type_name());
        return int(it->get<int64_t>());
      }
    }
    return def;
  };
  G4_ASSIGN_OR_RETURN(c.bos_id, id_field("bos_token_id", 2));
  G4_ASSIGN_OR_RETURN(c.pad_id, id_field("pad_token_id", 0));
  if (out.multimodal) {
    G4_ASSIGN_OR_RETURN(c.image_token, id_field("image_token_id", 258880));
  }
  if (auto bi = text.find("use_bidirectional_attention"); bi != text.end() && !bi->is_null()) {
    if (!bi->is_string()) return f.type_error("use_bidirectional_attention", "a string or null", *bi);
    c.bidi_images = bi->get<std::string>() == "vision";
  }
  c.eos_ids = {1};
  for (const json* o : {&text, &top}) {  // top-level wins
    auto it = o->find("eos_token_id");
    if (it != o->end() && !it->is_null()) {
      G4_ASSIGN_OR_RETURN(c.eos_ids, token_list(*it, file, "eos_token_id"));
    }
  }

  if (!generation_json.empty()) {
    G4_ASSIGN_OR_RETURN(json gen, parse_json(generation_json, gen_file));
    if (!gen.is_object()) return err("%s: expected a JSON object (got %s)", gen_file.c_str(), gen.type_name());
    auto it = gen.find("eos_token_id");
    if (it != gen.end() && truthy(*it)) {  // mlx-lm utils.load_config
      G4_ASSIGN_OR_RETURN(c.eos_ids, token_list(*it, gen_file, "eos_token_id"));
    }
    Fields g{gen, gen_file, ""};
    G4_ASSIGN_OR_RETURN(double temp, g.number("temperature", -1.0, true));
    G4_ASSIGN_OR_RETURN(double top_p, g.number("top_p", -1.0, true));
    G4_ASSIGN_OR_RETURN(c.gen_top_k, g.integer("top_k", 0, 0, INT32_MAX, true));
    c.gen_temperature = float(temp);
    c.gen_top_p = float(top_p);
  }

  G4_ASSIGN_OR_RETURN(out.quant, parse_quant(top, text, file));
  return out;
}

namespace {
Result<std::string> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return err("%s: cannot open", p.string().c_str());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

Result<LoadedConfig> load_config(const std::string& dir) {
  const fs::path cp = fs::path(dir) / "config.json";
  const fs::path gp = fs::path(dir) / "generation_config.json";
  std::error_code ec;
  if (!fs::is_regular_file(cp, ec)) return err("%s: missing (not a model directory?)", cp.string().c_str());
  G4_ASSIGN_OR_RETURN(std::string cfg, slurp(cp));
  std::string gen;
  if (fs::is_regular_file(gp, ec)) {
    G4_ASSIGN_OR_RETURN(gen, slurp(gp));
    if (gen.empty()) gen = " ";  // present but empty: report it as invalid JSON
  }
  return parse_config(cfg, gen, cp.string(), gp.string());
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> v;
  auto mat = [&](std::string n, int64_t r, int64_t cols) { v.push_back({std::move(n), true, 0, r, cols, false}); };
  auto stk = [&](std::string n, int64_t e, int64_t r, int64_t cols) {
    v.push_back({std::move(n), true, e, r, cols, false});
  };
  auto vec = [&](std::string n, int64_t len) { v.push_back({std::move(n), false, 0, len, 0, false}); };
  const int64_t d = c.hidden, P = c.ple_width, N = c.n_layers;
  mat("embed_tokens", c.vocab, d);
  if (!c.tie_embeddings) {
    mat("lm_head", c.vocab, d);
    v.back().optional = true;
  }
  if (P) {
    mat("embed_tokens_per_layer", c.ple_vocab, N * P);
    mat("per_layer_model_projection", N * P, d);
    vec("per_layer_projection_norm.weight", P);
  }
  vec("norm.weight", d);
  for (int i = 0; i < N; ++i) {
    const LayerSpec& L = c.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    const int64_t D = L.head_dim, H = c.n_heads, Hk = L.n_kv_heads;
    mat(p + "self_attn.q_proj", H * D, d);
    vec(p + "self_attn.q_norm.weight", D);
    if (L.kv_source < 0) {
      mat(p + "self_attn.k_proj", Hk * D, d);
      if (!L.k_eq_v) mat(p + "self_attn.v_proj", Hk * D, d);
      vec(p + "self_attn.k_norm.weight", D);
    }
    mat(p + "self_attn.o_proj", d, H * D);
    mat(p + "mlp.gate_proj", L.mlp_width, d);
    mat(p + "mlp.up_proj", L.mlp_width, d);
    mat(p + "mlp.down_proj", d, L.mlp_width);
    for (const char* n : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                          "post_feedforward_layernorm"})
      vec(p + n + ".weight", d);
    if (L.moe) {
      mat(p + "router.proj", c.n_experts, d);
      vec(p + "router.scale", d);
      vec(p + "router.per_expert_scale", c.n_experts);
      stk(p + "experts.switch_glu.gate_proj", c.n_experts, c.moe_width, d);
      stk(p + "experts.switch_glu.up_proj", c.n_experts, c.moe_width, d);
      stk(p + "experts.switch_glu.down_proj", c.n_experts, d, c.moe_width);
      for (const char* n : {"pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"})
        vec(p + n + ".weight", d);
    }
    if (P) {
      mat(p + "per_layer_input_gate", P, d);
      mat(p + "per_layer_projection", d, P);
      vec(p + "post_per_layer_input_norm.weight", d);
    }
    vec(p + "layer_scalar", 1);
    v.back().optional = true;
  }
  return v;
}

}  // namespace g4
