//===- Team.h - Pinned threads that time work on 1..N cores -----*- C++ -*-===//
//
// Every multi-core measurement in duck-bench runs on a team of threads,
// one per core, each pinned to its own CPU, synchronised by the same
// duck_barrier the kernels use. The team runs a call on every core, waits
// at the barrier, and repeats; it times the wall clock of each call on core
// 0 and each core's own busy time (its work, barrier waits excluded), from
// which the imbalance ratio max/mean follows.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_BENCH_TEAM_H
#define DUCK_BENCH_TEAM_H

#include <cstdint>
#include <functional>
#include <vector>

namespace duck::bench {

/// How long to measure and where to run.
struct TeamConfig {
  double seconds = 0.2;  // budget of one measurement (warm-up included)
  uint32_t batches = 7;  // timed batches; the medians over them are kept
  std::vector<int> cpus; // core c runs on cpus[c % cpus.size()]
};

/// Result of one measurement.
struct Timing {
  double callSeconds = 0;          // median wall time of one call
  double bestCallSeconds = 0;      // fastest batch's wall time of one call
  std::vector<double> coreSeconds; // median busy time of one call, per core
  double imbalance = 1;            // max / mean of coreSeconds
  uint64_t calls = 0;              // timed calls (all batches)
  // CPU time other processes (and the hypervisor, as steal) used while the
  // batches ran, in cores: 0 on a quiet machine, 1 if a whole core was busy
  // elsewhere. From /proc/stat and this process's CPU clock; NaN if unknown.
  double otherLoad = 0;
  uint32_t attempts = 1; // measurements made (the quietest is kept)
};

/// fn(core, call): core's share of call number `call`. Calls are numbered
/// from 0 (warm-up included) identically on every core, so a benchmark can
/// pick the call's cold copy from the number.
using CoreFn = std::function<void(uint32_t core, uint64_t call)>;

/// Runs fn on `cores` pinned threads with a barrier after every call:
/// warm-up of about an eighth of the budget, then `batches` batches of as
/// many calls as fill the rest.
Timing measureOnCores(const TeamConfig &config, uint32_t cores,
                      const CoreFn &fn);

/// Sums `bytes` bytes at `data` with AVX2 loads (bytes a multiple of 128);
/// the result only keeps the loads alive.
uint64_t streamRead(const uint8_t *data, uint64_t bytes);

/// Host-side yield for spinning barriers (a shared machine may run more
/// threads than it has cores).
void yieldThread();

} // namespace duck::bench

#endif // DUCK_BENCH_TEAM_H
