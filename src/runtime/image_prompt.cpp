#include "runtime/image_prompt.h"

namespace g4 {

Status attach_images(VisionEncoder& enc, Engine& engine, const std::vector<ImageInput>& images, int max_soft_tokens,
                     GenerationSpec& spec) {
  G4_TRY(enc.usable_for_prompts(engine.model().backend()));
  std::vector<PatchGrid> grids;
  std::vector<int> counts;
  for (const ImageInput& im : images) {
    G4_ASSIGN_OR_RETURN(RgbImage img, decode_image(im.bytes, im.label));
    auto g = enc.patches(img, max_soft_tokens);
    if (!g) return err("%s: %s", im.label.c_str(), g.message().c_str());
    counts.push_back(enc.soft_tokens(g.value()));
    grids.push_back(std::move(g).value());
  }
  G4_ASSIGN_OR_RETURN(spec.prompt, enc.expand_image_tokens(spec.prompt, counts));
  spec.soft.clear();
  Status failed = Status::ok();
  G4_TRY(engine.run_exclusive([&] {
    for (size_t i = 0; i < grids.size() && failed; ++i) {
      auto f = enc.encode(grids[i]);
      if (!f) {
        failed = err("%s: %s", images[i].label.c_str(), f.message().c_str());
        return;
      }
      spec.soft.insert(spec.soft.end(), f->begin(), f->end());
    }
  }));
  return failed;
}

}  // namespace g4
