#include "model/lora.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "io/json_bounded.h"
#include "io/safetensors.h"

namespace g4 {
namespace fs = std::filesystem;

namespace {


// t [rows, cols] of any float dtype -> its transpose [cols, rows] in f32.
std::vector<float> transposed_f32(const TensorInfo& t) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  std::vector<float> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(c * rows + r)] = load_float(t.data, t.dtype, size_t(r * cols + c));
  return out;
}

}  // namespace

std::pair<int64_t, int64_t> lora_module_shape(const ModelConfig& cfg, int layer, const std::string& m) {
  const LayerSpec& ls = cfg.layers[size_t(layer)];
  const int64_t d = cfg.hidden, qd = int64_t(cfg.n_heads) * ls.head_dim, kd = int64_t(ls.n_kv_heads) * ls.head_dim;
  const bool own_kv = ls.kv_source < 0;
  if (m == "self_attn.q_proj") return {qd, d};
  if (m == "self_attn.o_proj") return {d, qd};
  if (m == "self_attn.k_proj") return own_kv ? std::pair{kd, d} : std::pair<int64_t, int64_t>{0, 0};
  if (m == "self_attn.v_proj") return own_kv && !ls.k_eq_v ? std::pair{kd, d} : std::pair<int64_t, int64_t>{0, 0};
  if (m == "mlp.gate_proj" || m == "mlp.up_proj") return {ls.mlp_width, d};
  if (m == "mlp.down_proj") return {d, ls.mlp_width};
  if (cfg.ple_width > 0 && m == "per_layer_input_gate") return {cfg.ple_width, d};
  if (cfg.ple_width > 0 && m == "per_layer_projection") return {d, cfg.ple_width};
  return {0, 0};
}

bool parse_lora_tensor_name(const std::string& name, int* layer, std::string* module, char* which) {
  static const std::regex kName(
      R"(^(?:.*\.)?layers\.(\d+)\.(self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj|per_layer_input_gate|per_layer_projection)\.lora_([ab])$)");
  std::smatch m;
  if (!std::regex_match(name, m, kName) || m[1].str().size() > 6) return false;
  *layer = std::stoi(m[1].str());
  *module = m[2].str();
  *which = m[3].str()[0];
  return true;
}

Result<std::unique_ptr<LoraAdapter>> load_lora_adapter(const std::string& dir, const ModelConfig& cfg, Backend& be) {
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  const std::string st_path = (fs::path(dir) / "adapters.safetensors").string();
  if (!fs::is_directory(dir)) return err("%s: not a directory (an adapter directory holds adapter_config.json and "
                                         "adapters.safetensors)", dir.c_str());
  std::ifstream f(cfg_path);
  if (!f) return err("%s: cannot read", cfg_path.c_str());
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string why;
  auto parsed = parse_json_bounded<nlohmann::json>(text, JsonLimits{}, why);
  if (!parsed) return err("%s: not valid JSON: %s", cfg_path.c_str(), why.c_str());
  const nlohmann::json j = std::move(*parsed);
  if (!j.is_object()) return err("%s: not a JSON object", cfg_path.c_str());
  const std::string type = j.value("fine_tune_type", std::string("lora"));
  if (type == "dora") return err("%s: fine_tune_type \"dora\": DoRA adapters are not supported (LoRA only)", cfg_path.c_str());
  if (type == "full")
    return err("%s: fine_tune_type \"full\": a full fine-tune holds whole weights, not an adapter", cfg_path.c_str());
  if (type != "lora") return err("%s: unknown fine_tune_type \"%s\"", cfg_path.c_str(), type.c_str());
  if (!j.contains("lora_parameters") || !j["lora_parameters"].is_object())
    return err("%s: lora_parameters is missing", cfg_path.c_str());
  const auto& lp = j["lora_parameters"];
  if (!lp.contains("rank") || !lp["rank"].is_number_integer() || lp["rank"].get<int>() <= 0)
    return err("%s: lora_parameters.rank must be a positive integer", cfg_path.c_str());
  if (!lp.contains("scale") || !lp["scale"].is_number())
    return err("%s: lora_parameters.scale must be a number (mlx-lm's LoRA scale; not 'alpha')", cfg_path.c_str());
  auto ad = std::make_unique<LoraAdapter>();
  ad->path = dir;
  ad->rank = lp["rank"].get<int>();
  ad->scale = lp["scale"].get<float>();
  ad->num_layers = j.value("num_layers", 0);
  ad->layers.resize(cfg.layers.size());

  G4_ASSIGN_OR_RETURN(auto st, SafetensorsFile::open(st_path));
  struct Pair {
    const TensorInfo* a = nullptr;
    const TensorInfo* b = nullptr;
  };
  std::map<std::pair<int, std::string>, Pair> found;
  for (const TensorInfo& t : st->tensors()) {
    int layer = -1;
    std::string module;
    char which = 0;
    if (!parse_lora_tensor_name(t.name, &layer, &module, &which))
      return err("%s: tensor %s: not a LoRA weight of a supported module (attention q/k/v/o, MLP gate/up/down, "
                 "per-layer input gate/projection)", st_path.c_str(), t.name.c_str());
    if (layer >= int(cfg.layers.size()))
      return err("%s: tensor %s: the model has %zu layers", st_path.c_str(), t.name.c_str(), cfg.layers.size());
    if (ad->num_layers > 0 && layer < int(cfg.layers.size()) - ad->num_layers)
      return err("%s: tensor %s: %s says the adapter covers the last %d layers, but this tensor is in layer %d "
                 "(the config does not describe these weights)", st_path.c_str(), t.name.c_str(), cfg_path.c_str(),
                 ad->num_layers, layer);
    if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
      return err("%s: tensor %s: dtype must be F32, F16 or BF16", st_path.c_str(), t.name.c_str());
    Pair& p = found[{layer, module}];
    (which == 'a' ? p.a : p.b) = &t;
  }
  if (found.empty()) return err("%s: no lora_a / lora_b tensors", st_path.c_str());
  for (const auto& [key, p] : found) {
    const auto& [layer, module] = key;
    const std::string name = "layers." + std::to_string(layer) + "." + module;
    if (!p.a || !p.b)
      return err("%s: %s has lora_%s but no lora_%s", st_path.c_str(), name.c_str(), p.a ? "a" : "b", p.a ? "b" : "a");
    const auto [out, in] = lora_module_shape(cfg, layer, module);
    if (out == 0)
      return err("%s: %s: layer %d of this model has no such module", st_path.c_str(), p.a->name.c_str(), layer);
    const int64_t r = ad->rank;
    if (p.a->shape != std::vector<int64_t>{in, r})
      return err("%s: tensor %s has shape %s, expected [%lld, %lld] (input width, rank)", st_path.c_str(),
                 p.a->name.c_str(), p.a->shape_str().c_str(), (long long)in, (long long)r);
    if (p.b->shape != std::vector<int64_t>{r, out})
      return err("%s: tensor %s has shape %s, expected [%lld, %lld] (rank, output width)", st_path.c_str(),
                 p.b->name.c_str(), p.b->shape_str().c_str(), (long long)r, (long long)out);
    LoraDelta d;
    d.scale = ad->scale;
    ad->host.push_back(transposed_f32(*p.a));
    d.a = be.place_weight(f32_view(ad->host.back().data(), r, in));
    ad->host.push_back(transposed_f32(*p.b));
    d.b = be.place_weight(f32_view(ad->host.back().data(), out, r));
    d.id = uint32_t(ad->deltas.size());
    ad->deltas.push_back(d);
    lora_slot(ad->layers[size_t(layer)], module) = &ad->deltas.back();
    ad->max_out = std::max(ad->max_out, int(out));
    ad->max_in = std::max(ad->max_in, int(in));
    ++ad->modules;
  }
  return ad;
}

void release_lora_adapter(LoraAdapter& a, Backend& be) {
  for (LoraDelta& d : a.deltas) {
    be.release_weight(d.a);
    be.release_weight(d.b);
  }
  a.layers.assign(a.layers.size(), LayerLora{});
  a.deltas.clear();
  a.host.clear();
}

}  // namespace g4
