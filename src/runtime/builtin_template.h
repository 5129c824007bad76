// Chat templates built into the binary, so that a base model chats without a template file.
#pragma once
#include <string>
#include <string_view>

#include "runtime/bundle.h"

namespace g4 {

// templates/gemma3_chat.jinja, embedded at build time: Gemma 3's turn format.
std::string_view gemma3_turn_template_source();

// When `b` has no chat template of its own and its vocabulary holds Gemma 3's turn markers
// (<start_of_turn>, <end_of_turn>: the starter model and other Gemma 3 base models), gives it the
// built-in Gemma 3 turn template and returns a one-line note saying so; otherwise leaves `b` as it
// is and returns "". Answers then end at <end_of_turn> (one of b.stop_ids).
Result<std::string> adopt_builtin_chat_template(ModelBundle& b);

}  // namespace g4
