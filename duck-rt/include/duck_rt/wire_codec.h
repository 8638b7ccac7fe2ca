// The duckd wire protocol's frame codec (duck_rt/duckd_protocol.h): payload
// checksums, frame authentication, headers, whole frames to and from byte
// buffers, error payloads. No socket I/O: what moves the bytes (a socket,
// duck_rt/wire_socket.h; the host's DuckTransport; a test's fake) is apart,
// so that every transport speaks the same frames.
#ifndef DUCK_RT_WIRE_CODEC_H
#define DUCK_RT_WIRE_CODEC_H

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
/// One contiguous piece of a buffer that incoming bytes fill.
struct MutablePart {
  void *data;
  size_t bytes;
};

/// Frame authentication of one connection (docs/protocol.md, "Frame
/// authentication"). Unkeyed, a frame's check field is the XXH3-64 of its
/// payload. Keyed, it is the first 8 bytes (little-endian) of
///   HMAC-SHA256(key, role || seq (u64 LE) || header bytes 0-23 || payload)
/// where role is the sender's ('H' host, 'D' duck) and seq counts the
/// sender's frames on the connection: a frame that is altered, replayed,
/// reordered, dropped or reflected back fails. Plain data, so a duckd worker
/// can hold it in shared memory while it serves the connection.
enum : uint8_t { kRoleHost = 'H', kRoleDuck = 'D' };
constexpr size_t kNonceBytes = DUCKD_NONCE_BYTES;
constexpr size_t kKeyBytes = 32;
struct FrameKeys {
  uint8_t key[kKeyBytes] = {};
  uint64_t send_seq = 0, recv_seq = 0;
  uint8_t keyed = 0; // 0: frames carry the plain checksum
  uint8_t role = 0;  // kRoleHost or kRoleDuck: who this side is
};

/// The key a host's hello is sealed with (seq 0): HMAC-SHA256(token,
/// "duckd hello" || host_nonce). Proves the token without sending it.
FrameKeys HelloKeys(absl::string_view token, const uint8_t *host_nonce,
                    uint8_t role);
/// The connection's key after hello: HMAC-SHA256(token, "duckd frames" ||
/// host_nonce || duck_nonce); both sides' hello frames were seq 0, so the
/// counters start at 1.
FrameKeys ConnectionKeys(absl::string_view token, const uint8_t *host_nonce,
                         const uint8_t *duck_nonce, uint8_t role);
/// kNonceBytes from the kernel's random source.
absl::Status RandomNonce(uint8_t *out);
/// The ducks' mesh (duck_rt/peer_mesh.h): a pair's key from the cluster's
/// token and both hellos' nonces, HMAC-SHA256(token, "duck mesh" ||
/// connector_nonce || acceptor_nonce), and what a side sends to prove it
/// holds it: HMAC-SHA256(key, "duck mesh proof" || role) (kKeyBytes).
void MeshKey(absl::string_view token, const uint8_t *connector_nonce,
             const uint8_t *acceptor_nonce, uint8_t *key);
void MeshProof(const uint8_t *key, uint8_t role, uint8_t *proof);
class FrameCheck;
/// Fetches and exercises the HMAC implementation once (on this thread, and
/// with `check` if given), so that a process about to confine itself (the
/// duckd worker's sandbox) has loaded all it needs: later frames make no
/// system call of their own.
void WarmUpFrameAuth(FrameCheck *check = nullptr);

/// The host's half of hello: the request (with a fresh nonce) and the keys
/// its frame is sealed with (unkeyed without a token).
struct HostHello {
  duckd_hello_request request{};
  FrameKeys keys;
  std::string token;
};
absl::StatusOr<HostHello> BeginHello(absl::string_view token);
/// Checks duckd's answer to `hello`. An error reply or notice is checked
/// against its plain checksum (duckd cannot seal a refusal for a host it
/// could not authenticate) and leaves *keys alone: the caller reports it.
/// A hello reply from a duck that authenticated gives the connection's
/// keys; one without authentication is refused when the host has a token.
absl::Status FinishHello(const HostHello &hello, const duckd_frame_header &h,
                         absl::Span<const uint8_t> payload, FrameKeys *keys);

/// A frame's header; with keys that are keyed, sealed with keys->send_seq
/// (which advances).
duckd_frame_header MakeHeader(uint16_t type, uint32_t flags,
                              uint32_t request_id,
                              absl::Span<const Part> payload,
                              FrameKeys *keys = nullptr);

/// Checks a received payload as its bytes arrive: the plain checksum, or
/// with keyed keys the tag at keys->recv_seq (which advances at Finish).
class FrameCheck {
public:
  FrameCheck();
  ~FrameCheck();
  FrameCheck(const FrameCheck &) = delete;
  FrameCheck &operator=(const FrameCheck &) = delete;
  void Begin(const duckd_frame_header &h, FrameKeys *keys);
  void Update(const void *data, size_t bytes);
  /// OK, DataLoss ("payload checksum mismatch") or PermissionDenied
  /// ("frame authentication failed ...").
  absl::Status Finish();

private:
  StreamingChecksum sum_;
  void *mac_; // EVP_MAC_CTX
  FrameKeys *keys_ = nullptr;
  uint64_t expect_ = 0;
};

/// FrameCheck over a whole payload held in memory.
absl::Status CheckPayload(const duckd_frame_header &h,
                          absl::Span<const uint8_t> payload, FrameKeys *keys);

/// Checks everything a receiver can check before reading the payload.
absl::Status ValidateHeader(const duckd_frame_header &h, uint64_t max_payload);

/// A whole received frame (header validated, check verified).
struct Frame {
  duckd_frame_header header{};
  std::vector<uint8_t> payload;
};

/// A frame decoded in place from a byte buffer: its header and a view of
/// its payload inside that buffer.
struct FrameView {
  duckd_frame_header header{};
  absl::Span<const uint8_t> payload;
  size_t frame_bytes = 0; // header + payload: where the next frame starts
};

/// Appends one whole frame (MakeHeader's header, then the payload parts)
/// to *out; with keyed keys, sealed with keys->send_seq (which advances).
void AppendFrame(std::vector<uint8_t> *out, uint16_t type, uint32_t flags,
                 uint32_t request_id, absl::Span<const Part> payload,
                 FrameKeys *keys = nullptr);
/// AppendFrame into a buffer of its own.
std::vector<uint8_t> EncodeFrame(uint16_t type, uint32_t flags,
                                 uint32_t request_id,
                                 absl::Span<const Part> payload,
                                 FrameKeys *keys = nullptr);

/// The header at the start of `bytes`, validated (ValidateHeader). Fewer
/// bytes than a header: OutOfRange ("truncated frame: ...").
absl::StatusOr<duckd_frame_header> DecodeHeader(absl::Span<const uint8_t> bytes,
                                                uint64_t max_payload);
/// The frame at the start of `bytes`: the header validated, then the
/// payload checked as CheckPayload does (keys->recv_seq advances on a
/// keyed connection). A buffer that ends inside the frame is OutOfRange
/// ("truncated frame: ..." with the bytes there and needed), so a stream
/// reader can tell "wait for more" from a malformed frame (every other
/// error). Bytes after the frame are left alone (frame_bytes).
absl::StatusOr<FrameView> DecodeFrame(absl::Span<const uint8_t> bytes,
                                      uint64_t max_payload,
                                      FrameKeys *keys = nullptr);

/// Error payload (duckd_error + message) and its inverse.
std::string EncodeError(duckd_error_code code, absl::string_view message);
struct WireError {
  duckd_error_code code;
  std::string message;
};
absl::StatusOr<WireError> DecodeError(absl::Span<const uint8_t> payload);

const char *MessageTypeName(uint16_t type);
const char *ErrorCodeName(uint32_t code);

} // namespace duck::duckd

#endif // DUCK_RT_WIRE_CODEC_H
