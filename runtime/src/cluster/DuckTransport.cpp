//===- DuckTransport.cpp - endpoints and the TCP transport ----------------===//
//
// TcpDuckTransport: the socket I/O the client did itself before the
// transport seam, unchanged: non-blocking sendmsg of a frame's header and
// payload parts, one recvmsg into header and payload when a frame is the
// only one awaited, a blocking receive bounded by SO_RCVTIMEO (100 ms)
// when asked to wait, poll(2) across connections.
//===----------------------------------------------------------------------===//
#include "duck/runtime/cluster/DuckTransport.h"

#include "duck_rt/wire_socket.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <vector>

namespace duck::runtime {

std::string DuckEndpoint::ToString() const {
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<DuckEndpoint> ParseDuckEndpoint(absl::string_view text) {
  size_t colon = text.rfind(':');
  uint32_t port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(text.substr(colon + 1), &port))
    return absl::InvalidArgumentError(
        absl::StrCat("duck endpoint '", text, "' is not host:port"));
  if (port == 0 || port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("duck endpoint '", text, "': port ", port,
                     " is outside 1-65535"));
  DuckEndpoint ep;
  ep.host = std::string(text.substr(0, colon));
  ep.port = uint16_t(port);
  return ep;
}

namespace {

bool WouldBlock() {
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

absl::Status RecvFailed(ssize_t r) {
  return r == 0 ? absl::UnavailableError("duckd closed the connection")
                : absl::UnavailableError(
                      absl::StrCat("recv: ", std::strerror(errno)));
}

class TcpConnection final : public DuckConnection {
public:
  TcpConnection(int fd, uint64_t max_payload)
      : fd_(fd), max_payload_(max_payload) {}
  ~TcpConnection() override { ::close(fd_); }
  int fd() const { return fd_; }

  absl::StatusOr<uint64_t> Send(const duckd_frame_header &header,
                                absl::Span<const duckd::Part> payload,
                                uint64_t *sent) override;
  absl::StatusOr<bool> Receive(bool wait, bool only, ReceivedFrame *out,
                               uint64_t *received) override;
  void Reserve(uint64_t payload_bytes) override {
    payload_bytes = std::min(payload_bytes, max_payload_);
    if (payload_.size() < payload_bytes)
      payload_.resize(payload_bytes); // zeroed: its pages mapped now
  }

private:
  absl::Status HeaderDone();

  int fd_;
  uint64_t max_payload_;
  bool ready_ = false; // the last Receive handed a whole frame over
  duckd_frame_header rh_{};
  size_t rh_got_ = 0;
  std::vector<uint8_t> payload_ = std::vector<uint8_t>(64 << 10); // capacity
  size_t plen_ = 0, p_got_ = 0; // this frame's payload, bytes read
};

absl::StatusOr<uint64_t>
TcpConnection::Send(const duckd_frame_header &header,
                    absl::Span<const duckd::Part> payload, uint64_t *sent) {
  iovec iov[8];
  int n = 0;
  uint64_t skip = *sent, pos = 0;
  auto add = [&](const void *p, uint64_t bytes) {
    if (n == 8 || pos + bytes <= skip) {
      pos += bytes;
      return;
    }
    uint64_t off = skip > pos ? skip - pos : 0;
    iov[n++] = {const_cast<uint8_t *>(static_cast<const uint8_t *>(p)) + off,
                bytes - off};
    pos += bytes;
  };
  add(&header, sizeof header);
  for (const duckd::Part &p : payload)
    if (p.bytes)
      add(p.data, p.bytes);
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = size_t(n);
  for (;;) {
    ssize_t w = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w >= 0) {
      *sent += uint64_t(w);
      return uint64_t(w);
    }
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return 0;
    return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
  }
}

/// A frame's header is in: checks it and makes room for its payload.
absl::Status TcpConnection::HeaderDone() {
  if (absl::Status s = duckd::ValidateHeader(rh_, max_payload_); !s.ok())
    return s;
  plen_ = rh_.payload_bytes;
  if (payload_.size() < plen_)
    payload_.resize(plen_); // keeps what was read already
  return absl::OkStatus();
}

absl::StatusOr<bool> TcpConnection::Receive(bool wait, bool only,
                                            ReceivedFrame *out,
                                            uint64_t *received) {
  if (ready_) { // the frame handed over last time is consumed
    ready_ = false;
    rh_got_ = 0;
  }
  // Waiting: the first read blocks (the socket is blocking, SO_RCVTIMEO
  // bounds it); every later one in this call does not.
  int flags = wait ? 0 : MSG_DONTWAIT;
  if (rh_got_ == 0 && only) {
    // One frame awaited: nothing can follow it, so header and payload are
    // read together, usually with a single syscall.
    iovec iov[2] = {{&rh_, sizeof rh_}, {payload_.data(), payload_.size()}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    ssize_t r = ::recvmsg(fd_, &msg, flags);
    flags = MSG_DONTWAIT;
    if (r <= 0)
      return r < 0 && WouldBlock() ? absl::StatusOr<bool>(false)
                                   : RecvFailed(r);
    *received += uint64_t(r);
    if (size_t(r) < sizeof rh_) {
      rh_got_ = size_t(r);
    } else {
      rh_got_ = sizeof rh_;
      const size_t got = size_t(r) - sizeof rh_;
      if (absl::Status s = HeaderDone(); !s.ok())
        return s;
      if (got > plen_)
        return absl::DataLossError("duckd sent more than one reply");
      p_got_ = got;
    }
  }
  while (rh_got_ < sizeof rh_) {
    ssize_t r = ::recv(fd_, reinterpret_cast<uint8_t *>(&rh_) + rh_got_,
                       sizeof rh_ - rh_got_, flags);
    flags = MSG_DONTWAIT;
    if (r <= 0)
      return r < 0 && WouldBlock() ? absl::StatusOr<bool>(false)
                                   : RecvFailed(r);
    rh_got_ += size_t(r);
    *received += uint64_t(r);
    if (rh_got_ == sizeof rh_) {
      if (absl::Status s = HeaderDone(); !s.ok())
        return s;
      p_got_ = 0;
    }
  }
  while (p_got_ < plen_) {
    ssize_t r = ::recv(fd_, payload_.data() + p_got_, plen_ - p_got_, flags);
    flags = MSG_DONTWAIT;
    if (r <= 0)
      return r < 0 && WouldBlock() ? absl::StatusOr<bool>(false)
                                   : RecvFailed(r);
    p_got_ += size_t(r);
    *received += uint64_t(r);
  }
  ready_ = true;
  out->header = rh_;
  out->payload = {payload_.data(), plen_};
  return true;
}

class TcpTransport final : public DuckTransport {
public:
  absl::StatusOr<std::unique_ptr<DuckConnection>>
  Connect(const DuckEndpoint &endpoint, absl::Duration timeout,
          uint64_t max_payload) override;
  absl::StatusOr<int> Wait(absl::Span<DuckWait> waits,
                           absl::Duration timeout) override;
};

/// A connected non-blocking socket to `ep`, or why not.
absl::StatusOr<int> ConnectSocket(const DuckEndpoint &ep,
                                  absl::Duration timeout) {
  std::string host = ep.host == "localhost" ? "127.0.0.1" : ep.host;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(ep.port);
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1)
    return absl::InvalidArgumentError("not an IPv4 address");
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  int r = ::connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa);
  if (r != 0 && errno != EINPROGRESS) {
    int e = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(e)));
  }
  if (r != 0) {
    pollfd p{fd, POLLOUT, 0};
    int n = ::poll(&p, 1, int(absl::ToInt64Milliseconds(timeout)));
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (n <= 0 || err) {
      ::close(fd);
      return absl::UnavailableError(absl::StrCat(
          "connect: ", n <= 0 ? "timed out" : std::strerror(err)));
    }
  }
  return fd;
}

absl::StatusOr<std::unique_ptr<DuckConnection>>
TcpTransport::Connect(const DuckEndpoint &endpoint, absl::Duration timeout,
                      uint64_t max_payload) {
  absl::StatusOr<int> fd = ConnectSocket(endpoint, timeout);
  if (!fd.ok())
    return fd.status();
  duckd::TuneSocket(*fd);
  // Blocking from now on (every call passes MSG_DONTWAIT where it must
  // not block); a blocking receive wakes at least every 100 ms.
  ::fcntl(*fd, F_SETFL, ::fcntl(*fd, F_GETFL) & ~O_NONBLOCK);
  timeval tv{0, 100000};
  ::setsockopt(*fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return std::unique_ptr<DuckConnection>(
      std::make_unique<TcpConnection>(*fd, max_payload));
}

absl::StatusOr<int> TcpTransport::Wait(absl::Span<DuckWait> waits,
                                       absl::Duration timeout) {
  thread_local std::vector<pollfd> pfds; // no allocation per step
  pfds.resize(waits.size());
  for (size_t i = 0; i < waits.size(); ++i) {
    const short ev = short((waits[i].read ? POLLIN : 0) |
                           (waits[i].write ? POLLOUT : 0));
    pfds[i] = {static_cast<TcpConnection *>(waits[i].conn)->fd(), ev, 0};
  }
  const int ms = int(absl::ToInt64Milliseconds(timeout + absl::Nanoseconds(
                                                   999999)));
  int r = ::poll(pfds.data(), pfds.size(), timeout <= absl::ZeroDuration()
                                               ? 0
                                               : ms);
  if (r < 0 && errno != EINTR)
    return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
  for (size_t i = 0; i < waits.size(); ++i) {
    waits[i].readable = pfds[i].revents & (POLLIN | POLLHUP | POLLERR);
    waits[i].writable = pfds[i].revents & POLLOUT;
  }
  return r < 0 ? 0 : r;
}

} // namespace

namespace {
/// Waits for `conn` to become readable (or writable) on `t`, in rounds of
/// at most 100 ms, until `deadline`.
absl::Status WaitOn(DuckTransport &t, DuckConnection &conn, bool read,
                    absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration())
    return absl::DeadlineExceededError("timed out");
  DuckWait w;
  w.conn = &conn;
  w.read = read;
  w.write = !read;
  absl::StatusOr<int> r =
      t.Wait({&w, 1}, std::min(left, absl::Milliseconds(100)));
  return r.status();
}
} // namespace

absl::Status SendFrame(DuckTransport &transport, DuckConnection &conn,
                       const duckd_frame_header &header,
                       absl::Span<const duckd::Part> payload,
                       absl::Time deadline) {
  const uint64_t total = sizeof header + header.payload_bytes;
  uint64_t sent = 0;
  while (sent < total) {
    absl::StatusOr<uint64_t> n = conn.Send(header, payload, &sent);
    if (!n.ok())
      return n.status();
    if (*n == 0)
      if (absl::Status s = WaitOn(transport, conn, false, deadline); !s.ok())
        return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<ReceivedFrame> ReceiveFrame(DuckTransport &transport,
                                           DuckConnection &conn,
                                           absl::Time deadline) {
  ReceivedFrame f;
  uint64_t received = 0;
  for (;;) {
    absl::StatusOr<bool> got = conn.Receive(false, false, &f, &received);
    if (!got.ok())
      return got.status();
    if (*got)
      return f;
    if (absl::Status s = WaitOn(transport, conn, true, deadline); !s.ok())
      return s;
  }
}

std::shared_ptr<DuckTransport> TcpDuckTransport() {
  static const std::shared_ptr<DuckTransport> tcp =
      std::make_shared<TcpTransport>();
  return tcp;
}

} // namespace duck::runtime
