// A duckd worker: the process that runs the duck ELF, isolated from the
// daemon. duckd forks it with the weight buffer (made read-only in the
// child), IB, OB and a control block in shared memory; the worker runs
// `cores` threads pinned one per core. A fault in the ELF kills only the
// worker: duckd sees it through a pidfd, reports it for that step and closes
// the session; the weight cache is untouched (the child cannot write it).
//
// Two kinds of worker:
//  - session (persistent): the worker loads the ELF once and, while duckd
//    lends it the host connection, serves STEP frames itself (core 0 reads
//    the IB straight from the socket and writes the reply), so a step costs
//    the same wake-ups as a plain socket ping-pong. Any other frame is
//    handed back to duckd with its header; duckd watches the pidfd, the
//    step deadline and host hang-ups.
//  - one-shot (run): duckd copies the ELF and the IB into shared memory and
//    bumps a command word; the worker loads, runs and unloads the ELF.
//
// Secondary cores wait for a call on a sequence word (spinning for
// spin_ns, then sleeping on a futex).
#ifndef DUCK_RT_DUCKD_WORKER_H
#define DUCK_RT_DUCKD_WORKER_H

#include "ElfLoader.h"

#include "duck_rt/duckd_protocol.h"
#include "duck_rt/wire.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include <cstdint>
#include <memory>
#include <string>
#include <sys/types.h>
#include <vector>

namespace duck::duckd {

struct WorkerConfig {
  uint32_t cores = 1;
  std::vector<int> cpus;  // CPU per core, -1: not pinned
  bool persistent = true; // false: every call loads, runs, unloads an ELF
  uint64_t ib_limit = 0, ob_limit = 0, scratch_bytes = 0;
  uint64_t elf_limit = 0; // one-shot mode: largest ELF per call
  uint64_t spin_ns = 200000;
  bool yield = true; // pass sched_yield to the ELF's spin loops
  uint64_t tsc_hz = 0;
  // The weight buffer mapping (inherited; the child makes it read-only).
  uint8_t *weights_map = nullptr;
  uint64_t weights_map_bytes = 0;
  uint8_t *image = nullptr;
  // Bytes of a finished image at `image` the child maps before it reports
  // ready: a fork does not copy the page tables of a shared file mapping,
  // so otherwise the first step to read each page faults it in.
  uint64_t populate_bytes = 0;
  std::vector<int> close_in_child; // daemon fds the worker must not hold
  ElfLimits elf_limits;
  // Session workers: the host connection they serve steps on.
  int conn_fd = -1;
  uint64_t session_id = 0;
  uint64_t max_payload = DUCKD_DEFAULT_MAX_PAYLOAD;
  absl::Duration io_timeout = absl::Seconds(10);
  std::string log_prefix; // "duckd[port]"
  bool sandbox = true;    // seccomp + rlimits once set up (Sandbox.h)
  // Session workers: duckd's cast socket (--cast; -1: none), where a
  // step_cast's IB arrives as datagrams (duck_rt/cast.h), and how long a
  // batch may take to be whole once its frame is in.
  int cast_fd = -1;
  uint64_t cast_wait_ns = 2'000'000;
};

struct StepOutcome {
  int32_t status = 0;
  uint64_t ob_bytes = 0;
  std::vector<uint64_t> kernel_ns; // per core
  uint64_t worker_ns = 0;
  std::string log;
};

/// What a session worker gave back with the connection.
struct Handback {
  enum Kind { kNone, kFrame, kDrop } kind = kNone;
  duckd_frame_header header{}; // kFrame: read, not yet validated
  std::string message;         // kDrop: why the connection is unusable
  FrameKeys keys;              // the connection's, as the worker left them
};

class Worker {
public:
  /// Forks the worker and waits until it is ready. Session workers load
  /// `elf` in the child; a refused ELF comes back as InvalidArgument.
  static absl::StatusOr<std::unique_ptr<Worker>>
  Spawn(const WorkerConfig &config, absl::Span<const uint8_t> elf);
  ~Worker(); // kills and reaps the worker if it is still alive

  const WorkerConfig &config() const { return config_; }
  pid_t pid() const { return pid_; }
  bool alive() const { return pid_ > 0; }
  int pid_fd() const { return pidfd_; }
  int event_fd() const { return eventfd_; }

  // --- one-shot workers (duckd drives every call) -------------------------
  uint8_t *ib() const { return ib_; }
  uint8_t *ob() const { return ob_; }
  uint8_t *elf_area() const { return elf_; }
  /// Runs one call with the IB in ib() and the ELF in elf_area(). Fails with
  /// Aborted (the ELF crashed), DeadlineExceeded (not finished in `timeout`;
  /// killed), Cancelled (`watch_fd` hung up) or InvalidArgument (the ELF was
  /// refused; the worker lives on).
  absl::StatusOr<StepOutcome> Step(uint64_t ib_bytes, uint64_t elf_bytes,
                                   uint64_t weights_bytes,
                                   uint64_t weights_generation,
                                   absl::Duration timeout, int watch_fd);

  // --- session workers (serve steps on the connection) --------------------
  /// Lends the connection to the worker, with the weight state it must use.
  /// The worker seals and checks its frames with `keys` (and advances
  /// their counters) until it hands the connection back.
  void Lend(uint64_t weights_bytes, uint64_t weights_generation,
            const FrameKeys &keys);
  /// The connection's keys as the worker has them now (after its death:
  /// as it left them).
  FrameKeys keys() const;
  bool lent() const;
  /// After event_fd() became readable: what the worker handed back (kNone
  /// while it still holds the connection).
  Handback TakeBack();
  /// A step is inside the ELF; its request id and how long it has run.
  bool in_step() const;
  uint32_t step_request_id() const;
  uint64_t step_number() const;
  absl::Duration step_elapsed() const;

  /// Kills (if asked) and reaps the worker; describes how it ended.
  std::string Reap(bool kill_first);
  /// Session workers are killed; one-shot ones asked to exit first.
  void Stop(absl::Duration grace);

private:
  Worker() = default;
  absl::Status WaitReady(absl::Duration timeout);
  // Step's parts: post the call, wait for it, read what it left.
  uint32_t PostRun(uint64_t ib_bytes, uint64_t elf_bytes,
                   uint64_t weights_bytes, uint64_t weights_generation);
  absl::Status WaitDone(uint32_t seq, absl::Duration timeout, int watch_fd);
  StepOutcome ReadOutcome() const;

  WorkerConfig config_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int eventfd_ = -1;
  uint8_t *region_ = nullptr;
  uint64_t region_bytes_ = 0;
  struct Control *ctl_ = nullptr;
  uint8_t *elf_ = nullptr, *ib_ = nullptr, *ob_ = nullptr, *logs_ = nullptr;
  uint64_t step_seq_ = 0;
};

/// TSC ticks per second, measured against CLOCK_MONOTONIC.
uint64_t CalibrateTsc();

} // namespace duck::duckd

#endif // DUCK_RT_DUCKD_WORKER_H
