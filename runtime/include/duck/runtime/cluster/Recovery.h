//===- Recovery.h - bringing a cluster's ducks back after a failure -*- C++ -*-===//
//
// What the runner calls when a step fails (a duck died, hung or dropped
// its connection): the ducks are brought back and a new client returned,
// so the step can be sent again.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_CLUSTER_RECOVERY_H
#define DUCK_RUNTIME_CLUSTER_RECOVERY_H

#include "duck/runtime/cluster/DuckClient.h"
#include "duck/runtime/cluster/LocalCluster.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include <atomic>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

namespace duck::runtime {

/// After a failed step (`why`): restarts the local ducks that died (all of
/// them when none did: one is hung); with a cluster file (`local` null), a
/// duck that stays unreachable for 3 s gives its place to the next of
/// `spares` (which gets that duck's weight image). Then connects, prepares
/// `images` through the weight cache and opens `elf` again, retrying with
/// backoff until `budget` has passed or `cancel` is set. Progress goes to
/// `err` unless `quiet`.
absl::StatusOr<std::unique_ptr<DuckClient>>
RecoverDucks(const absl::Status &why, DuckClientOptions &co,
             LocalCluster *local, std::vector<DuckEndpoint> *spares,
             const std::vector<std::string> &images,
             const std::vector<uint8_t> &elf, absl::Duration budget, bool quiet,
             const std::atomic<bool> *cancel, std::ostream &err);

} // namespace duck::runtime

#endif
