#include "core/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <initializer_list>

namespace g4 {
namespace {

const char* g_program = "gemma4";

void write_str(const char* s) {
  if (s) (void)!::write(2, s, std::strlen(s));
}

// Only async-signal-safe calls: write, backtrace (its library is loaded at install time),
// backtrace_symbols_fd, raise.
void on_fatal(int sig) {
  write_str("\n");
  write_str(g_program);
  write_str(": fatal signal ");
  char num[8];
  int n = 0, v = sig;
  do {
    num[n++] = char('0' + v % 10);
    v /= 10;
  } while (v && n < 7);
  while (n) (void)!::write(2, &num[--n], 1);
  write_str(" (");
  write_str(sigabbrev_np(sig));
  write_str("); call stack:\n");
  void* frames[64];
  const int depth = backtrace(frames, 64);
  backtrace_symbols_fd(frames, depth, 2);
  raise(sig);  // SA_RESETHAND: the default action now (exit status, core dump)
}

}  // namespace

void install_crash_report(const char* program) {
  static bool done = false;
  if (done) return;
  done = true;
  if (program) g_program = program;
  void* warm[1];
  backtrace(warm, 1);  // loads the unwinder now, not inside the handler
  // Its own stack, so a stack overflow can still be reported.
  static char alt[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alt;
  ss.ss_size = sizeof alt;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_fatal;
  sa.sa_flags = SA_RESETHAND | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &sa, nullptr);
}

}  // namespace g4
