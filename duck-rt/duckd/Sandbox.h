//===- Sandbox.h - what a duckd worker may do once the ELF runs -*- C++ -*-===//
//
// The worker process runs code uploaded by the host. Once it is set up
// (buffers mapped, the ELF loaded, its core threads started), it confines
// itself and every thread: every file descriptor but the ones it serves
// steps with is closed, rlimits cap new descriptors, address space, core
// dumps and processes, and a seccomp filter (libseccomp) allows only the
// system calls a step needs. Anything else (open, socket, fork, exec, ...)
// kills the worker with SIGSYS; duckd reports it like a crash and goes on
// serving. A step that never returns is the step timeout's job.
//===----------------------------------------------------------------------===//
#ifndef DUCKD_SANDBOX_H
#define DUCKD_SANDBOX_H

#include "absl/status/status.h"

#include <cstdint>
#include <vector>

namespace duck::duckd {

struct SandboxOptions {
  std::vector<int> keep_fds;        // stay open (stderr is always kept)
  bool allow_exec_mappings = false; // one-shot workers load an ELF a call
  uint64_t extra_address_space = 1ull << 30; // beyond what is mapped now
};

/// Confines the calling process and all its threads. Returns an error (and
/// leaves the process as it was only if nothing was applied yet) when the
/// kernel refuses.
absl::Status EnterSandbox(const SandboxOptions &o);

/// The system calls the filter allows (names), for logs and docs.
std::vector<const char *> SandboxAllowedSyscalls(bool allow_exec_mappings);

} // namespace duck::duckd

#endif
