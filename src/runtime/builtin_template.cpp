#include "runtime/builtin_template.h"

namespace g4 {

std::string_view gemma3_turn_template_source() {
  static constexpr std::string_view kSource =
#include "gemma3_chat_jinja.inc"
      ;
  return kSource;
}

Result<std::string> adopt_builtin_chat_template(ModelBundle& b) {
  if (b.chat_template) return std::string();
  const Tokenizer& tok = *b.tokenizer;
  if (tok.id_of("<start_of_turn>") < 0 || tok.id_of("<end_of_turn>") < 0) return std::string();
  G4_ASSIGN_OR_RETURN(ChatTemplate ct, ChatTemplate::from_string(std::string(gemma3_turn_template_source()),
                                                                 "built-in templates/gemma3_chat.jinja"));
  b.chat_template = std::move(ct);
  return b.name + " is a base (pre-trained) model without a chat template: chatting through the built-in "
                  "Gemma 3 turn template (templates/gemma3_chat.jinja); --chat-template FILE gives another, "
                  "`gemma4 generate` completes raw text";
}

}  // namespace g4
