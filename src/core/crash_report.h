// On a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) the process writes one line naming
// the signal and the call stack's return addresses (with symbol names where the binary keeps them)
// to stderr, then dies of the same signal (exit status and core dump unchanged). A server that
// vanishes mid-run then leaves the reason in its log; stripped binaries print addresses that
// `addr2line -e <unstripped binary>` resolves.
#pragma once

namespace g4 {

// Installs the handlers (idempotent; safe to call before anything else runs).
void install_crash_report(const char* program);

}  // namespace g4
