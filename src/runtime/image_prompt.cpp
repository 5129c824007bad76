#include "runtime/image_prompt.h"

#include <fstream>
#include <iterator>

namespace g4 {

Result<std::vector<ImageInput>> read_image_files(const std::string& list) {
  std::vector<ImageInput> out;
  for (size_t b = 0; b <= list.size();) {
    size_t e = list.find(',', b);
    if (e == std::string::npos) e = list.size();
    ImageInput im;
    im.label = list.substr(b, e - b);
    b = e + 1;
    std::ifstream f(im.label, std::ios::binary);
    if (!f) return err("%s: cannot open image", im.label.c_str());
    im.bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    out.push_back(std::move(im));
  }
  return out;
}

Result<std::vector<PatchGrid>> preprocess_images(const VisionEncoder& enc, const std::vector<ImageInput>& images,
                                                 int max_soft_tokens) {
  std::vector<PatchGrid> grids;
  for (const ImageInput& im : images) {
    G4_ASSIGN_OR_RETURN(RgbImage img, decode_image(im.bytes, im.label));
    auto g = enc.patches(img, max_soft_tokens);
    if (!g) return err("%s: %s", im.label.c_str(), g.message().c_str());
    grids.push_back(std::move(g).value());
  }
  return grids;
}

Result<std::vector<float>> encode_images(VisionEncoder& enc, const std::vector<PatchGrid>& grids,
                                         const std::vector<ImageInput>& images) {
  std::vector<float> soft;
  for (size_t i = 0; i < grids.size(); ++i) {
    auto f = enc.encode(grids[i]);
    if (!f) return err("%s: %s", images[i].label.c_str(), f.message().c_str());
    soft.insert(soft.end(), f->begin(), f->end());
  }
  return soft;
}

Status attach_images(VisionEncoder& enc, Engine& engine, const std::vector<ImageInput>& images, int max_soft_tokens,
                     GenerationSpec& spec) {
  G4_TRY(enc.usable_for_prompts(engine.model().backend()));
  G4_ASSIGN_OR_RETURN(std::vector<PatchGrid> grids, preprocess_images(enc, images, max_soft_tokens));
  std::vector<int> counts;
  for (const PatchGrid& g : grids) counts.push_back(enc.soft_tokens(g));
  G4_ASSIGN_OR_RETURN(spec.prompt, enc.expand_image_tokens(spec.prompt, counts));
  Result<std::vector<float>> soft = std::vector<float>{};
  G4_TRY(engine.run_exclusive([&] { soft = encode_images(enc, grids, images); }));
  if (!soft) return Error{soft.message()};
  spec.soft = std::move(soft).value();
  return Status::ok();
}

}  // namespace g4
