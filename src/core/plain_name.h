// Names that clients choose for things the server keeps (saved KV entries, mounted adapters):
// 1 to max_len characters of A-Z a-z 0-9 '.' '_' '-', so a name is safe as a file name, in a
// URL path and in a model id (`<model>:<name>`).
#pragma once
#include <cstddef>
#include <string>

namespace g4 {

inline bool is_plain_name(const std::string& s, size_t max_len) {
  if (s.empty() || s.size() > max_len) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      return false;
  return true;
}

}  // namespace g4
