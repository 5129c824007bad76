// The options of `gemma4 lora`: mlx_lm.lora's names and defaults (declared once, shown by --help).
#pragma once
#include "cli/options.h"

namespace g4::cli {

void add_lora_options(VerbCli& cli);

}  // namespace g4::cli
