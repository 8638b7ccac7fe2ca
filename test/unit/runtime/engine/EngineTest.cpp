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
    auto p = LoadedPlan::Load(PlanDir(GetParam()), HostOpKinds());
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
// the all_logits engine's last row (which runs the last layer past its
// attention on every row, where this one runs it on the last row only,
// and on none of the first chunk's), and the caches it leaves decode the
// next token to the same bits; with logits=false none.
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
  ASSERT_TRUE(last->Forward({5}, &a).ok());
  ASSERT_TRUE(all->Forward({5}, &b).ok());
  EXPECT_TRUE(SameBits(a, b));
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
  // The plan's FFN steps, in op order.
  std::vector<const ::duck::plan::DuckStepDef *> steps;
  std::vector<uint32_t> perRow;
  for (const ::duck::plan::OpDef *op : *plan_->def().ops())
    if (auto *d = op->params_as_DenseFfnOpDef()) {
      steps.push_back(d->step());
      perRow.push_back(0);
    } else if (auto *m = op->params_as_MoeFfnOpDef()) {
      steps.push_back(m->step());
      perRow.push_back(m->top_k() + m->num_shared());
    }
  const size_t F = steps.size();
  ASSERT_GT(F, 0u);
  std::vector<FakeFfnRunner::Call> calls = runner_->calls();
  // Chunks of 4 and 2 rows. The last layer's FFN comes after the last
  // attention, so it runs on the rows that want logits only: none of the
  // first chunk's, the second chunk's last (one row, the prefill mode).
  ASSERT_EQ(calls.size(), 2 * F - 1);
  for (size_t i = 0; i < calls.size(); ++i) {
    SCOPED_TRACE(i);
    const size_t layer = i < F - 1 ? i : i - (F - 1);
    EXPECT_EQ(calls[i].slot, steps[layer]->slot());
    EXPECT_EQ(calls[i].top_k, perRow[layer]);
    EXPECT_EQ(calls[i].mode, steps[layer]->prefill_mode());
    EXPECT_TRUE(calls[i].mode == 5 || calls[i].mode == 6);
    EXPECT_EQ(calls[i].n_tokens, i < F - 1              ? 4u
                                 : i + 1 < calls.size() ? 2u
                                                        : 1u);
  }
  runner_->Clear();
  ASSERT_TRUE(e->Forward({3}, &logits).ok());
  calls = runner_->calls();
  ASSERT_EQ(calls.size(), F);
  for (size_t i = 0; i < F; ++i) {
    EXPECT_EQ(calls[i].mode, steps[i]->decode_mode());
    EXPECT_TRUE(calls[i].mode == 0 || calls[i].mode == 1 || calls[i].mode == 4);
    EXPECT_EQ(calls[i].n_tokens, 1u);
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

// Prefix reuse (Engine::SaveKv/LoadKv): a sequence's cache rows, saved
// in two pieces and loaded into another slot in two other pieces (as the
// prefix store hands them back), over what that slot held before, let it
// go on exactly as a cold run of the whole prompt: the next token's logits
// are the same bits. Every cache kind: GQA in fp32 and f16, MLA's latent
// and rope key, the indexer's keys. A row left unloaded shows.
TEST_P(EngineTest, SavedCacheRowsContinueLikeAColdRun) {
  const bool mla = plan_->def().model()->kv_lora_rank() != 0;
  for (bool f16 : {false, true}) {
    if (f16 && mla)
      continue; // --kv-cache f16 is for GQA
    SCOPED_TRACE(f16 ? "f16" : "f32");
    EngineOptions o;
    o.max_seq = 64;
    o.prefill_chunk = 8;
    o.max_seqs = 2;
    o.max_rows = 9;
    o.kv_f16 = f16;
    o.threads = 3; // the copies split positions over the pool
    const std::vector<int32_t> prompt = Prompt(12, 3), other = Prompt(12, 8);
    const int32_t next = 7;
    std::vector<float> cold, out;
    {
      auto e = Make(o);
      ASSERT_TRUE(e);
      ASSERT_TRUE(e->Forward(prompt, &out).ok());
      ASSERT_TRUE(e->Forward({next}, &cold).ok());
    }
    auto e = Make(o);
    ASSERT_TRUE(e);
    const uint64_t bpt = e->saved_kv_bytes_per_token();
    EXPECT_EQ(bpt, e->kv_bytes_per_token()) << "no MTP module here";
    const absl::Span<const int32_t> p(prompt), q(other);
    const SeqChunk fill[4] = {{0, 0, p.subspan(0, 8), false},
                              {0, 8, p.subspan(8), false},
                              {1, 0, q.subspan(0, 8), false},
                              {1, 8, q.subspan(8), false}};
    for (const SeqChunk &c : fill)
      ASSERT_TRUE(e->RunBatch({&c, 1}, &out).ok());
    std::vector<uint8_t> rows(12 * bpt);
    e->SaveKv(0, 0, 5, rows.data());
    e->SaveKv(0, 5, 7, rows.data() + 5 * bpt);
    const SeqChunk step{1, 12, {&next, 1}, true};
    for (uint32_t loaded : {11u, 12u}) {
      e->LoadKv(1, 0, 7, rows.data());
      e->LoadKv(1, 7, loaded - 7, rows.data() + 7 * bpt);
      out.clear();
      ASSERT_TRUE(e->RunBatch({&step, 1}, &out).ok());
      if (loaded == 12)
        EXPECT_TRUE(SameBits(out, cold));
      else // position 11 still holds the other prompt's row
        EXPECT_FALSE(SameBits(out, cold));
    }
  }
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

// GQA: k and v of every kv head a layer, fp32 or half. DeepSeek-V3.2: the
// MLA latent and rope key plus the indexer's key a layer, fp32 only (a
// half cache is refused); a token's MLA reads stop at the indexer's top-k.
// Speculative decoding's verify step: the next token and 3 drafts in one
// step give every row the logits a one-token step gives when the rows
// before it are right; after a rejection, Rewind drops the positions past
// the accepted ones and the next step writes them again, with the logits
// of a run that never saw the wrong drafts.
TEST_P(EngineTest, VerifyRowsEqualDecodeStepsAndRewindForgets) {
  EngineOptions o;
  o.max_seq = 64;
  o.prefill_chunk = 8;
  const std::vector<int32_t> prompt = Prompt(9, 2), next = Prompt(5, 7);
  auto plain = Make(o), spec = Make(o);
  ASSERT_TRUE(plain && spec);
  std::vector<float> a, b;
  ASSERT_TRUE(plain->Forward(prompt, &a).ok());
  ASSERT_TRUE(spec->Forward(prompt, &b).ok());
  std::vector<std::vector<float>> want(next.size());
  for (size_t i = 0; i < next.size(); ++i)
    ASSERT_TRUE(plain->Forward({next[i]}, &want[i]).ok());
  // Right drafts: rows 0-3 are decode steps 0-3.
  ASSERT_TRUE(spec->Verify(absl::MakeConstSpan(next).subspan(0, 4), &b).ok());
  ASSERT_EQ(b.size(), 4u * vocab_);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_TRUE(SameBits(std::vector<float>(b.begin() + i * vocab_,
                                            b.begin() + (i + 1) * vocab_),
                         want[i]))
        << "row " << i;
  // Wrong drafts after the first two: keep 2, rewind, go on right.
  auto again = Make(o);
  ASSERT_TRUE(again->Forward(prompt, &b).ok());
  const std::vector<int32_t> wrong{next[0], next[1], 3, 4};
  ASSERT_TRUE(again->Verify(wrong, &b).ok());
  again->Rewind((uint32_t)prompt.size() + 2);
  EXPECT_EQ(again->position(), prompt.size() + 2);
  for (size_t i = 2; i < next.size(); ++i) {
    ASSERT_TRUE(again->Forward({next[i]}, &b).ok());
    EXPECT_TRUE(SameBits(b, want[i])) << "token " << i << " after the rewind";
  }
  again->Rewind(1000); // never forward
  EXPECT_EQ(again->position(), prompt.size() + next.size());
}

TEST_P(EngineTest, KvCacheBytesAToken) {
  const auto &m = *plan_->def().model();
  EngineOptions o;
  o.max_seq = 128;
  auto e = Make(o);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->vocab(), m.vocab());
  EXPECT_GT(e->host_weight_bytes_per_token(), 0u);
  o.kv_f16 = true;
  if (m.kv_lora_rank() == 0) {
    auto h = Make(o);
    ASSERT_TRUE(h);
    const uint64_t fp32 =
        (uint64_t)m.layers() * 2 * m.kv_heads() * m.head_dim() * 4;
    EXPECT_EQ(e->kv_bytes_per_token(), fp32);
    EXPECT_EQ(h->kv_bytes_per_token(), fp32 / 2);
    EXPECT_EQ(e->cache_read_bytes_per_token(100), 100 * fp32);
    return;
  }
  auto h = Engine::Create(*plan_, runner_.get(), o);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("--kv-cache f16 is for grouped-query "
                                      "attention"),
            std::string::npos)
      << h.status();
  const ::duck::plan::IndexerOpDef *idx = nullptr;
  for (const ::duck::plan::OpDef *op : *plan_->def().ops())
    if (op->params_as_IndexerOpDef())
      idx = op->params_as_IndexerOpDef();
  ASSERT_NE(idx, nullptr);
  const uint64_t mla = (uint64_t)(m.kv_lora_rank() + m.qk_rope_head_dim()) * 4,
                 key = (uint64_t)idx->head_dim() * 4;
  EXPECT_EQ(e->kv_bytes_per_token(), m.layers() * (mla + key));
  ASSERT_LT(idx->topk(), 100u);
  EXPECT_EQ(e->cache_read_bytes_per_token(100),
            m.layers() * (idx->topk() * mla + 100 * key));
  EXPECT_EQ(e->cache_read_bytes_per_token(10), 10 * m.layers() * (mla + key));
}

INSTANTIATE_TEST_SUITE_P(Plans, EngineTest,
                         ::testing::Values("qwen3-moe", "qwen3",
                                           "deepseek"),
                         [](const auto &info) {
                           const std::string p = info.param;
                           return p == "qwen3"       ? std::string("Dense")
                                  : p == "qwen3-moe" ? std::string("Moe")
                                                     : std::string("DeepSeek");
                         });

} // namespace

namespace {

/// A runner that "sends" its step, runs what was left for the meanwhile,
/// then "awaits" it, as ClusterFfnRunner does; it records the order.
class SendingRunner : public duck::runtime::FfnRunner {
public:
  std::vector<std::string> log;
  absl::Status Run(uint32_t, uint32_t, uint32_t, uint32_t,
                   const duck_expert_slot *, const float *, float *) override {
    log.push_back("sent");
    RunMeanwhile();
    log.push_back("answered");
    return absl::OkStatus();
  }
};

TEST(FfnRunnerMeanwhile, RunsOnceBetweenSendAndAnswer) {
  SendingRunner r;
  r.Meanwhile([&] { r.log.push_back("host work"); });
  ASSERT_TRUE(r.Run(0, 0, 1, 0, nullptr, nullptr, nullptr).ok());
  r.RunMeanwhile(); // the caller's call after the step: nothing left
  EXPECT_EQ(r.log, (std::vector<std::string>{"sent", "host work",
                                             "answered"}));
  // A runner that computes in place leaves it to the caller's call.
  FakeFfnRunner fake(4);
  int ran = 0;
  fake.Meanwhile([&] { ++ran; });
  EXPECT_EQ(ran, 0);
  fake.RunMeanwhile();
  fake.RunMeanwhile();
  EXPECT_EQ(ran, 1);
}

} // namespace
