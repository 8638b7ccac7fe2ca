//===- LocalCluster.h - N duckd processes on this machine --------*- C++ -*-===//
//
// Starts N duckd daemons on 127.0.0.1 (each on a free port, read from its
// stdout), waits until every one answers hello, and tears them down
// cleanly: SIGTERM, then SIGKILL after a grace period. The daemons also die
// with the process that started them (PR_SET_PDEATHSIG). For tests,
// benchmarks and the duck-cluster tool.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_LOCALCLUSTER_H
#define DUCK_RUNTIME_LOCALCLUSTER_H

#include "duck/runtime/cluster/DuckClient.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include <cstdint>
#include <memory>
#include <string>
#include <sys/types.h>
#include <vector>

namespace duck::runtime {

struct LocalClusterOptions {
  uint32_t ducks = 1;
  uint32_t cores = 1; // per duck
  /// duckd binary; default: $DUCKD, else `duckd` next to this executable,
  /// else `duckd` on PATH.
  std::string duckd_path;
  /// Weight cache directory; default: a fresh temporary directory removed
  /// by the destructor. Duck i uses the cache file of name "<prefix><i>",
  /// so a restarted duck finds its cache again.
  std::string cache_dir;
  std::string name_prefix = "local";
  /// Several local clusters on one machine (a server and the CLI, two
  /// servers of different models) share cache_dir: with claim_slot the
  /// cluster takes the first of its slots no other running cluster holds
  /// (an flock on <cache_dir>/slot-<k>.lock, held while it lives), and
  /// slot k > 0 names its ducks "s<k>-<name_prefix><i>", so each cluster
  /// has weight files of its own. Slot 0 keeps the plain names.
  bool claim_slot = false;
  uint64_t weights_size = 64ull << 20;
  bool pin = true; // duck i pins its cores from CPU i * cores on
  bool sync = true;
  /// Where the daemons' stderr goes: "" inherits ours; a directory gets
  /// duckd-<name>.log per duck.
  std::string log_dir;
  std::string token; // --token of every duck (also used for the readiness ping)
  std::vector<std::string> extra_args; // passed to every duckd
  absl::Duration start_timeout = absl::Seconds(15);
  absl::Duration stop_timeout = absl::Seconds(3);
};

class LocalCluster {
public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>>
  Start(const LocalClusterOptions &options);
  ~LocalCluster(); // Stop()

  const std::vector<DuckEndpoint> &endpoints() const { return endpoints_; }
  /// Each duck's mesh listener (port 0 unless extra_args gave duckd
  /// --mesh-port).
  const std::vector<DuckEndpoint> &mesh_endpoints() const {
    return mesh_endpoints_;
  }
  /// Each duck's cast socket port (0 unless extra_args gave duckd --cast).
  const std::vector<uint16_t> &cast_ports() const { return cast_ports_; }
  pid_t pid(size_t duck) const { return pids_[duck]; }
  const std::string &cache_dir() const { return cache_dir_; }
  /// The slot this cluster claimed (claim_slot; 0 otherwise).
  int slot() const { return slot_; }
  /// Path of duck i's weight cache file.
  std::string cache_file(size_t duck) const;

  /// SIGTERM to every duck, SIGKILL to those still alive after
  /// stop_timeout; reaps them all.
  absl::Status Stop();
  /// Sends `sig` to duck i and reaps it (tests: crash a duck).
  absl::Status Kill(size_t duck, int sig);
  /// Sends `sig` to a running duck and returns at once (fault injection:
  /// SIGSTOP makes a hung duck).
  void Signal(size_t duck, int sig);
  /// Starts duck i again (same name and cache file, a new port).
  absl::Status Restart(size_t duck);
  /// True when duck i's process has exited (it is reaped then).
  bool Exited(size_t duck);

private:
  LocalCluster() = default;
  absl::Status StartOne(size_t duck);
  absl::Status ClaimSlot();

  LocalClusterOptions opt_;
  std::string duckd_;
  std::string cache_dir_;
  bool own_cache_dir_ = false;
  std::vector<pid_t> pids_;
  std::vector<DuckEndpoint> endpoints_, mesh_endpoints_;
  std::vector<uint16_t> cast_ports_;
  int slot_fd_ = -1; // the claimed slot's lock (claim_slot)
  int slot_ = 0;
};

/// Directory of the running executable ("." if unknown).
std::string ExecutableDir();
/// The duck ELF a host tool loads: $DUCK_ELF, else ../lib/duck.elf next to
/// the executable (the build tree's layout).
std::string DefaultElfPath();
/// The bytes of the duck ELF at `path` (DefaultElfPath() when empty); an
/// empty or unreadable file is NotFound, naming the path and DUCK_ELF.
absl::StatusOr<std::vector<uint8_t>> ReadDuckElf(const std::string &path = "");

/// Connects, says hello and disconnects: OK when duckd answers. Over
/// `transport` (null: TCP).
absl::Status PingDuck(const DuckEndpoint &endpoint, absl::Duration timeout,
                      const std::string &token = "",
                      std::shared_ptr<DuckTransport> transport = nullptr);

} // namespace duck::runtime

#endif // DUCK_RUNTIME_LOCALCLUSTER_H
