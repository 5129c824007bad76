// Blocking text generation through the engine, for the CLI and tests: submits one request,
// turns its tokens into TextEvents (runtime/text_stream.h) on the calling thread, cancels when a
// stop string completes or `interrupt` becomes true, and reports counts and timings.
#pragma once
#include <atomic>
#include <functional>
#include <string>

#include "runtime/engine.h"
#include "runtime/text_stream.h"

namespace g4 {

struct GenerationResult {
  FinishReason reason = FinishReason::None;
  bool stopped_by_string = false;
  int prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  double prefill_seconds = 0;  // submit -> first token
  double decode_seconds = 0;   // first token -> last token
  std::vector<int32_t> tokens; // generated ids (stop token included when it ended the turn)
  std::string error;
};

GenerationResult run_generation(Engine& engine, GenerationSpec spec, TextStream& stream,
                                const std::function<void(const TextEvent&)>& on_text,
                                const std::atomic<bool>* interrupt = nullptr);

}  // namespace g4
