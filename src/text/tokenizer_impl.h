// Internal state of g4::Tokenizer, shared by the loaders (tokenizer_json.cpp, tokenizer_gguf.cpp)
// and the encoder/decoder (tokenizer.cpp, tokenizer_model.cpp). Not part of the public API.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer.h"

namespace g4::tok {

uint64_t hash_bytes(std::string_view s);
inline uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27; x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// string -> id over a vector of strings that owns the text (open addressing, linear probing).
class StrIndex {
 public:
  void build(const std::vector<std::string>& strings);  // later duplicates win (like a map insert)
  // Id whose string equals `s`, or -1.
  int find(std::string_view s) const {
    if (slots_.empty()) return -1;
    const uint64_t h = hash_bytes(s);
    const uint32_t tag = uint32_t(h >> 32);
    size_t m = slots_.size() - 1, i = h & m;
    for (;; i = (i + 1) & m) {
      const Slot& e = slots_[i];
      if (e.id < 0) return -1;
      if (e.tag == tag && (*strings_)[e.id] == s) return e.id;  // the tag avoids most string loads
    }
  }

 private:
  struct Slot { int32_t id; uint32_t tag; };
  const std::vector<std::string>* strings_ = nullptr;
  std::vector<Slot> slots_;
};

// (left id, right id) -> (rank, merged id): BPE merge ranks (tokenizers `MergeMap`).
class MergeTable {
 public:
  struct Entry { uint64_t key; uint32_t rank; int32_t id; };
  void reserve(size_t n);
  // Later inserts of the same pair overwrite earlier ones (HashMap collect semantics).
  void insert(int left, int right, uint32_t rank, int merged);
  const Entry* find(int left, int right) const {
    if (slots_.empty()) return nullptr;
    uint64_t key = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
    size_t m = slots_.size() - 1, h = mix64(key) & m;
    for (;; h = (h + 1) & m) {
      const Entry& e = slots_[h];
      if (e.id < 0) return nullptr;
      if (e.key == key) return &e;
    }
  }
  size_t size() const { return size_; }

 private:
  void grow();
  std::vector<Entry> slots_;
  size_t size_ = 0;
};

// Leftmost-longest matcher over added-token strings (tokenizers builds an Aho-Corasick automaton
// with MatchKind::LeftmostLongest; scanning start positions left to right and taking the longest
// match at the first position that has one gives the same, non-overlapping matches).
class AddedMatcher {
 public:
  void add(std::string_view s, int id);
  bool empty() const { return term_.size() <= 1; }
  // Longest token starting at text[i]: sets len and returns its id, or -1.
  int match_at(std::string_view text, size_t i, size_t* len) const;
  bool may_start(uint8_t b) const { return first_[b]; }

 private:
  int child(int node, uint8_t b) const {
    auto it = edges_.find((uint64_t(node) << 8) | b);
    return it == edges_.end() ? -1 : it->second;
  }
  std::unordered_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> term_{-1};  // node -> token id or -1; node 0 is the root
  std::array<bool, 256> first_{};
};

// Normalizer steps applied to each piece of text between added tokens, in order.
struct NormOp {
  enum Kind { kReplace, kPrepend } kind;
  std::string pattern;  // kReplace: literal pattern
  std::string content;  // kReplace: replacement; kPrepend: prefix
};

// Pre-tokenizer Split with a literal pattern (tokenizers `SplitDelimiterBehavior`).
struct SplitOp {
  enum Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous } behavior;
  std::string pattern;
};

enum TokenFlags : uint8_t { kFlagSpecial = 1, kFlagAdded = 2 };

}  // namespace g4::tok

namespace g4 {

struct Tokenizer::Impl {
  enum class Model { kBpe, kSpm };

  // Vocabulary.
  std::vector<std::string> tokens;
  tok::StrIndex index;          // over `tokens`
  std::vector<std::string> pieces;  // decoded text of each token (decoder Replace steps applied)
  std::vector<int16_t> byte_val;    // byte-fallback value or -1
  std::vector<uint8_t> flags;       // tok::TokenFlags
  int bos = -1, eos = -1, unk = -1, pad = -1;
  bool wants_bos = false;

  // Added tokens: matched on the raw text (normalized=false) and on normalized text (true).
  tok::AddedMatcher raw_added, norm_added;

  std::vector<tok::NormOp> normalizer;
  std::vector<tok::SplitOp> pre_tokenizer;

  Model model = Model::kBpe;
  // BPE.
  tok::MergeTable merges;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::array<int32_t, 256> byte_ids{};  // id of "<0xNN>" or -1
  // SPM (GGUF "llama").
  std::vector<float> scores;
  bool spm_space_prefix = false;
  // Decoder has a ByteFallback step (else byte tokens decode as their literal text).
  bool decode_byte_fallback = true;

  // Fills index, byte_ids, byte_val from tokens/pieces. Call after tokens and pieces are set.
  void finish_vocab();
  // Encodes one pre-tokenized word with the model, appending ids.
  void encode_word(std::string_view word, std::vector<int>& out) const;
  void bpe_word(std::string_view word, std::vector<int>& out) const;
  void spm_word(std::string_view word, std::vector<int>& out) const;
};

// HF ByteFallback's test: a 6-char token "<0xHH>" whose hex parses as u8 (Rust from_str_radix).
int parse_byte_token(std::string_view s);

}  // namespace g4
