// duckd's memory scrub on loopback: a real duckd (LocalCluster), bytes of a
// finished slot changed in its weights file while it serves (the file is
// mapped MAP_SHARED, so a write to it changes the memory the duck reads),
// found by the scrub within a bounded time, the slot refused to steps with
// an error naming it (the other slots still run), and re-uploaded alone by
// the next prepare, after which the step is bit-identical again.
#include "DuckTestUtil.h"
#include "WeightCache.h"

#include "duck/runtime/cluster/DuckClient.h"
#include "duck/runtime/cluster/LocalCluster.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fcntl.h>
#include <fstream>
#include <iterator>
#include <thread>
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

std::vector<float> OutOf(const DuckOutput &o) {
  duck_ob_header h;
  std::memcpy(&h, o.ob.data(), sizeof h);
  std::vector<float> v(uint64_t(h.n_tokens) * h.hidden);
  if (o.ob.size() >= h.out_offset + v.size() * 4)
    std::memcpy(v.data(), o.ob.data() + h.out_offset, v.size() * 4);
  return v;
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

/// Polls the duck's stats until `done` holds (at most `limit`).
template <typename F>
duckd_stats_reply WaitStats(DuckClient &client, absl::Duration limit, F done) {
  const absl::Time until = absl::Now() + limit;
  for (;;) {
    auto st = client.Stats();
    EXPECT_TRUE(st.ok()) << st.status();
    if (!st.ok())
      return {};
    if (done((*st)[0]) || absl::Now() > until)
      return (*st)[0];
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TEST(DuckdScrub, DamagedSlotIsFoundRefusedAndUploadedAgain) {
  LocalClusterOptions co;
  co.ducks = 1;
  co.cores = 1;
  co.duckd_path = DUCKD_PATH;
  co.weights_size = 16 << 20;
  co.extra_args = {"--spin_us=50", "--scrub-mbps=200"};
  // Our own directory: the test reads the duck's log beside its cache.
  char tmpl[] = "/tmp/duckd-scrub-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  struct RemoveDir {
    std::string path;
    ~RemoveDir() { std::filesystem::remove_all(path); }
  } removeDir{dir};
  co.cache_dir = dir;
  co.log_dir = dir + "/logs";
  std::filesystem::create_directories(co.log_dir);
  auto cluster = LocalCluster::Start(co);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  SyntheticSpec spec = TestSpec(61);
  spec.tp_size = 1;
  spec.tp_rank = 0;
  auto built = duck::duckd::BuildSyntheticImage(spec);
  ASSERT_TRUE(built.ok()) << built.status();
  const std::vector<uint8_t> &img = *built;
  const std::string imagePath = dir + "/scrub-image.duckw";
  std::ofstream(imagePath, std::ios::binary)
      .write(reinterpret_cast<const char *>(img.data()),
             std::streamsize(img.size()));
  const auto *table = reinterpret_cast<const duck_slot_entry *>(
      img.data() + DUCK_IMAGE_HEADER_BYTES);
  const std::vector<uint8_t> elf = ReadFile(DUCK_ELF_PATH);

  auto x = RandomX(kHidden, 11);
  auto routing = RandomRouting(1, 4, 8, 12);
  const auto moeIb = MakeIb(DUCK_MODE_MOE_DECODE_SMP, 1, 1, 4, routing, x);
  const auto denseIb = MakeIb(DUCK_MODE_DENSE_DECODE, 0, 1, 0, {}, x);
  const std::vector<float> moeWant =
      Reference(img).Run(DUCK_MODE_MOE_DECODE_SMP, 1, 1, 4, routing, x);
  const std::vector<float> denseWant =
      Reference(img).Run(DUCK_MODE_DENSE_DECODE, 0, 1, 0, {}, x);
  auto step = [](DuckClient &c, const std::vector<uint8_t> &ib,
                 std::vector<float> *out) {
    std::vector<absl::Span<const uint8_t>> ibs = {ib};
    std::vector<DuckOutput> o;
    absl::Status s = c.Step(ibs, &o);
    if (s.ok())
      *out = OutOf(o[0]);
    return s;
  };

  auto client = DuckClient::Create(ClientOptions(**cluster));
  ASSERT_TRUE(client.ok()) << client.status();
  auto rep = (*client)->Prepare({imagePath});
  ASSERT_TRUE(rep.ok()) << rep.status();
  ASSERT_TRUE((*client)->Open(elf).ok());
  std::vector<float> got;
  ASSERT_TRUE(step(**client, moeIb, &got).ok());
  ExpectBitIdentical(got, moeWant, "before the damage");

  // An undamaged cache: the scrub passes over it and finds nothing.
  duckd_stats_reply st = WaitStats(
      **client, absl::Seconds(20),
      [](const duckd_stats_reply &s) { return s.scrub_passes >= 2; });
  EXPECT_EQ(st.scrub_bytes_per_second, 200000000u);
  ASSERT_GE(st.scrub_passes, 2u) << "the scrub never finished a pass";
  EXPECT_GE(st.scrub_slots, 6u);
  EXPECT_EQ(st.scrub_damaged, 0u);
  EXPECT_EQ(st.damaged_slots, 0u);
  EXPECT_EQ(st.finished_slots, 3u);
  EXPECT_GT(st.scrub_last_pass_unix_ms, 0u);

  // Three bytes of slot 1 changed in the weights file, under the running
  // duck (the session stays open): the mapping it serves from changes.
  std::string weights;
  for (const auto &e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".weights")
      weights = e.path().string();
  ASSERT_FALSE(weights.empty());
  auto flip = [&](uint32_t slot) {
    int fd = ::open(weights.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    for (uint64_t i = 0; i < 3; ++i) {
      const off_t at = off_t(DUCKD_CACHE_HEADER_BYTES + table[slot].offset +
                             700 + i * 1031);
      uint8_t b = 0;
      ASSERT_EQ(::pread(fd, &b, 1, at), 1);
      b ^= 0x24;
      ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
    }
    ::close(fd);
  };
  flip(1);
  st = WaitStats(**client, absl::Seconds(20), [](const duckd_stats_reply &s) {
    return s.scrub_damaged >= 1;
  });
  ASSERT_EQ(st.scrub_damaged, 1u) << "the scrub did not find the damage";
  EXPECT_EQ(st.damaged_slots, 1u);
  EXPECT_EQ(st.finished_slots, 2u);

  // A step on the damaged slot fails naming it; the others still run.
  absl::Status s = step(**client, moeIb, &got);
  ASSERT_FALSE(s.ok()) << "a step ran on a damaged slot";
  EXPECT_NE(s.message().find("slot 1 (layer 1)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("damaged"), std::string::npos) << s;
  ASSERT_TRUE(step(**client, denseIb, &got).ok());
  ExpectBitIdentical(got, denseWant, "an undamaged slot beside the damaged");
  {
    std::ifstream log(dir + "/logs/duckd-local0.log");
    const std::string text((std::istreambuf_iterator<char>(log)),
                           std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("scrub: slot 1 (layer 1, moe;"), std::string::npos)
        << text;
  }
  client->reset();

  // The next prepare uploads exactly that slot; the step is right again.
  client = DuckClient::Create(ClientOptions(**cluster));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->hello(0).finished_slots, 2u);
  rep = (*client)->Prepare({imagePath});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->result[0], DUCKD_CACHE_PARTIAL);
  EXPECT_EQ(rep->bytes_uploaded[0], table[1].bytes);
  ASSERT_TRUE((*client)->Open(elf).ok());
  ASSERT_TRUE(step(**client, moeIb, &got).ok());
  ExpectBitIdentical(got, moeWant, "after the slot was uploaded again");
  st = (*(*client)->Stats())[0];
  EXPECT_EQ(st.damaged_slots, 0u);
  EXPECT_EQ(st.finished_slots, 3u);
  client->reset();

  // A host that stays connected after a cache hit (a hit sends no
  // prepare_finish) does not hold the scrub off: damage to slot 0 is
  // found while its session is open, and the step on it refused.
  client = DuckClient::Create(ClientOptions(**cluster));
  ASSERT_TRUE(client.ok()) << client.status();
  rep = (*client)->Prepare({imagePath});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->result[0], DUCKD_CACHE_HIT);
  ASSERT_TRUE((*client)->Open(elf).ok());
  ASSERT_TRUE(step(**client, denseIb, &got).ok());
  flip(0);
  st = WaitStats(**client, absl::Seconds(20), [](const duckd_stats_reply &s) {
    return s.scrub_damaged >= 2;
  });
  ASSERT_EQ(st.scrub_damaged, 2u) << "no scrub while a host held the duck";
  s = step(**client, denseIb, &got);
  ASSERT_FALSE(s.ok()) << "a step ran on a damaged slot";
  EXPECT_NE(s.message().find("slot 0 (layer 0)"), std::string::npos) << s;
}

TEST(DuckdScrub, ZeroTurnsItOff) {
  LocalClusterOptions co;
  co.ducks = 1;
  co.cores = 1;
  co.duckd_path = DUCKD_PATH;
  co.weights_size = 16 << 20;
  co.extra_args = {"--scrub-mbps=0"};
  auto cluster = LocalCluster::Start(co);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = DuckClient::Create(ClientOptions(**cluster));
  ASSERT_TRUE(client.ok()) << client.status();
  auto st = (*client)->Stats();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ((*st)[0].scrub_bytes_per_second, 0u);
  EXPECT_EQ((*st)[0].scrub_bytes, 0u);
}

} // namespace
