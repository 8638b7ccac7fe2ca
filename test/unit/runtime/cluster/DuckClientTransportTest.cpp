// The transport seam (cluster/DuckTransport.h): the host's DuckClient runs
// hello, open, steps and close against scripted in-memory ducks, with no
// socket. The fake ducks decode and encode their frames with the same codec
// as duckd (duck_rt/wire_codec.h), so a frame the client gets wrong, or a
// key it does not keep, fails here as it would on the wire.
#include "duck/runtime/cluster/DuckClient.h"
#include "duck/runtime/cluster/DuckTransport.h"
#include "duck/runtime/cluster/LocalCluster.h"

#include "duck_rt/wire_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace duck::runtime {
namespace {

using duckd::Part;

/// What a fake duck does with a step.
enum class StepFault { kNone, kCorruptReply, kHangUp, kErrorReply };

/// One scripted duck: answers hello, open, step and close as duckd does
/// (the reply's layout, its keys), from frames given whole.
struct FakeDuck {
  uint16_t port = 0;
  std::string token;
  StepFault fault = StepFault::kNone;
  /// The connection is reset: every send from the host fails.
  bool reset = false;
  duckd::FrameKeys keys; // the connection's, after hello
  uint64_t session = 0;
  std::vector<uint8_t> to_host; // encoded replies not yet received
  bool hung_up = false;
  std::vector<std::string> seen; // message types, in order
  std::string error;             // a frame the fake could not accept

  void Reply(const duckd_frame_header &h, std::vector<Part> parts) {
    duckd::AppendFrame(&to_host, h.type, DUCKD_FLAG_REPLY, h.request_id, parts,
                       &keys);
  }
  void Hello(const duckd_frame_header &h, absl::Span<const uint8_t> frame);
  void Step(const duckd_frame_header &h, absl::Span<const uint8_t> payload);
  /// Takes one whole frame from the host.
  void Take(absl::Span<const uint8_t> frame);
};

void FakeDuck::Hello(const duckd_frame_header &h,
                     absl::Span<const uint8_t> frame) {
  duckd_hello_request r;
  std::memcpy(&r, frame.data() + sizeof h, sizeof r);
  duckd::FrameKeys hk;
  if (r.auth == DUCKD_AUTH_HMAC_SHA256)
    hk = duckd::HelloKeys(token, r.nonce, duckd::kRoleDuck);
  if (auto v = duckd::DecodeFrame(frame, 1 << 20, &hk); !v.ok()) {
    error = std::string(v.status().message());
    // As duckd: a refusal goes out unsealed.
    const std::string e = duckd::EncodeError(
        DUCKD_ERR_UNAUTHORIZED, "wrong token (the hello's tag does not verify)");
    duckd::AppendFrame(&to_host, h.type, DUCKD_FLAG_REPLY | DUCKD_FLAG_ERROR,
                       h.request_id, {{e.data(), e.size()}});
    return;
  }
  duckd_hello_reply rep{};
  rep.abi_version = DUCK_ABI_VERSION;
  rep.protocol_version = DUCKD_PROTOCOL_VERSION;
  rep.cores = 2;
  rep.auth = r.auth;
  rep.nonce[0] = uint8_t(port);
  std::snprintf(rep.name, sizeof rep.name, "fake-%u", unsigned(port));
  keys = duckd::FrameKeys{};
  if (r.auth == DUCKD_AUTH_HMAC_SHA256) {
    keys = duckd::ConnectionKeys(token, r.nonce, rep.nonce, duckd::kRoleDuck);
    keys.send_seq = 0; // the reply is the duck's first frame
  }
  Reply(h, {{&rep, sizeof rep}});
}

void FakeDuck::Step(const duckd_frame_header &h,
                    absl::Span<const uint8_t> payload) {
  duckd_step_request r;
  std::memcpy(&r, payload.data(), sizeof r);
  if (r.session_id != session || r.ib_bytes != payload.size() - sizeof r) {
    error = "bad step request";
    return;
  }
  if (fault == StepFault::kHangUp) {
    hung_up = true;
    return;
  }
  if (fault == StepFault::kErrorReply) {
    const std::string e =
        duckd::EncodeError(DUCKD_ERR_STEP_CRASHED, "the ELF faulted");
    duckd::AppendFrame(&to_host, h.type, DUCKD_FLAG_REPLY | DUCKD_FLAG_ERROR,
                       h.request_id, {{e.data(), e.size()}}, &keys);
    return;
  }
  // The OB: the IB backwards, each byte plus the duck's port.
  std::vector<uint8_t> ob(payload.begin() + sizeof r, payload.end());
  std::reverse(ob.begin(), ob.end());
  for (uint8_t &b : ob)
    b = uint8_t(b + port);
  const uint64_t kernel_ns[2] = {1000, 2000};
  duckd_step_reply rep{};
  rep.cores = 2;
  rep.ob_bytes = ob.size();
  rep.worker_ns = 5000;
  Reply(h, {{&rep, sizeof rep}, {kernel_ns, sizeof kernel_ns},
            {ob.data(), ob.size()}});
  if (fault == StepFault::kCorruptReply)
    to_host.back() ^= 0x01; // the OB's last byte, after the check
}

void FakeDuck::Take(absl::Span<const uint8_t> frame) {
  absl::StatusOr<duckd_frame_header> h = duckd::DecodeHeader(frame, 1 << 20);
  if (!h.ok()) {
    error = std::string(h.status().message());
    return;
  }
  seen.push_back(duckd::MessageTypeName(h->type));
  if (h->type == DUCKD_MSG_HELLO)
    return Hello(*h, frame);
  absl::StatusOr<duckd::FrameView> v = duckd::DecodeFrame(frame, 1 << 20,
                                                          &keys);
  if (!v.ok()) {
    error = std::string(v.status().message());
    return;
  }
  switch (h->type) {
  case DUCKD_MSG_OPEN: {
    duckd_open_reply rep{};
    rep.session_id = session = 100 + port;
    rep.cores = 2;
    Reply(*h, {{&rep, sizeof rep}});
    break;
  }
  case DUCKD_MSG_STEP:
    Step(*h, v->payload);
    break;
  case DUCKD_MSG_CLOSE:
    session = 0;
    Reply(*h, {});
    break;
  default:
    error = "unexpected request";
  }
}

/// A connection to a fake duck: frames cross as bytes, at most
/// `max_send` bytes a Send (a slow link: the client's partial sends).
class FakeLink final : public DuckConnection {
public:
  FakeLink(FakeDuck *duck, size_t max_send) : duck_(duck), max_(max_send) {}
  absl::StatusOr<uint64_t> Send(const duckd_frame_header &header,
                                absl::Span<const Part> payload,
                                uint64_t *sent) override {
    if (duck_->reset)
      return absl::UnavailableError("send: Connection reset by peer");
    std::vector<uint8_t> frame(sizeof header);
    std::memcpy(frame.data(), &header, sizeof header);
    for (const Part &p : payload) {
      const uint8_t *b = static_cast<const uint8_t *>(p.data);
      frame.insert(frame.end(), b, b + p.bytes);
    }
    const uint64_t n = std::min<uint64_t>(max_, frame.size() - *sent);
    from_host_.insert(from_host_.end(), frame.begin() + *sent,
                      frame.begin() + *sent + n);
    *sent += n;
    if (*sent == frame.size()) { // whole: the duck takes it
      duck_->Take(from_host_);
      from_host_.clear();
    }
    return n;
  }
  absl::StatusOr<bool> Receive(bool, bool, ReceivedFrame *out,
                               uint64_t *received) override {
    if (duck_->hung_up)
      return absl::UnavailableError("duckd closed the connection");
    std::vector<uint8_t> &in = duck_->to_host;
    absl::StatusOr<duckd_frame_header> h = duckd::DecodeHeader(in, 1 << 20);
    if (!h.ok())
      return h.status().code() == absl::StatusCode::kOutOfRange
                 ? absl::StatusOr<bool>(false)
                 : h.status();
    const size_t bytes = sizeof *h + h->payload_bytes;
    current_.assign(in.begin(), in.begin() + bytes);
    in.erase(in.begin(), in.begin() + bytes);
    *received += bytes;
    out->header = *h;
    out->payload = absl::MakeConstSpan(current_).subspan(sizeof *h);
    return true;
  }
  bool Readable() const { return duck_->hung_up || !duck_->to_host.empty(); }

private:
  FakeDuck *duck_;
  size_t max_;
  std::vector<uint8_t> from_host_, current_;
};

class FakeTransport final : public DuckTransport {
public:
  std::map<uint16_t, FakeDuck> ducks;
  size_t max_send = size_t(-1);
  int waits = 0;

  absl::StatusOr<std::unique_ptr<DuckConnection>>
  Connect(const DuckEndpoint &ep, absl::Duration, uint64_t) override {
    auto it = ducks.find(ep.port);
    if (it == ducks.end())
      return absl::UnavailableError("connect: Connection refused");
    return std::unique_ptr<DuckConnection>(
        std::make_unique<FakeLink>(&it->second, max_send));
  }
  absl::StatusOr<int> Wait(absl::Span<DuckWait> ws, absl::Duration) override {
    ++waits;
    int ready = 0;
    for (DuckWait &w : ws) {
      w.readable = w.read && static_cast<FakeLink *>(w.conn)->Readable();
      w.writable = w.write;
      ready += w.readable || w.writable;
    }
    return ready;
  }
};

DuckClientOptions Options(const std::shared_ptr<FakeTransport> &t,
                          std::vector<uint16_t> ports,
                          const std::string &token = "") {
  DuckClientOptions o;
  o.transport = t;
  o.read_environment = false;
  o.token = token;
  o.step_timeout = o.call_timeout = absl::Seconds(2);
  for (uint16_t p : ports) {
    t->ducks[p].port = p;
    t->ducks[p].token = token;
    o.ducks.push_back({"fake", p});
  }
  return o;
}

/// Opens a client on `t` and runs one step of `ib` on every duck.
absl::Status OpenAndStep(const std::shared_ptr<FakeTransport> &t,
                         const DuckClientOptions &o,
                         std::vector<DuckOutput> *outs,
                         StepMetrics *metrics = nullptr) {
  auto client = DuckClient::Create(o);
  if (!client.ok())
    return client.status();
  const std::vector<uint8_t> elf = {0x7f, 'E', 'L', 'F'};
  if (absl::Status s = (*client)->Open(elf); !s.ok())
    return s;
  const std::vector<uint8_t> ib = {1, 2, 3, 4, 5};
  std::vector<absl::Span<const uint8_t>> ibs(o.ducks.size(), ib);
  absl::Status s = (*client)->Step(ibs, outs, metrics);
  if (s.ok())
    s = (*client)->Close();
  return s;
}

TEST(DuckClientTransportTest, HandshakeStepCloseWithoutSockets) {
  auto t = std::make_shared<FakeTransport>();
  DuckClientOptions o = Options(t, {7, 9});
  auto client = DuckClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->hello(0).name, "fake-7");
  EXPECT_EQ((*client)->hello(1).cores, 2u);
  const std::vector<uint8_t> elf = {0x7f, 'E', 'L', 'F'};
  ASSERT_TRUE((*client)->Open(elf).ok());
  const std::vector<uint8_t> a = {1, 2, 3}, b = {10, 20};
  std::vector<absl::Span<const uint8_t>> ibs = {a, b};
  std::vector<DuckOutput> outs;
  StepMetrics m;
  ASSERT_TRUE((*client)->Step(ibs, &outs, &m).ok());
  EXPECT_EQ(outs[0].ob, (std::vector<uint8_t>{10, 9, 8}));
  EXPECT_EQ(outs[1].ob, (std::vector<uint8_t>{29, 19}));
  EXPECT_EQ(outs[1].kernel_ns, (std::vector<uint64_t>{1000, 2000}));
  EXPECT_EQ(outs[0].worker_ns, 5000u);
  EXPECT_DOUBLE_EQ(m.duck_max_us, 2.0);
  // Each step frame: header, step request, IB; each reply: header, step
  // reply, two cores' times, OB.
  EXPECT_EQ(m.bytes_sent, 2 * (32 + 16) + 3 + 2);
  EXPECT_EQ(m.bytes_received, 2 * (32 + 32 + 16) + 3 + 2);
  ASSERT_TRUE((*client)->Close().ok());
  for (auto &[port, duck] : t->ducks) {
    EXPECT_EQ(duck.error, "") << port;
    EXPECT_EQ(duck.seen, (std::vector<std::string>{"hello", "open", "step",
                                                   "close"}));
  }
}

TEST(DuckClientTransportTest, TokenSealsEveryFrame) {
  auto t = std::make_shared<FakeTransport>();
  std::vector<DuckOutput> outs;
  ASSERT_TRUE(OpenAndStep(t, Options(t, {3}, "secret"), &outs).ok());
  EXPECT_EQ(t->ducks[3].error, "");
  EXPECT_TRUE(t->ducks[3].keys.keyed);
  EXPECT_EQ(t->ducks[3].keys.recv_seq, 4u); // hello was 0: open, step, close
  EXPECT_EQ(outs[0].ob, (std::vector<uint8_t>{8, 7, 6, 5, 4}));

  // A duck with another token cannot verify the host's hello.
  auto u = std::make_shared<FakeTransport>();
  DuckClientOptions o = Options(u, {4}, "secret");
  u->ducks[4].token = "other";
  auto client = DuckClient::Create(o);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(client.status().message(),
            "duck fake:4: hello: wrong token (the hello's tag does not "
            "verify)");
  EXPECT_NE(u->ducks[4].error.find("frame authentication failed"),
            std::string::npos)
      << u->ducks[4].error;
}

TEST(DuckClientTransportTest, PartialSendsOnASlowLink) {
  auto t = std::make_shared<FakeTransport>();
  t->max_send = 7; // every frame in 7-byte pieces
  std::vector<DuckOutput> outs;
  ASSERT_TRUE(OpenAndStep(t, Options(t, {1, 2, 5}), &outs).ok());
  for (auto &[port, duck] : t->ducks)
    EXPECT_EQ(duck.error, "") << port;
  EXPECT_EQ(outs[2].ob, (std::vector<uint8_t>{10, 9, 8, 7, 6}));
}

TEST(DuckClientTransportTest, FaultsAreNamedByDuck) {
  struct Case {
    StepFault fault;
    absl::StatusCode code;
    std::string says;
  };
  for (const Case &c :
       {Case{StepFault::kCorruptReply, absl::StatusCode::kDataLoss,
             "duck fake:6: step: reply: payload checksum mismatch"},
        Case{StepFault::kHangUp, absl::StatusCode::kUnavailable,
             "duck fake:6: step: duckd closed the connection"},
        Case{StepFault::kErrorReply, absl::StatusCode::kAborted,
             "duck fake:6: step: the ELF faulted"}}) {
    auto t = std::make_shared<FakeTransport>();
    DuckClientOptions o = Options(t, {5, 6});
    t->ducks[6].fault = c.fault;
    std::vector<DuckOutput> outs;
    absl::Status s = OpenAndStep(t, o, &outs);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_EQ(s.message(), c.says);
    EXPECT_EQ(outs[0].ob.size(), 5u); // the healthy duck answered
  }
  auto t = std::make_shared<FakeTransport>();
  DuckClientOptions o = Options(t, {5});
  o.ducks.push_back({"fake", 8});
  auto client = DuckClient::Create(o);
  EXPECT_EQ(client.status().message(),
            "duck fake:8: connect: Connection refused");
}

// A duck whose connection is reset as a step goes out fails that step: the
// step never returns as if it had answered (its last step's output still
// in the outputs), and the stage before a staged step is no different.
TEST(DuckClientTransportTest, AStepThatCannotBeSentFails) {
  auto t = std::make_shared<FakeTransport>();
  DuckClientOptions o = Options(t, {5, 6});
  auto client = DuckClient::Create(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Open({0x7f, 'E', 'L', 'F'}).ok());
  const std::vector<uint8_t> ib = {1, 2, 3, 4, 5};
  std::vector<absl::Span<const uint8_t>> ibs(2, ib);
  std::vector<DuckOutput> outs;
  ASSERT_TRUE((*client)->Step(ibs, &outs).ok());
  ASSERT_EQ(outs[1].ob.size(), 5u);
  t->ducks[6].reset = true;
  absl::Status s = (*client)->Step(ibs, &outs);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("duck fake:6: step: "), std::string::npos) << s;
  EXPECT_NE(s.message().find("Connection reset by peer"), std::string::npos)
      << s;
  EXPECT_TRUE(outs[1].ob.empty()); // nothing of the step before
}

TEST(DuckClientTransportTest, PingDuckOverAnyTransport) {
  auto t = std::make_shared<FakeTransport>();
  t->max_send = 5;
  Options(t, {11, 12}, "secret");
  EXPECT_TRUE(PingDuck({"fake", 11}, absl::Seconds(1), "secret", t).ok());
  EXPECT_EQ(t->ducks[11].seen, (std::vector<std::string>{"hello"}));
  t->ducks[12].token = "other";
  absl::Status s = PingDuck({"fake", 12}, absl::Seconds(1), "secret", t);
  EXPECT_EQ(s.message(),
            "hello refused: wrong token (the hello's tag does not verify)");
  EXPECT_EQ(PingDuck({"fake", 13}, absl::Seconds(1), "", t).message(),
            "connect: Connection refused");
}

} // namespace
} // namespace duck::runtime
