// Frame encoding, validation and blocking socket I/O of the duckd wire
// protocol (duck_rt/duckd_protocol.h), shared by duckd, the host client and
// the tests.
#ifndef DUCK_RT_WIRE_H
#define DUCK_RT_WIRE_H

#include "duck_rt/duckd_protocol.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include <cstdint>
#include <string>
#include <vector>

namespace duck::duckd {

/// XXH3-64 of a byte range (the payload checksum of a frame).
uint64_t Checksum(const void *data, size_t bytes);

/// Streaming XXH3-64 over the parts of one payload.
class StreamingChecksum {
public:
  StreamingChecksum();
  ~StreamingChecksum();
  StreamingChecksum(const StreamingChecksum &) = delete;
  StreamingChecksum &operator=(const StreamingChecksum &) = delete;
  void Reset();
  void Update(const void *data, size_t bytes);
  uint64_t Digest() const;

private:
  void *state_;
};

/// One contiguous piece of an outgoing payload.
struct Part {
  const void *data;
  size_t bytes;
};

duckd_frame_header MakeHeader(uint16_t type, uint32_t flags,
                              uint32_t request_id,
                              absl::Span<const Part> payload);

/// Checks everything a receiver can check before reading the payload.
absl::Status ValidateHeader(const duckd_frame_header &h, uint64_t max_payload);

/// Error payload (duckd_error + message) and its inverse.
std::string EncodeError(duckd_error_code code, absl::string_view message);
struct WireError {
  duckd_error_code code;
  std::string message;
};
absl::StatusOr<WireError> DecodeError(absl::Span<const uint8_t> payload);

const char *MessageTypeName(uint16_t type);
const char *ErrorCodeName(uint32_t code);

/// Blocking I/O on a socket with an absolute deadline (absl::InfiniteFuture
/// for none). Short reads and EINTR are handled; a peer that closes gives
/// an error mentioning "closed".
absl::Status ReadFull(int fd, void *data, size_t bytes, absl::Time deadline);
/// ReadFull into several buffers, in order, with as few syscalls as the
/// data allows (one recvmsg when it has all arrived).
struct MutablePart {
  void *data;
  size_t bytes;
};
absl::Status ReadFullV(int fd, absl::Span<const MutablePart> parts,
                       absl::Time deadline);
absl::Status WriteFull(int fd, absl::Span<const Part> parts,
                       absl::Time deadline);

/// Writes one frame (header + parts) as a unit.
absl::Status WriteFrame(int fd, uint16_t type, uint32_t flags,
                        uint32_t request_id, absl::Span<const Part> payload,
                        absl::Time deadline);

/// A whole received frame (header validated, checksum verified).
struct Frame {
  duckd_frame_header header{};
  std::vector<uint8_t> payload;
};
absl::StatusOr<Frame> ReadFrame(int fd, uint64_t max_payload,
                                absl::Time deadline);

/// Sets TCP_NODELAY and close-on-exec on a connected socket.
void TuneSocket(int fd);

} // namespace duck::duckd

#endif // DUCK_RT_WIRE_H
