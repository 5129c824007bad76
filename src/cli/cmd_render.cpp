// gemma4 render (--template FILE.jinja | --model DIR|F.gguf) --messages FILE.json [--tools FILE.json]
//                [--thinking on|off] [--no-generation-prompt] [--bos TEXT] [--eos TEXT]
//                [--kwargs JSON]
// gemma4 render --batch FILE.jsonl
//
// Prints the prompt text that transformers' apply_chat_template(..., tokenize=False) would give,
// raw, with no added newline. --messages holds a JSON list of messages, or an object
// {"messages": [...], "tools": [...]} (--tools overrides its tools). --thinking passes
// enable_thinking (unset when absent). --model DIR finds chat_template.jinja / chat_template.json
// / tokenizer_config.json in DIR and takes bos/eos from tokenizer_config.json; --model F.gguf takes
// the file's tokenizer.chat_template and its vocabulary's bos/eos.
// --batch renders one case per line, {"template": PATH (or "source": TEXT), "messages": [...], "tools": [...]|null,
// "thinking": true|false|null, "add_generation_prompt": bool, "kwargs": {...}, "bos_token": ..,
// "eos_token": ..}, and prints one JSON line per case: {"text": ...} or {"error": ...}.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/options.h"
#include "io/gguf.h"
#include "runtime/bundle.h"
#include "text/chat_template.h"
#include "text/tokenizer_gguf.h"

namespace g4::cli {
namespace {

using ojson = nlohmann::ordered_json;

int fail_render(const std::string& msg) {
  std::fprintf(stderr, "gemma4 render: %s\n", msg.c_str());
  return 1;
}

Result<ojson> load_json_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return err("%s: cannot open", path.c_str());
  std::ostringstream ss;
  ss << f.rdbuf();
  ojson j = ojson::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return err("%s: invalid JSON", path.c_str());
  return j;
}

int run_batch(const std::string& path) {
  std::ifstream in(path);
  if (!in) return fail_render(path + ": cannot open");
  std::map<std::string, Result<ChatTemplate>> cache;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    ojson c = ojson::parse(line, nullptr, false);
    ojson out = ojson::object();
    bool inline_src = c.is_object() && c.contains("source") && c["source"].is_string();
    if (c.is_discarded() || !c.is_object() || (!inline_src && !(c.contains("template") && c["template"].is_string()))) {
      out["error"] = path + ":" + std::to_string(lineno) + ": not a JSON object with a 'template' path or 'source'";
      std::cout << out.dump() << "\n";
      continue;
    }
    std::string key = inline_src ? "source:" + c["source"].get<std::string>() : c["template"].get<std::string>();
    auto it = cache.find(key);
    if (it == cache.end())
      it = cache.emplace(key, inline_src ? ChatTemplate::from_string(c["source"].get<std::string>(), "case " + std::to_string(lineno))
                                         : ChatTemplate::from_file(key)).first;
    if (!it->second) {
      out["error"] = it->second.message();
    } else {
      ChatRenderOptions o;
      o.add_generation_prompt = c.value("add_generation_prompt", true);
      if (c.contains("thinking") && c["thinking"].is_boolean()) o.enable_thinking = c["thinking"].get<bool>();
      if (c.contains("kwargs") && c["kwargs"].is_object()) o.extra = c["kwargs"];
      if (c.contains("bos_token") && c["bos_token"].is_string()) o.bos_token = c["bos_token"].get<std::string>();
      if (c.contains("eos_token") && c["eos_token"].is_string()) o.eos_token = c["eos_token"].get<std::string>();
      ojson tools = c.contains("tools") ? c["tools"] : ojson();
      auto r = it->second->render(c.value("messages", ojson::array()), tools, o);
      if (r) out["text"] = r.value();
      else out["error"] = r.message();
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}

// The template a GGUF file carries, with its bos / eos token texts.
Result<ChatTemplate> template_of_gguf(const std::string& path, ChatRenderOptions* o) {
  G4_ASSIGN_OR_RETURN(auto f, GgufFile::open(path));
  G4_ASSIGN_OR_RETURN(GgufVocab v, read_gguf_vocab(*f));
  G4_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_gguf_vocab(v));
  G4_ASSIGN_OR_RETURN(std::optional<ChatTemplate> ct, gguf_chat_template(*f, tok, o));
  if (!ct) return err("%s: the file has no tokenizer.chat_template", path.c_str());
  return std::move(*ct);
}

int cmd_render(const std::vector<std::string>& argv) {
  VerbCli cli("render", "Apply a chat template to messages, as HF apply_chat_template(tokenize=False) does.");
  cli.value("--template", "the Jinja template file")->type_name("FILE");
  cli.value("-m,--model", "take the template of a model directory or .gguf file")->type_name("PATH");
  cli.value("--messages", "a JSON list of messages, or {\"messages\": [...], \"tools\": [...]}")->type_name("FILE");
  cli.value("--tools", "a JSON list of tools (overrides the messages file's)")->type_name("FILE");
  cli.value("--thinking", "pass enable_thinking (default: unset)")->type_name("on|off")
      ->check(one_of({"on", "off"}));
  cli.flag("--no-generation-prompt", "leave out the generation prompt");
  cli.value("--bos", "the bos_token text")->type_name("TEXT");
  cli.value("--eos", "the eos_token text")->type_name("TEXT");
  cli.value("--kwargs", "extra template variables, a JSON object")->type_name("JSON");
  cli.value("--batch", "render one case per line and print one JSON line each")->type_name("FILE.jsonl");
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  if (a.has("--batch")) return run_batch(a.get("--batch"));
  ChatRenderOptions o;
  Result<ChatTemplate> tpl = err("one of --template FILE or --model DIR is required");
  if (a.has("--template")) {
    tpl = ChatTemplate::from_file(a.get("--template"));
  } else if (a.has("--model") && a.get("--model").ends_with(".gguf")) {
    tpl = template_of_gguf(a.get("--model"), &o);
  } else if (a.has("--model")) {
    tpl = ChatTemplate::from_model_dir(a.get("--model"), &o);
  }
  if (!tpl) return fail_render(tpl.message());
  if (!a.has("--messages")) return fail_render("--messages FILE.json is required");
  auto msgs = load_json_file(a.get("--messages"));
  if (!msgs) return fail_render(msgs.message());
  ojson messages = msgs.value(), tools;
  if (messages.is_object()) {
    if (messages.contains("tools")) tools = messages["tools"];
    messages = messages.contains("messages") ? messages["messages"] : ojson();
  }
  if (a.has("--tools")) {
    auto t = load_json_file(a.get("--tools"));
    if (!t) return fail_render(t.message());
    tools = t.value();
  }
  if (a.has("--thinking")) {
    std::string v = a.get("--thinking");
    if (v != "on" && v != "off") return fail_render("--thinking takes on or off, got '" + v + "'");
    o.enable_thinking = v == "on";
  }
  o.add_generation_prompt = !a.has("--no-generation-prompt");
  if (a.has("--bos")) o.bos_token = a.get("--bos");
  if (a.has("--eos")) o.eos_token = a.get("--eos");
  if (a.has("--kwargs")) {
    ojson k = ojson::parse(a.get("--kwargs"), nullptr, false);
    if (k.is_discarded() || !k.is_object()) return fail_render("--kwargs must be a JSON object");
    o.extra = k;
  }
  auto r = tpl->render(messages, tools, o);
  if (!r) return fail_render(r.message());
  std::fwrite(r->data(), 1, r->size(), stdout);
  return 0;
}

}  // namespace

G4_COMMAND("render", "apply a chat template to messages (as HF apply_chat_template)", cmd_render);

}  // namespace g4::cli
