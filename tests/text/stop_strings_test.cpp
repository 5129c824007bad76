// Stop strings on streamed text and stop token ids (text/stop_strings.h).
#include <gtest/gtest.h>

#include "text/stop_strings.h"

using g4::StopStringMatcher;

namespace {

struct Out {
  std::string text;
  bool stopped = false;
  int which = -1;
};

Out run(std::vector<std::string> stops, const std::vector<std::string>& pieces) {
  StopStringMatcher m(std::move(stops));
  Out o;
  for (auto& p : pieces) {
    auto r = m.feed(p);
    o.text += r.text;
    if (r.stopped) {
      o.stopped = true;
      o.which = r.which;
      break;
    }
  }
  if (!o.stopped) o.text += m.flush();
  return o;
}

std::vector<std::string> cut(const std::string& s, std::vector<size_t> at) {
  std::vector<std::string> v;
  size_t prev = 0;
  for (size_t c : at) {
    v.push_back(s.substr(prev, c - prev));
    prev = c;
  }
  v.push_back(s.substr(prev));
  return v;
}

}  // namespace

TEST(StopStrings, MarkerPrefixAtEnd) {
  EXPECT_EQ(g4::marker_prefix_at_end("abc<|to", "<|tool"), 4u);
  EXPECT_EQ(g4::marker_prefix_at_end("abc<|tool", "<|tool"), 0u);  // full match is not "partial"
  EXPECT_EQ(g4::marker_prefix_at_end("aaa", "aab"), 2u);
  EXPECT_EQ(g4::marker_prefix_at_end("", "x"), 0u);
  EXPECT_EQ(g4::marker_prefix_at_end("x", ""), 0u);
}

TEST(StopStrings, SpansTokenBoundariesAtEverySplit) {
  const std::string text = "The end is near. END OF STORY and more";
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); ++b) {
      auto o = run({"END OF", "zzz"}, cut(text, {a, b}));
      ASSERT_TRUE(o.stopped) << a << "," << b;
      ASSERT_EQ(o.text, "The end is near. ") << a << "," << b;
      ASSERT_EQ(o.which, 0);
    }
  }
}

TEST(StopStrings, ReleasesHeldTextWhenItCannotMatch) {
  StopStringMatcher m({"</answer>"});
  auto r = m.feed("x </ans");
  EXPECT_EQ(r.text, "x ");
  EXPECT_EQ(m.held(), "</ans");
  r = m.feed("wer");  // "</answer" still a prefix
  EXPECT_EQ(r.text, "");
  r = m.feed("s>");  // "</answers>" cannot match any more
  EXPECT_EQ(r.text, "</answers>");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, EarliestMatchWinsAndNothingAfterIsEmitted) {
  auto o = run({"world", "lo w"}, {"hel", "lo world!"});
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "hel");
  EXPECT_EQ(o.which, 1);
  // Overlapping prefix: "aab" inside "aaab".
  o = run({"aab"}, {"a", "a", "a", "b", "c"});
  EXPECT_EQ(o.text, "a");
  EXPECT_TRUE(o.stopped);
  // Stop string at the very start.
  o = run({"\n\n"}, {"\n", "\nrest"});
  EXPECT_EQ(o.text, "");
  EXPECT_TRUE(o.stopped);
}

TEST(StopStrings, FlushAtEndAndEmptyStops) {
  auto o = run({"STOP"}, {"almost ST", "O"});
  EXPECT_FALSE(o.stopped);
  EXPECT_EQ(o.text, "almost STO");
  o = run({"", ""}, {"anything"});
  EXPECT_FALSE(o.stopped);
  EXPECT_EQ(o.text, "anything");
  StopStringMatcher none;
  EXPECT_FALSE(none.active());
  EXPECT_EQ(none.feed("abc").text, "abc");
}

TEST(StopStrings, AfterStopFeedsAreEmpty) {
  StopStringMatcher m({"x"});
  auto r = m.feed("abxcd");
  EXPECT_EQ(r.text, "ab");
  r = m.feed("more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, Utf8StaysWhole) {
  // Held-back text starts at the first byte of a stop string, so multi-byte characters are
  // never split.
  auto o = run({"été fini"}, {"c'est é", "t", "é par"});
  EXPECT_FALSE(o.stopped);
  EXPECT_EQ(o.text, "c'est été par");
  StopStringMatcher m({"été fini"});
  auto r = m.feed("Zürich é");
  EXPECT_EQ(r.text, "Zürich ");
}

TEST(StopTokens, Set) {
  g4::StopTokenSet s({1, 106});
  EXPECT_TRUE(s.contains(1));
  EXPECT_TRUE(s.contains(106));
  EXPECT_FALSE(s.contains(50));
  s.add(50);
  EXPECT_TRUE(s.contains(50));
  EXPECT_EQ(s.size(), 3u);
}
