#include "vision/vision_encoder.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/thread_pool.h"
#include "io/safetensors_source.h"
#include "io/tensor_store.h"

namespace g4 {
namespace fs = std::filesystem;
using nlohmann::json;

Result<VisionConfig> parse_vision_config(const std::string& text, const std::string& file) {
  json top = json::parse(text, nullptr, false);
  if (top.is_discarded() || !top.is_object()) return err("%s: not a JSON object", file.c_str());
  const std::string type = top.value("model_type", std::string());
  auto vc = top.find("vision_config");
  if ((type != "gemma4" && type != "gemma4_unified") || vc == top.end() || !vc->is_object())
    return err("%s: the model has no vision encoder (no vision_config)", file.c_str());
  VisionConfig c;
  c.unified = type == "gemma4_unified";
  auto integer = [&](const json& o, const char* k, int& out, int lo) -> Status {
    auto it = o.find(k);
    if (it == o.end() || it->is_null()) return Status::ok();
    if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > (1 << 24))
      return err("%s: field 'vision_config.%s' must be an integer >= %d", file.c_str(), k, lo);
    out = int(it->get<int64_t>());
    return Status::ok();
  };
  G4_TRY(integer(*vc, "hidden_size", c.hidden, 1));
  G4_TRY(integer(*vc, "intermediate_size", c.intermediate, 1));
  G4_TRY(integer(*vc, "num_hidden_layers", c.layers, 1));
  G4_TRY(integer(*vc, "num_attention_heads", c.heads, 1));
  G4_TRY(integer(*vc, "num_key_value_heads", c.kv_heads, 1));
  G4_TRY(integer(*vc, "head_dim", c.head_dim, 4));
  G4_TRY(integer(*vc, "patch_size", c.patch, 1));
  G4_TRY(integer(*vc, "pooling_kernel_size", c.pool, 1));
  G4_TRY(integer(*vc, "position_embedding_size", c.position_embedding_size, 1));
  G4_TRY(integer(*vc, "default_output_length", c.default_soft_tokens, 1));
  G4_TRY(integer(top, "vision_soft_tokens_per_image", c.default_soft_tokens, 1));
  if (c.unified) {
    G4_TRY(integer(*vc, "num_soft_tokens", c.default_soft_tokens, 1));
    G4_TRY(integer(*vc, "model_patch_size", c.model_patch, 1));
    G4_TRY(integer(*vc, "mm_embed_dim", c.mm_embed, 1));
    G4_TRY(integer(*vc, "mm_posemb_size", c.mm_posemb, 1));
    G4_TRY(integer(*vc, "output_proj_dims", c.output_proj, 1));
    if (!c.mm_embed) c.mm_embed = 3840;
    if (!c.mm_posemb) c.mm_posemb = 1120;
    if (!c.output_proj) c.output_proj = c.mm_embed;
    if (c.model_patch != c.patch * c.pool)
      return err("%s: vision_config.model_patch_size = %d is not patch_size * pooling_kernel_size = %d", file.c_str(),
                 c.model_patch, c.patch * c.pool);
  }
  G4_TRY(integer(top, "image_token_id", c.image_token, 0));
  G4_TRY(integer(top, "boi_token_id", c.boi_token, 0));
  G4_TRY(integer(top, "eoi_token_id", c.eoi_token, 0));
  if (vc->contains("rms_norm_eps") && (*vc)["rms_norm_eps"].is_number()) c.rms_eps = (*vc)["rms_norm_eps"].get<float>();
  c.clipped_linears = vc->value("use_clipped_linears", false);
  c.standardize = vc->value("standardize", false);
  auto rp = vc->find("rope_parameters");
  if (rp != vc->end() && rp->is_object() && rp->contains("rope_theta") && (*rp)["rope_theta"].is_number())
    c.rope_theta = (*rp)["rope_theta"].get<float>();
  if (c.heads % c.kv_heads) return err("%s: vision_config: num_key_value_heads must divide num_attention_heads", file.c_str());
  if (c.head_dim % 4) return err("%s: vision_config.head_dim must be a multiple of 4 (2-D RoPE)", file.c_str());
  const json& tc = top.contains("text_config") && top["text_config"].is_object() ? top["text_config"] : top;
  c.text_hidden = tc.value("hidden_size", 0);
  auto bi = tc.find("use_bidirectional_attention");
  c.text_bidirectional_images = bi != tc.end() && bi->is_string() && bi->get<std::string>() == "vision";
  if (c.text_hidden <= 0) return err("%s: text_config.hidden_size is missing", file.c_str());
  return c;
}

Result<std::unique_ptr<VisionEncoder>> VisionEncoder::load(const std::string& dir, Backend& be) {
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  std::ifstream f(cfg_path);
  if (!f) return err("%s: cannot read", cfg_path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  G4_ASSIGN_OR_RETURN(VisionConfig c, parse_vision_config(ss.str(), cfg_path));
  G4_ASSIGN_OR_RETURN(auto store, TensorStore::open_dir(dir));
  G4_ASSIGN_OR_RETURN(auto src, SafetensorsSource::create(store, QuantConfig{}, TensorSet::Vision));
  std::unique_ptr<VisionEncoder> e(new VisionEncoder(c, be));
  if (c.unified) {  // the 12B's encoder-free embedder
    const int64_t pd = 3 * int64_t(c.model_patch) * c.model_patch, m = c.mm_embed;
    const std::string ve = "vision_embedder.";
    auto vec = [&](const std::string& name, int64_t n, std::vector<float>& out) -> Status {
      G4_ASSIGN_OR_RETURN(out, src->vector(name, n));
      return Status::ok();
    };
    G4_TRY(vec(ve + "patch_ln1.weight", pd, e->ln1_w_));
    G4_TRY(vec(ve + "patch_ln1.bias", pd, e->ln1_b_));
    G4_ASSIGN_OR_RETURN(WeightView dw, src->matrix(ve + "patch_dense", m, pd));
    e->dense_ = be.place_weight(dw);
    G4_TRY(vec(ve + "patch_dense.bias", m, e->dense_b_));
    G4_TRY(vec(ve + "patch_ln2.weight", m, e->ln2_w_));
    G4_TRY(vec(ve + "patch_ln2.bias", m, e->ln2_b_));
    G4_TRY(vec(ve + "pos_embedding", int64_t(c.mm_posemb) * 2 * m, e->posemb_));
    G4_TRY(vec(ve + "pos_norm.weight", m, e->lnp_w_));
    G4_TRY(vec(ve + "pos_norm.bias", m, e->lnp_b_));
    if (c.output_proj != c.mm_embed)
      return err("%s: vision_config.output_proj_dims (%d) differs from mm_embed_dim (%d)", cfg_path.c_str(),
                 c.output_proj, c.mm_embed);
    G4_ASSIGN_OR_RETURN(WeightView pw, src->matrix("embed_vision.embedding_projection", c.text_hidden, c.output_proj));
    e->embed_proj_ = be.place_weight(pw);
    e->src_ = std::shared_ptr<const WeightSource>(std::move(src));
    return e;
  }
  const int d = c.hidden, I = c.intermediate, H = c.heads, Hk = c.kv_heads, D = c.head_dim;
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols, WeightView& out) -> Status {
    G4_ASSIGN_OR_RETURN(WeightView w, src->matrix(name, rows, cols));
    out = be.place_weight(w);
    return Status::ok();
  };
  auto host = [&](const std::string& name, int64_t n) -> Result<std::vector<float>> { return src->vector(name, n); };
  auto scalar = [&](const std::string& name, float& out) -> Status {
    if (!src->has(name)) return Status::ok();
    G4_ASSIGN_OR_RETURN(auto v, src->vector(name, 1));
    out = v[0];
    return Status::ok();
  };
  const std::string pe = "vision_tower.patch_embedder.";
  G4_TRY(mat(pe + "input_proj", d, 3 * int64_t(c.patch) * c.patch, e->input_proj_));
  G4_ASSIGN_OR_RETURN(e->pos_table_, host(pe + "position_embedding_table", 2 * int64_t(c.position_embedding_size) * d));
  G4_TRY(mat("embed_vision.embedding_projection", c.text_hidden, d, e->embed_proj_));
  if (c.standardize) {
    G4_ASSIGN_OR_RETURN(e->std_bias_, host("vision_tower.std_bias", d));
    G4_ASSIGN_OR_RETURN(e->std_scale_, host("vision_tower.std_scale", d));
  }
  for (int i = 0; i < c.layers; ++i) {
    Layer L;
    const std::string p = "vision_tower.encoder.layers." + std::to_string(i) + ".";
    struct Lin {
      const char* name;
      int64_t rows, cols;
      WeightView* w;
      Clip* clip;
    };
    for (const Lin& l : {Lin{"self_attn.q_proj", int64_t(H) * D, d, &L.q, &L.cq},
                         Lin{"self_attn.k_proj", int64_t(Hk) * D, d, &L.k, &L.ck},
                         Lin{"self_attn.v_proj", int64_t(Hk) * D, d, &L.v, &L.cv},
                         Lin{"self_attn.o_proj", d, int64_t(H) * D, &L.o, &L.co},
                         Lin{"mlp.gate_proj", I, d, &L.gate, &L.cgate}, Lin{"mlp.up_proj", I, d, &L.up, &L.cup},
                         Lin{"mlp.down_proj", d, I, &L.down, &L.cdown}}) {
      const std::string m = p + l.name;
      G4_TRY(mat(m + ".linear", l.rows, l.cols, *l.w));
      if (c.clipped_linears) {
        G4_TRY(scalar(m + ".input_min", l.clip->in_min));
        G4_TRY(scalar(m + ".input_max", l.clip->in_max));
        G4_TRY(scalar(m + ".output_min", l.clip->out_min));
        G4_TRY(scalar(m + ".output_max", l.clip->out_max));
      }
    }
    struct Norm {
      const char* name;
      int n;
      const float** out;
    };
    for (const Norm& nm : {Norm{"self_attn.q_norm.weight", D, &L.q_norm}, Norm{"self_attn.k_norm.weight", D, &L.k_norm},
                           Norm{"input_layernorm.weight", d, &L.input_ln},
                           Norm{"post_attention_layernorm.weight", d, &L.post_attn_ln},
                           Norm{"pre_feedforward_layernorm.weight", d, &L.pre_ffw_ln},
                           Norm{"post_feedforward_layernorm.weight", d, &L.post_ffw_ln}}) {
      G4_ASSIGN_OR_RETURN(auto v, host(p + nm.name, nm.n));
      *nm.out = e->vec(v);
    }
    e->layers_.push_back(L);
  }
  e->src_ = std::shared_ptr<const WeightSource>(std::move(src));
  return e;
}

Result<std::unique_ptr<VisionEncoder>> VisionEncoder::load_if_present(const std::string& dir, Backend& be) {
  std::error_code ec;
  const fs::path cfg = fs::path(dir) / "config.json";
  if (!fs::is_directory(dir, ec) || !fs::is_regular_file(cfg, ec)) return std::unique_ptr<VisionEncoder>();
  std::ifstream f(cfg);
  json top = json::parse(f, nullptr, false);
  const std::string type = top.is_object() ? top.value("model_type", std::string()) : std::string();
  if (top.is_discarded() || !top.is_object() || (type != "gemma4" && type != "gemma4_unified") ||
      !top.contains("vision_config") || !top["vision_config"].is_object())
    return std::unique_ptr<VisionEncoder>();
  G4_ASSIGN_OR_RETURN(auto store, TensorStore::open_dir(dir));
  bool any = false;
  for (const auto& [name, t] : store->all()) any = any || vision_tensor_name(name).has_value();
  if (!any) return std::unique_ptr<VisionEncoder>();
  return load(dir, be);
}

Result<std::vector<int32_t>> VisionEncoder::expand_image_tokens(const std::vector<int32_t>& ids,
                                                                const std::vector<int>& soft_tokens) const {
  std::vector<int32_t> out;
  size_t img = 0;
  for (int32_t t : ids) {
    if (t != cfg_.image_token) {
      out.push_back(t);
      continue;
    }
    if (img == soft_tokens.size()) break;
    out.push_back(cfg_.boi_token);
    out.insert(out.end(), size_t(soft_tokens[img]), cfg_.image_token);
    out.push_back(cfg_.eoi_token);
    ++img;
  }
  const size_t placeholders = size_t(std::count(ids.begin(), ids.end(), cfg_.image_token));
  if (placeholders != soft_tokens.size())
    return err("the prompt has %zu image placeholders but %zu images were given", placeholders, soft_tokens.size());
  return out;
}

VisionEncoder::~VisionEncoder() {
  for (float* p : owned_) be_.free(p);
}

float* VisionEncoder::vec(const std::vector<float>& v) {
  float* p = be_.alloc_f32(v.size()).f32();
  be_.from_host(v.data(), v.size(), p);
  owned_.push_back(p);
  return p;
}

Status VisionEncoder::usable_for_prompts(const Backend& be) const {
  if (cfg_.text_bidirectional_images && !be.supports_image_blocks())
    return err("image input for this model is not supported on the %s backend yet: its text model attends "
               "bidirectionally within each image (use_bidirectional_attention = \"vision\")",
               be.name().c_str());
  return Status::ok();
}

Result<PatchGrid> VisionEncoder::patches(const RgbImage& img, int max_soft_tokens) const {
  const int budget = max_soft_tokens > 0 ? max_soft_tokens : cfg_.default_soft_tokens;
  if (cfg_.unified) return gemma4_patches(img, cfg_.patch, cfg_.pool, budget, cfg_.model_patch, true);
  return gemma4_patches(img, cfg_.patch, cfg_.pool, budget);
}

namespace {

// LayerNorm over each row of x [rows, n] in place (mx.fast.layer_norm: f32 mean and variance).
void layer_norm_rows(std::vector<float>& x, int rows, int n, const std::vector<float>& w, const std::vector<float>& b,
                     float eps) {
  for (int r = 0; r < rows; ++r) {
    float* v = x.data() + size_t(r) * n;
    float mean = 0.f;
    for (int i = 0; i < n; ++i) mean += v[i];
    mean /= float(n);
    float var = 0.f;
    for (int i = 0; i < n; ++i) var += (v[i] - mean) * (v[i] - mean);
    var /= float(n);
    const float inv = 1.f / std::sqrt(var + eps);
    for (int i = 0; i < n; ++i) v[i] = (v[i] - mean) * inv * w[size_t(i)] + b[size_t(i)];
  }
}

}  // namespace

// The encoder computes in f32 on every backend (its buffers are f32 whatever the activation
// dtype); the features it returns are host vectors.
std::vector<float> VisionEncoder::embed(const Buf& x, int n, int width) {
  const Buf xn = be_.alloc_f32(size_t(n) * width);
  const Buf feat = be_.alloc_f32(size_t(n) * cfg_.text_hidden);
  be_.rms_norm(x, n, width, nullptr, cfg_.rms_eps, ActPrecision::F32, xn);
  be_.matmul(xn, n, embed_proj_, ActPrecision::F32, feat);
  std::vector<float> out(size_t(n) * cfg_.text_hidden);
  be_.to_host(feat, out.size(), out.data());
  be_.free(xn);
  be_.free(feat);
  return out;
}

Result<std::vector<float>> VisionEncoder::encode_unified(const PatchGrid& g, std::vector<float>* pooled) {
  const VisionConfig& c = cfg_;
  const int L = g.patches(), pd = 3 * c.model_patch * c.model_patch, m = c.mm_embed;
  if (g.patch != c.model_patch) return err("image patches are %d pixels, the embedder takes %d", g.patch, c.model_patch);
  for (int i = 0; i < L; ++i)
    if (g.pos_x[size_t(i)] >= c.mm_posemb || g.pos_y[size_t(i)] >= c.mm_posemb)
      return err("image is %d patches wide / %d high; the position table holds %d", g.cols, g.rows, c.mm_posemb);
  constexpr float kLnEps = 1e-5f;
  std::vector<float> h = g.pixels;
  layer_norm_rows(h, L, pd, ln1_w_, ln1_b_, kLnEps);
  const Buf x = be_.alloc_f32(size_t(L) * pd);
  const Buf y = be_.alloc_f32(size_t(L) * m);
  be_.from_host(h.data(), h.size(), x);
  be_.matmul(x, L, dense_, ActPrecision::F32, y);
  std::vector<float> e(size_t(L) * m);
  be_.to_host(y, e.size(), e.data());
  for (int r = 0; r < L; ++r)
    for (int j = 0; j < m; ++j) e[size_t(r) * m + j] += dense_b_[size_t(j)];
  layer_norm_rows(e, L, m, ln2_w_, ln2_b_, kLnEps);
  for (int r = 0; r < L; ++r)
    for (int j = 0; j < m; ++j)
      e[size_t(r) * m + j] += posemb_[(size_t(g.pos_x[size_t(r)]) * 2 + 0) * m + j] +
                              posemb_[(size_t(g.pos_y[size_t(r)]) * 2 + 1) * m + j];
  layer_norm_rows(e, L, m, lnp_w_, lnp_b_, kLnEps);
  if (pooled) *pooled = e;
  be_.from_host(e.data(), e.size(), y);
  std::vector<float> out = embed(y, L, m);
  be_.free(x);
  be_.free(y);
  return out;
}


namespace {

void clamp_host(std::vector<float>& x, float lo, float hi) {
  for (float& v : x) v = std::min(std::max(v, lo), hi);
}

// 2-D RoPE in place on x [L, heads, D] (mlx-vlm apply_multidimensional_rope, ndim 2): channels
// [0, D/2) rotate with pos_x, [D/2, D) with pos_y; within each part of C = D/2 channels, pairs
// (j, j + C/2) rotate by pos / theta^(2j/C).
void rope_2d(float* x, int L, int heads, int D, const int32_t* px, const int32_t* py, float theta) {
  const int C = D / 2, half = C / 2;
  std::vector<float> timescale(static_cast<size_t>(half));  // f32 as mlx-vlm computes it
  for (int j = 0; j < half; ++j) timescale[size_t(j)] = std::pow(theta, (2.0f / float(C)) * float(j));
  for (int r = 0; r < L; ++r) {
    for (int part = 0; part < 2; ++part) {
      const float pos = float(part == 0 ? px[r] : py[r]);
      for (int j = 0; j < half; ++j) {
        const float a = pos / timescale[size_t(j)];
        const float c = std::cos(a), s = std::sin(a);
        for (int h = 0; h < heads; ++h) {
          float* v = x + (size_t(r) * heads + h) * D + part * C;
          const float x0 = v[j], x1 = v[j + half];
          v[j] = x0 * c - x1 * s;
          v[j + half] = x1 * c + x0 * s;
        }
      }
    }
  }
}

// Bidirectional attention, scale 1: q [L, H, D], k / v [L, Hk, D] -> out [L, H, D].
void attend_all(const float* q, const float* k, const float* v, int L, int H, int Hk, int D, float* out) {
  const int group = H / Hk;
  parallel_for(int64_t(L) * H, [&](int64_t begin, int64_t end) {
    std::vector<float> s(static_cast<size_t>(L));
    for (int64_t i = begin; i < end; ++i) {
      const int r = int(i / H), h = int(i % H), kh = h / group;
      const float* qi = q + (size_t(r) * H + h) * D;
      float mx = -INFINITY;
      for (int t = 0; t < L; ++t) {
        const float* kt = k + (size_t(t) * Hk + kh) * D;
        float acc = 0.f;
        for (int j = 0; j < D; ++j) acc += qi[j] * kt[j];
        s[size_t(t)] = acc;
        mx = std::max(mx, acc);
      }
      double sum = 0.0;
      for (int t = 0; t < L; ++t) {
        s[size_t(t)] = std::exp(s[size_t(t)] - mx);
        sum += s[size_t(t)];
      }
      float* o = out + (size_t(r) * H + h) * D;
      std::fill(o, o + D, 0.f);
      for (int t = 0; t < L; ++t) {
        const float w = float(s[size_t(t)] / sum);
        const float* vt = v + (size_t(t) * Hk + kh) * D;
        for (int j = 0; j < D; ++j) o[j] += w * vt[j];
      }
    }
  });
}

}  // namespace

void VisionEncoder::linear(const Buf& x, int M, const WeightView& W, const Clip& c, const Buf& y) {
  const bool clip_in = std::isfinite(c.in_min) || std::isfinite(c.in_max);
  const bool clip_out = std::isfinite(c.out_min) || std::isfinite(c.out_max);
  std::vector<float> h;
  if (clip_in) {
    h.resize(size_t(M) * W.cols);
    be_.to_host(x, h.size(), h.data());
    clamp_host(h, c.in_min, c.in_max);
    be_.from_host(h.data(), h.size(), x);  // x is scratch the caller does not reuse unclipped
  }
  be_.matmul(x, M, W, ActPrecision::F32, y);
  if (clip_out) {
    h.resize(size_t(M) * W.rows);
    be_.to_host(y, h.size(), h.data());
    clamp_host(h, c.out_min, c.out_max);
    be_.from_host(h.data(), h.size(), y);
  }
}

Result<std::vector<float>> VisionEncoder::encode(const PatchGrid& g, std::vector<float>* pooled) {
  if (cfg_.unified) return encode_unified(g, pooled);
  const VisionConfig& c = cfg_;
  const int L = g.patches(), d = c.hidden, H = c.heads, Hk = c.kv_heads, D = c.head_dim, I = c.intermediate;
  const int pp = 3 * c.patch * c.patch;
  if (L == 0 || g.rows % c.pool || g.cols % c.pool)
    return err("image patch grid %dx%d is not a whole number of %dx%d pooling blocks", g.cols, g.rows, c.pool, c.pool);
  for (int i = 0; i < L; ++i)
    if (g.pos_x[size_t(i)] >= c.position_embedding_size || g.pos_y[size_t(i)] >= c.position_embedding_size)
      return err("image is %d patches wide / %d high; the position table holds %d", g.cols, g.rows,
                 c.position_embedding_size);
  Backend& be = be_;
  auto buf = [&](size_t n) { return be.alloc_f32(n); };
  const Buf x = buf(size_t(L) * d), xn = buf(size_t(L) * d), t = buf(size_t(L) * std::max(pp, d));
  const Buf q = buf(size_t(L) * H * D), k = buf(size_t(L) * Hk * D), v = buf(size_t(L) * Hk * D);
  const Buf att = buf(size_t(L) * H * D), o = buf(size_t(L) * d), gate = buf(size_t(L) * I), up = buf(size_t(L) * I);
  // Patch embedding: input_proj(2·(pixels − 0.5)) + T[0][x] + T[1][y].
  {
    std::vector<float> p(g.pixels.size());
    for (size_t i = 0; i < p.size(); ++i) p[i] = 2.f * (g.pixels[i] - 0.5f);
    be.from_host(p.data(), p.size(), t);
    be.matmul(t, L, input_proj_, ActPrecision::F32, x);
    std::vector<float> h(size_t(L) * d);
    be.to_host(x, h.size(), h.data());
    const size_t P = size_t(c.position_embedding_size);
    for (int r = 0; r < L; ++r)
      for (int j = 0; j < d; ++j)
        h[size_t(r) * d + j] += pos_table_[size_t(g.pos_x[size_t(r)]) * d + j] +
                                pos_table_[(P + size_t(g.pos_y[size_t(r)])) * d + j];
    be.from_host(h.data(), h.size(), x);
  }
  std::vector<float> hq(size_t(L) * H * D), hk(size_t(L) * Hk * D), hv(size_t(L) * Hk * D), ha(size_t(L) * H * D);
  for (const Layer& ly : layers_) {
    be.rms_norm(x, L, d, ly.input_ln, c.rms_eps, ActPrecision::F32, xn);
    be.copy(xn, size_t(L) * d, t);
    linear(t, L, ly.q, ly.cq, q);
    be.copy(xn, size_t(L) * d, t);
    linear(t, L, ly.k, ly.ck, k);
    be.copy(xn, size_t(L) * d, t);
    linear(t, L, ly.v, ly.cv, v);
    be.rms_norm(q, L * H, D, ly.q_norm, c.rms_eps, ActPrecision::F32, q);
    be.rms_norm(k, L * Hk, D, ly.k_norm, c.rms_eps, ActPrecision::F32, k);
    be.rms_norm(v, L * Hk, D, nullptr, c.rms_eps, ActPrecision::F32, v);
    be.to_host(q, hq.size(), hq.data());
    be.to_host(k, hk.size(), hk.data());
    be.to_host(v, hv.size(), hv.data());
    rope_2d(hq.data(), L, H, D, g.pos_x.data(), g.pos_y.data(), c.rope_theta);
    rope_2d(hk.data(), L, Hk, D, g.pos_x.data(), g.pos_y.data(), c.rope_theta);
    attend_all(hq.data(), hk.data(), hv.data(), L, H, Hk, D, ha.data());
    be.from_host(ha.data(), ha.size(), att);
    linear(att, L, ly.o, ly.co, o);
    be.norm_add(x, o, L, d, ly.post_attn_ln, c.rms_eps, ActPrecision::F32);
    be.rms_norm(x, L, d, ly.pre_ffw_ln, c.rms_eps, ActPrecision::F32, xn);
    be.copy(xn, size_t(L) * d, t);
    linear(t, L, ly.gate, ly.cgate, gate);
    be.copy(xn, size_t(L) * d, t);
    linear(t, L, ly.up, ly.cup, up);
    be.gelu_mul(gate, up, size_t(L) * I, ActPrecision::F32, gate);
    linear(gate, L, ly.down, ly.cdown, o);
    be.norm_add(x, o, L, d, ly.post_ffw_ln, c.rms_eps, ActPrecision::F32);
  }
  // Pooling: mean of each pool×pool block, row-major over the pooled grid, times √d.
  std::vector<float> h(size_t(L) * d);
  be.to_host(x, h.size(), h.data());
  const int pc = g.cols / c.pool, n_out = L / (c.pool * c.pool);
  std::vector<float> pooled_h(size_t(n_out) * d, 0.f);
  const float w = 1.f / float(c.pool * c.pool), root = float(std::sqrt(double(d)));
  for (int r = 0; r < L; ++r) {
    const int idx = g.pos_x[size_t(r)] / c.pool + pc * (g.pos_y[size_t(r)] / c.pool);
    for (int j = 0; j < d; ++j) pooled_h[size_t(idx) * d + j] += h[size_t(r) * d + j] * w;
  }
  for (float& val : pooled_h) val *= root;
  if (c.standardize)
    for (int r = 0; r < n_out; ++r)
      for (int j = 0; j < d; ++j) {
        float& val = pooled_h[size_t(r) * d + j];
        val = (val - std_bias_[size_t(j)]) * std_scale_[size_t(j)];
      }
  if (pooled) *pooled = pooled_h;
  // embed_vision: RMSNorm without weight, then the projection to the text width.
  be.from_host(pooled_h.data(), pooled_h.size(), x);
  be.rms_norm(x, n_out, d, nullptr, c.rms_eps, ActPrecision::F32, xn);
  const Buf feat = buf(size_t(n_out) * c.text_hidden);
  be.matmul(xn, n_out, embed_proj_, ActPrecision::F32, feat);
  std::vector<float> out(size_t(n_out) * c.text_hidden);
  be.to_host(feat, out.size(), out.data());
  for (const Buf& p : {x, xn, t, q, k, v, att, o, gate, up, feat}) be.free(p);
  return out;
}

}  // namespace g4
