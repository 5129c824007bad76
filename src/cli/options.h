// The command line of one verb, declared through CLI11: every option with its names (long and,
// where llama.cpp users expect one, short), its default (shown by --help and returned by
// Args::get when the option is absent) and one line of meaning. Values with a fixed range or set
// are checked here, before anything loads. Parsed values land in Args (cli/command.h), which the
// shared helpers (cli/common.h, cli/text_args.h) read.
//
// A verb declares its own options in its cmd_<verb>.cpp and adds the shared groups below, which
// are each declared once, in options.cpp:
//
//   VerbCli cli("bench", "measure prefill/decode tok/s and peak memory");
//   add_load_options(cli);                        // -m/--model, --backend, -t/--threads, ...
//   add_model_options(cli);                       // --kv-bits ..., --adapter-path, --draft-model
//   cli.value("--prompt-tokens", "prompt length in tokens", "128")->check(CLI::Range(1, 1 << 24));
//   Args a;
//   if (int rc = cli.parse(argv, a); rc >= 0) return rc;   // --help (0) or a usage error (2)
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "cli/command.h"

namespace g4::cli {

class VerbCli {
 public:
  VerbCli(const std::string& verb, const std::string& summary);
  // An option that takes a value. `names`: "-m,--model" or "--model"; `def` (may be empty: no
  // default, or one computed at run time and described in `help`).
  CLI::Option* value(const std::string& names, const std::string& help, const std::string& def = "");
  // An option without a value (a switch).
  CLI::Option* flag(const std::string& names, const std::string& help);
  // The verb takes words besides its options (a prompt, a text to continue): they are collected,
  // as typed, into Args::positional. Without this, a word is an error.
  void words(const std::string& name, const std::string& help);
  // Starts a titled section of --help for the options declared next.
  void group(const std::string& title) { group_ = title; }
  CLI::App& app() { return app_; }
  const std::string& verb() const { return verb_; }

  // Parses argv (the words after the verb) into `out`. Returns -1 when the verb should go on;
  // otherwise the exit code it returns: 0 after --help (usage on stdout), 2 after a usage error
  // (one line on stderr, "gemma4 VERB: MESSAGE", naming the option).
  int parse(const std::vector<std::string>& argv, Args& out);

 private:
  std::string verb_;
  std::string group_ = "Options";
  bool words_ = false;
  CLI::App app_;
};

// A validator that accepts one of `choices`; otherwise "expected a, b or c, got 'x'".
CLI::Validator one_of(std::vector<std::string> choices);

// The option groups shared by the model verbs. Backend-level switches belong in
// add_load_options (read by apply_process_flags / load_model_from_args); options applied to a
// loaded model in add_model_options (read by apply_model_flags).
void add_load_options(VerbCli& cli);   // -m/--model, --backend, -t/--threads, --weights, --batch-invariant
void add_model_options(VerbCli& cli);  // --kv-bits, --kv-group-size, --quantized-kv-start, --adapter-path, --draft-model, --draft-tokens
void add_text_options(VerbCli& cli);   // -n/--max-tokens and the sampling options (cli/text_args.h)
void add_image_options(VerbCli& cli);  // --image, --max-soft-tokens
void add_decode_ahead_option(VerbCli& cli);  // --decode-ahead (steps queued ahead on a device: greedy_pipeline.h, engine_ahead.cpp)
// -c/--context N: the context length (tokens) a verb plans for; `def` empty: the model's own.
void add_context_option(VerbCli& cli, const std::string& def, const std::string& help);
// --chat-template FILE for the verbs that chat.
void add_chat_template_option(VerbCli& cli);

}  // namespace g4::cli
