// Every render of tests/fixtures/templates/expected.jsonl (written by jinja2 through transformers'
// pipeline, tools/make_template_corpus.py) must come out byte-identical from ChatTemplate; where
// jinja2 raised, ChatTemplate must fail.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"

namespace g4 {
namespace {

using ojson = nlohmann::ordered_json;
const std::string kDir = std::string(G4_SOURCE_DIR) + "/tests/fixtures/templates/";

ojson read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ojson::parse(ss.str(), nullptr, false);
}

TEST(ChatTemplateCorpus, MatchesJinja2ByteForByte) {
  std::ifstream in(kDir + "expected.jsonl");
  ASSERT_TRUE(in) << "missing " << kDir << "expected.jsonl";
  std::map<std::string, ChatTemplate> templates;
  std::map<std::string, int> checked;
  std::string line;
  int mismatches = 0;
  while (std::getline(in, line)) {
    ojson row = ojson::parse(line);
    std::string tname = row["template"];
    if (!templates.count(tname)) {
      auto t = ChatTemplate::from_file(kDir + tname);
      ASSERT_TRUE(t.is_ok()) << t.message();
      templates.emplace(tname, std::move(t).value());
    }
    ojson conv = read_json(kDir + "corpus/" + row["case"].get<std::string>() + ".json");
    ASSERT_TRUE(conv.is_object()) << row["case"];
    ChatRenderOptions o;
    o.add_generation_prompt = row["add_generation_prompt"];
    if (row["thinking"].is_boolean()) o.enable_thinking = row["thinking"].get<bool>();
    auto r = templates.at(tname).render(conv["messages"], conv["tools"], o);
    bool ok = row.contains("error") ? !r.is_ok() : (r.is_ok() && r.value() == row["text"].get<std::string>());
    if (!ok && ++mismatches <= 3)
      ADD_FAILURE() << tname << " " << row["case"] << " thinking=" << row["thinking"]
                    << " gen=" << row["add_generation_prompt"] << "\n got: " << (r.is_ok() ? r.value() : r.message())
                    << "\nwant: " << row.value("text", row.value("error", ""));
    ++checked[tname];
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GE(checked["gemma4.jinja"], 300);
  EXPECT_GE(checked["gemma3.jinja"], 100);
  EXPECT_GE(checked["features.jinja"], 50);
}

TEST(ChatTemplate, ModelDirPrefersChatTemplateJinja) {
  auto t = ChatTemplate::from_model_dir(kDir + "no-such-dir");
  EXPECT_FALSE(t.is_ok());
  EXPECT_NE(t.message().find("no-such-dir"), std::string::npos);
}

TEST(ChatTemplate, ErrorsNameTheFileAndLine) {
  auto t = ChatTemplate::from_string("ok\n{% import 'x' as y %}", "my.jinja");
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.message(), "my.jinja line 2: unsupported tag 'import'");
  auto g3 = ChatTemplate::from_file(kDir + "gemma3.jinja");
  ASSERT_TRUE(g3.is_ok());
  auto r = g3->render(ojson::parse(R"([{"role":"user","content":"a"},{"role":"user","content":"b"}])"), ojson(),
                      ChatRenderOptions{});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("gemma3.jinja line 15: raise_exception: Conversation roles must alternate"),
            std::string::npos)
      << r.message();
}

}  // namespace
}  // namespace g4
