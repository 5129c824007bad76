// Flags shared by the text-generating verbs (run, generate, serve defaults):
//   --max-tokens N  --temp/--temperature T  --top-k K  --top-p P  --min-p P
//   --repetition-penalty R  --presence-penalty P  --frequency-penalty F  --seed S
//   --stop STR (repeatable)  --logit-bias ID=BIAS (repeatable)
#pragma once
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/status.h"
#include "core/config.h"
#include "sampling/sampler.h"

namespace g4::cli {

struct TextArgs {
  SamplingParams sampling;
  int max_tokens = 512;  // -n/--max-tokens (declared in cli/options.cpp) when given
  std::vector<std::string> stop;
};

// Defaults come from the model's generation_config (temperature/top-k/top-p) when it has one,
// else greedy decoding (mlx-lm's default); flags override.
Result<TextArgs> parse_text_args(const Args& a, const ModelConfig& cfg);

}  // namespace g4::cli
