#include "vision/image.h"

#include <jpeglib.h>
#include <stb/stb_image.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

namespace g4 {

namespace {

// The declared size against kMaxImageSide and max_pixels, before any pixel is decoded.
std::optional<Error> check_image_size(int64_t w, int64_t h, const std::string& label, int64_t max_pixels) {
  if (w <= 0 || h <= 0 || w > kMaxImageSide || h > kMaxImageSide)
    return err("%s: image is %lldx%lld; each side must be 1..%d pixels", label.c_str(), (long long)w, (long long)h,
               kMaxImageSide);
  if (w * h > max_pixels)
    return err("%s: image is %lldx%lld = %lld pixels; at most %lld are decoded", label.c_str(), (long long)w,
               (long long)h, (long long)(w * h), (long long)max_pixels);
  return std::nullopt;
}

// libjpeg errors longjmp back here instead of exiting the process.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// JPEG through libjpeg(-turbo) with its defaults (ISLOW DCT, fancy upsampling), as Pillow decodes
// it; nullopt for CMYK / YCCK files, which go to stb_image instead.
std::optional<Result<RgbImage>> decode_jpeg(const std::string& bytes, const std::string& label, int64_t max_pixels) {
  jpeg_decompress_struct cinfo;
  JpegError jerr;
  cinfo.err = jpeg_std_error(&jerr.mgr);
  jerr.mgr.error_exit = jpeg_error_exit;
  jerr.mgr.output_message = [](j_common_ptr) {};  // warnings (corrupt data recovered) stay quiet
  RgbImage img;
  if (setjmp(jerr.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return Result<RgbImage>(err("%s: cannot decode JPEG (%s)", label.c_str(), jerr.message));
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return std::nullopt;
  }
  if (auto bad = check_image_size(int64_t(cinfo.image_width), int64_t(cinfo.image_height), label, max_pixels)) {
    jpeg_destroy_decompress(&cinfo);
    return Result<RgbImage>(std::move(*bad));
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  img.width = int(cinfo.output_width);
  img.height = int(cinfo.output_height);
  img.rgb.resize(size_t(img.width) * img.height * 3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = img.rgb.data() + size_t(cinfo.output_scanline) * img.width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return Result<RgbImage>(std::move(img));
}

// HF convert_to_rgb composites transparency onto white with Pillow's Image.alpha_composite; this is
// its integer arithmetic (AlphaComposite.c, 7 extra bits) for an opaque white background.
uint8_t over_white(uint32_t v, uint32_t a) {
  if (a == 0) return 255;
  constexpr uint32_t kBits = 7;
  const uint32_t blend = 255 * (255 - a);
  const uint32_t outa255 = a * 255 + blend;
  const uint32_t coef1 = a * 255 * 255 * (1u << kBits) / outa255;
  const uint32_t coef2 = 255 * (1u << kBits) - coef1;
  const uint32_t t = v * coef1 + 255 * coef2 + (0x80u << kBits);
  return uint8_t((((t >> 8) + t) >> 8) >> kBits);
}

}  // namespace

Result<RgbImage> decode_image(const std::string& bytes, const std::string& label, int64_t max_pixels) {
  if (bytes.empty()) return err("%s: empty image", label.c_str());
  if (bytes.size() >= 3 && uint8_t(bytes[0]) == 0xFF && uint8_t(bytes[1]) == 0xD8 && uint8_t(bytes[2]) == 0xFF) {
    if (auto r = decode_jpeg(bytes, label, max_pixels)) return std::move(*r);
  }
  if (bytes.size() > size_t(INT32_MAX)) return err("%s: image file too large", label.c_str());
  const auto* p = reinterpret_cast<const stbi_uc*>(bytes.data());
  int w = 0, h = 0, comp = 0;
  if (!stbi_info_from_memory(p, int(bytes.size()), &w, &h, &comp))
    return err("%s: not a decodable image (%s)", label.c_str(), stbi_failure_reason());
  if (auto bad = check_image_size(w, h, label, max_pixels)) return std::move(*bad);
  stbi_uc* data = stbi_load_from_memory(p, int(bytes.size()), &w, &h, &comp, 4);
  if (!data) return err("%s: cannot decode image (%s)", label.c_str(), stbi_failure_reason());
  RgbImage img;
  img.width = w;
  img.height = h;
  img.rgb.resize(size_t(w) * size_t(h) * 3);
  const bool alpha = comp == 2 || comp == 4;  // alpha channel or a transparent palette entry
  for (size_t i = 0; i < size_t(w) * size_t(h); ++i) {
    const stbi_uc* px = data + 4 * i;
    for (int c = 0; c < 3; ++c) img.rgb[3 * i + size_t(c)] = alpha ? over_white(px[c], px[3]) : px[c];
  }
  stbi_image_free(data);
  return img;
}

Result<RgbImage> load_image_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return err("%s: cannot open image", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  return decode_image(ss.str(), path);
}

namespace {

// Pillow Resample.c, 8 bits per channel.
constexpr int kPrecisionBits = 32 - 8 - 2;

double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

struct Coeffs {
  int ksize = 0;
  std::vector<int> bounds;  // per output: first input index, count
  std::vector<int> k;       // [out, ksize] fixed-point weights
};

// precompute_coeffs + normalize_coeffs_8bpc for the box [0, in_size).
Coeffs coeffs(int in_size, int out_size) {
  constexpr double support_base = 2.0;  // bicubic
  const double scale = double(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = support_base * filterscale;
  Coeffs c;
  c.ksize = int(std::ceil(support)) * 2 + 1;
  c.bounds.resize(size_t(out_size) * 2);
  c.k.assign(size_t(out_size) * c.ksize, 0);
  std::vector<double> kk(size_t(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = int(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = int(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = bicubic((x + xmin - center + 0.5) * ss);
      kk[size_t(x)] = w;
      ww += w;
    }
    for (int x = 0; x < c.ksize; ++x) {
      double w = x < xmax ? (ww != 0.0 ? kk[size_t(x)] / ww : kk[size_t(x)]) : 0.0;
      c.k[size_t(xx) * c.ksize + x] =
          w < 0 ? int(-0.5 + w * (1 << kPrecisionBits)) : int(0.5 + w * (1 << kPrecisionBits));
    }
    c.bounds[size_t(xx) * 2] = xmin;
    c.bounds[size_t(xx) * 2 + 1] = xmax;
  }
  return c;
}

uint8_t clip8(int v) {
  const int s = v >> kPrecisionBits;  // arithmetic shift: floor
  return uint8_t(s < 0 ? 0 : s > 255 ? 255 : s);
}

}  // namespace

RgbImage resize_bicubic(const RgbImage& in, int width, int height) {
  if (width == in.width && height == in.height) return in;
  const Coeffs ch = coeffs(in.width, width), cv = coeffs(in.height, height);
  const bool need_h = width != in.width, need_v = height != in.height;
  // Horizontal pass over the source rows the vertical pass reads (ImagingResampleInner).
  const int y_first = cv.bounds[0];
  const int y_last = cv.bounds[size_t(height) * 2 - 2] + cv.bounds[size_t(height) * 2 - 1];
  RgbImage tmp;
  const RgbImage* src = &in;
  int row_shift = 0;
  if (need_h) {
    tmp.width = width;
    tmp.height = y_last - y_first;
    tmp.rgb.resize(size_t(tmp.width) * tmp.height * 3);
    for (int y = 0; y < tmp.height; ++y) {
      const uint8_t* row = in.rgb.data() + size_t(y + y_first) * in.width * 3;
      for (int xx = 0; xx < width; ++xx) {
        const int xmin = ch.bounds[size_t(xx) * 2], xmax = ch.bounds[size_t(xx) * 2 + 1];
        const int* k = ch.k.data() + size_t(xx) * ch.ksize;
        for (int c = 0; c < 3; ++c) {
          int ss = 1 << (kPrecisionBits - 1);
          for (int x = 0; x < xmax; ++x) ss += int(row[size_t(x + xmin) * 3 + c]) * k[x];
          tmp.rgb[(size_t(y) * width + xx) * 3 + c] = clip8(ss);
        }
      }
    }
    src = &tmp;
    row_shift = y_first;
  }
  if (!need_v) return tmp;
  RgbImage out;
  out.width = width;
  out.height = height;
  out.rgb.resize(size_t(width) * height * 3);
  for (int yy = 0; yy < height; ++yy) {
    const int ymin = cv.bounds[size_t(yy) * 2] - row_shift, ymax = cv.bounds[size_t(yy) * 2 + 1];
    const int* k = cv.k.data() + size_t(yy) * cv.ksize;
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < 3; ++c) {
        int ss = 1 << (kPrecisionBits - 1);
        for (int y = 0; y < ymax; ++y) ss += int(src->rgb[(size_t(y + ymin) * width + x) * 3 + c]) * k[y];
        out.rgb[(size_t(yy) * width + x) * 3 + c] = clip8(ss);
      }
    }
  }
  return out;
}

}  // namespace g4
