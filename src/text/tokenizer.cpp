// g4::Tokenizer public API: the encode pipeline (added tokens -> normalizer -> pre-tokenizer ->
// model) and decode (tokenizers' Replace / ByteFallback / Fuse decoder chain).
#include "text/tokenizer.h"

#include <cstdio>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace g4 {

namespace {

const std::string& empty_string() {
  static const std::string e;
  return e;
}

// Replaces every non-overlapping occurrence of `pat` (left to right) in `s`.
void replace_all(std::string& s, const std::string& pat, const std::string& with) {
  if (pat.empty()) return;
  size_t pos = s.find(pat);
  if (pos == std::string::npos) return;
  std::string out;
  out.reserve(s.size() + s.size() / 2);
  size_t from = 0;
  while (pos != std::string::npos) {
    out.append(s, from, pos - from);
    out += with;
    from = pos + pat.size();
    pos = s.find(pat, from);
  }
  out.append(s, from, std::string::npos);
  s.swap(out);
}

// tokenizers `Split` pre-tokenizer with a literal pattern, applied to one piece.
void split_piece(std::string_view s, const tok::SplitOp& op, std::vector<std::string_view>& out) {
  if (op.pattern.empty()) {
    out.push_back(s);
    return;
  }
  // (piece, is_match) runs covering s.
  struct Run { size_t b, e; bool match; };
  std::vector<Run> runs;
  size_t from = 0;
  for (size_t pos = s.find(op.pattern); pos != std::string_view::npos; pos = s.find(op.pattern, from)) {
    if (pos > from) runs.push_back({from, pos, false});
    runs.push_back({pos, pos + op.pattern.size(), true});
    from = pos + op.pattern.size();
  }
  if (from < s.size()) runs.push_back({from, s.size(), false});
  std::vector<Run> acc;
  using B = tok::SplitOp::Behavior;
  switch (op.behavior) {
    case B::kIsolated: acc = runs; break;
    case B::kRemoved:
      for (auto& r : runs) if (!r.match) acc.push_back(r);
      break;
    case B::kMergedWithPrevious: {
      bool prev_match = false;
      for (auto& r : runs) {
        if (r.match && !prev_match && !acc.empty()) acc.back().e = r.e;
        else acc.push_back(r);
        prev_match = r.match;
      }
      break;
    }
    case B::kMergedWithNext: {
      bool prev_match = false;
      for (auto& r : runs) {
        if (!r.match && prev_match && !acc.empty()) acc.back().e = r.e;
        else acc.push_back(r);
        prev_match = r.match;
      }
      break;
    }
    case B::kContiguous: {
      bool prev_match = false;
      for (auto& r : runs) {
        if (r.match && prev_match && !acc.empty()) acc.back().e = r.e;
        else acc.push_back(r);
        prev_match = r.match;
      }
      break;
    }
  }
  for (auto& r : acc)
    if (r.e > r.b) out.push_back(s.substr(r.b, r.e - r.b));
}

}  // namespace

void Tokenizer::Impl::finish_vocab() {
  index.build(tokens);
  if (pieces.size() != tokens.size()) pieces = tokens;
  flags.resize(tokens.size(), 0);
  byte_val.assign(tokens.size(), -1);
  if (decode_byte_fallback)
    for (size_t i = 0; i < tokens.size(); ++i) byte_val[i] = int16_t(parse_byte_token(pieces[i]));
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_ids[b] = index.find(name);
  }
}

Tokenizer::Tokenizer() : impl_(std::make_shared<Impl>()) {}
Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

std::vector<int> Tokenizer::encode(std::string_view text, bool parse_special, bool add_bos) const {
  return encode_impl(text, parse_special, add_bos, {});
}

std::string Tokenizer::mark_literal(std::string_view text) const {
  const tok::AddedMatcher& matcher = impl_->raw_added;
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kLiteralMark.size(), kLiteralMark) == 0) {
      i += kLiteralMark.size();
      continue;
    }
    size_t len = 0;
    const int id = matcher.may_start(static_cast<unsigned char>(text[i])) ? matcher.match_at(text, i, &len) : -1;
    if (id >= 0 && (impl_->flags[id] & tok::kFlagSpecial)) {
      out += kLiteralMark;
      out.append(text.substr(i, len));
      i += len;
      continue;
    }
    out += text[i++];
  }
  return out;
}

std::vector<int> Tokenizer::encode_marked(std::string_view text, bool add_bos) const {
  std::string plain;
  plain.reserve(text.size());
  std::vector<size_t> literal_at;  // offsets in `plain` where a mark stood
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kLiteralMark.size(), kLiteralMark) == 0) {
      literal_at.push_back(plain.size());
      i += kLiteralMark.size();
    } else {
      plain += text[i++];
    }
  }
  return encode_impl(plain, true, add_bos, literal_at);
}

std::vector<int> Tokenizer::encode_impl(std::string_view text, bool parse_special, bool add_bos,
                                        std::span<const size_t> literal_at) const {
  const Impl& m = *impl_;
  std::vector<int> out;
  out.reserve(text.size() / 3 + 4);
  if (add_bos && m.bos >= 0) out.push_back(m.bos);
  bool prev_is_token = true;  // SPM add_space_prefix: first fragment or after a token

  std::string norm;
  std::vector<std::string_view> words, next_words;
  // Model on one normalized piece (after the normalized added-token split).
  auto run_model = [&](std::string_view piece) {
    words.assign(1, piece);
    for (const auto& op : m.pre_tokenizer) {
      next_words.clear();
      for (auto w : words) split_piece(w, op, next_words);
      words.swap(next_words);
    }
    for (auto w : words) m.encode_word(w, out);
  };
  // Splits `s` on the tokens of `matcher`; plain pieces go to on_text. `literal` (raw text only):
  // sorted offsets where a special token is kept as text.
  auto split_added = [&](const tok::AddedMatcher& matcher, std::string_view s, std::span<const size_t> literal,
                         auto&& on_text) {
    size_t next_literal = 0;
    size_t i = 0, start = 0;
    while (i < s.size()) {
      if (!matcher.may_start(static_cast<unsigned char>(s[i]))) {
        ++i;
        continue;
      }
      size_t len = 0;
      int id = matcher.match_at(s, i, &len);
      if (id < 0) {
        ++i;
        continue;
      }
      while (next_literal < literal.size() && literal[next_literal] < i) ++next_literal;
      const bool literal_here = next_literal < literal.size() && literal[next_literal] == i;
      if ((!parse_special || literal_here) && (m.flags[id] & tok::kFlagSpecial)) {  // kept as text
        i += len;
        continue;
      }
      if (i > start) on_text(s.substr(start, i - start));
      out.push_back(id);
      prev_is_token = true;
      i += len;
      start = i;
    }
    if (start < s.size()) on_text(s.substr(start));
  };
  auto on_raw = [&](std::string_view piece) {
    norm.clear();
    if (m.spm_space_prefix && prev_is_token) norm += ' ';
    norm.append(piece);
    for (const auto& op : m.normalizer) {
      if (op.kind == tok::NormOp::kReplace)
        replace_all(norm, op.pattern, op.content);
      else if (!norm.empty())
        norm.insert(0, op.content);
    }
    prev_is_token = false;
    if (m.norm_added.empty()) {
      run_model(norm);
    } else {
      std::string local = norm;  // run_model's views must outlive nested calls
      split_added(m.norm_added, local, {}, run_model);
    }
  };
  split_added(m.raw_added, text, literal_at, on_raw);
  return out;
}

std::string Tokenizer::decode(std::span<const int> ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string out, bytes;
  auto flush = [&] {
    if (bytes.empty()) return;
    if (utf8::is_valid(bytes)) {
      out += bytes;
    } else {
      for (size_t k = 0; k < bytes.size(); ++k) out += utf8::kReplacement;
    }
    bytes.clear();
  };
  for (int id : ids) {
    if (id < 0 || id >= int(m.tokens.size())) continue;
    if (skip_special && (m.flags[id] & tok::kFlagSpecial)) continue;
    if (m.byte_val[id] >= 0) {
      bytes += static_cast<char>(m.byte_val[id]);
      continue;
    }
    flush();
    out += m.pieces[id];
  }
  flush();
  return out;
}

int Tokenizer::vocab_size() const { return int(impl_->tokens.size()); }
const std::string& Tokenizer::token_text(int id) const {
  return id >= 0 && id < vocab_size() ? impl_->tokens[id] : empty_string();
}
int Tokenizer::id_of(std::string_view token) const { return impl_->index.find(token); }
int Tokenizer::bos_id() const { return impl_->bos; }
int Tokenizer::eos_id() const { return impl_->eos; }
int Tokenizer::unk_id() const { return impl_->unk; }
int Tokenizer::pad_id() const { return impl_->pad; }
bool Tokenizer::wants_bos() const { return impl_->wants_bos; }
bool Tokenizer::is_special(int id) const {
  return id >= 0 && id < vocab_size() && (impl_->flags[id] & tok::kFlagSpecial);
}
bool Tokenizer::is_added(int id) const {
  return id >= 0 && id < vocab_size() && (impl_->flags[id] & tok::kFlagAdded);
}
int Tokenizer::byte_value(int id) const {
  return id >= 0 && id < vocab_size() ? impl_->byte_val[id] : -1;
}
const std::string& Tokenizer::piece(int id) const {
  return id >= 0 && id < vocab_size() ? impl_->pieces[id] : empty_string();
}
const char* Tokenizer::model_kind() const { return impl_->model == Impl::Model::kSpm ? "spm" : "bpe"; }

}  // namespace g4
