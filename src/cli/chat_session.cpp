#include "cli/chat_session.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>

#include "cli/common.h"
#include "cli/memory_plan.h"
#include "core/thread_pool.h"
#include "runtime/builtin_template.h"
#include "runtime/image_prompt.h"
#include "server/api_types.h"

namespace g4::cli {
namespace {

void on_sigint(int) { interrupt_flag().store(true); }

void progress(const std::string& m) { std::fprintf(stderr, "[gemma4] %s\n", m.c_str()); }

}  // namespace

void add_session_options(VerbCli& cli) {
  add_load_options(cli);
  add_model_options(cli);
  add_text_options(cli);
  add_context_option(cli, "8192", "context length in tokens (prompt + answer), at most the model's positions");
  add_decode_ahead_option(cli);
}

std::atomic<bool>& interrupt_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}

void install_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocked read returns so the prompt can be redrawn
  sigaction(SIGINT, &sa, nullptr);
}

Result<Session> open_session(const Args& a, bool chat) {
  G4_TRY(apply_process_flags(a));
  PlanInput plan;  // checked against the machine before anything loads
  plan.context = std::stoi(a.get("--context"));
  plan.kv_bits = a.has("--kv-bits") ? std::stoi(a.get("--kv-bits")) : 0;
  plan.kv_group = std::stoi(a.get("--kv-group-size"));
  plan.kv_elem_bytes = a.get("--dtype") == "f32" ? 4 : 0;  // device backends store bf16 unless --dtype f32
  plan.chunk = auto_prefill_chunk(a, EngineOptions{}.prefill_chunk);
  G4_ASSIGN_OR_RETURN(BackendOptions bo, backend_options_from_args(a));
  plan.place(bo);
  G4_ASSIGN_OR_RETURN(FitReport fit, plan_fit(a.get("--model"), a.get("--backend"), plan, a.has("--context")));
  G4_TRY(refuse_if_not_fitting(fit, "--context"));
  Session s;
  G4_ASSIGN_OR_RETURN(s.b, load_bundle(a.get("--model"), a.get("--backend"), progress, bo));
  if (a.has("--chat-template")) {  // a template file overrides the model's own (or adds one)
    G4_ASSIGN_OR_RETURN(ChatTemplate ct, ChatTemplate::from_file(a.get("--chat-template")));
    s.b.chat_template = std::move(ct);
  } else if (chat) {
    G4_ASSIGN_OR_RETURN(std::string note, adopt_builtin_chat_template(s.b));
    if (!note.empty()) progress("note: " + note);
  }
  const ModelConfig& cfg = s.b.model->config();
  G4_ASSIGN_OR_RETURN(s.text, parse_text_args(a, cfg));
  EngineOptions eo;
  G4_TRY(apply_model_flags(a, *s.b.model, eo.precision));
  eo.parallel = 1;
  if (a.get("--decode-ahead") == "off") eo.decode_ahead = EngineOptions::DecodeAhead::Off;
  eo.prefill_chunk = plan.chunk;
  eo.max_context = int(fit.input.context);
  s.max_context = eo.max_context;
  s.engine = std::make_unique<Engine>(*s.b.model, eo);
  s.color = isatty(STDOUT_FILENO);
  progress("ready: " + s.b.name + " (" + s.b.format + ", " + std::to_string(cfg.n_layers) + " layers, " +
           std::to_string(num_threads()) + " threads, context " + std::to_string(s.max_context) + ")");
  return s;
}

std::string answer(Session& s, std::vector<int32_t> prompt, bool chat, bool reasoning_open,
                   const std::vector<ImageInput>& images, int max_soft_tokens) {
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
  interrupt_flag().store(false);
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
  }, &interrupt_flag());
  if (in_reasoning && s.color) std::fputs("\x1b[0m", stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  s.last = res;
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

Result<std::vector<int32_t>> chat_prompt(Session& s, const nlohmann::ordered_json& messages, bool thinking,
                                         bool* reasoning_open) {
  ChatRenderOptions ro = s.b.render_defaults;
  ro.add_generation_prompt = true;
  ro.enable_thinking = thinking;
  // What the user typed stays text: a "<start_of_turn>" in a message is not a turn marker (as in
  // serve without --allow-special-in-content); only the template's own markup is special.
  G4_ASSIGN_OR_RETURN(std::string text,
                      s.b.chat_template->render(server::mark_literal_strings(messages, *s.b.tokenizer), nullptr, ro));
  *reasoning_open = prompt_opens_reasoning(text);
  const std::vector<int> ids = s.b.tokenizer->encode_marked(text);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

}  // namespace g4::cli
