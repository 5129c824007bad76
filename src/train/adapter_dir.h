// The output directory of `gemma4 lora` (--adapter-path): an adapter the user already has there is
// never replaced without being asked. A directory holding adapter_config.json or
// adapters.safetensors is refused unless the run resumes it (--resume: its weights are the start,
// its LoRA settings must equal this run's) or replaces it (--overwrite: the old weights are
// removed before the new config is written, so an interrupted run never leaves a new config
// beside old weights).
#pragma once
#include <optional>
#include <string>

#include "core/status.h"
#include "train/lora_params.h"

namespace g4::train {

enum class ExistingAdapter { Refuse, Resume, Overwrite };

// Checks and prepares `dir` (created when missing). Returns the weights file to resume from
// (mode Resume), else nullopt. Errors name the directory and say which flag would proceed.
Result<std::optional<std::string>> prepare_adapter_dir(const std::string& dir, ExistingAdapter mode,
                                                       const LoraConfig& lc);

}  // namespace g4::train
