// libFuzzer harness: image file bytes (JPEG through libjpeg-turbo, PNG/GIF/BMP through stb_image).
// Canvases are capped at 256 x 256 pixels here (serving accepts kMaxImagePixels): the decoders'
// parsing paths are the same at any size, and under ASan a corpus grown to multi-megapixel images
// ran at ~30 executions a second. The cap itself is tested by ImageBounds.* (tests/vision).
#include <cstddef>
#include <cstdint>
#include <string>

#include "vision/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr int64_t kFuzzMaxPixels = 256 * 256;
  auto img = g4::decode_image(std::string(reinterpret_cast<const char*>(data), size), "fuzz", kFuzzMaxPixels);
  if (img.is_ok() && img->width > 0) (void)g4::resize_bicubic(img.value(), 7, 5);
  return 0;
}
