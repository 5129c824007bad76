// libFuzzer harness: an HTTP request body as a client sends it, through what the server does
// before the engine sees it: bounded JSON parsing, the OpenAI (chat, completions) and Anthropic
// translations, and the Gemma 4 chat template rendering the result with client text marked literal.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "io/json_bounded.h"
#include "server/api_types.h"
#include "text/chat_template.h"
#include "../tests/text/tokenizer_fixture.h"

namespace {

const g4::ChatTemplate* gemma4_template() {
  static const auto t = [] {
    std::ifstream f(G4_SOURCE_DIR "/tests/fixtures/templates/gemma4.jinja");
    std::stringstream ss;
    ss << f.rdbuf();
    return g4::ChatTemplate::from_string(ss.str(), "gemma4.jinja");
  }();
  return t.is_ok() ? &t.value() : nullptr;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using g4::server::ojson;
  static const g4::Tokenizer tok = g4::testing::tiny_tokenizer();
  std::string why;
  auto body = g4::parse_json_bounded<ojson>(std::string_view(reinterpret_cast<const char*>(data), size),
                                            g4::kRequestJsonLimits, why);
  if (!body || !body->is_object()) return 0;
  for (int api = 0; api < 3; ++api) {
    g4::server::TextRequest r;
    auto e = api == 2 ? g4::server::read_anthropic_request(*body, r)
                      : g4::server::read_openai_request(*body, api == 0, 300, r);
    if (e || !r.chat || !gemma4_template()) continue;
    g4::ChatRenderOptions ro;
    ro.add_generation_prompt = true;
    auto text = gemma4_template()->render(g4::server::mark_literal_strings(r.messages, tok),
                                          g4::server::mark_literal_strings(r.tools, tok), ro);
    if (text.is_ok()) (void)tok.encode_marked(text.value());
  }
  return 0;
}
