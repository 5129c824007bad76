// install_crash_report: a fatal signal leaves one line naming it and the call stack on stderr, and
// the process still dies of that signal.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "core/crash_report.h"

namespace g4 {
namespace {

[[gnu::noinline]] void crash_here() { raise(SIGSEGV); }

TEST(CrashReport, FatalSignalIsNamedAndStillFatal) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(fds[1], 2);
    install_crash_report("crash_test");
    crash_here();
    _exit(0);  // not reached
  }
  close(fds[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << err;
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  EXPECT_NE(err.find("crash_test: fatal signal 11 (SEGV); call stack:"), std::string::npos) << err;
  EXPECT_NE(err.find("test_core(+0x"), std::string::npos) << err;  // frames as binary(+offset), for addr2line
}

}  // namespace
}  // namespace g4
