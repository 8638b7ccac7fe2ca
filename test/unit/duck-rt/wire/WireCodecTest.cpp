// The duckd protocol's frame codec (duck_rt/wire_codec.h) on byte buffers,
// no sockets: the wire layout, round trips (plain and authenticated), and
// truncated or corrupt frames refused with an error that says what is wrong.
#include "duck_rt/wire_codec.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <string>
#include <vector>

namespace duck::duckd {
namespace {

constexpr uint64_t kMax = 1 << 20;

std::vector<uint8_t> Bytes(const std::string &s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

TEST(WireCodecTest, LayoutIsTheProtocols) {
  const std::vector<uint8_t> a = Bytes("step request"), b = Bytes("the IB");
  const Part parts[] = {{a.data(), a.size()}, {b.data(), b.size()}};
  const std::vector<uint8_t> f = EncodeFrame(DUCKD_MSG_STEP, 0, 7, parts);
  ASSERT_EQ(f.size(), 32 + a.size() + b.size());
  // "DKWP", version, type, flags, request id, length, XXH3-64: little-endian.
  EXPECT_EQ(std::string(f.begin(), f.begin() + 4), "DKWP");
  uint16_t version, type;
  uint32_t flags, id;
  uint64_t bytes, check;
  std::memcpy(&version, &f[4], 2);
  std::memcpy(&type, &f[6], 2);
  std::memcpy(&flags, &f[8], 4);
  std::memcpy(&id, &f[12], 4);
  std::memcpy(&bytes, &f[16], 8);
  std::memcpy(&check, &f[24], 8);
  EXPECT_EQ(version, DUCKD_PROTOCOL_VERSION);
  EXPECT_EQ(type, DUCKD_MSG_STEP);
  EXPECT_EQ(flags, 0u);
  EXPECT_EQ(id, 7u);
  EXPECT_EQ(bytes, a.size() + b.size());
  EXPECT_EQ(check, XXH3_64bits(f.data() + 32, bytes));
  // The same header MakeHeader gives a socket's writev of the parts.
  const duckd_frame_header h = MakeHeader(DUCKD_MSG_STEP, 0, 7, parts);
  EXPECT_EQ(std::memcmp(&h, f.data(), sizeof h), 0);
  EXPECT_EQ(std::string(f.begin() + 32, f.end()), "step requestthe IB");
}

TEST(WireCodecTest, RoundTripsBackToBackFrames) {
  const std::vector<uint8_t> a = Bytes("hello"), big(100000, 0xa5);
  std::vector<uint8_t> stream;
  const Part pa{a.data(), a.size()}, pb{big.data(), big.size()};
  AppendFrame(&stream, DUCKD_MSG_HELLO, DUCKD_FLAG_REPLY, 1, {&pa, 1});
  AppendFrame(&stream, DUCKD_MSG_STATS, 0, 2, {});
  AppendFrame(&stream, DUCKD_MSG_PREPARE_WRITE, 0, 3, {&pb, 1});
  absl::Span<const uint8_t> rest(stream);
  std::vector<FrameView> got;
  while (!rest.empty()) {
    absl::StatusOr<FrameView> v = DecodeFrame(rest, kMax);
    ASSERT_TRUE(v.ok()) << v.status();
    got.push_back(*v);
    rest.remove_prefix(v->frame_bytes);
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].header.type, DUCKD_MSG_HELLO);
  EXPECT_EQ(got[0].header.flags, uint32_t(DUCKD_FLAG_REPLY));
  EXPECT_EQ(std::string(got[0].payload.begin(), got[0].payload.end()), "hello");
  EXPECT_EQ(got[1].header.request_id, 2u);
  EXPECT_TRUE(got[1].payload.empty());
  EXPECT_EQ(got[1].frame_bytes, 32u);
  EXPECT_EQ(got[2].header.payload_bytes, big.size());
  EXPECT_TRUE(std::equal(big.begin(), big.end(), got[2].payload.begin()));
}

TEST(WireCodecTest, TruncatedFramesAreOutOfRange) {
  const std::vector<uint8_t> p = Bytes("0123456789");
  const Part part{p.data(), p.size()};
  const std::vector<uint8_t> f = EncodeFrame(DUCKD_MSG_OPEN, 0, 1, {&part, 1});
  for (size_t n = 0; n < f.size(); ++n) {
    absl::StatusOr<FrameView> v = DecodeFrame({f.data(), n}, kMax);
    ASSERT_FALSE(v.ok()) << n;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kOutOfRange) << n;
    EXPECT_NE(v.status().message().find("truncated frame"),
              std::string::npos) << v.status();
  }
  EXPECT_EQ(DecodeFrame({f.data(), 20}, kMax).status().message(),
            "truncated frame: 20 of the header's 32 bytes");
  EXPECT_EQ(DecodeFrame({f.data(), 35}, kMax).status().message(),
            "truncated frame: 3 of its 10-byte payload (open)");
  EXPECT_EQ(DecodeHeader({f.data(), 31}, kMax).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(DecodeHeader({f.data(), 32}, kMax).ok());
}

TEST(WireCodecTest, CorruptFramesAreRefusedByName) {
  const std::vector<uint8_t> p = Bytes("payload");
  const Part part{p.data(), p.size()};
  const std::vector<uint8_t> good =
      EncodeFrame(DUCKD_MSG_MEASURE, 0, 9, {&part, 1});
  auto refuse = [&](size_t at, uint8_t x, absl::StatusCode code,
                    const std::string &says, uint64_t max = kMax) {
    std::vector<uint8_t> f = good;
    f[at] ^= x;
    absl::StatusOr<FrameView> v = DecodeFrame(f, max);
    ASSERT_FALSE(v.ok()) << "byte " << at;
    EXPECT_EQ(v.status().code(), code) << v.status();
    EXPECT_NE(v.status().message().find(says), std::string::npos)
        << v.status();
  };
  refuse(0, 1, absl::StatusCode::kInvalidArgument, "bad frame magic");
  refuse(4, 1, absl::StatusCode::kFailedPrecondition, "protocol version");
  refuse(6, 0x40, absl::StatusCode::kInvalidArgument, "unknown message type");
  refuse(8, 0x10, absl::StatusCode::kInvalidArgument, "unknown frame flags");
  refuse(32 + 3, 1, absl::StatusCode::kDataLoss, "payload checksum mismatch");
  refuse(24, 1, absl::StatusCode::kDataLoss, "payload checksum mismatch");
  refuse(0, 0, absl::StatusCode::kResourceExhausted, "exceeds the 4-byte limit",
         4);
  // A length that runs past the buffer is a truncated frame, not a read
  // past its end.
  refuse(16, 0x10, absl::StatusCode::kOutOfRange, "truncated frame");
}

TEST(WireCodecTest, AuthenticatedRoundTripAndReplay) {
  uint8_t hn[kNonceBytes] = {1, 2, 3}, dn[kNonceBytes] = {4, 5, 6};
  FrameKeys host = ConnectionKeys("secret", hn, dn, kRoleHost);
  FrameKeys duck = ConnectionKeys("secret", hn, dn, kRoleDuck);
  const std::vector<uint8_t> p = Bytes("sealed");
  const Part part{p.data(), p.size()};
  std::vector<uint8_t> f1 = EncodeFrame(DUCKD_MSG_STEP, 0, 1, {&part, 1}, &host);
  std::vector<uint8_t> f2 = EncodeFrame(DUCKD_MSG_STEP, 0, 2, {&part, 1}, &host);
  EXPECT_EQ(host.send_seq, 3u);
  absl::StatusOr<FrameView> v = DecodeFrame(f1, kMax, &duck);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(std::string(v->payload.begin(), v->payload.end()), "sealed");
  // Replayed: the duck's counter has moved on.
  v = DecodeFrame(f1, kMax, &duck);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(v.status().message().find("frame authentication failed"),
            std::string::npos);
  // Another token, or the plain checksum, does not verify either.
  FrameKeys other = ConnectionKeys("other", hn, dn, kRoleDuck);
  other.recv_seq = 2;
  EXPECT_EQ(DecodeFrame(f2, kMax, &other).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(DecodeFrame(f2, kMax).status().code(),
            absl::StatusCode::kDataLoss);
  duck.recv_seq = 2;
  EXPECT_TRUE(DecodeFrame(f2, kMax, &duck).ok());
}

TEST(WireCodecTest, HelloHandshakeOnBuffers) {
  absl::StatusOr<HostHello> hello = BeginHello("token");
  ASSERT_TRUE(hello.ok());
  FrameKeys hk = hello->keys;
  const Part rq{&hello->request, sizeof hello->request};
  const std::vector<uint8_t> req = EncodeFrame(DUCKD_MSG_HELLO, 0, 1, {&rq, 1},
                                               &hk);
  // The duck's side: checks the hello with the token, answers sealed with
  // the connection's keys.
  FrameKeys dk = HelloKeys("token", hello->request.nonce, kRoleDuck);
  ASSERT_TRUE(DecodeFrame(req, kMax, &dk).ok());
  duckd_hello_reply rep{};
  rep.abi_version = DUCK_ABI_VERSION;
  rep.auth = DUCKD_AUTH_HMAC_SHA256;
  rep.nonce[0] = 42;
  FrameKeys conn = ConnectionKeys("token", hello->request.nonce, rep.nonce,
                                  kRoleDuck);
  conn.send_seq = 0; // the reply is the duck's first frame
  const Part rp{&rep, sizeof rep};
  const std::vector<uint8_t> reply =
      EncodeFrame(DUCKD_MSG_HELLO, DUCKD_FLAG_REPLY, 1, {&rp, 1}, &conn);
  absl::StatusOr<duckd_frame_header> h = DecodeHeader(reply, kMax);
  ASSERT_TRUE(h.ok());
  FrameKeys keys;
  ASSERT_TRUE(FinishHello(*hello, *h, absl::MakeConstSpan(reply).subspan(32),
                          &keys)
                  .ok());
  EXPECT_TRUE(keys.keyed);
  EXPECT_EQ(keys.recv_seq, 1u);
}

TEST(WireCodecTest, ErrorPayloadRoundTrip) {
  const std::string e = EncodeError(DUCKD_ERR_BUSY, "duck is busy");
  absl::StatusOr<WireError> d =
      DecodeError({reinterpret_cast<const uint8_t *>(e.data()), e.size()});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->code, DUCKD_ERR_BUSY);
  EXPECT_EQ(d->message, "duck is busy");
  EXPECT_FALSE(
      DecodeError({reinterpret_cast<const uint8_t *>(e.data()), e.size() - 1})
          .ok());
  EXPECT_FALSE(DecodeError({reinterpret_cast<const uint8_t *>(e.data()), 7})
                   .ok());
}

} // namespace
} // namespace duck::duckd
