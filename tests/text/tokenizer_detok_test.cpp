// Streaming detokenizer: pieces are well-formed UTF-8 and concatenate to decode(all ids).
#include <gtest/gtest.h>

#include <random>

#include "text/detokenizer.h"
#include "text/utf8.h"
#include "tokenizer_fixture.h"

namespace g4 {
namespace {

using namespace g4::testing;
using Ids = std::vector<int>;

std::vector<std::string> stream(const Tokenizer& t, const Ids& ids, bool skip = false) {
  Detokenizer d(t, skip);
  std::vector<std::string> out;
  for (int id : ids) out.push_back(d.push(id));
  out.push_back(d.finish());
  return out;
}

TEST(Detokenizer, SplitMultibyteCharIsHeldBackUntilComplete) {
  Tokenizer t = tiny_tokenizer();
  // ▁ , F0 9F 98 80 (U+1F600), a
  Ids ids{kSpace, byte_id(0xF0), byte_id(0x9F), byte_id(0x98), byte_id(0x80), kA};
  auto p = stream(t, ids);
  EXPECT_EQ(p, (std::vector<std::string>{" ", "", "", "", "", "\xF0\x9F\x98\x80" "a", ""}));
  // The run at the very end comes out of finish().
  p = stream(t, Ids{kA, byte_id(0xC3), byte_id(0xA8)});
  EXPECT_EQ(p, (std::vector<std::string>{"a", "", "", "\xC3\xA8"}));
}

TEST(Detokenizer, InvalidRunsBecomeReplacementChars) {
  Tokenizer t = tiny_tokenizer();
  auto p = stream(t, Ids{byte_id(0xC3), byte_id(0xA8), byte_id(0xFF), kB});
  EXPECT_EQ(p.back(), "");
  EXPECT_EQ(p[3], "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "b");
  p = stream(t, Ids{byte_id(0xE2), byte_id(0x82)});  // truncated at the end
  EXPECT_EQ(p.back(), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Detokenizer, SkipsSpecialsWhenAsked) {
  Tokenizer t = tiny_tokenizer();
  Ids ids{2, kA, kStartTurn, kNewline, 1};
  std::string all;
  for (auto& s : stream(t, ids, true)) all += s;
  EXPECT_EQ(all, "a\n");
  all.clear();
  for (auto& s : stream(t, ids, false)) all += s;
  EXPECT_EQ(all, "<bos>a<start_of_turn>\n<eos>");
}

TEST(Detokenizer, RandomStreamsMatchDecodeAndStayValid) {
  Tokenizer t = tiny_tokenizer();
  std::mt19937 rng(1234);
  // Mostly byte tokens (including fragments of valid multi-byte chars) so that runs split chars.
  const std::string chars[] = {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "a"};
  for (int trial = 0; trial < 2000; ++trial) {
    Ids ids;
    int n = 1 + int(rng() % 20);
    for (int k = 0; k < n; ++k) {
      int r = int(rng() % 10);
      if (r < 4) {
        for (unsigned char c : chars[rng() % 4]) ids.push_back(byte_id(c));
      } else if (r < 6) {
        ids.push_back(byte_id(rng() % 256));
      } else {
        ids.push_back(int(rng() % unsigned(t.vocab_size())));
      }
    }
    for (bool skip : {false, true}) {
      std::string all;
      for (auto& piece : stream(t, ids, skip)) {
        EXPECT_TRUE(utf8::is_valid(piece));
        all += piece;
      }
      ASSERT_EQ(all, t.decode(ids, skip)) << "trial " << trial;
    }
  }
}

}  // namespace
}  // namespace g4
