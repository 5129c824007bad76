// libFuzzer harness: image file bytes (JPEG through libjpeg-turbo, PNG/GIF/BMP through stb_image).
#include <cstddef>
#include <cstdint>
#include <string>

#include "vision/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto img = g4::decode_image(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  if (img.is_ok() && img->width > 0) (void)g4::resize_bicubic(img.value(), 7, 5);
  return 0;
}
