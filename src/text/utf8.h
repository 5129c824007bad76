// UTF-8 helpers for the tokenizer and the streaming detokenizer.
// Validity follows RFC 3629 (what Rust's `String::from_utf8` and Python's `bytes.decode` accept):
// no overlong forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace g4::utf8 {

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 if the bytes there do not start
// one (invalid lead byte, bad continuation, overlong, surrogate, > U+10FFFF, or truncated).
size_t valid_seq_len(std::string_view s, size_t i);

// Length of the "character" starting at s[i] for splitting text into symbols: the sequence length
// when well-formed, else 1 (a stray byte is its own symbol). Requires i < s.size().
inline size_t char_len(std::string_view s, size_t i) {
  size_t n = valid_seq_len(s, i);
  return n ? n : 1;
}

// Whether all of `s` is well-formed UTF-8.
bool is_valid(std::string_view s);

// Length of the longest prefix of `s` that does not end inside a sequence that could still be
// completed by more bytes (i.e. drops a trailing *incomplete but so-far-valid* sequence).
// Bytes that can never become valid are kept (the caller decides how to render them).
size_t complete_prefix_len(std::string_view s);

// Appends the UTF-8 encoding of code point `cp` (must be <= 0x10FFFF, not a surrogate).
void append(std::string& out, uint32_t cp);

// The replacement character U+FFFD, as UTF-8.
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace g4::utf8
