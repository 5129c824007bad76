// gemma4 run [--model PATH] [PROMPT]      chat through the model's own chat template
// gemma4 generate [--model PATH] "text"   continue raw text (no template)
//
// run: with a PROMPT, one streamed answer; without, an interactive multi-turn chat (history
// kept; /reset clears it, /exit or Ctrl-D leaves; Ctrl-C stops the current answer, not the
// program). Flags: --system TEXT, --thinking on|off, --max-tokens, sampling flags
// (cli/text_args.h), --seed, --threads, --backend, --context N, --chat-template FILE,
// --kv-bits N [--kv-group-size G --quantized-kv-start T], --adapter-path DIR,
// --draft-model DIR [--draft-tokens N] (speculative decoding; cli/common.h); --image F1[,F2...]
// [--max-soft-tokens N] (images with the first message, for checkpoints with a vision encoder). A model without a chat template
// (a base model) is said to be one, and its prompts are completed as raw text instead.
// Load progress goes to stderr, and so do the prompt / decode speeds after each answer.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/text_args.h"
#include "core/thread_pool.h"
#include "runtime/bundle.h"
#include "runtime/generate.h"
#include "runtime/image_prompt.h"

namespace g4::cli {
namespace {

std::atomic<bool> g_interrupt{false};
void on_sigint(int) { g_interrupt.store(true); }

void install_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocked read returns so the prompt can be redrawn
  sigaction(SIGINT, &sa, nullptr);
}

void progress(const std::string& m) { std::fprintf(stderr, "[gemma4] %s\n", m.c_str()); }

struct Session {
  ModelBundle b;
  std::unique_ptr<Engine> engine;
  TextArgs text;
  bool color = false;
  bool failed = false;  // the last answer ended in an error (one-shot runs exit with 1)
};

Result<Session> open_session(const Args& a) {
  G4_TRY(apply_process_flags(a));
  Session s;
  G4_ASSIGN_OR_RETURN(BackendOptions bo, backend_options_from_args(a));
  G4_ASSIGN_OR_RETURN(s.b, load_bundle(a.get("--model"), a.get("--backend", "cpu"), progress, bo));
  if (a.has("--chat-template")) {  // a template file overrides the model's own (or adds one)
    G4_ASSIGN_OR_RETURN(ChatTemplate ct, ChatTemplate::from_file(a.get("--chat-template")));
    s.b.chat_template = std::move(ct);
  }
  G4_ASSIGN_OR_RETURN(s.text, parse_text_args(a, s.b.model->config()));
  EngineOptions eo;
  G4_TRY(apply_model_flags(a, *s.b.model, eo.precision));
  eo.parallel = 1;
  eo.max_context = std::atoi(a.get("--context", "8192").c_str());
  if (eo.max_context <= 0) return err("--context must be positive");
  s.engine = std::make_unique<Engine>(*s.b.model, eo);
  s.color = isatty(STDOUT_FILENO);
  progress("ready: " + s.b.name + " (" + s.b.format + ", " +
           std::to_string(s.b.model->config().n_layers) + " layers, " + std::to_string(num_threads()) +
           " threads)");
  return s;
}

// Streams one completion of `prompt` ids; prints the text; returns the visible answer text.
std::string answer(Session& s, std::vector<int32_t> prompt, bool chat, bool reasoning_open,
                   const std::vector<ImageInput>& images = {}, int max_soft_tokens = 0) {
  GenerationSpec spec;
  spec.prompt = std::move(prompt);
  s.failed = false;
  if (!images.empty()) {
    if (Status st = attach_images(*s.b.vision, *s.engine, images, max_soft_tokens, spec); !st) {
      std::fprintf(stderr, "gemma4: %s\n", st.message().c_str());
      s.failed = true;
      return "";
    }
  }
  spec.sampling = s.text.sampling;
  spec.max_tokens = s.text.max_tokens;
  spec.stop_ids = s.b.stop_ids;
  TextStreamOptions to;
  to.stop_strings = s.text.stop;
  to.split_reasoning = chat;
  to.parse_tool_calls = false;
  to.reasoning_open_in_prompt = reasoning_open;
  TextStream stream(*s.b.tokenizer, to);
  std::string visible;
  bool in_reasoning = false;
  g_interrupt.store(false);
  const EngineStats before = s.engine->stats();
  auto res = run_generation(*s.engine, spec, stream, [&](const TextEvent& e) {
    if (e.kind == TextEvent::kReasoning) {
      if (!in_reasoning && s.color) std::fputs("\x1b[2m", stdout);
      in_reasoning = true;
    } else if (in_reasoning) {
      if (s.color) std::fputs("\x1b[0m", stdout);
      std::fputs("\n", stdout);
      in_reasoning = false;
    }
    if (e.kind != TextEvent::kToolCall) {
      std::fputs(e.text.c_str(), stdout);
      if (e.kind == TextEvent::kContent) visible += e.text;
    }
    std::fflush(stdout);
  }, &g_interrupt);
  if (in_reasoning && s.color) std::fputs("\x1b[0m", stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (res.reason == FinishReason::Error) {
    std::fprintf(stderr, "gemma4: %s\n", res.error.c_str());
    s.failed = true;
    return visible;
  }
  const int computed = res.prompt_tokens - res.cached_tokens;
  const EngineStats after = s.engine->stats();
  std::string drafts;
  if (after.draft_rounds > before.draft_rounds) {
    const auto rounds = after.draft_rounds - before.draft_rounds;
    const auto drafted = after.drafted_tokens - before.drafted_tokens;
    const auto accepted = after.accepted_tokens - before.accepted_tokens;
    drafts = " | drafts: " + std::to_string(accepted) + " of " + std::to_string(drafted) + " accepted in " +
             std::to_string(rounds) + " rounds";
  }
  std::fprintf(stderr, "[gemma4] prompt: %d tokens (%d cached), %.1f tok/s | decode: %d tokens, %.1f tok/s%s%s\n",
               res.prompt_tokens, res.cached_tokens,
               res.prefill_seconds > 0 ? computed / res.prefill_seconds : 0.0, res.completion_tokens,
               res.decode_seconds > 0 && res.completion_tokens > 1
                   ? (res.completion_tokens - 1) / res.decode_seconds : 0.0,
               drafts.c_str(), res.reason == FinishReason::Cancelled ? " (stopped)" : "");
  return visible;
}

Result<std::vector<int32_t>> chat_prompt(Session& s, const nlohmann::ordered_json& messages,
                                         const std::string& thinking, bool* reasoning_open) {
  ChatRenderOptions ro = s.b.render_defaults;
  ro.add_generation_prompt = true;
  if (thinking == "on") ro.enable_thinking = true;
  if (thinking == "off") ro.enable_thinking = false;
  G4_ASSIGN_OR_RETURN(std::string text, s.b.chat_template->render(messages, nullptr, ro));
  *reasoning_open = prompt_opens_reasoning(text);
  return encode_chat_prompt(s.b, text);
}

int cmd_run(const std::vector<std::string>& argv) {
  Args a = parse_args(argv);
  static constexpr const char* kOwn[] = {"--chat-template", "--context", "--system", "--thinking"};
  if (Status s = reject_unknown_flags(a, {kLoadFlags, kModelOptionFlags, kTextFlags, kImageFlags, kOwn}, true); !s)
    return fail("run", s.message());
  const std::string thinking = a.get("--thinking", "off");
  if (thinking != "on" && thinking != "off") return fail("run", "--thinking: expected on or off");
  auto sr = open_session(a);
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
  bool images_sent = false;
  nlohmann::ordered_json history = nlohmann::ordered_json::array();
  const std::string system = a.get("--system");
  auto reset = [&] {
    history = nlohmann::ordered_json::array();
    if (!system.empty()) history.push_back({{"role", "system"}, {"content", system}});
  };
  reset();
  auto turn = [&](const std::string& user) -> int {
    if (!chat) {
      std::string prompt = system.empty() ? user : system + "\n\n" + user;
      answer(s, encode_raw_prompt(s.b, prompt), false, false);
      return s.failed ? 1 : 0;
    }
    if (!images.empty() && !images_sent) {
      nlohmann::ordered_json parts = nlohmann::ordered_json::array();
      for (size_t i = 0; i < images.size(); ++i) parts.push_back({{"type", "image"}});
      parts.push_back({{"type", "text"}, {"text", user}});
      history.push_back({{"role", "user"}, {"content", parts}});
      images_sent = true;
    } else {
      history.push_back({{"role", "user"}, {"content", user}});
    }
    bool open = false;
    auto ids = chat_prompt(s, history, thinking, &open);
    if (!ids) {
      history.erase(history.end() - 1);
      return fail("run", ids.message());
    }
    std::string reply = answer(s, ids.value(), true, open, images_sent ? images : std::vector<ImageInput>{},
                               mst.value());
    if (s.failed) {  // keep the history as it was before this message
      history.erase(history.end() - 1);
      // The images travel with the first user message: if that one failed, the next one takes them.
      images_sent = images_sent && history.size() > (system.empty() ? 0u : 1u);
      return 1;
    }
    history.push_back({{"role", "assistant"}, {"content", reply}});
    return 0;
  };
  if (!a.positional.empty()) {
    std::string prompt;
    for (const auto& p : a.positional) prompt += (prompt.empty() ? "" : " ") + p;
    return turn(prompt);
  }
  std::fprintf(stderr, "[gemma4] interactive chat: /reset clears the history, /exit or Ctrl-D leaves, "
               "Ctrl-C stops an answer.\n");
  for (;;) {
    std::fputs(s.color ? "\x1b[1m> \x1b[0m" : "> ", stdout);
    std::fflush(stdout);
    std::string line;
    g_interrupt.store(false);
    if (!std::getline(std::cin, line)) {
      if (g_interrupt.load() && !std::cin.eof()) {  // Ctrl-C at the prompt: new prompt
        std::cin.clear();
        std::fputs("\n", stdout);
        continue;
      }
      std::fputs("\n", stdout);
      return 0;
    }
    if (line == "/exit" || line == "/quit") return 0;
    if (line == "/reset") {
      reset();
      images_sent = false;
      std::fprintf(stderr, "[gemma4] history cleared\n");
      continue;
    }
    if (line.empty()) continue;
    turn(line);
  }
}

int cmd_generate(const std::vector<std::string>& argv) {
  Args a = parse_args(argv);
  static constexpr const char* kOwn[] = {"--context"};  // raw text: no template, system turn or thinking
  if (Status s = reject_unknown_flags(a, {kLoadFlags, kModelOptionFlags, kTextFlags, kOwn}, true); !s)
    return fail("generate", s.message());
  if (a.positional.empty()) return fail("generate", "give the text to continue");
  auto sr = open_session(a);
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
