//===- LinkSimTest.cpp - the link simulator's rate, shared port, latency ---===//
//
// Timing is checked only from below, where the simulator is exact: the last
// byte of B bytes through a link of rate R cannot leave before B*8/R, nor a
// round trip before twice the one-way latency, however loaded the machine.
// The upper bounds are 20x the expected time (a sanity check, not a rate),
// but for the cast's: 1.5x, to tell one copy through a link from two.
//===----------------------------------------------------------------------===//
#include "duck/runtime/cluster/LinkSim.h"

#include "gtest/gtest.h"

#include <arpa/inet.h>
#include <chrono>
#include <cstring>
#include <netinet/in.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace duck::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// A backend: accepts one connection; echo mode sends every byte back,
/// else it reads to the end and checks the pattern (byte i == i % 251).
struct Backend {
  int listen_fd = -1;
  uint16_t port = 0;
  size_t received = 0;
  bool pattern_ok = true;
  std::thread t;

  explicit Backend(bool echo, int accepts = 1) {
    listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(bind(listen_fd, (sockaddr *)&a, sizeof a), 0);
    EXPECT_EQ(listen(listen_fd, 4), 0);
    getsockname(listen_fd, (sockaddr *)&a, &len);
    port = ntohs(a.sin_port);
    t = std::thread([this, echo, accepts] {
      for (int i = 0; i < accepts; ++i)
        Serve(echo);
    });
  }
  void Serve(bool echo) {
    int fd = accept(listen_fd, nullptr, nullptr);
    char buf[65536];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) {
      for (ssize_t i = 0; i < n && !echo; ++i)
        pattern_ok &= (unsigned char)buf[i] == (received + i) % 251;
      received += size_t(n);
      if (echo)
        (void)!write(fd, buf, size_t(n));
    }
    close(fd);
  }
  ~Backend() {
    if (t.joinable())
      t.join();
    close(listen_fd);
  }
  DuckEndpoint endpoint() const { return {"127.0.0.1", port}; }
};

int Connect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_EQ(connect(fd, (sockaddr *)&a, sizeof a), 0);
  return fd;
}

void SendPattern(int fd, size_t bytes) {
  std::vector<char> buf(bytes);
  for (size_t i = 0; i < bytes; ++i)
    buf[i] = char(i % 251);
  size_t off = 0;
  while (off < bytes) {
    ssize_t n = write(fd, buf.data() + off, bytes - off);
    ASSERT_GT(n, 0);
    off += size_t(n);
  }
  shutdown(fd, SHUT_WR);
}

TEST(LinkSimTest, DuckLinkLimitsTheRate) {
  Backend b(false);
  LinkSimOptions o;
  o.backends = {b.endpoint()};
  o.duck_link_gbps = 0.08; // 10 MB/s: 1 MB takes 0.1 s
  auto sim = LinkSim::Start(o);
  ASSERT_TRUE(sim.ok()) << sim.status();
  const size_t bytes = 1 << 20;
  const auto t0 = Clock::now();
  int fd = Connect((*sim)->ports()[0]);
  SendPattern(fd, bytes);
  b.t.join(); // the backend has read every byte
  const double s = Since(t0);
  close(fd);
  EXPECT_EQ(b.received, bytes);
  EXPECT_TRUE(b.pattern_ok); // in order, unchanged
  EXPECT_GE(s, 0.95 * bytes * 8 / 0.08e9);
  EXPECT_LT(s, 20 * bytes * 8 / 0.08e9);
  (*sim)->Stop();
  EXPECT_EQ((*sim)->stats()[0].bytes_to_duck, bytes);
  EXPECT_EQ((*sim)->stats()[0].connections, 1u);
}

TEST(LinkSimTest, HostPortIsSharedByAllDucks) {
  Backend b0(false), b1(false);
  LinkSimOptions o;
  o.backends = {b0.endpoint(), b1.endpoint()};
  o.host_link_gbps = 0.08; // both ducks' bytes share 10 MB/s
  auto sim = LinkSim::Start(o);
  ASSERT_TRUE(sim.ok()) << sim.status();
  const size_t bytes = 512 << 10;
  const auto t0 = Clock::now();
  int f0 = Connect((*sim)->ports()[0]), f1 = Connect((*sim)->ports()[1]);
  std::thread s1([&] { SendPattern(f1, bytes); });
  SendPattern(f0, bytes);
  s1.join();
  b0.t.join();
  b1.t.join();
  const double s = Since(t0);
  close(f0);
  close(f1);
  EXPECT_EQ(b0.received + b1.received, 2 * bytes);
  EXPECT_GE(s, 0.95 * 2 * bytes * 8 / 0.08e9); // not one duck's 0.05 s
  EXPECT_LT(s, 20 * 2 * bytes * 8 / 0.08e9);
}

TEST(LinkSimTest, LatencyEachWay) {
  Backend b(true);
  LinkSimOptions o;
  o.backends = {b.endpoint()};
  o.latency_us = 10000; // 10 ms one way
  auto sim = LinkSim::Start(o);
  ASSERT_TRUE(sim.ok()) << sim.status();
  int fd = Connect((*sim)->ports()[0]);
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i) {
    char c = char(i), r = 0;
    ASSERT_EQ(write(fd, &c, 1), 1);
    ASSERT_EQ(read(fd, &r, 1), 1);
    EXPECT_EQ(r, c);
  }
  const double s = Since(t0);
  EXPECT_GE(s, 5 * 2 * 0.0095);
  EXPECT_LT(s, 5 * 2 * 0.010 * 20);
  shutdown(fd, SHUT_WR);
  b.t.join();
  close(fd);
}

TEST(LinkSimTest, StopsWithLiveConnections) {
  Backend b(true);
  LinkSimOptions o;
  o.backends = {b.endpoint()};
  o.duck_link_gbps = 0.001;
  auto sim = LinkSim::Start(o);
  ASSERT_TRUE(sim.ok()) << sim.status();
  int fd = Connect((*sim)->ports()[0]);
  std::vector<char> buf(256 << 10, 'x');
  ASSERT_GT(write(fd, buf.data(), buf.size()), 0); // held in the queue
  // Until the simulator has accepted it and connected to the backend (the
  // backend waits for that connection).
  for (int i = 0; i < 1000 && (*sim)->stats()[0].connections == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ((*sim)->stats()[0].connections, 1u);
  (*sim)->Stop(); // returns: closes both sides, joins its threads
  b.t.join();
  close(fd);
}

TEST(LinkSimTest, PeerTrafficPassesBothDucksLinksNotTheHostPort) {
  // Ducks 0 and 1 each send B bytes to duck 2 over the mesh: duck 2's
  // inbound link carries 2B; the host's port (here the slow one if it
  // were on the path) carries nothing.
  Backend mesh2(false, 2);
  LinkSimOptions o;
  o.backends.assign(3, {"127.0.0.1", 1}); // no host traffic
  o.peer_backends = {{"127.0.0.1", 1}, {"127.0.0.1", 1}, mesh2.endpoint()};
  o.duck_link_gbps = 0.08; // 10 MB/s
  o.host_link_gbps = 0.0008;
  auto sim = LinkSim::Start(o);
  ASSERT_TRUE(sim.ok()) << sim.status();
  const auto &pp = (*sim)->peer_ports();
  ASSERT_EQ(pp.size(), 3u);
  EXPECT_EQ(pp[1][0], 0); // the lower rank dials
  const size_t bytes = 256 << 10;
  const auto t0 = Clock::now();
  int f0 = Connect(pp[0][2]), f1 = Connect(pp[1][2]);
  std::thread s1([&] { SendPattern(f1, bytes); });
  SendPattern(f0, bytes);
  s1.join();
  mesh2.t.join();
  const double s = Since(t0);
  close(f0);
  close(f1);
  EXPECT_EQ(mesh2.received, 2 * bytes);
  EXPECT_GE(s, 0.95 * 2 * bytes * 8 / 0.08e9); // duck 2's inbound, shared
  EXPECT_LT(s, 20 * 2 * bytes * 8 / 0.08e9);   // not the host's port
  (*sim)->Stop();
  const auto st = (*sim)->stats();
  EXPECT_EQ(st[0].bytes_to_peers, bytes);
  EXPECT_EQ(st[1].bytes_to_peers, bytes);
  EXPECT_EQ(st[2].bytes_from_peers, 2 * bytes);
  EXPECT_EQ(st[2].bytes_to_duck, 0u);
  EXPECT_EQ(st[2].connections, 0u);
}

/// A UDP socket on 127.0.0.1 (a duck's datagram or cast socket): its
/// port; reads time out after 5 s, so a lost datagram fails the test
/// rather than hangs it.
int UdpReceiver(uint16_t *port) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(bind(fd, (sockaddr *)&a, sizeof a), 0);
  EXPECT_EQ(getsockname(fd, (sockaddr *)&a, &len), 0);
  const int big = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  *port = ntohs(a.sin_port);
  return fd;
}

// The mesh's datagrams: ducks 0 and 1 each send 200 datagrams of 1000
// bytes to duck 2 through their relays; duck 2 gets all of them, each
// sender's in order, no sooner than its inbound link carries 400 kB, and
// the bytes are counted on both sides.
TEST(LinkSimTest, DatagramsPassBothDucksLinksInOrder) {
  uint16_t rxPort = 0;
  int rx = UdpReceiver(&rxPort);
  ASSERT_GE(rx, 0);
  LinkSimOptions o;
  o.backends.assign(3, {"127.0.0.1", 1}); // no host traffic
  o.peer_datagram_ports = {1, 1, rxPort};
  o.duck_link_gbps = 0.08; // 10 MB/s
  auto sim = LinkSim::Start(o);
  ASSERT_TRUE(sim.ok()) << sim.status();
  const auto &relay = (*sim)->peer_datagram_relays();
  ASSERT_EQ(relay.size(), 3u);
  EXPECT_EQ(relay[2][2], 0);
  const int count = 200, bytes = 1000;
  const auto t0 = Clock::now();
  int tx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  for (int k = 0; k < count; ++k)
    for (int from : {0, 1}) {
      char d[bytes] = {};
      d[0] = char(from);
      std::memcpy(d + 1, &k, sizeof k);
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      to.sin_port = htons(relay[from][2]);
      ASSERT_EQ(sendto(tx, d, bytes, 0, (sockaddr *)&to, sizeof to), bytes);
    }
  int next[2] = {0, 0};
  for (int got = 0; got < 2 * count; ++got) {
    char d[2 * bytes];
    ASSERT_EQ(recv(rx, d, sizeof d, 0), bytes);
    int k;
    std::memcpy(&k, d + 1, sizeof k);
    ASSERT_EQ(k, next[int(d[0])]++) << "from relay " << int(d[0]);
  }
  const double s = Since(t0);
  EXPECT_GE(s, 0.95 * 2 * count * bytes * 8 / 0.08e9); // duck 2's inbound
  EXPECT_LT(s, 20 * 2 * count * bytes * 8 / 0.08e9);
  close(tx);
  close(rx);
  (*sim)->Stop();
  const auto st = (*sim)->stats();
  EXPECT_EQ(st[0].bytes_to_peers, uint64_t(count * bytes));
  EXPECT_EQ(st[1].bytes_to_peers, uint64_t(count * bytes));
  EXPECT_EQ(st[2].bytes_from_peers, uint64_t(2 * count * bytes));
}

void SendTo(int fd, uint16_t port, const std::vector<char> &d) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(port);
  ASSERT_EQ(sendto(fd, d.data(), d.size(), 0, (sockaddr *)&to, sizeof to),
            ssize_t(d.size()));
}

// The host's cast datagrams: each one sent once to the relay reaches every
// duck's cast port whole and in order; the host's port counts it once,
// each duck's link its copy (and none of it as TCP bytes).
TEST(LinkSimTest, CastRelayCopiesEachDatagramToEveryDuck) {
  uint16_t p0 = 0, p1 = 0;
  int rx0 = UdpReceiver(&p0), rx1 = UdpReceiver(&p1);
  LinkSimOptions o;
  o.backends.assign(2, {"127.0.0.1", 1}); // no host traffic
  o.cast_ports = {p0, p1};
  auto sim = LinkSim::Start(o);
  ASSERT_TRUE(sim.ok()) << sim.status();
  const uint16_t relay = (*sim)->cast_relay_port();
  ASSERT_NE(relay, 0);
  EXPECT_NE(relay, p0);
  EXPECT_NE(relay, p1);
  std::vector<std::vector<char>> sent;
  uint64_t total = 0;
  int tx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  for (size_t bytes : {1, 1432, 9000, 30000, 1432}) {
    std::vector<char> d(bytes);
    for (size_t i = 0; i < bytes; ++i)
      d[i] = char((i * 7 + sent.size() * 13 + bytes) % 251);
    SendTo(tx, relay, d);
    total += bytes;
    sent.push_back(std::move(d));
  }
  for (int rx : {rx0, rx1})
    for (size_t k = 0; k < sent.size(); ++k) {
      std::vector<char> d(65536);
      const ssize_t n = recv(rx, d.data(), d.size(), 0);
      ASSERT_EQ(n, ssize_t(sent[k].size())) << "datagram " << k;
      d.resize(size_t(n));
      EXPECT_EQ(d, sent[k]) << "datagram " << k;
    }
  close(tx);
  close(rx0);
  close(rx1);
  EXPECT_EQ((*sim)->cast_bytes_from_host(), total); // once, not per duck
  (*sim)->Stop();
  const auto st = (*sim)->stats();
  ASSERT_EQ(st.size(), 2u);
  for (const LinkSimDuckStats &d : st) {
    EXPECT_EQ(d.cast_bytes_to_duck, total);
    EXPECT_EQ(d.bytes_to_duck, 0u);
    EXPECT_EQ(d.bytes_from_peers, 0u);
  }
}

// Three datagrams of 1250 bytes at 1 Mb/s take 30 ms through one link. The
// slow host's port carries each once for both ducks (30 ms, not 60); slow
// duck links each carry their own copy side by side (30 ms, not 60).
TEST(LinkSimTest, CastPassesTheHostPortOnceAndEachDucksLink) {
  const int count = 3, bytes = 1250;
  const double once = count * bytes * 8 / 0.001e9; // 0.03 s
  for (bool slow_host : {true, false}) {
    SCOPED_TRACE(slow_host ? "slow host port" : "slow duck links");
    uint16_t p0 = 0, p1 = 0;
    int rx0 = UdpReceiver(&p0), rx1 = UdpReceiver(&p1);
    LinkSimOptions o;
    o.backends.assign(2, {"127.0.0.1", 1});
    o.cast_ports = {p0, p1};
    (slow_host ? o.host_link_gbps : o.duck_link_gbps) = 0.001;
    auto sim = LinkSim::Start(o);
    ASSERT_TRUE(sim.ok()) << sim.status();
    int tx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    const auto t0 = Clock::now();
    for (int k = 0; k < count; ++k)
      SendTo(tx, (*sim)->cast_relay_port(), std::vector<char>(bytes, char(k)));
    for (int rx : {rx0, rx1})
      for (int k = 0; k < count; ++k) {
        char d[2 * bytes];
        ASSERT_EQ(recv(rx, d, sizeof d, 0), bytes);
        EXPECT_EQ(d[0], char(k)); // in order
      }
    const double s = Since(t0);
    EXPECT_GE(s, 0.95 * once);
    EXPECT_LT(s, 1.5 * once); // two copies through one link: 2x
    close(tx);
    close(rx0);
    close(rx1);
    EXPECT_EQ((*sim)->cast_bytes_from_host(), uint64_t(count * bytes));
  }
}

TEST(LinkSimTest, CastPortsMustMatchTheDucks) {
  LinkSimOptions o;
  o.backends.assign(2, {"127.0.0.1", 1});
  o.cast_ports = {9}; // one for two ducks
  auto sim = LinkSim::Start(o);
  ASSERT_FALSE(sim.ok());
  EXPECT_EQ(sim.status().code(), absl::StatusCode::kInvalidArgument);
  o.cast_ports = {9, 10, 11};
  EXPECT_EQ(LinkSim::Start(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.cast_ports.clear(); // none: no relay
  auto plain = LinkSim::Start(o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->cast_relay_port(), 0);
  EXPECT_EQ((*plain)->stats()[1].cast_bytes_to_duck, 0u);
}

TEST(LinkSimTest, ARefusingDuckClosesTheHostsConnection) {
  // Nothing listens behind duck 0: the host's connection ends at once, as
  // a refused one would, and the simulator keeps serving.
  uint16_t dead_port = 0;
  {
    Backend gone(false, 0); // bound, then closed: nobody listens there
    dead_port = gone.port;
  }
  Backend b(true);
  LinkSimOptions o;
  o.backends = {{"127.0.0.1", dead_port}, b.endpoint()};
  auto sim = LinkSim::Start(o);
  ASSERT_TRUE(sim.ok()) << sim.status();
  for (int i = 0; i < 20; ++i) { // refused again and again, nothing kept
    int fd = Connect((*sim)->ports()[0]);
    char c = 0;
    EXPECT_LE(read(fd, &c, 1), 0);
    close(fd);
  }
  int fd = Connect((*sim)->ports()[1]);
  char c = 'x', r = 0;
  ASSERT_EQ(write(fd, &c, 1), 1);
  ASSERT_EQ(read(fd, &r, 1), 1);
  EXPECT_EQ(r, 'x');
  shutdown(fd, SHUT_WR);
  b.t.join();
  close(fd);
  EXPECT_EQ((*sim)->stats()[0].connections, 0u);
}

TEST(LinkSimTest, RefusesNegativeRates) {
  LinkSimOptions o;
  o.backends = {{"127.0.0.1", 1}};
  o.duck_link_gbps = -1;
  EXPECT_FALSE(LinkSim::Start(o).ok());
  o.backends.clear();
  o.duck_link_gbps = 1;
  EXPECT_FALSE(LinkSim::Start(o).ok());
  o.backends = {{"127.0.0.1", 1}, {"127.0.0.1", 2}};
  o.peer_backends = {{"127.0.0.1", 3}}; // one for two ducks
  EXPECT_FALSE(LinkSim::Start(o).ok());
}

} // namespace
} // namespace duck::runtime
