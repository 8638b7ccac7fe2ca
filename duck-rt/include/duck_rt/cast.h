// A step's IB sent once to every duck: the host's side (CastSender: the IB
// cut into UDP datagrams, all sent with one sendmmsg to the ducks' cast
// address) and the duck's (CastReceiver: a batch's datagrams taken from the
// cast socket into the session's IB), with the socket duckd listens on
// (OpenCastSocket) and the digest that ties a batch to its step frame
// (docs/protocol.md, "Cast steps"; duckd_step_cast_request).
//
// The cast address is an IP multicast group (the switch gives every duck
// its copy; on one box the kernel does) or, for the link simulator, a relay
// port that copies each datagram to every duck's own port. Nothing here
// recovers a lost datagram: a batch that is not whole answers
// DUCKD_ERR_CAST_MISSED and the host sends that duck the step again as a
// plain step over its connection.
#ifndef DUCK_RT_CAST_H
#define DUCK_RT_CAST_H

#include "duck_rt/duckd_protocol.h"

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

#include <cstdint>
#include <memory>
#include <string>
#include <sys/socket.h>
#include <vector>

namespace duck::duckd {

/// A batch's shape: `datagrams` datagrams of `datagram_bytes` of the IB
/// each (the last one the rest).
struct CastShape {
  uint32_t datagrams = 0;
  uint32_t datagram_bytes = 0;
};

/// The shape of an IB of `ib_bytes` cut for datagrams of at most
/// `datagram_limit` bytes of UDP payload, the 24-byte header included.
/// Errors: a limit outside [25, 65507] or an IB of 0 bytes or of more
/// than 2^32 - 1 datagrams.
absl::StatusOr<CastShape> CastShapeFor(uint64_t ib_bytes,
                                       uint32_t datagram_limit);

/// The digest the step frame carries: XXH3-64 of the IB (little-endian, in
/// the first 8 bytes, the rest zero) when `keyed` is false; SHA-256 when
/// the connection is keyed (its sealed frame then vouches for the IB).
void CastDigest(absl::Span<const uint8_t> ib, bool keyed,
                uint8_t out[DUCKD_CAST_DIGEST_BYTES]);

/// Makes the SHA-256 implementation ready (a process about to confine
/// itself: the duckd worker).
void WarmUpCastDigest();

/// true when `address` (dotted IPv4) is a multicast group (224.0.0.0/4).
bool IsMulticastAddress(const std::string &address);

struct CastSocket {
  int fd = -1;
  uint16_t port = 0; // the port bound (useful with port 0)
};
/// duckd's cast socket: a UDP socket bound to address:port (0: a free
/// one). A multicast group is joined on `interface_address` (the address
/// the duck serves on; empty: the kernel's choice), with SO_REUSEADDR so
/// that several duckd's on one box share the group's port; any other
/// address is bound as a plain unicast port. The receive buffer is asked
/// for 4 MiB (the kernel caps it at net.core.rmem_max).
absl::StatusOr<CastSocket> OpenCastSocket(const std::string &address,
                                          uint16_t port,
                                          const std::string &interface_address);

struct CastSenderOptions {
  std::string address; // the group, or a relay's address
  uint16_t port = 0;
  /// Where multicast leaves (IP_MULTICAST_IF; empty: the kernel's route).
  std::string interface_address;
  /// A datagram's UDP payload, the header included (1432: an IPv4 packet
  /// within a 1500-byte MTU).
  uint32_t datagram_bytes = 1432;
  /// For the loss tests: every this many datagrams one is not sent (0:
  /// none).
  uint32_t drop_every = 0;
};

class CastSender {
public:
  static absl::StatusOr<std::unique_ptr<CastSender>>
  Open(const CastSenderOptions &options);
  ~CastSender();
  CastSender(const CastSender &) = delete;
  CastSender &operator=(const CastSender &) = delete;

  /// Sends `ib` as batch `cast_id` (one sendmmsg, retried while the socket
  /// buffer is full); returns its shape. `magic`: DUCKD_CAST_MAGIC, or
  /// DUCKD_CAST_STAGE_MAGIC for a cast stage's batch (step_staged).
  absl::StatusOr<CastShape> Send(uint64_t cast_id, absl::Span<const uint8_t> ib,
                                 uint32_t magic = DUCKD_CAST_MAGIC);
  /// UDP payload bytes sent, headers included; datagrams dropped on
  /// purpose (drop_every).
  uint64_t bytes_sent() const { return sent_; }
  uint64_t dropped() const { return dropped_; }
  uint32_t datagram_bytes() const { return opt_.datagram_bytes; }

private:
  explicit CastSender(const CastSenderOptions &options) : opt_(options) {}
  CastSenderOptions opt_;
  int fd_ = -1;
  uint64_t sent_ = 0, dropped_ = 0, counter_ = 0;
  // A batch's headers and sendmmsg arrays, kept from one batch to the
  // next (no allocation a step once warm).
  std::vector<duckd_cast_datagram> headers_;
  std::vector<iovec> iov_;
  std::vector<mmsghdr> msgs_;
};

/// One batch being assembled: the receiver's bookkeeping apart from its
/// socket (what fuzz-cast drives with arbitrary datagrams).
class CastBatch {
public:
  /// Starts batch `cast_id` of `shape` into `ib` (which holds ib_bytes),
  /// whose datagrams carry `magic`.
  void Begin(uint64_t cast_id, const CastShape &shape, uint64_t ib_bytes,
             uint8_t *ib, uint32_t magic = DUCKD_CAST_MAGIC);
  enum class Took { placed, duplicate, stale, malformed };
  /// One datagram as received (`truncated`: longer than the buffer it was
  /// read into): its bytes go to the IB only when it belongs to this batch
  /// and fits its shape exactly.
  Took Offer(absl::Span<const uint8_t> datagram, bool truncated = false);
  uint32_t missing() const { return missing_; }

private:
  uint64_t cast_id_ = 0, ib_bytes_ = 0;
  uint32_t magic_ = DUCKD_CAST_MAGIC;
  CastShape shape_;
  uint8_t *ib_ = nullptr;
  std::vector<uint8_t> have_;
  uint32_t missing_ = 0;
};

/// Datagrams kept while no frame asks for their batch (CastReceiver::
/// Intake): the latest batch's, as received, apart from the socket (what
/// fuzz-cast drives with arbitrary datagrams).
class CastHeld {
public:
  /// Keeps at most `limit` bytes of datagrams, headers included (reserved
  /// here: never allocates once made).
  explicit CastHeld(uint64_t limit = 0);
  /// One datagram as received (`truncated`: longer than the buffer it was
  /// read into): false when refused (malformed, not this batch's shape,
  /// over the limit); a duplicate is kept once. A well-formed datagram of
  /// another batch first forgets the kept ones (*stale += how many).
  bool Keep(absl::Span<const uint8_t> d, bool truncated, uint64_t *stale);
  bool any() const { return count_ > 0; }
  bool whole() const { return count_ && have_ == count_; }
  uint32_t magic() const { return magic_; }
  uint64_t cast_id() const { return id_; }
  uint32_t have() const { return have_; }
  /// The shape a whole batch's datagrams make (each but the last of the
  /// first's size) and its bytes: false when they make none of at most
  /// `ib_limit` bytes.
  bool Shape(uint64_t ib_limit, CastShape *shape, uint64_t *ib_bytes) const;
  /// Offers every kept datagram to `batch` in index order (`took` hears
  /// each outcome), then forgets them.
  void Replay(CastBatch &batch, absl::FunctionRef<void(CastBatch::Took)> took);
  void Forget();

private:
  std::vector<uint8_t> bytes_; // the datagrams end to end
  std::vector<uint32_t> at_;   // where index i's starts (+1; 0: not in)
  uint64_t limit_ = 0, id_ = 0;
  uint32_t magic_ = 0, count_ = 0, have_ = 0;
};

/// What a CastReceiver saw over its life.
struct CastReceiverStats {
  uint64_t batches = 0, missed = 0;
  uint64_t datagrams = 0; // of the batches asked for
  uint64_t stale = 0;     // of other batches, dropped
  uint64_t malformed = 0; // wrong magic, size or shape, dropped
};

class CastReceiver {
public:
  /// `fd`: the cast socket (not owned, non-blocking reads are asked per
  /// call). `held_bytes`: what Intake may keep of a batch, datagrams and
  /// their headers (0: Intake keeps nothing); reserved here, so that a
  /// receiver made before a sandbox never allocates in it.
  explicit CastReceiver(int fd, uint64_t held_bytes = 0);

  /// Takes batch `cast_id` (`shape`, `ib_bytes` in all) into `ib` until
  /// every datagram is in: true then; false when `wait_ns` passed first
  /// (from the call), spinning on the socket for the first `spin_ns`, then
  /// sleeping in poll. Datagrams of other batches, or that do not fit the
  /// shape, are dropped; those Intake kept of this batch are used first.
  /// `magic`: the batch's datagrams' (a stage's: DUCKD_CAST_STAGE_MAGIC).
  /// `ib` must hold ib_bytes.
  bool Take(uint64_t cast_id, const CastShape &shape, uint64_t ib_bytes,
            uint8_t *ib, uint64_t wait_ns, uint64_t spin_ns,
            uint32_t magic = DUCKD_CAST_MAGIC);

  /// Reads whatever datagrams the socket holds now (never waits) and keeps
  /// the latest batch's, as received, for the Take that asks for it: a
  /// datagram of another batch replaces what was kept (the host sends one
  /// batch at a time). True when what is kept is a whole stage's batch
  /// (DUCKD_CAST_STAGE_MAGIC), for TakeHeldStage.
  bool Intake();
  /// A whole stage's batch that Intake kept, into `ib` (at most ib_limit
  /// bytes), its shape read off its datagrams (each but the last of the
  /// same size): true, with its id and size; false when none is kept or
  /// its datagrams do not make one IB. Either way it is no longer kept.
  bool TakeHeldStage(uint8_t *ib, uint64_t ib_limit, uint64_t *cast_id,
                     uint64_t *ib_bytes);
  /// Intake holds datagrams of a cast step's batch (not a stage's): its
  /// frame follows, and Take reads the rest.
  bool HoldsStepBatch() const {
    return held_.any() && held_.magic() == DUCKD_CAST_MAGIC;
  }
  const CastReceiverStats &stats() const { return stats_; }

private:
  void Count(CastBatch::Took took);
  /// Offers the kept datagrams to batch_ and forgets them.
  void Replay();

  int fd_;
  // Take's and Intake's reads: apart, so that neither resizes (and
  // zero-fills) the other's every call.
  std::vector<uint8_t> buf_, intake_buf_;
  CastBatch batch_;
  CastReceiverStats stats_;
  CastHeld held_; // Intake's batch
};

} // namespace duck::duckd

#endif // DUCK_RT_CAST_H
