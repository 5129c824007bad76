#include "cli/text_args.h"

#include <cstdlib>

namespace g4::cli {
namespace {

Result<double> number(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') return err("%s: '%s' is not a number", flag.c_str(), v.c_str());
  return d;
}

}  // namespace

Result<TextArgs> parse_text_args(const Args& a, const ModelConfig& cfg) {
  TextArgs t;
  t.sampling = generation_defaults(cfg);
  SamplingParams& s = t.sampling;
  for (const auto& [flag, value] : a.flags) {
    if (flag == "--max-tokens") {
      G4_ASSIGN_OR_RETURN(double d, number(flag, value));
      if (d < 1) return err("--max-tokens must be at least 1");
      t.max_tokens = int(d);
    } else if (flag == "--temp" || flag == "--temperature") {
      G4_ASSIGN_OR_RETURN(double d, number(flag, value));
      s.temperature = float(d);
    } else if (flag == "--top-k") {
      G4_ASSIGN_OR_RETURN(double d, number(flag, value));
      s.top_k = int(d);
    } else if (flag == "--top-p") {
      G4_ASSIGN_OR_RETURN(double d, number(flag, value));
      s.top_p = float(d);
    } else if (flag == "--min-p") {
      G4_ASSIGN_OR_RETURN(double d, number(flag, value));
      s.min_p = float(d);
    } else if (flag == "--repetition-penalty") {
      G4_ASSIGN_OR_RETURN(double d, number(flag, value));
      s.repetition_penalty = float(d);
    } else if (flag == "--presence-penalty") {
      G4_ASSIGN_OR_RETURN(double d, number(flag, value));
      s.presence_penalty = float(d);
    } else if (flag == "--frequency-penalty") {
      G4_ASSIGN_OR_RETURN(double d, number(flag, value));
      s.frequency_penalty = float(d);
    } else if (flag == "--seed") {
      G4_ASSIGN_OR_RETURN(double d, number(flag, value));
      s.seed = uint64_t(d);
      s.has_seed = true;
    } else if (flag == "--stop") {
      if (value.empty()) return err("--stop needs a string");
      t.stop.push_back(value);
    } else if (flag == "--logit-bias") {
      auto eq = value.find('=');
      if (eq == std::string::npos) return err("--logit-bias: expected ID=BIAS, got '%s'", value.c_str());
      G4_ASSIGN_OR_RETURN(double id, number(flag, value.substr(0, eq)));
      G4_ASSIGN_OR_RETURN(double b, number(flag, value.substr(eq + 1)));
      s.logit_bias.emplace_back(int(id), float(b));
    }
  }
  G4_TRY(validate(s, cfg.vocab));
  return t;
}

}  // namespace g4::cli
