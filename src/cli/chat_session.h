// A loaded model ready to answer, shared by `run` (one answer or the interactive chat) and
// `generate`: the bundle, its engine, the generation settings, and Ctrl-C handling.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/options.h"
#include "cli/text_args.h"
#include "runtime/bundle.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/image_prompt.h"

namespace g4::cli {

// The options of run and generate: loading, model options, generation, -c/--context.
void add_session_options(VerbCli& cli);

// Set by SIGINT (Ctrl-C) once install_sigint() ran; an answer in progress stops at it and the line
// editor clears its line. Cleared by whoever acts on it.
std::atomic<bool>& interrupt_flag();
void install_sigint();

struct Session {
  ModelBundle b;
  std::unique_ptr<Engine> engine;
  TextArgs text;
  int max_context = 0;       // tokens a conversation may hold (prompt + answer)
  bool color = false;        // stdout is a terminal
  bool failed = false;       // the last answer ended in an error (one-shot runs exit with 1)
  GenerationResult last;     // of the last answer
};

// Loads the model of `a` (progress on stderr), applies --chat-template (or, for a Gemma 3 base
// model when `chat` is set, the built-in turn template, said once on stderr), the model options
// and the generation options. -c/--context beyond the model's positions is refused, naming both.
Result<Session> open_session(const Args& a, bool chat);

// Streams one completion of `prompt` to stdout and returns the visible answer text (reasoning
// shown dimmed on a terminal, not returned). Speeds go to stderr. Ctrl-C stops it.
std::string answer(Session& s, std::vector<int32_t> prompt, bool chat, bool reasoning_open,
                   const std::vector<ImageInput>& images = {}, int max_soft_tokens = 0);

// The prompt ids of `messages` through the session's chat template (with the generation prompt);
// *reasoning_open: the rendered prompt leaves a reasoning block open.
Result<std::vector<int32_t>> chat_prompt(Session& s, const nlohmann::ordered_json& messages, bool thinking,
                                         bool* reasoning_open);

}  // namespace g4::cli
