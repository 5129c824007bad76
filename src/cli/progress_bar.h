// The progress bar of the gemma4 binary: one line on stderr, redrawn in place, with the amount
// done, the percentage, the rate and the time left. Installed only when stderr is a terminal, so
// logs and pipes get no bar.
#pragma once
#include "core/progress.h"

namespace g4::cli {

class TerminalProgressBar : public ProgressSink {
 public:
  void update(const std::string& what, uint64_t done, uint64_t total, ProgressUnit unit, double seconds,
              bool finished) override;
};

// Clears a bar in progress from the terminal line, before other output is written there.
void clear_progress_line();

// Installs a TerminalProgressBar as the process's progress sink when stderr is a terminal.
void install_progress_bar();

}  // namespace g4::cli
