// Blocking I/O of the duckd protocol's frames over a socket's file
// descriptor, on top of the frame codec (duck_rt/wire_codec.h): what duckd
// and the tests use; the host's DuckClient goes through its DuckTransport
// (runtime/include/duck/runtime/cluster/DuckTransport.h), whose TCP
// implementation has its own non-blocking I/O.
#ifndef DUCK_RT_WIRE_SOCKET_H
#define DUCK_RT_WIRE_SOCKET_H

#include "duck_rt/wire_codec.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include <cstdint>

namespace duck::duckd {

/// Blocking I/O on a socket with an absolute deadline (absl::InfiniteFuture
/// for none). Short reads and EINTR are handled; a peer that closes gives
/// an error mentioning "closed".
absl::Status ReadFull(int fd, void *data, size_t bytes, absl::Time deadline);
/// ReadFull into several buffers, in order, with as few syscalls as the
/// data allows (one recvmsg when it has all arrived).
absl::Status ReadFullV(int fd, absl::Span<const MutablePart> parts,
                       absl::Time deadline);
absl::Status WriteFull(int fd, absl::Span<const Part> parts,
                       absl::Time deadline);

/// Writes one frame (header + parts) as a unit.
absl::Status WriteFrame(int fd, uint16_t type, uint32_t flags,
                        uint32_t request_id, absl::Span<const Part> payload,
                        absl::Time deadline, FrameKeys *keys = nullptr);

/// Reads one whole frame: the header validated, the payload checked.
absl::StatusOr<Frame> ReadFrame(int fd, uint64_t max_payload,
                                absl::Time deadline,
                                FrameKeys *keys = nullptr);

/// Reads duckd's answer to `hello` and checks it (FinishHello).
absl::StatusOr<Frame> ReadHelloReply(int fd, const HostHello &hello,
                                     uint64_t max_payload, absl::Time deadline,
                                     FrameKeys *keys);

/// Sets TCP_NODELAY and close-on-exec on a connected socket.
void TuneSocket(int fd);

} // namespace duck::duckd

#endif // DUCK_RT_WIRE_SOCKET_H
