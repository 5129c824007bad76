// gemma4: one binary with verbs (run, generate, logits, info, bench, serve, tokenize, ...).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/command.h"

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
  return def;
}
Args parse_args(const std::vector<std::string>& argv, const std::vector<std::string>& bare) {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s.size() > 2 && s.rfind("--", 0) == 0) {
      auto eq = s.find('=');
      if (eq != std::string::npos) {
        a.flags.emplace_back(s.substr(0, eq), s.substr(eq + 1));
        continue;
      }
      bool is_bare = false;
      for (auto& b : bare) is_bare |= (b == s);
      if (!is_bare && i + 1 < argv.size()) {
        a.flags.emplace_back(s, argv[++i]);
      } else {
        a.flags.emplace_back(s, "");
      }
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

}  // namespace g4::cli

static void usage() {
  std::fprintf(stderr, "usage: gemma4 <verb> [options]\n\nverbs:\n");
  for (const auto& c : g4::cli::commands()) std::fprintf(stderr, "  %-12s %s\n", c.name, c.summary);
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& c : g4::cli::commands())
    if (c.name == std::string(argv[1])) return c.fn(args);
  std::fprintf(stderr, "gemma4: unknown verb '%s'\n", argv[1]);
  usage();
  return 2;
}
