// gemma4: one binary with verbs (run, generate, logits, info, bench, serve, tokenize, ...).
// `gemma4 --help` lists the verbs, `gemma4 VERB --help` (or `gemma4 help VERB`) a verb's options,
// `gemma4 --version` the version and the backends of this build; all on stdout, exit 0.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/progress_bar.h"
#include "core/crash_report.h"

#ifndef G4_VERSION
#define G4_VERSION "unknown"
#endif
#ifndef G4_GIT_REV
#define G4_GIT_REV "unknown"
#endif

namespace g4::cli {

std::vector<CommandInfo>& registry() {
  static std::vector<CommandInfo> r;
  return r;
}
bool register_command(const CommandInfo& c) {
  registry().push_back(c);
  return true;
}
const std::vector<CommandInfo>& commands() { return registry(); }

bool Args::has(const std::string& name) const {
  for (auto& f : flags)
    if (f.first == name) return true;
  return false;
}
std::string Args::get(const std::string& name, const std::string& def) const {
  for (auto it = flags.rbegin(); it != flags.rend(); ++it)
    if (it->first == name) return it->second;
  if (auto d = defaults.find(name); d != defaults.end()) return d->second;
  return def;
}

}  // namespace g4::cli

static void usage(FILE* out) {
  std::fprintf(out, "gemma4 %s: run Gemma 4 (and Gemma 3) models\n\nusage: gemma4 <verb> [options]\n\nverbs:\n",
               G4_VERSION);
  for (const auto& c : g4::cli::commands()) std::fprintf(out, "  %-12s %s\n", c.name, c.summary);
  std::fprintf(out,
               "\n`gemma4 VERB --help` (or `gemma4 help VERB`) lists a verb's options with their defaults.\n"
               "Without --model (-m), model verbs use the starter model (Gemma 3 270M).\n"
               "  gemma4 run                      interactive chat\n"
               "  gemma4 run -n 64 \"Hello!\"       one answer, at most 64 tokens\n"
               "  gemma4 serve --port 8080        API server and web chat page at http://127.0.0.1:8080/\n"
               "  gemma4 fit -m MODEL -c 32768    does it fit this machine?\n");
}

static void version() {
  std::printf("gemma4 %s (git %s)\nbackends: cpu, reference, ggml%s\n", G4_VERSION, G4_GIT_REV,
#ifdef G4_BUILD_CUDA
              ", cuda"
#else
              " (no cuda: build with `make build-cuda`)"
#endif
  );
}

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string first = argv[1];
  if (first == "--help" || first == "-h") {
    usage(stdout);
    return 0;
  }
  if (first == "--version" || first == "-V" || first == "version") {
    version();
    return 0;
  }
  g4::install_crash_report("gemma4");
  g4::cli::install_progress_bar();
  std::vector<std::string> args(argv + 2, argv + argc);
  std::string verb = first;
  if (verb == "help") {  // gemma4 help [VERB]
    if (args.empty()) {
      usage(stdout);
      return 0;
    }
    verb = args[0];
    args = {"--help"};
  }
  for (const auto& c : g4::cli::commands())
    if (c.name == verb) return c.fn(args);
  std::fprintf(stderr, "gemma4: unknown verb '%s'\n\n", verb.c_str());
  usage(stderr);
  return 2;
}
