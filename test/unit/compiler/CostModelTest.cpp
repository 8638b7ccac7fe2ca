// The cost model (compiler/lib/CostModel) on hand-computed small cases.
#include "duck/CostModel/Candidates.h"
#include "duck/CostModel/CostModel.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace mlir::duck;
using namespace mlir::duck::cost;

namespace {

/// A dense FFN slice on duck `rank`: rows x hidden gate and up, hidden x
/// rows down, in 128-blocks, and `expertBytes` for all three.
FfnShard denseShard(int64_t rank, uint32_t rows, uint32_t hidden,
                    uint64_t expertBytes) {
  FfnShard s;
  s.rank = rank;
  s.localInter = rows;
  s.gate = s.up = {rows, hidden, 128};
  s.down = {hidden, rows, 128};
  s.expertBytes = expertBytes;
  s.slotBytes = expertBytes + 4096;
  return s;
}

/// `layers` dense FFN layers of hidden 1024 over `tp` ducks, `rows` of
/// each a duck.
ModelFacts denseLayers(int64_t tp, size_t layers, uint32_t rows,
                       uint64_t expertBytes) {
  ModelFacts m;
  m.tp = tp;
  FfnLayer l;
  l.hidden = 1024;
  for (int64_t r = 0; r < tp; ++r)
    l.shards.push_back(denseShard(r, rows, 1024, expertBytes));
  m.ffn.assign(layers, l);
  return m;
}

/// C(n, k) in doubles.
double choose(int n, int k) {
  double c = 1;
  for (int i = 0; i < k; ++i)
    c = c * double(n - i) / double(i + 1);
  return c;
}

TEST(CostModelTest, SlicedExpertsRunTopKOnEveryDuck) {
  // Every duck holds a slice of all 4 routed experts and of the shared
  // one (id 4): each runs top_k + 1 of its slices; the slower duck sets
  // the pace.
  std::vector<HeldExperts> held = {{0, 0, 5, 1e-3}, {1, 0, 5, 2e-3}};
  EXPECT_DOUBLE_EQ(expectedSlowest(held, true, 2, 4), 3 * 2e-3);
  // A dense layer: one slice each.
  EXPECT_DOUBLE_EQ(expectedSlowest({{0, 0, 1, 1e-3}, {1, 0, 1, 2e-3}}, false,
                                   1, 1),
                   2e-3);
}

TEST(CostModelTest, WholeExpertsTakeTheExpectedBusiestDuck) {
  // 4 experts, 2 per duck, a token's 2 of them: of the C(4,2) = 6 pairs,
  // 2 land both on one duck (2 s), 4 split (1 s): 8/6, not the mean 1.
  std::vector<HeldExperts> held = {{0, 0, 2, 1.0}, {1, 2, 4, 1.0}};
  EXPECT_NEAR(expectedSlowest(held, true, 2, 4), 8.0 / 6.0, 1e-12);
  // Duck 1 three times slower: {0,1} 2 s, {2,3} 6 s, the others 3 s.
  held[1].seconds = 3.0;
  EXPECT_NEAR(expectedSlowest(held, true, 2, 4), 20.0 / 6.0, 1e-12);
}

TEST(CostModelTest, ManyCombinationsAreSampled) {
  // C(64, 8) is far past 20000: 4096 seeded draws. 32 experts a duck: the
  // busiest duck's count is max(X, 8 - X), X hypergeometric.
  std::vector<HeldExperts> held = {{0, 0, 32, 1.0}, {1, 32, 64, 1.0}};
  double exact = 0;
  for (int x = 0; x <= 8; ++x)
    exact += choose(32, x) * choose(32, 8 - x) / choose(64, 8) *
             std::max(x, 8 - x);
  const double sampled = expectedSlowest(held, true, 8, 64);
  EXPECT_NEAR(sampled, exact, 0.05); // exact: 5.0225
  EXPECT_GT(sampled, 4.0);            // not the average, 4
  // The same plan always gets the same prediction.
  EXPECT_EQ(sampled, expectedSlowest(held, true, 8, 64));
}

/// One dense layer of 10 MB on one duck (256 x 1024 slices).
ModelFacts oneDenseLayer() {
  ModelFacts m;
  m.tp = 1;
  FfnLayer l;
  l.hidden = 1024;
  l.shards.push_back(denseShard(0, 256, 1024, 10'000'000));
  m.ffn.push_back(l);
  return m;
}

/// A duck reading at 10 GB/s, 80 us a step.
ClusterModel tenGbsEightyUs() {
  ClusterModel c;
  c.bandwidthGbs = 10;
  c.stepOverheadUs = 80;
  return c;
}

TEST(CostModelTest, DenseLayerIsBytesOverBandwidthPlusStep) {
  // 10 MB at 10 GB/s: 1 ms a token, plus the 80 us step.
  ModelFacts m = oneDenseLayer();
  ClusterModel c = tenGbsEightyUs();
  PlanCost p = costPlan(m, c);
  ASSERT_EQ(p.layers.size(), 1u);
  EXPECT_NEAR(p.layers[0].ms, 1.0, 1e-12);
  EXPECT_NEAR(p.streamMsPerToken, 1.0, 1e-12);
  EXPECT_NEAR(p.dispatchMsPerToken, 0.08, 1e-12);
  EXPECT_NEAR(p.tokS, 1e3 / 1.08, 1e-9);
  EXPECT_EQ(p.layers[0].duckBytes, std::vector<uint64_t>{10'004'096});
  EXPECT_DOUBLE_EQ(p.duckParamsPerToken[0], 3.0 * 256 * 1024);
  // A GEMV call's cost on top, for each of the three matrices.
  c.duckGemvCallUs = {10};
  EXPECT_NEAR(costPlan(m, c).layers[0].ms, 1.03, 1e-12);
}

// Speculative projection: a verify step of K+1 rows on a dense layer reads
// the same weights once (memory-bound), so with no wire its time is one
// row's and the speed-up is the tokens it yields, 1 + a + ... + a^K; the
// union of K+1 tokens' experts follows the closed form.
TEST(CostModelTest, SpeculativeProjectionCountsTokensAStepAndTheUnion) {
  EXPECT_NEAR(unionExperts(256, 8, 1), 8.0, 1e-9);
  EXPECT_NEAR(unionExperts(256, 8, 2), 256 * (1 - std::pow(248.0 / 256, 2)),
              1e-9);
  EXPECT_DOUBLE_EQ(unionExperts(4, 4, 3), 4.0);
  ModelFacts m = oneDenseLayer();
  ClusterModel c = tenGbsEightyUs();
  c.speculateDrafts = 2;
  c.speculateAcceptance = 0.5;
  PlanCost p = costPlan(m, c);
  ASSERT_EQ(p.speculative.rows, 3);
  EXPECT_NEAR(p.speculative.tokensPerStep, 1.75, 1e-12);
  EXPECT_NEAR(p.speculative.stepMs, 1.08, 1e-9);
  EXPECT_NEAR(p.speculative.speedup, 1.75, 1e-9);
  // On a wire the step carries every row: more time, less speed-up.
  c.hostLinkGbps = 1;
  c.duckLinkGbps = {1};
  PlanCost w = costPlan(m, c);
  EXPECT_GT(w.speculative.stepMs, 1e3 / w.tokS);
  EXPECT_LT(w.speculative.speedup, 1.75);
  // No drafts: no projection.
  c.speculateDrafts = 0;
  EXPECT_EQ(costPlan(m, c).speculative.rows, 0);
}

// An MTP module (ModelFacts::mtp) is no part of a token's cost; a
// speculative step runs it once over the accepted rows: its layer (1.08
// ms as the plan's) joins the verify step.
TEST(CostModelTest, MtpModuleRunsOnceAVerifyStepOnly) {
  ModelFacts m = oneDenseLayer();
  m.mtp = std::make_shared<ModelFacts>(oneDenseLayer());
  ClusterModel c = tenGbsEightyUs();
  EXPECT_NEAR(costPlan(m, c).tokS, 1e3 / 1.08, 1e-9);
  c.speculateDrafts = 1;
  c.speculateAcceptance = 0.9;
  const PlanCost p = costPlan(m, c);
  EXPECT_TRUE(p.speculative.mtp);
  EXPECT_NEAR(p.speculative.mtpMs, 1.08, 1e-9);
  EXPECT_NEAR(p.speculative.stepMs, 2.16, 1e-9);
  EXPECT_NEAR(p.speculative.speedup, 1.9 / 2, 1e-9);
}

TEST(CostModelTest, KernelClassRatesTimeEachMatrix) {
  // gate/up: K 1024 in 128-blocks (general128) at 1 Gparam/s; down: K 256
  // (general128 too) likewise: 3 x 262144 weights = 0.786432 ms.
  FfnShard s = denseShard(0, 256, 1024, 1);
  ClusterModel c;
  c.duckKernelGparamS = {{1.0}};
  EXPECT_NEAR(expertSeconds(s, c), 786432 / 1e9, 1e-15);
  // A class not measured falls back to the duck's rate (2 Gparam/s).
  s.down.block = 64; // general64
  c.fp9GparamS = 2.0;
  EXPECT_NEAR(expertSeconds(s, c), (2 * 262144 / 1e9) + 262144 / 2e9,
              1e-15);
}

TEST(CostModelTest, UnequalDucksTakeTheirOwnRates) {
  // Two ducks at 20 and 10 Gparam/s with the same slice: the slow one
  // takes twice as long and sets the layer's time; given rows in
  // proportion (2:1) they tie.
  ModelFacts m;
  m.tp = 2;
  FfnLayer l;
  l.hidden = 1000;
  l.shards = {denseShard(0, 500, 1000, 1), denseShard(1, 500, 1000, 1)};
  m.ffn.push_back(l);
  ClusterModel c;
  c.duckGparamS = {20, 10};
  EXPECT_NEAR(expertSeconds(l.shards[0], c), 1.5e6 / 20e9, 1e-15);
  EXPECT_NEAR(expertSeconds(l.shards[1], c), 1.5e6 / 10e9, 1e-15);
  EXPECT_NEAR(costPlan(m, c).layers[0].ms, 0.15, 1e-12);
  m.ffn[0].shards = {denseShard(0, 600, 1000, 1), denseShard(1, 300, 1000, 1)};
  EXPECT_NEAR(costPlan(m, c).layers[0].ms, 0.09, 1e-12);
}

TEST(CostModelTest, StepOnTheWire) {
  // A dense decode step, hidden 1024, 2 ducks of one core: each gets
  // 32 (frame) + 16 (request) + 4128 (IB: 32-byte header, 1024 floats)
  // = 4176 bytes and answers 32 + 32 (reply) + 8 (a core's time) + 64 (OB
  // header) + 4096 = 4232.
  ClusterModel c;
  StepWire w = stepWire(c, 1, 0, 1024, {1024, 1024});
  EXPECT_EQ(w.txBytes, 8352);
  EXPECT_EQ(w.rxBytes, 8464);
  EXPECT_EQ(w.seconds, 0); // no link speed: not counted
  // Over a 1 Gb/s host link (full duplex): the two frames go out one
  // after another; duck 0's reply comes back while duck 1's frame is
  // still going out, duck 1's after it.
  c.hostLinkGbps = 1;
  w = stepWire(c, 1, 0, 1024, {1024, 1024});
  EXPECT_NEAR(w.outSeconds, 2 * 4176 * 8 / 1e9, 1e-15);
  EXPECT_NEAR(w.seconds, (4176 + 2 * 4232) * 8 / 1e9, 1e-15);
  EXPECT_NEAR(w.backSeconds, w.seconds - w.outSeconds, 1e-15);
  EXPECT_EQ(w.latencySeconds, 0);
  // bf16 activations: 2 bytes less a value, to each duck.
  c.wireX = ClusterModel::Wire::bf16;
  EXPECT_EQ(stepWire(c, 1, 0, 1024, {1024, 1024}).txBytes, 8352 - 2 * 2048);
  // q8 activations: 1024 int8 values and 32 bf16 scales (1088 bytes, not
  // 4096), to each duck; q8 answers: each reply 1088 bytes of values.
  c.wireX = ClusterModel::Wire::q8;
  EXPECT_EQ(stepWire(c, 1, 0, 1024, {1024, 1024}).txBytes,
            8352 - 2 * (4096 - 1088));
  c.wireOut = ClusterModel::Wire::q8;
  EXPECT_EQ(stepWire(c, 1, 0, 1024, {1024, 1024}).rxBytes,
            2 * (4232 - 4096 + 1088));
  c.wireOut = ClusterModel::Wire::f32;
  // A slow duck link (0.1 Gb/s) is slower than the host's whole load.
  c.wireX = ClusterModel::Wire::f32;
  c.duckLinkGbps = {100, 0.1};
  EXPECT_NEAR(stepWire(c, 1, 0, 1024, {1024, 1024}).seconds,
              (4176 + 4232) * 8 / 0.1e9, 1e-15);
  // The one-way latency, twice a step.
  c.latencyUs = 50;
  w = stepWire(c, 1, 0, 1024, {1024, 1024});
  EXPECT_NEAR(w.latencySeconds, 100e-6, 1e-15);
  EXPECT_NEAR(w.seconds, (4176 + 4232) * 8 / 0.1e9 + 100e-6, 1e-15);
}

TEST(CostModelTest, UnicastOverlapsRepliesWithSending) {
  // 16 ducks, the host's port 10x a duck's link, frames of u = 1000 bytes
  // each way (one unit: u at the host's rate). Ducks 0-9 have their frame
  // at 10 units (their own links), ducks 10-15 at 11-16 (the host's port,
  // one copy after another). Ducks 0-9's replies fill the host's inbound
  // port from 10 to 20, ducks 10-15's each reach it 10 units after their
  // frame: the last at 26 units, not 16 + 16 as two separate directions.
  ClusterModel c;
  c.hostLinkGbps = 10;
  c.duckLinkGbps.assign(16, 1);
  const double unit = 1000 * 8 / 10e9;
  StepWire w = unicastWire(c, 1000, std::vector<double>(16, 1000));
  EXPECT_NEAR(w.outSeconds, 16 * unit, 1e-15);
  EXPECT_NEAR(w.seconds, 26 * unit, 1e-15);
  EXPECT_EQ(w.txBytes, 16000);
  EXPECT_EQ(w.rxBytes, 16000);
  // At 4 ducks every duck's own link is the bound: in / D + out / D.
  c.duckLinkGbps.assign(4, 1);
  EXPECT_NEAR(unicastWire(c, 1000, std::vector<double>(4, 1000)).seconds,
              20 * unit, 1e-15);
  // Nothing limited and no latency: nothing counted.
  ClusterModel free;
  EXPECT_EQ(unicastWire(free, 1000, {1000, 1000}).seconds, 0);
}

TEST(CostModelTest, RelayTreeAgainstUnicast) {
  // 3 ducks, one copy from the host (K 1), each duck forwards to 2 (F 2);
  // the host's port 10 Gb/s, a duck's 1 Gb/s; 1000 bytes each way (8 us on
  // a duck's link, 0.8 on the host's), no reply header. Duck 0 has its
  // frame at 8 us; it forwards to duck 1 (16) and duck 2 (24). Duck 0's
  // inbound link takes duck 1's partial sums 16-24, duck 2's 24-32; duck 0
  // sends the sum up at 32, in at the host at 40 us.
  ClusterModel c;
  c.hostLinkGbps = 10;
  c.duckLinkGbps.assign(3, 1);
  c.fanout = ClusterModel::Fanout::relay;
  const std::vector<double> payload(3, 1000);
  StepWire w = relayWire(c, 1000, 0, payload, /*sums=*/true);
  EXPECT_NEAR(w.outSeconds, 24e-6, 1e-15);
  EXPECT_NEAR(w.seconds, 40e-6, 1e-15);
  EXPECT_EQ(w.txBytes, 1000); // one send a step
  EXPECT_EQ(w.rxBytes, 1000); // one vector of sums back
  // Unicast on the same links: every duck's own link is the bound, 16 us.
  EXPECT_NEAR(unicastWire(c, 1000, {1000, 1000, 1000}).seconds, 16e-6, 1e-15);
  // Rows gathered instead of summed: duck 0 sends 3000 bytes up (24 us).
  w = relayWire(c, 1000, 0, payload, /*sums=*/false);
  EXPECT_NEAR(w.seconds, 56e-6, 1e-15);
  EXPECT_EQ(w.rxBytes, 3000);
  // Each hop pays the latency: two down to duck 2, two back up.
  c.latencyUs = 50;
  w = relayWire(c, 1000, 0, payload, true);
  EXPECT_NEAR(w.latencySeconds, 200e-6, 1e-15);
  EXPECT_NEAR(w.seconds, 240e-6, 1e-15);
  EXPECT_NEAR(w.outSeconds + w.backSeconds + w.latencySeconds, w.seconds,
              1e-15);
}

TEST(CostModelTest, RelayTreeOnEqualLinks) {
  // 7 ducks, all links 1 Gb/s (8 us a frame), F 2: the last duck has its
  // frame at 40 us (8 + 16 + 16 down the last children) against unicast's
  // 56 (7 copies through the host's port); the sums come back level by
  // level, 64 us, as unicast's replies through the host's inbound port.
  ClusterModel c;
  c.hostLinkGbps = 1;
  c.duckLinkGbps.assign(7, 1);
  const std::vector<double> payload(7, 1000);
  StepWire u = unicastWire(c, 1000, payload);
  EXPECT_NEAR(u.outSeconds, 56e-6, 1e-15);
  EXPECT_NEAR(u.seconds, 64e-6, 1e-15);
  StepWire r = relayWire(c, 1000, 0, payload, true);
  EXPECT_NEAR(r.outSeconds, 40e-6, 1e-15);
  EXPECT_NEAR(r.seconds, 64e-6, 1e-15);
  // The host sending two copies (K 2): ducks 0 and 1 at 8 and 16 us.
  c.relayHostFanout = 2;
  EXPECT_LT(relayWire(c, 1000, 0, payload, true).seconds, r.seconds);
  // One duck: relay and unicast are the same step.
  c.duckLinkGbps.assign(1, 1);
  EXPECT_NEAR(relayWire(c, 1000, 0, {1000}, true).seconds,
              unicastWire(c, 1000, {1000}).seconds, 1e-15);
}

TEST(CostModelTest, RelayInPieces) {
  // A chain (F 1) of 3 ducks, every link 1 Gb/s, 4000-byte frames each
  // way. Whole frames (32 us a hop): the last duck has its frame at 96
  // us, the sums are in at the host at 192. In 1000-byte pieces (8 us):
  // duck 0 has its pieces at 8..32, duck 1 at 16..40, duck 2 at 24..48;
  // duck 2's sums reach duck 1 at 56..80, duck 0 at 64..88, the host at
  // 72..96 us.
  ClusterModel c;
  c.hostLinkGbps = 1;
  c.duckLinkGbps.assign(3, 1);
  c.relayFanout = 1;
  const std::vector<double> payload(3, 4000);
  StepWire w = relayWire(c, 4000, 0, payload, true);
  EXPECT_NEAR(w.outSeconds, 96e-6, 1e-15);
  EXPECT_NEAR(w.seconds, 192e-6, 1e-15);
  c.relayChunkBytes = 1000;
  w = relayWire(c, 4000, 0, payload, true);
  EXPECT_NEAR(w.outSeconds, 48e-6, 1e-15);
  EXPECT_NEAR(w.seconds, 96e-6, 1e-15);
  // Each hop's latency is paid once, not once a piece: 3 down, 3 up.
  c.latencyUs = 10;
  EXPECT_NEAR(relayWire(c, 4000, 0, payload, true).latencySeconds, 60e-6,
              1e-15);
}

TEST(CostModelTest, MulticastOnceFromTheHost) {
  // 16 ducks, the host's port 10 Gb/s, a duck's 1 Gb/s, 1000-byte frames
  // each way (one unit: 0.8 us, 1000 bytes at the host's rate). The IB
  // (1000 less the frame header and step request: 952 bytes) leaves the
  // host once as one datagram (976 bytes with its header), then each duck
  // its 96-byte step_cast frame: 2512 bytes through the host's port (2.512
  // units); each duck has its datagram and frame at 10.72 units (1072
  // bytes on its own link), where unicast's last has its copy at 16. The
  // replies to a star still queue at the host's inbound port (11.72 ..
  // 26.72): the step ends 0.72 units after unicast's 26.
  ClusterModel c;
  c.hostLinkGbps = 10;
  c.duckLinkGbps.assign(16, 1);
  c.fanout = ClusterModel::Fanout::multicast;
  const double unit = 1000 * 8 / 10e9;
  EXPECT_EQ(castBytes(952, 1432), 976);
  EXPECT_EQ(castBytes(3000, 1432), 3000 + 3 * 24); // 1408 + 1408 + 184
  const std::vector<double> payload(16, 1000);
  StepWire w = multicastWire(c, 1000, 0, payload, /*sums=*/true);
  EXPECT_NEAR(w.outSeconds, 10.72 * unit, 1e-15);
  EXPECT_NEAR(w.seconds, 26.72 * unit, 1e-15);
  EXPECT_EQ(w.txBytes, 976 + 16 * 96);
  EXPECT_EQ(w.rxBytes, 16000);
  // Partial sums up chains of two (K 8, F 1: duck 8 + i sends to duck i)
  // in 125-byte pieces (1.25 units on a duck's link): duck i has its
  // child's last piece at 20.72 units and its own last piece is in at the
  // host at 21.97; eight vectors come in, not sixteen.
  c.reduceTree = true;
  c.relayHostFanout = 8;
  c.relayFanout = 1;
  c.relayChunkBytes = 125;
  w = multicastWire(c, 1000, 0, payload, true);
  EXPECT_NEAR(w.outSeconds, 10.72 * unit, 1e-15);
  EXPECT_NEAR(w.seconds, 21.97 * unit, 1e-15);
  EXPECT_EQ(w.rxBytes, 8000);
  // A piece's CPU (the cluster file's mesh_message_us) delays the tree:
  // each duck's eight pieces leave one after another, at most 16 more
  // piece-costs end to end (the child's eight, then the parent's).
  ClusterModel cpu = c;
  cpu.meshMessageUs = 0.5;
  const double slower = multicastWire(cpu, 1000, 0, payload, true).seconds;
  EXPECT_GT(slower, w.seconds + 0.5e-6);
  EXPECT_LE(slower, w.seconds + 16 * 0.5e-6 + 1e-15);
  // Rows to gather go straight to the host, as the star's.
  EXPECT_NEAR(multicastWire(c, 1000, 0, payload, false).seconds, 26.72 * unit,
              1e-15);
  // A step whose ducks get inputs of their own goes as unicast.
  c.reduceTree = false;
  ClusterModel u = c;
  u.fanout = ClusterModel::Fanout::unicast;
  const std::vector<int64_t> k(16, 256), widths(16, 256);
  EXPECT_NEAR(stepWireEach(c, 1, k, widths, true).seconds,
              stepWireEach(u, 1, k, widths, true).seconds, 1e-15);
  // A latency counts twice a step for the star.
  c.latencyUs = 10;
  EXPECT_NEAR(multicastWire(c, 1000, 0, payload, true).latencySeconds, 20e-6,
              1e-15);
  // An IB over 64 KiB (eight rows of 4096 fp32 values) goes as unicast,
  // as the runtime sends it; one row is cast.
  c.latencyUs = 0;
  u.latencyUs = 0;
  const std::vector<int64_t> out(16, 4096);
  EXPECT_EQ(stepWire(c, 8, 0, 4096, out, true).txBytes,
            stepWire(u, 8, 0, 4096, out, true).txBytes);
  EXPECT_LT(stepWire(c, 1, 0, 4096, out, true).txBytes,
            stepWire(u, 1, 0, 4096, out, true).txBytes / 8);
}

TEST(CostModelTest, RelayTreeInThePlan) {
  // stepWire goes through the relay tree with Fanout::relay; a plan's FFN
  // steps sum (one vector back a step).
  ModelFacts m = denseLayers(4, 1, 64, 1'000'000);
  ClusterModel c;
  c.hostLinkGbps = 1;
  c.duckLinkGbps.assign(4, 1);
  const PlanCost uni = costPlan(m, c);
  c.fanout = ClusterModel::Fanout::relay;
  const PlanCost rel = costPlan(m, c);
  EXPECT_EQ(uni.hostTxBytesPerToken, 4 * rel.hostTxBytesPerToken);
  EXPECT_EQ(uni.hostRxBytesPerToken, 4 * rel.hostRxBytesPerToken);
  EXPECT_NE(uni.networkMsPerToken, rel.networkMsPerToken);
}

/// Two dense layers (hidden 1024), each split over two ducks.
ModelFacts twoDenseLayersOnTwoDucks() {
  return denseLayers(2, 2, 128, 1'000'000);
}

/// The same two layers as MoE layers of top-1 over `routed` experts and
/// `shared` shared ones, every duck holding a slice of each (their ids
/// 0 .. routed + shared - 1, shared ones last).
ModelFacts twoMoeLayersOnTwoDucks(int64_t routed, int64_t shared) {
  ModelFacts m = twoDenseLayersOnTwoDucks();
  for (FfnLayer &l : m.ffn) {
    l.moe = true;
    l.topK = 1;
    l.numExperts = routed;
    l.numShared = shared;
    for (FfnShard &s : l.shards)
      s.expertBegin = 0, s.expertEnd = routed + shared;
  }
  return m;
}

TEST(CostModelTest, NetworkJoinsTheTokenTime) {
  ModelFacts m = twoDenseLayersOnTwoDucks();
  ClusterModel c;
  c.hostLinkGbps = 1;
  PlanCost p = costPlan(m, c);
  EXPECT_EQ(p.hostTxBytesPerToken, 2 * 8352);
  EXPECT_EQ(p.hostRxBytesPerToken, 2 * 8464);
  EXPECT_NEAR(p.networkMsPerToken, 2 * (4176 + 8464) * 8 / 1e6, 1e-12);
  EXPECT_EQ(p.stepsPerToken, 2);
  EXPECT_NEAR(p.networkOutMsPerToken + p.networkBackMsPerToken +
                  p.networkLatencyMsPerToken,
              p.networkMsPerToken, 1e-12);
  EXPECT_NEAR(p.tokS,
              1e3 / (p.streamMsPerToken + 0.16 + p.networkMsPerToken), 1e-9);
}

// --stage-x (modelled only): a MoE step's x leaves while the host reads
// its router, so x's time out (the step's, less the same step without x)
// comes off the network, up to the router's read time.
TEST(CostModelTest, StagedXHidesBehindTheRouter) {
  ModelFacts m = twoMoeLayersOnTwoDucks(2, 0);
  ClusterModel c;
  c.hostLinkGbps = 1;
  c.hostReadGbs = 1; // 1 byte a ns
  const PlanCost plain = costPlan(m, c);
  c.stageX = true;
  // No router bytes (a dense layer's, or unknown): nothing hides.
  EXPECT_EQ(costPlan(m, c).stagedXMsPerToken, 0);
  // Each of the 2 ducks' x is 1024 floats: 2 x 4096 bytes out at 1 Gb/s,
  // 65.536 us a layer. A 10 KB router (10 us) hides 10 us of it; a 1 MB
  // one (1 ms) all of it.
  for (FfnLayer &l : m.ffn)
    l.routerHostBytes = 10'000;
  PlanCost p = costPlan(m, c);
  EXPECT_NEAR(p.stagedXMsPerToken, 2 * 0.010, 1e-12);
  EXPECT_NEAR(p.networkMsPerToken, plain.networkMsPerToken - 0.020, 1e-12);
  EXPECT_NEAR(p.networkOutMsPerToken, plain.networkOutMsPerToken - 0.020,
              1e-12);
  for (FfnLayer &l : m.ffn)
    l.routerHostBytes = 1'000'000;
  p = costPlan(m, c);
  EXPECT_NEAR(p.stagedXMsPerToken, 2 * 2 * 4096 * 8 / 1e6, 1e-12);
  // Without the host's read bandwidth the router's time is unknown.
  c.hostReadGbs = 0;
  EXPECT_EQ(costPlan(m, c).stagedXMsPerToken, 0);
}

// A step's overhead measured with one duck's ping (duck-measure-cluster:
// step_overhead_ducks 1) leaves out the host's frames to the other ducks
// of a step: two a duck at host_frame_us; a figure of the whole cluster's
// step (0, the seed's) is taken as it is.
TEST(CostModelTest, AStepOverheadOfOneDuckAddsTheOthersFrames) {
  ModelFacts m = twoDenseLayersOnTwoDucks();
  ClusterModel c = tenGbsEightyUs();
  c.hostFrameUs = 5;
  EXPECT_NEAR(stepOverheadMs(c, 32), 0.08, 1e-12);
  const double whole = costPlan(m, c).dispatchMsPerToken;
  EXPECT_NEAR(whole, 2 * 0.08, 1e-12);
  c.stepOverheadDucks = 1;
  EXPECT_NEAR(stepOverheadMs(c, 1), 0.08, 1e-12);
  EXPECT_NEAR(stepOverheadMs(c, 32), 0.08 + 2 * 31 * 5e-3, 1e-12);
  // Two ducks: one more duck's frame out and back a step, two steps.
  EXPECT_NEAR(costPlan(m, c).dispatchMsPerToken, 2 * (0.08 + 2 * 5e-3), 1e-12);
  c.hostFrameUs = 0; // not measured: nothing added
  EXPECT_NEAR(costPlan(m, c).dispatchMsPerToken, whole, 1e-12);
}

// --stage-shared: a MoE step's shared expert leaves with x before the
// router runs and the routed slots follow alone, so the router's time
// hides behind x's time out and the shared expert's time on the ducks
// (never more than the router's time), less the routed slots' frames.
// With multicast fanout a stage is one cast batch and no frame at all
// (protocol 5, step_staged): the host's cost a frame takes nothing off it.
TEST(CostModelTest, ACastStageAddsNoFrames) {
  ModelFacts m = twoMoeLayersOnTwoDucks(1, 1);
  for (FfnLayer &l : m.ffn)
    l.routerHostBytes = 10'000;
  ClusterModel c;
  c.hostLinkGbps = 1;
  c.hostReadGbs = 1;
  c.duckGparamS = {20, 20};
  c.stageShared = true;
  c.fanout = ClusterModel::Fanout::multicast;
  const PlanCost free = costPlan(m, c);
  c.hostFrameUs = 1.5;
  const PlanCost p = costPlan(m, c);
  EXPECT_GT(p.stagedSharedMsPerToken, 0);
  EXPECT_NEAR(p.stagedSharedMsPerToken, free.stagedSharedMsPerToken, 1e-12);
  EXPECT_EQ(p.stagedFramesPerToken, 0);
  c.fanout = ClusterModel::Fanout::unicast; // a quiet frame a duck
  EXPECT_EQ(costPlan(m, c).stagedFramesPerToken, 4);
}

TEST(CostModelTest, StagedSharedExpertHidesTheRouter) {
  ModelFacts m = twoMoeLayersOnTwoDucks(1, 1); // 0 routed, 1 shared
  ClusterModel c;
  c.hostLinkGbps = 1;
  c.hostReadGbs = 1; // 1 byte a ns
  c.duckGparamS = {20, 20};
  c.stageShared = true;
  EXPECT_EQ(costPlan(m, c).stagedSharedMsPerToken, 0); // no router bytes
  // The pieces: the whole step out (two ducks' 4208-byte frames at 1
  // Gb/s: 67.328 us), the stage's (x and the shared slot: the same size),
  // the routed slot alone (112 bytes a duck: 1.792 us), and the shared
  // expert on a duck (3 x 1024 x 128 weights at 20 G/s: 19.66 us).
  const std::vector<int64_t> whole(2, 1024), none(2, 0);
  const double o = stepWire(c, 1, 2, 1024, whole, true).outSeconds;
  const StepWire stage = stepWire(c, 1, 1, 1024, none, false);
  const double o2 = stepWire(c, 1, 1, 0, whole, true).outSeconds;
  const double shared = expertSeconds(m.ffn[0].shards[0], c);
  EXPECT_NEAR(o, 2 * 4208 * 8e-9, 1e-15);
  EXPECT_NEAR(stage.outSeconds, o, 1e-15);
  EXPECT_NEAR(o2, 2 * 112 * 8e-9, 1e-15);
  EXPECT_NEAR(shared, 3 * 1024 * 128 / 20e9, 1e-15);
  // A 1 MB router (1 ms): x and the shared expert hide under it.
  for (FfnLayer &l : m.ffn)
    l.routerHostBytes = 1'000'000;
  const PlanCost before = [&] {
    ClusterModel off = c;
    off.stageShared = false;
    return costPlan(m, off);
  }();
  PlanCost p = costPlan(m, c);
  const double big = o + shared - o2; // the stage is quiet: nothing back
  EXPECT_NEAR(p.stagedSharedMsPerToken, 2e3 * big, 1e-12);
  EXPECT_TRUE(p.stagedShared);
  EXPECT_NEAR(p.hostMsPerToken, before.hostMsPerToken - 2e3 * big, 1e-12);
  EXPECT_NEAR(p.networkMsPerToken, before.networkMsPerToken, 1e-12);
  // A 10 KB router (10 us) hides at most its own time.
  for (FfnLayer &l : m.ffn)
    l.routerHostBytes = 10'000;
  p = costPlan(m, c);
  EXPECT_NEAR(p.stagedSharedMsPerToken, 2e3 * 10e-6, 1e-12);
  // The host's CPU for the one more frame a duck (host_frame_us, the
  // routed slots' request): 2 ducks x 1.5 us a layer, two layers.
  c.hostFrameUs = 1.5;
  p = costPlan(m, c);
  EXPECT_NEAR(p.stagedSharedMsPerToken, 2e3 * 10e-6 - 2 * 2 * 1.5e-3, 1e-12);
  // Two ducks' frames a layer, two layers: it pays under 5 us a frame.
  EXPECT_EQ(p.stagedFramesPerToken, 4);
  EXPECT_NEAR(c.hostFrameUs +
                  1e3 * p.stagedSharedMsPerToken / p.stagedFramesPerToken,
              5.0, 1e-9);
  // Left to the cost model (--tp auto), a stage that costs more than it
  // hides is not taken: a 10-byte router hides 10 ns, the routed slots'
  // frames take 3 us of the host.
  c.stageShared = false;
  c.stageSharedOpen = true;
  EXPECT_TRUE(costPlan(m, c).stagedShared);
  for (FfnLayer &l : m.ffn)
    l.routerHostBytes = 10;
  p = costPlan(m, c);
  EXPECT_LT(p.stagedSharedMsPerToken, 0);
  EXPECT_FALSE(p.stagedShared);
  ClusterModel off = c;
  off.stageSharedOpen = false;
  EXPECT_NEAR(p.tokS, costPlan(m, off).tokS, 1e-9);
}

// A collective among 4 ducks at 1 Gb/s (125 bytes a us), 10 us one way,
// 5 us a call and 2 us a message: 10 values of 4 bytes, slices 3, 3, 2, 2.
TEST(CostModelTest, MeshCollectivesAreDirectExchanges) {
  ClusterModel c;
  c.duckLinkGbps.assign(4, 1.0);
  c.latencyUs = 10;
  c.meshCallUs = 5;
  c.meshMessageUs = 2;
  // Reduce-scatter: duck 0 sends slices 1..3 (8 + 12, 8 + 8, 8 + 8 = 52
  // bytes) and takes three of its own (3 x 20 = 60): 60 bytes the busiest
  // direction of ducks 0 and 1; ducks 2, 3 send 56 and take 48.
  MeshWire rs = meshWire(c, Collective::reduceScatter, 10, 4, 4);
  EXPECT_NEAR(rs.wireSeconds, 60 / 125e6, 1e-15);
  EXPECT_NEAR(rs.latencySeconds, 10e-6, 1e-15);
  EXPECT_NEAR(rs.overheadSeconds, (5 + 3 * 2) * 1e-6, 1e-15);
  EXPECT_NEAR(rs.seconds, 60 / 125e6 + 10e-6 + 11e-6, 1e-15);
  EXPECT_DOUBLE_EQ(rs.bytesPerDuck, 56);
  // All-gather: the same bytes the other way round.
  MeshWire ag = meshWire(c, Collective::allGather, 10, 4, 4);
  EXPECT_NEAR(ag.wireSeconds, 60 / 125e6, 1e-15);
  EXPECT_DOUBLE_EQ(ag.bytesPerDuck, 60);
  // One duck: nothing to exchange.
  EXPECT_EQ(meshWire(c, Collective::allGather, 10, 1, 4).seconds, 0);
  // Two groups of two: within the group 10 values in slices of 5 (one
  // piece of 28 bytes each way), then among 2 ducks over 5 values (pieces
  // of 20 and 16 bytes: 20 the busiest); two latencies, two calls and one
  // message each.
  c.meshGroups = 2;
  MeshWire two = meshWire(c, Collective::reduceScatter, 10, 4, 4);
  EXPECT_NEAR(two.wireSeconds, (28 + 20) / 125e6, 1e-15);
  EXPECT_NEAR(two.latencySeconds, 20e-6, 1e-15);
  EXPECT_NEAR(two.overheadSeconds, 2 * (5 + 2) * 1e-6, 1e-15);
  EXPECT_DOUBLE_EQ(two.bytesPerDuck, 28 + 20);
  // Groups that do not divide the ducks: one direct exchange.
  c.meshGroups = 3;
  EXPECT_EQ(meshWire(c, Collective::reduceScatter, 10, 4, 4).seconds,
            rs.seconds);
}

// Over UDP datagrams a message carries a 24-byte header a datagram of at
// most 1432 bytes (1408 of payload) instead of 8 bytes: 2 ducks' all-gather
// of 800 fp32 values is 400 a duck, 1600 bytes in two datagrams (1648 on
// the wire); 200 values (400 bytes a duck) fit one (424).
TEST(CostModelTest, MeshDatagramsCountAHeaderADatagram) {
  ClusterModel c;
  c.duckLinkGbps.assign(2, 1.0);
  c.meshDatagrams = true;
  EXPECT_DOUBLE_EQ(meshWire(c, Collective::allGather, 800, 2, 4).bytesPerDuck,
                   1600 + 2 * 24);
  EXPECT_DOUBLE_EQ(meshWire(c, Collective::allGather, 200, 2, 4).bytesPerDuck,
                   400 + 24);
  c.meshDatagrams = false;
  EXPECT_DOUBLE_EQ(meshWire(c, Collective::allGather, 800, 2, 4).bytesPerDuck,
                   1600 + 8);
}

// The residual on the ducks: one host exchange a layer and one for the
// head, a dense GQA layer's four collectives, the embedded token's
// gather, and the host's weights moved to the ducks' stream.
TEST(CostModelTest, ResidualOnTheDucksExchangesOnceALayer) {
  ModelFacts m = twoDenseLayersOnTwoDucks();
  Attention a;
  a.heads = 4;
  a.headDim = 64;
  a.kvHeads = 2;
  m.attention = {a, a};
  m.hostWeightBytes = 2'000'000;
  ClusterModel c;
  c.bandwidthGbs = 10;
  c.stepOverheadUs = 80;
  c.hostLinkGbps = 1;
  c.duckLinkGbps = {1, 1};
  c.meshCallUs = 5;
  PlanCost built = costPlan(m, c);
  c.residualOnDucks = true;
  PlanCost p = costPlan(m, c);
  EXPECT_TRUE(p.residualOnDucks);
  EXPECT_EQ(p.stepsPerToken, 3);         // two layers and the head
  EXPECT_EQ(p.collectivesPerToken, 1 + 2 * 4);
  EXPECT_NEAR(p.dispatchMsPerToken, 3 * 0.08 + 9 * 0.005, 1e-12);
  // 2 MB over 2 ducks at 10 GB/s.
  EXPECT_NEAR(p.meshHostWeightsMsPerToken, 0.1, 1e-12);
  EXPECT_NEAR(p.streamMsPerToken, built.streamMsPerToken + 0.1, 1e-12);
  // Each collective of 1024 fp32 over 2 ducks: 8 + 2048 bytes each way.
  EXPECT_NEAR(p.meshMsPerToken, 9 * 2056 * 8 / 1e6, 1e-12);
  EXPECT_NEAR(p.networkMsPerToken,
              p.meshMsPerToken + p.networkOutMsPerToken +
                  p.networkBackMsPerToken + p.networkLatencyMsPerToken,
              1e-12);
  // Far less at the host than the built plan's two whole vectors a duck
  // a step.
  EXPECT_LT(p.hostTxBytesPerToken, built.hostTxBytesPerToken / 2);
  EXPECT_NEAR(p.tokS,
              1e3 / (p.streamMsPerToken + p.dispatchMsPerToken +
                     p.hostMsPerToken + p.networkMsPerToken),
              1e-9);
}

// mesh_groups 0: the fastest groups for the token's collectives. Eight
// ducks at 1 us a call and 10 a message: one exchange costs 1 + 7 x 10 us,
// two groups of four 2 x 1 + (3 + 1) x 10 (four groups of two the same:
// the fewer groups win the tie); with free messages one exchange wins.
TEST(CostModelTest, ResidualOnTheDucksChoosesItsGroups) {
  ModelFacts m = denseLayers(8, 1, 32, 100'000);
  ClusterModel c;
  c.residualOnDucks = true;
  c.meshCallUs = 1;
  c.meshMessageUs = 10;
  PlanCost p = costPlan(m, c);
  EXPECT_EQ(p.meshGroups, 2);
  EXPECT_NEAR(p.meshOverheadMsPerToken, 5 * 0.042, 1e-12); // 5 collectives
  c.meshMessageUs = 0;
  EXPECT_EQ(costPlan(m, c).meshGroups, 1);
  c.meshGroups = 4; // as the cluster file says
  EXPECT_EQ(costPlan(m, c).meshGroups, 4);
}

TEST(CostModelTest, PrefillDecodesOncePerChunk) {
  // A dense slice of 3 x 1024 x 256 weights at 10 Gparam/s GEMV and 40
  // GMAC/s GEMM, 64-row chunks: each weight decoded once, 64 FMAs. Two
  // layers: a prompt's rows stop at the last one's attention (but the
  // row that samples), so its FFN costs a chunk nothing; a token pays
  // both in decode.
  ModelFacts m;
  m.tp = 1;
  FfnLayer dense;
  dense.hidden = 1024;
  dense.shards.push_back(denseShard(0, 256, 1024, 1));
  m.ffn.push_back(dense);
  m.ffn.push_back(dense);
  ClusterModel c;
  c.fp9GparamS = 10;
  c.gemmGmacS = 40;
  c.prefillChunk = 64;
  c.hostPrefillMsPerToken = 0.5;
  const double P = 3.0 * 1024 * 256;
  const double chunk = P * (1 / 10e9 + 64 / 40e9);
  EXPECT_NEAR(prefillShardSeconds(dense.shards[0], dense, c), chunk, 1e-15);
  PlanCost p = costPlan(m, c);
  const double ducksMs = (1e3 * chunk + 0.08) / 64;
  EXPECT_NEAR(p.prefillDucksMsPerToken, ducksMs, 1e-12);
  EXPECT_NEAR(p.prefillTokS, 1e3 / (ducksMs + 0.5), 1e-9);
  EXPECT_EQ(p.layers.size(), 2u);
  EXPECT_NEAR(p.streamMsPerToken, 2 * 1e3 * P / 10e9, 1e-9);
  // With an MTP module every prompt row runs the last layer too.
  m.mtp = std::make_shared<const ModelFacts>();
  EXPECT_NEAR(costPlan(m, c).prefillDucksMsPerToken, 2 * ducksMs, 1e-12);
  m.mtp = nullptr;
  // MoE: 4 experts, top 1, 2-row chunks: an expert some row chose with
  // probability 1 - (3/4)^2 = 7/16 is decoded, for 2 x 1/4 rows of FMAs.
  FfnLayer moe = dense;
  moe.moe = true;
  moe.topK = 1;
  moe.numExperts = 4;
  moe.shards[0].expertBegin = 0;
  moe.shards[0].expertEnd = 4;
  c.prefillChunk = 2;
  EXPECT_NEAR(prefillShardSeconds(moe.shards[0], moe, c),
              4 * P * (7.0 / 16 / 10e9 + 2 * 0.25 / 40e9), 1e-15);
}

TEST(CostModelTest, RowSplitsAreStepsOfTheirOwn) {
  // An o_proj of 2 x 512 rows of K 1024 and the LM head on the ducks: one
  // more step each; their slowest duck in the stream.
  ModelFacts m;
  m.tp = 2;
  RowSplit o;
  o.role = RowSplit::Role::oProj;
  o.k = 1024;
  o.block = 128;
  o.rows = {512, 256};
  RowSplit head = o;
  head.role = RowSplit::Role::head;
  m.rowSplits = {o, head};
  ClusterModel c;
  c.fp9GparamS = 1;
  PlanCost p = costPlan(m, c);
  EXPECT_TRUE(p.oProjOnDucks);
  EXPECT_TRUE(p.lmHeadOnDucks);
  EXPECT_EQ(p.attnProjSteps, 1);
  EXPECT_NEAR(p.oProjMsPerToken, 512 * 1024 / 1e6, 1e-12);
  EXPECT_NEAR(p.streamMsPerToken, 2 * 512 * 1024 / 1e6, 1e-12);
  EXPECT_NEAR(p.dispatchMsPerToken, 2 * 0.08, 1e-12);
  EXPECT_DOUBLE_EQ(p.duckParamsPerToken[1], 2 * 256 * 1024);
}

TEST(CostModelTest, AScatteredStepOfPartialSums) {
  // An absorbed MLA output step over 2 ducks (duckc --mla-absorb ducks):
  // each duck its own IB (16 and 32 latent floats), W_UV and its o_proj
  // columns (32 x 8 + 24 and 32 x 16 + 48 weights), partial sums of 32
  // floats back. Against the same step as a plain row split of 32 rows of
  // K 32: 16 + 32 floats out instead of 2 x 32, 64 back instead of 32.
  ModelFacts m;
  m.tp = 2;
  RowSplit o;
  o.role = RowSplit::Role::oProj;
  o.k = 32;
  o.block = 32;
  o.rows = {16, 16};
  m.rowSplits = {o};
  ClusterModel c;
  c.fp9GparamS = 1;
  const PlanCost plain = costPlan(m, c);
  RowSplit &a = m.rowSplits[0];
  a.rows = {8 + 32, 16 + 32};
  a.k = 8;
  a.extraParams = {0, 0};
  a.inWidth = {16, 32};
  a.outWidth = {32, 32};
  a.partialSums = true;
  const PlanCost absorbed = costPlan(m, c);
  EXPECT_EQ(plain.hostTxBytesPerToken - absorbed.hostTxBytesPerToken,
            (2 * 32 - 48) * 4);
  EXPECT_EQ(absorbed.hostRxBytesPerToken - plain.hostRxBytesPerToken,
            (64 - 32) * 4);
  // The slowest duck's weights: 48 x 8 (its rows of K 8) at 1 Gparam/s.
  EXPECT_NEAR(absorbed.oProjMsPerToken, 48 * 8 / 1e6, 1e-12);
  a.extraParams = {0, 100};
  EXPECT_NEAR(costPlan(m, c).oProjMsPerToken, (48 * 8 + 100) / 1e6, 1e-12);
}

TEST(CostModelTest, HostTime) {
  ModelFacts m;
  m.hostWeightBytes = 2e9;
  m.onDucksHostBytes = 1e9;
  m.lmHead = ModelFacts::LmHead{1e8, 2.0};
  Attention gqa; // 16 heads of 128, 8 kv heads
  gqa.heads = 16;
  gqa.headDim = 128;
  gqa.kvHeads = 8;
  m.attention = {gqa};
  ClusterModel c;
  c.hostReadGbs = 100;
  c.hostGmacS = 1;
  c.contextTokens = 1000;
  // Not measured: the host's weights at 100 GB/s (20 ms), its head's 200
  // MB (2 ms) and its attention: 4.096 MMAC (4.096 ms at 1 GMAC/s) or
  // 8.192 MB of cache (0.08192 ms): bound by the multiply-adds.
  PlanCost p = costPlan(m, c);
  EXPECT_NEAR(p.hostOpsMsPerToken, 20, 1e-12);
  EXPECT_NEAR(p.hostLmHeadMsPerToken, 2, 1e-12);
  EXPECT_NEAR(p.hostAttnMsPerToken, 4.096, 1e-12);
  EXPECT_NEAR(p.hostAttnCacheBytesPerToken, 8.192e6, 1e-6);
  EXPECT_NEAR(p.hostMsPerToken, 26.096, 1e-12);
  // Measured: 30 ms, less the projections on the ducks (1 GB: 10 ms); a
  // head quantised at load reads 1.125 bytes a weight.
  c.hostMsPerToken = 30;
  c.hostHeadBytesPerWeight = 1.125;
  p = costPlan(m, c);
  EXPECT_EQ(p.hostOpsMsPerToken, 0);
  EXPECT_NEAR(p.hostMsPerToken, 20 + 4.096 + 1.125, 1e-12);
}

TEST(CostModelTest, MlaWithAnIndexerAttendsItsTopK) {
  // MLA, 128 heads, kv_lora 512, rope 64, an indexer of 64 heads of 128
  // keeping 2048 of 8192 positions: 64 x 128 x 8192 indexer MACs plus
  // 128 x 1088 x 2048 attention MACs.
  Attention mla;
  mla.gqa = false;
  mla.heads = 128;
  mla.kvLora = 512;
  mla.rope = 64;
  mla.indexer = true;
  mla.indexHeads = 64;
  mla.indexDim = 128;
  mla.indexTopK = 2048;
  ClusterModel c;
  c.hostGmacS = 100;
  c.contextTokens = 8192;
  AttentionCost a = hostAttention({mla}, c);
  const double macs = 64.0 * 128 * 8192 + 128.0 * 1088 * 2048;
  EXPECT_DOUBLE_EQ(a.macs, macs);
  EXPECT_NEAR(a.ms, 1e3 * macs / 100e9, 1e-12);
  EXPECT_DOUBLE_EQ(a.cacheBytes, 128.0 * 4 * 8192 + 576.0 * 4 * 2048);
}

Candidate costed(int64_t tp, const char *mo, double tokS) {
  Candidate c;
  c.tp = tp;
  c.multipleOf = mo;
  c.strategy = "intermediate";
  c.lmHead = "checkpoint";
  c.ok = c.costed = true;
  c.tokS = tokS;
  return c;
}

TEST(CostModelCandidatesTest, WithinThreePercentFewerDucksWin) {
  std::vector<Candidate> all = {costed(4, "128", 102), costed(2, "64", 100),
                                costed(2, "128", 99.5)};
  // 100 and 99.5 tie with 102: the fewest ducks, then the larger block.
  EXPECT_EQ(pickBest(all), &all[2]);
  all[0].tokS = 110; // 9.5 % faster: no tie
  EXPECT_EQ(pickBest(all), &all[0]);
  all[0].ok = false; // not legal
  EXPECT_EQ(pickBest(all), &all[2]);
  for (Candidate &c : all)
    c.ok = false;
  EXPECT_EQ(pickBest(all), nullptr);
}

TEST(CostModelCandidatesTest, EnumeratesWhatTheFlagsLeaveOpen) {
  SearchRequest r;
  r.ducks = 4;
  r.multipleOf = "64";
  r.strategy = "intermediate";
  r.lmHead = "checkpoint";
  r.inProj = r.qProj = r.oProj = "host";
  EXPECT_EQ(enumerateCandidates(r).size(), 1u);
  EXPECT_EQ(enumerateCandidates(r)[0].tp, 4);
  r.tpOpen = r.multipleOfOpen = r.strategyOpen = true;
  r.lmHeadOpen = r.projOpen = true;
  std::vector<Candidate> all = enumerateCandidates(r);
  ASSERT_EQ(all.size(), 4u * 3 * 2 * 2 * 4);
  EXPECT_EQ(all.front().tp, 1);
  EXPECT_EQ(all.back().tp, 4);
  EXPECT_EQ(all.back().multipleOf, "32");
  EXPECT_EQ(all.back().strategy, "experts");
  EXPECT_EQ(all.back().lmHead, "ducks");
  EXPECT_EQ(all.back().inProj, "ducks");
  EXPECT_EQ(all[1].oProj, "ducks"); // the projections vary fastest
  EXPECT_EQ(all[1].qProj, "host");
}

TEST(CostModelCandidatesTest, MixMovesTheCheapestLayersToFit) {
  // 3 MoE layers on one duck: the split is faster in each (10 ms against
  // 11, 12, 20) but 300 bytes a layer against whole experts' 200. With 750
  // bytes the duck needs 150 freed: the cheapest layer (1 ms lost) moves,
  // then the next (2 ms); the 10 ms one stays split.
  Candidate split = costed(1, "64", 1), whole = split;
  whole.strategy = "experts";
  split.duckBytes = {900};
  whole.duckBytes = {600};
  const double wholeMs[] = {11, 20, 12};
  for (int64_t i = 0; i < 3; ++i) {
    split.layers.push_back({i, true, 10, {300}});
    whole.layers.push_back({i, true, wholeMs[i], {200}});
  }
  using Choice = std::vector<std::pair<int64_t, bool>>;
  EXPECT_EQ(mixLayers(split, whole, {750}),
            (Choice{{0, true}, {1, false}, {2, true}}));
  // With room for the split nothing moves: no mix.
  EXPECT_TRUE(mixLayers(split, whole, {900}).empty());
  // Only whole experts everywhere fit: no mix either.
  EXPECT_TRUE(mixLayers(split, whole, {600}).empty());
}

} // namespace
