// open_model: dispatch on what a path holds, clear errors for non-models; a synthetic model
// directory (every tensor of expected_tensors, mixed float / MLX-affine) opens and resolves.
#include <gtest/gtest.h>

#include "io/model_dir.h"
#include "io_test_util.h"

using namespace g4;
using namespace g4test;
using nlohmann::json;

namespace {

#define EXPECT_HAS(s, part) EXPECT_NE((s).find(part), std::string::npos) << "'" << (part) << "' not in: " << (s)

std::string open_err(const std::string& p) {
  auto r = open_model(p);
  EXPECT_FALSE(r.is_ok());
  return r.is_ok() ? "" : r.message();
}

json tiny_config() {
  return json{{"model_type", "gemma4_text"}, {"hidden_size", 64},        {"num_hidden_layers", 4},
              {"intermediate_size", 96},     {"num_attention_heads", 2}, {"num_key_value_heads", 1},
              {"head_dim", 16},              {"global_head_dim", 32},    {"num_kv_shared_layers", 1},
              {"vocab_size", 40},            {"sliding_window", 8},      {"hidden_size_per_layer_input", 8},
              {"attention_k_eq_v", true},    {"layer_types", {"sliding_attention", "full_attention",
                                                               "sliding_attention", "sliding_attention"}},
              {"quantization", {{"group_size", 64}, {"bits", 4}, {"model.layers.0.mlp.up_proj", false}}}};
}

// Writes every expected tensor under `prefix`: 4-bit g64 when cols % 64 == 0 (except modules the
// config marks false), bf16 otherwise.
void write_model(const TempDir& d, const json& cfg, const std::string& prefix, const std::string& skip = "") {
  write_text(d.file("config.json"), cfg.dump());
  auto lc = parse_config(cfg.dump());
  ASSERT_TRUE(lc.is_ok()) << lc.message();
  std::vector<T> ts;
  int seed = 0;
  for (const auto& e : expected_tensors(lc->model)) {
    if (e.name == skip) continue;
    const std::string n = prefix + e.name;
    if (!e.matrix) {
      ts.push_back(pat(n, "BF16", {e.rows}, ++seed));
      continue;
    }
    std::vector<int64_t> lead;
    if (e.count) lead.push_back(e.count);
    auto shp = [&](int64_t last) {
      auto s = lead;
      s.push_back(e.rows);
      s.push_back(last);
      return s;
    };
    const ModuleQuant* ov = lc->quant.find(e.name);
    if (e.cols % 64 == 0 && !(ov && !ov->quantized)) {
      ts.push_back(pat(n + ".weight", "U32", shp(e.cols / 8), ++seed));
      ts.push_back(pat(n + ".scales", "BF16", shp(e.cols / 64), ++seed));
      ts.push_back(pat(n + ".biases", "BF16", shp(e.cols / 64), ++seed));
    } else {
      ts.push_back(pat(n + ".weight", "BF16", shp(e.cols), ++seed));
    }
  }
  write_st(d.file("model.safetensors"), ts);
}

}  // namespace

TEST(ModelDir, NotAModel) {
  TempDir d;
  EXPECT_HAS(open_err(d.file("missing")), "missing: no such file or directory");
  EXPECT_HAS(open_err(d.path()), d.path() + ": no model found");
  write_text(d.file("notes.txt"), "hi");
  EXPECT_HAS(open_err(d.file("notes.txt")), "notes.txt: not a model");
  write_st(d.file("model.safetensors"), {pat("a", "U8", {1})});
  EXPECT_HAS(open_err(d.path()), "has *.safetensors but no config.json");
  EXPECT_HAS(open_err(""), "no model path given");
}

TEST(ModelDir, GgufDispatch) {
  TempDir d;
  write_bytes(d.file("a.gguf"), {'G', 'G', 'U', 'F'});  // truncated: the GGUF reader's error names it
  EXPECT_HAS(open_err(d.path()), d.file("a.gguf"));
  EXPECT_HAS(open_err(d.file("a.gguf")), d.file("a.gguf"));
  write_bytes(d.file("b.gguf"), {'G', 'G', 'U', 'F'});
  EXPECT_HAS(open_err(d.path()), "2 .gguf files");
}

TEST(ModelDir, BadConfigOrWeightsNameTheFile) {
  TempDir d;
  write_text(d.file("config.json"), "{");
  write_st(d.file("model.safetensors"), {pat("a", "U8", {1})});
  EXPECT_HAS(open_err(d.path()), d.file("config.json") + ": not valid JSON");
  write_text(d.file("config.json"), tiny_config().dump());
  write_bytes(d.file("model.safetensors"), {0, 1});
  EXPECT_HAS(open_err(d.path()), d.file("model.safetensors") + ": too short");
}

TEST(ModelDir, SyntheticModelResolvesEveryWeight) {
  for (const std::string prefix : {"model.", "language_model.model.", "model.language_model."}) {
    TempDir d;
    write_model(d, tiny_config(), prefix);
    auto r = open_model(d.path());
    ASSERT_TRUE(r.is_ok()) << r.message();
    EXPECT_EQ(r->format, "safetensors");
    EXPECT_EQ(r->config.n_layers, 4);
    EXPECT_TRUE(r->quant.present);
    Status st = verify_weights(r->config, *r->weights);
    EXPECT_TRUE(st.is_ok()) << prefix << ": " << st.message();
    auto up = r->weights->matrix("layers.0.mlp.up_proj", 96, 64);
    ASSERT_TRUE(up.is_ok()) << up.message();
    EXPECT_EQ(up->fmt, WFormat::BF16);  // `false` in the quantization block
    auto q = r->weights->matrix("layers.0.self_attn.q_proj", 32, 64);
    ASSERT_TRUE(q.is_ok());
    EXPECT_EQ(q->fmt, WFormat::MlxAffine);
    EXPECT_EQ(q->bits, 4);
  }
}

TEST(ModelDir, MissingWeightIsReported) {
  TempDir d;
  write_model(d, tiny_config(), "model.", "layers.2.self_attn.k_norm.weight");
  auto r = open_model(d.path());
  ASSERT_TRUE(r.is_ok()) << r.message();
  Status st = verify_weights(r->config, *r->weights);
  ASSERT_FALSE(st.is_ok());
  EXPECT_HAS(st.message(), "missing tensor 'layers.2.self_attn.k_norm.weight'");
}
