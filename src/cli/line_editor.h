// Reading the interactive chat's input. On a terminal: line editing and history through libedit's
// readline interface (arrow keys, Ctrl-R search, history kept in a file across sessions), Ctrl-C
// clears the line being typed. Otherwise (piped input): plain lines, and no prompt is written.
// Both read multi-line messages: a line starting with """ opens a block that ends at a line ending
// with """, and a line ending with a backslash continues on the next line.
#pragma once
#include <optional>
#include <string>

namespace g4::cli {

class LineEditor {
 public:
  // `history_file`: where the history is read from and appended to ("" keeps none).
  explicit LineEditor(std::string history_file);
  ~LineEditor();
  LineEditor(const LineEditor&) = delete;
  LineEditor& operator=(const LineEditor&) = delete;

  // The next message (its lines joined with '\n'), or nullopt at the end of input (Ctrl-D).
  // A Ctrl-C while typing gives an empty message after clearing the line.
  std::optional<std::string> read(const std::string& prompt);
  bool interactive() const { return interactive_; }

 private:
  std::optional<std::string> read_line(const std::string& prompt);  // one physical line
  bool interactive_;
  std::string history_file_;
};

// The history file: $GEMMA4_HISTORY when set, else ~/.gemma4_history ("" without a home).
std::string default_history_file();

}  // namespace g4::cli
