#include "cli/progress_bar.h"

#include <unistd.h>

#include <cstdio>
#include <string>

namespace g4::cli {
namespace {

std::string amount(double v, ProgressUnit unit) {
  char s[48];
  if (unit == ProgressUnit::Tokens) std::snprintf(s, sizeof s, "%.0f tokens", v);
  else if (unit == ProgressUnit::Iterations) std::snprintf(s, sizeof s, "%.4g it", v);
  else if (v >= double(1ull << 30)) std::snprintf(s, sizeof s, "%.2f GiB", v / double(1ull << 30));
  else std::snprintf(s, sizeof s, "%.1f MiB", v / double(1ull << 20));
  return s;
}

}  // namespace

void TerminalProgressBar::update(const std::string& what, uint64_t done, uint64_t total, ProgressUnit unit,
                                 double seconds, bool finished) {
  constexpr int kWidth = 24;
  const double frac = total ? double(done) / double(total) : 1.0;
  const int filled = int(frac * kWidth + 0.5);
  const double rate = seconds > 0 ? double(done) / seconds : 0;
  std::string bar(size_t(filled), '#');
  bar.append(size_t(kWidth - filled), '.');
  std::string eta;
  if (!finished && rate > 0 && done < total) {
    char s[32];
    std::snprintf(s, sizeof s, ", %.0f s left", double(total - done) / rate);
    eta = s;
  }
  std::fprintf(stderr, "\r\x1b[2K[gemma4] %s [%s] %3.0f%% %s of %s, %s/s%s%s", what.c_str(), bar.c_str(), frac * 100,
               amount(double(done), unit).c_str(), amount(double(total), unit).c_str(), amount(rate, unit).c_str(),
               eta.c_str(), finished ? "\n" : "");
  std::fflush(stderr);
}

void clear_progress_line() {
  if (isatty(STDERR_FILENO)) std::fputs("\r\x1b[2K", stderr);
}

void install_progress_bar() {
  static TerminalProgressBar bar;
  if (isatty(STDERR_FILENO)) set_progress_sink(&bar);
}

}  // namespace g4::cli
