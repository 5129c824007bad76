// Images for the vision encoder: decoding into 8-bit RGB (JPEG through libjpeg-turbo with the
// settings Pillow uses, so the pixels are Pillow's; PNG, GIF, BMP, TGA, PSD, HDR, PNM and CMYK
// JPEGs through stb_image, Debian's libstb), and Pillow's bicubic resize reproduced exactly.
//
// Why by hand: HF's Gemma4ImageProcessor resizes with PIL (Image.resize, BICUBIC), whose 8-bit
// path uses its own fixed-point kernels; no maintained C/C++ library reproduces them bit for bit,
// and a different resampler changes pixels by up to several levels. This is Pillow's
// Resample.c algorithm (antialiased separable convolution, a = -0.5 cubic, coefficients in 22-bit
// fixed point, horizontal pass first, each pass rounded and clipped to 8 bits), checked against
// Pillow itself (tests/python/test_vision.py).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace g4 {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3], row-major
};

// Largest accepted side (pixels); larger images are refused rather than allocated.
constexpr int kMaxImageSide = 16384;
// Decoded pixels per image (8192 x 4096): a small compressed file can declare a huge canvas, and
// decoding holds 7 bytes per pixel, so the bound is checked from the header before decoding.
constexpr int64_t kMaxImagePixels = int64_t(1) << 25;

// Decodes an image file's bytes into RGB as HF's processors do (convert_to_rgb): grey and
// palettes expanded, transparency (an alpha channel or a transparent palette entry) composited
// onto white with Pillow's arithmetic.
// `label` names the source in errors; a declared canvas over max_pixels (or a side over
// kMaxImageSide) is refused before decoding.
Result<RgbImage> decode_image(const std::string& bytes, const std::string& label,
                              int64_t max_pixels = kMaxImagePixels);
Result<RgbImage> load_image_file(const std::string& path);

// Pillow Image.resize((width, height), Image.BICUBIC) of an RGB image, exactly.
RgbImage resize_bicubic(const RgbImage& in, int width, int height);

}  // namespace g4
