// g4::Tokenizer on a tiny hand-built tokenizer.json (see tokenizer_fixture.h) and a tiny GGUF
// vocabulary. Expected ids follow by hand from the BPE / SentencePiece rules.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer_fixture.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace g4 {
namespace {

using namespace g4::testing;
using Ids = std::vector<int>;

TEST(Tokenizer, MergesApplyByRankNotPosition) {
  Tokenizer t = tiny_tokenizer();
  EXPECT_EQ(t.encode("ab"), (Ids{kAB}));
  // "▁ab": (▁,a) has rank 1, (a,b) rank 0 -> a+b first; (▁,ab) is no merge.
  EXPECT_EQ(t.encode(" ab"), (Ids{kSpace, kAB}));
  // "▁abc": ab (0), then ab+c (2).
  EXPECT_EQ(t.encode(" abc"), (Ids{kSpace, kABC}));
  // "▁a▁b": only ▁+a merges.
  EXPECT_EQ(t.encode(" a b"), (Ids{kSpaceA, kSpace, kB}));
  EXPECT_EQ(t.encode("ba"), (Ids{kB, kA}));
  EXPECT_EQ(t.encode("aab"), (Ids{kA, kAB}));
  EXPECT_EQ(t.encode(""), Ids{});
}

TEST(Tokenizer, ByteFallbackForCharsOutsideTheVocab) {
  Tokenizer t = tiny_tokenizer();
  EXPECT_EQ(t.encode("\xC3\xA9"), (Ids{kEAcute}));                           // é in vocab
  EXPECT_EQ(t.encode("\xC3\xA8"), (Ids{byte_id(0xC3), byte_id(0xA8)}));      // è is not
  EXPECT_EQ(t.encode("a\xF0\x9F\x98\x80"), (Ids{kA, byte_id(0xF0), byte_id(0x9F), byte_id(0x98), byte_id(0x80)}));
  // Ill-formed input: each stray byte is its own symbol.
  EXPECT_EQ(t.encode("\xFF" "a\xC3"), (Ids{byte_id(0xFF), kA, byte_id(0xC3)}));
  EXPECT_EQ(t.encode(std::string_view("\0", 1)), (Ids{byte_id(0)}));
}

TEST(Tokenizer, UnkWithoutByteFallback) {
  Tokenizer fused = tiny_tokenizer(/*byte_fallback=*/false, /*fuse_unk=*/true);
  EXPECT_EQ(fused.encode("qqq"), (Ids{3}));
  EXPECT_EQ(fused.encode("qaq"), (Ids{3, kA, 3}));
  Tokenizer unfused = tiny_tokenizer(false, false);
  EXPECT_EQ(unfused.encode("qqq"), (Ids{3, 3, 3}));
}

TEST(Tokenizer, AddedAndSpecialTokens) {
  Tokenizer t = tiny_tokenizer();
  // Non-special added tokens are always matched; special ones only with parse_special.
  EXPECT_EQ(t.encode("a\nb"), (Ids{kA, kNewline, kB}));
  EXPECT_EQ(t.encode("<start_of_turn>a", true), (Ids{kStartTurn, kA}));
  Ids plain;
  for (unsigned char c : std::string("<start_of_turn>")) plain.push_back(c == 'a' ? kA : byte_id(c));
  plain.push_back(kA);
  EXPECT_EQ(t.encode("<start_of_turn>a", false), plain);
  // Leftmost-longest: "xyz" wins over "xy"; "yz" cannot start inside a match.
  EXPECT_EQ(t.encode("axyz"), (Ids{kA, kXYZ}));
  EXPECT_EQ(t.encode("xyyz"), (Ids{kXY, kYZ}));
  // A special match that is not parsed stays text, and hides the "s1" inside it.
  EXPECT_EQ(t.encode("<s1>", true), (Ids{kSpecialS1}));
  EXPECT_EQ(t.encode("<s1>", false),
            (Ids{byte_id('<'), byte_id('s'), byte_id('1'), byte_id('>')}));
  EXPECT_EQ(t.encode("s1"), (Ids{kPlainS1}));
  // BOS only on request.
  EXPECT_EQ(t.encode("a", false, true), (Ids{2, kA}));
  EXPECT_TRUE(t.is_special(kStartTurn));
  EXPECT_FALSE(t.is_special(kNewline));
  EXPECT_TRUE(t.is_added(kNewline));
  EXPECT_FALSE(t.is_special(kA));
  EXPECT_EQ(t.bos_id(), 2);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_EQ(t.unk_id(), 3);
  EXPECT_EQ(t.pad_id(), 0);
  EXPECT_EQ(t.vocab_size(), kPlainS1 + 1);
  EXPECT_EQ(t.id_of("\xE2\x96\x81" "a"), kSpaceA);
  EXPECT_EQ(t.id_of("nope"), -1);
  EXPECT_EQ(t.token_text(kSpaceAB), "\xE2\x96\x81" "ab");
  EXPECT_EQ(t.token_text(-1), "");
  EXPECT_EQ(t.token_text(1 << 20), "");
}

TEST(Tokenizer, Decode) {
  Tokenizer t = tiny_tokenizer();
  EXPECT_EQ(t.decode(Ids{kAB, kSpace, kABC}), "ab abc");
  EXPECT_EQ(t.decode(Ids{byte_id(0xC3), byte_id(0xA8)}), "\xC3\xA8");
  // A byte run that is not UTF-8 becomes one U+FFFD per byte, the whole run.
  EXPECT_EQ(t.decode(Ids{byte_id(0xC3)}), "\xEF\xBF\xBD");
  EXPECT_EQ(t.decode(Ids{byte_id(0xC3), kA}), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(t.decode(Ids{byte_id(0xC3), byte_id(0xA8), byte_id(0xFF)}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(t.decode(Ids{2, kA, kStartTurn}), "<bos>a<start_of_turn>");
  EXPECT_EQ(t.decode(Ids{2, kA, kStartTurn}, /*skip_special=*/true), "a");
  EXPECT_EQ(t.decode(Ids{kNewline}, true), "\n");  // non-special added tokens are kept
  EXPECT_EQ(t.decode(Ids{-5, kA, 1 << 20}), "a");   // unknown ids are skipped
}

TEST(Tokenizer, RoundTripsUtf8EdgeCases) {
  Tokenizer t = tiny_tokenizer();
  const char* cases[] = {"ab abc", "  a  b  ", "\t\n\r\n", "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9",
                         "\xEF\xBB\xBF" "bom", "\xF4\x8F\xBF\xBF", "\xEF\xBF\xBF", "e\xCC\x81",
                         "<start_of_turn>x<bos>", "xyzzy s1 <s1>"};
  for (const char* s : cases) {
    EXPECT_EQ(t.decode(t.encode(s, false)), s) << s;
    EXPECT_EQ(t.decode(t.encode(s, true)), s) << s;
  }
}

TEST(Tokenizer, RandomBytesNeverBreakEncodeOrDecode) {
  Tokenizer t = tiny_tokenizer();
  Tokenizer spm = Tokenizer::from_gguf_vocab([] {
    GgufVocab v;
    v.model = "llama";
    v.tokens = {"<unk>", "a", "\xE2\x96\x81", "\xE2\x96\x81" "a", "<s>"};
    v.scores = {0, -1, -1, -0.5f, 0};
    v.token_types = {2, 1, 1, 1, 3};
    v.unk_id = 0;
    return v;
  }()).value();
  std::mt19937 rng(99);
  const char alphabet[] = {'a', 'b', 'c', ' ', '\n', 'x', 'y', 'z', '<', '>', 's', '1', '\xC3', '\xA9', '\xE2',
                           '\x96', '\x81', '\xF0', '\x9F', '\xFF', '\0'};
  for (int trial = 0; trial < 3000; ++trial) {
    std::string s;
    int n = int(rng() % 40);
    for (int k = 0; k < n; ++k) s += alphabet[rng() % sizeof alphabet];
    for (bool special : {false, true}) {
      auto ids = t.encode(s, special);
      for (int id : ids) ASSERT_TRUE(id >= 0 && id < t.vocab_size());
      std::string back = t.decode(ids);
      ASSERT_TRUE(utf8::is_valid(back));
      // Well-formed text without a literal "▁" round-trips exactly.
      if (utf8::is_valid(s) && s.find("\xE2\x96\x81") == std::string::npos) {
        ASSERT_EQ(back, s) << trial;
      }
      auto sids = spm.encode(s, special);
      for (int id : sids) ASSERT_TRUE(id >= 0 && id < spm.vocab_size());
      ASSERT_TRUE(utf8::is_valid(spm.decode(sids)));
    }
  }
}

TEST(Tokenizer, LoadErrorsNameTheField) {
  auto bad = Tokenizer::from_json("{not json", "x.json");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.message().find("x.json"), std::string::npos);

  auto j = tiny_tokenizer_json();
  j["normalizer"] = {{"type", "NFKC"}};
  auto r = Tokenizer::from_json(j.dump(), "t.json");
  ASSERT_FALSE(r);
  EXPECT_NE(r.message().find("normalizer"), std::string::npos) << r.message();

  j = tiny_tokenizer_json();
  j["model"]["merges"].push_back(nlohmann::json::array({"zz", "a"}));
  r = Tokenizer::from_json(j.dump(), "t.json");
  ASSERT_FALSE(r);
  EXPECT_NE(r.message().find("merges[4]"), std::string::npos) << r.message();

  j = tiny_tokenizer_json();
  j["model"]["type"] = "Unigram";
  EXPECT_FALSE(Tokenizer::from_json(j.dump(), "t.json"));
  j = tiny_tokenizer_json();
  j["model"]["vocab"] = 5;
  EXPECT_FALSE(Tokenizer::from_json(j.dump(), "t.json"));
  j = tiny_tokenizer_json();
  j["added_tokens"][0]["id"] = "zero";
  EXPECT_FALSE(Tokenizer::from_json(j.dump(), "t.json"));
  EXPECT_FALSE(Tokenizer::from_file("/nonexistent/tokenizer.json"));
}

TEST(Tokenizer, MergesAsStrings) {
  auto j = tiny_tokenizer_json();
  j["model"]["merges"] = {"a b", "\xE2\x96\x81 a", "ab c", "\xE2\x96\x81" "a b"};
  auto t = Tokenizer::from_json(j.dump());
  ASSERT_TRUE(t) << t.message();
  EXPECT_EQ(t->encode(" abc"), (Ids{kSpace, kABC}));
}

// A SentencePiece-style GGUF vocabulary: merge by score.
GgufVocab tiny_gguf(const std::string& model = "llama") {
  GgufVocab v;
  v.model = model;
  v.architecture = "llama";
  auto add = [&](const std::string& s, float score, int type) {
    v.tokens.push_back(s);
    v.scores.push_back(score);
    v.token_types.push_back(type);
  };
  add("<unk>", 0, GgufVocab::kUnknown);   // 0
  add("<s>", 0, GgufVocab::kControl);     // 1
  add("</s>", 0, GgufVocab::kControl);    // 2
  char name[8];
  for (int b = 0; b < 256; ++b) {         // 3..258
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    add(name, 0, GgufVocab::kByte);
  }
  add("\xE2\x96\x81", -10, GgufVocab::kNormal);         // 259 ▁
  add("a", -10, GgufVocab::kNormal);                    // 260
  add("b", -10, GgufVocab::kNormal);                    // 261
  add("ab", -3, GgufVocab::kNormal);                    // 262
  add("\xE2\x96\x81" "a", -1, GgufVocab::kNormal);      // 263 ▁a (higher score than ab)
  add("<tool>", 0, GgufVocab::kUserDefined);            // 264
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  v.add_bos = true;
  return v;
}

TEST(Tokenizer, GgufSpmMergesByScore) {
  auto t = Tokenizer::from_gguf_vocab(tiny_gguf());
  ASSERT_TRUE(t) << t.message();
  EXPECT_STREQ(t->model_kind(), "spm");
  // "▁ab": ▁a (-1) beats ab (-3); ▁a+b is no token.
  EXPECT_EQ(t->encode(" ab"), (Ids{263, 261}));
  EXPECT_EQ(t->encode("ab"), (Ids{262}));
  EXPECT_EQ(t->encode("c"), (Ids{3 + 'c'}));
  EXPECT_EQ(t->encode("<s>a<tool>", true), (Ids{1, 260, 264}));
  EXPECT_EQ(t->encode("<tool>", false), (Ids{264}));
  EXPECT_TRUE(t->wants_bos());
  EXPECT_EQ(t->encode("a", false, true), (Ids{1, 260}));
  EXPECT_TRUE(t->is_special(1));
  EXPECT_FALSE(t->is_special(264));
  EXPECT_EQ(t->decode(Ids{263, 261, 3 + 0xC3, 3 + 0xA9}), " ab\xC3\xA9");
  EXPECT_EQ(t->decode(Ids{1, 260}, true), "a");
}

TEST(Tokenizer, GgufErrors) {
  GgufVocab v = tiny_gguf();
  v.scores.pop_back();
  auto r = Tokenizer::from_gguf_vocab(v);
  ASSERT_FALSE(r);
  EXPECT_NE(r.message().find("tokenizer.ggml.scores"), std::string::npos);
  v = tiny_gguf();
  v.bos_id = 100000;
  EXPECT_FALSE(Tokenizer::from_gguf_vocab(v));
  EXPECT_FALSE(Tokenizer::from_gguf_vocab(tiny_gguf("gpt2")));
  EXPECT_FALSE(Tokenizer::from_gguf_vocab(tiny_gguf("gemma4")));  // BPE needs merges
  v = tiny_gguf("gemma4");
  v.merges = {"a b", "\xE2\x96\x81 a"};
  auto b = Tokenizer::from_gguf_vocab(v);
  ASSERT_TRUE(b) << b.message();
  EXPECT_EQ(b->encode(" ab"), (Ids{259, 262}));  // rank order: a+b first, then no ▁+ab
  v.merges = {"a q"};
  EXPECT_FALSE(Tokenizer::from_gguf_vocab(v));
  EXPECT_FALSE(Tokenizer::from_gguf_vocab(GgufVocab{}));
}

TEST(Tokenizer, GemmaGgufRespellsSpaceTokensAndDerivesMerges) {
  // Gemma 1-3 files store whitespace tokens with real spaces and list no merges; merges come from
  // the vocabulary order (earlier token = better), longer left part first.
  GgufVocab v;
  v.model = "llama";
  v.architecture = "gemma3";
  v.tokens = {"<pad>", "<eos>", "<bos>", "<unk>", "  ", "\xE2\x96\x81", "a", "b", "ab", "\xE2\x96\x81" "a",
              "\xE2\x96\x81" "ab"};
  v.token_types = {3, 3, 3, 2, 4, 1, 1, 1, 1, 1, 1};
  v.bos_id = 2;
  v.eos_id = 1;
  v.unk_id = 3;
  auto t = Tokenizer::from_gguf_vocab(v);
  ASSERT_TRUE(t) << t.message();
  EXPECT_STREQ(t->model_kind(), "bpe");
  EXPECT_EQ(t->id_of("\xE2\x96\x81\xE2\x96\x81"), 4);
  EXPECT_EQ(t->encode("  "), (Ids{4}));  // ▁▁ from merges ▁+▁ (token 4 ranks first)
  // "▁ab" (id 10): splits ▁|ab and ▁a|b; "ab" (8) ranks before "▁a" (9), so a+b, then ▁+ab.
  EXPECT_EQ(t->encode(" ab"), (Ids{10}));
  EXPECT_EQ(t->encode(" a"), (Ids{9}));
  EXPECT_EQ(t->decode(Ids{4, 10}), "   ab");
}

}  // namespace
}  // namespace g4
