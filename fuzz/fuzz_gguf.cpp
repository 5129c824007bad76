// libFuzzer harness: a GGUF file's bytes (header, metadata of every type, tensor infos), then the
// model-config resolution on what parsed.
#include <cstddef>
#include <cstdint>

#include "io/gguf.h"
#include "io/gguf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = g4::GgufFile::parse(nullptr, data, size, "fuzz.gguf");
  if (f.is_ok()) (void)g4::gguf_model_config(*f.value());
  return 0;
}
