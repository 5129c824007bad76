// JSON from outside (request bodies, tool-call arguments, config and data files) parsed with
// bounds checked while parsing, before any recursive work: nesting depth (nlohmann's copies,
// comparisons and conversions recurse once per level, so a 40k-deep document would overflow the
// stack) and keys per object (ordered_json's objects insert in linear time, so one object of
// 262k keys costs a minute of a core).
#pragma once
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace g4 {

struct JsonLimits {
  int max_depth = 128;              // nested objects/arrays
  size_t max_object_keys = 100000;  // keys of one object (unordered `json` files: vocabularies)
};

// Limits for JSON a network client sends: ordered objects, so few keys per object.
inline constexpr JsonLimits kRequestJsonLimits{128, 1024};

// Parses `text` as JsonT (nlohmann::json or ordered_json). On failure returns nullopt and sets
// `error` to the parser's message or the bound that was exceeded ("nesting deeper than 128 levels").
template <class JsonT>
std::optional<JsonT> parse_json_bounded(std::string_view text, const JsonLimits& lim, std::string& error) {
  struct Bound : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  std::vector<size_t> keys;  // keys seen so far in each open object (arrays: unused entries)
  typename JsonT::parser_callback_t cb = [&](int depth, typename JsonT::parse_event_t ev, JsonT&) {
    using E = typename JsonT::parse_event_t;
    if (ev == E::object_start || ev == E::array_start) {
      if (depth >= lim.max_depth)
        throw Bound("nesting deeper than " + std::to_string(lim.max_depth) + " levels");
      keys.push_back(0);
    } else if (ev == E::object_end || ev == E::array_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (ev == E::key && !keys.empty() && ++keys.back() > lim.max_object_keys) {
      throw Bound("an object with more than " + std::to_string(lim.max_object_keys) + " keys");
    }
    return true;
  };
  try {
    return JsonT::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true);
  } catch (const std::exception& e) {
    error = e.what();
    return std::nullopt;
  }
}

}  // namespace g4
