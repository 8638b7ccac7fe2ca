//===- DuckTransport.h - how frames reach a duck ---------------*- C++ -*-===//
//
// The seam between the duckd protocol and what carries it. DuckClient
// speaks the protocol (requests, replies, the hello and its keys, through
// the frame codec of duck_rt/wire_codec.h); a DuckTransport moves whole
// frames to and from one duck a connection and knows nothing of message
// types or keys. TCP today (TcpDuckTransport); a link simulator, a relay
// or multicast are further implementations, and a test's scripted fake
// runs the client with no socket at all (test/unit/runtime/cluster/
// DuckClientTransportTest.cpp).
//
// All calls of one transport come from one thread (the client's); nothing
// here starts a thread.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_CLUSTER_DUCKTRANSPORT_H
#define DUCK_RUNTIME_CLUSTER_DUCKTRANSPORT_H

#include "duck_rt/duckd_protocol.h"
#include "duck_rt/wire_codec.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include <cstdint>
#include <memory>
#include <string>

namespace duck::runtime {

struct DuckEndpoint {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string ToString() const;
};

/// Parses "host:port" (IPv4 dotted quad or "localhost").
absl::StatusOr<DuckEndpoint> ParseDuckEndpoint(absl::string_view text);

/// A frame as a transport hands it over: its header, validated
/// (duckd::ValidateHeader: magic, version, type range, length limit), and
/// its payload, not yet checked: the client checks it against the
/// connection's keys. Valid until the next Receive on its connection.
struct ReceivedFrame {
  duckd_frame_header header{};
  absl::Span<const uint8_t> payload;
};

/// One connection to one duck. Destroying it closes it. Errors are
/// Unavailable (the connection is then unusable: the client drops it),
/// except a header that fails validation (its ValidateHeader status).
class DuckConnection {
public:
  virtual ~DuckConnection() = default;

  /// Writes more of one frame (`header`, then the `payload` parts in
  /// order) without blocking, from byte *sent of it (the header's first
  /// byte is 0) on: as much as the link takes now. *sent advances; returns
  /// the bytes written now, 0 when the link takes none (wait for writable).
  virtual absl::StatusOr<uint64_t> Send(const duckd_frame_header &header,
                                        absl::Span<const duckd::Part> payload,
                                        uint64_t *sent) = 0;

  /// Reads what has arrived of the next frame; the bytes read are added to
  /// *received. true: a whole frame is in *out; false: not yet (what came
  /// is kept for the next call). `wait`: may wait a short while (TCP: up
  /// to 100 ms) for bytes instead of returning at once. `only`: no frame
  /// is expected after this one, so header and payload may be read in one
  /// go; bytes past its end are then an error.
  virtual absl::StatusOr<bool> Receive(bool wait, bool only,
                                       ReceivedFrame *out,
                                       uint64_t *received) = 0;

  /// Makes room now for frames of up to `payload_bytes` (memory mapped
  /// before the first large reply, not while it arrives). Best effort.
  virtual void Reserve(uint64_t payload_bytes) { (void)payload_bytes; }
};

/// What a Wait watches on one connection, and what it found.
struct DuckWait {
  DuckConnection *conn = nullptr;
  bool read = false, write = false;         // in: what to wait for
  bool readable = false, writable = false;  // out; readable also on a
                                            // hang-up (Receive says what)
};

class DuckTransport {
public:
  virtual ~DuckTransport() = default;

  /// Connects to a duck. Frames it receives with payloads over
  /// `max_payload` bytes are refused (ValidateHeader).
  virtual absl::StatusOr<std::unique_ptr<DuckConnection>>
  Connect(const DuckEndpoint &endpoint, absl::Duration timeout,
          uint64_t max_payload) = 0;

  /// Waits until one of the connections (this transport's own) is ready
  /// as asked, or `timeout` passes (zero: look and return); fills each
  /// readable/writable and returns how many are ready.
  virtual absl::StatusOr<int> Wait(absl::Span<DuckWait> waits,
                                   absl::Duration timeout) = 0;
};

/// Blocking use of any transport, for what is not latency-critical (a
/// readiness probe, a tool): writes one whole frame, waiting on the
/// transport while the link is full; DeadlineExceeded ("timed out") past
/// `deadline`.
absl::Status SendFrame(DuckTransport &transport, DuckConnection &conn,
                       const duckd_frame_header &header,
                       absl::Span<const duckd::Part> payload,
                       absl::Time deadline);
/// Receives one whole frame (its header validated, its payload not
/// checked: the caller checks it, e.g. duckd::FinishHello) by `deadline`.
absl::StatusOr<ReceivedFrame> ReceiveFrame(DuckTransport &transport,
                                           DuckConnection &conn,
                                           absl::Time deadline);

/// TCP over IPv4: a socket a duck (TCP_NODELAY, close-on-exec), a frame's
/// header and payload parts written with one sendmsg (no copy), a reply
/// read with one recvmsg into its header and payload when it is the only
/// one awaited, poll(2) across connections. One instance serves any
/// number of clients.
std::shared_ptr<DuckTransport> TcpDuckTransport();

} // namespace duck::runtime

#endif // DUCK_RUNTIME_CLUSTER_DUCKTRANSPORT_H
