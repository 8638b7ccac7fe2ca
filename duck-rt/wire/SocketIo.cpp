// Blocking socket I/O of the duckd protocol's frames over a file
// descriptor (duck_rt/wire_socket.h), on top of the codec.
#include "duck_rt/wire_socket.h"

#include "absl/strings/str_cat.h"

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
  const MutablePart part{data, bytes};
  return ReadFullV(fd, {&part, 1}, deadline);
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
                        absl::Time deadline, FrameKeys *keys) {
  duckd_frame_header h = MakeHeader(type, flags, request_id, payload, keys);
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

namespace {
absl::StatusOr<Frame> ReadUnchecked(int fd, uint64_t max_payload,
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
  return f;
}
} // namespace

absl::StatusOr<Frame> ReadHelloReply(int fd, const HostHello &hello,
                                     uint64_t max_payload, absl::Time deadline,
                                     FrameKeys *keys) {
  auto f = ReadUnchecked(fd, max_payload, deadline);
  if (!f.ok())
    return f;
  if (absl::Status s = FinishHello(hello, f->header, f->payload, keys);
      !s.ok())
    return s;
  return f;
}

absl::StatusOr<Frame> ReadFrame(int fd, uint64_t max_payload,
                                absl::Time deadline, FrameKeys *keys) {
  auto f = ReadUnchecked(fd, max_payload, deadline);
  if (!f.ok())
    return f;
  if (absl::Status s = CheckPayload(f->header, f->payload, keys); !s.ok())
    return s;
  return f;
}

void TuneSocket(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
}

} // namespace duck::duckd
