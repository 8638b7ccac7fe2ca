//===- DuckClient.h - the host's connection to a cluster of ducks -*- C++ -*-===//
//
// Connects to N duckd daemons (docs/protocol.md), opens a persistent ELF
// session on each, sends one step to all of them at once and gathers the
// OBs, keeping the judge metrics of every step. Also streams weight images
// into the ducks' weight caches (prepare) with hit/miss reporting.
//
// No hidden threads: all ducks are driven from the calling thread through
// a DuckTransport (DuckTransport.h; TCP unless the options name another):
// the client speaks the protocol, the transport moves the frames.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_DUCKCLIENT_H
#define DUCK_RUNTIME_DUCKCLIENT_H

#include "duck/runtime/cluster/DuckTransport.h"

#include "duck_rt/duckd_protocol.h"
#include "duck_rt/kernel_select.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace duck::runtime {

struct DuckClientOptions {
  std::vector<DuckEndpoint> ducks;
  /// What carries the frames; null: TCP (TcpDuckTransport()).
  std::shared_ptr<DuckTransport> transport;
  std::string token; // presented at hello (ducks started with --token)
  /// Persistent sessions (open once, step many). false: every step sends
  /// the ELF with a one-shot `run`. DUCK_PERSISTENT=0 in the environment
  /// switches to false when `read_environment` is set.
  bool persistent = true;
  bool read_environment = true;
  uint32_t cores = 0; // per duck; 0: all of its cores
  uint64_t ib_limit = 1 << 20;
  uint64_t ob_limit = 1 << 20;
  uint64_t scratch_bytes = 64ull << 20;
  absl::Duration connect_timeout = absl::Seconds(5);
  /// A duck that has not answered a step by then is reported by name and
  /// its connection closed (a hung duck is an error, not a hang).
  absl::Duration step_timeout = absl::Seconds(30);
  absl::Duration call_timeout = absl::Seconds(60); // hello, open, prepare
  /// How long a step spins (polling without sleeping) for the replies
  /// before it blocks. The host thread is idle during a step anyway; a
  /// thread that sleeps through the whole FFN step pays a wake-up (tens of
  /// microseconds on a virtualised or power-saving CPU) on top of the
  /// network. 0: block at once.
  absl::Duration reply_spin = absl::ZeroDuration();
  uint64_t max_payload = DUCKD_DEFAULT_MAX_PAYLOAD;
  uint64_t prepare_chunk_bytes = 8ull << 20;
  /// Cast steps (duck_rt/cast.h, docs/protocol.md "Cast steps"): a step
  /// whose IB is the same for every duck, of at most cast_max_ib_bytes,
  /// goes out once as UDP datagrams to cast_address:cast_port (the ducks'
  /// multicast group, or the link simulator's relay), each duck getting a
  /// small step_cast frame over its connection; a duck that did not get the
  /// whole batch is sent the step again plainly, and one that misses
  /// cast_give_up steps in a row gets plain steps from then on. Empty
  /// address: every step goes to each duck over its connection.
  std::string cast_address;
  uint16_t cast_port = 0;
  std::string cast_interface;          // IP_MULTICAST_IF (empty: the route's)
  uint32_t cast_datagram_bytes = 1432; // UDP payload, header included
  uint64_t cast_max_ib_bytes = 64 << 10;
  uint32_t cast_give_up = 8;
  uint32_t cast_drop_every = 0; // for the loss tests: datagrams not sent
  /// Stages as one cast batch and no frame where they can go so (Stage);
  /// false: a quiet frame a duck, as without a cast address (for A/B
  /// runs: duckrun's DUCK_CAST_STAGES=0).
  bool cast_stages = true;
  /// For the tests: every this many cast stages, the staged steps name a
  /// digest the batch does not have (0: never).
  uint32_t stage_digest_flip_every = 0;
};

/// What the cast path did over a client's life.
struct CastStats {
  uint64_t steps = 0;          // steps whose IB went out as one batch
  uint64_t datagram_bytes = 0; // UDP payload sent, headers included
  uint64_t resent = 0;         // ducks sent a cast step again plainly
  uint64_t dropped = 0;        // datagrams not sent on purpose (drop_every)
  uint32_t ducks_off = 0;      // ducks given plain steps after misses
};

/// What a duck said at hello.
struct DuckHello {
  DuckEndpoint endpoint;
  std::string name;
  uint32_t cores = 0, pid = 0;
  uint64_t memory_bytes = 0, weights_capacity = 0, tsc_hz = 0;
  bool cache_valid = false, head_finished = false;
  duck_image_header image{}; // the cached image (when cache_valid)
  uint32_t finished_slots = 0;
  std::vector<uint8_t> finished_bitmap;
};

/// One duck's answer to a step.
struct DuckOutput {
  int32_t status = 0; // duck_status of core 0
  std::vector<uint8_t> ob;
  std::vector<uint64_t> kernel_ns; // per core, time inside the ELF
  uint64_t worker_ns = 0;          // duckd's time from IB to OB
  std::string log;
};

/// Judge metrics of one step (docs/reference-system.md, "Persistent judge").
struct StepMetrics {
  double judge_wait_us = 0; // host: first byte sent to last reply read
  double duck_max_us = 0;   // slowest duck's slowest core inside the ELF
  double judge_gap_us = 0;  // judge_wait - duck_max
  double judge_ratio = 0;   // judge_wait / duck_max
  uint64_t bytes_sent = 0, bytes_received = 0; // cast datagrams included
  bool cast = false; // the IB went out as one batch of datagrams
};

struct PrepareProgress {
  uint64_t bytes_done = 0, bytes_total = 0;
  double seconds = 0, bytes_per_second = 0, eta_seconds = 0;
};

struct PrepareOptions {
  /// Force a miss on every duck (a host tool's --invalidate switch; with
  /// read_environment, DUCK_INVALIDATE=1 does the same).
  bool invalidate = false;
  std::function<void(const PrepareProgress &)> progress;
  absl::Duration progress_interval = absl::Milliseconds(200);
  /// Set by the caller (a signal, a server stopping) to stop the upload
  /// between chunks: Prepare then returns Cancelled once the chunks in
  /// flight are answered and each duck has kept the slots that arrived
  /// whole, so the next prepare sends only the rest (a partial hit).
  const std::atomic<bool> *cancel = nullptr;
};

struct PrepareReport {
  std::vector<duckd_cache_result> result; // per duck: hit, partial, miss
  std::vector<uint64_t> bytes_uploaded;   // per duck
  double seconds = 0;
};

struct MeasureOptions {
  uint32_t cores = 0;              // per duck; 0: all of its cores
  uint64_t arena_bytes = 1ull << 30; // cold copies cycle through this
  uint32_t millis = 150;           // budget of each measurement
  /// One duck after another (ducks that share a machine must not measure
  /// at once); false: all at once (ducks on machines of their own).
  bool one_at_a_time = true;
  uint32_t pings = 200; // round trips timed a duck
  /// Pings keep duckd busy this long before it answers (a step's compute
  /// time; the host's wake-up after a long wait is part of the gap).
  uint32_t busy_us = 0;
  /// The duck ELF: when given, a session is opened on every duck and
  /// `pings` header-only steps are timed too (the dispatch path of a real
  /// step: duckd's hand-off to its worker, the ELF's entry and exit); the
  /// session is closed afterwards.
  std::vector<uint8_t> elf;
};
/// One duck's rates (duckd's `measure`) and round trip.
struct DuckRates {
  uint32_t cores = 0;
  double read_gbs = 0;
  double gparam_s[DUCK_KERNEL_COUNT] = {}; // cold fp9 GEMV by duck_kernel_id
  uint32_t rows[DUCK_KERNEL_COUNT] = {}, k[DUCK_KERNEL_COUNT] = {};
  double gemm_gmac_s = 0; // a prompt chunk's fp9 GEMM (dense prefill)
  uint32_t gemm_tokens = 0;
  double gemv_call_us = 0; // a cold GEMV call's fixed cost (0: not given)
  double other_load = 0;            // cores busy elsewhere meanwhile
  double seconds = 0;               // the duck's time measuring
  double rtt_us_p50 = 0, rtt_us_p90 = 0; // a ping's round trip, less busy_us
  double step_us_p50 = 0, step_us_p90 = 0; // an empty step's (with an ELF)
  /// A ping (no busy time) to every duck at once, all answers in (the
  /// same for every duck; 0 with one duck): what each more duck adds to
  /// it is the host's time for one more frame out and one more in
  /// (duck-measure-cluster's host_frame_wall_us). `rtt_idle_us_p50`: one
  /// duck's own such ping.
  double fan_rtt_us_p50 = 0, rtt_idle_us_p50 = 0;
  /// The host thread's own CPU time for the same two rounds (medians):
  /// what each more duck adds to it is the host's CPU for one more frame
  /// out and one more in, without the wake-ups and the ducks' own CPU a
  /// wall time counts where they share the host's cores
  /// (duck-measure-cluster's host_frame_us).
  double fan_cpu_us_p50 = 0, cpu_idle_us_p50 = 0;
};

/// duck-measure-cluster --links: each link timed with `bytes` going one
/// way and none, `trips` round trips each (medians).
struct LinkProbeOptions {
  uint64_t bytes = 8 << 20; // at most DUCKD_LINK_PROBE_MAX_BYTES
  uint32_t trips = 5;
};
/// The links' rates, Gbit/s: (round trip with the bytes - without) over
/// the bytes. 0 where the bytes took no measurable time more.
struct LinkRates {
  /// Each duck alone: host -> duck, duck -> host.
  std::vector<double> out_gbps, in_gbps;
  /// Every duck at once (the host's port, or the ducks' links where their
  /// sum is the slower); 0 with one duck.
  double all_out_gbps = 0, all_in_gbps = 0;
  /// The round trip without bytes (each duck alone, the slowest), us.
  double empty_us = 0;
};

class DuckClient {
public:
  /// Connects to every duck and says hello (abi, token).
  static absl::StatusOr<std::unique_ptr<DuckClient>>
  Create(const DuckClientOptions &options);
  ~DuckClient();
  DuckClient(const DuckClient &) = delete;
  DuckClient &operator=(const DuckClient &) = delete;

  size_t size() const;
  bool persistent() const;
  const DuckHello &hello(size_t duck) const;
  const DuckEndpoint &endpoint(size_t duck) const;

  /// Persistent: loads `elf` once on every duck (open). One-shot: keeps it
  /// to send with every step.
  absl::Status Open(absl::Span<const uint8_t> elf);

  /// Sends ibs[d] to duck d (all at once), waits for every OB. An ELF
  /// status other than OK, a crash or a timeout is an error naming the
  /// duck; `out_outputs` is filled for every duck that answered.
  /// `after_send`, if set, runs once every duck has its step (or as much
  /// of it as the sockets took at once) and before the wait for replies.
  absl::Status Step(absl::Span<const absl::Span<const uint8_t>> ibs,
                    std::vector<DuckOutput> *out_outputs,
                    StepMetrics *out_metrics = nullptr,
                    const std::function<void()> &after_send = nullptr,
                    absl::Span<const absl::Span<const uint8_t>> whole = {});

  /// Staged steps (abi.h, DUCK_IB_STAGE; persistent sessions only): sends
  /// ibs[d], a stage, to duck d and returns without waiting. When they are
  /// all the same and a cast can carry them, the stage goes as one cast
  /// batch and no frame at all (the ducks run it as its datagrams come
  /// whole; the staged step's step_staged frame names it); otherwise in a
  /// quiet frame a duck (DUCKD_FLAG_QUIET: duckd answers nothing). The
  /// next Step must be its DUCK_IB_STAGED step, with `whole` (each duck's
  /// whole step): a duck whose stage failed or never came answers
  /// stage_missed, and Step sends it its whole step plainly. The stage's
  /// IBs must stay valid until then.
  absl::Status Stage(absl::Span<const absl::Span<const uint8_t>> ibs);

  /// The cast path's counts (all zero without a cast address).
  CastStats cast_stats() const;
  /// Stages sent, ducks sent their whole step after a stage_missed, and
  /// the stages' time on the ducks (each stage's slowest duck's slowest
  /// core, as the staged steps' OBs carry it (duck_ob_header.stage_ns),
  /// added up; not in the steps' StepMetrics).
  struct StageStats {
    uint64_t stages = 0, resent = 0;
    uint64_t cast = 0; // stages sent as a cast batch alone, no frames
    /// Ducks' staged steps whose cast stage had finished before the
    /// step's frame came (duck_ob_header.stage_ahead_ns), and by how much.
    uint64_t ahead = 0;
    double ahead_us = 0;
    /// The host's CPU in Stage (this thread's): the stages' frames or
    /// batches, all of them.
    double host_cpu_us = 0;
    double kernel_us = 0;
  };
  StageStats stage_stats() const;

  /// Closes the sessions (kept connections stay usable for a new Open).
  absl::Status Close();

  /// Streams weight image files (images[d] for duck d, as the compiler
  /// writes them) into the ducks' weight caches. A duck whose cache
  /// already holds the image finished uploads nothing.
  absl::StatusOr<PrepareReport> Prepare(absl::Span<const std::string> images,
                                        const PrepareOptions &options = {});

  /// Re-reads hello from every duck (cache state after a prepare).
  absl::Status Refresh();
  /// Asks every duck for its read bandwidth and fp9 GEMV rates (measured
  /// on memory of its own: its weight cache is untouched) and times
  /// `pings` round trips to it. For the compiler's cost model.
  absl::StatusOr<std::vector<DuckRates>>
  Measure(const MeasureOptions &options = {});
  /// Times link probes (duckd_protocol.h's DUCKD_MEASURE_LINK) to every
  /// duck alone, then to all at once, with `bytes` out, back and neither.
  /// A duckd from before the probe answers an error, returned.
  absl::StatusOr<LinkRates> MeasureLinks(const LinkProbeOptions &options = {});
  /// Asks every duck for its counters (`stats`: the weight scrub's). A
  /// duckd older than the `stats` message answers bad_frame ("unknown
  /// message type 11") and closes the connection.
  absl::StatusOr<std::vector<duckd_stats_reply>> Stats();
  /// Asks every duck to join the ducks' mesh (`mesh`; duckd started with
  /// --mesh-port): duck i is rank i, `mesh[j]` is where duck j's mesh
  /// listener is. Each duck connects to the others, then they sum every
  /// duck's `checks[i]` over the new links: the sums come back (all equal
  /// when the mesh carries data). `transport`: DUCKD_MESH_TCP or
  /// DUCKD_MESH_UDP (the collectives as datagrams). No step uses the mesh
  /// yet.
  absl::StatusOr<std::vector<duckd_mesh_reply>>
  JoinMesh(absl::Span<const DuckEndpoint> mesh, absl::Span<const float> checks,
           uint64_t session, uint32_t groups = 1,
           uint32_t transport = DUCKD_MESH_TCP);
  /// Every duck of the joined mesh runs the probe's collectives at once
  /// (`mesh_probe`) and answers its time for them.
  absl::StatusOr<std::vector<duckd_mesh_probe_reply>>
  ProbeMesh(const duckd_mesh_probe_request &request);

private:
  struct Impl;
  explicit DuckClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace duck::runtime

#endif // DUCK_RUNTIME_DUCKCLIENT_H
