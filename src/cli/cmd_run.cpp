// gemma4 run [-m PATH] [PROMPT]          chat through the model's chat template
// gemma4 generate [-m PATH] "text"        continue raw text (no template)
//
// run: with a PROMPT (or -p), one streamed answer; without, the interactive chat (cli/chat_repl.h).
// A model without a chat template is a base model: a Gemma 3 one (the starter) chats through
// the built-in Gemma 3 turn template (runtime/builtin_template.h), others are said to be base
// models and their prompts completed as raw text. --image F1[,F2...] go with the first message.
// Options: `gemma4 run --help` (cli/options.h declares the shared ones). Load progress goes to
// stderr, and so do the prompt / decode speeds after each answer.
#include <cstdio>

#include "cli/chat_repl.h"
#include "cli/chat_session.h"
#include "cli/common.h"
#include "cli/conversation.h"
#include "runtime/image_prompt.h"

namespace g4::cli {
namespace {

int cmd_run(const std::vector<std::string>& argv) {
  VerbCli cli("run", "Chat with a model through its chat template: one answer to PROMPT, or an interactive chat "
              "without one.");
  add_session_options(cli);
  add_image_options(cli);
  add_chat_template_option(cli);
  cli.value("--system", "system prompt")->type_name("TEXT");
  cli.value("--thinking", "let the model reason before answering (models with a thinking mode)", "off")
      ->type_name("on|off")->check(one_of({"on", "off"}));
  cli.value("-p,--prompt", "the prompt (instead of the words after the options)")->type_name("TEXT");
  cli.words("PROMPT", "the prompt; without one (and without -p), an interactive chat");
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  if (a.has("--prompt")) a.positional.insert(a.positional.begin(), a.get("--prompt"));
  auto sr = open_session(a, /*chat=*/true);
  if (!sr) return fail("run", sr.message());
  Session& s = sr.value();
  install_sigint();
  const bool chat = s.b.chat_template.has_value();
  if (!chat)
    std::fprintf(stderr, "[gemma4] note: %s has no chat template: it is a base (pre-trained) model, "
                 "so prompts are completed as raw text instead of answered as a chat.\n",
                 s.b.name.c_str());
  // --image F1[,F2...]: the images go with the first message and stay in the history.
  std::vector<ImageInput> images;
  if (a.has("--image")) {
    if (!s.b.vision)
      return fail("run", s.b.name + " has no vision encoder: --image needs a Gemma 4 safetensors checkpoint with one" +
                             (s.b.format == "gguf" ? " (a GGUF file's vision tower is a separate mmproj file, not read yet)" : ""));
    if (!chat) return fail("run", "--image needs a chat model (this one has no chat template)");
    auto read = read_image_files(a.get("--image"));
    if (!read) return fail("run", read.message());
    images = std::move(read).value();
  }
  auto mst = int_flag(a, "--max-soft-tokens", 0, 0, 1120);
  if (!mst) return fail("run", mst.message());
  Conversation c(s, chat, a.get("--system"), a.get("--thinking") == "on", std::move(images), mst.value());
  if (!a.positional.empty()) {
    std::string prompt;
    for (const auto& p : a.positional) prompt += (prompt.empty() ? "" : " ") + p;
    return c.turn(prompt);
  }
  return run_chat_repl(c);
}

int cmd_generate(const std::vector<std::string>& argv) {
  VerbCli cli("generate", "Continue raw text (no chat template, system turn or thinking).");
  add_session_options(cli);
  cli.value("-p,--prompt", "the text to continue (instead of the words after the options)")->type_name("TEXT");
  cli.words("TEXT", "the text to continue");
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  if (a.has("--prompt")) a.positional.insert(a.positional.begin(), a.get("--prompt"));
  if (a.positional.empty()) return fail("generate", "give the text to continue");
  auto sr = open_session(a, /*chat=*/false);
  if (!sr) return fail("generate", sr.message());
  install_sigint();
  std::string prompt;
  for (const auto& p : a.positional) prompt += (prompt.empty() ? "" : " ") + p;
  std::fputs(prompt.c_str(), stdout);
  answer(sr.value(), encode_raw_prompt(sr.value().b, prompt), false, false);
  return sr.value().failed ? 1 : 0;
}

}  // namespace
G4_COMMAND("run", "chat with a model (interactive, or one answer to PROMPT)", cmd_run);
G4_COMMAND("generate", "continue raw text without a chat template", cmd_generate);
}  // namespace g4::cli
