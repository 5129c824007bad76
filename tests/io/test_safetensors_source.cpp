// SafetensorsSource: canonical-name mapping for mlx-community and Hugging Face checkpoints,
// HF gate_up_proj split views, MLX affine views (bits/group inferred from shapes, spec §3.4/§3.5),
// shape/dtype checks; plus TensorStore sharding.
#include <gtest/gtest.h>

#include "io/safetensors_source.h"
#include "io/tensor_store.h"
#include "io_test_util.h"

using namespace g4;
using namespace g4test;

namespace {

#define EXPECT_HAS(s, part) EXPECT_NE((s).find(part), std::string::npos) << "'" << (part) << "' not in: " << (s)

std::unique_ptr<SafetensorsSource> source(const TempDir& d, const std::vector<T>& ts, QuantConfig q = {}) {
  write_st(d.file("model.safetensors"), ts);
  auto st = TensorStore::open_dir(d.path());
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (!st.is_ok()) return nullptr;
  auto s = SafetensorsSource::create(st.value(), std::move(q));
  EXPECT_TRUE(s.is_ok()) << s.message();
  return s.is_ok() ? std::move(s).value() : nullptr;
}

const uint8_t* stored(const SafetensorsSource& s, const std::string& name) {
  auto t = s.store().find(name);
  return t.info ? t.info->data : nullptr;
}

}  // namespace

TEST(SafetensorsSource, MlxNestedNamesFloatViews) {
  TempDir d;
  auto s = source(d, {pat("language_model.model.embed_tokens.weight", "BF16", {10, 8}),
                      pat("language_model.model.layers.0.self_attn.q_proj.weight", "F32", {12, 8}),
                      pat("language_model.model.layers.0.mlp.down_proj.weight", "F16", {8, 6}),
                      pat("language_model.lm_head.weight", "BF16", {10, 8}),
                      T{"language_model.model.norm.weight", "BF16", {4}, bf16_bytes({1.f, -0.5f, 2.f, 0.f})},
                      pat("vision_tower.encoder.layers.0.q_proj.weight", "BF16", {4, 4})});
  ASSERT_TRUE(s);
  auto e = s->matrix("embed_tokens", 10, 8);
  ASSERT_TRUE(e.is_ok()) << e.message();
  EXPECT_EQ(e->fmt, WFormat::BF16);
  EXPECT_EQ(e->rows, 10);
  EXPECT_EQ(e->cols, 8);
  EXPECT_EQ(e->row_bytes, 16);
  EXPECT_EQ(e->data, stored(*s, "language_model.model.embed_tokens.weight"));  // a view, not a copy
  auto q = s->matrix("layers.0.self_attn.q_proj", 12, 8);
  ASSERT_TRUE(q.is_ok()) << q.message();
  EXPECT_EQ(q->fmt, WFormat::F32);
  EXPECT_EQ(q->row_bytes, 32);
  auto dn = s->matrix("layers.0.mlp.down_proj", 8, 6);
  ASSERT_TRUE(dn.is_ok());
  EXPECT_EQ(dn->fmt, WFormat::F16);
  auto lm = s->matrix("lm_head", 10, 8);
  ASSERT_TRUE(lm.is_ok()) << lm.message();
  EXPECT_EQ(lm->data, stored(*s, "language_model.lm_head.weight"));
  auto n = s->vector("norm.weight", 4);
  ASSERT_TRUE(n.is_ok());
  EXPECT_EQ(n.value(), (std::vector<float>{1.f, -0.5f, 2.f, 0.f}));
  EXPECT_TRUE(s->has("embed_tokens"));
  EXPECT_TRUE(s->has("norm.weight"));
  EXPECT_FALSE(s->has("layers.0.self_attn.k_proj"));
  EXPECT_FALSE(s->has("vision_tower.encoder.layers.0.q_proj"));
  EXPECT_EQ(s->stored_name("norm.weight"), "language_model.model.norm.weight");
  EXPECT_HAS(s->describe(), "language_model.model.*");
}

TEST(SafetensorsSource, TextOnlyAndHfNames) {
  {
    TempDir d;
    auto s = source(d, {pat("model.embed_tokens.weight", "BF16", {10, 8}), pat("lm_head.weight", "BF16", {10, 8}),
                        pat("model.layers.2.self_attn.o_proj.weight", "BF16", {8, 16})});
    ASSERT_TRUE(s);
    EXPECT_TRUE(s->matrix("embed_tokens", 10, 8).is_ok());
    EXPECT_TRUE(s->matrix("lm_head", 10, 8).is_ok());
    EXPECT_TRUE(s->matrix("layers.2.self_attn.o_proj", 8, 16).is_ok());
  }
  {
    TempDir d;  // HF multimodal originals: towers dropped, text under model.language_model.
    auto s = source(d, {pat("model.language_model.embed_tokens.weight", "BF16", {10, 8}),
                        pat("model.language_model.layers.0.self_attn.q_proj.weight", "BF16", {16, 8}),
                        pat("model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight", "BF16", {4, 4}),
                        pat("model.embed_vision.embedding_projection.weight", "BF16", {8, 4}),
                        pat("model.audio_tower.layers.0.x.weight", "BF16", {2}),
                        T{"model.language_model.layers.0.layer_scalar", "BF16", {1}, bf16_bytes({0.5f})}});
    ASSERT_TRUE(s);
    auto q = s->matrix("layers.0.self_attn.q_proj", 16, 8);
    ASSERT_TRUE(q.is_ok()) << q.message();
    EXPECT_EQ(q->data, stored(*s, "model.language_model.layers.0.self_attn.q_proj.weight"));
    auto ls = s->vector("layers.0.layer_scalar", 1);
    ASSERT_TRUE(ls.is_ok());
    EXPECT_EQ(ls.value()[0], 0.5f);
    EXPECT_HAS(s->describe(), "model.language_model.*");
  }
}

// HF experts.gate_up_proj [E, 2I, d]: gate = rows [0, I), up = rows [I, 2I) of each expert
// (mlx-lm gemma4_text.Model.sanitize splits along axis -2), as views into the stored tensor.
TEST(SafetensorsSource, HfGateUpSplitViews) {
  TempDir d;
  const int E = 3, I = 4, D = 6;
  auto s = source(d, {pat("model.language_model.layers.1.experts.gate_up_proj", "BF16", {E, 2 * I, D}, 3),
                      pat("model.language_model.layers.1.experts.down_proj", "BF16", {E, D, I}, 5)});
  ASSERT_TRUE(s);
  const uint8_t* base = stored(*s, "model.language_model.layers.1.experts.gate_up_proj");
  const int64_t rb = D * 2;
  for (int e = 0; e < E; ++e) {
    auto g = s->stacked_matrix("layers.1.experts.switch_glu.gate_proj", e, E, I, D);
    auto u = s->stacked_matrix("layers.1.experts.switch_glu.up_proj", e, E, I, D);
    ASSERT_TRUE(g.is_ok()) << g.message();
    ASSERT_TRUE(u.is_ok()) << u.message();
    EXPECT_EQ(g->row_bytes, rb);
    EXPECT_EQ(g->rows, I);
    EXPECT_EQ(static_cast<const uint8_t*>(g->data), base + (int64_t(e) * 2 * I) * rb);
    EXPECT_EQ(static_cast<const uint8_t*>(u->data), base + (int64_t(e) * 2 * I + I) * rb);
    // Element check against the stored pattern: up row r of expert e is stored row e*2I + I + r.
    auto pat_all = pattern(size_t(E) * 2 * I * D * 2, 3);
    EXPECT_EQ(std::memcmp(u->data, pat_all.data() + (int64_t(e) * 2 * I + I) * rb, size_t(I * rb)), 0);
    auto dn = s->stacked_matrix("layers.1.experts.switch_glu.down_proj", e, E, D, I);
    ASSERT_TRUE(dn.is_ok()) << dn.message();
    EXPECT_EQ(static_cast<const uint8_t*>(dn->data),
              stored(*s, "model.language_model.layers.1.experts.down_proj") + int64_t(e) * D * I * 2);
  }
  EXPECT_TRUE(s->has("layers.1.experts.switch_glu.gate_proj"));
  EXPECT_EQ(s->stored_bytes("layers.1.experts.switch_glu.up_proj"), uint64_t(E * I * D * 2));
  auto bad = s->stacked_matrix("layers.1.experts.switch_glu.gate_proj", 0, E, I + 1, D);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_HAS(bad.message(), "experts.gate_up_proj' has shape [3, 8, 6] but module");
  EXPECT_HAS(bad.message(), "[3, 10, 6]");
  EXPECT_FALSE(s->stacked_matrix("layers.1.experts.switch_glu.gate_proj", 3, E, I, D).is_ok());
}

// MLX affine: weight u32 [out, in*b/32], scales/biases [out, in/g] (spec §3.4); bits and group
// inferred as mlx-lm utils.infer_quant_config does.
TEST(SafetensorsSource, MlxAffineViewsInferBitsAndGroup) {
  struct Case { int bits, group; };
  for (Case c : {Case{4, 64}, Case{8, 32}, Case{3, 128}, Case{6, 64}, Case{2, 32}, Case{5, 64}}) {
    TempDir d;
    const int rows = 6, cols = 256;
    const int wcols = cols * c.bits / 32, ng = cols / c.group;
    QuantConfig q;
    q.present = true;
    q.bits = 4;
    q.group_size = 64;
    auto s = source(d, {pat("model.layers.0.mlp.up_proj.weight", "U32", {rows, wcols}, 1),
                        pat("model.layers.0.mlp.up_proj.scales", "BF16", {rows, ng}, 2),
                        pat("model.layers.0.mlp.up_proj.biases", "BF16", {rows, ng}, 3)},
                    q);
    ASSERT_TRUE(s);
    auto v = s->matrix("layers.0.mlp.up_proj", rows, cols);
    ASSERT_TRUE(v.is_ok()) << v.message();
    EXPECT_EQ(v->fmt, WFormat::MlxAffine);
    EXPECT_EQ(v->bits, c.bits);
    EXPECT_EQ(v->group_size, c.group);
    EXPECT_EQ(v->row_bytes, wcols * 4);
    EXPECT_EQ(v->scale_dtype, DType::BF16);
    EXPECT_EQ(v->data, stored(*s, "model.layers.0.mlp.up_proj.weight"));
    EXPECT_EQ(v->scales, stored(*s, "model.layers.0.mlp.up_proj.scales"));
    EXPECT_EQ(v->biases, stored(*s, "model.layers.0.mlp.up_proj.biases"));
    EXPECT_EQ(s->stored_bytes("layers.0.mlp.up_proj"), uint64_t(rows * wcols * 4 + 2 * rows * ng * 2));
  }
}

TEST(SafetensorsSource, QuantizedStackedExperts) {
  TempDir d;
  const int E = 4, rows = 8, cols = 64, wcols = 8, ng = 1;  // 4-bit, group 64
  auto s = source(d, {pat("language_model.model.layers.0.experts.switch_glu.down_proj.weight", "U32", {E, rows, wcols}),
                      pat("language_model.model.layers.0.experts.switch_glu.down_proj.scales", "F16", {E, rows, ng}),
                      pat("language_model.model.layers.0.experts.switch_glu.down_proj.biases", "F16", {E, rows, ng})});
  ASSERT_TRUE(s);
  const std::string m = "layers.0.experts.switch_glu.down_proj";
  for (int e = 0; e < E; ++e) {
    auto v = s->stacked_matrix(m, e, E, rows, cols);
    ASSERT_TRUE(v.is_ok()) << v.message();
    EXPECT_EQ(v->bits, 4);
    EXPECT_EQ(v->group_size, 64);
    EXPECT_EQ(v->scale_dtype, DType::F16);
    EXPECT_EQ(static_cast<const uint8_t*>(v->data), stored(*s, "language_model.model." + m + ".weight") + e * rows * wcols * 4);
    EXPECT_EQ(static_cast<const uint8_t*>(v->scales), stored(*s, "language_model.model." + m + ".scales") + e * rows * ng * 2);
    EXPECT_EQ(static_cast<const uint8_t*>(v->biases), stored(*s, "language_model.model." + m + ".biases") + e * rows * ng * 2);
  }
  auto bad = s->stacked_matrix(m, 0, E + 1, rows, cols);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_HAS(bad.message(), "needs [5, 8, 8]");
}

TEST(SafetensorsSource, QuantConfigRules) {
  const std::vector<T> q4 = {pat("model.layers.0.mlp.up_proj.weight", "U32", {4, 8}),
                             pat("model.layers.0.mlp.up_proj.scales", "BF16", {4, 1}),
                             pat("model.layers.0.mlp.up_proj.biases", "BF16", {4, 1}),
                             pat("model.layers.0.mlp.down_proj.weight", "BF16", {64, 4})};
  QuantConfig q;
  q.present = true;
  q.bits = 4;
  q.group_size = 64;
  {  // explicit override that matches the shapes
    TempDir d;
    auto qq = q;
    qq.overrides["layers.0.mlp.up_proj"] = ModuleQuant{true, 4, 64};
    auto s = source(d, q4, qq);
    EXPECT_TRUE(s->matrix("layers.0.mlp.up_proj", 4, 64).is_ok());
  }
  {  // override disagrees with the stored shapes
    TempDir d;
    auto qq = q;
    qq.overrides["layers.0.mlp.up_proj"] = ModuleQuant{true, 8, 64};
    auto s = source(d, q4, qq);
    auto r = s->matrix("layers.0.mlp.up_proj", 4, 64);
    ASSERT_FALSE(r.is_ok());
    EXPECT_HAS(r.message(), "model.layers.0.mlp.up_proj.weight' is stored as 4-bit, group 64 but config.json says 8-bit");
  }
  {  // `false` but scales present
    TempDir d;
    auto qq = q;
    qq.overrides["layers.0.mlp.up_proj"] = ModuleQuant{false, 0, 0};
    auto s = source(d, q4, qq);
    auto r = s->matrix("layers.0.mlp.up_proj", 4, 64);
    ASSERT_FALSE(r.is_ok());
    EXPECT_HAS(r.message(), "marked unquantized");
  }
  {  // `false` for a float module: a float view
    TempDir d;
    auto qq = q;
    qq.overrides["layers.0.mlp.down_proj"] = ModuleQuant{false, 0, 0};
    auto s = source(d, q4, qq);
    auto r = s->matrix("layers.0.mlp.down_proj", 64, 4);
    ASSERT_TRUE(r.is_ok()) << r.message();
    EXPECT_EQ(r->fmt, WFormat::BF16);
  }
  {  // a dict override names a module that has no scales
    TempDir d;
    auto qq = q;
    qq.overrides["layers.0.mlp.down_proj"] = ModuleQuant{true, 4, 64};
    auto s = source(d, q4, qq);
    auto r = s->matrix("layers.0.mlp.down_proj", 64, 4);
    ASSERT_FALSE(r.is_ok());
    EXPECT_HAS(r.message(), "is quantized per config.json but 'layers.0.mlp.down_proj.scales' is missing");
  }
  {  // U32 weight without scales
    TempDir d;
    auto s = source(d, {pat("model.layers.0.mlp.up_proj.weight", "U32", {4, 8})}, q);
    auto r = s->matrix("layers.0.mlp.up_proj", 4, 64);
    ASSERT_FALSE(r.is_ok());
    EXPECT_HAS(r.message(), "packed U32 but there is no");
  }
  {  // missing biases (not affine)
    TempDir d;
    auto s = source(d, {q4[0], q4[1]}, q);
    auto r = s->matrix("layers.0.mlp.up_proj", 4, 64);
    ASSERT_FALSE(r.is_ok());
    EXPECT_HAS(r.message(), "biases' is missing");
  }
  {  // shapes implying unsupported bits / group
    TempDir d;
    auto s = source(d, {pat("model.a.weight", "U32", {4, 14}), pat("model.a.scales", "BF16", {4, 2}),
                        pat("model.a.biases", "BF16", {4, 2}), pat("model.b.weight", "U32", {4, 8}),
                        pat("model.b.scales", "BF16", {4, 4}), pat("model.b.biases", "BF16", {4, 4}),
                        pat("model.c.weight", "U32", {4, 8}), pat("model.c.scales", "BF16", {4, 1}),
                        pat("model.c.biases", "F16", {4, 1})},
                    q);
    auto r = s->matrix("a", 4, 64);  // 14 words * 32 / 64 = 7 bits
    ASSERT_FALSE(r.is_ok());
    EXPECT_HAS(r.message(), "implies 7-bit values");
    r = s->matrix("b", 4, 64);  // group 16
    ASSERT_FALSE(r.is_ok());
    EXPECT_HAS(r.message(), "implies group size 16");
    r = s->matrix("c", 4, 64);
    ASSERT_FALSE(r.is_ok());
    EXPECT_HAS(r.message(), "has dtype F16 but its scales");
  }
}

TEST(SafetensorsSource, ShapeAndDtypeErrorsNameFileAndTensor) {
  TempDir d;
  auto s = source(d, {pat("model.layers.0.self_attn.q_proj.weight", "BF16", {16, 8}),
                      pat("model.layers.0.self_attn.k_proj.weight", "I32", {4, 8}),
                      pat("model.norm.weight", "BF16", {8}), pat("model.idx", "I32", {8})});
  auto r = s->matrix("layers.0.self_attn.q_proj", 8, 16);
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), d.file("model.safetensors"));
  EXPECT_HAS(r.message(), "'model.layers.0.self_attn.q_proj.weight' has shape [16, 8] but module 'layers.0.self_attn.q_proj' needs [8, 16]");
  r = s->matrix("layers.0.self_attn.k_proj", 4, 8);
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), "'model.layers.0.self_attn.k_proj.weight' has dtype I32");
  r = s->matrix("layers.0.self_attn.v_proj", 4, 8);
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), "missing tensor for module 'layers.0.self_attn.v_proj'");
  auto v = s->vector("norm.weight", 9);
  ASSERT_FALSE(v.is_ok());
  EXPECT_HAS(v.message(), "'model.norm.weight' has shape [8] (8 elements) but 9 are expected");
  v = s->vector("idx", 8);
  ASSERT_FALSE(v.is_ok());
  EXPECT_HAS(v.message(), "'model.idx' has dtype I32");
  v = s->vector("layers.0.layer_scalar", 1);
  ASSERT_FALSE(v.is_ok());
  EXPECT_HAS(v.message(), "missing tensor 'layers.0.layer_scalar'");
}

TEST(SafetensorsSource, VectorConvertsF16AndBf16) {
  TempDir d;
  std::vector<uint8_t> f16(6);
  const uint16_t h[3] = {0x3c00, 0xc000, 0x3555};  // 1, -2, 0.333251953125
  std::memcpy(f16.data(), h, 6);
  auto s = source(d, {T{"model.a", "F16", {3}, f16}, T{"model.b", "BF16", {1, 3}, bf16_bytes({1.5f, -3.f, 1e-3f})},
                      T{"model.c", "F32", {2}, f32_bytes({0.25f, 7.f})}});
  EXPECT_EQ(s->vector("a", 3).value(), (std::vector<float>{1.f, -2.f, 0.333251953125f}));
  EXPECT_EQ(s->vector("b", 3).value(), (std::vector<float>{1.5f, -3.f, round_bf16(1e-3f)}));
  EXPECT_EQ(s->vector("c", 2).value(), (std::vector<float>{0.25f, 7.f}));
}

TEST(SafetensorsSource, TwoNamesForOneCanonicalIsAnError) {
  TempDir d;
  write_st(d.file("model.safetensors"), {pat("model.norm.weight", "BF16", {4}), pat("language_model.model.norm.weight", "BF16", {4})});
  auto st = TensorStore::open_dir(d.path());
  ASSERT_TRUE(st.is_ok());
  auto s = SafetensorsSource::create(st.value(), {});
  ASSERT_FALSE(s.is_ok());
  EXPECT_HAS(s.message(), "both map to 'norm.weight'");
}

TEST(TensorStore, ShardedWithIndex) {
  TempDir d;
  write_st(d.file("model-00001-of-00002.safetensors"), {pat("a", "BF16", {4}), pat("b", "BF16", {2})});
  write_st(d.file("model-00002-of-00002.safetensors"), {pat("c", "F32", {3})});
  write_text(d.file("model.safetensors.index.json"),
             R"({"metadata":{"total_size":24},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
             R"("b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})");
  auto st = TensorStore::open_dir(d.path());
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ((*st)->files().size(), 2u);
  EXPECT_EQ((*st)->all().size(), 3u);
  EXPECT_EQ((*st)->total_bytes(), 8u + 4u + 12u);
  EXPECT_EQ((*st)->find("c").file->path(), d.file("model-00002-of-00002.safetensors"));
}

TEST(TensorStore, IndexErrors) {
  TempDir d;
  write_st(d.file("model-00001-of-00002.safetensors"), {pat("a", "BF16", {4})});
  write_st(d.file("model-00002-of-00002.safetensors"), {pat("c", "F32", {3})});
  // Listed in the index but missing from its shard: names both.
  write_text(d.file("model.safetensors.index.json"),
             R"({"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors"}})");
  auto r = TensorStore::open_dir(d.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), d.file("model-00001-of-00002.safetensors") + ": tensor 'b' listed in " +
                              d.file("model.safetensors.index.json") + " is missing from that shard");
  // Listed under the wrong shard.
  write_text(d.file("model.safetensors.index.json"),
             R"({"weight_map":{"a":"model-00001-of-00002.safetensors","c":"model-00001-of-00002.safetensors"}})");
  r = TensorStore::open_dir(d.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), "tensor 'c' listed in");
  // Missing shard file, unsafe path, invalid JSON, no weight_map.
  write_text(d.file("model.safetensors.index.json"), R"({"weight_map":{"a":"model-00003-of-00003.safetensors"}})");
  r = TensorStore::open_dir(d.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), "shard 'model-00003-of-00003.safetensors' listed in the index does not exist");
  write_text(d.file("model.safetensors.index.json"), R"({"weight_map":{"a":"../x.safetensors"}})");
  r = TensorStore::open_dir(d.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), "unsafe shard path");
  write_text(d.file("model.safetensors.index.json"), R"({"weight_map":)");
  r = TensorStore::open_dir(d.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), "model.safetensors.index.json: not valid JSON");
  write_text(d.file("model.safetensors.index.json"), R"({"metadata":{}})");
  r = TensorStore::open_dir(d.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), "missing object 'weight_map'");
}

TEST(TensorStore, GlobWithoutIndex) {
  TempDir d;
  write_st(d.file("model-00001-of-00002.safetensors"), {pat("a", "BF16", {4})});
  write_st(d.file("model-00002-of-00002.safetensors"), {pat("c", "F32", {3})});
  write_st(d.file("adapters.safetensors"), {pat("a", "F32", {1})});  // not model*: ignored by mlx-lm's glob
  auto r = TensorStore::open_dir(d.path());
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ((*r)->all().size(), 2u);
  // Same tensor in two shards.
  write_st(d.file("model-00002-of-00002.safetensors"), {pat("a", "F32", {3})});
  r = TensorStore::open_dir(d.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), "tensor 'a' is also in");
  // A bad shard's error names that shard.
  write_bytes(d.file("model-00002-of-00002.safetensors"), {1, 2, 3});
  r = TensorStore::open_dir(d.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), d.file("model-00002-of-00002.safetensors") + ": too short");
}

TEST(TensorStore, NoFiles) {
  TempDir d;
  auto r = TensorStore::open_dir(d.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), "no *.safetensors files");
  r = TensorStore::open_dir(d.file("nope"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.message(), "not a directory");
}

// MLX's writer does not pad the header (fixture headers have lengths = 3, 5, 6, 7 mod 8), so
// tensors start at odd addresses. Views point there unchanged; vector() reads with memcpy (this
// test runs under UBSan's alignment check in `make test-asan`).
TEST(SafetensorsSource, UnalignedDataAsMlxWritesIt) {
  TempDir d;
  nlohmann::ordered_json h;
  h["model.norm.weight"] = {{"dtype", "F32"}, {"shape", {1, 2}}, {"data_offsets", {1, 9}}};
  h["model.layer_norm.weight"] = {{"dtype", "BF16"}, {"shape", {3}}, {"data_offsets", {9, 15}}};
  h["model.pad"] = {{"dtype", "U8"}, {"shape", {1}}, {"data_offsets", {0, 1}}};
  std::string hs = h.dump();
  while (hs.size() % 4) hs += ' ';  // F32 data at file offset 8 + |header| + 1 = 1 (mod 4)
  std::vector<uint8_t> data = {0};
  auto f = f32_bytes({1.5f, -2.f});
  auto b = bf16_bytes({0.25f, 3.f, -1.f});
  data.insert(data.end(), f.begin(), f.end());
  data.insert(data.end(), b.begin(), b.end());
  write_bytes(d.file("model.safetensors"), raw_file(hs, data));
  auto st = TensorStore::open_dir(d.path());
  ASSERT_TRUE(st.is_ok()) << st.message();
  auto s = SafetensorsSource::create(st.value(), {});
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ((*s)->vector("norm.weight", 2).value(), (std::vector<float>{1.5f, -2.f}));
  EXPECT_EQ((*s)->vector("layer_norm.weight", 3).value(), (std::vector<float>{0.25f, 3.f, -1.f}));
  auto v = (*s)->matrix("norm", 1, 2);
  ASSERT_TRUE(v.is_ok()) << v.message();
  EXPECT_NE(reinterpret_cast<uintptr_t>(v->data) % 4, 0u);  // a view in place, not an aligned copy
}
