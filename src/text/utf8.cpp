#include "text/utf8.h"

namespace g4::utf8 {

// Table 3-7 of the Unicode standard (well-formed byte sequences).
size_t valid_seq_len(std::string_view s, size_t i) {
  const size_t n = s.size();
  if (i >= n) return 0;
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  if (c < 0x80) return 1;
  auto cont = [&](size_t k, uint8_t lo = 0x80, uint8_t hi = 0xBF) {
    return k < n && b(k) >= lo && b(k) <= hi;
  };
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

bool is_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = valid_seq_len(s, i);
    if (!n) return false;
    i += n;
  }
  return true;
}

size_t complete_prefix_len(std::string_view s) {
  // Only the last 3 bytes can belong to an unfinished sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const uint8_t c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) return n;          // ASCII: nothing pending after it
    if (c < 0xC0) continue;          // continuation byte: look further back
    size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (c < 0xC2 || c > 0xF4) return n;  // can never start a sequence
    if (back >= want) return n;           // the sequence is long enough: complete or invalid
    // Check that the bytes seen so far are a valid beginning.
    uint8_t lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    for (size_t k = i + 1; k < n; ++k) {
      uint8_t d = static_cast<uint8_t>(s[k]);
      bool ok = k == i + 1 ? (d >= lo && d <= hi) : (d >= 0x80 && d <= 0xBF);
      if (!ok) return n;
    }
    return i;  // valid but unfinished: hold it back
  }
  return n;
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace g4::utf8
