// gemma4 vision --model DIR --image FILE [--max-soft-tokens N] [--pixels-out F.npy]
//                [--positions-out F.npy] [--pooled-out F.npy] [--features-out F.npy]
// Checking tool for image input (vision/): decodes and preprocesses the image as HF's
// Gemma4ImageProcessor does and runs the vision encoder. Prints one JSON object: the image size,
// the resized size, the patch grid and the number of soft tokens; the flags write the patch
// pixels [patches, 768], positions [patches, 2] (x, y), the pooled encoder output
// [soft tokens, hidden] and the text-space features [soft tokens, text hidden] as .npy.
#include <cstdio>

#include "cli/common.h"
#include "cli/options.h"
#include "vision/image.h"
#include "vision/vision_encoder.h"

namespace g4::cli {
namespace {

int cmd_vision(const std::vector<std::string>& argv) {
  VerbCli cli("vision", "Image-input check: HF-exact preprocessing and the vision encoder's outputs, as JSON.");
  add_load_options(cli);
  add_image_options(cli);
  cli.app().get_option("--image")->required();
  cli.value("--pixels-out", "write the patch pixels [patches, 768]")->type_name("F.npy");
  cli.value("--positions-out", "write the patch positions [patches, 2]")->type_name("F.npy");
  cli.value("--pooled-out", "write the pooled encoder output [soft tokens, hidden]")->type_name("F.npy");
  cli.value("--features-out", "write the text-space features [soft tokens, text hidden]")->type_name("F.npy");
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  if (Status s = apply_process_flags(a); !s) return fail("vision", s.message());
  auto be = make_backend(a.get("--backend"));
  if (!be) return fail("vision", "unknown or unavailable backend '" + a.get("--backend") + "'");
  auto enc = VisionEncoder::load(a.get("--model"), *be);
  if (!enc) return fail("vision", enc.message());
  VisionEncoder& v = *enc.value();
  auto img = load_image_file(a.get("--image"));
  if (!img) return fail("vision", img.message());
  auto mst = int_flag(a, "--max-soft-tokens", 0, 0, 1120);
  if (!mst) return fail("vision", mst.message());
  auto g = v.patches(img.value(), mst.value());
  if (!g) return fail("vision", a.get("--image") + ": " + g.message());
  const PatchGrid& grid = g.value();
  std::vector<float> pooled;
  auto feats = v.encode(grid, &pooled);
  if (!feats) return fail("vision", feats.message());
  const size_t n = size_t(grid.patches()), per = grid.pixels.size() / std::max<size_t>(n, 1);
  const size_t soft = size_t(v.soft_tokens(grid));
  std::vector<float> pos(n * 2);
  for (size_t i = 0; i < n; ++i) {
    pos[2 * i] = float(grid.pos_x[i]);
    pos[2 * i + 1] = float(grid.pos_y[i]);
  }
  struct Out {
    const char* flag;
    const std::vector<float>* data;
    size_t rows;
  };
  for (const Out& o : {Out{"--pixels-out", &grid.pixels, n}, Out{"--positions-out", &pos, n},
                       Out{"--pooled-out", &pooled, soft}, Out{"--features-out", &feats.value(), soft}}) {
    if (!a.has(o.flag)) continue;
    Status st = write_npy(a.get(o.flag), o.data->data(), o.rows, o.rows ? o.data->size() / o.rows : 0);
    if (!st) return fail("vision", st.message());
  }
  std::printf("{\"width\": %d, \"height\": %d, \"resized\": [%d, %d], \"patch_grid\": [%d, %d], \"patch_values\": %zu, "
              "\"soft_tokens\": %zu}\n",
              img->width, img->height, grid.rows * grid.patch, grid.cols * grid.patch, grid.rows, grid.cols, per, soft);
  return 0;
}

}  // namespace
G4_COMMAND("vision", "image input check: preprocessing and vision-encoder outputs as .npy", cmd_vision);
}  // namespace g4::cli
