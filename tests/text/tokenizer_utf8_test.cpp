#include <gtest/gtest.h>

#include "text/utf8.h"

namespace g4 {
namespace {

TEST(Utf8, ValidSequenceLengths) {
  using utf8::valid_seq_len;
  EXPECT_EQ(valid_seq_len("a", 0), 1u);
  EXPECT_EQ(valid_seq_len("\xC3\xA9", 0), 2u);
  EXPECT_EQ(valid_seq_len("\xE2\x82\xAC", 0), 3u);
  EXPECT_EQ(valid_seq_len("\xF0\x9F\x98\x80", 0), 4u);
  EXPECT_EQ(valid_seq_len("\xF4\x8F\xBF\xBF", 0), 4u);  // U+10FFFF
  EXPECT_EQ(valid_seq_len("\xC0\x80", 0), 0u);          // overlong NUL
  EXPECT_EQ(valid_seq_len("\xC1\xBF", 0), 0u);
  EXPECT_EQ(valid_seq_len("\xE0\x80\x80", 0), 0u);      // overlong
  EXPECT_EQ(valid_seq_len("\xED\xA0\x80", 0), 0u);      // surrogate U+D800
  EXPECT_EQ(valid_seq_len("\xF0\x80\x80\x80", 0), 0u);  // overlong
  EXPECT_EQ(valid_seq_len("\xF4\x90\x80\x80", 0), 0u);  // > U+10FFFF
  EXPECT_EQ(valid_seq_len("\xF5\x80\x80\x80", 0), 0u);
  EXPECT_EQ(valid_seq_len("\x80", 0), 0u);
  EXPECT_EQ(valid_seq_len("\xE2\x82", 0), 0u);          // truncated
  EXPECT_EQ(valid_seq_len("\xE2\x28\xA1", 0), 0u);      // bad continuation
  EXPECT_EQ(utf8::char_len("\xFF" "a", 0), 1u);
  EXPECT_TRUE(utf8::is_valid("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(utf8::is_valid("h\xC3"));
  EXPECT_TRUE(utf8::is_valid(""));
}

TEST(Utf8, CompletePrefix) {
  using utf8::complete_prefix_len;
  EXPECT_EQ(complete_prefix_len("abc"), 3u);
  EXPECT_EQ(complete_prefix_len("a\xF0\x9F"), 1u);        // waiting for 2 more bytes
  EXPECT_EQ(complete_prefix_len("a\xF0\x9F\x98"), 1u);
  EXPECT_EQ(complete_prefix_len("a\xF0\x9F\x98\x80"), 5u);
  EXPECT_EQ(complete_prefix_len("\xC3"), 0u);
  EXPECT_EQ(complete_prefix_len("a\xE2\x82"), 1u);
  EXPECT_EQ(complete_prefix_len("\xFF"), 1u);              // never valid: not held back
  EXPECT_EQ(complete_prefix_len("a\xE0\x80"), 3u);          // E0 80 can never complete
  EXPECT_EQ(complete_prefix_len("a\xED\xA0"), 3u);          // surrogate prefix
  EXPECT_EQ(complete_prefix_len(""), 0u);
}

TEST(Utf8, Append) {
  std::string s;
  for (uint32_t cp : {0x41u, 0xE9u, 0x20ACu, 0x1F600u}) utf8::append(s, cp);
  EXPECT_EQ(s, "A\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
}

}  // namespace
}  // namespace g4
