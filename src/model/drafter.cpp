#include "model/drafter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/model_config.h"
#include "io/safetensors_source.h"
#include "io/tensor_store.h"

namespace g4 {
namespace fs = std::filesystem;
using nlohmann::json;

Result<DrafterConfig> parse_drafter_config(std::string_view config_json, const std::string& file) {
  json top = json::parse(config_json, nullptr, false);
  if (top.is_discarded() || !top.is_object()) return err("%s: not a JSON object", file.c_str());
  const std::string type = top.value("model_type", std::string());
  if (type != "gemma4_assistant")
    return err("%s: model_type '%s' is not a Gemma 4 assistant drafter (gemma4_assistant)", file.c_str(), type.c_str());
  auto integer = [&](const char* k, int def, int lo) -> Result<int> {
    auto it = top.find(k);
    if (it == top.end() || it->is_null()) return def;
    if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > (1 << 24))
      return err("%s: field '%s' must be an integer >= %d", file.c_str(), k, lo);
    return int(it->get<int64_t>());
  };
  DrafterConfig c;
  if (!top.contains("backbone_hidden_size")) return err("%s: missing required field 'backbone_hidden_size'", file.c_str());
  G4_ASSIGN_OR_RETURN(c.backbone, integer("backbone_hidden_size", 0, 1));
  G4_ASSIGN_OR_RETURN(c.block_size, integer("block_size", 4, 2));
  G4_ASSIGN_OR_RETURN(c.num_centroids, integer("num_centroids", 2048, 1));
  G4_ASSIGN_OR_RETURN(c.centroid_top_k, integer("centroid_intermediate_top_k", 32, 1));
  auto oe = top.find("use_ordered_embeddings");
  if (oe != top.end() && !oe->is_null() && !oe->is_boolean())
    return err("%s: field 'use_ordered_embeddings' must be true or false", file.c_str());
  c.ordered_embeddings = oe != top.end() && oe->is_boolean() && oe->get<bool>();
  auto tc = top.find("text_config");
  if (tc == top.end() || !tc->is_object()) return err("%s: missing required object 'text_config'", file.c_str());
  // The decoder is a Gemma 4 text config whose layers own no KV and take no per-layer inputs
  // (HF Gemma4AssistantConfig; mlx-vlm builds every layer with kv_shared_only=True).
  json text = *tc;
  if (text.value("enable_moe_block", false))
    return err("%s: field 'text_config.enable_moe_block' = true: MoE drafters are not supported", file.c_str());
  text["model_type"] = "gemma4_text";
  text["num_kv_shared_layers"] = 0;
  text["hidden_size_per_layer_input"] = 0;
  if (top.contains("tie_word_embeddings")) text["tie_word_embeddings"] = top["tie_word_embeddings"];
  for (const char* k : {"quantization", "quantization_config"})
    if (top.contains(k)) text[k] = top[k];
  G4_ASSIGN_OR_RETURN(LoadedConfig lc, parse_config(text.dump(), {}, file + " (text_config)"));
  c.text = std::move(lc.model);
  c.quant = std::move(lc.quant);
  if (c.ordered_embeddings && c.text.vocab % c.num_centroids)
    return err("%s: num_centroids = %d does not divide the vocabulary (%d)", file.c_str(), c.num_centroids, c.text.vocab);
  if (c.ordered_embeddings && c.centroid_top_k > c.num_centroids)
    return err("%s: centroid_intermediate_top_k = %d exceeds num_centroids = %d", file.c_str(), c.centroid_top_k,
               c.num_centroids);
  return c;
}

Result<std::unique_ptr<Drafter>> Drafter::load(const std::string& dir, const ModelConfig& target,
                                               const ModelWeights& tw, Backend& be) {
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  if (!fs::is_directory(dir)) return err("%s: not a directory (a drafter directory holds config.json and *.safetensors)", dir.c_str());
  std::ifstream f(cfg_path);
  if (!f) return err("%s: cannot read", cfg_path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  G4_ASSIGN_OR_RETURN(DrafterConfig cfg, parse_drafter_config(ss.str(), cfg_path));
  if (cfg.backbone != target.hidden)
    return err("%s: backbone_hidden_size = %d but the target model's hidden size is %d", cfg_path.c_str(), cfg.backbone,
               target.hidden);
  if (cfg.text.vocab != target.vocab)
    return err("%s: the drafter's vocabulary (%d) is not the target model's (%d)", cfg_path.c_str(), cfg.text.vocab,
               target.vocab);
  // Each drafter layer reads the KV of the target's last layer of its kind (its donor, for a
  // KV-shared one): HF shared_kv_states / mlx-vlm shared_kv_sink keep the last of each type.
  int last_of_kind[2] = {-1, -1};
  for (int i = 0; i < target.n_layers; ++i) {
    const LayerSpec& ls = target.layers[size_t(i)];
    last_of_kind[ls.kind == AttnKind::Full ? 1 : 0] = ls.kv_source >= 0 ? ls.kv_source : i;
  }
  for (int i = 0; i < cfg.text.n_layers; ++i) {
    LayerSpec& ls = cfg.text.layers[size_t(i)];
    const bool full = ls.kind == AttnKind::Full;
    const int t = last_of_kind[full ? 1 : 0];
    if (t < 0)
      return err("%s: drafter layer %d is a %s layer but the target model has none", cfg_path.c_str(), i,
                 full ? "full-attention" : "sliding-window");
    const LayerSpec& ts = target.layers[size_t(t)];
    if (ts.head_dim != ls.head_dim || cfg.text.n_heads % ts.n_kv_heads)
      return err("%s: drafter layer %d (head_dim %d, %d heads) cannot read target layer %d's KV (head_dim %d, %d KV heads)",
                 cfg_path.c_str(), i, ls.head_dim, cfg.text.n_heads, t, ts.head_dim, ts.n_kv_heads);
    if (ts.window != ls.window)
      return err("%s: drafter layer %d has sliding window %d but target layer %d has %d", cfg_path.c_str(), i, ls.window,
                 t, ts.window);
    ls.kv_source = t;  // a TARGET layer index: the layer owns no KV (load_weights skips k/v)
    ls.n_kv_heads = ts.n_kv_heads;
  }

  G4_ASSIGN_OR_RETURN(auto store, TensorStore::open_dir(dir));
  G4_ASSIGN_OR_RETURN(auto src, SafetensorsSource::create(store, cfg.quant));
  std::unique_ptr<Drafter> d(new Drafter(std::move(cfg), be));
  const DrafterConfig& c = d->cfg_;
  const int dd = c.text.hidden, bb = c.backbone, V = c.text.vocab;
  G4_ASSIGN_OR_RETURN(d->w_, load_weights(c.text, *src, be));
  auto mat = [&](const char* name, int64_t rows, int64_t cols, WeightView& out) -> Status {
    G4_ASSIGN_OR_RETURN(WeightView w, src->matrix(name, rows, cols));
    out = be.place_weight(w);
    return Status::ok();
  };
  G4_TRY(mat("pre_projection", dd, 2 * int64_t(bb), d->pre_proj_));
  G4_TRY(mat("post_projection", bb, dd, d->post_proj_));
  if (c.ordered_embeddings) {
    G4_TRY(mat("masked_embedding.centroids", c.num_centroids, dd, d->centroids_));
    StoredTensor t = store->find("masked_embedding.token_ordering");
    if (!t.info) t = store->find("model.masked_embedding.token_ordering");
    if (!t.info) return err("%s: tensor 'masked_embedding.token_ordering' is missing", dir.c_str());
    const TensorInfo& ti = *t.info;
    if ((ti.dtype != DType::I32 && ti.dtype != DType::I64) || ti.numel() != V)
      return err("%s: tensor '%s' must be int32/int64 with %d entries (got %s %s)", t.file->path().c_str(),
                 ti.name.c_str(), V, std::string(dtype_name(ti.dtype)).c_str(), ti.shape_str().c_str());
    d->ordering_.resize(size_t(V));
    for (int i = 0; i < V; ++i) {
      int64_t v;
      if (ti.dtype == DType::I32) {
        int32_t x;
        std::memcpy(&x, ti.data + size_t(i) * 4, 4);
        v = x;
      } else {
        std::memcpy(&v, ti.data + size_t(i) * 8, 8);
      }
      if (v < 0 || v >= V)
        return err("%s: tensor '%s' entry %d = %lld is not a token id below %d", t.file->path().c_str(), ti.name.c_str(),
                   i, static_cast<long long>(v), V);
      d->ordering_[size_t(i)] = int32_t(v);
    }
  }
  d->src_ = std::shared_ptr<const WeightSource>(std::move(src));
  d->path_ = dir;
  d->target_embed_ = tw.embed;
  d->target_hidden_ = target.hidden;
  d->draft_tokens_ = c.block_size - 1;
  for (const LayerSpec& ls : c.text.layers) d->rope_.push_back(make_rope_table(ls.rope, ls.head_dim));

  size_t qw = 0, iw = 0;
  for (const LayerSpec& ls : c.text.layers) {
    qw = std::max(qw, size_t(c.text.n_heads) * ls.head_dim);
    iw = std::max(iw, size_t(ls.mlp_width));
  }
  d->cat_ = be.alloc_act(size_t(target.hidden) + bb);
  d->x_ = be.alloc_act(dd); d->xn_ = be.alloc_act(dd); d->o_ = be.alloc_act(dd); d->f_ = be.alloc_act(dd);
  d->hn_ = be.alloc_act(dd);
  d->q_ = be.alloc_act(qw); d->att_ = be.alloc_act(qw);
  d->gate_ = be.alloc_act(iw); d->up_ = be.alloc_act(iw);
  d->logits_ = be.alloc_f32(size_t(V));
  d->state_ = be.alloc_act(size_t(bb));
  if (c.ordered_embeddings) {
    d->cent_ = be.alloc_f32(size_t(c.num_centroids));
    const size_t n = size_t(c.centroid_top_k) * size_t(V / c.num_centroids);
    d->cand_ids_ = be.alloc_i32(n);
    d->cand_rows_ = be.alloc_f32(n * size_t(dd));
  }
  d->ids_ = be.alloc_i32(1);
  d->am_ = be.alloc_i32(1);
  return d;
}

Drafter::~Drafter() {
  for (const Buf& p : {cat_, x_, xn_, q_, att_, o_, gate_, up_, f_, hn_, logits_, state_, cent_, cand_rows_, cand_ids_,
                       ids_, am_})
    be_.free(p);
}

int32_t Drafter::pick(ActPrecision P, bool full_logits) {
  const int V = cfg_.text.vocab;
  if (!cfg_.ordered_embeddings) {
    be_.argmax(logits_, 1, V, am_);
    int32_t tok = 0;
    be_.to_host(am_, 1, &tok);
    return tok;
  }
  // Centroid routing (HF Gemma4AssistantMaskedEmbedder): the top-k clusters' tokens compete.
  const int C = cfg_.num_centroids, K = cfg_.centroid_top_k, per = V / C;
  be_.matmul(hn_, 1, centroids_, P, cent_);
  host_cent_.resize(size_t(C));
  be_.to_host(cent_, size_t(C), host_cent_.data());
  std::vector<int> order(static_cast<size_t>(C));
  for (int i = 0; i < C; ++i) order[size_t(i)] = i;
  std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int a, int b) {
    const float x = host_cent_[size_t(a)], y = host_cent_[size_t(b)];
    return x > y || (x == y && a < b);
  });
  cand_.clear();
  for (int j = 0; j < K; ++j) {
    const int32_t* ids = ordering_.data() + size_t(order[size_t(j)]) * per;
    cand_.insert(cand_.end(), ids, ids + per);
  }
  // The candidates' logits: from the full head when it was computed, else (host backends) from
  // their embedding rows alone, which is the point of the routing (a 262144-token head is most
  // of a small drafter's work).
  std::vector<float>& sc = host_cand_scores_;
  sc.resize(cand_.size());
  if (full_logits) {
    host_logits_.resize(size_t(V));
    be_.to_host(logits_, size_t(V), host_logits_.data());
    for (size_t i = 0; i < cand_.size(); ++i) sc[i] = host_logits_[size_t(cand_[i])];
  } else {
    const int n = int(cand_.size()), d = cfg_.text.hidden;
    be_.from_host(cand_.data(), size_t(n), cand_ids_);
    be_.embed(w_.lm_head, cand_ids_, n, 1.f, P, cand_rows_);  // host memory on host backends
    host_hn_.resize(size_t(d));
    be_.to_host(hn_, size_t(d), host_hn_.data());
    for (int i = 0; i < n; ++i) {
      const float* row = cand_rows_.f32() + size_t(i) * d;
      float acc = 0.f;
      for (int k = 0; k < d; ++k) acc += row[k] * host_hn_[size_t(k)];
      sc[size_t(i)] = acc;
    }
  }
  int32_t best = -1;
  float best_score = 0.f;
  for (size_t i = 0; i < cand_.size(); ++i)
    if (best < 0 || sc[i] > best_score || (sc[i] == best_score && cand_[i] < best)) {
      best = cand_[i];
      best_score = sc[i];
    }
  return best;
}

void Drafter::draft(const KvCache& cache, const Buf& hidden, int32_t token, int n, ActPrecision P, int32_t* out,
                    float* logits, float* states) {
  auto T = [P](double c) { return P == ActPrecision::BF16 ? round_bf16(float(c)) : float(c); };
  const ModelConfig& tc = cfg_.text;
  const int dt = target_hidden_, bb = cfg_.backbone, dd = tc.hidden, H = tc.n_heads, V = tc.vocab;
  const int pos = cache.size() - 1;  // the position of the target's last cached token
  be_.copy(hidden, size_t(bb), state_);
  std::vector<AttnSeq> seqs(1);  // one query row at `pos`; each layer points it at its target cache
  seqs[0].n = 1;
  seqs[0].pos0 = pos;
  for (int step = 0; step < n; ++step) {
    be_.from_host(&token, 1, ids_);
    be_.embed(target_embed_, ids_, 1, T(std::sqrt(double(dt))), P, cat_);
    be_.copy(state_, size_t(bb), cat_.at(dt));
    be_.matmul(cat_, 1, pre_proj_, P, x_);
    for (int l = 0; l < tc.n_layers; ++l) {
      const LayerSpec& ls = tc.layers[size_t(l)];
      const LayerWeights& lw = w_.layers[size_t(l)];
      be_.norm_matmuls(x_, 1, InputNorm{lw.input_ln.data, tc.rms_eps, xn_}, {{&lw.q, q_}}, P);
      seqs[0].kv = cache.layer(ls.kv_source);
      be_.attn_prep(q_, H, Buf(), Buf(), ls.n_kv_heads, ls.head_dim, lw.q_norm.data, nullptr, false, tc.rms_eps,
                    seqs, rope_[size_t(l)], P);
      be_.attention(q_, H, seqs, tc.query_scale, P, att_);
      be_.matmul_norm_add(att_, 1, lw.o, o_, x_, lw.post_attn_ln.data, tc.rms_eps, P);
      be_.gate_up_gelu(x_, 1, InputNorm{lw.pre_ffw_ln.data, tc.rms_eps, xn_}, lw.gate, lw.up, false, P, gate_, up_);
      be_.matmul_norm_add(gate_, 1, lw.down, f_, x_, lw.post_ffw_ln.data, tc.rms_eps, P);
      if (lw.layer_scalar != 1.f) be_.scale(x_, T(lw.layer_scalar), size_t(dd), P, x_);
    }
    be_.rms_norm(x_, 1, dd, w_.final_norm.data, tc.rms_eps, P, hn_);
    // The full head, unless only the routed candidates compete and their rows are cheaper.
    const bool full = !cfg_.ordered_embeddings || be_.on_device() || logits;
    if (full) be_.matmul(hn_, 1, w_.lm_head, P, logits_);
    token = pick(P, full);
    out[step] = token;
    be_.matmul(hn_, 1, post_proj_, P, state_);
    if (logits) be_.to_host(logits_, size_t(V), logits + size_t(step) * V);
    if (states) be_.to_host(state_, size_t(bb), states + size_t(step) * bb);
  }
}

}  // namespace g4
