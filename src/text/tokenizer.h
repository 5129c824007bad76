// g4::Tokenizer: text <-> token ids for Gemma checkpoints.
//
// Two sources:
//  * a Hugging Face `tokenizer.json` (tokenizers library format): model BPE (merge ranks,
//    byte_fallback, fuse_unk, ignore_merges), added tokens (special or not, normalized or not),
//    normalizer Replace/Prepend/Sequence, pre-tokenizer Split(String)/Sequence, decoder
//    Replace/ByteFallback/Fuse/Sequence. Unsupported components are load errors naming the field.
//    Mirrors tokenizers' `TokenizerImpl::encode_single_sequence` / `BPE::merge_word` /
//    `Word::merge_all` / `AddedVocabulary::extract_and_normalize` and `Tokenizer::decode`.
//  * a GGUF vocabulary (`GgufVocab`, filled from `tokenizer.ggml.*` metadata):
//      model "llama"  -> SentencePiece merge-by-score (llama.cpp `llm_tokenizer_spm_session`);
//      model "gemma4" -> BPE with the file's merges (same engine as tokenizer.json);
//      model "gpt2"   -> rejected (byte-level BPE needs a regex pre-tokenizer, not implemented).
//    Token types follow llama.cpp: CONTROL tokens become special added tokens, USER_DEFINED ones
//    non-special added tokens (as transformers' GGUF conversion does).
//
// Encoding never fails: ill-formed UTF-8 bytes in the input are encoded through byte fallback
// (or unk). Decoding skips ids outside the vocabulary, like tokenizers does.
// A Tokenizer is immutable after loading, cheap to copy, and safe to use from many threads.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace g4 {

// The tokenizer part of a GGUF file's metadata (llama.cpp key names in comments).
struct GgufVocab {
  std::string model;         // tokenizer.ggml.model: "llama", "gemma4", "gpt2", ...
  std::string pre;           // tokenizer.ggml.pre (informational)
  std::string architecture;  // general.architecture, e.g. "gemma3"
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens
  std::vector<float> scores;         // tokenizer.ggml.scores (may be empty: then all 0)
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type (may be empty: all NORMAL)
  std::vector<std::string> merges;   // tokenizer.ggml.merges, "left right" each (may be empty)
  int bos_id = -1;                   // tokenizer.ggml.bos_token_id
  int eos_id = -1;                   // tokenizer.ggml.eos_token_id
  int unk_id = -1;                   // tokenizer.ggml.unknown_token_id
  int pad_id = -1;                   // tokenizer.ggml.padding_token_id
  bool add_bos = false;              // tokenizer.ggml.add_bos_token
  bool add_eos = false;              // tokenizer.ggml.add_eos_token
  bool add_space_prefix = false;     // tokenizer.ggml.add_space_prefix
  std::string source = "gguf";       // file name, used in error messages

  // llama.cpp `llama_token_type`.
  enum TokenType : int32_t {
    kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6,
  };
};

class Tokenizer {
 public:
  Tokenizer();  // empty vocabulary; use a factory

  // `path` is a tokenizer.json file or a directory containing one. A tokenizer_config.json next
  // to it, if present, supplies bos/eos/pad token names and add_bos_token.
  static Result<Tokenizer> from_file(const std::string& path);
  // Parses tokenizer.json text; `name` is used in error messages.
  static Result<Tokenizer> from_json(std::string_view json_text, const std::string& name = "tokenizer.json");
  static Result<Tokenizer> from_gguf_vocab(const GgufVocab& v);

  // Text -> ids. parse_special: occurrences of special tokens' text ("<bos>", "<start_of_turn>")
  // become their ids; otherwise they are encoded as ordinary text. Non-special added tokens are
  // always matched (tokenizers' `encode_special_tokens` semantics). add_bos prepends bos_id()
  // (when the vocabulary has one); nothing is ever added implicitly.
  std::vector<int> encode(std::string_view text, bool parse_special = false, bool add_bos = false) const;
  // Text whose special tokens must stay text, such as a chat message's content rendered into a
  // template: mark_literal() puts kLiteralMark before each special token's text in `text` (and
  // drops marks already there), and encode_marked() encodes a string holding such marked text
  // with parse_special, except that a special token right after a mark is encoded as ordinary
  // text; the marks themselves are removed. The mark is U+FDD0, a Unicode noncharacter (reserved
  // for internal use), so no real text loses anything but that code point.
  static constexpr std::string_view kLiteralMark = "\xEF\xB7\x90";
  std::string mark_literal(std::string_view text) const;
  std::vector<int> encode_marked(std::string_view text, bool add_bos = false) const;
  // Ids -> text. skip_special drops special tokens. Runs of byte-fallback tokens are joined and,
  // if not well-formed UTF-8, become one U+FFFD per byte (tokenizers' ByteFallback decoder).
  std::string decode(std::span<const int> ids, bool skip_special = false) const;

  int vocab_size() const;
  // The vocabulary string of `id` ("▁Hello", "<0x0A>", "<bos>"); empty for ids out of range.
  const std::string& token_text(int id) const;
  // Id of the exact vocabulary string, or -1.
  int id_of(std::string_view token) const;
  int bos_id() const;  // -1 when absent
  int eos_id() const;
  int unk_id() const;
  int pad_id() const;
  // Whether the source asks for BOS on raw text (GGUF add_bos_token, tokenizer.json post-processor,
  // tokenizer_config add_bos_token). Informational: encode() only adds it when asked.
  bool wants_bos() const;
  bool is_special(int id) const;  // special added token (CONTROL in GGUF)
  bool is_added(int id) const;    // any added token (special or not)

  // Decoder building blocks (used by Detokenizer): for byte-fallback tokens byte_value() is the
  // byte (0..255), else -1 and piece() is the token's decoded text (e.g. "▁Hello" -> " Hello").
  int byte_value(int id) const;
  const std::string& piece(int id) const;

  // "bpe" or "spm" (for diagnostics).
  const char* model_kind() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::vector<int> encode_impl(std::string_view text, bool parse_special, bool add_bos,
                               std::span<const size_t> literal_at) const;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace g4
