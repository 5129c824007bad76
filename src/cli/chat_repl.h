// The interactive chat of `gemma4 run` (no prompt given): messages go to the model; lines that
// start with '/' are commands (/help lists them) and never reach it.
#pragma once
#include "cli/conversation.h"

namespace g4::cli {

// Reads messages until /exit or the end of input; returns the exit code (0).
int run_chat_repl(Conversation& c);

}  // namespace g4::cli
