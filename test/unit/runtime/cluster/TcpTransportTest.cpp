// TcpDuckTransport on its own, against a scripted peer on a loopback
// socket (no duckd): frames that arrive in pieces, a reply followed by
// bytes it should not have, a bad header, a peer that hangs up, a link
// that fills up.
#include "duck/runtime/cluster/DuckTransport.h"

#include "duck_rt/wire_codec.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace duck::runtime {
namespace {

/// A listening loopback socket and the one connection it accepts.
class Peer {
public:
  Peer() {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    EXPECT_EQ(::bind(listen_, reinterpret_cast<sockaddr *>(&sa), len), 0);
    EXPECT_EQ(::listen(listen_, 1), 0);
    ::getsockname(listen_, reinterpret_cast<sockaddr *>(&sa), &len);
    port_ = ntohs(sa.sin_port);
  }
  ~Peer() {
    if (fd_ >= 0)
      ::close(fd_);
    ::close(listen_);
  }
  DuckEndpoint endpoint() const { return {"127.0.0.1", port_}; }
  void Accept() { fd_ = ::accept(listen_, nullptr, nullptr); }
  void Write(const std::vector<uint8_t> &b, size_t from, size_t to) {
    ASSERT_EQ(::send(fd_, b.data() + from, to - from, 0), ssize_t(to - from));
  }
  void HangUp() {
    ::close(fd_);
    fd_ = -1;
  }
  int fd() const { return fd_; }

private:
  int listen_ = -1, fd_ = -1;
  uint16_t port_ = 0;
};

std::vector<uint8_t> Reply(uint32_t id, size_t bytes) {
  std::vector<uint8_t> payload(bytes);
  for (size_t i = 0; i < bytes; ++i)
    payload[i] = uint8_t(i * 7);
  const duckd::Part p{payload.data(), payload.size()};
  return duckd::EncodeFrame(DUCKD_MSG_STEP, DUCKD_FLAG_REPLY, id, {&p, 1});
}

/// Receives until a whole frame is in, waiting on the transport.
absl::StatusOr<ReceivedFrame> Next(DuckTransport &t, DuckConnection &c,
                                   bool only, uint64_t *received) {
  ReceivedFrame f;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<bool> got = c.Receive(false, only, &f, received);
    if (!got.ok())
      return got.status();
    if (*got)
      return f;
    DuckWait w;
    w.conn = &c;
    w.read = true;
    (void)t.Wait({&w, 1}, absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError("no frame");
}

struct TcpTransportTest : ::testing::Test {
  void SetUp() override {
    auto c = tcp->Connect(peer.endpoint(), absl::Seconds(2), 1 << 20);
    ASSERT_TRUE(c.ok()) << c.status();
    conn = std::move(*c);
    peer.Accept();
  }
  std::shared_ptr<DuckTransport> tcp = TcpDuckTransport();
  Peer peer;
  std::unique_ptr<DuckConnection> conn;
};

TEST_F(TcpTransportTest, FramesInPiecesAndBackToBack) {
  const std::vector<uint8_t> a = Reply(1, 1000), b = Reply(2, 0),
                             c = Reply(3, 70000);
  uint64_t received = 0;
  ReceivedFrame f;
  absl::StatusOr<bool> got = conn->Receive(false, false, &f, &received);
  ASSERT_TRUE(got.ok() && !*got); // nothing yet
  peer.Write(a, 0, 10);           // inside the header
  DuckWait w;
  w.conn = conn.get();
  w.read = true;
  ASSERT_EQ(*tcp->Wait({&w, 1}, absl::Seconds(2)), 1);
  EXPECT_TRUE(w.readable);
  got = conn->Receive(false, false, &f, &received);
  ASSERT_TRUE(got.ok() && !*got);
  peer.Write(a, 10, 500); // the header and part of the payload
  peer.Write(a, 500, a.size());
  peer.Write(b, 0, b.size());
  peer.Write(c, 0, c.size());
  absl::StatusOr<ReceivedFrame> r = Next(*tcp, *conn, false, &received);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->header.request_id, 1u);
  EXPECT_TRUE(std::equal(r->payload.begin(), r->payload.end(), a.begin() + 32));
  r = Next(*tcp, *conn, false, &received);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->header.request_id, 2u);
  EXPECT_TRUE(r->payload.empty());
  r = Next(*tcp, *conn, true, &received); // the last one: read whole
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->payload.size(), 70000u);
  EXPECT_TRUE(std::equal(r->payload.begin(), r->payload.end(), c.begin() + 32));
  EXPECT_EQ(received, a.size() + b.size() + c.size());
}

TEST_F(TcpTransportTest, BytesAfterTheOnlyReplyAreAnError) {
  std::vector<uint8_t> two = Reply(1, 100), b = Reply(2, 10);
  two.insert(two.end(), b.begin(), b.end());
  peer.Write(two, 0, two.size());
  ::usleep(20000); // both arrive before the read
  uint64_t received = 0;
  absl::StatusOr<ReceivedFrame> r = Next(*tcp, *conn, true, &received);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(), "duckd sent more than one reply");
}

TEST_F(TcpTransportTest, BadHeaderAndHangUp) {
  std::vector<uint8_t> bad = Reply(1, 4);
  bad[0] ^= 0xff;
  peer.Write(bad, 0, bad.size());
  uint64_t received = 0;
  absl::StatusOr<ReceivedFrame> r = Next(*tcp, *conn, false, &received);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bad frame magic"), std::string::npos);

  auto c2 = tcp->Connect(peer.endpoint(), absl::Seconds(2), 1 << 20);
  ASSERT_TRUE(c2.ok());
  peer.HangUp(); // the first connection
  peer.Accept();
  peer.HangUp();
  r = Next(*tcp, **c2, false, &received);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(), "duckd closed the connection");
}

TEST_F(TcpTransportTest, SendsAFrameInPiecesWhenTheLinkIsFull) {
  std::vector<uint8_t> big(32 << 20, 0x5a);
  const duckd::Part parts[] = {{big.data(), big.size() / 2},
                               {big.data() + big.size() / 2, big.size() / 2}};
  const duckd_frame_header h = duckd::MakeHeader(DUCKD_MSG_PREPARE_WRITE, 0, 1,
                                                 parts);
  uint64_t sent = 0;
  absl::StatusOr<uint64_t> n = conn->Send(h, parts, &sent);
  ASSERT_TRUE(n.ok());
  EXPECT_GT(*n, 0u);
  EXPECT_LT(sent, 32 + big.size()); // the peer reads nothing: the link fills
  while ((n = conn->Send(h, parts, &sent)).ok() && *n > 0) {
  }
  ASSERT_TRUE(n.ok());
  DuckWait w;
  w.conn = conn.get();
  w.write = true;
  EXPECT_EQ(*tcp->Wait({&w, 1}, absl::ZeroDuration()), 0);
  EXPECT_FALSE(w.writable);
  // The peer reads the frame whole; the rest goes as it makes room.
  std::vector<uint8_t> in(32 + big.size());
  size_t got = 0;
  while (got < in.size()) {
    ssize_t r = ::recv(peer.fd(), in.data() + got, in.size() - got,
                       MSG_DONTWAIT);
    if (r > 0)
      got += size_t(r);
    if (sent < in.size()) {
      ASSERT_TRUE(conn->Send(h, parts, &sent).ok());
    }
  }
  absl::StatusOr<duckd::FrameView> v = duckd::DecodeFrame(in, 64 << 20);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->payload.size(), big.size());
}

} // namespace
} // namespace duck::runtime
