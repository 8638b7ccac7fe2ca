// Cast steps' datagrams (duck_rt/cast.h): a batch's shape and digest, the
// cast socket, and CastSender -> CastReceiver on loopback (unicast, and a
// multicast group joined twice on 127.0.0.1): whole batches taken byte for
// byte, a batch with a datagram missing not whole within its wait, other
// batches' and malformed datagrams dropped and counted.
#include "duck_rt/cast.h"

#include "duck_rt/wire_codec.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <arpa/inet.h>
#include <chrono>
#include <cstring>
#include <memory>
#include <netinet/in.h>
#include <random>
#include <string>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

namespace duck::duckd {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kWaitNs = 2'000'000'000; // a whole batch: far more
constexpr uint64_t kSpinNs = 1'000'000;

std::vector<uint8_t> RandomIb(size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(bytes);
  for (uint8_t &b : v)
    b = uint8_t(rng());
  return v;
}

/// A cast socket closed at the end of the test.
struct Socket {
  CastSocket s;
  ~Socket() {
    if (s.fd >= 0)
      close(s.fd);
  }
};

std::unique_ptr<CastSender> Sender(const std::string &address, uint16_t port,
                                   uint32_t drop_every = 0,
                                   const std::string &iface = "") {
  CastSenderOptions o;
  o.address = address;
  o.port = port;
  o.drop_every = drop_every;
  o.interface_address = iface;
  auto s = CastSender::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

/// One raw datagram to 127.0.0.1:port (the malformed ones).
void SendRaw(uint16_t port, const void *data, size_t bytes) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_EQ(sendto(fd, data, bytes, 0, (sockaddr *)&a, sizeof a),
            ssize_t(bytes));
  close(fd);
}

/// A UDP port free at the moment (the multicast group's: it cannot be 0).
uint16_t FreeUdpPort() {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  socklen_t len = sizeof a;
  EXPECT_EQ(bind(fd, (sockaddr *)&a, sizeof a), 0);
  EXPECT_EQ(getsockname(fd, (sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

TEST(CastTest, ShapeCutsTheIbForTheDatagramLimit) {
  // The limit includes the 24-byte header: [25, 65507].
  EXPECT_FALSE(CastShapeFor(100, 24).ok());
  EXPECT_FALSE(CastShapeFor(100, 0).ok());
  EXPECT_FALSE(CastShapeFor(100, 65508).ok());
  EXPECT_EQ(CastShapeFor(100, 24).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto low = CastShapeFor(3, 25);
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_EQ(low->datagram_bytes, 1u);
  EXPECT_EQ(low->datagrams, 3u);
  auto high = CastShapeFor(65483, 65507);
  ASSERT_TRUE(high.ok()) << high.status();
  EXPECT_EQ(high->datagram_bytes, 65483u);
  EXPECT_EQ(high->datagrams, 1u);
  EXPECT_FALSE(CastShapeFor(0, 1432).ok());

  auto s = CastShapeFor(7616, 1432);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->datagram_bytes, 1408u);
  EXPECT_EQ(s->datagrams, 6u); // 5 of 1408, then 576
  auto exact = CastShapeFor(4 * 1408, 1432);
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->datagrams, 4u);
  auto over = CastShapeFor(4 * 1408 + 1, 1432);
  ASSERT_TRUE(over.ok());
  EXPECT_EQ(over->datagrams, 5u);
  auto one = CastShapeFor(1, 1432);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->datagrams, 1u);
  EXPECT_EQ(one->datagram_bytes, 1408u);

  // The count must fit 32 bits: 2^32 - 1 datagrams of 1 byte do, 2^32 not.
  auto most = CastShapeFor((uint64_t(1) << 32) - 1, 25);
  ASSERT_TRUE(most.ok()) << most.status();
  EXPECT_EQ(most->datagrams, UINT32_MAX);
  EXPECT_FALSE(CastShapeFor(uint64_t(1) << 32, 25).ok());
}

TEST(CastTest, DigestIsXxh3UnkeyedAndSha256Keyed) {
  const std::string abc = "abc";
  const auto ib = absl::MakeConstSpan(
      reinterpret_cast<const uint8_t *>(abc.data()), abc.size());
  uint8_t d[DUCKD_CAST_DIGEST_BYTES];
  std::memset(d, 0xee, sizeof d);
  CastDigest(ib, false, d);
  uint64_t h;
  std::memcpy(&h, d, sizeof h);
  EXPECT_EQ(h, Checksum(abc.data(), abc.size()));
  EXPECT_EQ(h, XXH3_64bits(abc.data(), abc.size()));
  for (int i = 8; i < DUCKD_CAST_DIGEST_BYTES; ++i)
    EXPECT_EQ(d[i], 0) << "byte " << i;

  const uint8_t sha_abc[32] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea,
                               0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
                               0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c,
                               0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
  uint8_t k[DUCKD_CAST_DIGEST_BYTES];
  std::memset(k, 0xee, sizeof k);
  CastDigest(ib, true, k);
  EXPECT_EQ(std::memcmp(k, sha_abc, 32), 0);

  // One byte of a larger IB changed: both digests change.
  std::vector<uint8_t> big = RandomIb(20000, 1);
  uint8_t u0[32], k0[32], u1[32], k1[32];
  CastDigest(big, false, u0);
  CastDigest(big, true, k0);
  big[12345] ^= 0x01;
  CastDigest(big, false, u1);
  CastDigest(big, true, k1);
  EXPECT_NE(std::memcmp(u0, u1, 32), 0);
  EXPECT_NE(std::memcmp(k0, k1, 32), 0);
  EXPECT_NE(std::memcmp(u0, k0, 32), 0);
}

TEST(CastTest, MulticastAddresses) {
  EXPECT_TRUE(IsMulticastAddress("239.77.0.1"));
  EXPECT_TRUE(IsMulticastAddress("224.0.0.0"));
  EXPECT_TRUE(IsMulticastAddress("239.255.255.255"));
  EXPECT_FALSE(IsMulticastAddress("223.255.255.255"));
  EXPECT_FALSE(IsMulticastAddress("240.0.0.1"));
  EXPECT_FALSE(IsMulticastAddress("127.0.0.1"));
  EXPECT_FALSE(IsMulticastAddress("not an address"));
  EXPECT_FALSE(IsMulticastAddress(""));
  EXPECT_FALSE(IsMulticastAddress("ff02::1")); // IPv4 only
}

TEST(CastTest, RoundTripOnLoopback) {
  auto opened = OpenCastSocket("127.0.0.1", 0, "");
  ASSERT_TRUE(opened.ok()) << opened.status();
  Socket rx{*opened};
  ASSERT_GE(rx.s.fd, 0);
  ASSERT_NE(rx.s.port, 0);
  auto tx = Sender("127.0.0.1", rx.s.port);
  ASSERT_TRUE(tx);
  const std::vector<uint8_t> ib = RandomIb(20011, 7);
  auto sent = tx->Send(7, ib);
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(sent->datagrams, 15u); // 14 of 1408, then 299
  EXPECT_EQ(sent->datagram_bytes, 1408u);
  EXPECT_EQ(tx->bytes_sent(), ib.size() + 15 * sizeof(duckd_cast_datagram));
  EXPECT_EQ(tx->dropped(), 0u);

  CastReceiver r(rx.s.fd);
  std::vector<uint8_t> got(ib.size(), 0);
  ASSERT_TRUE(r.Take(7, *sent, ib.size(), got.data(), kWaitNs, kSpinNs));
  EXPECT_EQ(got, ib);
  EXPECT_EQ(r.stats().batches, 1u);
  EXPECT_EQ(r.stats().datagrams, sent->datagrams);
  EXPECT_EQ(r.stats().missed, 0u);
  EXPECT_EQ(r.stats().stale, 0u);
  EXPECT_EQ(r.stats().malformed, 0u);
}

TEST(CastTest, ABatchWithADroppedDatagramIsNotWhole) {
  auto opened = OpenCastSocket("127.0.0.1", 0, "");
  ASSERT_TRUE(opened.ok()) << opened.status();
  Socket rx{*opened};
  auto tx = Sender("127.0.0.1", rx.s.port, /*drop_every=*/3);
  ASSERT_TRUE(tx);
  const std::vector<uint8_t> ib = RandomIb(20011, 8);
  auto sent = tx->Send(3, ib);
  ASSERT_TRUE(sent.ok()) << sent.status();
  ASSERT_EQ(sent->datagrams, 15u);
  EXPECT_EQ(tx->dropped(), 5u); // the 3rd, 6th, ... 15th

  CastReceiver r(rx.s.fd);
  std::vector<uint8_t> got(ib.size(), 0);
  const uint64_t wait_ns = 20'000'000;
  const auto t0 = Clock::now();
  EXPECT_FALSE(r.Take(3, *sent, ib.size(), got.data(), wait_ns, 1'000'000));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(s, 0.95 * wait_ns * 1e-9); // waited its wait ...
  EXPECT_LT(s, 1.0);                   // ... and not much longer
  EXPECT_EQ(r.stats().batches, 1u);
  EXPECT_EQ(r.stats().missed, 1u);
  EXPECT_EQ(r.stats().datagrams, 10u);
}

TEST(CastTest, AnEarlierBatchsDatagramsAreStale) {
  auto opened = OpenCastSocket("127.0.0.1", 0, "");
  ASSERT_TRUE(opened.ok()) << opened.status();
  Socket rx{*opened};
  auto tx = Sender("127.0.0.1", rx.s.port);
  ASSERT_TRUE(tx);
  const std::vector<uint8_t> ib1 = RandomIb(9000, 1), ib2 = RandomIb(5000, 2);
  auto s1 = tx->Send(1, ib1);
  auto s2 = tx->Send(2, ib2);
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(s1->datagrams, 7u);
  EXPECT_EQ(s2->datagrams, 4u);

  CastReceiver r(rx.s.fd);
  std::vector<uint8_t> got(ib2.size(), 0);
  ASSERT_TRUE(r.Take(2, *s2, ib2.size(), got.data(), kWaitNs, kSpinNs));
  EXPECT_EQ(got, ib2);
  EXPECT_EQ(r.stats().stale, s1->datagrams);
  EXPECT_EQ(r.stats().datagrams, s2->datagrams);
  EXPECT_EQ(r.stats().missed, 0u);
  EXPECT_EQ(r.stats().malformed, 0u);
}

TEST(CastTest, MalformedDatagramsAreDroppedAndCounted) {
  auto opened = OpenCastSocket("127.0.0.1", 0, "");
  ASSERT_TRUE(opened.ok()) << opened.status();
  Socket rx{*opened};
  const std::vector<uint8_t> ib = RandomIb(5000, 3);
  auto shape = CastShapeFor(ib.size(), 1432);
  ASSERT_TRUE(shape.ok());

  // Shorter than a header.
  const uint8_t tiny[10] = {};
  SendRaw(rx.s.port, tiny, sizeof tiny);
  // A header and its bytes, each wrong in one way: the magic; fewer bytes
  // than the header says; the count; an index past the count; fewer bytes
  // than the shape's datagram; more (longer than any of the batch's).
  auto raw = [&](duckd_cast_datagram h, size_t payload) {
    std::vector<uint8_t> d(sizeof h + payload, 0x5a);
    std::memcpy(d.data(), &h, sizeof h);
    SendRaw(rx.s.port, d.data(), d.size());
  };
  const uint32_t n = shape->datagrams, per = shape->datagram_bytes;
  raw({DUCKD_CAST_MAGIC ^ 1u, 0, n, per, 9}, per);
  raw({DUCKD_CAST_MAGIC, 0, n, per, 9}, per / 2);
  raw({DUCKD_CAST_MAGIC, 0, n + 1, per, 9}, per);
  raw({DUCKD_CAST_MAGIC, n, n, 8, 9}, 8);
  raw({DUCKD_CAST_MAGIC, 0, n, per - 1, 9}, per - 1);
  raw({DUCKD_CAST_MAGIC, 1, n, per + 100, 9}, per + 100);

  auto tx = Sender("127.0.0.1", rx.s.port);
  ASSERT_TRUE(tx);
  auto sent = tx->Send(9, ib);
  ASSERT_TRUE(sent.ok()) << sent.status();
  CastReceiver r(rx.s.fd);
  std::vector<uint8_t> got(ib.size(), 0);
  ASSERT_TRUE(r.Take(9, *sent, ib.size(), got.data(), kWaitNs, kSpinNs));
  EXPECT_EQ(got, ib); // none of the 0x5a bytes got in
  EXPECT_EQ(r.stats().malformed, 7u);
  EXPECT_EQ(r.stats().datagrams, sent->datagrams);
  EXPECT_EQ(r.stats().stale, 0u);
  EXPECT_EQ(r.stats().missed, 0u);
}

/// Intake until it finds a whole stage (datagrams on loopback are there
/// at once; a few tries for a busy box). Whether it did.
bool IntakeStage(CastReceiver &r) {
  for (int i = 0; i < 200; ++i) {
    if (r.Intake())
      return true;
    usleep(1000);
  }
  return false;
}

// A cast stage's batch taken while no frame asks for it (Intake): whole,
// its shape read off its datagrams, byte for byte; a cast step's batch
// kept for the Take that asks for it.
TEST(CastTest, IntakeKeepsABatchUntilItIsAskedFor) {
  auto opened = OpenCastSocket("127.0.0.1", 0, "");
  ASSERT_TRUE(opened.ok()) << opened.status();
  Socket rx{*opened};
  auto tx = Sender("127.0.0.1", rx.s.port);
  ASSERT_TRUE(tx);
  CastReceiver r(rx.s.fd, 1 << 20);
  const std::vector<uint8_t> stage = RandomIb(20011, 21);
  ASSERT_TRUE(tx->Send(21, stage, DUCKD_CAST_STAGE_MAGIC).ok());
  ASSERT_TRUE(IntakeStage(r));
  std::vector<uint8_t> got(1 << 16, 0);
  uint64_t id = 0, bytes = 0;
  ASSERT_TRUE(r.TakeHeldStage(got.data(), got.size(), &id, &bytes));
  EXPECT_EQ(id, 21u);
  ASSERT_EQ(bytes, stage.size());
  EXPECT_TRUE(std::equal(stage.begin(), stage.end(), got.begin()));
  EXPECT_FALSE(r.TakeHeldStage(got.data(), got.size(), &id, &bytes)); // once
  // A step's batch is no stage: kept for its Take, whose wait it skips.
  const std::vector<uint8_t> ib = RandomIb(9000, 22);
  auto sent = tx->Send(22, ib);
  ASSERT_TRUE(sent.ok());
  for (int i = 0; i < 50; ++i) {
    EXPECT_FALSE(r.Intake());
    usleep(200);
  }
  std::vector<uint8_t> step(ib.size(), 0);
  ASSERT_TRUE(r.Take(22, *sent, ib.size(), step.data(), /*wait_ns=*/0, 0));
  EXPECT_EQ(step, ib);
  EXPECT_EQ(r.stats().datagrams, 15u + sent->datagrams);
  EXPECT_EQ(r.stats().missed, 0u);
  // A stage's batch asked for by a Take of a step's magic is not taken.
  ASSERT_TRUE(tx->Send(23, ib, DUCKD_CAST_STAGE_MAGIC).ok());
  ASSERT_TRUE(IntakeStage(r));
  EXPECT_FALSE(r.Take(23, *sent, ib.size(), step.data(), 1'000'000, 0));
  EXPECT_EQ(r.stats().malformed, sent->datagrams);
}

// A stage's batch with a datagram missing is never whole; a later batch
// takes its place (the earlier one's datagrams counted stale), and a
// batch larger than what the receiver keeps is not kept.
TEST(CastTest, IntakeDropsWhatCannotBeWhole) {
  auto opened = OpenCastSocket("127.0.0.1", 0, "");
  ASSERT_TRUE(opened.ok()) << opened.status();
  Socket rx{*opened};
  CastReceiver r(rx.s.fd, 64 << 10);
  auto lossy = Sender("127.0.0.1", rx.s.port, /*drop_every=*/4);
  ASSERT_TRUE(lossy);
  ASSERT_TRUE(lossy->Send(1, RandomIb(20011, 1), DUCKD_CAST_STAGE_MAGIC).ok());
  for (int i = 0; i < 20; ++i) {
    EXPECT_FALSE(r.Intake());
    usleep(500);
  }
  auto tx = Sender("127.0.0.1", rx.s.port);
  ASSERT_TRUE(tx);
  const std::vector<uint8_t> stage = RandomIb(3000, 2);
  ASSERT_TRUE(tx->Send(2, stage, DUCKD_CAST_STAGE_MAGIC).ok());
  ASSERT_TRUE(IntakeStage(r));
  EXPECT_EQ(r.stats().stale, 15u - 3u); // batch 1's that came
  std::vector<uint8_t> got(stage.size(), 0);
  uint64_t id = 0, bytes = 0;
  EXPECT_FALSE(r.TakeHeldStage(got.data(), 2999, &id, &bytes)); // too big
  ASSERT_TRUE(tx->Send(3, stage, DUCKD_CAST_STAGE_MAGIC).ok());
  ASSERT_TRUE(IntakeStage(r));
  ASSERT_TRUE(r.TakeHeldStage(got.data(), got.size(), &id, &bytes));
  EXPECT_EQ(got, stage);
  EXPECT_EQ(id, 3u);
  // 100 KB: more than the 64 KiB this receiver keeps.
  ASSERT_TRUE(tx->Send(4, RandomIb(100000, 4), DUCKD_CAST_STAGE_MAGIC).ok());
  for (int i = 0; i < 20; ++i) {
    EXPECT_FALSE(r.Intake());
    usleep(500);
  }
  EXPECT_GT(r.stats().malformed, 0u);
}

TEST(CastTest, MulticastGroupOnLoopbackReachesEveryDuck) {
  const uint16_t port = FreeUdpPort();
  ASSERT_NE(port, 0);
  const std::string group = "239.77.0.9";
  auto a = OpenCastSocket(group, port, "127.0.0.1");
  if (!a.ok())
    GTEST_SKIP() << "cannot join " << group << " on 127.0.0.1: " << a.status();
  Socket ra{*a};
  auto b = OpenCastSocket(group, port, "127.0.0.1"); // a second duck's
  ASSERT_TRUE(b.ok()) << b.status(); // SO_REUSEADDR: the group's port shared
  Socket rb{*b};
  EXPECT_EQ(ra.s.port, port);
  EXPECT_EQ(rb.s.port, port);

  auto tx = Sender(group, port, 0, "127.0.0.1");
  ASSERT_TRUE(tx);
  const std::vector<uint8_t> ib = RandomIb(20011, 11);
  auto sent = tx->Send(11, ib);
  ASSERT_TRUE(sent.ok()) << sent.status();
  for (const Socket *s : {&ra, &rb}) {
    CastReceiver r(s->s.fd);
    std::vector<uint8_t> got(ib.size(), 0);
    ASSERT_TRUE(r.Take(11, *sent, ib.size(), got.data(), kWaitNs, kSpinNs))
        << "duck " << (s == &ra ? 0 : 1) << ": " << r.stats().datagrams
        << " datagrams of " << sent->datagrams;
    EXPECT_EQ(got, ib);
    EXPECT_EQ(r.stats().datagrams, sent->datagrams);
  }
}

TEST(CastTest, OpenCastSocketRefusesBadAddresses) {
  auto zero = OpenCastSocket("239.77.0.9", 0, "");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("needs a port"), std::string::npos)
      << zero.status();
  for (const char *bad : {"::1", "localhost", "", "1.2.3"}) {
    auto s = OpenCastSocket(bad, 0, "");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto iface = OpenCastSocket("239.77.0.9", 4000, "eth0");
  ASSERT_FALSE(iface.ok());
  EXPECT_EQ(iface.status().code(), absl::StatusCode::kInvalidArgument);

  // The sender too: a limit out of range, a port of 0.
  CastSenderOptions o;
  o.address = "127.0.0.1";
  o.port = 0;
  EXPECT_FALSE(CastSender::Open(o).ok());
  o.port = 4000;
  o.datagram_bytes = 24;
  EXPECT_FALSE(CastSender::Open(o).ok());
}

} // namespace
} // namespace duck::duckd
