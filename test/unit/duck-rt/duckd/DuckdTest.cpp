// duckd end to end on loopback: real duckd processes (LocalCluster), the
// host's DuckClient, persistent sessions and one-shot runs of every mode
// compared bit for bit against the kernels run in-process, the weight cache
// (hit, miss, invalidation, restart, crash mid-prepare, resume), a crashing
// and a hanging ELF, busy and token handling.
#include "DuckTestUtil.h"

#include "duck/runtime/cluster/DuckClient.h"
#include "duck/runtime/cluster/LocalCluster.h"
#include "duck_rt/wire.h"

#include <gtest/gtest.h>
#include <thread>

#include <arpa/inet.h>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using namespace duck::test;
using duck::duckd::MakeIb;
using duck::duckd::RandomRouting;
using duck::duckd::RandomX;
using duck::runtime::DuckClient;
using duck::runtime::DuckClientOptions;
using duck::runtime::DuckOutput;
using duck::runtime::LocalCluster;
using duck::runtime::LocalClusterOptions;
using duck::runtime::StepMetrics;

LocalClusterOptions ClusterOptions(uint32_t ducks, uint32_t cores) {
  LocalClusterOptions o;
  o.ducks = ducks;
  o.cores = cores;
  o.duckd_path = DUCKD_PATH;
  o.weights_size = 16 << 20;
  o.extra_args = {"--spin_us=50"};
  return o;
}

DuckClientOptions ClientOptions(const LocalCluster &c) {
  DuckClientOptions o;
  o.ducks = c.endpoints();
  o.read_environment = false;
  o.ib_limit = 64 << 10;
  o.ob_limit = 64 << 10;
  o.scratch_bytes = 4 << 20;
  o.step_timeout = absl::Seconds(20);
  return o;
}

/// Image of tp rank `rank` of `tp` (the seed makes ranks differ).
struct TestImage {
  std::vector<uint8_t> bytes;
  std::string path;
  TestImage(uint64_t seed, uint32_t tp, uint32_t rank, const std::string &dir,
            std::vector<SyntheticSlot> extra = {}) {
    SyntheticSpec s = TestSpec(seed);
    s.tp_size = tp;
    s.tp_rank = rank;
    s.slots.insert(s.slots.end(), extra.begin(), extra.end());
    auto b = duck::duckd::BuildSyntheticImage(s);
    EXPECT_TRUE(b.ok()) << b.status();
    bytes = std::move(*b);
    path = dir + "/image-" + std::to_string(seed) + "-" + std::to_string(rank) +
           ".duckw";
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char *>(bytes.data()),
              std::streamsize(bytes.size()));
  }
};

/// Bytes a full prepare sends: the head (header + slot table) and every
/// slot (not the padding between them).
uint64_t UploadBytes(const std::vector<uint8_t> &img) {
  duck_image_header h;
  std::memcpy(&h, img.data(), sizeof h);
  uint64_t n = h.slot_table_offset + uint64_t(h.slot_count) * 32;
  const auto *t =
      reinterpret_cast<const duck_slot_entry *>(img.data() + h.slot_table_offset);
  for (uint32_t s = 0; s < h.slot_count; ++s)
    n += t[s].bytes;
  return n;
}

std::vector<float> OutOf(const DuckOutput &o) {
  duck_ob_header h;
  std::memcpy(&h, o.ob.data(), sizeof h);
  EXPECT_EQ(h.magic, DUCK_OB_MAGIC);
  EXPECT_EQ(o.ob.size(), h.out_offset + uint64_t(h.n_tokens) * h.hidden * 4);
  std::vector<float> v(uint64_t(h.n_tokens) * h.hidden);
  std::memcpy(v.data(), o.ob.data() + h.out_offset, v.size() * 4);
  return v;
}

struct ModeCase {
  uint32_t mode, slot, tokens, top_k;
};
const ModeCase kModes[] = {
    {DUCK_MODE_DENSE_PREPARE, 0, 0, 0},  {DUCK_MODE_MOE_PREPARE, 1, 0, 0},
    {DUCK_MODE_DENSE_DECODE, 0, 1, 0},   {DUCK_MODE_MOE_DECODE, 1, 1, 6},
    {DUCK_MODE_MOE_DECODE_SMP, 1, 1, 8}, {DUCK_MODE_MOE_DECODE_SMP, 2, 1, 4},
    {DUCK_MODE_DENSE_PREFILL, 0, 5, 0},  {DUCK_MODE_MOE_PREFILL, 1, 6, 3},
};

/// Runs every mode on every duck and checks each OB against the kernels.
void RunEveryMode(DuckClient &client, const std::vector<TestImage> &images,
                  const char *what) {
  std::vector<Reference> refs;
  for (const TestImage &i : images)
    refs.emplace_back(i.bytes);
  uint64_t seed = 1000;
  for (const ModeCase &c : kModes) {
    auto x = RandomX(c.tokens * kHidden, ++seed);
    auto routing = c.top_k ? RandomRouting(c.tokens, c.top_k, 8, ++seed)
                           : std::vector<duck_expert_slot>();
    auto ib = MakeIb(c.mode, c.slot, c.tokens, c.top_k, routing, x);
    std::vector<absl::Span<const uint8_t>> ibs(client.size(), ib);
    std::vector<DuckOutput> out;
    StepMetrics m;
    absl::Status s = client.Step(ibs, &out, &m);
    ASSERT_TRUE(s.ok()) << what << " mode " << c.mode << ": " << s;
    EXPECT_GT(m.judge_wait_us, 0);
    EXPECT_GT(m.duck_max_us, 0);
    EXPECT_NEAR(m.judge_gap_us, m.judge_wait_us - m.duck_max_us, 1e-6);
    EXPECT_GT(m.bytes_sent, client.size() * ib.size());
    EXPECT_GT(m.bytes_received, client.size() * 64);
    for (size_t d = 0; d < client.size(); ++d) {
      EXPECT_EQ(out[d].status, DUCK_STATUS_OK);
      if (c.tokens == 0) { // prepare modes: header only
        EXPECT_EQ(out[d].ob.size(), 64u);
        continue;
      }
      std::string label = std::string(what) + " duck " + std::to_string(d) +
                          " mode " + std::to_string(c.mode) + " slot " +
                          std::to_string(c.slot);
      ExpectBitIdentical(
          OutOf(out[d]),
          refs[d].Run(c.mode, c.slot, c.tokens, c.top_k, routing, x),
          label.c_str());
    }
  }
}

// Two ducks of two cores, weights prepared over the wire, every mode through
// a persistent session and through one-shot runs: bit-identical to the
// kernels run in-process, with judge metrics.
TEST(Duckd, EveryModeOverPersistentAndRunIsBitIdentical) {
  auto cluster = LocalCluster::Start(ClusterOptions(2, 2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string dir = (*cluster)->cache_dir();
  std::vector<TestImage> images = {TestImage(21, 2, 0, dir),
                                   TestImage(22, 2, 1, dir)};
  const std::vector<std::string> paths = {images[0].path, images[1].path};
  const std::vector<uint8_t> elf = ReadFile(DUCK_ELF_PATH);
  {
    auto client = DuckClient::Create(ClientOptions(**cluster));
    ASSERT_TRUE(client.ok()) << client.status();
    EXPECT_EQ((*client)->hello(0).cores, 2u);
    EXPECT_FALSE((*client)->hello(0).cache_valid);
    auto rep = (*client)->Prepare(paths);
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_EQ(rep->result[0], DUCKD_CACHE_MISS);
    EXPECT_EQ(rep->bytes_uploaded[1], UploadBytes(images[1].bytes));
    EXPECT_EQ((*client)->hello(1).finished_slots, 3u);
    EXPECT_EQ((*client)->hello(1).image.tp_rank, 1u);
    ASSERT_TRUE((*client)->persistent());
    ASSERT_TRUE((*client)->Open(elf).ok());
    RunEveryMode(**client, images, "persistent");
    // A step that fails in the ELF is an error naming the duck; the session
    // stays usable.
    auto bad = MakeIb(DUCK_MODE_MOE_DECODE_SMP, 9, 1, 1, {{0, 1.0f}},
                      RandomX(kHidden, 1));
    std::vector<absl::Span<const uint8_t>> ibs(2, bad);
    std::vector<DuckOutput> out;
    absl::Status s = (*client)->Step(ibs, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    // The first duck to answer is reported; either one, by endpoint.
    EXPECT_TRUE(s.message().find((*cluster)->endpoints()[0].ToString()) !=
                    std::string::npos ||
                s.message().find((*cluster)->endpoints()[1].ToString()) !=
                    std::string::npos)
        << s;
    EXPECT_NE(s.message().find("BAD_INPUT"), std::string::npos) << s;
    EXPECT_EQ(out[0].status, DUCK_STATUS_BAD_INPUT);
    EXPECT_EQ(out[1].status, DUCK_STATUS_BAD_INPUT);
    RunEveryMode(**client, images, "persistent after an error");
    ASSERT_TRUE((*client)->Close().ok());
  }
  {
    DuckClientOptions o = ClientOptions(**cluster);
    o.persistent = false;
    auto client = DuckClient::Create(o);
    ASSERT_TRUE(client.ok()) << client.status();
    auto rep = (*client)->Prepare(paths);
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_EQ(rep->result[0], DUCKD_CACHE_HIT);
    EXPECT_EQ(rep->bytes_uploaded[0], 0u);
    ASSERT_TRUE((*client)->Open(elf).ok());
    RunEveryMode(**client, images, "run");
  }
  {
    // DUCK_PERSISTENT=0 switches a default client to one-shot runs.
    setenv("DUCK_PERSISTENT", "0", 1);
    DuckClientOptions o = ClientOptions(**cluster);
    o.read_environment = true;
    auto client = DuckClient::Create(o);
    unsetenv("DUCK_PERSISTENT");
    ASSERT_TRUE(client.ok());
    EXPECT_FALSE((*client)->persistent());
  }
}

// The weight cache: miss, hit, hit after a restart (no upload at all), forced
// invalidation, another model key or tp rank, and a partial resume.
TEST(Duckd, WeightCacheHitMissInvalidateRestart) {
  auto cluster = LocalCluster::Start(ClusterOptions(1, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string dir = (*cluster)->cache_dir();
  TestImage a(31, 1, 0, dir), b(32, 1, 0, dir), a1(31, 2, 1, dir);
  const std::vector<uint8_t> elf = ReadFile(DUCK_ELF_PATH);
  auto prepare = [&](const TestImage &img, bool invalidate) {
    auto client = DuckClient::Create(ClientOptions(**cluster));
    EXPECT_TRUE(client.ok()) << client.status();
    duck::runtime::PrepareOptions po;
    po.invalidate = invalidate;
    int calls = 0;
    po.progress = [&](const duck::runtime::PrepareProgress &p) {
      ++calls;
      EXPECT_LE(p.bytes_done, p.bytes_total);
    };
    auto rep = (*client)->Prepare({img.path}, po);
    EXPECT_TRUE(rep.ok()) << rep.status();
    EXPECT_GE(calls, 1);
    // Runtime descriptors are rebuilt either way: a step must work.
    EXPECT_TRUE((*client)->Open(elf).ok());
    std::vector<DuckOutput> out;
    auto x = RandomX(kHidden, 5);
    auto routing = RandomRouting(1, 4, 8, 6);
    auto ib = MakeIb(DUCK_MODE_MOE_DECODE_SMP, 1, 1, 4, routing, x);
    std::vector<absl::Span<const uint8_t>> ibs = {ib};
    absl::Status s = (*client)->Step(ibs, &out);
    EXPECT_TRUE(s.ok()) << s;
    if (s.ok())
      ExpectBitIdentical(OutOf(out[0]),
                         Reference(img.bytes).Run(DUCK_MODE_MOE_DECODE_SMP, 1,
                                                  1, 4, routing, x),
                         "step after prepare");
    return std::make_pair(rep->result[0], rep->bytes_uploaded[0]);
  };
  EXPECT_EQ(prepare(a, false),
            std::make_pair(DUCKD_CACHE_MISS, UploadBytes(a.bytes)));
  EXPECT_EQ(prepare(a, false), std::make_pair(DUCKD_CACHE_HIT, uint64_t(0)));
  ASSERT_TRUE((*cluster)->Restart(0).ok());
  {
    auto client = DuckClient::Create(ClientOptions(**cluster));
    ASSERT_TRUE(client.ok());
    const auto &h = (*client)->hello(0);
    EXPECT_TRUE(h.cache_valid);
    EXPECT_TRUE(h.head_finished);
    EXPECT_EQ(h.finished_slots, 3u);
    EXPECT_EQ(h.finished_bitmap, std::vector<uint8_t>{7});
  }
  EXPECT_EQ(prepare(a, false), std::make_pair(DUCKD_CACHE_HIT, uint64_t(0)));
  EXPECT_EQ(prepare(a, true).first, DUCKD_CACHE_MISS); // --invalidate
  EXPECT_EQ(prepare(a, false).first, DUCKD_CACHE_HIT);
  EXPECT_EQ(prepare(b, false).first, DUCKD_CACHE_MISS); // another model key
  EXPECT_EQ(prepare(a1, false).first, DUCKD_CACHE_MISS); // another tp/rank
  EXPECT_EQ(prepare(a, false).first, DUCKD_CACHE_MISS);

  // Overwrite slot 1 with a raw prepare_write: only that slot loses its
  // flag, and the next prepare re-sends just that slot.
  {
    auto client = DuckClient::Create(ClientOptions(**cluster));
    ASSERT_TRUE(client.ok());
  }
  const auto *table = reinterpret_cast<const duck_slot_entry *>(
      a.bytes.data() + DUCK_IMAGE_HEADER_BYTES);
  {
    const auto ep = (*cluster)->endpoints()[0];
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(ep.port);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa), 0);
    const absl::Time dl = absl::Now() + absl::Seconds(5);
    duckd_hello_request hr{DUCK_ABI_VERSION, DUCKD_PROTOCOL_VERSION, DUCKD_AUTH_NONE, 0, {}};
    duck::duckd::Part hp{&hr, sizeof hr};
    ASSERT_TRUE(duck::duckd::WriteFrame(fd, DUCKD_MSG_HELLO, 0, 1, {&hp, 1}, dl).ok());
    ASSERT_TRUE(duck::duckd::ReadFrame(fd, 1 << 20, dl).ok());
    duckd_prepare_write_request w{table[1].offset, 4096};
    std::vector<uint8_t> junk(4096, 0xAB);
    duck::duckd::Part parts[] = {{&w, sizeof w}, {junk.data(), junk.size()}};
    ASSERT_TRUE(duck::duckd::WriteFrame(fd, DUCKD_MSG_PREPARE_WRITE, 0, 2,
                                        parts, dl)
                    .ok());
    auto f = duck::duckd::ReadFrame(fd, 1 << 20, dl);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->header.flags, uint32_t(DUCKD_FLAG_REPLY));
    close(fd);
  }
  {
    auto client = DuckClient::Create(ClientOptions(**cluster));
    ASSERT_TRUE(client.ok());
    EXPECT_EQ((*client)->hello(0).finished_slots, 2u);
    EXPECT_EQ((*client)->hello(0).finished_bitmap, std::vector<uint8_t>{5});
  }
  EXPECT_EQ(prepare(a, false),
            std::make_pair(DUCKD_CACHE_PARTIAL, uint64_t(table[1].bytes)));
  EXPECT_EQ(prepare(a, false).first, DUCKD_CACHE_HIT);
}

// duckd killed mid-upload: after a restart no slot of the new image is
// marked finished (nor any of the old one), and a new prepare completes.
/// A prepare whose caller asks it to stop (Ctrl-C, a server stopping)
/// sends no more chunks and returns Cancelled; each duck keeps the slots
/// that arrived whole, so the next prepare sends only the rest, and steps
/// are then bit-exact.
TEST(Duckd, CancelledPrepareKeepsWholeSlotsAndTheNextOneSendsTheRest) {
  auto cluster = LocalCluster::Start(ClusterOptions(1, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TestImage a(41, 1, 0, (*cluster)->cache_dir());
  const auto *table = reinterpret_cast<const duck_slot_entry *>(
      a.bytes.data() + DUCK_IMAGE_HEADER_BYTES);
  const auto *head =
      reinterpret_cast<const duck_image_header *>(a.bytes.data());
  ASSERT_GE(head->slot_count, 2u);
  auto cancelledPrepare = [&](bool stopAtOnce) {
    auto client = DuckClient::Create(ClientOptions(**cluster));
    ASSERT_TRUE(client.ok()) << client.status();
    std::atomic<bool> stop{stopAtOnce};
    duck::runtime::PrepareOptions po;
    po.cancel = &stop;
    po.progress_interval = absl::ZeroDuration();
    // Stopped once the first chunk (the head) is answered: the slot in
    // flight beside it still arrives.
    po.progress = [&](const duck::runtime::PrepareProgress &p) {
      if (p.bytes_done > 0)
        stop.store(true);
    };
    auto rep = (*client)->Prepare({a.path}, po);
    ASSERT_FALSE(rep.ok());
    EXPECT_TRUE(absl::IsCancelled(rep.status())) << rep.status();
    EXPECT_NE(rep.status().message().find("the next prepare sends the rest"),
              std::string::npos)
        << rep.status();
  };
  auto prepare = [&] {
    auto client = DuckClient::Create(ClientOptions(**cluster));
    EXPECT_TRUE(client.ok()) << client.status();
    auto rep = (*client)->Prepare({a.path});
    EXPECT_TRUE(rep.ok()) << rep.status();
    EXPECT_TRUE((*client)->Open(ReadFile(DUCK_ELF_PATH)).ok());
    std::vector<DuckOutput> out;
    auto x = RandomX(kHidden, 7);
    auto routing = RandomRouting(1, 4, 8, 9);
    auto ib = MakeIb(DUCK_MODE_MOE_DECODE_SMP, 1, 1, 4, routing, x);
    std::vector<absl::Span<const uint8_t>> ibs = {ib};
    EXPECT_TRUE((*client)->Step(ibs, &out).ok());
    if (!out.empty())
      ExpectBitIdentical(
          OutOf(out[0]),
          Reference(a.bytes).Run(DUCK_MODE_MOE_DECODE_SMP, 1, 1, 4, routing, x),
          "step after a cancelled prepare");
    return std::make_pair(rep->result[0], rep->bytes_uploaded[0]);
  };
  // Stopped before anything was sent: the next prepare (the same image,
  // nothing finished: partial) sends everything.
  cancelledPrepare(true);
  EXPECT_EQ(prepare(),
            std::make_pair(DUCKD_CACHE_PARTIAL, UploadBytes(a.bytes)));
  // Stopped once the head is answered (the chunks in flight beside it
  // still arrive): the next prepare sends the slots that were not.
  {
    auto client = DuckClient::Create(ClientOptions(**cluster));
    ASSERT_TRUE(client.ok());
    duck::runtime::PrepareOptions po;
    po.invalidate = true; // start again from nothing
    std::atomic<bool> stop{true};
    po.cancel = &stop;
    ASSERT_FALSE((*client)->Prepare({a.path}, po).ok());
  }
  cancelledPrepare(false);
  uint64_t slots = 0;
  for (uint32_t s = 0; s < head->slot_count; ++s)
    slots += table[s].bytes;
  const auto [result, sent] = prepare();
  EXPECT_EQ(result, DUCKD_CACHE_PARTIAL);
  EXPECT_GT(sent, 0u);                   // some slots were not sent before
  EXPECT_LT(sent, slots);                // and not all of them: some were kept
  EXPECT_LT(sent, UploadBytes(a.bytes)); // nor the head
}

TEST(Duckd, CrashMidPrepareNeverLeavesAHalfSlotFinished) {
  auto cluster = LocalCluster::Start(ClusterOptions(1, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string dir = (*cluster)->cache_dir();
  SyntheticSlot big;
  big.kind = DUCK_SLOT_MOE;
  big.layer = 3;
  big.inter = 256;
  big.experts = 48; // ~5 MiB: many 256 KiB chunks
  TestImage a(41, 1, 0, dir), b(42, 1, 0, dir, {big});
  {
    auto client = DuckClient::Create(ClientOptions(**cluster));
    ASSERT_TRUE(client.ok());
    ASSERT_TRUE((*client)->Prepare({a.path}).ok());
  }
  {
    DuckClientOptions o = ClientOptions(**cluster);
    o.prepare_chunk_bytes = 256 << 10;
    auto client = DuckClient::Create(o);
    ASSERT_TRUE(client.ok());
    bool killed = false;
    duck::runtime::PrepareOptions po;
    po.progress_interval = absl::ZeroDuration();
    auto &c = **cluster;
    po.progress = [&](const duck::runtime::PrepareProgress &p) {
      if (!killed && p.bytes_done >= (1u << 20)) {
        killed = true;
        kill(c.pid(0), SIGKILL);
      }
    };
    auto rep = (*client)->Prepare({b.path}, po);
    ASSERT_TRUE(killed);
    ASSERT_FALSE(rep.ok());
    EXPECT_NE(rep.status().message().find(c.endpoints()[0].ToString()),
              std::string::npos)
        << rep.status();
  }
  (void)(*cluster)->Kill(0, SIGKILL); // reap it
  ASSERT_TRUE((*cluster)->Restart(0).ok());
  {
    auto client = DuckClient::Create(ClientOptions(**cluster));
    ASSERT_TRUE(client.ok()) << client.status();
    const auto &h = (*client)->hello(0);
    // The cache names image b (begin committed it) with nothing finished.
    EXPECT_TRUE(h.cache_valid);
    EXPECT_EQ(h.image.slot_count, 4u);
    EXPECT_EQ(h.image.total_bytes, b.bytes.size());
    EXPECT_LT(h.finished_slots, 4u);
    EXPECT_EQ(h.finished_slots, 0u);
    EXPECT_FALSE(h.head_finished);
    auto rep = (*client)->Prepare({b.path});
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_EQ(rep->result[0], DUCKD_CACHE_PARTIAL); // same image: resumed
    EXPECT_EQ((*client)->hello(0).finished_slots, 4u);
    ASSERT_TRUE((*client)->Open(ReadFile(DUCK_ELF_PATH)).ok());
    auto x = RandomX(kHidden, 8);
    auto routing = RandomRouting(1, 8, 48, 9);
    auto ib = MakeIb(DUCK_MODE_MOE_DECODE_SMP, 3, 1, 8, routing, x);
    std::vector<absl::Span<const uint8_t>> ibs = {ib};
    std::vector<DuckOutput> out;
    ASSERT_TRUE((*client)->Step(ibs, &out).ok());
    ExpectBitIdentical(
        OutOf(out[0]),
        Reference(b.bytes).Run(DUCK_MODE_MOE_DECODE_SMP, 3, 1, 8, routing, x),
        "after the resumed prepare");
  }
}

/// One persistent step of mode 4 on every duck.
absl::Status StepMoe(DuckClient &client, std::vector<DuckOutput> *out,
                     uint32_t mode = DUCK_MODE_MOE_DECODE_SMP) {
  auto ib = MakeIb(mode, 1, 1, 8, RandomRouting(1, 8, 8, 77),
                   RandomX(kHidden, 78));
  std::vector<absl::Span<const uint8_t>> ibs(client.size(), ib);
  return client.Step(ibs, out);
}

// A crashing ELF (SIGSEGV on one core mid-step) takes down only its worker:
// the step is an error naming the duck and the signal, the session is
// closed, the daemon and its weight cache keep serving, and a new session
// gives the same bits as before. The same after a stale-state scribble.
TEST(Duckd, CrashingElfClosesOnlyTheSession) {
  auto cluster = LocalCluster::Start(ClusterOptions(1, 2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TestImage a(51, 1, 0, (*cluster)->cache_dir());
  auto client = DuckClient::Create(ClientOptions(**cluster));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Prepare({a.path}).ok());
  const auto elf = ReadFile(DUCK_TEST_ELF_PATH);
  ASSERT_TRUE((*client)->Open(elf).ok());
  std::vector<DuckOutput> first, out;
  ASSERT_TRUE(StepMoe(**client, &first).ok());

  auto crash = MakeIb(100, 0, 0, 0, {}, {});
  std::vector<absl::Span<const uint8_t>> ibs = {crash};
  absl::Status s = (*client)->Step(ibs, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("SIGSEGV"), std::string::npos) << s;
  EXPECT_NE(s.message().find((*cluster)->endpoints()[0].ToString()),
            std::string::npos)
      << s;
  s = StepMoe(**client, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;

  ASSERT_TRUE((*client)->Open(elf).ok());
  ASSERT_TRUE(StepMoe(**client, &out).ok());
  EXPECT_EQ(out[0].ob, first[0].ob);
  auto scribble = MakeIb(102, 0, 0, 0, {}, {});
  ibs = {scribble};
  ASSERT_TRUE((*client)->Step(ibs, &out).ok());
  ASSERT_TRUE(StepMoe(**client, &out).ok());
  EXPECT_EQ(out[0].ob, first[0].ob);
  ASSERT_TRUE(StepMoe(**client, &out, DUCK_MODE_MOE_DECODE).ok());
  EXPECT_EQ(out[0].ob, first[0].ob);
  ASSERT_TRUE((*client)->Refresh().ok());
  EXPECT_EQ((*client)->hello(0).finished_slots, 3u);

  // One-shot runs crash the same way and recover the same way.
  client->reset();
  DuckClientOptions o = ClientOptions(**cluster);
  o.persistent = false;
  auto runner = DuckClient::Create(o);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_TRUE((*runner)->Open(elf).ok());
  ibs = {crash};
  s = (*runner)->Step(ibs, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  ASSERT_TRUE(StepMoe(**runner, &out).ok());
  EXPECT_EQ(out[0].ob, first[0].ob);
}

// The worker runs the uploaded ELF under seccomp: code that opens a file or
// a socket, or forks, is killed with SIGSYS before the call does anything;
// the step is an error naming the signal, the daemon goes on serving, and a
// new session gives the same bits as before. Session and one-shot workers.
TEST(Duckd, SandboxStopsForbiddenSystemCalls) {
  auto cluster = LocalCluster::Start(ClusterOptions(1, 2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TestImage a(71, 1, 0, (*cluster)->cache_dir());
  auto client = DuckClient::Create(ClientOptions(**cluster));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Prepare({a.path}).ok());
  const auto elf = ReadFile(DUCK_TEST_ELF_PATH);
  ASSERT_TRUE((*client)->Open(elf).ok());
  std::vector<DuckOutput> first, out;
  ASSERT_TRUE(StepMoe(**client, &first).ok());
  for (uint32_t mode : {103u, 104u, 105u}) { // open, socket, fork
    auto bad = MakeIb(mode, 0, 0, 0, {}, {});
    std::vector<absl::Span<const uint8_t>> ibs = {bad};
    absl::Status s = (*client)->Step(ibs, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << "mode " << mode << s;
    EXPECT_NE(s.message().find("SIGSYS"), std::string::npos) << s;
    ASSERT_TRUE((*client)->Open(elf).ok());
    ASSERT_TRUE(StepMoe(**client, &out).ok());
    EXPECT_EQ(out[0].ob, first[0].ob);
  }
  client->reset();
  DuckClientOptions o = ClientOptions(**cluster);
  o.persistent = false;
  auto runner = DuckClient::Create(o);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_TRUE((*runner)->Open(elf).ok());
  auto open = MakeIb(103, 0, 0, 0, {}, {});
  std::vector<absl::Span<const uint8_t>> ibs = {open};
  absl::Status s = (*runner)->Step(ibs, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("SIGSYS"), std::string::npos) << s;
  ASSERT_TRUE(StepMoe(**runner, &out).ok());
  EXPECT_EQ(out[0].ob, first[0].ob);
}

// A hung step (the ELF never returns) is a clear error naming the duck after
// the client's step timeout, not a hang; duckd notices the host leaving,
// kills the worker and serves the next host.
TEST(Duckd, HungStepIsAnErrorNamingTheDuck) {
  auto cluster = LocalCluster::Start(ClusterOptions(2, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string dir = (*cluster)->cache_dir();
  std::vector<std::string> paths = {TestImage(61, 2, 0, dir).path,
                                    TestImage(62, 2, 1, dir).path};
  const auto elf = ReadFile(DUCK_TEST_ELF_PATH);
  std::vector<DuckOutput> first, out;
  {
    DuckClientOptions o = ClientOptions(**cluster);
    o.step_timeout = absl::Milliseconds(800);
    auto client = DuckClient::Create(o);
    ASSERT_TRUE(client.ok());
    ASSERT_TRUE((*client)->Prepare(paths).ok());
    ASSERT_TRUE((*client)->Open(elf).ok());
    ASSERT_TRUE(StepMoe(**client, &first).ok());
    // Duck 1 hangs, duck 0 answers normally.
    auto hang = MakeIb(101, 0, 0, 0, {}, {});
    auto ok = MakeIb(DUCK_MODE_DENSE_PREPARE, 0, 0, 0, {}, {});
    std::vector<absl::Span<const uint8_t>> ibs = {ok, hang};
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = (*client)->Step(ibs, &out);
    const double secs = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find((*cluster)->endpoints()[1].ToString()),
              std::string::npos)
        << s;
    EXPECT_EQ(s.message().find((*cluster)->endpoints()[0].ToString()),
              std::string::npos)
        << s;
    EXPECT_LT(secs, 5.0);
    EXPECT_EQ(out[0].status, DUCK_STATUS_OK);
  }
  // The next host gets both ducks back (duck 1 may need a moment to notice).
  absl::StatusOr<std::unique_ptr<DuckClient>> client;
  for (int i = 0; i < 100; ++i) {
    client = DuckClient::Create(ClientOptions(**cluster));
    if (client.ok())
      break;
    usleep(20000);
  }
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Open(elf).ok());
  ASSERT_TRUE(StepMoe(**client, &out).ok());
  EXPECT_EQ(out[0].ob, first[0].ob);
  EXPECT_EQ(out[1].ob, first[1].ob);
}

// duckd's own step deadline (--step_timeout_ms): a hung ELF is killed and
// the host gets a timeout reply for that step, in a session and in a run;
// the daemon keeps serving.
TEST(Duckd, DaemonStepTimeoutKillsTheWorker) {
  LocalClusterOptions lo = ClusterOptions(1, 2);
  lo.extra_args.push_back("--step_timeout_ms=400");
  auto cluster = LocalCluster::Start(lo);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TestImage a(81, 1, 0, (*cluster)->cache_dir());
  const auto elf = ReadFile(DUCK_TEST_ELF_PATH);
  auto hang = MakeIb(101, 0, 0, 0, {}, {});
  std::vector<absl::Span<const uint8_t>> ibs = {hang};
  std::vector<DuckOutput> first, out;
  for (bool persistent : {true, false}) {
    DuckClientOptions o = ClientOptions(**cluster);
    o.persistent = persistent;
    auto client = DuckClient::Create(o);
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->Prepare({a.path}).ok());
    ASSERT_TRUE((*client)->Open(elf).ok());
    ASSERT_TRUE(StepMoe(**client, &out).ok());
    if (first.empty())
      first = out;
    EXPECT_EQ(out[0].ob, first[0].ob);
    absl::Status s = (*client)->Step(ibs, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("did not finish within"), std::string::npos)
        << s;
    if (persistent) {
      EXPECT_EQ(StepMoe(**client, &out).code(),
                absl::StatusCode::kFailedPrecondition);
      ASSERT_TRUE((*client)->Open(elf).ok());
    }
    ASSERT_TRUE(StepMoe(**client, &out).ok());
    EXPECT_EQ(out[0].ob, first[0].ob);
  }
}

// One host at a time: a second one is refused with a clear "busy" message.
TEST(Duckd, SecondHostIsRefusedAsBusy) {
  auto cluster = LocalCluster::Start(ClusterOptions(1, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TestImage a(71, 1, 0, (*cluster)->cache_dir());
  auto first = DuckClient::Create(ClientOptions(**cluster));
  ASSERT_TRUE(first.ok());
  auto second = DuckClient::Create(ClientOptions(**cluster));
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("busy: serving a host from"),
            std::string::npos)
      << second.status();
  ASSERT_TRUE((*first)->Prepare({a.path}).ok());
  ASSERT_TRUE((*first)->Open(ReadFile(DUCK_ELF_PATH)).ok());
  second = DuckClient::Create(ClientOptions(**cluster));
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("busy: serving session 1 from 127.0.0.1:"),
            std::string::npos)
      << second.status();
  first->reset();
  second = DuckClient::Create(ClientOptions(**cluster));
  EXPECT_TRUE(second.ok()) << second.status();
}

// A connection that never says hello, or a host idle without a session,
// gives the duck to the next host after its timeout instead of holding it
// busy; a host that is working keeps it (the test above).
TEST(Duckd, SilentOrIdleHostYieldsTheDuck) {
  LocalClusterOptions lo = ClusterOptions(1, 1);
  lo.extra_args.push_back("--hello_timeout_ms=300");
  lo.extra_args.push_back("--idle_timeout_ms=600");
  auto cluster = LocalCluster::Start(lo);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // A raw TCP connection that says nothing.
  int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((*cluster)->endpoints()[0].port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(silent, reinterpret_cast<sockaddr *>(&sa), sizeof sa), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto early = DuckClient::Create(ClientOptions(**cluster));
  EXPECT_FALSE(early.ok()) << "a silent connection within its hello timeout";
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto second = DuckClient::Create(ClientOptions(**cluster));
  ASSERT_TRUE(second.ok()) << second.status();
  // The second host said hello but opens no session: after the idle
  // timeout a third host takes the duck and the second's connection ends.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  auto third = DuckClient::Create(ClientOptions(**cluster));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE((*second)->Refresh().ok());
  EXPECT_TRUE((*third)->Refresh().ok());
  ::close(silent);
}

namespace auth {

using duck::duckd::FrameKeys;
using duck::duckd::Part;

int ConnectTo(const duck::runtime::DuckEndpoint &ep) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(ep.port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa), 0);
  return fd;
}

/// The bytes of one frame as it goes on the wire.
std::string FrameBytes(uint16_t type, uint32_t id, const void *payload,
                       size_t bytes, FrameKeys *keys) {
  Part p{payload, bytes};
  duckd_frame_header h = duck::duckd::MakeHeader(type, 0, id, {&p, 1}, keys);
  std::string out(reinterpret_cast<const char *>(&h), sizeof h);
  out.append(static_cast<const char *>(payload), bytes);
  return out;
}

void Send(int fd, const std::string &bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            ssize_t(bytes.size()));
}

/// True when the peer closes within 3 s.
bool Closed(int fd) {
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) > 0) {
      char c;
      ssize_t n = ::recv(fd, &c, 1, 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET))
        return true;
    }
  }
  return false;
}

/// An authenticated connection: hello sealed with the token, the reply
/// checked, the keys of the frames to come.
struct Connection {
  int fd = -1;
  FrameKeys keys;
  std::string hello_bytes; // what went on the wire, for replays
  Connection(const duck::runtime::DuckEndpoint &ep, const std::string &token) {
    fd = ConnectTo(ep);
    auto hello = duck::duckd::BeginHello(token);
    EXPECT_TRUE(hello.ok());
    FrameKeys hk = hello->keys;
    hello_bytes = FrameBytes(DUCKD_MSG_HELLO, 1, &hello->request,
                             sizeof hello->request, &hk);
    Send(fd, hello_bytes);
    auto reply = duck::duckd::ReadHelloReply(
        fd, *hello, 1 << 20, absl::Now() + absl::Seconds(5), &keys);
    EXPECT_TRUE(reply.ok()) << reply.status();
    EXPECT_TRUE(keys.keyed);
  }
  ~Connection() { ::close(fd); }
  /// Reads one sealed error reply; returns its code and message.
  std::pair<uint32_t, std::string> Error() {
    auto f = duck::duckd::ReadFrame(fd, 1 << 20,
                                    absl::Now() + absl::Seconds(5), &keys);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok())
      return {0, ""};
    EXPECT_TRUE(f->header.flags & DUCKD_FLAG_ERROR);
    auto e = duck::duckd::DecodeError(f->payload);
    EXPECT_TRUE(e.ok());
    return e.ok() ? std::make_pair(uint32_t(e->code), e->message)
                  : std::make_pair(0u, std::string());
  }
};

} // namespace auth

// With a token every frame carries a tag (HMAC-SHA256 keyed from the token
// and both sides' nonces) and the token itself never crosses the wire. A
// whole session (prepare over the wire, a persistent ELF session, one-shot
// runs) is bit-identical; a frame replayed, altered, unsealed, reflected or
// sealed with another token's key is refused and ends the connection; a
// replayed hello holds the duck no longer than the hello timeout.
TEST(Duckd, EveryFrameIsAuthenticated) {
  LocalClusterOptions lo = ClusterOptions(2, 1);
  lo.token = "s3cret-token";
  lo.extra_args.push_back("--hello_timeout_ms=400");
  auto cluster = LocalCluster::Start(lo);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string dir = (*cluster)->cache_dir();
  std::vector<TestImage> images = {TestImage(41, 2, 0, dir),
                                   TestImage(42, 2, 1, dir)};
  const std::vector<std::string> paths = {images[0].path, images[1].path};
  const std::vector<uint8_t> elf = ReadFile(DUCK_ELF_PATH);
  DuckClientOptions o = ClientOptions(**cluster);
  o.token = lo.token;
  for (bool persistent : {true, false}) {
    o.persistent = persistent;
    auto client = DuckClient::Create(o);
    ASSERT_TRUE(client.ok()) << client.status();
    auto rep = (*client)->Prepare(paths);
    ASSERT_TRUE(rep.ok()) << rep.status();
    ASSERT_TRUE((*client)->Open(elf).ok());
    RunEveryMode(**client, images, persistent ? "sealed session" : "sealed run");
    ASSERT_TRUE((*client)->Refresh().ok()); // a second hello, new keys
    RunEveryMode(**client, images, "after a second hello");
  }

  const duck::runtime::DuckEndpoint ep = (*cluster)->endpoints()[0];
  duckd_close_request close{12345};
  {
    auth::Connection c(ep, lo.token);
    EXPECT_EQ(c.hello_bytes.find(lo.token), std::string::npos);
    // A sealed request gets a sealed answer.
    const std::string frame =
        auth::FrameBytes(DUCKD_MSG_CLOSE, 2, &close, sizeof close, &c.keys);
    auth::Send(c.fd, frame);
    EXPECT_EQ(c.Error().first, uint32_t(DUCKD_ERR_NO_SESSION));
    // The very same bytes again: a replay.
    auth::Send(c.fd, frame);
    auto [code, message] = c.Error();
    EXPECT_EQ(code, uint32_t(DUCKD_ERR_UNAUTHORIZED));
    EXPECT_NE(message.find("frame authentication failed"), std::string::npos)
        << message;
    EXPECT_TRUE(auth::Closed(c.fd));
  }
  {
    auth::Connection c(ep, lo.token);
    std::string frame =
        auth::FrameBytes(DUCKD_MSG_CLOSE, 2, &close, sizeof close, &c.keys);
    frame.back() ^= 1; // altered in flight
    auth::Send(c.fd, frame);
    EXPECT_EQ(c.Error().first, uint32_t(DUCKD_ERR_UNAUTHORIZED));
    EXPECT_TRUE(auth::Closed(c.fd));
  }
  {
    auth::Connection c(ep, lo.token);
    auth::FrameKeys header = c.keys; // an altered header field (the request id)
    std::string frame =
        auth::FrameBytes(DUCKD_MSG_CLOSE, 2, &close, sizeof close, &header);
    frame[offsetof(duckd_frame_header, request_id)] ^= 4;
    auth::Send(c.fd, frame);
    EXPECT_EQ(c.Error().first, uint32_t(DUCKD_ERR_UNAUTHORIZED));
    EXPECT_TRUE(auth::Closed(c.fd));
  }
  {
    auth::Connection c(ep, lo.token);
    auth::Send(c.fd, auth::FrameBytes(DUCKD_MSG_CLOSE, 2, &close, sizeof close,
                                      nullptr)); // plain checksum only
    EXPECT_EQ(c.Error().first, uint32_t(DUCKD_ERR_UNAUTHORIZED));
    EXPECT_TRUE(auth::Closed(c.fd));
  }
  {
    auth::Connection c(ep, lo.token);
    auth::FrameKeys reflected = c.keys; // sealed as if duckd had sent it
    reflected.role = duck::duckd::kRoleDuck;
    auth::Send(c.fd, auth::FrameBytes(DUCKD_MSG_CLOSE, 2, &close, sizeof close,
                                      &reflected));
    EXPECT_EQ(c.Error().first, uint32_t(DUCKD_ERR_UNAUTHORIZED));
    EXPECT_TRUE(auth::Closed(c.fd));
  }
  {
    // Another connection's keys: same token, other nonces.
    auth::Connection a(ep, lo.token);
    auth::FrameKeys stolen = a.keys;
    ::close(a.fd);
    a.fd = -1;
    auth::Connection b(ep, lo.token);
    auth::Send(b.fd, auth::FrameBytes(DUCKD_MSG_CLOSE, 2, &close, sizeof close,
                                      &stolen));
    EXPECT_EQ(b.Error().first, uint32_t(DUCKD_ERR_UNAUTHORIZED));
    EXPECT_TRUE(auth::Closed(b.fd));
  }
  {
    // A hello replayed from a recording: duckd answers it (it cannot tell),
    // but the answer's key needs the token, so nothing after it verifies;
    // nor does it hold the duck past the hello timeout.
    std::string recorded;
    {
      auth::Connection c(ep, lo.token);
      recorded = c.hello_bytes;
    }
    int fd = auth::ConnectTo(ep);
    auth::Send(fd, recorded);
    auto reply = duck::duckd::ReadFrame(fd, 1 << 20,
                                        absl::Now() + absl::Seconds(5));
    EXPECT_FALSE(reply.ok()) << "a reply the replayer can verify";
    auto held = DuckClient::Create(o);
    EXPECT_FALSE(held.ok()) << "the duck is busy within the hello timeout";
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto next = DuckClient::Create(o);
    EXPECT_TRUE(next.ok()) << next.status();
    ::close(fd);
  }
}

// --token is checked at hello; a non-loopback --bind without a token is
// refused at start-up.
TEST(Duckd, TokenIsCheckedAtHello) {
  LocalClusterOptions lo = ClusterOptions(1, 1);
  lo.token = "s3cret";
  auto cluster = LocalCluster::Start(lo);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  DuckClientOptions o = ClientOptions(**cluster);
  auto client = DuckClient::Create(o);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(client.status().message().find("has a token"), std::string::npos)
      << client.status();
  o.token = "s3cre7";
  client = DuckClient::Create(o);
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("wrong token"), std::string::npos)
      << client.status();
  o.token = "s3cret";
  client = DuckClient::Create(o);
  EXPECT_TRUE(client.ok()) << client.status();
  // A host with a token refuses a duck without one (it could not prove
  // itself), and says what to do.
  auto open = LocalCluster::Start(ClusterOptions(1, 1));
  ASSERT_TRUE(open.ok()) << open.status();
  DuckClientOptions withToken = ClientOptions(**open);
  withToken.token = "s3cret";
  client = DuckClient::Create(withToken);
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("same --token"), std::string::npos)
      << client.status();

  FILE *p = popen(DUCKD_PATH " --port=0 --bind=0.0.0.0 2>&1", "r");
  ASSERT_NE(p, nullptr);
  char buf[512] = {};
  size_t n = fread(buf, 1, sizeof buf - 1, p);
  int rc = pclose(p);
  EXPECT_NE(WEXITSTATUS(rc), 0);
  EXPECT_NE(std::string(buf, n).find("needs --token"), std::string::npos)
      << buf;
}

} // namespace

namespace duck::runtime {
namespace {

// Three duckd's join the ducks' mesh on the host's request (`mesh`): each
// connects to the others over its --mesh-port listener, proves the shared
// token, and the all-reduce of their checks (1 + 2 + 3) comes back from
// every one of them; a second request replaces the mesh; a duckd started
// without --mesh-port refuses by name.
TEST(DuckdMesh, ThreeDucksJoinAndSumOverTheirOwnLinks) {
  LocalClusterOptions co = ClusterOptions(3, 1);
  co.extra_args.push_back("--mesh-port=0");
  co.token = "mesh test secret";
  auto cluster = LocalCluster::Start(co);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (const DuckEndpoint &e : (*cluster)->mesh_endpoints())
    ASSERT_NE(e.port, 0);
  DuckClientOptions o = ClientOptions(**cluster);
  o.token = co.token;
  auto client = DuckClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  // 3 groups of 1: one direct exchange; then the same over datagrams.
  for (uint32_t transport : {DUCKD_MESH_TCP, DUCKD_MESH_UDP})
    for (uint32_t groups : {1u, 3u}) {
      auto rep = (*client)->JoinMesh((*cluster)->mesh_endpoints(), {1, 2, 3},
                                     /*session=*/7 + groups, groups, transport);
      ASSERT_TRUE(rep.ok()) << rep.status();
      for (const duckd_mesh_reply &r : *rep) {
        EXPECT_EQ(r.check_sum, 6.0f);
        EXPECT_GT(r.bytes_sent, 0u);
      }
      // The joined mesh times collectives (mesh_probe) in any groups that
      // divide the ducks; 2 groups of 3 ducks are refused by name.
      for (uint32_t g : {1u, 3u}) {
        auto probe = (*client)->ProbeMesh({5, 1000, g, 1});
        ASSERT_TRUE(probe.ok()) << probe.status();
        for (const duckd_mesh_probe_reply &p : *probe) {
          EXPECT_EQ(p.collectives, 10u);
          EXPECT_GT(p.wall_ns, 0u);
          EXPECT_GT(p.bytes_sent, 0u);
        }
      }
      auto bad = (*client)->ProbeMesh({5, 1000, 2, 1});
      ASSERT_FALSE(bad.ok());
      EXPECT_NE(std::string(bad.status().message()).find("do not divide"),
                std::string::npos)
          << bad.status();
    }
  // The client still steps after the mesh requests (the ducks serve on).
  auto stats = (*client)->Stats();
  EXPECT_TRUE(stats.ok()) << stats.status();
}

TEST(DuckdMesh, ADuckWithoutAMeshPortRefusesByName) {
  auto cluster = LocalCluster::Start(ClusterOptions(1, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ((*cluster)->mesh_endpoints()[0].port, 0);
  auto client = DuckClient::Create(ClientOptions(**cluster));
  ASSERT_TRUE(client.ok());
  auto rep = (*client)->JoinMesh({{"127.0.0.1", 1}}, {1}, 1);
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(std::string(rep.status().message()).find("without --mesh-port"),
            std::string::npos)
      << rep.status();
}

} // namespace
} // namespace duck::runtime
