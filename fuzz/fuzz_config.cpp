// libFuzzer harness: config.json text -> ModelConfig (every field's type and range).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "io/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)g4::parse_config(text, {}, "config.json");
  return 0;
}
