// gemma4 info --model PATH [--context N] [--json] [--config-only]
// Prints the resolved architecture per layer (kind, head_dim, KV heads, window, KV source, MLP
// width, MoE, RoPE), the storage format of every module (format, bits, group), weight bytes, and
// the KV-cache bytes for a context of N tokens (default: max_position_embeddings): layers that own
// a cache hold K and V of n_kv_heads * head_dim per token, sliding layers at most `window` tokens
// (mlx-lm RotatingKVCache), KV-shared layers none. Every weight is resolved (shapes and dtypes
// checked), so `info` also validates a checkpoint; --config-only skips the weights (a directory
// with just config.json, and generation_config.json, is enough). --experts FILE.jsonl summarizes
// an expert trace (model/expert_trace.h) instead.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/memory_plan.h"
#include "cli/options.h"
#include "io/gguf_model.h"
#include "io/model_dir.h"
#include "io/safetensors_source.h"
#include "model/expert_trace.h"

namespace g4::cli {
namespace {

const char* rope_name(RopeKind k) {
  switch (k) {
    case RopeKind::Default: return "default";
    case RopeKind::Proportional: return "proportional";
    case RopeKind::Linear: return "linear";
  }
  return "?";
}

const char* fmt_name(WFormat f) {
  switch (f) {
    case WFormat::F32: return "f32";
    case WFormat::F16: return "f16";
    case WFormat::BF16: return "bf16";
    case WFormat::MlxAffine: return "mlx-affine";
    case WFormat::GgufQ4_0: return "q4_0";
    case WFormat::GgufQ5_0: return "q5_0";
    case WFormat::GgufQ8_0: return "q8_0";
    case WFormat::GgufQ4_K: return "q4_K";
    case WFormat::GgufQ5_K: return "q5_K";
    case WFormat::GgufQ6_K: return "q6_K";
  }
  return "?";
}

std::string mib(uint64_t b) {
  char s[64];
  std::snprintf(s, sizeof s, "%.2f MiB", double(b) / (1024.0 * 1024.0));
  return s;
}

// The engine's cache bytes with --kv-bits `bits` (0: f32 rows) and group 64: full layers as codes
// plus f32 scale and bias per group, sliding layers f32 (model/kv_cache.h).
uint64_t engine_kv_bytes(const ModelConfig& c, int64_t context, int bits) {
  const uint64_t all = kv_elements(c, context), full = kv_elements(c, context, true);
  if (bits == 0) return all * 4;
  return (all - full) * 4 + full * uint64_t(bits) / 8 + full / 64 * 8;
}

int cmd_info(const std::vector<std::string>& argv) {
  VerbCli cli("info", "Resolved architecture per layer, quantization per module, weight and KV-cache memory; "
              "validates every weight.");
  cli.value("-m,--model", "model directory, .gguf file, or a directory holding one (default: the starter model)")
      ->type_name("PATH");
  add_context_option(cli, "", "context for the KV-cache size (default: the model's max_position_embeddings)");
  cli.flag("--json", "print JSON");
  cli.flag("--config-only", "read config.json only, not the weights");
  cli.value("--experts", "summarize an expert trace written by --trace-experts instead (per MoE layer: load, "
            "hot and cold experts; no model needed)")->type_name("FILE.jsonl");
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  if (a.has("--experts")) {
    auto summary = summarize_expert_trace(a.get("--experts"), a.has("--json"));
    if (!summary) return fail("info", summary.message());
    std::fputs(summary.value().c_str(), stdout);
    return 0;
  }
  std::string path = a.get("--model");
  if (path.empty()) path = default_model_path();
  if (path.empty()) return fail("info", no_model_message());
  const bool config_only = a.has("--config-only");
  Result<OpenedModel> om = Error{""};
  if (config_only) {
    auto lc = load_config(path);
    if (!lc) return fail("info", lc.message());
    OpenedModel cm;
    cm.config = std::move(lc->model);
    cm.quant = std::move(lc->quant);
    cm.multimodal_config = lc->multimodal;
    cm.path = path;
    cm.format = "config";
    om = std::move(cm);
  } else {
    om = open_model(path);
  }
  if (!om) return fail("info", om.message());
  const OpenedModel& m = om.value();
  const ModelConfig& c = m.config;
  int64_t context = c.max_positions > 0 ? c.max_positions : 4096;
  if (a.has("--context")) {  // range-checked by the parser
    context = std::stoll(a.get("--context"));
    if (c.max_positions > 0 && context > c.max_positions)
      return fail("info", "--context " + std::to_string(context) + ": the model holds at most " +
                              std::to_string(c.max_positions) + " positions (max_position_embeddings)");
  }
  const bool as_json = a.has("--json");
  const auto* sts = dynamic_cast<const SafetensorsSource*>(m.weights.get());

  // Resolve every weight (this is also the validation).
  nlohmann::ordered_json jmods = nlohmann::ordered_json::array();
  uint64_t matrix_bytes = 0, vector_bytes = 0;
  std::string table;
  for (const ExpectedTensor& t : config_only ? std::vector<ExpectedTensor>{} : expected_tensors(c)) {
    if (t.optional && !m.weights->has(t.name)) continue;
    if (!t.matrix) {
      auto v = m.weights->vector(t.name, t.rows);
      if (!v) return fail("info", v.message());
      vector_bytes += sts ? sts->stored_bytes(t.name) : uint64_t(t.rows) * 4;
      continue;
    }
    WeightView first;
    uint64_t bytes = 0;
    const int64_t count = t.count > 0 ? t.count : 1;
    for (int64_t e = 0; e < count; ++e) {
      auto v = t.count > 0 ? m.weights->stacked_matrix(t.name, e, t.count, t.rows, t.cols)
                           : m.weights->matrix(t.name, t.rows, t.cols);
      if (!v) return fail("info", v.message());
      if (e == 0) first = v.value();
      bytes += view_bytes(v.value());
    }
    matrix_bytes += bytes;
    std::string shape = (t.count ? std::to_string(t.count) + "x" : std::string()) + std::to_string(t.rows) + "x" +
                        std::to_string(t.cols);
    if (as_json) {
      jmods.push_back({{"module", t.name},
                       {"format", fmt_name(first.fmt)},
                       {"bits", first.bits},
                       {"group_size", first.group_size},
                       {"count", t.count},
                       {"rows", t.rows},
                       {"cols", t.cols},
                       {"bytes", bytes}});
    } else {
      char line[256];
      std::string q = first.fmt == WFormat::MlxAffine
                          ? std::to_string(first.bits) + "-bit g" + std::to_string(first.group_size)
                          : std::string("-");
      std::snprintf(line, sizeof line, "  %-44s %-11s %-10s %-18s %s\n", t.name.c_str(), fmt_name(first.fmt),
                    q.c_str(), shape.c_str(), mib(bytes).c_str());
      table += line;
    }
  }
  const uint64_t kv = kv_elements(c, context);

  if (as_json) {
    nlohmann::ordered_json j;
    j["path"] = m.path;
    j["format"] = m.format;
    j["source"] = m.weights ? m.weights->describe() : std::string("config only");
    j["model_type"] = c.model_type;
    j["hidden_size"] = c.hidden;
    j["num_layers"] = c.n_layers;
    j["num_heads"] = c.n_heads;
    j["vocab_size"] = c.vocab;
    j["ple_width"] = c.ple_width;
    j["final_softcap"] = c.final_softcap;
    j["tie_embeddings"] = c.tie_embeddings;
    j["num_experts"] = c.n_experts;
    j["top_k_experts"] = c.top_k_experts;
    j["moe_width"] = c.moe_width;
    j["first_kv_shared"] = c.first_kv_shared();
    j["eos_ids"] = c.eos_ids;
    j["bos_id"] = c.bos_id;
    j["rms_eps"] = c.rms_eps;
    j["max_positions"] = c.max_positions;
    auto& jl = j["layers"] = nlohmann::ordered_json::array();
    for (const LayerSpec& L : c.layers)
      jl.push_back({{"kind", L.kind == AttnKind::Full ? "full" : "sliding"},
                    {"head_dim", L.head_dim},
                    {"kv_heads", L.n_kv_heads},
                    {"window", L.window},
                    {"k_eq_v", L.k_eq_v},
                    {"kv_source", L.kv_source},
                    {"mlp_width", L.mlp_width},
                    {"moe", L.moe},
                    {"rope", {{"type", rope_name(L.rope.kind)},
                              {"theta", L.rope.theta},
                              {"partial_factor", L.rope.partial_factor},
                              {"factor", L.rope.factor}}}});
    j["modules"] = jmods;
    j["weight_bytes"] = matrix_bytes + vector_bytes;
    j["context"] = context;
    j["kv_cache_bytes"] = {{"f32", kv * 4}, {"bf16", kv * 2},
                           {"kv_bits_8", engine_kv_bytes(c, context, 8)},
                           {"kv_bits_4", engine_kv_bytes(c, context, 4)}};
    std::printf("%s\n", j.dump(1).c_str());
    return 0;
  }

  std::printf("model:   %s\nsource:  %s\n", m.path.c_str(),
              m.weights ? m.weights->describe().c_str() : "config.json only (weights not checked)");
  std::printf("type:    %s%s, hidden %d, %d layers, %d heads, vocab %d, rms eps %g\n", c.model_type.c_str(),
              m.multimodal_config ? " (text_config)" : "", c.hidden, c.n_layers, c.n_heads, c.vocab, c.rms_eps);
  std::printf("head:    %s embeddings, final softcap %s\n", c.tie_embeddings ? "tied" : "untied",
              c.final_softcap > 0 ? std::to_string(int(c.final_softcap)).c_str() : "off");
  std::printf("norms:   %s, qk_norm %s, v_norm %s, attention scale %g\n",
              c.norm_style == NormStyle::Plain ? "x/rms*w" : "x/rms*(1+w)", c.qk_norm ? "yes" : "no",
              c.v_norm ? "yes" : "no", c.query_scale);
  if (c.ple_width) std::printf("ple:     width %d, vocab %d\n", c.ple_width, c.ple_vocab);
  if (c.n_experts) std::printf("moe:     %d experts, top %d, width %d\n", c.n_experts, c.top_k_experts, c.moe_width);
  if (c.n_kv_shared) std::printf("kv:      last %d layers share KV (first shared layer %d)\n", c.n_kv_shared, c.first_kv_shared());
  std::string eos;
  for (int e : c.eos_ids) eos += (eos.empty() ? "" : ",") + std::to_string(e);
  std::printf("tokens:  eos [%s], bos %d, pad %d\n", eos.c_str(), c.bos_id, c.pad_id);
  if (c.gen_temperature >= 0 || c.gen_top_k > 0 || c.gen_top_p >= 0)
    std::printf("gen:     temperature %g, top_k %d, top_p %g (generation_config.json)\n", c.gen_temperature,
                c.gen_top_k, c.gen_top_p);
  std::printf("\nlayer  kind     head_dim kv_heads window  kv_source  mlp    moe  rope\n");
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerSpec& L = c.layers[i];
    std::string src = L.kv_source < 0 ? "own" : "layer " + std::to_string(L.kv_source);
    std::string win = L.window ? std::to_string(L.window) : "-";
    char rope[128];
    if (L.rope.kind == RopeKind::Proportional)
      std::snprintf(rope, sizeof rope, "proportional theta=%g partial=%g factor=%g", L.rope.theta,
                    L.rope.partial_factor, L.rope.factor);
    else if (L.rope.kind == RopeKind::Linear)
      std::snprintf(rope, sizeof rope, "linear theta=%g factor=%g", L.rope.theta, L.rope.factor);
    else
      std::snprintf(rope, sizeof rope, "default theta=%g", L.rope.theta);
    std::printf("%5d  %-8s %8d %8d %6s  %-9s %6d  %-4s %s%s\n", i, L.kind == AttnKind::Full ? "full" : "sliding",
                L.head_dim, L.n_kv_heads, win.c_str(), src.c_str(), L.mlp_width, L.moe ? "yes" : "-", rope,
                L.k_eq_v ? "  (K=V)" : "");
  }
  if (m.quant.present)
    std::printf("\nquantization block: %d-bit, group %d, %zu per-module entries (%zu outside the text model)\n",
                m.quant.bits, m.quant.group_size, m.quant.overrides.size() + m.quant.ignored.size(),
                m.quant.ignored.size());
  if (!config_only) {
    std::printf("\nmodules (format, quantization, shape, bytes):\n%s", table.c_str());
    std::printf("\nweights: %s (matrices %s, vectors %s)", mib(matrix_bytes + vector_bytes).c_str(),
                mib(matrix_bytes).c_str(), mib(vector_bytes).c_str());
    if (sts) std::printf("; files hold %s of tensors", mib(sts->store().total_bytes()).c_str());
    std::printf("\n");
  }
  std::printf("kv cache for %lld tokens: f32 %s, bf16 %s (%.1f KiB bf16 per token before the window cap)\n",
              (long long)context, mib(kv * 4).c_str(), mib(kv * 2).c_str(),
              double(kv_elements(c, 1)) * 2 / 1024.0);
  std::printf("  with --kv-bits 8: %s, --kv-bits 4: %s (full-attention layers quantized, group 64; "
              "sliding windows stay f32)\n",
              mib(engine_kv_bytes(c, context, 8)).c_str(), mib(engine_kv_bytes(c, context, 4)).c_str());
  return 0;
}

}  // namespace

G4_COMMAND("info", "show a model's resolved architecture, quantization, weight and KV-cache sizes", cmd_info);

}  // namespace g4::cli
