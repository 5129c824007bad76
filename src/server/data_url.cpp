#include "server/data_url.h"

namespace g4::server {

std::optional<std::string> base64_decode(std::string_view in) {
  std::string out;
  out.reserve(in.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0, pad = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else if (c == '=') { ++pad; continue; }
    else if (c == '\n' || c == '\r' || c == ' ' || c == '\t') continue;
    else return std::nullopt;
    if (pad) return std::nullopt;  // data after padding
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(char((acc >> bits) & 0xFF));
    }
  }
  if (bits >= 6 || pad > 2) return std::nullopt;  // a lone 6-bit group is not a byte
  return out;
}

std::optional<std::string> decode_data_url(std::string_view url, std::string* why) {
  if (url.substr(0, 5) != "data:") {
    *why = url.substr(0, 7) == "http://" || url.substr(0, 8) == "https://"
               ? "remote image URLs are not fetched by this server; send the image inline as a data: URL"
               : "expected a data: URL (data:image/...;base64,...)";
    return std::nullopt;
  }
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) {
    *why = "malformed data: URL (no comma)";
    return std::nullopt;
  }
  const std::string_view meta = url.substr(5, comma - 5);
  if (meta.size() < 7 || meta.substr(meta.size() - 7) != ";base64") {
    *why = "only base64 data: URLs are supported";
    return std::nullopt;
  }
  auto bytes = base64_decode(url.substr(comma + 1));
  if (!bytes) *why = "the data: URL's base64 payload is invalid";
  return bytes;
}

}  // namespace g4::server
