// Hostile inputs to the loaders: bounded JSON parsing (depth, keys per object) and config
// integers range-checked before anything is allocated from them.
#include <gtest/gtest.h>

#include <chrono>

#include "io/json_bounded.h"
#include "io/model_config.h"

using namespace g4;

namespace {

std::string nested(int depth, const char* open = "[", const char* close = "]") {
  std::string s;
  for (int i = 0; i < depth; ++i) s += open;
  s += "1";
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}

std::string wide_object(int keys) {
  std::string s = "{";
  for (int i = 0; i < keys; ++i) s += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
  return s + "}";
}

}  // namespace

TEST(JsonBounded, DeepNestingIsRefusedWithoutRecursing) {
  for (const char* open : {"[", "{\"a\":"}) {
    const bool obj = open[0] == '{';
    std::string why;
    auto j = parse_json_bounded<nlohmann::ordered_json>(nested(40000, open, obj ? "}" : "]"), kRequestJsonLimits, why);
    EXPECT_FALSE(j.has_value());
    EXPECT_NE(why.find("nesting deeper than 128 levels"), std::string::npos) << why;
  }
  std::string why;
  auto ok = parse_json_bounded<nlohmann::ordered_json>(nested(100), kRequestJsonLimits, why);
  ASSERT_TRUE(ok.has_value()) << why;
}

TEST(JsonBounded, ObjectsWithTooManyKeysAreRefusedFast) {
  const std::string body = wide_object(262144);  // 3 MB: took a minute of a core as ordered_json
  const auto t0 = std::chrono::steady_clock::now();
  std::string why;
  auto j = parse_json_bounded<nlohmann::ordered_json>(body, kRequestJsonLimits, why);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(j.has_value());
  EXPECT_NE(why.find("more than 1024 keys"), std::string::npos) << why;
  EXPECT_LT(s, 2.0);
  auto fine = parse_json_bounded<nlohmann::ordered_json>(wide_object(1024), kRequestJsonLimits, why);
  ASSERT_TRUE(fine.has_value()) << why;
  EXPECT_EQ(fine->size(), 1024u);
}

TEST(JsonBounded, SyntaxErrorsAreMessages) {
  std::string why;
  EXPECT_FALSE(parse_json_bounded<nlohmann::json>("{\"a\": ", JsonLimits{}, why).has_value());
  EXPECT_NE(why.find("parse error"), std::string::npos) << why;
}

TEST(ModelConfigBounds, SlidingWindowBeyondWhatCanBeAllocatedIsRefused) {
  for (const char* w : {"2147483647", "1e8", "100000000", "65537"}) {
    const std::string cfg = std::string(R"({"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 2,
      "intermediate_size": 128, "head_dim": 16, "global_head_dim": 32, "num_kv_shared_layers": 0,
      "vocab_size": 300, "hidden_size_per_layer_input": 0, "sliding_window": )") + w + "}";
    auto r = parse_config(cfg, "", "config.json");
    ASSERT_FALSE(r.is_ok()) << w;
    EXPECT_NE(r.message().find("sliding_window"), std::string::npos) << r.message();
    EXPECT_NE(r.message().find("config.json"), std::string::npos) << r.message();
  }
}

TEST(ModelConfigBounds, DeeplyNestedConfigIsAnError) {
  const std::string cfg = R"({"model_type": "gemma4", "text_config": )" + nested(50000, "{\"a\":", "}") + "}";
  auto r = parse_config(cfg, "", "config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("nesting deeper"), std::string::npos) << r.message();
}
