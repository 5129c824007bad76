#include "text/detokenizer.h"

#include "text/utf8.h"

namespace g4 {

std::string Detokenizer::flush_bytes() {
  std::string out;
  if (bytes_.empty()) return out;
  if (utf8::is_valid(bytes_)) {
    out.swap(bytes_);
  } else {
    for (size_t k = 0; k < bytes_.size(); ++k) out += utf8::kReplacement;
  }
  bytes_.clear();
  return out;
}

std::string Detokenizer::push(int id) {
  if (id < 0 || id >= tok_->vocab_size()) return {};
  if (skip_special_ && tok_->is_special(id)) return {};
  int b = tok_->byte_value(id);
  if (b >= 0) {
    bytes_ += static_cast<char>(b);
    return {};
  }
  std::string out = flush_bytes();
  out += tok_->piece(id);
  return out;
}

std::string Detokenizer::finish() { return flush_bytes(); }

}  // namespace g4
