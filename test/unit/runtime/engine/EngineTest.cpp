// The engine walking a compiled tiny plan's host program, its FFN steps
// answered by a fake runner (FakeFfnRunner.h): a prompt's logits do not
// depend on how it is cut into steps (a prefill chunk, single-token decode
// steps) or on the other sequences of a batched step, bit for bit; the
// ducks get the prefill and decode modes of the plan; RunBatch refuses
// steps it cannot run.
#include "duck/runtime/engine/Engine.h"

#include "TestPlans.h"
#include "engine/FakeFfnRunner.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

namespace {

using namespace duck::runtime;
using duck::runtime::test::FakeFfnRunner;
using duck::runtime::test::PlanDir;

class EngineTest : public ::testing::TestWithParam<const char *> {
protected:
  void SetUp() override {
    auto p = LoadedPlan::Load(PlanDir(GetParam()));
    ASSERT_TRUE(p.ok()) << p.status();
    plan_ = std::move(*p);
    runner_ = std::make_unique<FakeFfnRunner>(plan_->def().model()->hidden());
    vocab_ = plan_->def().model()->vocab();
  }
  std::unique_ptr<Engine> Make(EngineOptions o) {
    auto e = Engine::Create(*plan_, runner_.get(), o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }
  std::vector<int32_t> Prompt(uint32_t n, uint32_t seed) const {
    std::vector<int32_t> p(n);
    for (uint32_t i = 0; i < n; ++i)
      p[i] = (int32_t)((seed * 131 + i * 37 + 5) % vocab_);
    return p;
  }
  /// Whether two logit vectors are the same bits; says where not.
  static ::testing::AssertionResult SameBits(const std::vector<float> &a,
                                             const std::vector<float> &b) {
    if (a.size() != b.size())
      return ::testing::AssertionFailure()
             << "sizes " << a.size() << " and " << b.size();
    for (size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(&a[i], &b[i], 4) != 0)
        return ::testing::AssertionFailure()
               << "first difference at " << i << ": " << a[i] << " vs "
               << b[i] << " (" << std::count_if(a.begin(), a.end(), [&](
                                                 const float &x) {
                    size_t j = &x - a.data();
                    return std::memcmp(&a[j], &b[j], 4) != 0;
                  })
               << " differ)";
    return ::testing::AssertionSuccess();
  }

  std::unique_ptr<LoadedPlan> plan_;
  std::unique_ptr<FakeFfnRunner> runner_;
  uint32_t vocab_ = 0;
};

// Prefill of 11 tokens (chunks of 4, 4 and 3: the GEMM and the small-batch
// paths) gives every token the logits 11 single-token decode steps give.
TEST_P(EngineTest, PrefillEqualsDecodeStepsBitForBit) {
  EngineOptions o;
  o.max_seq = 64;
  o.prefill_chunk = 4;
  o.all_logits = true;
  auto prefill = Make(o), decode = Make(o);
  ASSERT_TRUE(prefill && decode);
  const std::vector<int32_t> prompt = Prompt(11, 1);
  std::vector<float> a, b;
  ASSERT_TRUE(prefill->Forward(prompt, &a).ok());
  ASSERT_EQ(a.size(), prompt.size() * vocab_);
  ASSERT_TRUE(decode->ForwardDecodeOnly(prompt, &b).ok());
  EXPECT_TRUE(SameBits(a, b));
  EXPECT_EQ(prefill->position(), 11u);
  EXPECT_EQ(decode->position(), 11u);
  // The logits are not all alike (the test would pass on a constant).
  EXPECT_NE(std::memcmp(a.data(), a.data() + vocab_, vocab_ * 4), 0);
  // Then both decode the same next token to the same bits.
  std::vector<float> c, d;
  ASSERT_TRUE(prefill->Forward({7}, &c).ok());
  ASSERT_TRUE(decode->Forward({7}, &d).ok());
  EXPECT_EQ(c.size(), vocab_);
  EXPECT_TRUE(SameBits(std::vector<float>(c.end() - vocab_, c.end()),
                       std::vector<float>(d.end() - vocab_, d.end())));
}

// Without all_logits, Forward gives the last token's logits, the same as
// the all_logits engine's last row; with logits=false none.
TEST_P(EngineTest, ForwardGivesTheLastRowsLogits) {
  EngineOptions o;
  o.max_seq = 64;
  o.prefill_chunk = 4;
  auto last = Make(o);
  o.all_logits = true;
  auto all = Make(o);
  ASSERT_TRUE(last && all);
  const std::vector<int32_t> prompt = Prompt(6, 2);
  std::vector<float> a, b;
  ASSERT_TRUE(last->Forward(prompt, &a).ok());
  ASSERT_TRUE(all->Forward(prompt, &b).ok());
  ASSERT_EQ(a.size(), vocab_);
  EXPECT_TRUE(SameBits(a, std::vector<float>(b.end() - vocab_, b.end())));
  last->Reset();
  std::vector<float> none;
  ASSERT_TRUE(last->Forward(prompt, &none, /*logits=*/false).ok());
  EXPECT_TRUE(none.empty());
}

// The FFN steps the ducks would get: a prefill chunk in the prefill mode
// with all its rows, a decode step in the decode mode with one.
TEST_P(EngineTest, FfnStepsUseThePlansModes) {
  EngineOptions o;
  o.max_seq = 64;
  o.prefill_chunk = 4;
  auto e = Make(o);
  ASSERT_TRUE(e);
  std::vector<float> logits;
  ASSERT_TRUE(e->Forward(Prompt(6, 3), &logits).ok());
  const bool moe = std::string(GetParam()) == "qwen3-moe";
  const uint32_t layers = plan_->def().model()->layers();
  std::vector<FakeFfnRunner::Call> calls = runner_->calls();
  ASSERT_EQ(calls.size(), 2u * layers); // chunks of 4 and 2
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].mode, moe ? 6u : 5u) << i;
    EXPECT_EQ(calls[i].n_tokens, i < layers ? 4u : 2u) << i;
    EXPECT_EQ(calls[i].slot, i % layers) << i;
    EXPECT_EQ(calls[i].top_k, moe ? 4u : 0u) << i; // top 4, no shared
  }
  runner_->Clear();
  ASSERT_TRUE(e->Forward({3}, &logits).ok());
  calls = runner_->calls();
  ASSERT_EQ(calls.size(), layers);
  for (const auto &c : calls) {
    EXPECT_TRUE(moe ? c.mode == 1 || c.mode == 4 : c.mode == 0) << c.mode;
    EXPECT_EQ(c.n_tokens, 1u);
  }
}

// Two sequences in one step get what each gets alone, bit for bit: one
// decoding while the other's prompt chunk joins.
TEST_P(EngineTest, BatchedRowsEqualEachSequenceAlone) {
  EngineOptions o;
  o.max_seq = 64;
  o.prefill_chunk = 8;
  o.max_seqs = 2;
  o.max_rows = 9;
  const std::vector<int32_t> pa = Prompt(5, 4), pb = Prompt(7, 5);
  // Alone: A's prompt then token 9; B's prompt.
  std::vector<float> aloneA, aloneB, tmp;
  {
    auto e = Make(o);
    ASSERT_TRUE(e);
    ASSERT_TRUE(e->Forward(pa, &tmp).ok());
    ASSERT_TRUE(e->Forward({9}, &aloneA).ok());
    e->Reset();
    ASSERT_TRUE(e->Forward(pb, &aloneB).ok());
  }
  auto e = Make(o);
  ASSERT_TRUE(e);
  std::vector<float> out;
  const SeqChunk first{1, 0, pa, false}; // A in slot 1
  ASSERT_TRUE(e->RunBatch({&first, 1}, &out).ok());
  EXPECT_TRUE(out.empty());
  const int32_t nine = 9;
  const SeqChunk both[2] = {{1, 5, {&nine, 1}, true}, {0, 0, pb, true}};
  ASSERT_TRUE(e->RunBatch(both, &out).ok());
  ASSERT_EQ(out.size(), 2u * vocab_);
  EXPECT_TRUE(SameBits(std::vector<float>(out.begin(), out.begin() + vocab_),
                       aloneA));
  EXPECT_TRUE(SameBits(std::vector<float>(out.begin() + vocab_, out.end()),
                       aloneB));
}

TEST_P(EngineTest, RunBatchRefusesStepsItCannotRun) {
  EngineOptions o;
  o.max_seq = 16;
  o.prefill_chunk = 4;
  o.max_seqs = 2;
  o.max_rows = 6;
  auto e = Make(o);
  ASSERT_TRUE(e);
  const std::vector<int32_t> four = Prompt(4, 6), three = Prompt(3, 7);
  std::vector<float> out;
  auto run = [&](std::vector<SeqChunk> c) { return e->RunBatch(c, &out); };
  absl::Status s = run({{0, 0, four, true}, {1, 0, three, true}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a batched step of 7 rows; the engine takes 6"),
            std::string::npos)
      << s;
  s = run({{2, 0, three, true}});
  EXPECT_NE(s.message().find("sequence 2 of a batched step; the engine has 2"),
            std::string::npos)
      << s;
  s = run({{1, 0, three, true}, {1, 3, {three.data(), 1}, true}});
  EXPECT_NE(s.message().find("sequence 1 appears twice"), std::string::npos)
      << s;
  s = run({{0, 14, three, true}});
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("sequence of 17 tokens exceeds --max-seq 16"),
            std::string::npos)
      << s;
  s = run({});
  EXPECT_NE(s.message().find("a batched step with no tokens"),
            std::string::npos)
      << s;
  EXPECT_TRUE(runner_->calls().empty()) << "a refused step reached the ducks";
  const int32_t bad = (int32_t)vocab_;
  s = run({{0, 0, {&bad, 1}, true}});
  EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos)
      << s;
  // A failing duck step is the step's error.
  runner_->Fail(absl::UnavailableError("duck 1 is gone"));
  s = run({{0, 0, three, true}});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
}

TEST_P(EngineTest, KvCacheBytesAToken) {
  const auto &m = *plan_->def().model();
  const uint64_t fp32 = (uint64_t)m.layers() * 2 * m.kv_heads() * m.head_dim() * 4;
  EngineOptions o;
  o.max_seq = 16;
  auto e = Make(o);
  o.kv_f16 = true;
  auto h = Make(o);
  ASSERT_TRUE(e && h);
  EXPECT_EQ(e->kv_bytes_per_token(), fp32);
  EXPECT_EQ(h->kv_bytes_per_token(), fp32 / 2);
  EXPECT_EQ(e->cache_read_bytes_per_token(10), 10 * fp32);
  EXPECT_GT(e->host_weight_bytes_per_token(), 0u);
  EXPECT_EQ(e->vocab(), m.vocab());
}

INSTANTIATE_TEST_SUITE_P(Plans, EngineTest,
                         ::testing::Values("qwen3-moe", "qwen3"),
                         [](const auto &info) {
                           return std::string(info.param) == "qwen3"
                                      ? std::string("Dense")
                                      : std::string("Moe");
                         });

} // namespace
