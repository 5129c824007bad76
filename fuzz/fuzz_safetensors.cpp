// libFuzzer harness: a safetensors file's bytes (header JSON, offsets, dtypes, shapes).
#include <cstddef>
#include <cstdint>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = g4::SafetensorsFile::parse(data, size, "fuzz.safetensors", nullptr);
  if (f.is_ok())
    for (const auto& t : f.value()->tensors()) (void)t.shape_str();
  return 0;
}
