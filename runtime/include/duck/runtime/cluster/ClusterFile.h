//===- ClusterFile.h - a cluster of ducks, as a JSON file ---------*- C++
//-*-===//
//
// The cluster file duckrun reads (and duckc compile, and duck-measure-cluster,
// which writes its measured figures into it): a JSON object with "ducks"
// (a non-empty array of {"host", "port"}), optional "spares" (same shape:
// they take a failed duck's place), "token", "bandwidth_gbs" and the links
// ("host_link_gbps", "duck_link_gbps": Gbit/s each way; "latency_us": the
// one-way latency between the host and a duck), read with the compiler's
// rules (a number, not negative), and "cast" ("ADDR:PORT": where the host
// sends a multicast plan's steps once, the ducks' multicast group or a
// relay; duckd --cast) with "cast_interface" (the host's address facing
// the ducks); other keys are the compiler's and are left alone here.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_CLUSTERFILE_H
#define DUCK_RUNTIME_CLUSTERFILE_H

#include "duck/runtime/cluster/DuckClient.h"

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include <string>
#include <vector>

namespace duck::runtime {

struct ClusterFile {
  std::vector<DuckEndpoint> ducks;
  std::vector<DuckEndpoint> spares; // take a failed duck's place
  std::string token;
  double bandwidth_gbs = 0; // the ducks' read bandwidth, if given
  /// The links, as the cost model reads them (0: not given).
  double host_link_gbps = 0, duck_link_gbps = 0, latency_us = 0;
  /// Cast steps (duck_rt/cast.h): the address and port the host sends a
  /// step's datagrams to (empty: none) and where multicast leaves.
  std::string cast_address;
  uint16_t cast_port = 0;
  std::string cast_interface;
};

/// Parses a cluster file's text; `path` names the file in errors
/// (InvalidArgument: not JSON, not an object, no ducks, a bad endpoint).
absl::StatusOr<ClusterFile> ParseClusterFile(absl::string_view text,
                                             const std::string &path);
/// Reads and parses the cluster file at `path` (NotFound: unreadable).
absl::StatusOr<ClusterFile> LoadClusterFile(const std::string &path);

} // namespace duck::runtime

#endif // DUCK_RUNTIME_CLUSTERFILE_H
