// A tiny tokenizer.json built in the tests: ids 0-3 specials, 4..259 byte tokens <0x00>..<0xFF>,
// then the words below. Expected ids in the tests are derived by hand from the BPE rules
// (lowest merge rank first, leftmost on ties), not produced by our implementation.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "text/tokenizer.h"

namespace g4::testing {

inline int byte_id(unsigned b) { return 4 + int(b); }
enum : int {
  kSpace = 260,  // "▁"
  kA, kB, kC, kAB, kSpaceA, kABC, kSpaceAB, kEAcute,  // a b c ab ▁a abc ▁ab é
  kStartTurn, kNewline, kXY, kXYZ, kYZ, kSpecialS1, kPlainS1,
};

inline nlohmann::json tiny_tokenizer_json(bool byte_fallback = true, bool fuse_unk = true) {
  using nlohmann::json;
  json vocab = json::object();
  const char* specials[] = {"<pad>", "<eos>", "<bos>", "<unk>"};
  for (int i = 0; i < 4; ++i) vocab[specials[i]] = i;
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = byte_id(b);
  }
  const char* words[] = {"\xE2\x96\x81", "a", "b", "c", "ab", "\xE2\x96\x81" "a", "abc", "\xE2\x96\x81" "ab",
                         "\xC3\xA9"};
  for (int i = 0; i < 9; ++i) vocab[words[i]] = kSpace + i;
  json added = json::array();
  auto add = [&](int id, const char* content, bool special) {
    added.push_back({{"id", id}, {"content", content}, {"special", special}, {"normalized", false},
                     {"lstrip", false}, {"rstrip", false}, {"single_word", false}});
  };
  for (int i = 0; i < 4; ++i) add(i, specials[i], true);
  add(kStartTurn, "<start_of_turn>", true);
  add(kNewline, "\n", false);
  add(kXY, "xy", false);
  add(kXYZ, "xyz", false);
  add(kYZ, "yz", false);
  add(kSpecialS1, "<s1>", true);
  add(kPlainS1, "s1", false);
  json merges = json::array({json::array({"a", "b"}),                   // rank 0 -> ab
                             json::array({"\xE2\x96\x81", "a"}),         // rank 1 -> ▁a
                             json::array({"ab", "c"}),                   // rank 2 -> abc
                             json::array({"\xE2\x96\x81" "a", "b"})});   // rank 3 -> ▁ab
  return json{
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}},
      {"pre_tokenizer",
       {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}}})}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", fuse_unk}, {"byte_fallback", byte_fallback},
        {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}}},
  };
}

inline Tokenizer tiny_tokenizer(bool byte_fallback = true, bool fuse_unk = true) {
  auto t = Tokenizer::from_json(tiny_tokenizer_json(byte_fallback, fuse_unk).dump(), "tiny.json");
  if (!t) throw std::runtime_error(t.message());
  return t.value();
}

}  // namespace g4::testing
