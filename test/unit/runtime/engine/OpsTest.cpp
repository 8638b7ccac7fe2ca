// The host ops that need no ducks, against straightforward references in
// double: RoPE/YaRN frequencies and rotations (Rope.h), the MoE routers
// (Routers.h: softmax top-k, sigmoid group-limited top-k), and the
// embedding, RMSNorm, residual add, MoE routing, LM head and GQA attention
// ops built from a compiled tiny plan (ops/HostOp.h, internal to the
// engine).
#include "HostOp.h"
#include "Rope.h"
#include "Routers.h"

#include "TestPlans.h"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>

namespace {

namespace pl = ::duck::plan;
using namespace duck::runtime;
using namespace duck::runtime::ops;

//===----------------------------------------------------------------------===//
// RoPE / YaRN
//===----------------------------------------------------------------------===//

/// HF's _compute_yarn_parameters / DeepSeek's precompute_freqs_cis, written
/// out as they are (extrapolation factor 1 - ramp).
struct YarnRef {
  std::vector<double> inv_freq;
  double mscale = 1.0, attn = 1.0;
};
double RefMscale(double scale, double m) {
  return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}
YarnRef RefYarn(uint32_t dim, double base, double factor, double orig,
                double beta_fast, double beta_slow, double mscale,
                double mscale_all_dim) {
  YarnRef r;
  auto corrDim = [&](double rot) {
    return (dim * std::log(orig / (rot * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = std::floor(corrDim(beta_fast)),
         high = std::ceil(corrDim(beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, (double)dim - 1);
  if (low == high)
    high += 0.001;
  for (uint32_t i = 0; i < dim / 2; ++i) {
    const double pos_freq = std::pow(base, (double)(2 * i) / dim);
    const double extrapolation = 1.0 / pos_freq,
                 interpolation = 1.0 / (factor * pos_freq);
    double ramp = (i - low) / (high - low);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    const double extrapolation_factor = 1 - ramp;
    r.inv_freq.push_back(interpolation * (1 - extrapolation_factor) +
                         extrapolation * extrapolation_factor);
  }
  r.mscale = RefMscale(factor, mscale) / RefMscale(factor, mscale_all_dim);
  if (mscale_all_dim > 0)
    r.attn = std::pow(RefMscale(factor, mscale_all_dim), 2);
  return r;
}

// A KV cache's rows about to be written (SeqCache::AtForWrite) are the
// rows At names, and the first row written in a piece of kPopulateBytes
// maps that whole piece (one call instead of a page fault every few
// positions), nothing past it.
TEST(SeqCache, AWriteMapsItsPieceOfTheCache) {
#ifndef MADV_POPULATE_WRITE
  GTEST_SKIP() << "no MADV_POPULATE_WRITE in these headers";
#else
  duck::runtime::ops::SeqCache c;
  ASSERT_TRUE(c.Init(128, 4096, 2).ok()); // 512 B a row, 2 MiB a sequence
  const long page = sysconf(_SC_PAGESIZE);
  // Small pages whatever the machine's THP setting, so a fault maps one.
  ASSERT_EQ(0, madvise(c.At(0, 0), 2 * 4096 * 512, MADV_NOHUGEPAGE));
  const uint64_t piece = duck::runtime::ops::SeqCache::kPopulateBytes;
  auto resident = [&](const float *at, uint64_t bytes) {
    std::vector<unsigned char> v((bytes + page - 1) / page);
    EXPECT_EQ(0, mincore(const_cast<float *>(at), bytes, v.data()));
    return (uint64_t)std::count_if(v.begin(), v.end(),
                                   [](unsigned char b) { return b & 1; });
  };
  float *row = c.AtForWrite(1, 64); // sequence 1's second piece
  EXPECT_EQ(row, c.At(1, 64));
  row[0] = 1.0f;
  const float *pieceStart = c.At(1, 64);
  EXPECT_EQ(resident(pieceStart, piece), piece / page)
      << "the whole piece is mapped";
  EXPECT_EQ(resident(c.At(1, 128), piece), 0u) << "nothing past it";
  EXPECT_EQ(resident(c.At(0, 0), piece), 0u) << "nor another sequence's";
  // A row that is not its piece's first maps only its own page (a fault).
  c.AtForWrite(1, 200)[0] = 1.0f;
  EXPECT_EQ(resident(c.At(1, 192), piece), 1u);
#endif
}

// A cache's next 2 MiB, mapped ahead of its writes (SeqCache::Populate,
// PopulateAhead): in this call or on the background thread, exactly the
// rows asked for (PopulateAhead: the 2 MiB piece row p + ahead enters,
// only when it enters one), the contents of mapped rows unchanged.
TEST(SeqCache, PopulateMapsRowsAheadOfTheirWrites) {
#ifndef MADV_POPULATE_WRITE
  GTEST_SKIP() << "no MADV_POPULATE_WRITE in these headers";
#else
  using duck::runtime::BackgroundPopulate;
  duck::runtime::ops::SeqCache c;
  ASSERT_TRUE(c.Init(128, 16384, 2).ok()); // 512 B a row, 8 MiB a sequence
  const long page = sysconf(_SC_PAGESIZE);
  ASSERT_EQ(0, madvise(c.At(0, 0), 2 * 16384 * 512, MADV_NOHUGEPAGE));
  auto resident = [&](const float *at, uint64_t bytes) {
    std::vector<unsigned char> v((bytes + page - 1) / page);
    EXPECT_EQ(0, mincore(const_cast<float *>(at), bytes, v.data()));
    return (uint64_t)std::count_if(v.begin(), v.end(),
                                   [](unsigned char b) { return b & 1; });
  };
  const uint64_t mib2 = 2 << 20, rowsA = mib2 / 512; // 4096 rows a piece
  c.At(1, 5)[3] = 7.0f; // a written row keeps its value
  c.Populate(1, 0, 64, /*now=*/true);
  EXPECT_EQ(resident(c.At(1, 0), 64 * 512), 64 * 512 / (uint64_t)page);
  EXPECT_EQ(resident(c.At(1, 64), 64 * 512), 0u) << "nothing past the rows";
  EXPECT_EQ(c.At(1, 5)[3], 7.0f);
  // In the background: mapped once Drain returns.
  c.Populate(1, 256, 64, /*now=*/false);
  BackgroundPopulate::Get().Drain();
  EXPECT_EQ(BackgroundPopulate::Get().Pending(), 0u);
  EXPECT_EQ(resident(c.At(1, 256), 64 * 512), 64 * 512 / (uint64_t)page);
  EXPECT_EQ(resident(c.At(1, 320), 64 * 512), 0u);
  // PopulateAhead: row p + ahead inside sequence 0's first piece asks for
  // nothing; the first row of its second piece maps that piece whole.
  c.PopulateAhead(0, 100, 10, /*now=*/true);
  EXPECT_EQ(resident(c.At(0, 0), 8 * mib2 / 4), 0u);
  c.PopulateAhead(0, rowsA - 10, 10, /*now=*/false);
  BackgroundPopulate::Get().Drain();
  EXPECT_EQ(resident(c.At(0, rowsA), mib2), mib2 / (uint64_t)page);
  EXPECT_EQ(resident(c.At(0, 0), mib2), 0u) << "not the piece before";
  EXPECT_EQ(resident(c.At(0, 2 * rowsA), mib2), 0u) << "nor the one after";
  // Past the sequence's rows: nothing.
  c.PopulateAhead(0, 16380, 10, /*now=*/true);
  EXPECT_EQ(resident(c.At(1, 4096), mib2), 0u);
#endif
}

// Forget drops what is queued on a range and returns with nothing
// running there: a cache can then be unmapped.
TEST(BackgroundPopulate, ForgetLeavesNothingOnTheRange) {
#ifndef MADV_POPULATE_WRITE
  GTEST_SKIP() << "no MADV_POPULATE_WRITE in these headers";
#else
  using duck::runtime::BackgroundPopulate;
  const size_t bytes = 64 << 20;
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto &bg = BackgroundPopulate::Get();
  for (size_t off = 0; off < bytes; off += 2 << 20)
    bg.Request(static_cast<uint8_t *>(p) + off, 2 << 20);
  bg.Forget(p, bytes);
  EXPECT_EQ(bg.Pending(), 0u);
  ASSERT_EQ(0, munmap(p, bytes));
  bg.Drain(); // nothing queued there ran after the unmap
  EXPECT_EQ(bg.Pending(), 0u);
#endif
}

TEST(Rope, PlainFrequenciesAreThetaPowers) {
  for (uint32_t dim : {64u, 128u})
    for (double theta : {10000.0, 1e6}) {
      YarnRope r = YarnRope::Make(dim, theta, nullptr);
      ASSERT_EQ(r.inv_freq.size(), dim / 2);
      for (uint32_t i = 0; i < dim / 2; ++i)
        EXPECT_NEAR(r.inv_freq[i], 1.0 / std::pow(theta, 2.0 * i / dim),
                    1e-15 * std::max(1.0, r.inv_freq[i]))
            << "dim " << dim << " i " << i;
      EXPECT_EQ(r.cos_sin_scale, 1.0f);
      EXPECT_EQ(r.attn_scale, 1.0);
    }
}

TEST(Rope, YarnMatchesTheReferenceFormula) {
  struct Case {
    uint32_t dim;
    double theta, factor, orig, fast, slow, mscale, mscale_all;
  };
  const Case cases[] = {
      {64, 10000, 40, 4096, 32, 1, 1.0, 1.0},    // DeepSeek-V3
      {64, 10000, 40, 4096, 32, 1, 0.707, 0.707}, // V3.2's indexer-style
      {128, 1e6, 4, 32768, 32, 1, 1.0, 0.0},     // Qwen3 YaRN (mscale only)
      {16, 10000, 2, 64, 32, 1, 1.0, 0.0},       // low clamps to 0
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(testing::Message() << "dim " << c.dim << " factor " << c.factor
                                    << " mscale " << c.mscale << "/"
                                    << c.mscale_all);
    flatbuffers::FlatBufferBuilder b;
    b.Finish(pl::CreateRopeScalingDef(b, b.CreateString("yarn"), c.factor,
                                      (uint32_t)c.orig, c.fast, c.slow,
                                      c.mscale, c.mscale_all));
    const auto *rs = flatbuffers::GetRoot<pl::RopeScalingDef>(
        b.GetBufferPointer());
    YarnRope r = YarnRope::Make(c.dim, c.theta, rs);
    YarnRef ref = RefYarn(c.dim, c.theta, c.factor, c.orig, c.fast, c.slow,
                          c.mscale, c.mscale_all);
    ASSERT_EQ(r.inv_freq.size(), ref.inv_freq.size());
    for (size_t i = 0; i < ref.inv_freq.size(); ++i)
      EXPECT_NEAR(r.inv_freq[i], ref.inv_freq[i], 1e-12 * ref.inv_freq[i])
          << "i " << i;
    // The ends: the fastest frequency is kept, the slowest interpolated.
    EXPECT_DOUBLE_EQ(r.inv_freq[0], 1.0);
    EXPECT_NEAR(r.inv_freq.back(),
                std::pow(c.theta, -2.0 * (c.dim / 2 - 1) / c.dim) / c.factor,
                1e-12);
    EXPECT_NEAR(r.cos_sin_scale, ref.mscale, 1e-6);
    EXPECT_NEAR(r.attn_scale, ref.attn, 1e-12);
  }
  // factor 1 is no scaling at all.
  flatbuffers::FlatBufferBuilder b;
  b.Finish(pl::CreateRopeScalingDef(b, b.CreateString("yarn"), 1.0, 4096));
  YarnRope r = YarnRope::Make(
      64, 10000, flatbuffers::GetRoot<pl::RopeScalingDef>(b.GetBufferPointer()));
  EXPECT_NEAR(r.inv_freq[31], std::pow(10000.0, -62.0 / 64), 1e-15);
  EXPECT_EQ(r.cos_sin_scale, 1.0f);
}

TEST(Rope, RotationsMatchDoubleReference) {
  flatbuffers::FlatBufferBuilder b;
  b.Finish(pl::CreateRopeScalingDef(b, b.CreateString("yarn"), 40, 4096, 32,
                                    1, 1.0, 0.0)); // cos/sin scaled 1.37x
  YarnRope r = YarnRope::Make(
      64, 10000, flatbuffers::GetRoot<pl::RopeScalingDef>(b.GetBufferPointer()));
  ASSERT_GT(r.cos_sin_scale, 1.3f);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2, 2);
  for (uint64_t pos : {0ull, 1ull, 17ull, 4095ull, 100000ull}) {
    std::vector<float> x(64);
    for (float &v : x)
      v = u(rng);
    std::vector<float> a = x, h = x;
    r.Interleaved(a.data(), pos);
    r.HalfSplit(h.data(), pos);
    for (size_t i = 0; i < 32; ++i) {
      const double ang = (double)pos * r.inv_freq[i];
      const double c = std::cos(ang) * r.cos_sin_scale,
                   s = std::sin(ang) * r.cos_sin_scale;
      EXPECT_NEAR(a[2 * i], x[2 * i] * c - x[2 * i + 1] * s, 1e-5)
          << pos << " " << i;
      EXPECT_NEAR(a[2 * i + 1], x[2 * i] * s + x[2 * i + 1] * c, 1e-5);
      EXPECT_NEAR(h[i], x[i] * c - x[i + 32] * s, 1e-5) << pos << " " << i;
      EXPECT_NEAR(h[i + 32], x[i + 32] * c + x[i] * s, 1e-5);
    }
    if (pos == 0) { // no rotation, only the scale
      EXPECT_NEAR(a[5], x[5] * r.cos_sin_scale, 1e-6);
    }
  }
}

//===----------------------------------------------------------------------===//
// Routers
//===----------------------------------------------------------------------===//

/// The k largest of v, ties to the lower index.
std::vector<uint32_t> RefTopK(const std::vector<double> &v, uint32_t k) {
  std::vector<uint32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](uint32_t a, uint32_t b) { return v[a] > v[b]; });
  idx.resize(k);
  return idx;
}

std::vector<duck_expert_slot> Route(const RouterConfig &c,
                                    std::vector<float> logits,
                                    const float *bias = nullptr) {
  Router r(c);
  std::vector<duck_expert_slot> out(c.top_k + c.shared);
  r.Route(logits.data(), bias, out.data());
  return out;
}

TEST(Routers, SoftmaxTopKMatchesReference) {
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0, 2);
  for (bool norm : {false, true})
    for (int trial = 0; trial < 200; ++trial) {
      RouterConfig c;
      c.experts = 64;
      c.top_k = 8;
      c.shared = trial % 3;
      c.norm_topk_prob = norm;
      std::vector<float> logits(c.experts);
      for (float &v : logits)
        v = n(rng);
      std::vector<double> p(c.experts);
      double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
      for (uint32_t i = 0; i < c.experts; ++i)
        sum += p[i] = std::exp((double)logits[i] - mx);
      for (double &v : p)
        v /= sum;
      std::vector<uint32_t> want = RefTopK(p, c.top_k);
      double kept = 0;
      for (uint32_t e : want)
        kept += p[e];
      std::vector<duck_expert_slot> got = Route(c, logits);
      for (uint32_t j = 0; j < c.top_k; ++j) {
        ASSERT_EQ(got[j].expert, want[j]) << "trial " << trial << " j " << j;
        EXPECT_NEAR(got[j].weight, norm ? p[want[j]] / kept : p[want[j]],
                    2e-6);
      }
      for (uint32_t s = 0; s < c.shared; ++s) {
        EXPECT_EQ(got[c.top_k + s].expert, c.experts + s);
        EXPECT_EQ(got[c.top_k + s].weight, 1.0f);
      }
    }
}

TEST(Routers, TiesGoToTheLowerExpert) {
  RouterConfig c;
  c.experts = 8;
  c.top_k = 3;
  std::vector<duck_expert_slot> got =
      Route(c, {0, 1, 0, 1, 0, 1, 0, 0}); // three equal best
  EXPECT_EQ(got[0].expert, 1u);
  EXPECT_EQ(got[1].expert, 3u);
  EXPECT_EQ(got[2].expert, 5u);
  c.sigmoid = true;
  c.n_group = 4;
  c.topk_group = 2;
  c.top_k = 2;
  got = Route(c, {0, 0, 0, 0, 0, 0, 0, 0}); // every group ties
  EXPECT_EQ(got[0].expert, 0u);
  EXPECT_EQ(got[1].expert, 1u);
}

/// DeepSeek-V3's MoEGate.forward (noaux_tc), in double.
std::vector<std::pair<uint32_t, double>>
RefSigmoidGrouped(const std::vector<float> &logits,
                  const std::vector<float> &bias, uint32_t G, uint32_t keepG,
                  uint32_t K, bool norm, double scaling) {
  const uint32_t E = (uint32_t)logits.size(), per = E / G;
  std::vector<double> s(E), sel(E);
  for (uint32_t i = 0; i < E; ++i) {
    s[i] = 1 / (1 + std::exp(-(double)logits[i]));
    sel[i] = s[i] + bias[i];
  }
  std::vector<double> gs(G);
  for (uint32_t g = 0; g < G; ++g) {
    std::vector<double> m(sel.begin() + g * per, sel.begin() + (g + 1) * per);
    std::sort(m.rbegin(), m.rend());
    gs[g] = m[0] + (per > 1 ? m[1] : 0);
  }
  std::vector<uint32_t> groups = RefTopK(gs, keepG);
  for (uint32_t g = 0; g < G; ++g)
    if (std::find(groups.begin(), groups.end(), g) == groups.end())
      for (uint32_t i = g * per; i < (g + 1) * per; ++i)
        sel[i] = -INFINITY;
  std::vector<uint32_t> idx = RefTopK(sel, K);
  double sum = 0;
  for (uint32_t e : idx)
    sum += s[e];
  std::vector<std::pair<uint32_t, double>> out;
  for (uint32_t e : idx)
    out.push_back({e, (norm ? s[e] / (sum + 1e-20) : s[e]) * scaling});
  return out;
}

TEST(Routers, SigmoidGroupLimitedTopKMatchesReference) {
  std::mt19937 rng(2);
  std::normal_distribution<float> n(0, 1.5);
  struct Case {
    uint32_t E, G, keepG, K;
    bool norm;
    float scaling;
  };
  const Case cases[] = {{256, 8, 4, 8, true, 2.5f}, // DeepSeek-V3
                        {64, 8, 1, 6, true, 1.0f},  // one group kept
                        {16, 1, 1, 4, false, 1.0f}, // no groups
                        {32, 16, 3, 5, true, 1.5f}}; // two experts a group
  for (const Case &c : cases)
    for (int trial = 0; trial < 100; ++trial) {
      SCOPED_TRACE(testing::Message() << c.E << " experts, " << c.G
                                      << " groups, trial " << trial);
      RouterConfig rc;
      rc.sigmoid = true;
      rc.experts = c.E;
      rc.top_k = c.K;
      rc.shared = 1;
      rc.norm_topk_prob = c.norm;
      rc.n_group = c.G;
      rc.topk_group = c.keepG;
      rc.scaling = c.scaling;
      std::vector<float> logits(c.E), bias(c.E);
      for (uint32_t i = 0; i < c.E; ++i) {
        logits[i] = n(rng);
        bias[i] = 0.3f * n(rng);
      }
      auto want = RefSigmoidGrouped(logits, bias, c.G, c.keepG, c.K, c.norm,
                                    c.scaling);
      std::vector<duck_expert_slot> got = Route(rc, logits, bias.data());
      std::vector<uint32_t> groupsUsed;
      for (uint32_t j = 0; j < c.K; ++j) {
        ASSERT_EQ(got[j].expert, want[j].first) << "j " << j;
        EXPECT_NEAR(got[j].weight, want[j].second, 2e-6 * c.scaling);
        const uint32_t g = got[j].expert / (c.E / c.G);
        if (std::find(groupsUsed.begin(), groupsUsed.end(), g) ==
            groupsUsed.end())
          groupsUsed.push_back(g);
      }
      EXPECT_LE(groupsUsed.size(), c.keepG);
      EXPECT_EQ(got[c.K].expert, c.E); // the shared expert
      EXPECT_EQ(got[c.K].weight, 1.0f);
    }
}

// The bias chooses, the unbiased score weighs: an expert the bias lifts
// into the top k keeps its own sigmoid weight.
TEST(Routers, CorrectionBiasSelectsButDoesNotWeigh) {
  RouterConfig c;
  c.sigmoid = true;
  c.experts = 4;
  c.top_k = 1;
  std::vector<float> logits = {2.0f, 0.0f, 0.0f, 0.0f};
  std::vector<float> bias = {0.0f, 0.0f, 1.0f, 0.0f};
  std::vector<duck_expert_slot> got = Route(c, logits, bias.data());
  EXPECT_EQ(got[0].expert, 2u);
  EXPECT_NEAR(got[0].weight, 0.5f, 1e-7);
}

//===----------------------------------------------------------------------===//
// Ops built from a compiled plan
//===----------------------------------------------------------------------===//

/// Records what an FFN op sends; answers zeros.
class RecordingRunner : public FfnRunner {
public:
  absl::Status Run(uint32_t mode, uint32_t slot, uint32_t n_tokens,
                   uint32_t top_k, const duck_expert_slot *slots,
                   const float *x, float *out) override {
    (void)x, (void)out;
    modes.push_back(mode);
    this->slot = slot;
    this->top_k = top_k;
    sent.assign(slots, slots + (uint64_t)n_tokens * top_k);
    return absl::OkStatus();
  }
  std::vector<uint32_t> modes;
  uint32_t slot = 0, top_k = 0;
  std::vector<duck_expert_slot> sent;
};

class PlanOps : public ::testing::Test {
protected:
  static constexpr uint32_t kRows = 5;     // the MoE test's rows
  static constexpr uint32_t kMaxRows = 8;  // the steps' capacity

  void SetUp() override {
    auto p = LoadedPlan::Load(test::PlanDir("qwen3-moe"), HostOpKinds());
    ASSERT_TRUE(p.ok()) << p.status();
    plan_ = std::move(*p);
    hidden_ = plan_->def().model()->hidden();
    weights_ = std::make_unique<WeightReader>(*plan_);
    pool_ = std::make_unique<ThreadPool>(1);
    values_.Init(std::vector<uint64_t>(plan_->def().num_values(),
                                       plan_->def().model()->vocab()),
                 kMaxRows);
  }
  const pl::OpDef &Op(pl::OpParams kind, int n = 0) {
    for (const pl::OpDef *op : *plan_->def().ops())
      if (op->params_type() == kind && n-- == 0)
        return *op;
    ADD_FAILURE() << "no op of kind " << pl::EnumNameOpParams(kind);
    return *plan_->def().ops()->Get(0);
  }
  std::unique_ptr<HostOp> Create(const pl::OpDef &def, uint32_t maxSeqs = 1) {
    OpEnv env{*plan_, def, *weights_, &runner_, pool_.get(), hidden_,
              kMaxRows, 64, maxSeqs};
    auto op = FindHostOpKind(def.params_type())->create(env);
    EXPECT_TRUE(op.ok()) << op.status();
    if (!op.ok())
      return nullptr;
    if (def.inputs())
      (*op)->inputs.assign(def.inputs()->begin(), def.inputs()->end());
    (*op)->result = def.result();
    return std::move(*op);
  }
  Step MakeStep(const std::vector<int32_t> &tokens, bool prefill,
                std::vector<float> *logits = nullptr) {
    tokens_ = tokens;
    pos_.resize(tokens.size());
    std::iota(pos_.begin(), pos_.end(), 0u);
    seq_.assign(tokens.size(), 0);
    return Step{tokens_, pos_, seq_, logit_rows_, prefill, &values_, logits};
  }
  /// A step of rows at the given sequences and positions.
  Step MakeStep(const std::vector<uint32_t> &seq,
                const std::vector<uint32_t> &pos) {
    tokens_.assign(seq.size(), 0);
    seq_ = seq;
    pos_ = pos;
    return Step{tokens_, pos_, seq_, logit_rows_, seq.size() > 1, &values_,
                nullptr};
  }
  std::vector<float> Tensor(const pl::TensorDef *t) {
    auto v = weights_->ReadAll(*t);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : std::vector<float>();
  }
  void Fill(uint32_t value, uint32_t rows, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0, 1);
    float *x = values_.Get(value);
    for (uint64_t i = 0; i < (uint64_t)rows * hidden_; ++i)
      x[i] = n(rng);
  }

  std::unique_ptr<LoadedPlan> plan_;
  std::unique_ptr<WeightReader> weights_;
  std::unique_ptr<ThreadPool> pool_;
  RecordingRunner runner_;
  ValueArena values_;
  uint32_t hidden_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<uint32_t> pos_, seq_, logit_rows_;
};

/// An FP8 host matrix kept as e4m3 (the checkpoint's bytes and its tile
/// scales, not packed to fp9 first) multiplies with the fp9 pack's bits;
/// a NaN byte in it is refused naming the tensor and the element.
TEST_F(PlanOps, Fp8MatricesKeptAsE4m3HaveFp9sBitsAndRefuseNaN) {
  const pl::GqaAttentionOpDef *p =
      Op(pl::OpParams::GqaAttentionOpDef).params_as_GqaAttentionOpDef();
  // q_proj: two tiles of rows; o_proj: two tiles of columns.
  for (const pl::TensorDef *w : {p->q_proj(), p->o_proj()}) {
    ASSERT_EQ(w->dtype(), pl::DType::F8_E4M3);
    ::unsetenv("DUCK_HOST_FP8");
    auto e4 = weights_->Matrix(*w);
    ASSERT_TRUE(e4.ok()) << e4.status();
    ::setenv("DUCK_HOST_FP8", "fp9", 1);
    auto f9 = weights_->Matrix(*w);
    ::unsetenv("DUCK_HOST_FP8");
    ASSERT_TRUE(f9.ok()) << f9.status();
    ASSERT_TRUE(e4->is_e4m3);
    ASSERT_TRUE(f9->is_fp9);
    std::mt19937 rng(5);
    std::normal_distribution<float> n(0, 1);
    std::vector<float> x(f9->cols), a(f9->rows), b(f9->rows);
    for (auto &v : x)
      v = n(rng);
    MatVec(*pool_, *e4, x.data(), a.data());
    MatVec(*pool_, *f9, x.data(), b.data());
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
        << w->name()->str();
  }
  const pl::TensorDef &t = *p->q_proj();

  // The checkpoint copied, one byte of q_proj made NaN (row 3, column 5).
  char tmpl[] = "/tmp/duck-e4m3-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string model = test::ModelDir("qwen3-moe");
  ASSERT_EQ(0, std::system(("cp -r '" + model + "/.' '" + dir + "/'").c_str()));
  const std::string file =
      dir + "/" + plan_->def().files()->Get(t.file())->path()->str();
  {
    std::FILE *f = std::fopen(file.c_str(), "r+b");
    ASSERT_NE(f, nullptr) << file;
    ASSERT_EQ(0, std::fseek(f, (long)(t.offset() + 3 * t.shape()->Get(1) + 5),
                            SEEK_SET));
    ASSERT_EQ(0x7F, std::fputc(0x7F, f));
    std::fclose(f);
  }
  PlanLoadOptions lo;
  lo.checkpoint_dir = dir;
  auto bad = LoadedPlan::Load(test::PlanDir("qwen3-moe"), HostOpKinds(), lo);
  ASSERT_TRUE(bad.ok()) << bad.status();
  const WeightReader reader(**bad);
  auto m = reader.Matrix(t);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("host tensor '" + t.name()->str() + "'"),
            std::string::npos)
      << m.status();
  EXPECT_NE(m.status().message().find("row 3, column 5"), std::string::npos)
      << m.status();
  std::system(("rm -rf '" + dir + "'").c_str());
}

TEST_F(PlanOps, EmbeddingCopiesTheTokensRows) {
  const pl::OpDef &def = Op(pl::OpParams::EmbeddingOpDef);
  auto op = Create(def);
  ASSERT_TRUE(op);
  std::vector<float> table = Tensor(def.params_as_EmbeddingOpDef()->weight());
  const int32_t V = (int32_t)plan_->def().model()->vocab();
  ASSERT_EQ(table.size(), (uint64_t)V * hidden_);
  std::vector<int32_t> tokens = {0, 7, V - 1, 7};
  ASSERT_TRUE(op->Run(MakeStep(tokens, true)).ok());
  const float *out = values_.Get(def.result());
  for (size_t t = 0; t < tokens.size(); ++t)
    for (uint32_t c = 0; c < hidden_; ++c)
      ASSERT_EQ(out[t * hidden_ + c], table[(uint64_t)tokens[t] * hidden_ + c])
          << "row " << t << " col " << c;
  for (int32_t bad : {V, -1}) {
    absl::Status s = op->Run(MakeStep({3, bad}, true));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(s.message()).find("is outside the vocabulary of " +
                                            std::to_string(V)),
              std::string::npos)
        << s;
  }
}

TEST_F(PlanOps, RmsNormMatchesDoubleReference) {
  const pl::OpDef &def = Op(pl::OpParams::RmsNormOpDef, 1);
  auto op = Create(def);
  ASSERT_TRUE(op);
  const pl::RmsNormOpDef *p = def.params_as_RmsNormOpDef();
  std::vector<float> w = Tensor(p->weight());
  ASSERT_EQ(w.size(), hidden_);
  Fill(def.inputs()->Get(0), 3, 11);
  const float *x = values_.Get(def.inputs()->Get(0));
  // A row of large values and one of zeros: eps keeps it finite.
  float *xw = values_.Get(def.inputs()->Get(0));
  for (uint32_t c = 0; c < hidden_; ++c)
    xw[hidden_ + c] = 1e3f * xw[hidden_ + c], xw[2 * hidden_ + c] = 0;
  ASSERT_TRUE(op->Run(MakeStep({1, 2, 3}, true)).ok());
  const float *y = values_.Get(def.result());
  for (uint32_t t = 0; t < 3; ++t) {
    double ss = 0;
    for (uint32_t c = 0; c < hidden_; ++c)
      ss += (double)x[t * hidden_ + c] * x[t * hidden_ + c];
    const double inv = 1 / std::sqrt(ss / hidden_ + p->eps());
    for (uint32_t c = 0; c < hidden_; ++c) {
      const double want = x[t * hidden_ + c] * inv * w[c];
      ASSERT_NEAR(y[t * hidden_ + c], want, 1e-5 * std::max(1.0, std::fabs(want)))
          << "row " << t << " col " << c;
    }
  }
}

TEST_F(PlanOps, AddSumsItsInputs) {
  const pl::OpDef &def = Op(pl::OpParams::AddOpDef);
  auto op = Create(def);
  ASSERT_TRUE(op);
  ASSERT_EQ(def.inputs()->size(), 2u);
  Fill(def.inputs()->Get(0), 2, 3);
  Fill(def.inputs()->Get(1), 2, 4);
  ASSERT_TRUE(op->Run(MakeStep({0, 0}, true)).ok());
  const float *a = values_.Get(def.inputs()->Get(0)),
              *b = values_.Get(def.inputs()->Get(1)),
              *y = values_.Get(def.result());
  for (uint32_t i = 0; i < 2 * hidden_; ++i)
    ASSERT_EQ(y[i], a[i] + b[i]);
}

// The MoE op routes every row on the host (router weight x hidden, then
// softmax top-k) and sends the slots in the mode of the step's kind.
TEST_F(PlanOps, MoeFfnSendsEachRowsTopKInItsMode) {
  const pl::OpDef &def = Op(pl::OpParams::MoeFfnOpDef);
  const pl::MoeFfnOpDef *p = def.params_as_MoeFfnOpDef();
  auto op = Create(def);
  ASSERT_TRUE(op);
  std::vector<float> gate = Tensor(p->router_weight());
  const uint32_t E = p->num_experts(), K = p->top_k();
  ASSERT_EQ(gate.size(), (uint64_t)E * hidden_);
  Fill(def.inputs()->Get(0), kRows, 5);
  const float *x = values_.Get(def.inputs()->Get(0));
  ASSERT_TRUE(op->Run(MakeStep({0, 0, 0, 0, 0}, true)).ok());
  ASSERT_TRUE(op->Run(MakeStep({0}, false)).ok());
  ASSERT_EQ(runner_.modes.size(), 2u);
  EXPECT_EQ(runner_.modes[0], p->step()->prefill_mode());
  EXPECT_EQ(runner_.modes[0], 6u);
  EXPECT_EQ(runner_.modes[1], p->step()->decode_mode());
  EXPECT_EQ(runner_.slot, p->step()->slot());
  EXPECT_EQ(runner_.top_k, K + p->num_shared());
  // The prefill step's rows, against a double reference.
  ASSERT_TRUE(op->Run(MakeStep({0, 0, 0, 0, 0}, true)).ok());
  ASSERT_EQ(runner_.sent.size(), (uint64_t)kRows * K);
  for (uint32_t t = 0; t < kRows; ++t) {
    std::vector<double> logit(E);
    for (uint32_t e = 0; e < E; ++e)
      for (uint32_t c = 0; c < hidden_; ++c)
        logit[e] += (double)gate[(uint64_t)e * hidden_ + c] * x[t * hidden_ + c];
    std::vector<uint32_t> want = RefTopK(logit, K); // softmax keeps order
    double mx = *std::max_element(logit.begin(), logit.end()), sum = 0,
           kept = 0;
    for (double l : logit)
      sum += std::exp(l - mx);
    for (uint32_t e : want)
      kept += std::exp(logit[e] - mx) / sum;
    for (uint32_t j = 0; j < K; ++j) {
      EXPECT_EQ(runner_.sent[t * K + j].expert, want[j]) << t << " " << j;
      const double pw = std::exp(logit[want[j]] - mx) / sum;
      EXPECT_NEAR(runner_.sent[t * K + j].weight,
                  p->norm_topk_prob() ? pw / kept : pw, 1e-4);
    }
  }
}

TEST_F(PlanOps, LmHeadProjectsOnlyTheLogitRows) {
  const pl::OpDef &def = Op(pl::OpParams::LmHeadOpDef);
  auto op = Create(def);
  ASSERT_TRUE(op);
  const pl::LmHeadOpDef *p = def.params_as_LmHeadOpDef();
  ASSERT_FALSE(p->on_ducks());
  std::vector<float> w = Tensor(p->weight());
  const uint32_t V = plan_->def().model()->vocab();
  ASSERT_EQ(w.size(), (uint64_t)V * hidden_);
  Fill(def.inputs()->Get(0), 4, 9);
  const float *x = values_.Get(def.inputs()->Get(0));
  std::vector<float> logits = {42.0f}; // appended after what is there
  logit_rows_ = {1, 3};
  ASSERT_TRUE(op->Run(MakeStep({0, 0, 0, 0}, true, &logits)).ok());
  ASSERT_EQ(logits.size(), 1 + 2u * V);
  EXPECT_EQ(logits[0], 42.0f);
  for (uint32_t i = 0; i < 2; ++i) {
    const uint32_t row = logit_rows_[i];
    for (uint32_t v = 0; v < V; ++v) {
      double want = 0, mag = 0;
      for (uint32_t c = 0; c < hidden_; ++c) {
        want += (double)w[(uint64_t)v * hidden_ + c] * x[row * hidden_ + c];
        mag += std::fabs((double)w[(uint64_t)v * hidden_ + c] *
                         x[row * hidden_ + c]);
      }
      ASSERT_NEAR(logits[1 + (uint64_t)i * V + v], want, 1e-5 * mag + 1e-6)
          << "row " << row << " vocab " << v;
    }
  }
}

/// Qwen3's attention (HF Qwen3Attention) for one sequence in double:
/// projections, per-head RMSNorm of q and k, NeoX RoPE, causal softmax
/// over positions 0..p, the query head's kv group, o_proj.
std::vector<double> RefGqa(const std::vector<std::vector<float>> &xs,
                           const pl::GqaAttentionOpDef &p,
                           const std::vector<float> &wq,
                           const std::vector<float> &wk,
                           const std::vector<float> &wv,
                           const std::vector<float> &wo,
                           const std::vector<float> &qn,
                           const std::vector<float> &kn, uint32_t hidden) {
  const uint32_t H = p.heads(), KV = p.kv_heads(), D = p.head_dim(),
                 half = D / 2;
  const size_t T = xs.size();
  auto proj = [&](const std::vector<float> &w, const std::vector<float> &x,
                  uint64_t rows) {
    std::vector<double> y(rows);
    for (uint64_t r = 0; r < rows; ++r)
      for (uint32_t c = 0; c < hidden; ++c)
        y[r] += (double)w[r * hidden + c] * x[c];
    return y;
  };
  auto normRope = [&](std::vector<double> &v, uint32_t heads,
                      const std::vector<float> &w, uint64_t pos) {
    for (uint32_t h = 0; h < heads; ++h) {
      double *x = v.data() + (uint64_t)h * D;
      double ss = 0;
      for (uint32_t i = 0; i < D; ++i)
        ss += x[i] * x[i];
      const double inv = 1 / std::sqrt(ss / D + p.norm_eps());
      for (uint32_t i = 0; i < D; ++i)
        x[i] = x[i] * inv * w[i];
      for (uint32_t i = 0; i < half; ++i) {
        const double a = pos * std::pow(p.rope_theta(), -2.0 * i / D);
        const double x0 = x[i], x1 = x[i + half];
        x[i] = x0 * std::cos(a) - x1 * std::sin(a);
        x[i + half] = x1 * std::cos(a) + x0 * std::sin(a);
      }
    }
  };
  std::vector<std::vector<double>> q(T), k(T), v(T);
  for (size_t t = 0; t < T; ++t) {
    q[t] = proj(wq, xs[t], (uint64_t)H * D);
    k[t] = proj(wk, xs[t], (uint64_t)KV * D);
    v[t] = proj(wv, xs[t], (uint64_t)KV * D);
    normRope(q[t], H, qn, t);
    normRope(k[t], KV, kn, t);
  }
  std::vector<double> out(T * hidden);
  for (size_t t = 0; t < T; ++t) {
    std::vector<double> attn((uint64_t)H * D);
    for (uint32_t h = 0; h < H; ++h) {
      const uint32_t g = h / (H / KV);
      std::vector<double> sc(t + 1);
      double mx = -INFINITY, sum = 0;
      for (size_t j = 0; j <= t; ++j) {
        for (uint32_t i = 0; i < D; ++i)
          sc[j] += q[t][h * D + i] * k[j][g * D + i];
        sc[j] /= std::sqrt((double)D);
        mx = std::max(mx, sc[j]);
      }
      for (double &s : sc)
        sum += s = std::exp(s - mx);
      for (size_t j = 0; j <= t; ++j)
        for (uint32_t i = 0; i < D; ++i)
          attn[h * D + i] += sc[j] / sum * v[j][g * D + i];
    }
    for (uint32_t r = 0; r < hidden; ++r)
      for (uint64_t c = 0; c < (uint64_t)H * D; ++c)
        out[t * hidden + r] += (double)wo[r * H * D + c] * attn[c];
  }
  return out;
}

// A prompt chunk of one sequence and a decode row, with another sequence's
// rows in the same steps: every row against the double reference of its
// own sequence (its cache holds only its own positions).
TEST_F(PlanOps, GqaAttentionMatchesDoubleReferencePerSequence) {
  const pl::OpDef &def = Op(pl::OpParams::GqaAttentionOpDef);
  const pl::GqaAttentionOpDef *p = def.params_as_GqaAttentionOpDef();
  auto op = Create(def, /*maxSeqs=*/2);
  ASSERT_TRUE(op);
  ASSERT_FALSE(p->rope_scaling());
  const std::vector<float> wq = Tensor(p->q_proj()), wk = Tensor(p->k_proj()),
                           wv = Tensor(p->v_proj()), wo = Tensor(p->o_proj()),
                           qn = Tensor(p->q_norm()), kn = Tensor(p->k_norm());
  ASSERT_GT(p->heads(), p->kv_heads()); // grouped
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0, 1);
  auto row = [&] {
    std::vector<float> x(hidden_);
    for (float &v : x)
      v = nd(rng);
    return x;
  };
  // Sequence 1: 5 prompt rows, then 1 decode row. Sequence 0: 2 rows in
  // the first step, 1 in the second.
  std::vector<std::vector<float>> a, b;
  for (int i = 0; i < 6; ++i)
    a.push_back(row());
  for (int i = 0; i < 3; ++i)
    b.push_back(row());
  const std::vector<double> refA = RefGqa(a, *p, wq, wk, wv, wo, qn, kn, hidden_),
                            refB = RefGqa(b, *p, wq, wk, wv, wo, qn, kn, hidden_);
  float *x = values_.Get(def.inputs()->Get(0));
  const float *y = values_.Get(def.result());
  auto check = [&](uint32_t r, const std::vector<double> &ref, size_t t) {
    double mag = 0;
    for (uint32_t c = 0; c < hidden_; ++c)
      mag = std::max(mag, std::fabs(ref[t * hidden_ + c]));
    for (uint32_t c = 0; c < hidden_; ++c)
      ASSERT_NEAR(y[r * hidden_ + c], ref[t * hidden_ + c], 1e-4 * mag + 1e-6)
          << "step row " << r << ", position " << t << ", column " << c;
  };
  // Step 1: b0, a0..a4, b1 (a prompt chunk between another sequence's rows).
  const std::vector<const std::vector<float> *> s1 = {&b[0], &a[0], &a[1], &a[2],
                                                      &a[3], &a[4], &b[1]};
  for (size_t r = 0; r < s1.size(); ++r)
    std::copy(s1[r]->begin(), s1[r]->end(), x + r * hidden_);
  ASSERT_TRUE(op->Run(MakeStep({0, 1, 1, 1, 1, 1, 0}, {0, 0, 1, 2, 3, 4, 1})).ok());
  check(0, refB, 0);
  for (uint32_t t = 0; t < 5; ++t)
    check(1 + t, refA, t);
  check(6, refB, 1);
  // Step 2: the decode rows a5 and b2.
  std::copy(a[5].begin(), a[5].end(), x);
  std::copy(b[2].begin(), b[2].end(), x + hidden_);
  ASSERT_TRUE(op->Run(MakeStep({1, 0}, {5, 2})).ok());
  check(0, refA, 5);
  check(1, refB, 2);
}

} // namespace
