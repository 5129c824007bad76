// Prompts with images: each image token a chat template wrote (one per image) becomes
// boi + soft tokens + eoi (HF Gemma4Processor), and the images' features (vision encoder, run on
// the engine thread) fill GenerationSpec::soft in prompt order.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/engine.h"
#include "vision/vision_encoder.h"

namespace g4 {

struct ImageInput {
  std::string bytes;  // an encoded image file (PNG, JPEG, ...)
  std::string label;  // names it in errors ("messages[0].content[1]", a file name)
};

// Reads "F1,F2,..." (a --image flag) into ImageInputs labelled by file name.
Result<std::vector<ImageInput>> read_image_files(const std::string& comma_list);
// Decodes and preprocesses each image (max_soft_tokens 0: the model's default); errors name the
// image's label.
Result<std::vector<PatchGrid>> preprocess_images(const VisionEncoder& enc, const std::vector<ImageInput>& images,
                                                 int max_soft_tokens);
// The text-space features of every grid, concatenated ([k, hidden]); uses the encoder's backend.
Result<std::vector<float>> encode_images(VisionEncoder& enc, const std::vector<PatchGrid>& grids,
                                         const std::vector<ImageInput>& images);
// Decodes, preprocesses (max_soft_tokens 0: the model's default) and encodes `images`, expands
// the image tokens of spec.prompt and sets spec.soft. Errors name the image's label: undecodable
// data, sizes the encoder cannot take, a count of images that differs from the prompt's image
// tokens.
Status attach_images(VisionEncoder& enc, Engine& engine, const std::vector<ImageInput>& images, int max_soft_tokens,
                     GenerationSpec& spec);

}  // namespace g4
