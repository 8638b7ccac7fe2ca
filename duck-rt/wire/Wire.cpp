// Frame encoding, validation and blocking socket I/O of the duckd protocol.
#include "duck_rt/wire.h"

#include "absl/strings/str_cat.h"

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

namespace duck::duckd {

namespace avx2 { // ChecksumAvx2.cpp
uint64_t Hash(const void *data, size_t bytes);
void *NewState();
void FreeState(void *s);
void Reset(void *s);
void Update(void *s, const void *data, size_t bytes);
uint64_t Digest(const void *s);
} // namespace avx2

namespace {
bool HasAvx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}
} // namespace

uint64_t Checksum(const void *data, size_t bytes) {
  return HasAvx2() ? avx2::Hash(data, bytes) : XXH3_64bits(data, bytes);
}

StreamingChecksum::StreamingChecksum()
    : state_(HasAvx2() ? avx2::NewState() : XXH3_createState()) {
  Reset();
}
StreamingChecksum::~StreamingChecksum() {
  if (HasAvx2())
    avx2::FreeState(state_);
  else
    XXH3_freeState(static_cast<XXH3_state_t *>(state_));
}
void StreamingChecksum::Reset() {
  if (HasAvx2())
    avx2::Reset(state_);
  else
    XXH3_64bits_reset(static_cast<XXH3_state_t *>(state_));
}
void StreamingChecksum::Update(const void *data, size_t bytes) {
  if (HasAvx2())
    avx2::Update(state_, data, bytes);
  else
    XXH3_64bits_update(static_cast<XXH3_state_t *>(state_), data, bytes);
}
uint64_t StreamingChecksum::Digest() const {
  return HasAvx2() ? avx2::Digest(state_)
                   : XXH3_64bits_digest(static_cast<XXH3_state_t *>(state_));
}

duckd_frame_header MakeHeader(uint16_t type, uint32_t flags,
                              uint32_t request_id,
                              absl::Span<const Part> payload) {
  duckd_frame_header h{};
  h.magic = DUCKD_FRAME_MAGIC;
  h.version = DUCKD_PROTOCOL_VERSION;
  h.type = type;
  h.flags = flags;
  h.request_id = request_id;
  uint64_t total = 0;
  for (const Part &p : payload)
    total += p.bytes;
  h.payload_bytes = total;
  if (payload.size() == 1) {
    h.payload_checksum = Checksum(payload[0].data, payload[0].bytes);
  } else {
    thread_local StreamingChecksum sum; // no allocation per frame
    sum.Reset();
    for (const Part &p : payload)
      sum.Update(p.data, p.bytes);
    h.payload_checksum = sum.Digest();
  }
  return h;
}

absl::Status ValidateHeader(const duckd_frame_header &h, uint64_t max_payload) {
  if (h.magic != DUCKD_FRAME_MAGIC)
    return absl::InvalidArgumentError(
        absl::StrCat("bad frame magic 0x", absl::Hex(h.magic),
                     " (not a duckd protocol peer)"));
  if (h.version != DUCKD_PROTOCOL_VERSION)
    return absl::FailedPreconditionError(
        absl::StrCat("protocol version ", h.version, ", this side speaks ",
                     DUCKD_PROTOCOL_VERSION));
  if (h.type == 0 || h.type >= DUCKD_MSG_COUNT)
    return absl::InvalidArgumentError(
        absl::StrCat("unknown message type ", h.type));
  if (h.flags & ~uint32_t(DUCKD_FLAG_REPLY | DUCKD_FLAG_ERROR))
    return absl::InvalidArgumentError(
        absl::StrCat("unknown frame flags 0x", absl::Hex(h.flags)));
  if (h.payload_bytes > max_payload)
    return absl::ResourceExhaustedError(
        absl::StrCat("payload of ", h.payload_bytes, " bytes exceeds the ",
                     max_payload, "-byte limit"));
  return absl::OkStatus();
}

std::string EncodeError(duckd_error_code code, absl::string_view message) {
  duckd_error e{};
  e.code = code;
  e.message_bytes = static_cast<uint32_t>(message.size());
  std::string out(sizeof e, '\0');
  std::memcpy(out.data(), &e, sizeof e);
  out.append(message.data(), message.size());
  return out;
}

absl::StatusOr<WireError> DecodeError(absl::Span<const uint8_t> payload) {
  duckd_error e;
  if (payload.size() < sizeof e)
    return absl::InvalidArgumentError("error reply shorter than its header");
  std::memcpy(&e, payload.data(), sizeof e);
  if (e.message_bytes != payload.size() - sizeof e)
    return absl::InvalidArgumentError("error reply length mismatch");
  return WireError{static_cast<duckd_error_code>(e.code),
                   std::string(reinterpret_cast<const char *>(payload.data()) +
                                   sizeof e,
                               e.message_bytes)};
}

const char *MessageTypeName(uint16_t type) {
  switch (type) {
  case DUCKD_MSG_HELLO: return "hello";
  case DUCKD_MSG_OPEN: return "open";
  case DUCKD_MSG_STEP: return "step";
  case DUCKD_MSG_RUN: return "run";
  case DUCKD_MSG_PREPARE_BEGIN: return "prepare_begin";
  case DUCKD_MSG_PREPARE_WRITE: return "prepare_write";
  case DUCKD_MSG_PREPARE_FINISH: return "prepare_finish";
  case DUCKD_MSG_CLOSE: return "close";
  case DUCKD_MSG_NOTICE: return "notice";
  default: return "unknown";
  }
}

const char *ErrorCodeName(uint32_t code) {
  switch (code) {
  case DUCKD_ERR_BAD_FRAME: return "bad_frame";
  case DUCKD_ERR_BAD_REQUEST: return "bad_request";
  case DUCKD_ERR_BAD_ABI: return "bad_abi";
  case DUCKD_ERR_UNAUTHORIZED: return "unauthorized";
  case DUCKD_ERR_BUSY: return "busy";
  case DUCKD_ERR_NO_SESSION: return "no_session";
  case DUCKD_ERR_BAD_ELF: return "bad_elf";
  case DUCKD_ERR_STEP_CRASHED: return "step_crashed";
  case DUCKD_ERR_STEP_TIMEOUT: return "step_timeout";
  case DUCKD_ERR_CACHE: return "cache";
  case DUCKD_ERR_TOO_LARGE: return "too_large";
  case DUCKD_ERR_INTERNAL: return "internal";
  default: return "unknown";
  }
}

namespace {

/// Waits until `fd` is ready for `events` or the deadline passes.
absl::Status WaitFd(int fd, short events, absl::Time deadline) {
  for (;;) {
    int timeout = -1;
    if (deadline != absl::InfiniteFuture()) {
      absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration())
        return absl::DeadlineExceededError("timed out");
      timeout = static_cast<int>(
          absl::ToInt64Milliseconds(left + absl::Microseconds(999)));
    }
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, timeout);
    if (r > 0)
      return absl::OkStatus();
    if (r < 0 && errno != EINTR)
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
  }
}

} // namespace

absl::Status ReadFull(int fd, void *data, size_t bytes, absl::Time deadline) {
  auto *p = static_cast<uint8_t *>(data);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::recv(fd, p + done, bytes - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0)
      return absl::UnavailableError(
          absl::StrCat("connection closed by peer after ", done, " of ",
                       bytes, " bytes"));
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return absl::UnavailableError(
          absl::StrCat("recv: ", std::strerror(errno)));
    if (absl::Status s = WaitFd(fd, POLLIN, deadline); !s.ok())
      return absl::DeadlineExceededError(absl::StrCat(
          "read timed out after ", done, " of ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ReadFullV(int fd, absl::Span<const MutablePart> parts,
                       absl::Time deadline) {
  iovec iov[8];
  if (parts.size() > 8)
    return absl::InternalError("ReadFullV: too many parts");
  size_t count = 0, total = 0;
  for (const MutablePart &p : parts)
    if (p.bytes) {
      iov[count++] = {p.data, p.bytes};
      total += p.bytes;
    }
  size_t first = 0, done = 0;
  while (first < count) {
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = count - first;
    ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT);
    if (n == 0)
      return absl::UnavailableError(
          absl::StrCat("connection closed by peer after ", done, " of ",
                       total, " bytes"));
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return absl::UnavailableError(
            absl::StrCat("recv: ", std::strerror(errno)));
      if (absl::Status s = WaitFd(fd, POLLIN, deadline); !s.ok())
        return absl::DeadlineExceededError(absl::StrCat(
            "read timed out after ", done, " of ", total, " bytes"));
      continue;
    }
    done += size_t(n);
    size_t left = size_t(n);
    while (first < count && left >= iov[first].iov_len)
      left -= iov[first++].iov_len;
    if (first < count) {
      iov[first].iov_base = static_cast<uint8_t *>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, absl::Span<const Part> parts,
                       absl::Time deadline) {
  iovec small[16];
  std::vector<iovec> big;
  iovec *iov = small;
  if (parts.size() > 16) {
    big.resize(parts.size());
    iov = big.data();
  }
  size_t count = 0;
  for (const Part &p : parts)
    if (p.bytes)
      iov[count++] = {const_cast<void *>(p.data), p.bytes};
  size_t first = 0;
  while (first < count) {
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = count - first;
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return absl::UnavailableError(
            absl::StrCat("send: ", std::strerror(errno)));
      if (absl::Status s = WaitFd(fd, POLLOUT, deadline); !s.ok())
        return absl::DeadlineExceededError("write timed out");
      continue;
    }
    size_t left = static_cast<size_t>(n);
    while (first < count && left >= iov[first].iov_len)
      left -= iov[first++].iov_len;
    if (first < count) {
      iov[first].iov_base = static_cast<uint8_t *>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status WriteFrame(int fd, uint16_t type, uint32_t flags,
                        uint32_t request_id, absl::Span<const Part> payload,
                        absl::Time deadline) {
  duckd_frame_header h = MakeHeader(type, flags, request_id, payload);
  Part small[16];
  std::vector<Part> big;
  Part *parts = small;
  if (payload.size() + 1 > 16) {
    big.resize(payload.size() + 1);
    parts = big.data();
  }
  parts[0] = {&h, sizeof h};
  std::copy(payload.begin(), payload.end(), parts + 1);
  return WriteFull(fd, absl::MakeConstSpan(parts, payload.size() + 1),
                   deadline);
}

absl::StatusOr<Frame> ReadFrame(int fd, uint64_t max_payload,
                                absl::Time deadline) {
  Frame f;
  if (absl::Status s = ReadFull(fd, &f.header, sizeof f.header, deadline);
      !s.ok())
    return s;
  if (absl::Status s = ValidateHeader(f.header, max_payload); !s.ok())
    return s;
  f.payload.resize(f.header.payload_bytes);
  if (absl::Status s = ReadFull(fd, f.payload.data(), f.payload.size(),
                                deadline);
      !s.ok())
    return s;
  if (Checksum(f.payload.data(), f.payload.size()) !=
      f.header.payload_checksum)
    return absl::DataLossError("payload checksum mismatch");
  return f;
}

void TuneSocket(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
}

} // namespace duck::duckd
