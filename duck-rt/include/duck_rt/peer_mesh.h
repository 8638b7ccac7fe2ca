// The ducks' mesh: one TCP connection between every pair of ducks, and the
// collectives that let them reduce and share vectors among themselves over
// the switch instead of through the host (reduce-scatter, all-gather,
// all-reduce), each a direct exchange: every duck sends each other duck its
// piece at once, so a collective costs one one-way latency and its bytes on
// each duck's link, whatever the duck count.
//
// Sums are taken in rank order (0, 1, ..., N-1) from the values as the wire
// carries them (a duck's own part rounded as the wire rounds the others'),
// so a collective's result is the same in every run, and an all-reduce's is
// bit-identical on every duck.
//
// With `groups` G > 1 (dividing N; M = N / G ducks a group, rank g M + m
// is member m of group g) a reduce-scatter or all-gather takes two direct
// exchanges instead of one: within the group, then among the G ducks of
// the same member index. Each duck then sends M - 1 + G - 1 messages
// instead of N - 1 (the same bytes), for one more latency: where a
// message's own cost dominates (many ducks, small pieces) that wins. Duck
// g M + m then holds slice m G + g (OwnedSlice), sums are taken within
// the group in member order and then in group order.
//
// The messages travel over the pair's TCP connection or as UDP datagrams
// (PeerTransport). Today `duck-bench collective` measures the mesh over the
// link simulator and loopback, duckd joins one when the host sends `mesh`
// and times it on `mesh_probe` (docs/protocol.md); no step uses it yet. The
// session field is a check that both ends belong to the same run; with a token
// (the cluster's shared secret) each pair also proves it holds it in the hello
// (HMAC-SHA256 over both sides' fresh nonces, duckd's own hello scheme), so a
// stranger cannot join; the collectives' messages themselves are not sealed.
#ifndef DUCK_RT_PEER_MESH_H
#define DUCK_RT_PEER_MESH_H

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace duck::duckd {

class PeerDatagrams;

struct PeerAddress {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
};

/// How a collective's messages travel: over the pair's TCP connection
/// (a send and a receive a message), or as UDP datagrams (every peer's at
/// once with one sendmmsg, taken in by the batch with recvmmsg; a lost one
/// asked for again). The TCP connections carry the hello either way.
enum class PeerTransport { tcp, udp };

struct PeerMeshOptions {
  uint32_t rank = 0, ducks = 0;
  uint64_t session = 0;
  /// The cluster's shared secret: every pair proves it in its hello
  /// (empty: no authentication, for loopback benches and tests).
  std::string token;
  /// This duck's listening socket: the ranks below it connect here.
  int listen_fd = -1;
  /// Where this duck reaches rank j (used for j > rank; it connects to
  /// every higher rank and accepts every lower one).
  std::vector<PeerAddress> peers;
  absl::Duration timeout = absl::Seconds(30);
  /// Two-level collectives over this many groups (1: one direct exchange).
  uint32_t groups = 1;
  PeerTransport transport = PeerTransport::tcp;
  /// udp: the largest datagram's UDP payload, its 24-byte header included
  /// (1432: an IPv4 packet within a 1500-byte MTU).
  uint32_t datagram_bytes = 1432;
  /// udp, for the loss tests: every this many datagrams' first send is
  /// dropped (0: none).
  uint32_t drop_every = 0;
  /// udp: a bound datagram socket to use (the mesh owns it from Connect
  /// on; -1: the mesh binds its own on the listener's address).
  int udp_fd = -1;
  /// udp: where this duck sends duck j's datagrams (empty: the port j's
  /// hello named, at j's address), for a relay such as the link simulator.
  std::vector<PeerAddress> datagram_peers;
  /// udp: how long a collective keeps looking for its datagrams before it
  /// sleeps (a duck with a core to itself: no wake-up on the way in; 0:
  /// sleep at once, for ducks sharing cores).
  absl::Duration spin = absl::ZeroDuration();
};

/// How values cross the wire: fp32, bf16 (round to nearest even) or q8
/// (each message's values as one q8 row: blocks of 32 int8 and a bf16
/// scale, duck_rt/abi.h).
enum class PeerWire { f32, bf16, q8 };

/// Slice j of n values over N ducks: [SliceBegin(j), SliceBegin(j + 1)),
/// the first n % N slices one value longer.
size_t PeerSliceBegin(size_t n, uint32_t ducks, uint32_t j);

class PeerMesh {
public:
  /// Connects the mesh (each pair exchanges a hello naming rank, duck count
  /// and session; a mismatch is an error naming it).
  static absl::StatusOr<std::unique_ptr<PeerMesh>>
  Connect(const PeerMeshOptions &options);
  ~PeerMesh();

  uint32_t rank() const { return rank_; }
  uint32_t groups() const { return groups_; }
  /// The groups of the collectives from now on (every duck must set the
  /// same before its next collective): a divisor of the duck count.
  absl::Status SetGroups(uint32_t groups);
  uint32_t ducks() const { return ducks_; }
  /// The slice of a reduce-scatter's result (and of an all-gather's input)
  /// this duck holds: its rank, or m G + g with groups.
  uint32_t OwnedSlice() const;

  /// `in`: this duck's partial sums of n values; `out`: its slice of the
  /// sums over every duck (PeerSliceBegin's length).
  absl::Status ReduceScatter(absl::Span<const float> in, PeerWire wire,
                             absl::Span<float> out);
  /// `mine`: this duck's slice of n values; `all`: the n values.
  absl::Status AllGather(absl::Span<const float> mine, PeerWire wire,
                         absl::Span<float> all);
  /// Every duck's `in` summed (the same on every duck).
  absl::Status AllReduce(absl::Span<const float> in, PeerWire wire,
                         absl::Span<float> out);

  /// Over udp, a duck that returned from a collective may still owe a peer
  /// a lost datagram (it answers resend requests inside its collectives):
  /// before a pause (between tokens, before replying to the host) every
  /// duck calls Settle, which returns once every duck has all of the
  /// collectives so far. A no-op over tcp.
  absl::Status Settle();

  /// Payload bytes this duck has sent and received, the headers included
  /// (tcp: 8 bytes a message; udp: 24 a datagram; first sends, not the
  /// resent ones).
  uint64_t bytes_sent() const { return sent_; }
  uint64_t bytes_received() const { return received_; }
  /// udp: datagrams sent again on a peer's request (0 over tcp).
  uint64_t datagrams_resent() const;

private:
  PeerMesh() = default;
  static absl::Status Validate(const PeerMeshOptions &options);
  /// Sends out[j] to every peer j in `with` and receives in[j] (its length
  /// known) from each, all at once (empty `with`: every other duck).
  absl::Status Exchange(const std::vector<std::vector<char>> &out,
                        std::vector<std::vector<char>> &in,
                        const std::vector<uint32_t> &with = {});
  std::vector<uint32_t> Others() const; // every rank but this one
  /// A reduce-scatter's or all-gather's levels (one direct exchange, or
  /// within the group then across): at each, the ranks that exchange in
  /// sum order, this duck's index among them, and the bounds of their
  /// parts of that level's vector (the first level's is the whole one).
  struct Levels {
    std::vector<std::vector<uint32_t>> ranks;
    std::vector<size_t> me;
    std::vector<std::vector<size_t>> bounds;
  };
  Levels LevelsOf(size_t n) const;
  /// One level: `ranks[k]` gets part k of `in` summed over the ranks in
  /// their order; *out is this duck's (ranks[me]'s) part.
  absl::Status ReduceScatterAmong(const std::vector<uint32_t> &ranks, size_t me,
                                  absl::Span<const float> in,
                                  const std::vector<size_t> &bounds,
                                  PeerWire wire, std::vector<float> *out);
  /// One level: every rank's part (this duck's is `mine`) into `all` at
  /// its bounds.
  absl::Status AllGatherAmong(const std::vector<uint32_t> &ranks, size_t me,
                              absl::Span<const float> mine,
                              const std::vector<size_t> &bounds, PeerWire wire,
                              absl::Span<float> all);

  uint32_t rank_ = 0, ducks_ = 0, groups_ = 1;
  uint32_t seq_ = 0;
  absl::Duration timeout_;
  std::vector<int> fds_; // by rank; -1 for this duck
  std::unique_ptr<PeerDatagrams> udp_; // transport udp
  // A collective's messages out and in by rank (reused: no allocation a
  // collective once warm).
  std::vector<std::vector<char>> scratch_out_, scratch_in_;
  uint64_t sent_ = 0, received_ = 0;
};

} // namespace duck::duckd

#endif // DUCK_RT_PEER_MESH_H
