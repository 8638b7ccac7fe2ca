//===- Sandbox.cpp - what a duckd worker may do once the ELF runs ---------===//
#include "Sandbox.h"

#include "absl/strings/str_cat.h"

#include <seccomp.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

namespace duck::duckd {
namespace {

// A step: reading and answering frames on the connection (recv/send), the
// cores' barriers and wake-ups (futex, sched_yield, sleeps, the eventfd
// write), the clocks, logs on stderr, and threads ending. Memory: freeing
// and growing the heap, never executable unless asked.
const char *const kAlways[] = {
    "read",
    "write",
    "readv",
    "writev",
    "recvfrom",
    "recvmsg",
    "recvmmsg",
    "sendto",
    "sendmsg",
    "poll",
    "ppoll",
    "futex",
    "sched_yield",
    "nanosleep",
    "clock_nanosleep",
    "clock_gettime",
    "gettimeofday",
    "getpid",
    "gettid",
    "getcpu",
    "exit",
    "exit_group",
    "rt_sigreturn",
    "rt_sigprocmask",
    "restart_syscall",
    "madvise",
    "munmap",
    "brk",
    "close",
    "rseq",
    "set_robust_list",
    "sched_getaffinity",
};
const char *const kMappings[] = {"mmap", "mprotect"};

uint64_t MappedBytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t pages = 0;
  f >> pages;
  return pages * (uint64_t)sysconf(_SC_PAGESIZE);
}

absl::Status Limit(int what, const char *name, rlim_t v) {
  rlimit r{v, v};
  rlimit cur{};
  if (getrlimit(what, &cur) == 0 && cur.rlim_max != RLIM_INFINITY &&
      cur.rlim_max < v)
    r = {cur.rlim_max, cur.rlim_max};
  if (setrlimit(what, &r) != 0)
    return absl::InternalError(
        absl::StrCat("setrlimit ", name, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

} // namespace

std::vector<const char *> SandboxAllowedSyscalls(bool allow_exec_mappings) {
  std::vector<const char *> v(std::begin(kAlways), std::end(kAlways));
  for (const char *m : kMappings)
    v.push_back(m);
  v.push_back("sched_setaffinity");
  (void)allow_exec_mappings; // mmap/mprotect without PROT_EXEC otherwise
  return v;
}

absl::Status EnterSandbox(const SandboxOptions &o) {
  // Descriptors: only stderr and the ones given stay open.
  std::vector<int> keep = o.keep_fds;
  keep.push_back(STDERR_FILENO);
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  int from = 0;
  for (int fd : keep) {
    if (fd < 0)
      continue;
    if (fd > from)
      close_range((unsigned)from, (unsigned)fd - 1, 0);
    from = fd + 1;
  }
  close_range((unsigned)from, ~0u, 0);

  const uint64_t mapped = MappedBytes();
  if (absl::Status s = Limit(RLIMIT_NOFILE, "RLIMIT_NOFILE", (rlim_t)from);
      !s.ok())
    return s;
  if (absl::Status s = Limit(RLIMIT_CORE, "RLIMIT_CORE", 0); !s.ok())
    return s;
  if (absl::Status s = Limit(RLIMIT_NPROC, "RLIMIT_NPROC", 0); !s.ok())
    return s;
  if (mapped)
    if (absl::Status s = Limit(RLIMIT_AS, "RLIMIT_AS",
                               (rlim_t)(mapped + o.extra_address_space));
        !s.ok())
      return s;

  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
  if (!ctx)
    return absl::InternalError("seccomp_init failed");
  auto fail = [&](const std::string &what, int rc) {
    seccomp_release(ctx);
    return absl::InternalError(
        absl::StrCat("seccomp ", what, ": ", std::strerror(-rc)));
  };
  for (const char *name : kAlways) {
    const int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR)
      continue; // not on this architecture
    if (int rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0); rc < 0)
      return fail(absl::StrCat("allow ", name), rc);
  }
  // Pinning a core thread to its CPU (itself only).
  if (int rc =
          seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(sched_setaffinity), 1,
                           SCMP_A0(SCMP_CMP_EQ, 0));
      rc < 0)
    return fail("allow sched_setaffinity", rc);
  for (const char *name : kMappings) {
    const int nr = seccomp_syscall_resolve_name(name);
    int rc = o.allow_exec_mappings
                 ? seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0)
                 : seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 1,
                                    SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0));
    if (rc < 0)
      return fail(absl::StrCat("allow ", name), rc);
  }
  // Every thread of the worker, not just this one.
  if (int rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_TSYNC, 1); rc < 0)
    return fail("thread sync", rc);
  if (int rc = seccomp_load(ctx); rc < 0)
    return fail("load", rc);
  seccomp_release(ctx);
  return absl::OkStatus();
}

} // namespace duck::duckd
