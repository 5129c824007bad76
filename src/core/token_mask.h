// Allowed-token bitmasks (constrained decoding, grammar/grammar.h): a row's mask is
// token_mask_words(vocab) uint32 words, bit t % 32 of word t / 32 set when token t may come next
// (XGrammar's bitmask layout). Logits of tokens whose bit is clear become -inf.
#pragma once
#include <cstdint>
#include <limits>

namespace g4 {

inline int token_mask_words(int vocab) { return (vocab + 31) / 32; }

// The masks of some logit rows of a forward (the constrained ones; every other row stays open):
// count masks of token_mask_words(vocab) words each, mask i for logit row rows[i]. Host memory.
struct TokenMasks {
  const uint32_t* words = nullptr;
  const int32_t* rows = nullptr;
  int count = 0;
};

// logits [vocab] = -inf where the mask's bit is clear.
inline void apply_token_mask(float* logits, int vocab, const uint32_t* words) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int w = 0; w * 32 < vocab; ++w) {
    const uint32_t word = words[w];
    if (word == 0xffffffffu) continue;
    for (int b = 0, i = w * 32; b < 32 && i < vocab; ++b, ++i)
      if (!((word >> b) & 1u)) logits[i] = ninf;
  }
}

}  // namespace g4
