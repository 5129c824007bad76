// Verbs of the `gemma4` binary. Each verb lives in its own src/cli/cmd_<verb>.cpp and registers
// itself with G4_COMMAND; main.cpp only dispatches. A verb returns the process exit code and
// prints errors as one line on stderr ("gemma4 <verb>: <message>").
#pragma once
#include <string>
#include <vector>

namespace g4::cli {

using CommandFn = int (*)(const std::vector<std::string>& args);

struct CommandInfo {
  const char* name;
  const char* summary;
  CommandFn fn;
};

bool register_command(const CommandInfo& c);
const std::vector<CommandInfo>& commands();

// Small argument helpers shared by verbs: "--flag value" / "--flag=value".
struct Args {
  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> flags;  // in order; value "" for bare flags
  bool has(const std::string& name) const;
  std::string get(const std::string& name, const std::string& def = "") const;
};
// `bare` lists flags that take no value.
Args parse_args(const std::vector<std::string>& argv, const std::vector<std::string>& bare = {});

}  // namespace g4::cli

#define G4_COMMAND(name, summary, fn) \
  static const bool g4_cmd_registered_##fn = ::g4::cli::register_command({name, summary, fn})
