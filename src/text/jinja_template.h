// A Jinja2-subset interpreter for chat templates.
//
// Why our own: no maintained C++ Jinja library is packaged in Debian, and chat templates need
// output byte-identical to Python's jinja2 as transformers' apply_chat_template runs it
// (ImmutableSandboxedEnvironment with trim_blocks=True, lstrip_blocks=True, the loopcontrols
// extension, HF's `tojson`/`raise_exception`/`strftime_now`/`namespace`/`dict` globals).
//
// Supported: text/{{ }}/{% %}/{# #} with whitespace control and {% raw %}; if/elif/else,
// for (else, `if` filter, unpacking, loop.*), break/continue, set (plain, tuple, namespace
// attribute, block set), macros (defaults, keyword args, calling other macros), filter blocks,
// {% generation %}, with; literals, arithmetic, comparisons, and/or/not, in, ~, is-tests, filters,
// attribute/item/slice access and Python str/dict methods. Anything else (include, import,
// extends, block, call, recursive loops, str.format, printf-style '%') is rejected with an error
// naming the line. Known gaps: integers beyond int64 (error), Python's final-sigma and other
// special casing rules, lazy-generator printing ("<generator object ...>").
//
// Usage:
//   auto t = jinja::Template::parse(source);            // Result<Template>
//   auto out = t->render(context_dict);                  // Result<std::string>
// A parsed Template is immutable; render() may run concurrently from several threads.
#pragma once
#include <memory>
#include <string>

#include "core/status.h"
#include "text/jinja_lexer.h"
#include "text/jinja_value.h"

namespace g4::jinja {

struct Stmt;

class Template {
 public:
  // Errors read "line N: message". `options` defaults to HF's trim_blocks + lstrip_blocks.
  static Result<Template> parse(const std::string& source, const LexOptions& options = {});
  // `context` must be a Dict (or Undefined for none); its keys become template variables on top of
  // the globals. Errors read "line N: message". A render that takes more than `max_steps` steps
  // (statements and expressions evaluated) ends with an error; value sizes are bounded as
  // jinja_value.h says.
  static constexpr uint64_t kMaxSteps = 10'000'000;  // real chat templates: a few hundred per message
  Result<std::string> render(const Value& context, uint64_t max_steps = kMaxSteps) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
};

}  // namespace g4::jinja
