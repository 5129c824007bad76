// Filling a GgufVocab from an opened GGUF file's `tokenizer.ggml.*` metadata.
#pragma once
#include "core/status.h"
#include "io/gguf.h"
#include "text/tokenizer.h"

namespace g4 {

// Reads tokens (required), scores, token types, merges, special ids and flags. Errors name the
// file and the key.
Result<GgufVocab> read_gguf_vocab(const GgufFile& f);

// Opens `path` and builds the tokenizer from its vocabulary.
Result<Tokenizer> tokenizer_from_gguf_file(const std::string& path);

}  // namespace g4
