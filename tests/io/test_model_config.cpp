// config.json -> ModelConfig / QuantConfig. Expected geometry comes from the rules in
// docs/gemma4-spec.md §1 (mlx-lm gemma4_text.ModelArgs / Gemma4TextModel / MLP), e.g. the E2B and
// E4B KV donors listed in §1.5.
#include <gtest/gtest.h>

#include "io/model_config.h"
#include "io_test_util.h"

using namespace g4;
using nlohmann::json;

namespace {

json flat_base() {
  return json{{"model_type", "gemma4_text"},  {"hidden_size", 64},       {"num_hidden_layers", 6},
              {"intermediate_size", 128},     {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"head_dim", 16},               {"global_head_dim", 32},    {"num_kv_shared_layers", 0},
              {"vocab_size", 300},            {"sliding_window", 8},      {"hidden_size_per_layer_input", 0}};
}

LoadedConfig parse_ok(const json& j, const std::string& gen = "") {
  auto r = parse_config(j.dump(), gen);
  EXPECT_TRUE(r.is_ok()) << r.message();
  return r.is_ok() ? r.value() : LoadedConfig{};
}

std::string parse_err(const json& j, const std::string& gen = "") {
  auto r = parse_config(j.dump(), gen);
  EXPECT_FALSE(r.is_ok());
  if (r.is_ok()) return "";
  EXPECT_EQ(r.message().find('\n'), std::string::npos);
  return r.message();
}

#define EXPECT_HAS(s, part) EXPECT_NE((s).find(part), std::string::npos) << "'" << (part) << "' not in: " << (s)

std::vector<std::string> types_pattern(int n, int period) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back((i + 1) % period == 0 ? "full_attention" : "sliding_attention");
  return v;
}

}  // namespace

TEST(ModelConfig, FlatDefaultsAndDerivedLayerTypes) {
  auto c = parse_ok(flat_base()).model;
  EXPECT_EQ(c.model_type, "gemma4_text");
  EXPECT_EQ(c.hidden, 64);
  EXPECT_EQ(c.n_layers, 6);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.vocab, 300);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_EQ(c.norm_style, NormStyle::Plain);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.v_norm);
  EXPECT_EQ(c.query_scale, 1.f);
  EXPECT_EQ(c.final_softcap, 30.f);  // mlx-lm default
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.ple_width, 0);
  EXPECT_EQ(c.max_positions, 131072);
  EXPECT_EQ(c.eos_ids, std::vector<int>{1});
  EXPECT_EQ(c.bos_id, 2);
  EXPECT_EQ(c.pad_id, 0);
  ASSERT_EQ(c.layers.size(), 6u);
  // mlx-lm: sliding_window_pattern 5 -> [S,S,S,S,F] repeated and truncated.
  for (int i = 0; i < 6; ++i) {
    const auto& L = c.layers[i];
    const bool full = i == 4;
    EXPECT_EQ(L.kind, full ? AttnKind::Full : AttnKind::Sliding) << i;
    EXPECT_EQ(L.head_dim, full ? 32 : 16) << i;
    EXPECT_EQ(L.n_kv_heads, 2) << i;
    EXPECT_EQ(L.window, full ? 0 : 8) << i;
    EXPECT_EQ(L.kv_source, -1) << i;
    EXPECT_EQ(L.mlp_width, 128) << i;
    EXPECT_FALSE(L.moe);
    EXPECT_FALSE(L.k_eq_v);
    if (full) {
      EXPECT_EQ(L.rope.kind, RopeKind::Proportional);
      EXPECT_EQ(L.rope.theta, 1e6f);
      EXPECT_EQ(L.rope.partial_factor, 0.25f);
      EXPECT_EQ(L.rope.factor, 1.f);
    } else {
      EXPECT_EQ(L.rope.kind, RopeKind::Default);
      EXPECT_EQ(L.rope.theta, 1e4f);
    }
  }
  EXPECT_FALSE(parse_ok(flat_base()).quant.present);
}

TEST(ModelConfig, SlidingWindowPatternOverride) {
  auto j = flat_base();
  j["sliding_window_pattern"] = 3;
  auto c = parse_ok(j).model;
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.layers[i].kind == AttnKind::Full, i == 2 || i == 5) << i;
}

TEST(ModelConfig, MissingRequiredFields) {
  for (const char* f : {"hidden_size", "num_hidden_layers", "intermediate_size"}) {
    auto j = flat_base();
    j.erase(f);
    auto m = parse_err(j);
    EXPECT_HAS(m, std::string("config.json: missing required field '") + f + "'");
  }
  auto j = flat_base();
  j.erase("model_type");
  EXPECT_HAS(parse_err(j), "missing required field 'model_type'");
}

TEST(ModelConfig, WrongTypesNameTheField) {
  auto j = flat_base();
  j["hidden_size"] = "64";
  EXPECT_HAS(parse_err(j), "'hidden_size' must be an integer (got string)");
  j = flat_base();
  j["rms_norm_eps"] = "x";
  EXPECT_HAS(parse_err(j), "'rms_norm_eps' must be a number");
  j = flat_base();
  j["tie_word_embeddings"] = 1;
  EXPECT_HAS(parse_err(j), "'tie_word_embeddings' must be true or false");
  j = flat_base();
  j["head_dim"] = 15;
  EXPECT_HAS(parse_err(j), "'head_dim' must be even");
  j = flat_base();
  j["hidden_size"] = -3;
  EXPECT_HAS(parse_err(j), "'hidden_size' = -3 is out of range");
  j = flat_base();
  j["layer_types"] = "full_attention";
  EXPECT_HAS(parse_err(j), "'layer_types' must be a list");
  j = flat_base();
  j["model_type"] = "llama";
  EXPECT_HAS(parse_err(j), "model_type 'llama'");
  EXPECT_HAS(parse_err(json::array()), "expected a JSON object");
  auto r = parse_config("{\"model_type\": ", "");
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), "config.json: not valid JSON");
}

TEST(ModelConfig, LayerTypesValidated) {
  auto j = flat_base();
  j["layer_types"] = types_pattern(5, 6);
  EXPECT_HAS(parse_err(j), "'layer_types' has 5 entries but num_hidden_layers = 6");
  j["layer_types"] = {"sliding_attention", "sliding_attention", "chunked_attention", "full_attention",
                      "sliding_attention", "full_attention"};
  EXPECT_HAS(parse_err(j), "'layer_types[2]'");
  j["layer_types"] = types_pattern(6, 2);
  auto c = parse_ok(j).model;
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.layers[i].kind == AttnKind::Full, i % 2 == 1);
}

// E2B geometry (spec §1.4/§1.5): 35 layers, (4S+1F)x7, 20 KV-shared layers -> first shared 15,
// sliding donors 13, full donors 14; double-wide MLP (12288) on the shared layers.
TEST(ModelConfig, E2BKvSharingAndDoubleWide) {
  json t = {{"hidden_size", 1536},  {"num_hidden_layers", 35}, {"intermediate_size", 6144},
            {"num_attention_heads", 8}, {"num_key_value_heads", 1}, {"head_dim", 256},
            {"global_head_dim", 512}, {"num_kv_shared_layers", 20}, {"use_double_wide_mlp", true},
            {"hidden_size_per_layer_input", 256}, {"sliding_window", 512},
            {"layer_types", types_pattern(35, 5)}, {"final_logit_softcapping", 30.0}};
  json j = {{"model_type", "gemma4"}, {"text_config", t}, {"eos_token_id", {1, 106}}};
  auto lc = parse_ok(j);
  const auto& c = lc.model;
  EXPECT_TRUE(lc.multimodal);
  EXPECT_EQ(c.first_kv_shared(), 15);
  EXPECT_EQ(c.ple_width, 256);
  EXPECT_EQ(c.eos_ids, (std::vector<int>{1, 106}));
  for (int i = 0; i < 35; ++i) {
    const auto& L = c.layers[i];
    EXPECT_EQ(L.kind == AttnKind::Full, i % 5 == 4) << i;
    if (i < 15) {
      EXPECT_EQ(L.kv_source, -1) << i;
      EXPECT_EQ(L.mlp_width, 6144) << i;
    } else {
      EXPECT_EQ(L.kv_source, L.kind == AttnKind::Full ? 14 : 13) << i;
      EXPECT_EQ(L.mlp_width, 12288) << i;
    }
  }
}

// E4B (spec §1.5): 42 layers, (5S+1F)x7, 18 shared -> sliding donors 22, full donors 23.
TEST(ModelConfig, E4BDonorsAndNoDoubleWideWhenOff) {
  json j = {{"model_type", "gemma4_text"}, {"hidden_size", 2560}, {"num_hidden_layers", 42},
            {"intermediate_size", 10240}, {"num_key_value_heads", 2}, {"num_kv_shared_layers", 18},
            {"use_double_wide_mlp", false}, {"layer_types", types_pattern(42, 6)}};
  auto c = parse_ok(j).model;
  EXPECT_EQ(c.n_heads, 8);  // mlx-lm default
  for (int i = 24; i < 42; ++i) {
    EXPECT_EQ(c.layers[i].kv_source, c.layers[i].kind == AttnKind::Full ? 23 : 22) << i;
    EXPECT_EQ(c.layers[i].mlp_width, 10240) << i;
  }
  EXPECT_EQ(c.layers[23].kv_source, -1);
}

TEST(ModelConfig, KvSharingErrors) {
  auto j = flat_base();
  j["num_kv_shared_layers"] = 6;
  EXPECT_HAS(parse_err(j), "num_kv_shared_layers");
  j = flat_base();
  j.erase("num_kv_shared_layers");  // mlx-lm default 20 > 6 layers
  EXPECT_HAS(parse_err(j), "num_kv_shared_layers' = 20");
  j = flat_base();
  j["num_kv_shared_layers"] = 2;  // layers 4 (full) and 5: layers 0..3 are all sliding
  j["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                      "full_attention", "sliding_attention"};
  EXPECT_HAS(parse_err(j), "KV-shared layer 4 (full) has no earlier full layer");
}

// mlx-lm gemma4.ModelArgs: top-level vocab_size overrides text_config's (default 262144); heads
// default to 8 / 1 only when missing.
TEST(ModelConfig, NestedWrapperRules) {
  json t = flat_base();
  t.erase("model_type");
  t["vocab_size"] = 999;
  t.erase("num_attention_heads");
  t.erase("num_key_value_heads");
  json j = {{"model_type", "gemma4_unified"}, {"text_config", t}, {"vocab_size", 512}};
  auto c = parse_ok(j).model;
  EXPECT_EQ(c.vocab, 512);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.layers[0].n_kv_heads, 1);
  j.erase("vocab_size");
  EXPECT_EQ(parse_ok(j).model.vocab, 262144);
  t["num_attention_heads"] = 4;
  t["num_key_value_heads"] = 4;
  j["text_config"] = t;
  c = parse_ok(j).model;
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.layers[0].n_kv_heads, 4);
  // Errors inside text_config name the nested field.
  t.erase("hidden_size");
  j["text_config"] = t;
  EXPECT_HAS(parse_err(j), "missing required field 'text_config.hidden_size'");
  j["text_config"] = 3;
  EXPECT_HAS(parse_err(j), "'text_config' must be an object");
}

// 26B-style full layers: attention_k_eq_v with num_global_key_value_heads (spec §1.4).
TEST(ModelConfig, KEqVGlobalHeads) {
  auto j = flat_base();
  j["num_attention_heads"] = 16;
  j["num_key_value_heads"] = 8;
  j["num_global_key_value_heads"] = 2;
  j["attention_k_eq_v"] = true;
  j["layer_types"] = types_pattern(6, 6);
  auto c = parse_ok(j).model;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(c.layers[i].n_kv_heads, 8);
    EXPECT_FALSE(c.layers[i].k_eq_v);
    EXPECT_EQ(c.layers[i].head_dim, 16);
  }
  EXPECT_EQ(c.layers[5].n_kv_heads, 2);
  EXPECT_TRUE(c.layers[5].k_eq_v);
  EXPECT_EQ(c.layers[5].head_dim, 32);
  // Without k_eq_v, mlx-lm ignores num_global_key_value_heads.
  j["attention_k_eq_v"] = false;
  c = parse_ok(j).model;
  EXPECT_EQ(c.layers[5].n_kv_heads, 8);
  EXPECT_FALSE(c.layers[5].k_eq_v);
}

// The newer HF form gives the same per-layer geometry as global_head_dim / num_global_kv_heads.
TEST(ModelConfig, PerLayerConfigEquivalentToGlobalFields) {
  auto a = flat_base();
  a["num_attention_heads"] = 8;
  a["num_key_value_heads"] = 4;
  a["num_global_key_value_heads"] = 1;
  a["attention_k_eq_v"] = true;
  a["layer_types"] = types_pattern(6, 3);
  auto b = a;
  b.erase("global_head_dim");
  b.erase("num_global_key_value_heads");
  b["per_layer_config"] = {{"2", {{"head_dim", 32}, {"num_key_value_heads", 1}}},
                           {"5", {{"head_dim", 32}, {"num_key_value_heads", 1}}}};
  auto ca = parse_ok(a).model, cb = parse_ok(b).model;
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(ca.layers[i].head_dim, cb.layers[i].head_dim) << i;
    EXPECT_EQ(ca.layers[i].n_kv_heads, cb.layers[i].n_kv_heads) << i;
    EXPECT_EQ(ca.layers[i].k_eq_v, cb.layers[i].k_eq_v) << i;
  }
  EXPECT_EQ(cb.layers[2].head_dim, 32);
  EXPECT_EQ(cb.layers[2].n_kv_heads, 1);
  EXPECT_EQ(cb.layers[1].n_kv_heads, 4);
  // Conflicts and bad keys are errors.
  auto c = b;
  c["global_head_dim"] = 64;
  EXPECT_HAS(parse_err(c), "per_layer_config gives layer 2 head_dim 32 but global_head_dim is 64");
  c = b;
  c["per_layer_config"]["9"] = {{"head_dim", 32}};
  EXPECT_HAS(parse_err(c), "per_layer_config' has key '9'");
  c = b;
  c["per_layer_config"]["2"]["num_key_value_heads"] = 3;
  EXPECT_HAS(parse_err(c), "layer 2 has 3 KV heads, which does not divide");
}

TEST(ModelConfig, RopeParameters) {
  auto j = flat_base();
  j["rope_parameters"] = {
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 5000.0}}},
      {"full_attention",
       {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.5}, {"rope_theta", 2e6}, {"factor", 8.0}}}};
  auto c = parse_ok(j).model;
  EXPECT_EQ(c.layers[0].rope.kind, RopeKind::Default);
  EXPECT_EQ(c.layers[0].rope.theta, 5000.f);
  EXPECT_EQ(c.layers[4].rope.kind, RopeKind::Proportional);
  EXPECT_EQ(c.layers[4].rope.partial_factor, 0.5f);
  EXPECT_EQ(c.layers[4].rope.theta, 2e6f);
  EXPECT_EQ(c.layers[4].rope.factor, 8.f);
  // A block without a layer type: mlx-lm uses {} -> default RoPE, theta 1e4.
  j["rope_parameters"] = {{"sliding_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}};
  c = parse_ok(j).model;
  EXPECT_EQ(c.layers[0].rope.kind, RopeKind::Linear);
  EXPECT_EQ(c.layers[0].rope.factor, 2.f);
  EXPECT_EQ(c.layers[4].rope.kind, RopeKind::Default);
  EXPECT_EQ(c.layers[4].rope.theta, 1e4f);
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "yarn"}}}};
  EXPECT_HAS(parse_err(j), "rope_parameters.full_attention.rope_type' = 'yarn' is not supported");
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "proportional"}, {"partial_rotary_factor", 2}}}};
  EXPECT_HAS(parse_err(j), "partial_rotary_factor' must be in (0, 1]");
  j["rope_parameters"] = {{"full_attention", {{"rope_theta", "big"}}}};
  EXPECT_HAS(parse_err(j), "rope_parameters.full_attention.rope_theta' must be a number");
}

TEST(ModelConfig, SoftcapMoeAndPle) {
  auto j = flat_base();
  j["final_logit_softcapping"] = nullptr;
  EXPECT_EQ(parse_ok(j).model.final_softcap, 0.f);
  j["final_logit_softcapping"] = 25.0;
  EXPECT_EQ(parse_ok(j).model.final_softcap, 25.f);
  j.erase("hidden_size_per_layer_input");
  EXPECT_EQ(parse_ok(j).model.ple_width, 256);  // mlx-lm default
  j["enable_moe_block"] = true;
  EXPECT_HAS(parse_err(j), "missing required field 'num_experts'");
  j["num_experts"] = 8;
  j["top_k_experts"] = 2;
  j["moe_intermediate_size"] = 24;
  auto c = parse_ok(j).model;
  EXPECT_EQ(c.n_experts, 8);
  EXPECT_EQ(c.top_k_experts, 2);
  EXPECT_EQ(c.moe_width, 24);
  for (const auto& L : c.layers) EXPECT_TRUE(L.moe);
  j["top_k_experts"] = 9;
  EXPECT_HAS(parse_err(j), "top_k_experts' exceeds num_experts");
}

TEST(ModelConfig, GenerationConfigReplacesEos) {
  auto j = flat_base();
  j["eos_token_id"] = {1, 106};
  j["bos_token_id"] = 2;
  auto c = parse_ok(j, R"({"eos_token_id": [1, 106, 50], "temperature": 1.0, "top_k": 64, "top_p": 0.95})").model;
  EXPECT_EQ(c.eos_ids, (std::vector<int>{1, 106, 50}));
  EXPECT_EQ(c.gen_temperature, 1.f);
  EXPECT_EQ(c.gen_top_k, 64);
  EXPECT_FLOAT_EQ(c.gen_top_p, 0.95f);
  // A falsy eos in generation_config does not replace (mlx-lm `if eos := ...`).
  c = parse_ok(j, R"({"eos_token_id": []})").model;
  EXPECT_EQ(c.eos_ids, (std::vector<int>{1, 106}));
  EXPECT_EQ(c.gen_temperature, -1.f);
  EXPECT_EQ(c.gen_top_k, 0);
  c = parse_ok(j, R"({"eos_token_id": 7})").model;
  EXPECT_EQ(c.eos_ids, std::vector<int>{7});
  auto r = parse_config(j.dump(), "{oops", "config.json", "generation_config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), "generation_config.json: not valid JSON");
  r = parse_config(j.dump(), R"({"eos_token_id": "x"})");
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), "generation_config.json: field 'eos_token_id'");
  j["eos_token_id"] = "eos";
  EXPECT_HAS(parse_err(j), "field 'eos_token_id'");
}

TEST(ModelConfig, LoadConfigFromDirectory) {
  g4test::TempDir d;
  auto bad = load_config(d.path());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_HAS(bad.message(), "config.json: missing");
  auto j = flat_base();
  g4test::write_text(d.file("config.json"), j.dump());
  g4test::write_text(d.file("generation_config.json"), R"({"eos_token_id": [1, 106, 50]})");
  auto r = load_config(d.path());
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ(r->model.eos_ids, (std::vector<int>{1, 106, 50}));
  j.erase("hidden_size");
  g4test::write_text(d.file("config.json"), j.dump());
  r = load_config(d.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), d.file("config.json") + ": missing required field 'hidden_size'");
}

TEST(QuantConfig, DefaultsAndOverrides) {
  auto j = flat_base();
  j["quantization"] = {{"group_size", 64},
                       {"bits", 4},
                       {"mode", "affine"},
                       {"model.layers.0.mlp.down_proj", {{"group_size", 32}, {"bits", 8}}},
                       {"language_model.model.layers.1.router.proj", {{"bits", 6}}},
                       {"model.embed_tokens", false},
                       {"lm_head", true},
                       {"vision_tower.encoder.layers.0.q_proj", false}};
  auto q = parse_ok(j).quant;
  ASSERT_TRUE(q.present);
  EXPECT_EQ(q.bits, 4);
  EXPECT_EQ(q.group_size, 64);
  const ModuleQuant* m = q.find("layers.0.mlp.down_proj");
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->quantized);
  EXPECT_EQ(m->bits, 8);
  EXPECT_EQ(m->group_size, 32);
  m = q.find("layers.1.router.proj");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->bits, 6);
  EXPECT_EQ(m->group_size, 64);  // MLX affine default when the dict omits it
  m = q.find("embed_tokens");
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->quantized);
  m = q.find("lm_head");
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->quantized);
  EXPECT_EQ(m->bits, 4);
  EXPECT_EQ(q.find("layers.0.mlp.up_proj"), nullptr);
  EXPECT_EQ(q.ignored, std::vector<std::string>{"vision_tower.encoder.layers.0.q_proj"});
}

TEST(QuantConfig, QuantizationConfigAndNestedPlacement) {
  auto j = flat_base();
  j["quantization_config"] = {{"group_size", 32}, {"bits", 8}};
  auto q = parse_ok(j).quant;
  EXPECT_TRUE(q.present);
  EXPECT_EQ(q.bits, 8);
  EXPECT_EQ(q.group_size, 32);
  // `quantization` wins over `quantization_config`.
  j["quantization"] = {{"group_size", 128}, {"bits", 2}};
  EXPECT_EQ(parse_ok(j).quant.group_size, 128);
  // Nested: text_config.quantization_config is used when the top level has none (mlx-lm).
  json t = flat_base();
  t["quantization_config"] = {{"group_size", 64}, {"bits", 3}};
  json n = {{"model_type", "gemma4"}, {"text_config", t}};
  EXPECT_EQ(parse_ok(n).quant.bits, 3);
}

TEST(QuantConfig, UnsupportedSettings) {
  auto j = flat_base();
  j["quantization"] = {{"group_size", 64}, {"bits", 7}};
  EXPECT_HAS(parse_err(j), "'quantization.bits' = 7 is not supported");
  j["quantization"] = {{"group_size", 16}, {"bits", 4}};
  EXPECT_HAS(parse_err(j), "'quantization.group_size' = 16 is not supported");
  j["quantization"] = {{"group_size", 32}, {"bits", 4}, {"mode", "mxfp4"}};
  EXPECT_HAS(parse_err(j), "'quantization.mode' = 'mxfp4' is not supported");
  j["quantization"] = {{"group_size", 64}, {"bits", 4}, {"model.layers.0.mlp.up_proj", {{"bits", 1}}}};
  EXPECT_HAS(parse_err(j), "'quantization.model.layers.0.mlp.up_proj.bits' = 1 is not supported");
  j["quantization"] = {{"bits", 4}};
  EXPECT_HAS(parse_err(j), "missing required field 'quantization.group_size'");
  j["quantization"] = 4;
  EXPECT_HAS(parse_err(j), "'quantization' must be an object");
  j.erase("quantization");
  j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  EXPECT_HAS(parse_err(j), "quant_method' = 'gptq' is not supported");
}

TEST(CanonicalName, BothNamingSchemes) {
  EXPECT_EQ(canonical_name("language_model.model.layers.3.mlp.up_proj.weight"), "layers.3.mlp.up_proj.weight");
  EXPECT_EQ(canonical_name("language_model.lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(canonical_name("model.language_model.embed_tokens.weight"), "embed_tokens.weight");
  EXPECT_EQ(canonical_name("model.norm.weight"), "norm.weight");
  EXPECT_EQ(canonical_name("lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(canonical_name("model.vision_tower.encoder.x.weight"), std::nullopt);
  EXPECT_EQ(canonical_name("vision_tower.encoder.x.weight"), std::nullopt);
  EXPECT_EQ(canonical_name("model.embed_vision.embedding_projection.weight"), std::nullopt);
  EXPECT_EQ(canonical_name("model.audio_tower.a"), std::nullopt);
  EXPECT_EQ(canonical_name("model.vision_embedder.b"), std::nullopt);
  EXPECT_EQ(canonical_name("multi_modal_projector.c"), std::nullopt);
}

TEST(ExpectedTensors, CoversSharedAndKEqVLayers) {
  auto j = flat_base();
  j["num_kv_shared_layers"] = 1;
  j["attention_k_eq_v"] = true;
  j["hidden_size_per_layer_input"] = 8;
  auto c = parse_ok(j).model;
  auto v = expected_tensors(c);
  auto has = [&](const std::string& n) {
    for (auto& t : v)
      if (t.name == n) return true;
    return false;
  };
  EXPECT_TRUE(has("layers.4.self_attn.k_proj"));
  EXPECT_FALSE(has("layers.4.self_attn.v_proj"));  // full layer with k_eq_v
  EXPECT_TRUE(has("layers.3.self_attn.v_proj"));
  EXPECT_FALSE(has("layers.5.self_attn.k_proj"));  // KV-shared
  EXPECT_FALSE(has("layers.5.self_attn.k_norm.weight"));
  EXPECT_TRUE(has("layers.5.self_attn.q_norm.weight"));
  EXPECT_TRUE(has("embed_tokens_per_layer"));
  EXPECT_TRUE(has("layers.0.per_layer_input_gate"));
  EXPECT_FALSE(has("lm_head"));
}
