// Incremental detokenization for streaming output.
//
// Feed ids one at a time; each call returns the text that is now final. Contract:
//   * every returned piece is well-formed UTF-8;
//   * the concatenation of all pieces (including finish()) equals tokenizer.decode(all ids,
//     skip_special).
// Byte-fallback tokens ("<0xE2>") are held back until their run ends (the next non-byte token or
// finish()), because the decoder renders a whole run either as its UTF-8 text or, if any part is
// ill-formed, as one U+FFFD per byte; text of other tokens is emitted immediately.
// Compared with mlx-lm's SPMStreamingDetokenizer(trim_space=False): same text for well-formed
// output, but mlx-lm emits a completed character before its byte run ends, and renders ill-formed
// bytes with Python's "replace" (one U+FFFD per maximal ill-formed subsequence, not per byte).
#pragma once
#include <string>

#include "text/tokenizer.h"

namespace g4 {

class Detokenizer {
 public:
  // `tok` must outlive the Detokenizer.
  explicit Detokenizer(const Tokenizer& tok, bool skip_special = false) : tok_(&tok), skip_special_(skip_special) {}

  // Adds one id; returns the newly final text (possibly empty).
  std::string push(int id);
  // Ends the stream: returns the held-back text (a pending byte run), and resets.
  std::string finish();
  // Forget pending state (e.g. a new sequence).
  void reset() { bytes_.clear(); }
  // Number of bytes currently held back.
  size_t pending_bytes() const { return bytes_.size(); }

 private:
  std::string flush_bytes();
  const Tokenizer* tok_;
  bool skip_special_;
  std::string bytes_;
};

}  // namespace g4
