// The duckd worker process (Worker.h): spawn, the session worker's step
// server, the one-shot call path, crash and timeout handling.
#include "Worker.h"

#include "Sandbox.h"
#include "WeightCache.h"
#include "duck_rt/cast.h"
#include "duck_rt/wire.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <linux/futex.h>
#include <optional>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>
#include <x86intrin.h>

namespace duck::duckd {

enum : uint32_t { kCmdNone = 0, kCmdStep = 1, kCmdRun = 2, kCmdExit = 3 };
enum : uint32_t { kReadyNo = 0, kReadyOk = 1, kReadyFailed = 2 };
enum : uint32_t { kOwnerDaemon = 0, kOwnerWorker = 1 };
constexpr uint64_t kLogBytes = 4096;
constexpr uint64_t kPage = 4096;

/// Shared between duckd and its worker (MAP_SHARED anonymous memory).
struct Control {
  // Calls, published to every core (by duckd for one-shot workers, by
  // core 0 for session workers).
  alignas(64) std::atomic<uint32_t> cmd_seq{0}; // futex word
  std::atomic<uint32_t> sleepers{0};            // threads in futex wait
  uint32_t cmd = kCmdNone;
  uint64_t step_seq = 0, ib_bytes = 0, elf_bytes = 0;
  uint64_t weights_bytes = 0, weights_generation = 0;
  // Completion (one-shot): worker -> duckd.
  alignas(64) std::atomic<uint32_t> done_seq{0};
  std::atomic<uint32_t> main_sleeping{0};
  alignas(64) std::atomic<uint32_t> finished{0}; // secondaries done
  std::atomic<uint32_t> loaded_seq{0};           // one-shot: ELF loaded
  int32_t status = 0;
  uint32_t load_failed = 0;
  uint64_t ob_size = 0, worker_ns = 0;
  uint64_t core_cycles[DUCKD_MAX_CORES] = {};
  uint64_t log_size[DUCKD_MAX_CORES] = {};
  // Session workers: who holds the connection, what came back, and the
  // step in flight (for duckd's crash and timeout replies).
  alignas(64) std::atomic<uint32_t> owner{kOwnerDaemon}; // futex word
  uint32_t handback_kind = Handback::kNone;
  duckd_frame_header handback_header{};
  char handback_message[512] = {};
  FrameKeys keys; // the connection's, while the worker holds it
  alignas(64) std::atomic<uint32_t> in_step{0};
  uint32_t step_request_id = 0;
  uint64_t step_number = 0;
  uint64_t step_started_ns = 0;
  // Spawn handshake.
  std::atomic<uint32_t> ready{kReadyNo};
  char message[1024] = {};
};

namespace {

uint64_t PageUp(uint64_t v) { return (v + kPage - 1) & ~(kPage - 1); }

/// Maps [p, p + bytes) into this process now, rather than a page fault at
/// a time inside the first steps that touch it: one madvise (best effort;
/// Linux 5.14), then a load (`write`: a store of the zero the fresh memory
/// holds) on every 4 KiB page, which a hypervisor that shadows the guest's
/// page tables charges each process apart (see MapWeightsReadOnly). A
/// write is for step buffers only, before the first step: they are written
/// afresh every step, so nothing they hold is lost.
void TouchPages(uint8_t *p, uint64_t bytes, bool write) {
  if (!p || !bytes)
    return;
#if defined(MADV_POPULATE_READ) && defined(MADV_POPULATE_WRITE)
  (void)::madvise(p, PageUp(bytes),
                  write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
#endif
  volatile uint8_t *v = p;
  uint64_t sum = 0;
  for (uint64_t i = 0; i < bytes; i += kPage) {
    if (write)
      v[i] = 0;
    else
      sum += v[i];
  }
  asm volatile("" : : "r"(sum));
}

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

long Futex(std::atomic<uint32_t> *word, int op, uint32_t val) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), op, val,
                 nullptr, nullptr, 0);
}

void YieldHook() { sched_yield(); }

void CopyMessage(char *dst, size_t cap, const std::string &m) {
  size_t n = std::min(m.size(), cap - 1);
  std::memcpy(dst, m.data(), n);
  dst[n] = 0;
}

void Notify(int efd) {
  uint64_t one = 1;
  ssize_t r = ::write(efd, &one, sizeof one);
  (void)r;
}

std::string SignalName(int sig) {
  const char *abbrev = sigabbrev_np(sig);
  return absl::StrCat("SIG", abbrev ? abbrev : "?", " (signal ", sig, ")",
                      sig == SIGSYS ? ": a system call the sandbox forbids"
                                    : "");
}

/// Waits until `word` moves away from `seen`: spins (yielding now and then)
/// for spin_ns, then sleeps on the futex. `sleepers` counts sleepers so the
/// waker can skip the futex syscall while everyone spins.
uint32_t WaitChange(std::atomic<uint32_t> *word, std::atomic<uint32_t> *sleepers,
                    uint32_t seen, uint64_t spin_ns) {
  uint64_t start = 0;
  for (uint32_t i = 0;; ++i) {
    uint32_t cur = word->load(std::memory_order_acquire);
    if (cur != seen)
      return cur;
    if ((i & 63) != 63) {
      _mm_pause();
      continue;
    }
    uint64_t now = NowNs();
    if (!start)
      start = now;
    if (now - start < spin_ns) {
      sched_yield();
      continue;
    }
    if (sleepers)
      sleepers->fetch_add(1, std::memory_order_seq_cst);
    if (word->load(std::memory_order_seq_cst) == seen)
      Futex(word, FUTEX_WAIT, seen);
    if (sleepers)
      sleepers->fetch_sub(1, std::memory_order_seq_cst);
  }
}

void Pin(int cpu) {
  if (cpu < 0)
    return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set); // best effort
}

/// The worker process's side.
struct WorkerSide {
  const WorkerConfig *cfg = nullptr;
  Control *ctl = nullptr;
  int efd = -1;
  uint8_t *elf = nullptr, *ib = nullptr, *ob = nullptr, *logs = nullptr;
  uint8_t *scratch = nullptr;
  duck_entry_fn step = nullptr;
  std::unique_ptr<LoadedElf> persistent;
  std::unique_ptr<LoadedElf> oneShot; // core 0 owns it during a run call
  uint64_t local_seq = 0;             // session workers: calls so far
  std::unique_ptr<FrameCheck> check;  // session workers: of each step
  std::unique_ptr<CastReceiver> cast; // session workers with a cast socket
  /// This session's host sends cast stages (a step_staged came): a worker
  /// asleep waiting for a frame wakes for datagrams too. Until then it
  /// wakes for its connection alone, as without cast stages: waking for
  /// every cast step's datagrams, just before their frame, cost a one-box
  /// cluster (ducks and host sharing two vCPUs) 0.4 ms a token of
  /// dispatch gap (Qwen3-30B-A3B shape, multicast).
  bool wake_for_casts = false;
  /// The step frame being served is quiet (DUCKD_FLAG_QUIET): its answer,
  /// error or not, is not sent (an error is still logged).
  bool quiet = false;
  /// The last DUCK_IB_STAGE step's (abi.h), for the DUCK_IB_STAGED step
  /// after it: its header, slots, x as sent and fp32 results a slot.
  /// Reserved before the sandbox (an IB's slots and bytes, four OBs of
  /// results): never allocates.
  struct Stage {
    bool valid = false;
    /// It came as a cast stage's batch alone (run as soon as it was
    /// whole): only a step_staged naming this batch and digest uses it.
    bool cast = false;
    uint64_t cast_id = 0;
    uint8_t digest[DUCKD_CAST_DIGEST_BYTES] = {};
    uint64_t done_ns = 0; // when a cast stage finished
    // The last cast stage's batch that could not run, and why (its
    // step_staged is answered so at once).
    uint64_t failed_id = 0;
    std::string failed_why;
    uint64_t ahead_ns = 0;       // for the staged step's OB (stage_ahead_ns)
    std::vector<uint8_t> routed; // a step_staged's own IB, as read
    duck_ib_header ih{};
    std::vector<duck_expert_slot> slots;  // each token's, by expert id
    std::vector<duck_expert_slot> column; // one slot of every token
    std::vector<uint8_t> x;
    std::vector<float> out; // a slot's results after another's
    uint64_t kernel_ns = 0; // its slowest core's time in the ELF
    void Reserve(const WorkerConfig &cfg) {
      x.reserve(cfg.ib_limit);
      slots.reserve(cfg.ib_limit / sizeof(duck_expert_slot));
      column.reserve(cfg.ib_limit / sizeof(duck_expert_slot));
      out.reserve(4 * cfg.ob_limit / sizeof(float));
      routed.reserve(cfg.ib_limit);
      failed_why.reserve(512);
    }
  } stage;

  duck_info InfoFor(uint32_t core) const {
    duck_info info{};
    info.abi_version = DUCK_ABI_VERSION;
    info.info_size = sizeof(duck_info);
    info.ib = ib;
    info.ob = ob;
    info.ob_limit = cfg->ob_limit;
    info.log = reinterpret_cast<char *>(logs + core * kLogBytes);
    info.log_limit = kLogBytes;
    info.tsc_hz = cfg->tsc_hz;
    info.smp_cpu_index = core;
    info.smp_cpu_count = cfg->cores;
    info.weights = cfg->image;
    info.scratch = scratch;
    info.scratch_size = cfg->scratch_bytes;
    info.core_cycles = ctl->core_cycles;
    info.yield = cfg->yield ? YieldHook : nullptr;
    return info;
  }

  /// Calls `fn` on this core with the call's fields from the control block.
  int32_t Call(duck_entry_fn fn, duck_info &info, uint32_t core) {
    info.log_size = 0;
    info.ob_size = 0;
    info.ib_size = ctl->ib_bytes;
    info.weights_size = ctl->weights_bytes;
    info.weights_generation = ctl->weights_generation;
    info.step_seq = ctl->step_seq;
    int32_t ret = fn(&info);
    ctl->log_size[core] = info.log_size;
    return ret;
  }

  /// Core 0: waits until every secondary core has returned from the call.
  void WaitSecondaries() {
    for (uint32_t spins = 0;
         ctl->finished.load(std::memory_order_acquire) != cfg->cores - 1;
         ++spins)
      if (spins % 64 == 63)
        sched_yield();
      else
        _mm_pause();
    ctl->finished.store(0, std::memory_order_relaxed);
  }
};

/// Secondary cores (and core 0 of one-shot workers): wait for a call, run it.
void CoreLoop(WorkerSide *w, uint32_t core) {
  const WorkerConfig &cfg = *w->cfg;
  Control *ctl = w->ctl;
  Pin(cfg.cpus.size() > core ? cfg.cpus[core] : -1);
  duck_info info = w->InfoFor(core);
  uint32_t seen = 0;
  for (;;) {
    seen = WaitChange(&ctl->cmd_seq, &ctl->sleepers, seen, cfg.spin_ns);
    const uint64_t start = core == 0 ? NowNs() : 0;
    const uint32_t cmd = ctl->cmd;
    if (cmd == kCmdExit)
      return;
    duck_entry_fn fn = w->step;
    if (cmd == kCmdRun) {
      if (core == 0) {
        ctl->load_failed = 0;
        auto loaded = LoadedElf::Load(
            absl::MakeConstSpan(w->elf, ctl->elf_bytes), cfg.elf_limits);
        if (loaded.ok()) {
          w->oneShot = std::move(*loaded);
        } else {
          ctl->load_failed = 1;
          CopyMessage(ctl->message, sizeof ctl->message,
                      std::string(loaded.status().message()));
        }
        ctl->loaded_seq.store(seen, std::memory_order_release);
      } else {
        while (ctl->loaded_seq.load(std::memory_order_acquire) != seen)
          sched_yield();
      }
      fn = ctl->load_failed ? nullptr : w->oneShot->run();
    }
    int32_t ret = fn ? w->Call(fn, info, core) : 0;
    if (core != 0) {
      ctl->finished.fetch_add(1, std::memory_order_acq_rel);
      continue;
    }
    w->WaitSecondaries();
    ctl->status = ret;
    ctl->ob_size = info.ob_size;
    w->oneShot.reset();
    ctl->worker_ns = NowNs() - start;
    ctl->done_seq.store(seen, std::memory_order_seq_cst);
    if (ctl->main_sleeping.load(std::memory_order_seq_cst))
      Notify(w->efd);
  }
}

/// Session worker, core 0: gives the connection back to duckd.
void HandBack(WorkerSide *w, Handback::Kind kind,
              const duckd_frame_header *h, const std::string &message) {
  Control *ctl = w->ctl;
  ctl->handback_kind = kind;
  if (h)
    ctl->handback_header = *h;
  CopyMessage(ctl->handback_message, sizeof ctl->handback_message, message);
  ctl->owner.store(kOwnerDaemon, std::memory_order_seq_cst);
  Notify(w->efd);
}

/// Waits until a frame header has arrived and peeks it (false: the
/// connection ended first, or only part of a header came before EOF).
/// Spins on a non-blocking peek for spin_ns (steps often come back to
/// back), then blocks in the peek itself: one syscall, no poll.
bool PeekHeader(int fd, uint64_t spin_ns, duckd_frame_header *h) {
  const uint64_t start = spin_ns ? NowNs() : 0;
  for (uint32_t i = 0; spin_ns; ++i) {
    ssize_t n = ::recv(fd, h, sizeof *h, MSG_PEEK | MSG_DONTWAIT);
    if (n == ssize_t(sizeof *h))
      return true;
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                   errno != EINTR))
      return false;
    if (NowNs() - start >= spin_ns)
      break;
    if (i % 16 == 15)
      sched_yield();
    else
      _mm_pause();
  }
  for (;;) {
    ssize_t n = ::recv(fd, h, sizeof *h, MSG_PEEK | MSG_WAITALL);
    if (n == ssize_t(sizeof *h))
      return true;
    if (n < 0 && errno == EINTR)
      continue;
    if (n > 0) { // a partial header; let the timed read sort it out
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, 10);
      if (::recv(fd, h, sizeof *h, MSG_PEEK | MSG_DONTWAIT) ==
          ssize_t(sizeof *h))
        return true;
      return n > 0;
    }
    return false;
  }
}

/// Answers a step with an error (and logs it); false when even that
/// failed (the connection is handed back).
bool StepError(WorkerSide *w, const duckd_frame_header &h, absl::Time deadline,
               duckd_error_code code, const std::string &m) {
  std::fprintf(stderr, "%s %s -> %s: %s\n", w->cfg->log_prefix.c_str(),
               w->quiet ? "quiet stage" : "step", ErrorCodeName(code),
               m.c_str());
  if (w->quiet)
    return true; // its staged step finds no stage
  const std::string payload = EncodeError(code, m);
  Part part{payload.data(), payload.size()};
  absl::Status s =
      WriteFrame(w->cfg->conn_fd, h.type, DUCKD_FLAG_REPLY | DUCKD_FLAG_ERROR,
                 h.request_id, {&part, 1}, deadline, &w->ctl->keys);
  if (!s.ok())
    HandBack(w, Handback::kDrop, nullptr,
             absl::StrCat("error reply failed: ", s.message()));
  return s.ok();
}

/// The frame's check, once every byte is read: true when it passed; else
/// the complaint is answered (and a frame that fails authentication hands
/// the connection back).
bool StepVerified(WorkerSide *w, const duckd_frame_header &h,
                  absl::Time deadline, FrameCheck &check) {
  absl::Status s = check.Finish();
  if (s.ok())
    return true;
  w->quiet = false; // a frame that fails its check cannot ask for silence
  const bool auth = s.code() == absl::StatusCode::kPermissionDenied;
  if (StepError(w, h, deadline,
                auth ? DUCKD_ERR_UNAUTHORIZED : DUCKD_ERR_BAD_FRAME,
                std::string(s.message())) &&
      auth)
    HandBack(w, Handback::kDrop, nullptr, std::string(s.message()));
  return false;
}

/// Reads and checks `n` bytes of a frame that will not be acted on.
bool Drain(int fd, FrameCheck &check, uint64_t n, absl::Time deadline) {
  uint8_t tmp[16384];
  while (n) {
    size_t k = std::min<uint64_t>(n, sizeof tmp);
    if (!ReadFull(fd, tmp, k, deadline).ok())
      return false;
    check.Update(tmp, k);
    n -= k;
  }
  return true;
}

/// A frame refused whole: the rest of it (`n` bytes) read and checked,
/// then answered `code` with `why` (truncated: the connection handed back,
/// "truncated WHAT"). What the serving function returns.
bool RefuseRest(WorkerSide *w, const duckd_frame_header &h, FrameCheck &check,
                uint64_t n, absl::Time deadline, const char *what,
                duckd_error_code code, const std::string &why) {
  if (!Drain(w->cfg->conn_fd, check, n, deadline)) {
    HandBack(w, Handback::kDrop, nullptr, absl::StrCat("truncated ", what));
    return false;
  }
  if (!StepVerified(w, h, deadline, check))
    return w->ctl->owner.load() == kOwnerWorker;
  return StepError(w, h, deadline, code, why);
}

/// What is wrong with a step request for this session ("" when nothing).
std::string StepRequestProblem(const WorkerConfig &cfg,
                               const duckd_step_request &r, uint64_t rest,
                               duckd_error_code *code) {
  *code = DUCKD_ERR_BAD_REQUEST;
  if (r.ib_bytes != rest)
    return "step: ib_bytes does not match the payload";
  if (r.session_id != cfg.session_id) {
    *code = DUCKD_ERR_NO_SESSION;
    return absl::StrCat("step for session ", r.session_id,
                        "; the open session is ", cfg.session_id);
  }
  if (rest > cfg.ib_limit) {
    *code = DUCKD_ERR_TOO_LARGE;
    return absl::StrCat("step: IB of ", rest, " bytes exceeds the session's ",
                        cfg.ib_limit);
  }
  return std::string();
}

/// Reads a step's request and its IB (straight into the ELF's input
/// buffer) and checks them, answering what is wrong: nothing when the step
/// is to run (its IB's size in `ib_bytes`), else what ServeStep returns.
std::optional<bool> TakeStep(WorkerSide *w, const duckd_frame_header &h,
                             FrameCheck &check,
                             const duckd_step_request *preread,
                             absl::Time deadline, uint64_t *ib_bytes) {
  const WorkerConfig &cfg = *w->cfg;
  Control *ctl = w->ctl;
  const int fd = cfg.conn_fd;
  duckd_step_request r{};
  if (preread) { // the whole frame is already in (header, r, IB)
    r = *preread;
  } else if (h.payload_bytes < sizeof r) {
    return RefuseRest(w, h, check, h.payload_bytes, deadline, "step",
                      DUCKD_ERR_BAD_REQUEST, "step shorter than its header");
  } else if (absl::Status s = ReadFull(fd, &r, sizeof r, deadline); !s.ok()) {
    HandBack(w, Handback::kDrop, nullptr,
             absl::StrCat("truncated step: ", s.message()));
    return false;
  }
  check.Update(&r, sizeof r);
  const uint64_t rest = h.payload_bytes - sizeof r;
  duckd_error_code code = DUCKD_ERR_BAD_REQUEST;
  if (std::string bad = StepRequestProblem(cfg, r, rest, &code);
      !bad.empty()) {
    if (preread) {
      check.Update(w->ib, rest);
    } else if (!Drain(fd, check, rest, deadline)) {
      HandBack(w, Handback::kDrop, nullptr, "truncated step");
      return false;
    }
    if (!StepVerified(w, h, deadline, check))
      return ctl->owner.load() == kOwnerWorker;
    return StepError(w, h, deadline, code, bad);
  }
  if (absl::Status s =
          preread ? absl::OkStatus() : ReadFull(fd, w->ib, rest, deadline);
      !s.ok()) {
    HandBack(w, Handback::kDrop, nullptr,
             absl::StrCat("truncated step: ", s.message()));
    return false;
  }
  check.Update(w->ib, rest);
  if (!StepVerified(w, h, deadline, check))
    return ctl->owner.load() == kOwnerWorker;
  // Never on a slot the scrub found damaged (the flag is in the cache
  // metadata this worker maps read-only): the host re-prepares and resends.
  if (std::string why = DamagedSlotRefusal(cfg.weights_map, w->ib, rest);
      !why.empty())
    return StepError(w, h, deadline, DUCKD_ERR_CACHE, why);
  *ib_bytes = rest;
  return std::nullopt;
}

/// Runs the step's call on every core: the ELF's status; the time it took
/// in `worker_ns`.
int32_t RunStep(WorkerSide *w, const duckd_frame_header &h, duck_info &info,
                uint64_t ib_bytes, uint64_t *worker_ns) {
  const WorkerConfig &cfg = *w->cfg;
  Control *ctl = w->ctl;
  const uint64_t start = NowNs();
  ctl->step_request_id = h.request_id;
  ctl->step_number = ++w->local_seq;
  ctl->step_started_ns = start;
  ctl->in_step.store(1, std::memory_order_seq_cst);
  ctl->cmd = kCmdStep;
  ctl->step_seq = w->local_seq;
  ctl->ib_bytes = ib_bytes;
  if (cfg.cores > 1) {
    ctl->cmd_seq.fetch_add(1, std::memory_order_seq_cst);
    if (ctl->sleepers.load(std::memory_order_seq_cst))
      Futex(&ctl->cmd_seq, FUTEX_WAKE, INT_MAX);
  }
  const int32_t status = w->Call(w->step, info, 0);
  if (cfg.cores > 1)
    w->WaitSecondaries();
  ctl->in_step.store(0, std::memory_order_seq_cst);
  *worker_ns = NowNs() - start;
  return status;
}

/// The step's reply: its status and times, the output buffer, each core's
/// log; false when it could not be sent (the connection is handed back).
bool SendStepReply(WorkerSide *w, const duckd_frame_header &h,
                   const duck_info &info, int32_t status, uint64_t worker_ns,
                   absl::Time deadline) {
  if (w->quiet)
    return true;
  const WorkerConfig &cfg = *w->cfg;
  Control *ctl = w->ctl;
  duckd_step_reply rep{};
  rep.status = status;
  rep.cores = cfg.cores;
  rep.ob_bytes = std::min<uint64_t>(info.ob_size, cfg.ob_limit);
  rep.worker_ns = worker_ns;
  uint64_t kernelNs[DUCKD_MAX_CORES];
  const double nsPerTick = cfg.tsc_hz ? 1e9 / double(cfg.tsc_hz) : 0;
  for (uint32_t c = 0; c < cfg.cores; ++c)
    kernelNs[c] = uint64_t(double(ctl->core_cycles[c]) * nsPerTick);
  Part parts[2 + 2 * DUCKD_MAX_CORES];
  size_t n = 0;
  parts[n++] = {&rep, sizeof rep};
  parts[n++] = {kernelNs, cfg.cores * sizeof(uint64_t)};
  parts[n++] = {w->ob, rep.ob_bytes};
  for (uint32_t c = 0; c < cfg.cores; ++c) {
    uint64_t len = std::min<uint64_t>(ctl->log_size[c], kLogBytes - 1);
    if (len) {
      parts[n++] = {w->logs + c * kLogBytes, len};
      rep.log_bytes += len;
    }
  }
  absl::Status s =
      WriteFrame(cfg.conn_fd, h.type, DUCKD_FLAG_REPLY, h.request_id,
                 absl::MakeConstSpan(parts, n), deadline, &ctl->keys);
  if (!s.ok()) {
    HandBack(w, Handback::kDrop, nullptr,
             absl::StrCat("step reply failed: ", s.message()));
    return false;
  }
  return true;
}

/// What a step's IB asks of duckd besides the ELF's call (abi.h's
/// DUCK_IB_STAGE and DUCK_IB_STAGED).
struct Staging {
  uint32_t flags = 0;     // DUCK_IB_STAGE, DUCK_IB_STAGED or 0
  uint32_t out_flags = 0; // the out form the host asked for
};

/// Writes the ELF's IB for a staged call into w->ib: `ih` (its flags
/// those of the call), `slots` (n_tokens * ih.top_k) and the stage's x.
/// Its bytes; 0 when it would not fit the session's IB.
uint64_t WriteStagedIb(WorkerSide *w, duck_ib_header ih,
                       const duck_expert_slot *slots) {
  const uint64_t n = uint64_t(ih.n_tokens) * ih.top_k;
  ih.x_offset = duck_ib_x_offset(n);
  const std::vector<uint8_t> &x = w->stage.x;
  if (ih.x_offset + x.size() > w->cfg->ib_limit)
    return 0;
  const uint64_t slotEnd = sizeof ih + n * sizeof(duck_expert_slot);
  // The slots may be the IB's own (a staged step's): moved before the
  // header and the padding are written over the bytes around them.
  std::memmove(w->ib + sizeof ih, slots, n * sizeof(duck_expert_slot));
  std::memcpy(w->ib, &ih, sizeof ih);
  std::memset(w->ib + slotEnd, 0, ih.x_offset - slotEnd);
  std::memcpy(w->ib + ih.x_offset, x.data(), x.size());
  return ih.x_offset + x.size();
}

/// Reads a step's IB header for staging: a stage's header, slots (each
/// token's by expert id, the order of the ELF's sum) and x kept; a staged
/// step's IB made whole with its stage's x. "" or why the step cannot run,
/// answered with `code`. `had`: the step frame right before this one was
/// a stage that ran (every step frame takes the stage away on arrival,
/// TakeStage: it is used once, by the very next one).
std::string PrepareStaging(WorkerSide *w, bool had, uint64_t *ib_bytes,
                           Staging *st, duckd_error_code *code) {
  WorkerSide::Stage &s = w->stage;
  duck_ib_header ih;
  if (*ib_bytes < sizeof ih)
    return std::string(); // the ELF answers BAD_INPUT
  std::memcpy(&ih, w->ib, sizeof ih);
  if (ih.magic != DUCK_IB_MAGIC)
    return std::string(); // not an IB: the ELF answers BAD_INPUT
  const uint32_t kOut = DUCK_IB_OUT_BF16 | DUCK_IB_OUT_Q8;
  st->flags = ih.flags & (DUCK_IB_STAGE | DUCK_IB_STAGED);
  st->out_flags = ih.flags & kOut;
  if (!st->flags)
    return std::string();
  *code = DUCKD_ERR_BAD_REQUEST;
  const bool decode =
      ih.mode == DUCK_MODE_MOE_DECODE || ih.mode == DUCK_MODE_MOE_DECODE_SMP;
  const uint64_t n = uint64_t(ih.n_tokens) * ih.top_k;
  const uint64_t slotEnd = sizeof ih + n * sizeof(duck_expert_slot);
  if (st->flags == (DUCK_IB_STAGE | DUCK_IB_STAGED) || !decode ||
      ih.n_tokens == 0 || ih.top_k == 0 || slotEnd > *ib_bytes)
    return absl::StrCat("a staged step (IB flags ", ih.flags,
                        ") must be one MoE decode step with its slots");
  ih.flags &= ~(DUCK_IB_STAGE | DUCK_IB_STAGED | kOut);
  const auto *slots =
      reinterpret_cast<const duck_expert_slot *>(w->ib + sizeof ih);
  if (st->flags == DUCK_IB_STAGE) {
    if (ih.x_offset < slotEnd || ih.x_offset > *ib_bytes)
      return "a stage's x_offset is outside its IB";
    if (n > s.slots.capacity())
      return "a stage of more slots than an IB holds";
    s.ih = ih;
    s.x.assign(w->ib + ih.x_offset, w->ib + *ib_bytes);
    s.slots.assign(slots, slots + n);
    for (uint64_t t = 0; t < ih.n_tokens; ++t) { // stable, as the ELF's
      duck_expert_slot *row = s.slots.data() + t * ih.top_k;
      for (uint32_t i = 1; i < ih.top_k; ++i)
        for (uint32_t j = i; j > 0 && row[j - 1].expert > row[j].expert; --j)
          std::swap(row[j - 1], row[j]);
    }
    return std::string();
  }
  const uint32_t kX = DUCK_IB_X_BF16 | DUCK_IB_X_Q8;
  if (!had || s.ih.slot != ih.slot || s.ih.n_tokens != ih.n_tokens ||
      (s.ih.flags & kX) != (ih.flags & kX)) {
    *code = DUCKD_ERR_STAGE_MISSED;
    return absl::StrCat("staged step on slot ", ih.slot,
                        ": no stage of its own came before it");
  }
  *ib_bytes = WriteStagedIb(w, ih, slots);
  if (*ib_bytes == 0) {
    *code = DUCKD_ERR_TOO_LARGE;
    return "a staged step with its stage's x exceeds the session's IB";
  }
  return std::string();
}

/// The fp32 rows of the OB a call wrote (n values), or null.
float *Fp32Out(const WorkerSide *w, const duck_info &info, uint64_t *n) {
  duck_ob_header oh;
  if (info.ob_size < sizeof oh)
    return nullptr;
  std::memcpy(&oh, w->ob, sizeof oh);
  *n = uint64_t(oh.n_tokens) * oh.hidden;
  if (oh.out_offset != sizeof oh || sizeof oh + 4 * *n > info.ob_size)
    return nullptr;
  return reinterpret_cast<float *>(w->ob + oh.out_offset);
}

/// A stage: each of its tokens' slots run alone, in expert order, their
/// fp32 results kept apart, so that the staged step adds them one by one
/// after the routed experts' sum, as the whole step's sum would. Its
/// status; a call's results that cannot be kept are *bad.
int32_t RunStage(WorkerSide *w, const duckd_frame_header &h, duck_info &info,
                 uint64_t *worker_ns, std::string *bad) {
  WorkerSide::Stage &s = w->stage;
  const uint32_t k = s.ih.top_k;
  duck_ib_header one = s.ih;
  one.top_k = 1;
  s.out.clear();
  std::vector<duck_expert_slot> &column = s.column;
  column.resize(s.ih.n_tokens); // within its reserve
  int32_t status = DUCK_STATUS_OK;
  *worker_ns = 0;
  uint64_t cycles[DUCKD_MAX_CORES] = {}; // every call's, for the reply
  const uint32_t cores = std::min<uint32_t>(w->cfg->cores, DUCKD_MAX_CORES);
  for (uint32_t j = 0; j < k && status == DUCK_STATUS_OK; ++j) {
    for (uint32_t t = 0; t < s.ih.n_tokens; ++t)
      column[t] = s.slots[uint64_t(t) * k + j];
    const uint64_t bytes = WriteStagedIb(w, one, column.data());
    if (bytes == 0) {
      *bad = "a stage's x exceeds the session's IB";
      return status;
    }
    uint64_t ns = 0;
    status = RunStep(w, h, info, bytes, &ns);
    *worker_ns += ns;
    for (uint32_t c = 0; c < cores; ++c)
      cycles[c] += w->ctl->core_cycles[c];
    uint64_t n = 0;
    const float *out = Fp32Out(w, info, &n);
    if (status != DUCK_STATUS_OK)
      break;
    if (!out || s.out.size() + n > s.out.capacity()) {
      *bad = "a stage's results exceed what duckd keeps (its OB limit)";
      return status;
    }
    s.out.insert(s.out.end(), out, out + n);
  }
  if (status == DUCK_STATUS_OK) {
    s.valid = true;
    s.cast = false;                        // RunCastStage says otherwise
    info.ob_size = sizeof(duck_ob_header); // the header alone
    uint64_t most = 0;
    for (uint32_t c = 0; c < cores; ++c) {
      w->ctl->core_cycles[c] = cycles[c];
      most = std::max(most, cycles[c]);
    }
    const WorkerConfig &cfg = *w->cfg;
    s.kernel_ns =
        cfg.tsc_hz ? uint64_t(double(most) * 1e9 / double(cfg.tsc_hz)) : 0;
  }
  return status;
}

/// A staged step's answer: the routed experts' sum (the ELF's, fp32),
/// then each kept stage result added in turn, narrowed as asked. "" or
/// why the OB cannot be used.
std::string FinishStaged(WorkerSide *w, const Staging &st, duck_info &info) {
  WorkerSide::Stage &s = w->stage;
  uint64_t n = 0;
  float *out = Fp32Out(w, info, &n);
  if (!out || n == 0 || s.out.size() != n * s.ih.top_k)
    return "a staged step's results do not match its stage's";
  for (uint32_t j = 0; j < s.ih.top_k; ++j) {
    const float *add = s.out.data() + uint64_t(j) * n;
    for (uint64_t i = 0; i < n; ++i)
      out[i] += add[i];
  }
  duck_ob_header oh;
  std::memcpy(&oh, w->ob, sizeof oh);
  oh.stage_ns = s.kernel_ns;
  oh.stage_ahead_ns = std::exchange(s.ahead_ns, 0);
  std::memcpy(w->ob, &oh, sizeof oh);
  info.ob_size =
      sizeof oh + duck_narrow_out(out, oh.n_tokens, oh.hidden, st.out_flags);
  return std::string();
}

/// The stage a step frame found on its arrival: none, a quiet stage's
/// (the frame before it), or a cast stage's batch run since the frame
/// before it. No later frame may use it.
enum class Left { none, framed, cast };
Left TakeStage(WorkerSide *w) {
  w->stage.ahead_ns = 0;
  if (!std::exchange(w->stage.valid, false))
    return Left::none;
  return std::exchange(w->stage.cast, false) ? Left::cast : Left::framed;
}

/// Runs a step whose IB is in (its staging first) and answers it.
bool RunAndReply(WorkerSide *w, const duckd_frame_header &h, duck_info &info,
                 bool staged, uint64_t ib_bytes, absl::Time deadline) {
  Staging st;
  duckd_error_code code = DUCKD_ERR_BAD_REQUEST;
  if (std::string bad = PrepareStaging(w, staged, &ib_bytes, &st, &code);
      !bad.empty())
    return StepError(w, h, deadline, code, bad);
  if (w->quiet && st.flags != DUCK_IB_STAGE)
    return StepError(w, h, deadline, DUCKD_ERR_BAD_REQUEST,
                     "a quiet step must be a stage (DUCK_IB_STAGE)");
  uint64_t workerNs = 0;
  std::string bad;
  int32_t status;
  if (st.flags == DUCK_IB_STAGE) {
    status = RunStage(w, h, info, &workerNs, &bad);
  } else {
    status = RunStep(w, h, info, ib_bytes, &workerNs);
    if (st.flags == DUCK_IB_STAGED && status == DUCK_STATUS_OK)
      bad = FinishStaged(w, st, info);
  }
  if (!bad.empty())
    return StepError(w, h, deadline, DUCKD_ERR_INTERNAL, bad);
  return SendStepReply(w, h, info, status, workerNs, deadline);
}

/// Session worker, core 0: serves one STEP frame whose header is read.
/// Returns false when the connection is no longer usable (handed back).
bool ServeStep(WorkerSide *w, const duckd_frame_header &h, duck_info &info,
               FrameCheck &check, const duckd_step_request *preread) {
  const absl::Time deadline = absl::Now() + w->cfg->io_timeout;
  const bool staged = TakeStage(w) == Left::framed;
  w->quiet = h.flags & DUCKD_FLAG_QUIET;
  // The frame's check covers every byte read; nothing is acted on (not
  // even answered with a complaint) before it has passed.
  check.Begin(h, &w->ctl->keys);
  uint64_t ibBytes = 0;
  if (std::optional<bool> done =
          TakeStep(w, h, check, preread, deadline, &ibBytes))
    return *done;
  return RunAndReply(w, h, info, staged, ibBytes, deadline);
}

/// What is wrong with a request (`what`) naming a cast batch of `ib_bytes`
/// in `datagrams` of `datagram_bytes` for session `session` ("" when
/// nothing); *shape is the batch's. step_cast's and step_staged's.
std::string BatchRequestProblem(const WorkerConfig &cfg, const char *what,
                                uint64_t session, uint64_t ib_bytes,
                                uint32_t datagram_bytes, uint32_t datagrams,
                                CastShape *shape, duckd_error_code *code) {
  *code = DUCKD_ERR_BAD_REQUEST;
  if (session != cfg.session_id) {
    *code = DUCKD_ERR_NO_SESSION;
    return absl::StrCat(what, " for session ", session,
                        "; the open session is ", cfg.session_id);
  }
  if (ib_bytes > cfg.ib_limit) {
    *code = DUCKD_ERR_TOO_LARGE;
    return absl::StrCat(what, ": IB of ", ib_bytes,
                        " bytes exceeds the session's ", cfg.ib_limit);
  }
  auto s = CastShapeFor(ib_bytes,
                        datagram_bytes + uint32_t(sizeof(duckd_cast_datagram)));
  if (!s.ok() || datagram_bytes > DUCKD_CAST_MAX_DATAGRAM ||
      s->datagrams != datagrams)
    return absl::StrCat(what, ": a batch of ", datagrams, " datagrams of ",
                        datagram_bytes, " bytes cannot carry ", ib_bytes,
                        " bytes");
  *shape = *s;
  return std::string();
}

/// What is wrong with a step_cast request for this session ("" when
/// nothing); *shape is the batch's.
std::string CastRequestProblem(const WorkerSide &w,
                               const duckd_step_cast_request &r,
                               CastShape *shape, duckd_error_code *code) {
  if (std::string bad =
          BatchRequestProblem(*w.cfg, "step_cast", r.session_id, r.ib_bytes,
                              r.datagram_bytes, r.datagrams, shape, code);
      !bad.empty())
    return bad;
  if (!w.cast) {
    *code = DUCKD_ERR_CAST_MISSED;
    return "duckd has no cast socket (start it with --cast)";
  }
  return std::string();
}

/// Session worker, core 0: serves one STEP_CAST frame whose header is
/// read (with its request, when `preread`): its request from the
/// connection, its IB from the cast socket.
/// Returns false when the connection is no longer usable (handed back).
bool ServeCastStep(WorkerSide *w, const duckd_frame_header &h, duck_info &info,
                   FrameCheck &check, const duckd_step_cast_request *preread) {
  const WorkerConfig &cfg = *w->cfg;
  const absl::Time deadline = absl::Now() + cfg.io_timeout;
  const bool staged = TakeStage(w) == Left::framed;
  w->quiet = h.flags & DUCKD_FLAG_QUIET;
  check.Begin(h, &w->ctl->keys);
  duckd_step_cast_request r{};
  if (preread) {
    r = *preread;
  } else if (h.payload_bytes != sizeof r) {
    return RefuseRest(w, h, check, h.payload_bytes, deadline, "step_cast",
                      DUCKD_ERR_BAD_REQUEST,
                      absl::StrCat("step_cast of ", h.payload_bytes,
                                   " bytes (its request is ", sizeof r, ")"));
  } else if (absl::Status s = ReadFull(cfg.conn_fd, &r, sizeof r, deadline);
             !s.ok()) {
    HandBack(w, Handback::kDrop, nullptr,
             absl::StrCat("truncated step_cast: ", s.message()));
    return false;
  }
  check.Update(&r, sizeof r);
  if (!StepVerified(w, h, deadline, check))
    return w->ctl->owner.load() == kOwnerWorker;
  CastShape shape;
  duckd_error_code code = DUCKD_ERR_BAD_REQUEST;
  if (std::string bad = CastRequestProblem(*w, r, &shape, &code); !bad.empty())
    return StepError(w, h, deadline, code, bad);
  if (!w->cast->Take(r.cast_id, shape, r.ib_bytes, w->ib, cfg.cast_wait_ns,
                     cfg.spin_ns))
    return StepError(w, h, deadline, DUCKD_ERR_CAST_MISSED,
                     absl::StrCat("batch ", r.cast_id, ": not all of its ",
                                  r.datagrams, " datagrams came within ",
                                  cfg.cast_wait_ns / 1000, " us"));
  uint8_t digest[DUCKD_CAST_DIGEST_BYTES];
  CastDigest(absl::MakeConstSpan(w->ib, r.ib_bytes), w->ctl->keys.keyed,
             digest);
  if (std::memcmp(digest, r.digest, sizeof digest) != 0)
    return StepError(w, h, deadline, DUCKD_ERR_CAST_MISSED,
                     absl::StrCat("batch ", r.cast_id,
                                  ": its datagrams do not match the step's "
                                  "digest"));
  if (std::string why = DamagedSlotRefusal(cfg.weights_map, w->ib, r.ib_bytes);
      !why.empty())
    return StepError(w, h, deadline, DUCKD_ERR_CACHE, why);
  return RunAndReply(w, h, info, staged, r.ib_bytes, deadline);
}

/// Prepares and runs a stage whose IB (ib_bytes) is in w->ib, taken from
/// cast batch `cast_id` (its digest first: the run writes over the IB).
/// "" when it ran and is kept (w->stage, cast), else why not.
std::string RunCastStage(WorkerSide *w, const duckd_frame_header &h,
                         duck_info &info, uint64_t cast_id, uint64_t ib_bytes) {
  const WorkerConfig &cfg = *w->cfg;
  WorkerSide::Stage &s = w->stage;
  CastDigest(absl::MakeConstSpan(w->ib, ib_bytes), w->ctl->keys.keyed,
             s.digest);
  if (std::string why = DamagedSlotRefusal(cfg.weights_map, w->ib, ib_bytes);
      !why.empty())
    return why;
  Staging st;
  duckd_error_code code = DUCKD_ERR_BAD_REQUEST;
  if (std::string bad = PrepareStaging(w, false, &ib_bytes, &st, &code);
      !bad.empty())
    return bad;
  if (st.flags != DUCK_IB_STAGE)
    return "its IB is not a stage (DUCK_IB_STAGE)";
  uint64_t ns = 0;
  std::string bad;
  const int32_t status = RunStage(w, h, info, &ns, &bad);
  if (status != DUCK_STATUS_OK)
    return absl::StrCat("ELF status ", status);
  if (!bad.empty())
    return bad;
  s.cast = true;
  s.cast_id = cast_id;
  s.done_ns = NowNs();
  return std::string();
}

/// While waiting for a frame: a cast stage's batch Intake found whole is
/// run now, before its step_staged frame comes (a failure is logged:
/// that frame then takes the batch itself or finds no stage).
void IntakeCastStage(WorkerSide *w, duck_info &info) {
  if (w->cast->HoldsStepBatch() || !w->cast->Intake())
    return;
  TakeStage(w); // a stage is used by the very next step frame only
  uint64_t id = 0, bytes = 0;
  std::string why = "its datagrams do not make one IB";
  if (w->cast->TakeHeldStage(w->ib, w->cfg->ib_limit, &id, &bytes))
    why = RunCastStage(w, duckd_frame_header{}, info, id, bytes);
  if (!why.empty()) {
    w->stage.valid = false;
    w->stage.failed_id = id;
    w->stage.failed_why = why;
    std::fprintf(stderr, "%s cast stage %llu not run: %s\n",
                 w->cfg->log_prefix.c_str(), (unsigned long long)id,
                 why.c_str());
  }
}

/// PeekHeader for a worker with a cast socket: waits on the connection
/// and the cast socket together, running cast stages as they come whole
/// (the cast socket is read first: a batch leaves before its frame).
bool WaitFrame(WorkerSide *w, duck_info &info, duckd_frame_header *h) {
  const WorkerConfig &cfg = *w->cfg;
  if (!w->cast)
    return PeekHeader(cfg.conn_fd, cfg.spin_ns, h);
  for (;;) {
    const uint64_t start = NowNs();
    for (uint32_t i = 0; cfg.spin_ns; ++i) {
      IntakeCastStage(w, info);
      ssize_t n = ::recv(cfg.conn_fd, h, sizeof *h, MSG_PEEK | MSG_DONTWAIT);
      if (n == ssize_t(sizeof *h))
        return true;
      if (n == 0 ||
          (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        return false;
      if (NowNs() - start >= cfg.spin_ns)
        break;
      if (i % 16 == 15)
        sched_yield();
      else
        _mm_pause();
    }
    // A cast step's datagrams in: only its frame is awaited (woken once).
    pollfd p[2] = {{cfg.conn_fd, POLLIN, 0}, {cfg.cast_fd, POLLIN, 0}};
    const nfds_t n = !w->wake_for_casts || w->cast->HoldsStepBatch() ? 1 : 2;
    if (::poll(p, n, -1) < 0 && errno != EINTR)
      return false;
    if (n == 2 && (p[1].revents & POLLIN)) {
      IntakeCastStage(w, info);
      continue; // spin again: its staged step follows
    }
    if (p[0].revents)
      return PeekHeader(cfg.conn_fd, 0, h);
  }
}

/// What is wrong with a step_staged request of `rest` IB bytes ("" when
/// nothing); *shape is its stage's batch's.
std::string StagedRequestProblem(const WorkerSide &w,
                                 const duckd_step_staged_request &r,
                                 uint64_t rest, CastShape *shape,
                                 duckd_error_code *code) {
  *code = DUCKD_ERR_BAD_REQUEST;
  if (r.ib_bytes != rest)
    return "step_staged: ib_bytes does not match the payload";
  return BatchRequestProblem(*w.cfg, "step_staged", r.session_id,
                             r.stage_ib_bytes, r.datagram_bytes, r.datagrams,
                             shape, code);
}

/// A step_staged whose stage did not run before it: its batch taken now
/// (within the cast wait), checked and run. "" when it ran, else why not.
std::string LateStage(WorkerSide *w, const duckd_frame_header &h,
                      duck_info &info, const duckd_step_staged_request &r,
                      const CastShape &shape) {
  const WorkerConfig &cfg = *w->cfg;
  if (!w->cast)
    return "duckd has no cast socket (start it with --cast)";
  if (!w->cast->Take(r.cast_id, shape, r.stage_ib_bytes, w->ib,
                     cfg.cast_wait_ns, cfg.spin_ns, DUCKD_CAST_STAGE_MAGIC))
    return absl::StrCat("not all of its ", r.datagrams,
                        " datagrams came within ", cfg.cast_wait_ns / 1000,
                        " us");
  std::string why = RunCastStage(w, h, info, r.cast_id, r.stage_ib_bytes);
  if (why.empty() && std::memcmp(w->stage.digest, r.digest, sizeof r.digest))
    why = "its datagrams do not match the step's digest";
  return why;
}

/// Session worker, core 0: serves one STEP_STAGED frame whose header,
/// request and IB (w->stage.routed) are read (`preread`; null: a frame
/// of another size, read and refused here).
bool ServeStagedStep(WorkerSide *w, const duckd_frame_header &h,
                     duck_info &info, FrameCheck &check,
                     const duckd_step_staged_request *preread) {
  const WorkerConfig &cfg = *w->cfg;
  const absl::Time deadline = absl::Now() + cfg.io_timeout;
  const uint64_t arrived = NowNs();
  const Left left = TakeStage(w);
  w->quiet = false;
  w->wake_for_casts = true; // this host sends cast stages
  check.Begin(h, &w->ctl->keys);
  if (!preread)
    return RefuseRest(w, h, check, h.payload_bytes, deadline, "step_staged",
                      DUCKD_ERR_BAD_REQUEST,
                      absl::StrCat("step_staged of ", h.payload_bytes,
                                   " bytes: shorter than its request, or an "
                                   "IB over the session's"));
  const duckd_step_staged_request &r = *preread;
  const std::vector<uint8_t> &routed = w->stage.routed;
  check.Update(&r, sizeof r);
  check.Update(routed.data(), routed.size());
  if (!StepVerified(w, h, deadline, check))
    return w->ctl->owner.load() == kOwnerWorker;
  CastShape shape;
  duckd_error_code code = DUCKD_ERR_BAD_REQUEST;
  if (std::string bad =
          StagedRequestProblem(*w, r, routed.size(), &shape, &code);
      !bad.empty())
    return StepError(w, h, deadline, code, bad);
  WorkerSide::Stage &s = w->stage;
  std::string why; // why its stage cannot be used
  if (left == Left::cast && s.cast_id == r.cast_id) { // ran on arrival
    s.ahead_ns = arrived - std::min(arrived, s.done_ns);
    if (std::memcmp(s.digest, r.digest, sizeof r.digest) != 0)
      why = "its datagrams do not match the step's digest";
  } else if (s.failed_id == r.cast_id && !s.failed_why.empty()) {
    why = s.failed_why; // came whole, could not run
  } else {
    why = LateStage(w, h, info, r, shape);
    s.valid = false; // used by this frame only, if at all
  }
  s.failed_why.clear();
  if (!why.empty())
    return StepError(w, h, deadline, DUCKD_ERR_STAGE_MISSED,
                     absl::StrCat("stage batch ", r.cast_id, ": ", why));
  if (std::string why =
          DamagedSlotRefusal(cfg.weights_map, routed.data(), routed.size());
      !why.empty())
    return StepError(w, h, deadline, DUCKD_ERR_CACHE, why);
  std::memcpy(w->ib, routed.data(), routed.size());
  return RunAndReply(w, h, info, true, routed.size(), deadline);
}

/// Reads a frame's parts in one go; false (the connection handed back,
/// "truncated WHAT") when they did not all come.
bool ReadParts(WorkerSide *w, absl::Span<const MutablePart> parts,
               absl::Time deadline, const char *what) {
  absl::Status s = ReadFullV(w->cfg->conn_fd, parts, deadline);
  if (!s.ok())
    HandBack(w, Handback::kDrop, nullptr,
             absl::StrCat("truncated ", what, ": ", s.message()));
  return s.ok();
}

/// Session worker, core 0: serves the frame whose header `h` it peeked:
/// a step, cast step or staged step; hands any other back to duckd.
/// Whether it still holds the connection.
bool ServeFrame(WorkerSide *w, duckd_frame_header h, duck_info &info,
                FrameCheck &check) {
  const WorkerConfig &cfg = *w->cfg;
  const absl::Time deadline = absl::Now() + cfg.io_timeout;
  constexpr uint32_t kQuiet = DUCKD_FLAG_QUIET; // a step's only flag
  const bool valid = ValidateHeader(h, cfg.max_payload).ok();
  const bool step = valid && h.type == DUCKD_MSG_STEP && !(h.flags & ~kQuiet);
  const bool cast =
      valid && h.type == DUCKD_MSG_STEP_CAST && !(h.flags & ~kQuiet);
  const bool staged = valid && h.type == DUCKD_MSG_STEP_STAGED && !h.flags;
  // Fast paths: a whole well-formed step is read with one recvmsg (header,
  // request, IB into the ELF's input buffer); a cast step's header and
  // request; a staged step's and its IB (the routed slots).
  if (step && h.payload_bytes >= sizeof(duckd_step_request) &&
      h.payload_bytes - sizeof(duckd_step_request) <= cfg.ib_limit) {
    duckd_step_request r;
    const MutablePart parts[] = {
        {&h, sizeof h}, {&r, sizeof r}, {w->ib, h.payload_bytes - sizeof r}};
    return ReadParts(w, parts, deadline, "step") &&
           ServeStep(w, h, info, check, &r);
  }
  if (cast && h.payload_bytes == sizeof(duckd_step_cast_request)) {
    duckd_step_cast_request r;
    const MutablePart parts[] = {{&h, sizeof h}, {&r, sizeof r}};
    return ReadParts(w, parts, deadline, "step_cast") &&
           ServeCastStep(w, h, info, check, &r);
  }
  if (staged && h.payload_bytes >= sizeof(duckd_step_staged_request) &&
      h.payload_bytes - sizeof(duckd_step_staged_request) <= cfg.ib_limit) {
    duckd_step_staged_request r;
    std::vector<uint8_t> &routed = w->stage.routed; // within its reserve
    routed.resize(h.payload_bytes - sizeof r);
    const MutablePart parts[] = {
        {&h, sizeof h}, {&r, sizeof r}, {routed.data(), routed.size()}};
    return ReadParts(w, parts, deadline, "step_staged") &&
           ServeStagedStep(w, h, info, check, &r);
  }
  const MutablePart header[] = {{&h, sizeof h}};
  if (!ReadParts(w, header, deadline, "frame header"))
    return false;
  if (staged)
    return ServeStagedStep(w, h, info, check, nullptr);
  if (cast)
    return ServeCastStep(w, h, info, check, nullptr);
  if (!step) {
    HandBack(w, Handback::kFrame, &h, "");
    return false;
  }
  return ServeStep(w, h, info, check, nullptr);
}

/// Session worker, core 0: serves STEP, STEP_CAST and STEP_STAGED frames
/// while it holds the connection; hands every other frame back to duckd.
void ServeConnection(WorkerSide *w) {
  const WorkerConfig &cfg = *w->cfg;
  Control *ctl = w->ctl;
  Pin(cfg.cpus.empty() ? -1 : cfg.cpus[0]);
  duck_info info = w->InfoFor(0);
  FrameCheck &check = *w->check; // made before the sandbox
  for (;;) {
    // Wait until duckd lends the connection.
    WaitChange(&ctl->owner, nullptr, kOwnerDaemon, cfg.spin_ns);
    TakeStage(w); // a stage never outlives the worker's hold
    bool holding = true;
    while (holding) {
      duckd_frame_header h{};
      if (!WaitFrame(w, info, &h)) {
        HandBack(w, Handback::kDrop, nullptr, "disconnected");
        break;
      }
      holding = ServeFrame(w, h, info, check);
    }
  }
}

/// A session worker's cast receiver, made (and its digest readied) before
/// the sandbox. Intake keeps a batch while no frame asks for it: a cast
/// stage's (run at once), or a cast step's that came before its frame.
std::unique_ptr<CastReceiver> MakeCastReceiver(const WorkerConfig &cfg) {
  WarmUpCastDigest();
  return std::make_unique<CastReceiver>(
      cfg.cast_fd, cfg.ib_limit + cfg.ib_limit / 8 + (64 << 10));
}

/// The ELF may read the weight buffer, never write it; a finished image is
/// mapped now, in one call (2 MiB at a time where the page cache holds
/// large folios), rather than a fault a page in the first prompt's steps
/// (WorkerConfig::populate_bytes; best effort), and then read a byte of
/// every 4 KiB page: a hypervisor that shadows the guest's page tables
/// (this project's development VM) charges each process a first touch of
/// every 4 KiB page even where the guest maps 2 MiB, and a worker is a new
/// process. Paid here, before the ducks report ready (about 25 ms for a
/// 1.3 GB image there), it is not paid inside the first prompt's steps
/// (a Qwen3-30B-A3B-shape prompt 391 -> 481 tok/s, its decode's duck
/// kernel 4.0 -> 3.3 ms a token; docs/perf.md). Returns what failed.
std::string MapWeightsReadOnly(const WorkerConfig &cfg) {
  if (cfg.weights_map &&
      ::mprotect(cfg.weights_map, cfg.weights_map_bytes, PROT_READ) != 0)
    return absl::StrCat("mprotect weights: ", std::strerror(errno));
  TouchPages(cfg.image, cfg.populate_bytes, false); // read: mapped read-only
  return "";
}

/// The session's scratch (private, in 2 MiB pages where the kernel allows;
/// a 64-token MoE chunk's is ~7 MB) and its IB and OB, all mapped before
/// the host's first step: the first prompt's MoE step took 2,600 page
/// faults here, 20-35 ms of a Qwen3-30B-A3B-shape prompt on the
/// development VM. The worker reads the IB and writes the OB. Returns
/// what failed.
std::string MapStepBuffers(const WorkerConfig &cfg, uint8_t *ib, uint8_t *ob,
                           uint8_t **scratch) {
  if (cfg.scratch_bytes) {
    void *s = ::mmap(nullptr, PageUp(cfg.scratch_bytes), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED)
      return absl::StrCat("scratch of ", cfg.scratch_bytes,
                          " bytes: ", std::strerror(errno));
    *scratch = static_cast<uint8_t *>(s);
    (void)::madvise(s, PageUp(cfg.scratch_bytes), MADV_HUGEPAGE);
    TouchPages(*scratch, cfg.scratch_bytes, true);
  }
  TouchPages(ib, cfg.ib_limit, false);
  TouchPages(ob, cfg.ob_limit, true);
  return "";
}

[[noreturn]] void WorkerMain(const WorkerConfig &cfg, Control *ctl, int efd,
                             uint8_t *elfArea, uint8_t *ib, uint8_t *ob,
                             uint8_t *logs, absl::Span<const uint8_t> elf,
                             pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent)
    _exit(0);
  prctl(PR_SET_NAME, "duckd-worker");
  for (int fd : cfg.close_in_child)
    if (fd >= 0 && fd != cfg.conn_fd && fd != cfg.cast_fd)
      ::close(fd);
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  auto fail = [&](const std::string &m) {
    CopyMessage(ctl->message, sizeof ctl->message, m);
    ctl->ready.store(kReadyFailed, std::memory_order_seq_cst);
    Notify(efd);
    _exit(0);
  };
  if (std::string why = MapWeightsReadOnly(cfg); !why.empty())
    fail(why);
  WorkerSide w;
  w.cfg = &cfg;
  w.ctl = ctl;
  w.efd = efd;
  w.elf = elfArea;
  w.ib = ib;
  w.ob = ob;
  w.logs = logs;
  if (std::string why = MapStepBuffers(cfg, ib, ob, &w.scratch); !why.empty())
    fail(why);
  if (cfg.persistent) {
    auto loaded = LoadedElf::Load(elf, cfg.elf_limits);
    if (!loaded.ok())
      fail(std::string(loaded.status().message()));
    w.persistent = std::move(*loaded);
    w.step = w.persistent->step();
  }
  if (cfg.persistent) { // frames are checked and sealed from the sandbox
    w.stage.Reserve(cfg);
    w.check = std::make_unique<FrameCheck>();
    WarmUpFrameAuth(w.check.get());
    if (cfg.cast_fd >= 0)
      w.cast = MakeCastReceiver(cfg);
  }
  std::vector<std::thread> threads;
  for (uint32_t c = 1; c < cfg.cores; ++c)
    threads.emplace_back(CoreLoop, &w, c);
  // From here on the uploaded code runs: confine every thread.
  if (cfg.sandbox) {
    SandboxOptions so;
    so.keep_fds = {efd, cfg.conn_fd, cfg.cast_fd};
    so.allow_exec_mappings = !cfg.persistent; // one-shot: an ELF a call
    if (absl::Status s = EnterSandbox(so); !s.ok())
      fail(absl::StrCat("sandbox: ", s.message()));
  }
  ctl->ready.store(kReadyOk, std::memory_order_seq_cst);
  Notify(efd);
  if (cfg.persistent)
    ServeConnection(&w); // until duckd kills the session
  else
    CoreLoop(&w, 0);
  for (auto &t : threads)
    t.join();
  _exit(0);
}

} // namespace

uint64_t CalibrateTsc() {
  const uint64_t n0 = NowNs(), t0 = __rdtsc();
  timespec ts{0, 20 * 1000 * 1000};
  nanosleep(&ts, nullptr);
  const uint64_t n1 = NowNs(), t1 = __rdtsc();
  if (n1 <= n0 || t1 <= t0)
    return 0;
  return uint64_t(double(t1 - t0) * 1e9 / double(n1 - n0));
}

absl::StatusOr<std::unique_ptr<Worker>>
Worker::Spawn(const WorkerConfig &config, absl::Span<const uint8_t> elf) {
  if (config.cores == 0 || config.cores > DUCKD_MAX_CORES)
    return absl::InvalidArgumentError(
        absl::StrCat("cores ", config.cores, " outside [1, ", DUCKD_MAX_CORES,
                     "]"));
  if (config.persistent && config.conn_fd < 0)
    return absl::InvalidArgumentError("a session worker needs a connection");
  std::unique_ptr<Worker> w(new Worker());
  w->config_ = config;
  const uint64_t ctlBytes = PageUp(sizeof(Control));
  const uint64_t elfBytes = config.persistent ? 0 : PageUp(config.elf_limit);
  const uint64_t ibBytes = PageUp(std::max<uint64_t>(config.ib_limit, 1));
  const uint64_t obBytes = PageUp(std::max<uint64_t>(config.ob_limit, 1));
  const uint64_t logBytes = PageUp(config.cores * kLogBytes);
  w->region_bytes_ = ctlBytes + elfBytes + ibBytes + obBytes + logBytes;
  void *m = ::mmap(nullptr, w->region_bytes_, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return absl::ResourceExhaustedError(
        absl::StrCat("shared buffers of ", w->region_bytes_,
                     " bytes: ", std::strerror(errno)));
  w->region_ = static_cast<uint8_t *>(m);
  w->ctl_ = new (w->region_) Control();
  w->elf_ = w->region_ + ctlBytes;
  w->ib_ = w->elf_ + elfBytes;
  w->ob_ = w->ib_ + ibBytes;
  w->logs_ = w->ob_ + obBytes;
  // duckd writes the IB and reads the OB every step: mapped now, not in
  // the first steps (the worker maps them again for itself).
  TouchPages(w->ib_, ibBytes, true);
  TouchPages(w->ob_, obBytes, false);
  w->eventfd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (w->eventfd_ < 0)
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));

  std::fflush(stderr);
  const pid_t parent = getpid();
  const pid_t pid = ::fork();
  if (pid < 0)
    return absl::ResourceExhaustedError(
        absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0)
    WorkerMain(w->config_, w->ctl_, w->eventfd_, w->elf_, w->ib_, w->ob_,
               w->logs_, elf, parent);
  w->pid_ = pid;
  w->pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (w->pidfd_ < 0) {
    w->Reap(true);
    return absl::InternalError(
        absl::StrCat("pidfd_open: ", std::strerror(errno)));
  }
  if (absl::Status s = w->WaitReady(absl::Seconds(30)); !s.ok())
    return s;
  return w;
}

absl::Status Worker::WaitReady(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    uint32_t r = ctl_->ready.load(std::memory_order_seq_cst);
    if (r == kReadyOk)
      return absl::OkStatus();
    if (r == kReadyFailed) {
      std::string m = ctl_->message;
      Reap(false);
      return absl::InvalidArgumentError(m);
    }
    pollfd p[2] = {{eventfd_, POLLIN, 0}, {pidfd_, POLLIN, 0}};
    int ms = int(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (ms <= 0) {
      Reap(true);
      return absl::DeadlineExceededError("worker did not start in time");
    }
    ::poll(p, 2, std::min(ms, 100));
    uint64_t v;
    while (::read(eventfd_, &v, sizeof v) > 0) {
    }
    if ((p[1].revents & POLLIN) &&
        ctl_->ready.load(std::memory_order_seq_cst) == kReadyNo) {
      std::string how = Reap(false);
      return absl::InternalError(
          absl::StrCat("worker died while starting: ", how));
    }
  }
}

std::string Worker::Reap(bool kill_first) {
  if (pid_ <= 0)
    return "not running";
  if (kill_first)
    ::kill(pid_, SIGKILL);
  int status = 0;
  std::string how = "unknown";
  if (::waitpid(pid_, &status, 0) == pid_) {
    if (WIFSIGNALED(status))
      how = absl::StrCat("killed by ", SignalName(WTERMSIG(status)));
    else if (WIFEXITED(status))
      how = absl::StrCat("exited with status ", WEXITSTATUS(status));
  }
  pid_ = -1;
  if (pidfd_ >= 0)
    ::close(pidfd_);
  pidfd_ = -1;
  return how;
}

void Worker::Lend(uint64_t weights_bytes, uint64_t weights_generation,
                  const FrameKeys &keys) {
  ctl_->keys = keys;
  ctl_->weights_bytes = weights_bytes;
  ctl_->weights_generation = weights_generation;
  ctl_->handback_kind = Handback::kNone;
  ctl_->owner.store(kOwnerWorker, std::memory_order_seq_cst);
  Futex(&ctl_->owner, FUTEX_WAKE, INT_MAX);
}

bool Worker::lent() const {
  return ctl_->owner.load(std::memory_order_acquire) == kOwnerWorker;
}

Handback Worker::TakeBack() {
  uint64_t v;
  while (::read(eventfd_, &v, sizeof v) > 0) {
  }
  Handback h;
  if (lent())
    return h;
  h.kind = static_cast<Handback::Kind>(ctl_->handback_kind);
  h.header = ctl_->handback_header;
  h.message = ctl_->handback_message;
  h.keys = ctl_->keys;
  ctl_->handback_kind = Handback::kNone;
  return h;
}

FrameKeys Worker::keys() const { return ctl_->keys; }

bool Worker::in_step() const {
  return ctl_->in_step.load(std::memory_order_seq_cst) != 0;
}
uint32_t Worker::step_request_id() const { return ctl_->step_request_id; }
uint64_t Worker::step_number() const { return ctl_->step_number; }
absl::Duration Worker::step_elapsed() const {
  return absl::Nanoseconds(int64_t(NowNs() - ctl_->step_started_ns));
}

// Hands the worker its next call and wakes its cores if they sleep; the
// command's sequence number, which the worker's done_seq reaches when done.
uint32_t Worker::PostRun(uint64_t ib_bytes, uint64_t elf_bytes,
                         uint64_t weights_bytes, uint64_t weights_generation) {
  Control *ctl = ctl_;
  ctl->cmd = kCmdRun;
  ctl->step_seq = ++step_seq_;
  ctl->ib_bytes = ib_bytes;
  ctl->elf_bytes = elf_bytes;
  ctl->weights_bytes = weights_bytes;
  ctl->weights_generation = weights_generation;
  const uint32_t seq = ctl->cmd_seq.fetch_add(1, std::memory_order_seq_cst) + 1;
  if (ctl->sleepers.load(std::memory_order_seq_cst))
    Futex(&ctl->cmd_seq, FUTEX_WAKE, INT_MAX);
  return seq;
}

// Waits for the call to finish: spins, then yields, then sleeps on the
// eventfd; fails when the worker dies, `watch_fd` hangs up or the timeout
// passes (the worker reaped in each case).
absl::Status Worker::WaitDone(uint32_t seq, absl::Duration timeout,
                              int watch_fd) {
  Control *ctl = ctl_;
  const uint64_t start = NowNs();
  const absl::Time deadline = absl::Now() + timeout;
  for (uint32_t i = 0;; ++i) {
    if (ctl->done_seq.load(std::memory_order_acquire) == seq)
      return absl::OkStatus();
    if ((i & 63) != 63) {
      _mm_pause();
      continue;
    }
    if (NowNs() - start < config_.spin_ns) {
      sched_yield();
      continue;
    }
    ctl->main_sleeping.store(1, std::memory_order_seq_cst);
    if (ctl->done_seq.load(std::memory_order_seq_cst) == seq) {
      ctl->main_sleeping.store(0, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    pollfd p[3] = {{eventfd_, POLLIN, 0},
                   {pidfd_, POLLIN, 0},
                   {watch_fd, POLLRDHUP, 0}};
    const absl::Duration left = deadline - absl::Now();
    int ms = left <= absl::ZeroDuration()
                 ? 0
                 : int(std::min<int64_t>(
                       absl::ToInt64Milliseconds(left) + 1, 1000));
    int r = ::poll(p, watch_fd >= 0 ? 3 : 2, ms);
    ctl->main_sleeping.store(0, std::memory_order_relaxed);
    uint64_t v;
    while (::read(eventfd_, &v, sizeof v) > 0) {
    }
    if (ctl->done_seq.load(std::memory_order_acquire) == seq)
      return absl::OkStatus();
    if (r > 0 && (p[1].revents & POLLIN)) {
      std::string how = Reap(false);
      return absl::AbortedError(
          absl::StrCat("the ELF crashed in call ", step_seq_, ": worker ",
                       how));
    }
    if (r > 0 && watch_fd >= 0 && (p[2].revents & (POLLRDHUP | POLLHUP))) {
      Reap(true);
      return absl::CancelledError("host hung up during the call");
    }
    if (absl::Now() >= deadline) {
      Reap(true);
      return absl::DeadlineExceededError(absl::StrCat(
          "call ", step_seq_, " did not finish within ",
          absl::FormatDuration(timeout), "; worker killed"));
    }
  }
}

// What the finished call left in the control block: its status, OB size,
// times (cycles to ns) and each core's log.
StepOutcome Worker::ReadOutcome() const {
  const Control *ctl = ctl_;
  StepOutcome out;
  out.status = ctl->status;
  out.ob_bytes = std::min<uint64_t>(ctl->ob_size, config_.ob_limit);
  out.worker_ns = ctl->worker_ns;
  out.kernel_ns.resize(config_.cores);
  const double nsPerTick = config_.tsc_hz ? 1e9 / double(config_.tsc_hz) : 0;
  for (uint32_t c = 0; c < config_.cores; ++c)
    out.kernel_ns[c] = uint64_t(double(ctl->core_cycles[c]) * nsPerTick);
  for (uint32_t c = 0; c < config_.cores; ++c) {
    uint64_t n = std::min<uint64_t>(ctl->log_size[c], kLogBytes - 1);
    if (n)
      out.log.append(reinterpret_cast<const char *>(logs_ + c * kLogBytes), n);
  }
  return out;
}

absl::StatusOr<StepOutcome> Worker::Step(uint64_t ib_bytes, uint64_t elf_bytes,
                                         uint64_t weights_bytes,
                                         uint64_t weights_generation,
                                         absl::Duration timeout,
                                         int watch_fd) {
  if (pid_ <= 0)
    return absl::FailedPreconditionError("worker is not running");
  const uint32_t seq =
      PostRun(ib_bytes, elf_bytes, weights_bytes, weights_generation);
  if (absl::Status st = WaitDone(seq, timeout, watch_fd); !st.ok())
    return st;
  if (ctl_->load_failed)
    return absl::InvalidArgumentError(ctl_->message);
  return ReadOutcome();
}

void Worker::Stop(absl::Duration grace) {
  if (pid_ <= 0)
    return;
  if (config_.persistent) { // nothing to clean up: kill it
    Reap(true);
    return;
  }
  ctl_->cmd = kCmdExit;
  ctl_->cmd_seq.fetch_add(1, std::memory_order_seq_cst);
  Futex(&ctl_->cmd_seq, FUTEX_WAKE, INT_MAX);
  pollfd p{pidfd_, POLLIN, 0};
  ::poll(&p, 1, int(absl::ToInt64Milliseconds(grace)));
  Reap(!(p.revents & POLLIN));
}

Worker::~Worker() {
  if (pid_ > 0)
    Reap(true);
  if (eventfd_ >= 0)
    ::close(eventfd_);
  if (region_)
    ::munmap(region_, region_bytes_);
}

} // namespace duck::duckd
