//===- LinkSim.h - a userspace link simulator in front of duckd's -*- C++
//-*-===//
//
// N local duckd's behave like N boxes on one switch: LinkSim listens on one
// loopback port per duck and forwards every accepted connection to that
// duck's duckd. Each chunk read (up to chunk_bytes) is given the time its
// last byte would leave the simulated path and is written on only then plus
// the one-way latency:
//   - a link is a FIFO server at its rate (a token bucket with a burst of
//     one chunk): a chunk of b bytes keeps it busy b*8/rate after the later
//     of its arrival and the link's previous chunk;
//   - host -> duck i passes the host's port (one for all ducks, its
//     outbound direction) and duck i's link (inbound); duck i -> host its
//     link (outbound) and the host's port (inbound); a chunk is done when
//     every link of its path has carried it (cut-through, no store and
//     forward), and released `latency_us` later;
//   - each direction is a FIFO: bytes leave in the order they came;
//   - with peer_backends, the ducks' mesh (duck_rt/peer_mesh.h) too: duck i
//     reaches duck j (i < j) through its own port for that pair, and the
//     bytes i -> j pass duck i's link (outbound) and duck j's (inbound),
//     j -> i the reverse (a non-blocking switch: a duck's link carries its
//     host traffic and its peer traffic in one FIFO each way);
//   - with peer_datagram_ports, the mesh's UDP datagrams too: duck i sends
//     duck j's to a relay port of its own for that pair, and each datagram
//     (its UDP payload's bytes) passes the same two links and is sent on
//     whole, in order, from the relay;
//   - with cast_ports, the host's cast datagrams (duck_rt/cast.h): the
//     host sends each one once to the cast relay port; it passes the
//     host's port (outbound) once and then every duck's link (inbound),
//     and a copy is sent on to each duck's cast port: a switch's IP
//     multicast, cut through, the host's port carrying it once.
// Not modelled: TCP's own congestion control and windows run over loopback
// underneath (only the release times are shaped), no loss, no jitter, no
// switch buffers (a queue grows without drops, bounded by queue_bytes per
// direction, which then stops reading: backpressure), no per-packet
// overheads (Ethernet/IP/TCP headers are not counted, only payload).
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_CLUSTER_LINKSIM_H
#define DUCK_RUNTIME_CLUSTER_LINKSIM_H

#include "duck/runtime/cluster/DuckClient.h"

#include "absl/status/statusor.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace duck::runtime {

struct LinkSimOptions {
  std::vector<DuckEndpoint> backends; // duck i's duckd
  double host_link_gbps = 0;          // the host's port, each way; 0: unlimited
  double duck_link_gbps = 0;          // every duck's link, each way; 0: unlimited
  double latency_us = 0;              // one way, added to every chunk
  uint16_t port_base = 0;             // duck i listens on port_base + i; 0: any
  size_t chunk_bytes = 16 << 10;      // largest read shaped as one unit
  size_t queue_bytes = 4 << 20;       // most bytes held a direction
  /// Duck j's mesh listener; empty: no peer links are simulated.
  std::vector<DuckEndpoint> peer_backends;
  /// Duck j's datagram socket (a port on 127.0.0.1); empty: no relays.
  std::vector<uint16_t> peer_datagram_ports;
  /// Duck j's cast socket (duckd --cast 127.0.0.1:0's port); empty: no
  /// cast relay.
  std::vector<uint16_t> cast_ports;
};

struct LinkSimDuckStats {
  uint64_t bytes_to_duck = 0;
  uint64_t bytes_from_duck = 0;
  uint64_t connections = 0;
  uint64_t bytes_to_peers = 0, bytes_from_peers = 0; // the mesh's
  uint64_t cast_bytes_to_duck = 0; // the cast datagrams' copies
};

class LinkSim {
public:
  static absl::StatusOr<std::unique_ptr<LinkSim>>
  Start(const LinkSimOptions &options);
  ~LinkSim(); // Stop()

  /// Duck i's simulated endpoint (127.0.0.1, its listening port).
  const std::vector<uint16_t> &ports() const;
  /// With peer_backends: the port duck i dials to reach duck j, at [i][j]
  /// for i < j (0 elsewhere).
  const std::vector<std::vector<uint16_t>> &peer_ports() const;
  /// With peer_datagram_ports: the relay port duck i sends its datagrams
  /// for duck j to, at [i][j] (i != j).
  const std::vector<std::vector<uint16_t>> &peer_datagram_relays() const;
  /// With cast_ports: the port the host sends its cast datagrams to.
  uint16_t cast_relay_port() const;
  /// The cast datagrams' bytes through the host's port (each once).
  uint64_t cast_bytes_from_host() const;
  std::vector<LinkSimDuckStats> stats() const;
  /// Closes the listeners and every connection, joins every thread.
  void Stop();

  struct Impl;

private:
  explicit LinkSim(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// What LinkSim models and what not, for --help texts.
const char *LinkSimModelText();

} // namespace duck::runtime

#endif // DUCK_RUNTIME_CLUSTER_LINKSIM_H
