// libFuzzer harness for the tokenizer. First byte even: the rest is a tokenizer.json to load (and
// encode a fixed text with); odd: the rest is text, encoded (plain, special, marked), decoded.
#include <cstddef>
#include <cstdint>
#include <string>

#include "../tests/text/tokenizer_fixture.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto t = g4::Tokenizer::from_json(rest, "fuzz.json");
    if (t.is_ok()) {
      auto ids = t->encode("Hello <bos> world \xC3\xA9\xF0\x9F\x98\x80", true, true);
      (void)t->decode(ids);
    }
    return 0;
  }
  static const g4::Tokenizer tok = g4::testing::tiny_tokenizer();
  for (bool special : {false, true}) (void)tok.decode(tok.encode(rest, special, true));
  (void)tok.decode(tok.encode_marked("<start_of_turn>" + tok.mark_literal(rest) + "<eos>"));
  return 0;
}
