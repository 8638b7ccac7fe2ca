// The ducks' mesh (duck_rt/peer_mesh.h) on loopback: N threads, each a
// duck with its own listener. Each collective's result is checked against
// the same sums computed here in rank order (exact equality: the mesh
// promises that order), an all-reduce bit-identical on every duck, and a
// mismatched mesh or collective is an error naming it.
#include "duck_rt/peer_mesh.h"

#include "duck_rt/abi.h"
#include "duck_rt/fp9.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

#include <arpa/inet.h>
#include <cstring>
#include <functional>
#include <netinet/in.h>
#include <random>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace duck::duckd {
namespace {

int ListenAny(uint16_t *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(bind(fd, (sockaddr *)&a, sizeof a), 0);
  EXPECT_EQ(listen(fd, 64), 0);
  getsockname(fd, (sockaddr *)&a, &len);
  *port = ntohs(a.sin_port);
  return fd;
}

/// Runs body(rank, mesh) on `ducks` threads over one loopback mesh;
/// sessions[r] overrides rank r's session (a mismatch test).
std::vector<absl::Status>
RunMesh(uint32_t ducks,
        const std::function<absl::Status(uint32_t, PeerMesh &)> &body,
        std::vector<uint64_t> sessions = {}, uint32_t groups = 1,
        std::vector<std::string> tokens = {},
        const std::function<void(PeerMeshOptions &)> &tweak = nullptr) {
  std::vector<int> listeners(ducks);
  std::vector<PeerAddress> peers(ducks);
  for (uint32_t r = 0; r < ducks; ++r)
    listeners[r] = ListenAny(&peers[r].port);
  std::vector<absl::Status> status(ducks);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < ducks; ++r)
    threads.emplace_back([&, r] {
      PeerMeshOptions o;
      o.rank = r;
      o.ducks = ducks;
      o.session = sessions.empty() ? 7 : sessions[r];
      o.listen_fd = listeners[r];
      o.peers = peers;
      // Short: the error tests wait this long on the rank that refuses.
      o.timeout = absl::Seconds(2);
      o.groups = groups;
      o.token = tokens.empty() ? "" : tokens[r];
      if (tweak)
        tweak(o);
      absl::StatusOr<std::unique_ptr<PeerMesh>> m = PeerMesh::Connect(o);
      status[r] = m.ok() ? body(r, **m) : m.status();
    });
  for (std::thread &t : threads)
    t.join();
  for (int fd : listeners)
    close(fd);
  return status;
}

std::vector<float> Values(uint32_t rank, size_t n) {
  std::mt19937 rng(1000 + rank);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (float &x : v)
    x = d(rng);
  return v;
}

float AsWire(float f, PeerWire wire) {
  return wire == PeerWire::f32 ? f : duck_bf16_to_f32(duck_f32_to_bf16(f));
}

/// Every duck's values summed in rank order, as the wire carries them.
std::vector<float> RankOrderSum(uint32_t ducks, size_t n, PeerWire wire) {
  std::vector<float> sum(n, 0.0f);
  for (uint32_t r = 0; r < ducks; ++r) {
    const std::vector<float> v = Values(r, n);
    for (size_t i = 0; i < n; ++i)
      sum[i] += AsWire(v[i], wire);
  }
  return sum;
}

/// The same over G groups of M ducks (rank g M + m): each group's sum in
/// member order, as the wire carries it, then those in group order.
std::vector<float> GroupOrderSum(uint32_t ducks, uint32_t groups, size_t n,
                                 PeerWire wire) {
  const uint32_t members = ducks / groups;
  std::vector<float> sum(n, 0.0f);
  for (uint32_t g = 0; g < groups; ++g) {
    std::vector<float> part(n, 0.0f);
    for (uint32_t m = 0; m < members; ++m) {
      const std::vector<float> v = Values(g * members + m, n);
      for (size_t i = 0; i < n; ++i)
        part[i] += AsWire(v[i], wire);
    }
    for (size_t i = 0; i < n; ++i)
      sum[i] += AsWire(part[i], wire);
  }
  return sum;
}

/// Sets the transport (and, over udp, the datagrams' size and losses).
std::function<void(PeerMeshOptions &)> Transport(PeerTransport t,
                                                 uint32_t datagram_bytes = 1432,
                                                 uint32_t drop_every = 0) {
  return [=](PeerMeshOptions &o) {
    o.transport = t;
    o.datagram_bytes = datagram_bytes;
    o.drop_every = drop_every;
  };
}

class PeerMeshTest
    : public ::testing::TestWithParam<
          std::tuple<uint32_t, PeerWire, uint32_t, PeerTransport>> {};

TEST_P(PeerMeshTest, CollectivesMatchRankOrderSums) {
  const auto [ducks, wire, groups, transport] = GetParam();
  const size_t n = 7168 + 5; // ragged slices
  const bool grouped = groups > 1 && groups < ducks;
  const std::vector<float> want = grouped
                                      ? GroupOrderSum(ducks, groups, n, wire)
                                      : RankOrderSum(ducks, n, wire);
  std::vector<uint32_t> owned(ducks);
  std::vector<std::vector<float>> reduced(ducks), gathered(ducks);
  std::vector<std::vector<float>> allreduced(ducks);
  auto body = [&](uint32_t r, PeerMesh &m) -> absl::Status {
    owned[r] = m.OwnedSlice();
    const size_t b = PeerSliceBegin(n, ducks, owned[r]);
    std::vector<float> slice(PeerSliceBegin(n, ducks, owned[r] + 1) - b);
    if (absl::Status s =
            m.ReduceScatter(Values(r, n), wire, absl::MakeSpan(slice));
        !s.ok())
      return s;
    reduced[r] = slice;
    gathered[r].resize(n);
    if (absl::Status s = m.AllGather(slice, wire, absl::MakeSpan(gathered[r]));
        !s.ok())
      return s;
    allreduced[r].resize(3);
    return m.AllReduce(absl::MakeConstSpan(Values(r, 3)), wire,
                       absl::MakeSpan(allreduced[r]));
  };
  for (const absl::Status &s :
       RunMesh(ducks, body, {}, groups, {}, Transport(transport)))
    ASSERT_TRUE(s.ok()) << s;
  const std::vector<float> want3 = RankOrderSum(ducks, 3, wire);
  std::vector<bool> held(ducks, false); // every slice held once
  for (uint32_t r = 0; r < ducks; ++r) {
    ASSERT_LT(owned[r], ducks);
    ASSERT_FALSE(held[owned[r]]);
    held[owned[r]] = true;
    const size_t b = PeerSliceBegin(n, ducks, owned[r]);
    for (size_t i = 0; i < reduced[r].size(); ++i)
      ASSERT_EQ(reduced[r][i], want[b + i]) << "rank " << r << " value " << i;
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(gathered[r][i], AsWire(want[i], wire)) << "value " << i;
    for (size_t i = 0; i < 3; ++i)
      ASSERT_EQ(std::memcmp(&allreduced[r][i], &want3[i], 4), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    DucksAndWires, PeerMeshTest,
    ::testing::Combine(::testing::Values(1u, 2u, 3u, 5u),
                       ::testing::Values(PeerWire::f32, PeerWire::bf16),
                       ::testing::Values(1u),
                       ::testing::Values(PeerTransport::tcp,
                                         PeerTransport::udp)));

/// `v` as one q8 message carries it (blocks of 32 from its first value).
std::vector<float> AsQ8(const std::vector<float> &v) {
  std::vector<uint8_t> b(duck_q8_row_bytes(v.size()));
  duck_q8_encode_row(v.data(), v.size(), b.data());
  std::vector<float> out(v.size());
  duck_q8_decode_row(b.data(), v.size(), out.data());
  return out;
}

// q8 on the mesh: each message (a rank's piece of a slice, a gathered
// slice, an all-reduce's values) is one q8 row, its blocks counted from
// the piece's first value; the sums are the decoded pieces in rank order.
class PeerMeshQ8Test
    : public ::testing::TestWithParam<std::tuple<uint32_t, PeerTransport>> {};

TEST_P(PeerMeshQ8Test, CollectivesMatchBlockwiseSums) {
  const auto [ducks, transport] = GetParam();
  const size_t n = 7168 + 5; // ragged slices, blocks that end short
  std::vector<uint32_t> owned(ducks);
  std::vector<std::vector<float>> reduced(ducks), gathered(ducks),
      allreduced(ducks);
  auto body = [&](uint32_t r, PeerMesh &m) -> absl::Status {
    owned[r] = m.OwnedSlice();
    const size_t b = PeerSliceBegin(n, ducks, owned[r]);
    std::vector<float> slice(PeerSliceBegin(n, ducks, owned[r] + 1) - b);
    if (absl::Status s =
            m.ReduceScatter(Values(r, n), PeerWire::q8, absl::MakeSpan(slice));
        !s.ok())
      return s;
    reduced[r] = slice;
    gathered[r].resize(n);
    if (absl::Status s =
            m.AllGather(slice, PeerWire::q8, absl::MakeSpan(gathered[r]));
        !s.ok())
      return s;
    allreduced[r].resize(3);
    return m.AllReduce(absl::MakeConstSpan(Values(r, 3)), PeerWire::q8,
                       absl::MakeSpan(allreduced[r]));
  };
  for (const absl::Status &s :
       RunMesh(ducks, body, {}, 1, {}, Transport(transport)))
    ASSERT_TRUE(s.ok()) << s;
  std::vector<float> want3(3, 0.0f);
  for (uint32_t q = 0; q < ducks; ++q) {
    const std::vector<float> v = AsQ8(Values(q, 3));
    for (size_t i = 0; i < 3; ++i)
      want3[i] += v[i];
  }
  for (uint32_t r = 0; r < ducks; ++r) {
    const size_t b = PeerSliceBegin(n, ducks, owned[r]),
                 e = PeerSliceBegin(n, ducks, owned[r] + 1);
    std::vector<float> want(e - b, 0.0f);
    for (uint32_t q = 0; q < ducks; ++q) {
      const std::vector<float> all = Values(q, n);
      const std::vector<float> piece =
          AsQ8(std::vector<float>(all.begin() + b, all.begin() + e));
      for (size_t i = 0; i < piece.size(); ++i)
        want[i] += piece[i];
    }
    ASSERT_EQ(reduced[r], want) << "rank " << r;
    const std::vector<float> wire = AsQ8(want);
    for (uint32_t k = 0; k < ducks; ++k)
      for (size_t i = 0; i < wire.size(); ++i)
        ASSERT_EQ(gathered[k][b + i], wire[i]) << "rank " << k;
    for (size_t i = 0; i < 3; ++i)
      ASSERT_EQ(allreduced[r][i], want3[i]) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    DucksAndTransports, PeerMeshQ8Test,
    ::testing::Combine(::testing::Values(1u, 3u, 5u),
                       ::testing::Values(PeerTransport::tcp,
                                         PeerTransport::udp)));

// Two-level collectives: 4 ducks in 2 groups, 6 in 2 and in 3, 8 in 4.
INSTANTIATE_TEST_SUITE_P(
    Groups, PeerMeshTest,
    ::testing::Values(std::tuple{4u, PeerWire::f32, 2u, PeerTransport::tcp},
                      std::tuple{4u, PeerWire::f32, 2u, PeerTransport::udp},
                      std::tuple{6u, PeerWire::bf16, 2u, PeerTransport::tcp},
                      std::tuple{6u, PeerWire::bf16, 2u, PeerTransport::udp},
                      std::tuple{6u, PeerWire::f32, 3u, PeerTransport::tcp},
                      std::tuple{6u, PeerWire::f32, 3u, PeerTransport::udp},
                      std::tuple{8u, PeerWire::bf16, 4u, PeerTransport::tcp},
                      std::tuple{8u, PeerWire::bf16, 4u, PeerTransport::udp}));

TEST(PeerMeshErrors, GroupsMustDivideTheDucks) {
  std::vector<absl::Status> st = RunMesh(
      3, [](uint32_t, PeerMesh &) { return absl::OkStatus(); }, {}, 2);
  for (const absl::Status &s : st)
    EXPECT_NE(std::string(s.message()).find("do not divide"), std::string::npos)
        << s;
}

TEST(PeerMeshErrors, AnotherSessionIsRefusedByName) {
  std::vector<absl::Status> st =
      RunMesh(2, [](uint32_t, PeerMesh &) { return absl::OkStatus(); }, {7, 8});
  EXPECT_FALSE(st[0].ok());
  EXPECT_FALSE(st[1].ok());
  EXPECT_NE(std::string(st[0].message()).find("another mesh"),
            std::string::npos)
      << st[0];
}

// Both transports: a mismatched collective or a leaving peer is an error
// naming it, not garbage or a timeout.
TEST(PeerMeshErrors, MismatchedCollectiveIsAnErrorNotGarbage) {
  for (PeerTransport t : {PeerTransport::tcp, PeerTransport::udp}) {
    std::vector<absl::Status> st = RunMesh(
        2,
        [](uint32_t r, PeerMesh &m) -> absl::Status {
          std::vector<float> in(r == 0 ? 4 : 6, 1.0f), out(in.size());
          return m.AllReduce(in, PeerWire::f32, absl::MakeSpan(out));
        },
        {}, 1, {}, Transport(t));
    // Both fail; the one that reads the other's header first names it
    // (over tcp the other may see the link closed instead).
    ASSERT_FALSE(st[0].ok());
    ASSERT_FALSE(st[1].ok());
    const std::string both =
        std::string(st[0].message()) + " | " + std::string(st[1].message());
    EXPECT_NE(both.find("got collective 1 of"), std::string::npos) << both;
  }
}

TEST(PeerMeshErrors, APeerThatLeavesIsAnErrorNamingIt) {
  // Rank 2 closes its mesh at once (over udp it says it left after no
  // collective); the others' all-reduce ends with an error naming it
  // instead of waiting for the timeout.
  for (PeerTransport t : {PeerTransport::tcp, PeerTransport::udp}) {
    std::vector<absl::Status> st = RunMesh(
        3,
        [](uint32_t r, PeerMesh &m) -> absl::Status {
          if (r == 2)
            return absl::OkStatus();
          std::vector<float> in(4, 1.0f), out(4);
          return m.AllReduce(in, PeerWire::f32, absl::MakeSpan(out));
        },
        {}, 1, {}, Transport(t));
    EXPECT_TRUE(st[2].ok());
    for (int r : {0, 1}) {
      ASSERT_FALSE(st[r].ok());
      EXPECT_NE(std::string(st[r].message()).find("rank 2 closed its link"),
                std::string::npos)
          << st[r];
    }
  }
}

TEST(PeerMeshAuth, ASharedTokenJoinsAndSumsAsWithout) {
  for (PeerTransport t : {PeerTransport::tcp, PeerTransport::udp}) {
    std::vector<float> got(3);
    auto body = [&](uint32_t r, PeerMesh &m) -> absl::Status {
      std::vector<float> in(2, float(r + 1)), out(2);
      absl::Status s = m.AllReduce(in, PeerWire::f32, absl::MakeSpan(out));
      got[r] = out[0];
      return s;
    };
    for (const absl::Status &s :
         RunMesh(3, body, {}, 1,
                 {"cluster secret", "cluster secret", "cluster secret"},
                 Transport(t)))
      ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(got, (std::vector<float>{6, 6, 6}));
  }
}

TEST(PeerMeshAuth, AnotherTokenOrNoneIsRefused) {
  auto none = [](uint32_t, PeerMesh &) { return absl::OkStatus(); };
  std::vector<absl::Status> st = RunMesh(2, none, {}, 1, {"a", "b"});
  for (const absl::Status &s : st) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(std::string(s.message()).find("failed authentication"),
              std::string::npos)
        << s;
  }
  st = RunMesh(2, none, {}, 1, {"a", ""});
  for (const absl::Status &s : st) {
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  }
  EXPECT_NE(std::string(st[0].message()).find("has no token"),
            std::string::npos)
      << st[0];
}

TEST(PeerMeshErrors, ALowerRankThatNeverComesIsNamed) {
  // Rank 1 of 2 waits for rank 0, which never dials.
  uint16_t port = 0;
  const int fd = ListenAny(&port);
  PeerMeshOptions o;
  o.rank = 1;
  o.ducks = 2;
  o.listen_fd = fd;
  o.peers.resize(2);
  o.timeout = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<PeerMesh>> m = PeerMesh::Connect(o);
  close(fd);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message()).find("for rank(s) 0 to connect"),
            std::string::npos)
      << m.status();
}

TEST(PeerMeshErrors, AStrangerOnTheListenerDoesNotStopTheMesh) {
  // Before rank 0 dials, something else connects to rank 1's listener and
  // says three bytes: it is dropped after a second and the mesh forms.
  std::vector<PeerAddress> peers(2);
  const int l0 = ListenAny(&peers[0].port), l1 = ListenAny(&peers[1].port);
  const int stranger = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(peers[1].port);
  ASSERT_EQ(connect(stranger, (sockaddr *)&a, sizeof a), 0);
  ASSERT_EQ(write(stranger, "abc", 3), 3);
  std::vector<absl::Status> st(2);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      PeerMeshOptions o;
      o.rank = r;
      o.ducks = 2;
      o.listen_fd = r == 0 ? l0 : l1;
      o.peers = peers;
      o.timeout = absl::Seconds(5);
      if (r == 0) // after the stranger is in the backlog
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      auto m = PeerMesh::Connect(o);
      st[r] = m.status();
      if (m.ok()) {
        float in = float(r + 1), out = 0;
        st[r] = (*m)->AllReduce(absl::MakeConstSpan(&in, 1), PeerWire::f32,
                                absl::MakeSpan(&out, 1));
        if (st[r].ok() && out != 3.0f)
          st[r] = absl::InternalError("wrong sum");
      }
    });
  for (std::thread &t : threads)
    t.join();
  close(stranger);
  close(l0);
  close(l1);
  EXPECT_TRUE(st[0].ok()) << st[0];
  EXPECT_TRUE(st[1].ok()) << st[1];
}

TEST(PeerMeshErrors, BadRankOrAddressesAreRefused) {
  PeerMeshOptions o;
  o.rank = 2;
  o.ducks = 2;
  o.peers.resize(2);
  EXPECT_FALSE(PeerMesh::Connect(o).ok());
}

// Over udp: small datagrams (a message in many chunks) with every third
// first send dropped: the lost ones are asked for and sent again, and every
// result is still exactly the rank-order sum, over several rounds (so that
// a duck's early datagrams for the next collective are kept for it), each
// settled before one duck pauses.
TEST(PeerMeshDatagrams, LostDatagramsAreAskedForAgain) {
  const uint32_t ducks = 4;
  const size_t n = 1000 + 3;
  const std::vector<float> want = RankOrderSum(ducks, n, PeerWire::f32);
  std::vector<uint64_t> resent(ducks);
  auto body = [&](uint32_t r, PeerMesh &m) -> absl::Status {
    const size_t b = PeerSliceBegin(n, ducks, r);
    std::vector<float> slice(PeerSliceBegin(n, ducks, r + 1) - b), all(n);
    for (int round = 0; round < 5; ++round) {
      if (absl::Status s = m.ReduceScatter(Values(r, n), PeerWire::f32,
                                           absl::MakeSpan(slice));
          !s.ok())
        return s;
      for (size_t i = 0; i < slice.size(); ++i)
        if (slice[i] != want[b + i])
          return absl::InternalError(absl::StrCat("rank ", r, " value ", i));
      if (absl::Status s =
              m.AllGather(slice, PeerWire::f32, absl::MakeSpan(all));
          !s.ok())
        return s;
      if (all != want)
        return absl::InternalError(absl::StrCat("rank ", r, " gathered"));
      // A pause after the round is safe once every duck has settled: a
      // peer's lost datagram is asked for and answered before it.
      if (absl::Status s = m.Settle(); !s.ok())
        return s;
      if (r == round % ducks)
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    resent[r] = m.datagrams_resent();
    return absl::OkStatus();
  };
  for (const absl::Status &s :
       RunMesh(ducks, body, {}, 1, {}, Transport(PeerTransport::udp, 124, 3)))
    ASSERT_TRUE(s.ok()) << s;
  uint64_t total = 0;
  for (uint64_t x : resent)
    total += x;
  EXPECT_GT(total, 0u); // the drops happened and were recovered
}

TEST(PeerMeshDatagrams, AnotherTransportOrDatagramSizeIsRefusedByName) {
  std::vector<absl::Status> st = RunMesh(
      2, [](uint32_t, PeerMesh &) { return absl::OkStatus(); }, {}, 1, {},
      [](PeerMeshOptions &o) {
        o.transport = o.rank == 0 ? PeerTransport::udp : PeerTransport::tcp;
      });
  ASSERT_FALSE(st[0].ok());
  ASSERT_FALSE(st[1].ok());
  EXPECT_NE(std::string(st[0].message()).find("rank 1 sends tcp"),
            std::string::npos)
      << st[0];
  // Datagrams of another size too.
  st = RunMesh(
      2, [](uint32_t, PeerMesh &) { return absl::OkStatus(); }, {}, 1, {},
      [](PeerMeshOptions &o) {
        o.transport = PeerTransport::udp;
        o.datagram_bytes = o.rank == 0 ? 1432 : 512;
      });
  ASSERT_FALSE(st[0].ok());
  EXPECT_NE(std::string(st[0].message())
                .find("rank 1 sends datagrams of 512 bytes and rank 0 of 1432"),
            std::string::npos)
      << st[0];
}

} // namespace
} // namespace duck::duckd
