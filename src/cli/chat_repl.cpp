#include "cli/chat_repl.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "cli/line_editor.h"
#include "core/thread_pool.h"

namespace g4::cli {
namespace {

constexpr const char* kHelp =
    "commands:\n"
    "  /help                 this list\n"
    "  /reset                forget the conversation (the system prompt stays)\n"
    "  /set                  show the settings\n"
    "  /set temperature T    sampling temperature (0: greedy)\n"
    "  /set top-p P          nucleus sampling mass (1: off)\n"
    "  /set top-k K          sample among the K most likely tokens (0: all)\n"
    "  /set max-tokens N     most tokens per answer\n"
    "  /set seed S           sampling seed\n"
    "  /set system TEXT      system prompt (\"/set system\" alone removes it)\n"
    "  /set thinking on|off  let the model reason first (models with a thinking mode)\n"
    "  /show                 model, context use, settings\n"
    "  /save FILE            write the conversation as JSON\n"
    "  /load FILE            continue a saved conversation\n"
    "  /exit, /quit, /bye    leave (also Ctrl-D)\n"
    "input: \"\"\" opens and closes a multi-line message; a line ending with \\ continues on the next.\n"
    "Ctrl-C stops an answer, or clears the line being typed.\n";

void say(const std::string& m) { std::fprintf(stderr, "[gemma4] %s\n", m.c_str()); }

std::string settings(Conversation& c) {
  const TextArgs& t = c.session().text;
  char buf[512];
  std::snprintf(buf, sizeof buf, "temperature %g, top-p %g, top-k %d, max-tokens %d, seed %s, thinking %s, system %s",
                double(t.sampling.temperature), double(t.sampling.top_p), t.sampling.top_k, t.max_tokens,
                t.sampling.has_seed ? std::to_string(t.sampling.seed).c_str() : "random", c.thinking() ? "on" : "off",
                c.system().empty() ? "(none)" : ("\"" + c.system() + "\"").c_str());
  return buf;
}

// A number for /set NAME VALUE in [lo, hi], or an error naming the setting.
Result<double> setting_number(const std::string& name, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(d >= lo && d <= hi))
    return err("/set %s: expected a number from %g to %g, got '%s'", name.c_str(), lo, hi, v.c_str());
  return d;
}

Status set(Conversation& c, const std::string& name, const std::string& value) {
  TextArgs& t = c.session().text;
  if (name == "system") {
    c.set_system(value);
    return Status::ok();
  }
  if (name == "thinking") {
    if (value != "on" && value != "off") return err("/set thinking: expected on or off, got '%s'", value.c_str());
    c.set_thinking(value == "on");
    return Status::ok();
  }
  if (name == "temperature" || name == "temp") {
    G4_ASSIGN_OR_RETURN(double d, setting_number(name, value, 0, 100));
    t.sampling.temperature = float(d);
  } else if (name == "top-p" || name == "top_p") {
    G4_ASSIGN_OR_RETURN(double d, setting_number(name, value, 0, 1));
    t.sampling.top_p = float(d);
  } else if (name == "top-k" || name == "top_k") {
    G4_ASSIGN_OR_RETURN(double d, setting_number(name, value, 0, 1 << 24));
    t.sampling.top_k = int(d);
  } else if (name == "max-tokens" || name == "max_tokens") {
    G4_ASSIGN_OR_RETURN(double d, setting_number(name, value, 1, 1 << 24));
    t.max_tokens = int(d);
  } else if (name == "seed") {
    G4_ASSIGN_OR_RETURN(double d, setting_number(name, value, 0, 1e18));
    t.sampling.seed = uint64_t(d);
    t.sampling.has_seed = true;
  } else {
    return err("/set %s: unknown setting (temperature, top-p, top-k, max-tokens, seed, system, thinking)",
               name.c_str());
  }
  return Status::ok();
}

void show(Conversation& c) {
  Session& s = c.session();
  const ModelConfig& cfg = s.b.model->config();
  std::fprintf(stderr,
               "model: %s (%s, %d layers, hidden %d, vocabulary %d, %.1f MiB of weights, backend %s, %d threads)\n"
               "chat template: %s\n"
               "context: %d of %d tokens used (%zu turns)\n"
               "settings: %s\n",
               s.b.name.c_str(), s.b.format.c_str(), cfg.n_layers, cfg.hidden, cfg.vocab,
               double(s.b.model->weights().weight_bytes) / (1 << 20), s.b.model->backend().name().c_str(),
               num_threads(), c.chat() ? "yes" : "none (raw completion)", c.context_tokens(), s.max_context, c.turns(),
               settings(c).c_str());
}

// Runs one /command line; returns false when the chat should end.
bool command(Conversation& c, const std::string& line) {
  std::istringstream in(line);
  std::string cmd;
  in >> cmd;
  std::string rest;
  std::getline(in, rest);
  if (const size_t b = rest.find_first_not_of(" \t"); b != std::string::npos) rest.erase(0, b);
  else rest.clear();
  if (cmd == "/exit" || cmd == "/quit" || cmd == "/bye") return false;
  if (cmd == "/help" || cmd == "/?") {
    std::fputs(kHelp, stderr);
  } else if (cmd == "/reset" || cmd == "/clear") {
    c.reset();
    say("history cleared");
  } else if (cmd == "/set") {
    if (rest.empty()) {
      say(settings(c));
    } else {
      const size_t sp = rest.find_first_of(" \t");
      const std::string name = rest.substr(0, sp);
      std::string value = sp == std::string::npos ? "" : rest.substr(rest.find_first_not_of(" \t", sp));
      if (Status st = set(c, name, value); !st) say(st.message());
      else say("set " + name + (value.empty() ? " (removed)" : " " + value));
    }
  } else if (cmd == "/show") {
    show(c);
  } else if (cmd == "/save" || cmd == "/load") {
    if (rest.empty()) {
      say(cmd + " needs a file name");
    } else if (Status st = cmd == "/save" ? c.save(rest) : c.load(rest); !st) {
      say(st.message());
    } else {
      say(cmd == "/save" ? "saved " + std::to_string(c.turns()) + " turns to " + rest
                         : "loaded " + std::to_string(c.turns()) + " turns from " + rest);
    }
  } else {
    say("unknown command " + cmd + ": /help lists the commands");
  }
  return true;
}

}  // namespace

int run_chat_repl(Conversation& c) {
  LineEditor editor(default_history_file());
  say(std::string("interactive chat: /help lists the commands, /exit or Ctrl-D leaves, Ctrl-C stops an answer") +
      (editor.interactive() ? ", \"\"\" opens a multi-line message." : "."));
  const std::string prompt = c.session().color ? "\001\x1b[1m\002> \001\x1b[0m\002" : "> ";
  for (;;) {
    auto msg = editor.read(prompt);
    if (!msg) {
      if (editor.interactive()) std::fputs("\n", stdout);
      return 0;
    }
    if (msg->empty()) continue;
    if ((*msg)[0] == '/' && msg->find('\n') == std::string::npos) {
      if (!command(c, *msg)) return 0;
      continue;
    }
    c.turn(*msg);
  }
}

}  // namespace g4::cli
