// GGUF vocabulary -> Tokenizer (mirrors llama.cpp `llama_vocab::impl::load` for the SPM and
// Gemma 4 BPE cases, with transformers' GGUF conversion choices where the two differ; see
// tokenizer.h).
#include "text/tokenizer_gguf.h"

#include <algorithm>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace g4 {

namespace {

bool is_gemma_1_to_3(const std::string& arch) {
  return arch == "gemma" || arch == "gemma2" || arch == "gemma3" || arch == "gemma3n";
}

// transformers `gemma_tokenizer`: Gemma 1-3 files store whitespace-only tokens with real spaces
// ("  "), while the text they match has been normalized to "▁▁".
bool respell_spaces(std::string& t) {
  if (t.empty() || t.find(' ') == std::string::npos) return false;
  for (char c : t)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f') return false;
  // Python: "\u2581" * len(t) with len in code points (all ASCII here).
  std::string out;
  for (size_t i = 0; i < t.size(); ++i) out += "\xE2\x96\x81";
  t.swap(out);
  return true;
}

// transformers `generate_merges(vocab, vocab_scores=-position)` as used by `gemma_tokenizer`: every
// split of every token into two vocabulary tokens is a merge; merges are ranked by the merged
// token's position in the file, then by longer left part (Python's stable sort with reverse=True on
// (score, len(left), len(right)); splits are at code-point boundaries).
void derive_merges(tok::MergeTable& merges, const std::vector<std::string>& tokens, const tok::StrIndex& index) {
  struct M { int merged; int left_len; int left; int right; };
  std::vector<M> all;
  all.reserve(tokens.size() * 2);
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string& t = tokens[id];
    if (t.empty() || index.find(t) != int(id)) continue;  // duplicates: the last id holds the string
    int cps = 0;
    for (size_t i = 0; i < t.size(); i += utf8::char_len(t, i)) {
      if (i > 0) {
        int l = index.find(std::string_view(t).substr(0, i));
        if (l >= 0) {
          int r = index.find(std::string_view(t).substr(i));
          if (r >= 0) all.push_back(M{int(id), cps, l, r});
        }
      }
      ++cps;
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const M& a, const M& b) {
    return a.merged != b.merged ? a.merged < b.merged : a.left_len > b.left_len;
  });
  merges.reserve(all.size());
  for (size_t r = 0; r < all.size(); ++r) merges.insert(all[r].left, all[r].right, uint32_t(r), all[r].merged);
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf_vocab(const GgufVocab& v) {
  const char* src = v.source.c_str();
  const size_t n = v.tokens.size();
  if (n == 0) return err("%s: tokenizer.ggml.tokens is empty", src);
  if (n >= (size_t(1) << 30)) return err("%s: tokenizer.ggml.tokens has too many entries", src);
  if (!v.scores.empty() && v.scores.size() != n)
    return err("%s: tokenizer.ggml.scores has %zu entries, expected %zu", src, v.scores.size(), n);
  if (!v.token_types.empty() && v.token_types.size() != n)
    return err("%s: tokenizer.ggml.token_type has %zu entries, expected %zu", src, v.token_types.size(), n);
  auto check_id = [&](int id, const char* key) -> Status {
    if (id >= int(n)) return err("%s: %s = %d is outside the vocabulary (%zu)", src, key, id, n);
    return Status::ok();
  };
  G4_TRY(check_id(v.bos_id, "tokenizer.ggml.bos_token_id"));
  G4_TRY(check_id(v.eos_id, "tokenizer.ggml.eos_token_id"));
  G4_TRY(check_id(v.unk_id, "tokenizer.ggml.unknown_token_id"));
  G4_TRY(check_id(v.pad_id, "tokenizer.ggml.padding_token_id"));

  auto impl = std::make_shared<Impl>();
  Impl& m = *impl;
  // Gemma 1-3 "llama" vocabularies without merges are tokenized the way transformers converts them
  // (BPE over merges derived from the vocabulary order): merge-by-score (llama.cpp SPM) differs
  // from the HF tokenizer on ~11% of our corpus (whitespace runs), the derived merges on none.
  const bool gemma_derived = v.model == "llama" && is_gemma_1_to_3(v.architecture) && v.merges.empty();
  if (gemma_derived) {
    m.model = Impl::Model::kBpe;
    m.byte_fallback = true;
    m.fuse_unk = true;
  } else if (v.model == "llama") {
    m.model = Impl::Model::kSpm;
    m.scores = v.scores;
    m.spm_space_prefix = v.add_space_prefix;
  } else if (v.model == "gemma4") {
    m.model = Impl::Model::kBpe;
    m.byte_fallback = true;
    m.fuse_unk = true;
  } else {
    return err("%s: tokenizer.ggml.model '%s' is not supported (llama, gemma4)", src, v.model.c_str());
  }
  m.tokens = v.tokens;
  std::vector<bool> respelled(n, false);
  if (is_gemma_1_to_3(v.architecture))
    for (size_t i = 0; i < n; ++i) respelled[i] = respell_spaces(m.tokens[i]);

  // Space -> "▁" (llama.cpp `llama_escape_whitespace`; HF normalizer Replace). Decoder: "▁" -> " ",
  // byte tokens -> bytes.
  m.normalizer.push_back({tok::NormOp::kReplace, " ", "\xE2\x96\x81"});
  m.pieces = m.tokens;
  for (auto& p : m.pieces) {
    std::string out;
    for (size_t i = 0; i < p.size();) {
      if (p.compare(i, 3, "\xE2\x96\x81") == 0) {
        out += ' ';
        i += 3;
      } else {
        out += p[i++];
      }
    }
    p.swap(out);
  }
  m.decode_byte_fallback = true;
  m.finish_vocab();

  // Token types -> added tokens (transformers `add_gguf_special_tokens`): CONTROL -> special,
  // USER_DEFINED -> non-special (only if still spelled as in the vocabulary).
  for (size_t i = 0; i < v.token_types.size(); ++i) {
    const int t = v.token_types[i];
    if (m.tokens[i].empty()) continue;
    if (t == GgufVocab::kControl) {
      m.flags[i] |= tok::kFlagSpecial | tok::kFlagAdded;
      m.raw_added.add(m.tokens[i], int(i));
    } else if (t == GgufVocab::kUserDefined && !respelled[i]) {
      m.flags[i] |= tok::kFlagAdded;
      m.raw_added.add(m.tokens[i], int(i));
    }
  }

  // Merges ("left right", split at the first space after the first byte, like llama.cpp).
  m.merges.reserve(v.merges.size());
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& s = v.merges[r];
    size_t sp = s.find(' ', 1);
    if (sp == std::string::npos) return err("%s: tokenizer.ggml.merges[%zu] has no space", src, r);
    std::string a = s.substr(0, sp), b = s.substr(sp + 1);
    int ia = m.index.find(a), ib = m.index.find(b), im = m.index.find(a + b);
    if (ia < 0 || ib < 0 || im < 0)
      return err("%s: tokenizer.ggml.merges[%zu] '%s' uses tokens missing from the vocabulary", src, r, s.c_str());
    m.merges.insert(ia, ib, uint32_t(r), im);
  }
  if (gemma_derived) derive_merges(m.merges, m.tokens, m.index);
  if (m.model == Impl::Model::kBpe && m.merges.size() == 0)
    return err("%s: tokenizer.ggml.merges is missing for model '%s'", src, v.model.c_str());

  m.bos = v.bos_id;
  m.eos = v.eos_id;
  m.unk = v.unk_id;
  m.pad = v.pad_id;
  m.wants_bos = v.add_bos;
  return Tokenizer(std::shared_ptr<const Impl>(std::move(impl)));
}

Result<GgufVocab> read_gguf_vocab(const GgufFile& f) {
  GgufVocab v;
  v.source = f.path();
  auto str = [&](const char* key, std::string& out) -> Status {
    if (!f.has(key)) return Status::ok();
    G4_ASSIGN_OR_RETURN(auto s, f.get_string(key));
    out.assign(s);
    return Status::ok();
  };
  auto id = [&](const char* key, int& out) -> Status {
    if (!f.has(key)) return Status::ok();
    G4_ASSIGN_OR_RETURN(int64_t x, f.get_int(key));
    out = int(x);
    return Status::ok();
  };
  auto flag = [&](const char* key, bool& out) -> Status {
    if (!f.has(key)) return Status::ok();
    G4_ASSIGN_OR_RETURN(bool b, f.get_bool(key));
    out = b;
    return Status::ok();
  };
  G4_TRY(str("tokenizer.ggml.model", v.model));
  G4_TRY(str("tokenizer.ggml.pre", v.pre));
  G4_TRY(str("general.architecture", v.architecture));
  {
    G4_ASSIGN_OR_RETURN(auto toks, f.get_string_array("tokenizer.ggml.tokens"));
    v.tokens.reserve(toks.size());
    for (auto t : toks) v.tokens.emplace_back(t);
  }
  if (f.has("tokenizer.ggml.scores")) {
    G4_ASSIGN_OR_RETURN(auto s, f.get_f32_array("tokenizer.ggml.scores"));
    v.scores = std::move(s);
  }
  if (f.has("tokenizer.ggml.token_type")) {
    G4_ASSIGN_OR_RETURN(auto t, f.get_int_array("tokenizer.ggml.token_type"));
    v.token_types.assign(t.begin(), t.end());
  }
  if (f.has("tokenizer.ggml.merges")) {
    G4_ASSIGN_OR_RETURN(auto ms, f.get_string_array("tokenizer.ggml.merges"));
    v.merges.reserve(ms.size());
    for (auto s : ms) v.merges.emplace_back(s);
  }
  G4_TRY(id("tokenizer.ggml.bos_token_id", v.bos_id));
  G4_TRY(id("tokenizer.ggml.eos_token_id", v.eos_id));
  G4_TRY(id("tokenizer.ggml.unknown_token_id", v.unk_id));
  G4_TRY(id("tokenizer.ggml.padding_token_id", v.pad_id));
  G4_TRY(flag("tokenizer.ggml.add_bos_token", v.add_bos));
  G4_TRY(flag("tokenizer.ggml.add_eos_token", v.add_eos));
  G4_TRY(flag("tokenizer.ggml.add_space_prefix", v.add_space_prefix));
  return v;
}

Result<Tokenizer> tokenizer_from_gguf_file(const std::string& path) {
  G4_ASSIGN_OR_RETURN(auto f, GgufFile::open(path));
  G4_ASSIGN_OR_RETURN(GgufVocab v, read_gguf_vocab(*f));
  return Tokenizer::from_gguf_vocab(v);
}

}  // namespace g4
