// Image decoding refuses canvases larger than kMaxImagePixels from the file's header, before any
// pixel memory is taken (a 254 KB PNG can declare 16384 x 16384 = 1 GiB of RGBA).
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cstdint>
#include <string>

#include "vision/image.h"

namespace g4 {
namespace {

uint32_t crc32(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void be32(std::string& s, uint32_t v) {
  for (int k = 3; k >= 0; --k) s.push_back(char((v >> (8 * k)) & 0xFF));
}

void chunk(std::string& png, const char* type, const std::string& data) {
  be32(png, uint32_t(data.size()));
  const std::string body = std::string(type, 4) + data;
  png += body;
  be32(png, crc32(body));
}

// A PNG whose header declares w x h RGB pixels (its image data is a stub: the size check must
// refuse it before decoding).
std::string png_header(uint32_t w, uint32_t h) {
  std::string png = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  be32(ihdr, w);
  be32(ihdr, h);
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit RGB, deflate, no filter, no interlace
  chunk(png, "IHDR", ihdr);
  chunk(png, "IDAT", std::string("\x78\x9c\x03\x00\x00\x00\x00\x01", 8));
  chunk(png, "IEND", "");
  return png;
}

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

TEST(ImageBounds, HugeCanvasIsRefusedBeforeDecoding) {
  const long before = peak_rss_kib();
  auto r = decode_image(png_header(16384, 16384), "messages[0].content[1]");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("messages[0].content[1]"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("268435456 pixels"), std::string::npos) << r.message();
  EXPECT_LT(peak_rss_kib() - before, 64 * 1024);  // nothing near the 1 GiB the canvas would take
}

TEST(ImageBounds, TheLimitIsOnPixelsNotOnOneSide) {
  auto wide = decode_image(png_header(16384, 4096), "wide.png");  // 64M pixels > 32M
  ASSERT_FALSE(wide.is_ok());
  EXPECT_NE(wide.message().find("at most 33554432"), std::string::npos) << wide.message();
  auto side = decode_image(png_header(16385, 1), "side.png");
  ASSERT_FALSE(side.is_ok());
  EXPECT_NE(side.message().find("each side must be 1..16384"), std::string::npos) << side.message();
}

// A caller's lower bound (the fuzz harness's) refuses from the header as the default one does.
TEST(ImageBounds, ACallerMayAskForALowerBound) {
  auto r = decode_image(png_header(300, 300), "small.png", 256 * 256);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("90000 pixels; at most 65536"), std::string::npos) << r.message();
}

}  // namespace
}  // namespace g4
