// With G4_TEST_BACKTRACE=1 in the environment, a segmentation fault, bus error or abort in this
// test binary prints the faulting thread's call stack (glibc's backtrace: "binary(+offset)"
// frames, which `addr2line -f -C -e test_backend OFFSET` names on the build machine) to stderr
// before the process dies. For the GPU machine, which has no debugger. Off by default: the ASan
// build installs its own handler, which this would replace.
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace {

void print_backtrace(int sig) {
  const char* what = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : "SIGABRT";
  (void)!write(STDERR_FILENO, "\n*** ", 5);
  (void)!write(STDERR_FILENO, what, std::strlen(what));
  (void)!write(STDERR_FILENO, ", call stack:\n", 14);
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}

[[maybe_unused]] const bool installed = [] {
  const char* on = std::getenv("G4_TEST_BACKTRACE");
  if (!on || std::strcmp(on, "1") != 0) return false;
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT}) signal(sig, print_backtrace);
  return true;
}();

}  // namespace
