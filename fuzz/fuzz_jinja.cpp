// libFuzzer harness: a chat template's source, parsed and rendered on a small conversation (the
// step budget lowered so that runaway templates end quickly; sizes keep their real bounds).
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const g4::jinja::Value ctx = g4::jinja::from_json(nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <b>"},
                 {"role": "assistant", "content": "Hello", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "bos_token": "<bos>", "add_generation_prompt": true})"));
  auto t = g4::jinja::Template::parse(std::string(reinterpret_cast<const char*>(data), size));
  if (t.is_ok()) (void)t->render(ctx, 200000);
  return 0;
}
