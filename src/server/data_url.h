// RFC 2397 data URLs with base64 payloads ("data:image/png;base64,iVBOR..."), the way API clients
// send images inline. Written by hand: a few lines of RFC 4648 decoding, which neither cpp-httplib
// nor the standard library expose.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace g4::server {

// The decoded bytes of standard base64 (padding optional, whitespace ignored); nullopt for any
// other character or a truncated quantum.
std::optional<std::string> base64_decode(std::string_view in);

// The payload of "data:<mime>;base64,<data>"; nullopt (with *why set) for anything else.
std::optional<std::string> decode_data_url(std::string_view url, std::string* why);

}  // namespace g4::server
