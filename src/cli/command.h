// Verbs of the `gemma4` binary. Each verb lives in its own src/cli/cmd_<verb>.cpp and registers
// itself with G4_COMMAND; main.cpp only dispatches. A verb returns the process exit code and
// prints errors as one line on stderr ("gemma4 <verb>: <message>").
#pragma once
#include <map>
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

// A verb's parsed command line (cli/options.h fills it): the values given, in order, and the
// declared defaults of the options not given.
struct Args {
  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> flags;  // in order; value "" for switches
  std::map<std::string, std::string> defaults;             // option -> declared default
  bool has(const std::string& name) const;                 // given on the command line
  // The last value given, else the declared default, else `def`.
  std::string get(const std::string& name, const std::string& def = "") const;
};

}  // namespace g4::cli

#define G4_COMMAND(name, summary, fn) \
  static const bool g4_cmd_registered_##fn = ::g4::cli::register_command({name, summary, fn})
