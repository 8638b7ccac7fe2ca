// duckd survives every bad client: garbage, truncated and oversized frames,
// wrong versions, bad checksums, calls out of order, bad ELFs, bad sizes and
// clients that vanish or stall mid-frame. Each gets an error reply or a
// closed connection, leaves a log line, and the daemon keeps serving.
#include "duck/runtime/cluster/DuckClient.h"
#include "duck/runtime/cluster/LocalCluster.h"
#include "duck_rt/cast.h"
#include "duck_rt/wire.h"

#include "DuckTestUtil.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <netinet/in.h>
#include <poll.h>
#include <random>
#include <sys/socket.h>
#include <unistd.h>

namespace {

using duck::duckd::CastDigest;
using duck::duckd::CastSender;
using duck::duckd::CastSenderOptions;
using duck::duckd::Part;
using duck::runtime::DuckEndpoint;
using duck::runtime::LocalCluster;
using duck::runtime::LocalClusterOptions;
using duck::test::ReadFile;

/// A raw protocol connection.
struct Raw {
  int fd = -1;
  explicit Raw(const DuckEndpoint &ep) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(ep.port);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa), 0);
  }
  ~Raw() { close(fd); }
  void SendBytes(const void *p, size_t n) {
    ASSERT_EQ(send(fd, p, n, MSG_NOSIGNAL), ssize_t(n));
  }
  void SendFrame(uint16_t type, std::vector<Part> parts, uint32_t flags = 0,
                 uint32_t id = 7) {
    ASSERT_TRUE(duck::duckd::WriteFrame(fd, type, flags, id, parts,
                                        absl::Now() + absl::Seconds(5))
                    .ok());
  }
  absl::StatusOr<duck::duckd::Frame> Recv() {
    return duck::duckd::ReadFrame(fd, 64 << 20, absl::Now() + absl::Seconds(5));
  }
  /// Expects an error reply with `code`; returns its message.
  std::string ExpectError(duckd_error_code code) {
    auto f = Recv();
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok())
      return "";
    EXPECT_TRUE(f->header.flags & DUCKD_FLAG_ERROR);
    auto e = duck::duckd::DecodeError(f->payload);
    EXPECT_TRUE(e.ok());
    if (!e.ok())
      return "";
    EXPECT_EQ(e->code, code) << e->message;
    return e->message;
  }
  /// True when duckd closes the connection within `timeout`.
  bool Closed(absl::Duration timeout = absl::Seconds(3)) {
    const absl::Time deadline = absl::Now() + timeout;
    char c;
    while (absl::Now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) > 0) {
        ssize_t n = recv(fd, &c, 1, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
          return true;
      }
    }
    return false;
  }
  void Hello(uint32_t abi = DUCK_ABI_VERSION) {
    duckd_hello_request r{abi, DUCKD_PROTOCOL_VERSION, DUCKD_AUTH_NONE, 0, {}};
    SendFrame(DUCKD_MSG_HELLO, {{&r, sizeof r}});
  }
  void HelloOk() {
    Hello();
    auto f = Recv();
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_EQ(f->header.flags, uint32_t(DUCKD_FLAG_REPLY));
  }
  /// Opens a session of two cores on `elf`: its id (0 on failure).
  uint64_t Open(const std::vector<uint8_t> &elf, uint64_t ib_limit,
                uint64_t ob_limit) {
    duckd_open_request o{};
    o.cores = 2;
    o.ib_limit = ib_limit;
    o.ob_limit = ob_limit;
    o.scratch_bytes = 1 << 20;
    o.elf_bytes = elf.size();
    SendFrame(DUCKD_MSG_OPEN, {{&o, sizeof o}, {elf.data(), elf.size()}});
    auto f = Recv();
    EXPECT_TRUE(f.ok());
    if (!f.ok() || f->payload.size() < sizeof(duckd_open_reply))
      return 0;
    duckd_open_reply rep;
    std::memcpy(&rep, f->payload.data(), sizeof rep);
    return rep.session_id;
  }
};

class DuckdBadClient : public ::testing::Test {
protected:
  void SetUp() override {
    log_dir_ = ::testing::TempDir() + "/duckd-bad-" +
               std::to_string(getpid()) + "-" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_EQ(system(("mkdir -p '" + log_dir_ + "'").c_str()), 0);
    LocalClusterOptions o;
    o.ducks = 1;
    o.cores = 2;
    o.duckd_path = DUCKD_PATH;
    o.weights_size = 8 << 20;
    o.log_dir = log_dir_;
    o.extra_args = {"--io_timeout_ms=500", "--max_payload=4M", "--spin_us=50"};
    o.extra_args.insert(o.extra_args.end(), more_args_.begin(),
                        more_args_.end());
    auto c = LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    ep_ = cluster_->endpoints()[0];
  }
  void TearDown() override {
    if (cluster_) {
      EXPECT_TRUE(cluster_->Stop().ok()); // still answers SIGTERM
    }
    cluster_.reset();
    std::remove((log_dir_ + "/duckd-local0.log").c_str());
    ::rmdir(log_dir_.c_str());
  }
  /// The daemon is alive and serves a new host.
  void ExpectServing() {
    absl::Status s;
    for (int i = 0; i < 50; ++i) {
      s = duck::runtime::PingDuck(ep_, absl::Seconds(2));
      if (s.ok())
        break;
      usleep(20000);
    }
    EXPECT_TRUE(s.ok()) << s;
  }
  std::string Log() {
    std::ifstream in(log_dir_ + "/duckd-local0.log");
    return std::string((std::istreambuf_iterator<char>(in)),
                       std::istreambuf_iterator<char>());
  }
  std::string log_dir_;
  std::vector<std::string> more_args_; // a subclass's duckd flags
  std::unique_ptr<LocalCluster> cluster_;
  DuckEndpoint ep_;
};

/// The same, duckd with a cast socket (a unicast port of its own).
class DuckdCastBadClient : public DuckdBadClient {
protected:
  DuckdCastBadClient() { more_args_ = {"--cast=127.0.0.1:0"}; }
};

/// A step_staged request naming cast batch `cast_id` of a stage of
/// `stage_bytes` (in datagrams of 1408 bytes) with `digest`, and `ib`.
void SendStaged(Raw &r, uint64_t session, uint64_t cast_id,
                uint64_t stage_bytes, const uint8_t *digest,
                const std::vector<uint8_t> &ib, uint32_t id,
                uint32_t datagrams = 0) {
  duckd_step_staged_request q{};
  q.session_id = session;
  q.ib_bytes = ib.size();
  q.cast_id = cast_id;
  q.stage_ib_bytes = stage_bytes;
  q.datagram_bytes = 1408;
  q.datagrams = datagrams ? datagrams : uint32_t((stage_bytes + 1407) / 1408);
  if (digest)
    std::memcpy(q.digest, digest, sizeof q.digest);
  r.SendFrame(DUCKD_MSG_STEP_STAGED, {{&q, sizeof q}, {ib.data(), ib.size()}},
              0, id);
}

/// A one-token MoE decode IB of 64 wide with `flags` (and x unless staged).
std::vector<uint8_t> StageIb(uint32_t flags) {
  static const duck_expert_slot slots[2] = {{0, 0.5f}, {1, 0.5f}};
  const std::vector<float> x(64, 1.0f);
  const bool staged = flags & DUCK_IB_STAGED;
  std::vector<uint8_t> ib(duck_ib_bytes_flags(1, 2, 64, 0));
  duck_ib_write_flags(ib.data(), DUCK_MODE_MOE_DECODE_SMP, 0, 1, 2, slots,
                      staged ? nullptr : x.data(), 64, flags);
  if (staged)
    ib.resize(duck_ib_x_offset(2));
  return ib;
}

// step_staged (protocol 5) refused by name: another session, a batch
// shape that cannot carry its stage, a payload shorter than its request,
// quiet; and with no cast socket, a stage_missed naming it.
TEST_F(DuckdBadClient, StepStagedRefusals) {
  Raw r(ep_);
  r.HelloOk();
  const uint64_t session = r.Open(ReadFile(DUCK_ELF_PATH), 1 << 16, 1 << 16);
  ASSERT_NE(session, 0u);
  const std::vector<uint8_t> ib = StageIb(DUCK_IB_STAGED);
  SendStaged(r, session + 1, 5, 3000, nullptr, ib, 1);
  EXPECT_NE(r.ExpectError(DUCKD_ERR_NO_SESSION).find("step_staged for session"),
            std::string::npos);
  SendStaged(r, session, 5, 3000, nullptr, ib, 2, /*datagrams=*/2);
  EXPECT_NE(r.ExpectError(DUCKD_ERR_BAD_REQUEST).find("cannot carry 3000"),
            std::string::npos);
  SendStaged(r, session, 5, 1 << 20, nullptr, ib, 3);
  EXPECT_NE(r.ExpectError(DUCKD_ERR_TOO_LARGE).find("exceeds the session's"),
            std::string::npos);
  const uint8_t junk[10] = {};
  r.SendFrame(DUCKD_MSG_STEP_STAGED, {{junk, sizeof junk}}, 0, 4);
  EXPECT_NE(
      r.ExpectError(DUCKD_ERR_BAD_REQUEST).find("shorter than its request"),
      std::string::npos);
  r.SendFrame(DUCKD_MSG_STEP_STAGED, {{junk, sizeof junk}}, DUCKD_FLAG_QUIET,
              5);
  EXPECT_NE(r.ExpectError(DUCKD_ERR_BAD_REQUEST).find("quiet on a step"),
            std::string::npos);
  SendStaged(r, session, 5, 3000, nullptr, ib, 6);
  EXPECT_NE(r.ExpectError(DUCKD_ERR_STAGE_MISSED).find("no cast socket"),
            std::string::npos);
  r.HelloOk(); // still serving this host
}

// With a cast socket: a batch that never came is waited for (the cast
// wait) and missed; a stage's batch that came whole but could not run
// (no weights here: the ELF's status) is answered at once with why; a
// batch whose datagrams are not a stage likewise. Every answer names the
// batch.
TEST_F(DuckdCastBadClient, StepStagedWithoutItsStage) {
  Raw r(ep_);
  r.HelloOk();
  const uint64_t session = r.Open(ReadFile(DUCK_ELF_PATH), 1 << 16, 1 << 16);
  ASSERT_NE(session, 0u);
  const uint16_t port = cluster_->cast_ports()[0];
  ASSERT_NE(port, 0);
  CastSenderOptions co;
  co.address = "127.0.0.1";
  co.port = port;
  auto tx = CastSender::Open(co);
  ASSERT_TRUE(tx.ok()) << tx.status();
  const std::vector<uint8_t> staged = StageIb(DUCK_IB_STAGED);
  SendStaged(r, session, 40, 3000, nullptr, staged, 1);
  std::string m = r.ExpectError(DUCKD_ERR_STAGE_MISSED);
  EXPECT_NE(m.find("stage batch 40: not all of its 3 datagrams came within"),
            std::string::npos)
      << m;
  for (uint32_t flags : {uint32_t(DUCK_IB_STAGE), 0u}) {
    const std::vector<uint8_t> stage = StageIb(flags);
    const uint64_t id = flags ? 41 : 42;
    ASSERT_TRUE((*tx)->Send(id, stage, DUCKD_CAST_STAGE_MAGIC).ok());
    uint8_t digest[DUCKD_CAST_DIGEST_BYTES];
    CastDigest(stage, false, digest);
    usleep(100000); // the duck takes the batch while it waits
    SendStaged(r, session, id, stage.size(), digest, staged, 2);
    m = r.ExpectError(DUCKD_ERR_STAGE_MISSED);
    EXPECT_NE(m.find(absl::StrCat("stage batch ", id, ": ")), std::string::npos)
        << m;
    EXPECT_NE(m.find(flags ? "ELF status" : "not a stage"), std::string::npos)
        << m;
  }
  r.HelloOk();
  const std::string log = Log();
  EXPECT_NE(log.find("cast stage 41 not run"), std::string::npos) << log;
}

TEST_F(DuckdBadClient, GarbageBytes) {
  Raw r(ep_);
  std::mt19937 rng(1);
  std::vector<uint8_t> junk(512);
  for (auto &b : junk)
    b = uint8_t(rng());
  r.SendBytes(junk.data(), junk.size());
  EXPECT_NE(r.ExpectError(DUCKD_ERR_BAD_FRAME).find("magic"),
            std::string::npos);
  EXPECT_TRUE(r.Closed());
  ExpectServing();
  EXPECT_NE(Log().find("bad frame magic"), std::string::npos) << Log();
}

TEST_F(DuckdBadClient, TruncatedHeaderThenDisconnect) {
  {
    Raw r(ep_);
    uint8_t part[10] = {0x44, 0x4B, 0x57, 0x50};
    r.SendBytes(part, sizeof part);
  }
  ExpectServing();
  EXPECT_NE(Log().find("truncated frame header"), std::string::npos) << Log();
}

TEST_F(DuckdBadClient, TruncatedPayloadThenDisconnect) {
  {
    Raw r(ep_);
    std::vector<uint8_t> payload(100, 1);
    Part p{payload.data(), payload.size()};
    duckd_frame_header h =
        duck::duckd::MakeHeader(DUCKD_MSG_HELLO, 0, 1, {&p, 1});
    r.SendBytes(&h, sizeof h);
    r.SendBytes(payload.data(), 20);
  }
  ExpectServing();
  EXPECT_NE(Log().find("truncated hello frame"), std::string::npos) << Log();
}

TEST_F(DuckdBadClient, OversizedLength) {
  Raw r(ep_);
  duckd_frame_header h = duck::duckd::MakeHeader(DUCKD_MSG_HELLO, 0, 1, {});
  h.payload_bytes = 1ull << 40;
  r.SendBytes(&h, sizeof h);
  EXPECT_NE(r.ExpectError(DUCKD_ERR_TOO_LARGE).find("exceeds"),
            std::string::npos);
  EXPECT_TRUE(r.Closed());
  // Just above the configured 4 MiB limit too.
  Raw r2(ep_);
  h.payload_bytes = (4 << 20) + 1;
  r2.SendBytes(&h, sizeof h);
  r2.ExpectError(DUCKD_ERR_TOO_LARGE);
  ExpectServing();
}

TEST_F(DuckdBadClient, StallMidFrameIsDropped) {
  Raw r(ep_);
  duckd_frame_header h = duck::duckd::MakeHeader(DUCKD_MSG_HELLO, 0, 1, {});
  r.SendBytes(&h, 16);
  EXPECT_TRUE(r.Closed(absl::Seconds(5))); // --io_timeout_ms=500
  ExpectServing();
  EXPECT_NE(Log().find("read timed out"), std::string::npos) << Log();
}

TEST_F(DuckdBadClient, WrongProtocolVersion) {
  Raw r(ep_);
  duckd_hello_request req{DUCK_ABI_VERSION, DUCKD_PROTOCOL_VERSION, DUCKD_AUTH_NONE, 0, {}};
  Part p{&req, sizeof req};
  duckd_frame_header h =
      duck::duckd::MakeHeader(DUCKD_MSG_HELLO, 0, 1, {&p, 1});
  h.version = DUCKD_PROTOCOL_VERSION + 1;
  r.SendBytes(&h, sizeof h);
  r.SendBytes(&req, sizeof req);
  EXPECT_NE(r.ExpectError(DUCKD_ERR_BAD_ABI)
                .find(absl::StrCat("protocol version ",
                                   DUCKD_PROTOCOL_VERSION + 1)),
            std::string::npos);
  EXPECT_TRUE(r.Closed());
  ExpectServing();
}

TEST_F(DuckdBadClient, WrongAbiAtHelloThenGoodHello) {
  {
    Raw r(ep_);
    r.Hello(99);
    EXPECT_NE(r.ExpectError(DUCKD_ERR_BAD_ABI).find("abi 99"),
              std::string::npos);
    r.HelloOk(); // the connection stays usable
  }
  ExpectServing();
}

TEST_F(DuckdBadClient, BadChecksum) {
  Raw r(ep_);
  duckd_hello_request req{DUCK_ABI_VERSION, DUCKD_PROTOCOL_VERSION, DUCKD_AUTH_NONE, 0, {}};
  Part p{&req, sizeof req};
  duckd_frame_header h =
      duck::duckd::MakeHeader(DUCKD_MSG_HELLO, 0, 1, {&p, 1});
  h.payload_checksum ^= 1;
  r.SendBytes(&h, sizeof h);
  r.SendBytes(&req, sizeof req);
  EXPECT_NE(r.ExpectError(DUCKD_ERR_BAD_FRAME).find("checksum"),
            std::string::npos);
  r.HelloOk();
}

TEST_F(DuckdBadClient, CallsOutOfOrder) {
  Raw r(ep_);
  duckd_close_request c{1};
  r.SendFrame(DUCKD_MSG_CLOSE, {{&c, sizeof c}});
  EXPECT_NE(r.ExpectError(DUCKD_ERR_UNAUTHORIZED).find("hello first"),
            std::string::npos);
  r.HelloOk();
  std::vector<uint8_t> ib(64, 0);
  duckd_step_request s{1, ib.size()};
  r.SendFrame(DUCKD_MSG_STEP, {{&s, sizeof s}, {ib.data(), ib.size()}});
  EXPECT_NE(r.ExpectError(DUCKD_ERR_NO_SESSION).find("open first"),
            std::string::npos);
  r.SendFrame(DUCKD_MSG_CLOSE, {{&c, sizeof c}});
  r.ExpectError(DUCKD_ERR_NO_SESSION);
  r.SendFrame(DUCKD_MSG_PREPARE_FINISH, {});
  r.ExpectError(DUCKD_ERR_CACHE); // nothing named yet
  // A host must not send replies or notices.
  r.SendFrame(DUCKD_MSG_CLOSE, {{&c, sizeof c}}, DUCKD_FLAG_REPLY);
  r.ExpectError(DUCKD_ERR_BAD_REQUEST);
  r.SendFrame(DUCKD_MSG_NOTICE, {});
  r.ExpectError(DUCKD_ERR_BAD_REQUEST);
  // Wrong sizes inside a well-formed frame.
  uint8_t tiny[3] = {};
  r.SendFrame(DUCKD_MSG_OPEN, {{tiny, 3}});
  r.ExpectError(DUCKD_ERR_BAD_REQUEST);
  r.SendFrame(DUCKD_MSG_STEP, {{tiny, 3}});
  r.ExpectError(DUCKD_ERR_BAD_REQUEST);
  duckd_step_request lie{1, 1000};
  r.SendFrame(DUCKD_MSG_STEP, {{&lie, sizeof lie}, {ib.data(), ib.size()}});
  r.ExpectError(DUCKD_ERR_BAD_REQUEST);
  r.HelloOk();
}

/// Sends open with `elf`; returns the error message (BAD_ELF expected).
std::string OpenBadElf(Raw &r, const std::vector<uint8_t> &elf) {
  duckd_open_request o{};
  o.cores = 1;
  o.ib_limit = 4096;
  o.ob_limit = 4096;
  o.scratch_bytes = 1 << 20;
  o.elf_bytes = elf.size();
  r.SendFrame(DUCKD_MSG_OPEN, {{&o, sizeof o}, {elf.data(), elf.size()}});
  return r.ExpectError(DUCKD_ERR_BAD_ELF);
}

TEST_F(DuckdBadClient, BadElfs) {
  {
  Raw r(ep_);
  r.HelloOk();
  const std::vector<uint8_t> good = ReadFile(DUCK_ELF_PATH);
  auto arm = good;
  arm[18] = 183; // e_machine = EM_AARCH64
  arm[19] = 0;
  EXPECT_NE(OpenBadElf(r, arm).find("need x86-64"), std::string::npos);
  std::vector<uint8_t> cut(good.begin(), good.begin() + good.size() / 3);
  EXPECT_NE(OpenBadElf(r, cut).find("past the end"), std::string::npos);
  std::vector<uint8_t> junk(4096, 0x5A);
  EXPECT_NE(OpenBadElf(r, junk).find("bad magic"), std::string::npos);
  EXPECT_NE(OpenBadElf(r, {}).find("truncated"), std::string::npos);
  EXPECT_NE(OpenBadElf(r, ReadFile(DUCKD_PATH)).find("PT_INTERP"),
            std::string::npos);
  // One-shot runs refuse them the same way, and keep the sandbox alive.
  duckd_run_request run{};
  run.cores = 1;
  run.ob_limit = 4096;
  run.scratch_bytes = 1 << 20;
  run.elf_bytes = arm.size();
  std::vector<uint8_t> ib(64, 0);
  run.ib_bytes = ib.size();
  r.SendFrame(DUCKD_MSG_RUN,
              {{&run, sizeof run}, {arm.data(), arm.size()}, {ib.data(), 64}});
  EXPECT_NE(r.ExpectError(DUCKD_ERR_BAD_ELF).find("need x86-64"),
            std::string::npos);
  // And a good ELF opens afterwards on the same connection.
  duckd_open_request o{};
  o.cores = 2;
  o.ib_limit = 4096;
  o.ob_limit = 4096;
  o.scratch_bytes = 1 << 20;
  o.elf_bytes = good.size();
  r.SendFrame(DUCKD_MSG_OPEN, {{&o, sizeof o}, {good.data(), good.size()}});
  auto f = r.Recv();
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->header.flags, uint32_t(DUCKD_FLAG_REPLY));
  }
  ExpectServing();
}

TEST_F(DuckdBadClient, BadSizes) {
  Raw r(ep_);
  r.HelloOk();
  const std::vector<uint8_t> elf = ReadFile(DUCK_ELF_PATH);
  duckd_open_request o{};
  o.cores = 99;
  o.ib_limit = 4096;
  o.ob_limit = 4096;
  o.elf_bytes = elf.size();
  r.SendFrame(DUCKD_MSG_OPEN, {{&o, sizeof o}, {elf.data(), elf.size()}});
  EXPECT_NE(r.ExpectError(DUCKD_ERR_BAD_REQUEST).find("cores"),
            std::string::npos);
  o.cores = 1;
  o.ob_limit = 0;
  r.SendFrame(DUCKD_MSG_OPEN, {{&o, sizeof o}, {elf.data(), elf.size()}});
  r.ExpectError(DUCKD_ERR_BAD_REQUEST);
  o.ob_limit = 4096;
  o.scratch_bytes = 1ull << 50;
  r.SendFrame(DUCKD_MSG_OPEN, {{&o, sizeof o}, {elf.data(), elf.size()}});
  r.ExpectError(DUCKD_ERR_BAD_REQUEST);
  o.scratch_bytes = 1 << 20;
  o.elf_bytes = elf.size() + 5;
  r.SendFrame(DUCKD_MSG_OPEN, {{&o, sizeof o}, {elf.data(), elf.size()}});
  r.ExpectError(DUCKD_ERR_BAD_REQUEST);
  // A step IB larger than the session's ib_limit.
  o.elf_bytes = elf.size();
  r.SendFrame(DUCKD_MSG_OPEN, {{&o, sizeof o}, {elf.data(), elf.size()}});
  auto f = r.Recv();
  ASSERT_TRUE(f.ok());
  duckd_open_reply rep;
  std::memcpy(&rep, f->payload.data(), sizeof rep);
  std::vector<uint8_t> ib(8192, 0);
  duckd_step_request s{rep.session_id, ib.size()};
  r.SendFrame(DUCKD_MSG_STEP, {{&s, sizeof s}, {ib.data(), ib.size()}});
  r.ExpectError(DUCKD_ERR_TOO_LARGE);
  // A bad IB inside the limit: the ELF answers with a status, not a fault.
  std::vector<uint8_t> small(64, 0xEE);
  duckd_step_request s2{rep.session_id, small.size()};
  r.SendFrame(DUCKD_MSG_STEP, {{&s2, sizeof s2}, {small.data(), 64}});
  f = r.Recv();
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->header.flags, uint32_t(DUCKD_FLAG_REPLY));
  duckd_step_reply sr;
  std::memcpy(&sr, f->payload.data(), sizeof sr);
  EXPECT_EQ(sr.status, DUCK_STATUS_BAD_INPUT);
  // Image headers and writes the cache refuses.
  duckd_prepare_begin_request b{};
  r.SendFrame(DUCKD_MSG_PREPARE_BEGIN, {{&b, sizeof b}});
  EXPECT_NE(r.ExpectError(DUCKD_ERR_CACHE).find("bad magic"),
            std::string::npos);
  duck::duckd::SyntheticSpec spec;
  spec.slots = {duck::duckd::SyntheticSlot{}};
  auto img = duck::duckd::BuildSyntheticImage(spec);
  ASSERT_TRUE(img.ok());
  std::memcpy(&b.image, img->data(), sizeof b.image);
  b.image.total_bytes = 1ull << 40;
  r.SendFrame(DUCKD_MSG_PREPARE_BEGIN, {{&b, sizeof b}});
  r.ExpectError(DUCKD_ERR_CACHE); // the checksum no longer matches
  std::memcpy(&b.image, img->data(), sizeof b.image);
  r.SendFrame(DUCKD_MSG_PREPARE_BEGIN, {{&b, sizeof b}});
  f = r.Recv();
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->header.flags, uint32_t(DUCKD_FLAG_REPLY));
  duckd_prepare_write_request w{img->size() - 8, 64};
  std::vector<uint8_t> data(64, 1);
  r.SendFrame(DUCKD_MSG_PREPARE_WRITE, {{&w, sizeof w}, {data.data(), 64}});
  EXPECT_NE(r.ExpectError(DUCKD_ERR_CACHE).find("outside the image"),
            std::string::npos);
  // Finishing an image never uploaded fails verification, marks nothing.
  r.SendFrame(DUCKD_MSG_PREPARE_FINISH, {});
  r.ExpectError(DUCKD_ERR_CACHE);
  r.HelloOk();
}

// Staged steps (abi.h DUCK_IB_STAGE / DUCK_IB_STAGED) that duckd refuses
// before any call: a staged step with no stage before it is answered
// stage_missed (the host then sends it whole), a stage that is not a MoE
// decode step or carries both flags a bad request; a stage whose call
// fails leaves nothing for the step after it.
TEST_F(DuckdBadClient, StagedStepsWithoutTheirStage) {
  {
    Raw r(ep_);
    r.HelloOk();
    const uint64_t session = r.Open(ReadFile(DUCK_ELF_PATH), 1 << 16, 1 << 16);
    ASSERT_NE(session, 0u);
    const duck_expert_slot slots[2] = {{0, 0.5f}, {1, 0.5f}};
    const std::vector<float> x(64, 1.0f);
    uint32_t id = 100;
    auto step = [&](uint32_t mode, uint32_t top_k, uint32_t flags, bool withX,
                    uint32_t frameFlags) {
      std::vector<uint8_t> ib(duck_ib_bytes_flags(1, top_k, 64, 0));
      duck_ib_write_flags(ib.data(), mode, 0, 1, top_k, slots,
                          withX ? x.data() : nullptr, 64, flags);
      if (!withX)
        ib.resize(duck_ib_x_offset(top_k));
      duckd_step_request s{session, ib.size()};
      r.SendFrame(DUCKD_MSG_STEP, {{&s, sizeof s}, {ib.data(), ib.size()}},
                  frameFlags, ++id);
    };
    // The next frame is the answer to request `want` (nothing came for the
    // quiet ones before it), an error with `code`; its message.
    auto answer = [&](uint32_t want, duckd_error_code code) {
      auto f = r.Recv();
      EXPECT_TRUE(f.ok());
      if (!f.ok())
        return std::string();
      EXPECT_EQ(f->header.request_id, want);
      EXPECT_EQ(f->header.flags, uint32_t(DUCKD_FLAG_REPLY | DUCKD_FLAG_ERROR));
      auto e = duck::duckd::DecodeError(f->payload);
      EXPECT_TRUE(e.ok());
      if (!e.ok())
        return std::string();
      EXPECT_EQ(e->code, uint32_t(code)) << e->message;
      return e->message;
    };
    step(DUCK_MODE_MOE_DECODE_SMP, 2, DUCK_IB_STAGED, false, 0);
    EXPECT_NE(answer(id, DUCKD_ERR_STAGE_MISSED).find("no stage of its own"),
              std::string::npos);
    // Answered stages still say what is wrong with them.
    step(DUCK_MODE_DENSE_DECODE, 0, DUCK_IB_STAGE, true, 0);
    EXPECT_NE(answer(id, DUCKD_ERR_BAD_REQUEST).find("MoE decode step"),
              std::string::npos);
    step(DUCK_MODE_MOE_DECODE_SMP, 1, DUCK_IB_STAGE | DUCK_IB_STAGED, true, 0);
    answer(id, DUCKD_ERR_BAD_REQUEST);
    // Quiet ones say nothing, and leave no stage: a bad stage, one whose
    // call fails (no weights here: the ELF's status), and a quiet step that
    // is no stage (not run); each staged step after them finds none.
    for (uint32_t mode : {uint32_t(DUCK_MODE_DENSE_DECODE),
                          uint32_t(DUCK_MODE_MOE_DECODE_SMP)}) {
      step(mode, mode == DUCK_MODE_DENSE_DECODE ? 0 : 1, DUCK_IB_STAGE, true,
           DUCKD_FLAG_QUIET);
      step(DUCK_MODE_MOE_DECODE_SMP, 2, DUCK_IB_STAGED, false, 0);
      answer(id, DUCKD_ERR_STAGE_MISSED);
    }
    step(DUCK_MODE_MOE_DECODE_SMP, 1, 0, true, DUCKD_FLAG_QUIET);
    r.HelloOk(); // the quiet plain step left no answer before this one
    // Quiet is a step's flag alone.
    duckd_hello_request h{
        DUCK_ABI_VERSION, DUCKD_PROTOCOL_VERSION, DUCKD_AUTH_NONE, 0, {}};
    r.SendFrame(DUCKD_MSG_HELLO, {{&h, sizeof h}}, DUCKD_FLAG_QUIET);
    EXPECT_NE(r.ExpectError(DUCKD_ERR_BAD_REQUEST).find("quiet on a step"),
              std::string::npos);
    r.HelloOk(); // still serving this host
  }
  // Without a session, a quiet step is drained unanswered too (once duckd
  // has let the last host go).
  ExpectServing();
  Raw other(ep_);
  other.HelloOk();
  duckd_step_request none{12345, 0};
  other.SendFrame(DUCKD_MSG_STEP, {{&none, sizeof none}}, DUCKD_FLAG_QUIET);
  other.HelloOk();
}

TEST_F(DuckdBadClient, DisconnectMidStep) {
  const std::vector<uint8_t> elf = ReadFile(DUCK_ELF_PATH);
  {
    Raw r(ep_);
    r.HelloOk();
    const uint64_t session = r.Open(elf, 1 << 20, 4096);
    ASSERT_NE(session, 0u);
    std::vector<uint8_t> ib(512 << 10, 0);
    duckd_step_request s{session, ib.size()};
    Part parts[] = {{&s, sizeof s}, {ib.data(), ib.size()}};
    duckd_frame_header h = duck::duckd::MakeHeader(DUCKD_MSG_STEP, 0, 3, parts);
    r.SendBytes(&h, sizeof h);
    r.SendBytes(&s, sizeof s);
    r.SendBytes(ib.data(), 100 << 10);
  } // gone mid-IB
  ExpectServing();
  const std::string log = Log();
  EXPECT_NE(log.find("truncated step"), std::string::npos) << log;
  EXPECT_NE(log.find("session 1 closed"), std::string::npos) << log;
}

} // namespace

// A mesh request whose peer list does not match its duck count, whose
// rank is past it, or whose transport is unknown, is a bad request naming
// what a mesh request holds (the
// daemon here has no --mesh-port, but the payload is checked first); the
// daemon keeps serving.
TEST_F(DuckdBadClient, MalformedMeshRequests) {
  for (uint32_t ducks : {0u, 2u}) {
    Raw r(ep_);
    r.HelloOk();
    duckd_mesh_request req{};
    req.ducks = ducks;
    req.rank = 5; // past the ducks, and no peers follow
    r.SendFrame(DUCKD_MSG_MESH, {{&req, sizeof req}});
    const std::string m = r.ExpectError(DUCKD_ERR_BAD_REQUEST);
    EXPECT_NE(m.find("one peer for each of its ducks"), std::string::npos) << m;
  }
  { // a probe without a mesh, and one of the wrong size
    Raw r(ep_);
    r.HelloOk();
    duckd_mesh_probe_request probe{1, 16, 1, 0};
    r.SendFrame(DUCKD_MSG_MESH_PROBE, {{&probe, sizeof probe}});
    std::string m = r.ExpectError(DUCKD_ERR_BAD_REQUEST);
    EXPECT_NE(m.find("holds no mesh"), std::string::npos) << m;
    r.SendFrame(DUCKD_MSG_MESH_PROBE, {{&probe, sizeof probe - 4}});
    m = r.ExpectError(DUCKD_ERR_BAD_REQUEST);
    EXPECT_NE(m.find("a request of 16 bytes"), std::string::npos) << m;
    probe.rounds = 0;
    r.SendFrame(DUCKD_MSG_MESH_PROBE, {{&probe, sizeof probe}});
    m = r.ExpectError(DUCKD_ERR_BAD_REQUEST);
    EXPECT_NE(m.find("1 to 100000 rounds"), std::string::npos) << m;
  }
  { // a well-formed request of an unknown transport
    Raw r(ep_);
    r.HelloOk();
    duckd_mesh_request req{};
    req.ducks = 1;
    req.transport = 7;
    duckd_mesh_peer peer{};
    r.SendFrame(DUCKD_MSG_MESH, {{&req, sizeof req}, {&peer, sizeof peer}});
    const std::string m = r.ExpectError(DUCKD_ERR_BAD_REQUEST);
    EXPECT_NE(m.find("transport 7 (0: tcp, 1: udp)"), std::string::npos) << m;
  }
  Raw r(ep_);
  r.HelloOk();
}

// The frame-level bad input the list names: an unknown message type, flags
// a host may not send, a hello whose length is not its protocol's (the
// token no longer travels in it: protocol 1 sent it after the request), and
// a prepare write whose offset + length wraps around 2^64.
// Each is an error reply naming the problem; the daemon keeps serving.
TEST_F(DuckdBadClient, UnknownTypeFlagsTokenLengthAndWrappingOffset) {
  {
    Raw r(ep_);
    r.HelloOk();
    r.SendFrame(uint16_t(DUCKD_MSG_COUNT + 3), {});
    const std::string m = r.ExpectError(DUCKD_ERR_BAD_FRAME);
    EXPECT_NE(m.find("type"), std::string::npos) << m;
  }
  {
    Raw r(ep_);
    r.HelloOk();
    duckd_hello_request h{DUCK_ABI_VERSION, DUCKD_PROTOCOL_VERSION, DUCKD_AUTH_NONE, 0, {}};
    r.SendFrame(DUCKD_MSG_HELLO, {{&h, sizeof h}}, DUCKD_FLAG_REPLY);
    const std::string m = r.ExpectError(DUCKD_ERR_BAD_REQUEST);
    EXPECT_NE(m.find("flags"), std::string::npos) << m;
  }
  {
    Raw r(ep_);
    duckd_hello_request h{DUCK_ABI_VERSION, DUCKD_PROTOCOL_VERSION,
                          DUCKD_AUTH_NONE, 0, {}};
    const char token[8] = "short";
    r.SendFrame(DUCKD_MSG_HELLO, {{&h, sizeof h}, {token, sizeof token}});
    const std::string m = r.ExpectError(DUCKD_ERR_BAD_REQUEST);
    EXPECT_NE(m.find("hello of 40 bytes"), std::string::npos) << m;
  }
  {
    Raw r(ep_);
    r.HelloOk();
    duck::duckd::SyntheticSpec spec;
    spec.slots = {duck::duckd::SyntheticSlot{}};
    auto img = duck::duckd::BuildSyntheticImage(spec);
    ASSERT_TRUE(img.ok());
    duckd_prepare_begin_request b{};
    std::memcpy(&b.image, img->data(), sizeof b.image);
    r.SendFrame(DUCKD_MSG_PREPARE_BEGIN, {{&b, sizeof b}});
    auto f = r.Recv();
    ASSERT_TRUE(f.ok());
    ASSERT_EQ(f->header.flags, uint32_t(DUCKD_FLAG_REPLY));
    duckd_prepare_write_request w{~0ull - 16, 64};
    std::vector<uint8_t> data(64, 1);
    r.SendFrame(DUCKD_MSG_PREPARE_WRITE, {{&w, sizeof w}, {data.data(), 64}});
    const std::string m = r.ExpectError(DUCKD_ERR_CACHE);
    EXPECT_NE(m.find("outside the image"), std::string::npos) << m;
  }
  ExpectServing();
}

// measure: sizes and limits are checked before anything runs; a ping is
// answered at once.
TEST_F(DuckdBadClient, MeasureRequestsOutOfRange) {
  {
    Raw r(ep_);
    r.HelloOk();
    auto expect = [&](duckd_measure_request q, const char *what) {
      r.SendFrame(DUCKD_MSG_MEASURE, {{&q, sizeof q}});
      const std::string m = r.ExpectError(DUCKD_ERR_BAD_REQUEST);
      EXPECT_NE(m.find(what), std::string::npos) << m;
    };
    expect({99, 0, 0, 0, 0}, "99 cores asked");
    expect({0, 0, 1 << 20, 0, 0}, "arena of 1048576 bytes");
    expect({0, 4, 0, 0, 0}, "unknown flags 0x4");
    expect({0, 0, 0, 60000, 0}, "at most 10000");
    const uint32_t shortOne = 0;
    r.SendFrame(DUCKD_MSG_MEASURE, {{&shortOne, sizeof shortOne}});
    EXPECT_NE(r.ExpectError(DUCKD_ERR_BAD_REQUEST).find("wrong size"),
              std::string::npos);
    duckd_measure_request ping{0, DUCKD_MEASURE_PING, 0, 0, 0};
    r.SendFrame(DUCKD_MSG_MEASURE, {{&ping, sizeof ping}});
    auto f = r.Recv();
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->header.flags, uint32_t(DUCKD_FLAG_REPLY));
    EXPECT_EQ(f->payload.size(), sizeof(duckd_measure_reply));
  }
  ExpectServing();
}

// A link probe (DUCKD_MEASURE_LINK): its bytes read and dropped, a reply of
// the size it asks for; without its reply_bytes, or asking for more than
// the limit, a bad_request and the connection still serves.
TEST_F(DuckdBadClient, LinkProbes) {
  {
    Raw r(ep_);
    r.HelloOk();
    const duckd_measure_request q{0, DUCKD_MEASURE_PING | DUCKD_MEASURE_LINK, 0,
                                  0, 0};
    const std::vector<uint8_t> bytes(300000, 0x5a);
    for (uint64_t back : {uint64_t(0), uint64_t(123457)}) {
      r.SendFrame(
          DUCKD_MSG_MEASURE,
          {{&q, sizeof q}, {&back, sizeof back}, {bytes.data(), bytes.size()}});
      auto f = r.Recv();
      ASSERT_TRUE(f.ok()) << f.status();
      EXPECT_EQ(f->header.flags, uint32_t(DUCKD_FLAG_REPLY));
      ASSERT_EQ(f->payload.size(), sizeof(duckd_measure_reply) + back);
      EXPECT_TRUE(std::all_of(f->payload.begin(), f->payload.end(),
                              [](uint8_t b) { return b == 0; }));
    }
    r.SendFrame(DUCKD_MSG_MEASURE, {{&q, sizeof q}});
    EXPECT_NE(r.ExpectError(DUCKD_ERR_BAD_REQUEST)
                  .find("without its "
                        "reply_bytes"),
              std::string::npos);
    const uint64_t huge = uint64_t(DUCKD_LINK_PROBE_MAX_BYTES) + 1;
    r.SendFrame(DUCKD_MSG_MEASURE, {{&q, sizeof q}, {&huge, sizeof huge}});
    EXPECT_NE(r.ExpectError(DUCKD_ERR_BAD_REQUEST).find("a link probe's reply"),
              std::string::npos);
  }
  ExpectServing();
}
