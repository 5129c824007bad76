// Constrained decoding: a grammar (JSON Schema, "any JSON", or an EBNF / GBNF text) compiled against
// the model's vocabulary, and a per-sequence matcher that masks each step's logits to the tokens
// the grammar allows next. The grammar engine is XGrammar's C++ core (the pinned PyPI sdist, built
// by our CMake), the engine vLLM, SGLang and TensorRT-LLM use; a build without it (G4_XGRAMMAR_DIR
// unset) answers every compile with an error.
//
// Vocabulary contract: tokens are matched by their decoded bytes (the tokenizer's pieces, "▁" as a
// space, byte-fallback tokens as their byte); special (control) tokens never match grammar text,
// except those a compiler is made to see as their text (markup a grammar spells, such as Gemma 4's
// tool-call markers: then either the one token or the same text in pieces matches).
// After the grammar's root is complete only the sequence's stop tokens are allowed, so a finished
// answer ends at the turn end.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace g4 {

class Tokenizer;

// A grammar compiled for one vocabulary; immutable, shared by the sequences that use it.
class CompiledGrammar {
 public:
  struct Impl;
  explicit CompiledGrammar(std::unique_ptr<Impl> impl);
  ~CompiledGrammar();
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Compiles grammars for one model. Thread-safe; compiled grammars are cached by their source
// text (a repeated schema costs a lookup).
class GrammarCompiler {
 public:
  // vocab_size: the model's logit width (may exceed the tokenizer's: the extra ids never match).
  // text_specials: the special tokens (by their text) that match grammar text as that text.
  static Result<std::shared_ptr<GrammarCompiler>> create(const Tokenizer& tok, int vocab_size,
                                                         const std::vector<std::string>& text_specials = {});
  ~GrammarCompiler();
  // Any JSON value (OpenAI response_format json_object).
  Result<std::shared_ptr<const CompiledGrammar>> json_object();
  // A JSON Schema (response_format json_schema). strict: no properties beyond the schema's
  // (OpenAI's strict mode); otherwise additionalProperties follows the schema's default.
  Result<std::shared_ptr<const CompiledGrammar>> json_schema(const std::string& schema, bool strict);
  // An EBNF grammar in XGrammar's dialect (GBNF-compatible: `root ::= ...`).
  Result<std::shared_ptr<const CompiledGrammar>> ebnf(const std::string& text);
  // An XGrammar structural tag (JSON: {"type": "structural_tag", "format": ...}): tags, triggered
  // tags, JSON Schema content in a model's own argument style (tool_call_grammar.h builds them).
  Result<std::shared_ptr<const CompiledGrammar>> structural_tag(const std::string& json);

  struct Impl;

 private:
  explicit GrammarCompiler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One sequence's position in a grammar. Not thread-safe (the engine thread owns it).
class GrammarMatcher {
 public:
  // stop_ids: the tokens that end the sequence, the only ones allowed once the grammar is complete.
  GrammarMatcher(std::shared_ptr<const CompiledGrammar> g, const std::vector<int32_t>& stop_ids);
  ~GrammarMatcher();
  // logits [vocab_size]: every token the grammar does not allow next becomes -inf. Returns false,
  // leaving logits as they are, once the matcher has accepted a stop token (nothing may follow:
  // the caller ends the sequence) or when the grammar engine fails.
  bool mask(float* logits, int vocab_size);
  // The same as a bitmask (core/token_mask.h: token_mask_words(vocab_size) words, bit set = allowed)
  // for a backend to apply where the logits are (Backend::mask_logits). Same return value.
  bool allowed(uint32_t* words, int vocab_size);
  // Whether a stop token has been accepted (the constrained sequence is over).
  bool terminated() const;
  // Advances past `token`; false (and no change) when the grammar does not allow it.
  bool accept(int32_t token);
  // Whether the grammar's root is complete (only stop tokens may follow).
  bool complete() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Whether this build has the grammar engine.
bool grammar_engine_available();

}  // namespace g4
