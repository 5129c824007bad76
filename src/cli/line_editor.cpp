#include "cli/line_editor.h"

#include <sys/select.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include <editline/readline.h>

#include "cli/chat_session.h"

namespace g4::cli {
namespace {

constexpr int kHistoryEntries = 1000;
// What read_line gives for a Ctrl-C (no typed line holds this byte: the terminal turns it into SIGINT).
const std::string kInterrupted = "\x03";

// The line libedit's callback hands over (rl_callback_handler_install), per read_line call.
struct PendingLine {
  bool done = false;
  bool eof = false;
  std::string text;
};
PendingLine* g_pending = nullptr;

void on_line(char* line) {
  if (!g_pending) return;
  g_pending->done = true;
  if (!line) {
    g_pending->eof = true;
    return;
  }
  g_pending->text = line;
  std::free(line);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

std::string default_history_file() {
  if (const char* h = std::getenv("GEMMA4_HISTORY")) return h;
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.gemma4_history";
  return "";
}

LineEditor::LineEditor(std::string history_file)
    : interactive_(isatty(STDIN_FILENO) && isatty(STDOUT_FILENO)), history_file_(std::move(history_file)) {
  if (!interactive_) return;
  rl_catch_signals = 0;  // SIGINT is this program's (chat_session.h): it clears the line
  rl_readline_name = "gemma4";
  using_history();
  stifle_history(kHistoryEntries);
  if (!history_file_.empty()) read_history(history_file_.c_str());
}

LineEditor::~LineEditor() = default;

std::optional<std::string> LineEditor::read_line(const std::string& prompt) {
  if (!interactive_) {
    std::string line;
    if (!std::getline(std::cin, line)) return std::nullopt;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return line;
  }
  // The callback interface, so that a Ctrl-C (which ends select() with EINTR) can clear the line.
  PendingLine pending;
  g_pending = &pending;
  interrupt_flag().store(false);
  rl_callback_handler_install(prompt.c_str(), on_line);
  while (!pending.done) {
    fd_set fds;
    FD_ZERO(&fds);
    FD_SET(STDIN_FILENO, &fds);
    const int r = select(STDIN_FILENO + 1, &fds, nullptr, nullptr, nullptr);
    if (interrupt_flag().exchange(false)) {  // Ctrl-C: drop what was typed, new prompt
      rl_replace_line("", 0);
      rl_callback_handler_remove();
      std::fputs("^C\n", stdout);
      std::fflush(stdout);
      g_pending = nullptr;
      return kInterrupted;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      pending.eof = true;
      break;
    }
    rl_callback_read_char();
  }
  rl_callback_handler_remove();
  g_pending = nullptr;
  if (pending.eof) return std::nullopt;
  return pending.text;
}

std::optional<std::string> LineEditor::read(const std::string& prompt) {
  auto first = read_line(prompt);
  if (!first) return std::nullopt;
  if (*first == kInterrupted) return std::string();
  std::string text = *first;
  const std::string more = interactive_ ? "... " : "";
  if (text.rfind("\"\"\"", 0) == 0) {  // """ block: until a line ending with """
    text.erase(0, 3);
    while (!ends_with(text, "\"\"\"") || text.empty()) {
      auto next = read_line(more);
      if (!next) break;
      if (*next == kInterrupted) return std::string();
      text += (text.empty() ? "" : "\n") + *next;
      if (ends_with(*next, "\"\"\"")) break;
    }
    if (ends_with(text, "\"\"\"")) text.erase(text.size() - 3);
  } else {
    while (!text.empty() && text.back() == '\\') {  // trailing backslash: the message goes on
      text.back() = '\n';
      auto next = read_line(more);
      if (!next) break;
      if (*next == kInterrupted) return std::string();
      text += *next;
    }
  }
  if (interactive_ && !text.empty()) {
    add_history(text.c_str());
    if (!history_file_.empty()) write_history(history_file_.c_str());
  }
  return text;
}

}  // namespace g4::cli
