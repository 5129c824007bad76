// Constrained decoding through XGrammar (grammar.h). Without G4_HAVE_XGRAMMAR every compile
// answers that this build has no grammar engine.
#include "grammar/grammar.h"

#include "core/token_mask.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "text/tokenizer.h"
#include <nlohmann/json.hpp>

#ifdef G4_HAVE_XGRAMMAR
#include <xgrammar/xgrammar.h>
#endif

namespace g4 {

#ifdef G4_HAVE_XGRAMMAR

struct CompiledGrammar::Impl {
  xgrammar::CompiledGrammar g;
  int vocab_size = 0;
};

struct GrammarCompiler::Impl {
  xgrammar::GrammarCompiler compiler;
  int vocab_size = 0;
  std::mutex mu;  // the caches below (the compiler itself is thread-safe)
  std::unordered_map<std::string, std::shared_ptr<const CompiledGrammar>> cache;
  static constexpr size_t kMaxCached = 256;  // distinct grammars kept; the oldest go first
  std::vector<std::string> order;
};

struct GrammarMatcher::Impl {
  std::shared_ptr<const CompiledGrammar> g;
  xgrammar::GrammarMatcher m;
  std::vector<int32_t> bits;  // the next-token bitmask, 32 tokens per word
  int64_t shape = 0;
};

namespace {

// The vocabulary as XGrammar matches it: each id's decoded bytes, "" for special tokens (never
// matched as text) other than text_specials, and for ids past the tokenizer (the model's padding rows).
std::vector<std::string> decoded_vocab(const Tokenizer& tok, const std::vector<std::string>& text_specials) {
  std::vector<std::string> v(size_t(tok.vocab_size()));
  for (int id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_special(id)) {
      const std::string& t = tok.token_text(id);
      if (std::find(text_specials.begin(), text_specials.end(), t) != text_specials.end()) v[size_t(id)] = t;
      continue;
    }
    const int b = tok.byte_value(id);
    v[size_t(id)] = b >= 0 ? std::string(1, char(b)) : tok.piece(id);
  }
  return v;
}

// XGrammar 0.2.9 spells a string with minLength / maxLength (and no pattern or format) as up to N
// characters other than '"', '\\', CR and LF, so raw control characters, which JSON forbids in a
// string, pass. The same bounds as a pattern go through its JSON-string regex path, which leaves
// out every character a JSON string must escape: each such string schema gets the pattern
// ^.{min,max}$ (XGrammar then ignores the lengths; the pattern states them). Data keywords (enum,
// const, default, examples) are not walked.
void bound_strings_by_pattern(nlohmann::ordered_json& j) {
  if (j.is_array()) {
    for (auto& e : j) bound_strings_by_pattern(e);
    return;
  }
  if (!j.is_object()) return;
  auto t = j.find("type");
  const bool bounded = j.contains("minLength") || j.contains("maxLength");
  if (t != j.end() && *t == "string" && bounded && !j.contains("pattern") && !j.contains("format")) {
    auto len = [&](const char* k) -> std::string {
      auto it = j.find(k);
      return it != j.end() && it->is_number_integer() && it->get<int64_t>() >= 0 ? std::to_string(it->get<int64_t>()) : "";
    };
    const std::string lo = len("minLength"), hi = len("maxLength");
    j["pattern"] = "^.{" + (lo.empty() ? std::string("0") : lo) + "," + hi + "}$";
  }
  for (auto& [k, v] : j.items())
    if (k != "enum" && k != "const" && k != "default" && k != "examples") bound_strings_by_pattern(v);
}

// Compiles through `fn` (which may throw XGrammar's errors) under `key`, caching the result.
template <class Fn>
Result<std::shared_ptr<const CompiledGrammar>> cached(GrammarCompiler::Impl& c, const std::string& key, Fn&& fn) {
  {
    std::lock_guard<std::mutex> lk(c.mu);
    auto it = c.cache.find(key);
    if (it != c.cache.end()) return it->second;
  }
  std::shared_ptr<const CompiledGrammar> g;
  try {
    auto impl = std::make_unique<CompiledGrammar::Impl>(CompiledGrammar::Impl{fn(), c.vocab_size});
    g = std::make_shared<const CompiledGrammar>(std::move(impl));
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (msg.size() > 2000) msg.resize(2000);  // a hostile grammar may echo itself at length
    return err("%s", msg.c_str());
  }
  std::lock_guard<std::mutex> lk(c.mu);
  if (c.cache.size() >= GrammarCompiler::Impl::kMaxCached) {
    c.cache.erase(c.order.front());
    c.order.erase(c.order.begin());
  }
  if (c.cache.emplace(key, g).second) c.order.push_back(key);
  return g;
}

}  // namespace

CompiledGrammar::CompiledGrammar(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CompiledGrammar::~CompiledGrammar() = default;

GrammarCompiler::GrammarCompiler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrammarCompiler::~GrammarCompiler() = default;

Result<std::shared_ptr<GrammarCompiler>> GrammarCompiler::create(const Tokenizer& tok, int vocab_size,
                                                                 const std::vector<std::string>& text_specials) {
  if (vocab_size < tok.vocab_size())
    return err("grammar: the model's vocabulary (%d) is smaller than its tokenizer's (%d)", vocab_size,
               tok.vocab_size());
  try {
    // No stop tokens in the vocabulary info: each matcher is told its sequence's own.
    xgrammar::TokenizerInfo info(decoded_vocab(tok, text_specials), xgrammar::VocabType::RAW, vocab_size,
                                 std::vector<int32_t>{});
    // XGrammar's own cache off: ours (cached()) keeps each compiled grammar once, shared by identity.
    auto impl = std::unique_ptr<Impl>(
        new Impl{xgrammar::GrammarCompiler(info, /*max_threads=*/2, /*cache_enabled=*/false), vocab_size, {}, {}, {}});
    return std::shared_ptr<GrammarCompiler>(new GrammarCompiler(std::move(impl)));
  } catch (const std::exception& e) {
    return err("grammar: the vocabulary was refused: %s", e.what());
  }
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::json_object() {
  return cached(*impl_, "json_object", [&] { return impl_->compiler.CompileBuiltinJSONGrammar(); });
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::json_schema(const std::string& schema, bool strict) {
  return cached(*impl_, std::string(strict ? "schema1:" : "schema0:") + schema, [&] {
    // Unparsable text goes to XGrammar as it is, for its own error message.
    auto j = nlohmann::ordered_json::parse(schema, nullptr, /*allow_exceptions=*/false);
    std::string text = schema;
    if (!j.is_discarded()) {
      bound_strings_by_pattern(j);
      text = j.dump();
    }
    // Compact JSON (no whitespace between tokens): a model cannot spend its tokens on layout.
    return impl_->compiler.CompileJSONSchema(text, /*any_whitespace=*/false, std::nullopt, std::nullopt, strict);
  });
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::ebnf(const std::string& text) {
  return cached(*impl_, "ebnf:" + text, [&] { return impl_->compiler.CompileGrammar(text, "root"); });
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::structural_tag(const std::string& json) {
  return cached(*impl_, "stag:" + json, [&] { return impl_->compiler.CompileStructuralTag(json); });
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> g, const std::vector<int32_t>& stop_ids)
    : impl_(new Impl{g, xgrammar::GrammarMatcher(g->impl().g, stop_ids), {}, 0}) {
  impl_->shape = xgrammar::GetBitmaskSize(g->impl().vocab_size);
  impl_->bits.assign(size_t(impl_->shape), 0);
}
GrammarMatcher::~GrammarMatcher() = default;

bool GrammarMatcher::allowed(uint32_t* words, int vocab_size) {
  if (impl_->m.IsTerminated()) return false;  // XGrammar throws if asked for a mask past its end
  DLTensor t{};
  t.data = impl_->bits.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = &impl_->shape;
  bool all = false;
  try {
    all = !impl_->m.FillNextTokenBitmask(&t);  // false: every token allowed
  } catch (const std::exception&) {
    return false;
  }
  // Tokens past the grammar's vocabulary (the model's padding rows) are never allowed.
  const int n = std::min(vocab_size, impl_->g->impl().vocab_size);
  for (int w = 0; w < token_mask_words(vocab_size); ++w) {
    const int lo = w * 32;
    uint32_t word = 0;
    if (lo < n) {
      word = all ? 0xffffffffu : uint32_t(impl_->bits[size_t(w)]);
      if (lo + 32 > n) word &= (uint32_t(1) << (n - lo)) - 1u;
    }
    words[w] = word;
  }
  return true;
}

bool GrammarMatcher::mask(float* logits, int vocab_size) {
  std::vector<uint32_t> words(size_t(token_mask_words(vocab_size)));
  if (!allowed(words.data(), vocab_size)) return false;
  apply_token_mask(logits, vocab_size, words.data());
  return true;
}

bool GrammarMatcher::terminated() const { return impl_->m.IsTerminated(); }

bool GrammarMatcher::accept(int32_t token) {
  try {
    return impl_->m.AcceptToken(token);
  } catch (const std::exception&) {
    return false;
  }
}

bool GrammarMatcher::complete() const { return impl_->m.IsCompleted(); }

bool grammar_engine_available() { return true; }

#else  // no XGrammar in this build

struct CompiledGrammar::Impl {};
struct GrammarCompiler::Impl {};
struct GrammarMatcher::Impl {};

CompiledGrammar::CompiledGrammar(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CompiledGrammar::~CompiledGrammar() = default;
GrammarCompiler::GrammarCompiler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrammarCompiler::~GrammarCompiler() = default;
Result<std::shared_ptr<GrammarCompiler>> GrammarCompiler::create(const Tokenizer&, int, const std::vector<std::string>&) {
  return err("this build has no grammar engine (XGrammar): rebuild with `make build`");
}
Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::json_object() { return err("no grammar engine"); }
Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::json_schema(const std::string&, bool) {
  return err("no grammar engine");
}
Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::ebnf(const std::string&) {
  return err("no grammar engine");
}
Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::structural_tag(const std::string&) {
  return err("no grammar engine");
}
GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar>, const std::vector<int32_t>&) {}
GrammarMatcher::~GrammarMatcher() = default;
bool GrammarMatcher::mask(float*, int) { return false; }
bool GrammarMatcher::allowed(uint32_t*, int) { return false; }
bool GrammarMatcher::terminated() const { return false; }
bool GrammarMatcher::accept(int32_t) { return false; }
bool GrammarMatcher::complete() const { return false; }
bool grammar_engine_available() { return false; }

#endif

}  // namespace g4
