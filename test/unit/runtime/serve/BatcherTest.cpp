// Continuous batching (serve/Batcher.h) on a real engine over a compiled
// tiny plan, its FFN steps answered by a fake runner (FakeFfnRunner.h,
// which also tells how many rows every step carried): requests join and
// leave between steps, a step carries every decoding row plus at most a
// chunk of prompt rows (oldest prompt first), every request gets the
// tokens it would get alone, and cancellation, stop tokens, errors and
// Stop end requests as documented.
#include "duck/runtime/serve/Batcher.h"

#include "TestPlans.h"
#include "engine/FakeFfnRunner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <ostream>
#include <thread>

namespace {

using namespace duck::runtime;
using duck::runtime::test::FakeFfnRunner;
using duck::runtime::test::PlanDir;

/// What one request saw.
struct Rec {
  std::vector<int32_t> tokens;
  FinishReason why = FinishReason::kError;
  absl::Status error;
  int done = 0;
  std::vector<uint64_t> token_steps; // the step count when each came
};

class BatcherTest : public ::testing::Test {
protected:
  static constexpr uint32_t kChunk = 4;

  void SetUp() override {
    auto p = LoadedPlan::Load(PlanDir(plan_name_), HostOpKinds());
    ASSERT_TRUE(p.ok()) << p.status();
    plan_ = std::move(*p);
    runner_ = std::make_unique<FakeFfnRunner>(plan_->def().model()->hidden());
    layers_ = plan_->def().model()->layers();
  }
  void TearDown() override { StopRun(); }

  /// Sized as Session::Start sizes the engine for `duckrun serve`.
  EngineOptions Options(uint32_t parallel) const {
    EngineOptions o;
    o.max_seq = 64;
    o.prefill_chunk = kChunk;
    o.max_seqs = parallel;
    o.max_rows = parallel > 1 ? kChunk + parallel : kChunk;
    o.kv_f16 = kv_f16_;
    o.mtp = mtp_;
    return o;
  }
  void Make(uint32_t parallel, uint32_t queue_limit = 64,
            uint64_t kv_budget = 0) {
    auto e = Engine::Create(*plan_, runner_.get(), Options(parallel));
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    BatcherOptions bo;
    bo.parallel = parallel;
    bo.prefill_chunk = kChunk;
    bo.queue_limit = queue_limit;
    bo.kv_budget = kv_budget;
    bo.mtp = mtp_;
    batcher_ = std::make_unique<Batcher>(*engine_, bo);
    batcher_->SetAfterStep([this] { ++steps_; });
  }
  void StartRun() {
    run_ = std::thread([this] { batcher_->Run(); });
  }
  void StopRun() {
    if (run_.joinable()) {
      batcher_->Stop();
      run_.join();
    }
  }

  /// The tokens `prompt` gets alone: greedy, one-shot on its own engine.
  std::vector<int32_t> Alone(const std::vector<int32_t> &prompt, uint32_t n) {
    FakeFfnRunner runner(plan_->def().model()->hidden());
    auto e = Engine::Create(*plan_, &runner, Options(1));
    EXPECT_TRUE(e.ok()) << e.status();
    std::vector<int32_t> out;
    if (!e.ok())
      return out;
    Sampler sampler(SamplerOptions{});
    std::vector<float> logits;
    EXPECT_TRUE((*e)->Forward(prompt, &logits).ok());
    for (uint32_t i = 0; i < n; ++i) {
      out.push_back(sampler.Sample(logits));
      if (i + 1 < n) {
        EXPECT_TRUE((*e)->Forward({out.back()}, &logits).ok());
      }
    }
    return out;
  }
  std::vector<int32_t> Prompt(uint32_t n, uint32_t seed) const {
    std::vector<int32_t> p(n);
    for (uint32_t i = 0; i < n; ++i)
      p[i] = (int32_t)((seed * 97 + i * 29 + 3) % plan_->def().model()->vocab());
    return p;
  }

  /// A request that records into `rec`; `on_token` may add a verdict.
  GenRequest Request(Rec *rec, std::vector<int32_t> prompt, uint32_t max_tokens,
                     std::function<TokenVerdict(size_t n)> verdict = nullptr) {
    GenRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.on_token = [this, rec, verdict](int32_t id) {
      std::lock_guard<std::mutex> lock(mu_);
      rec->tokens.push_back(id);
      rec->token_steps.push_back(steps_);
      return verdict ? verdict(rec->tokens.size()) : TokenVerdict::kContinue;
    };
    r.on_done = [this, rec](FinishReason why, const absl::Status &error) {
      std::lock_guard<std::mutex> lock(mu_);
      rec->why = why;
      rec->error = error;
      ++rec->done;
      cv_.notify_all();
    };
    return r;
  }
  uint64_t Submit(GenRequest r) {
    auto id = batcher_->Submit(std::move(r));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }
  /// Waits (10 s at most) until every one of `recs` is done.
  bool WaitDone(std::initializer_list<Rec *> recs) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] {
      for (Rec *r : recs)
        if (r->done == 0)
          return false;
      return true;
    });
  }
  /// The rows of every step so far: each FFN layer but the last sees the
  /// step's rows, the last (after the last attention) only the rows that
  /// want logits, and no call when none does (the MTP module: every row).
  std::vector<uint32_t> StepRows() const {
    std::vector<uint32_t> rows;
    std::vector<FakeFfnRunner::Call> calls = runner_->calls();
    EXPECT_GE(layers_, 2u);
    const uint32_t first = calls.empty() ? 0 : calls[0].slot;
    for (size_t i = 0; i < calls.size();) {
      EXPECT_EQ(calls[i].slot, first) << "call " << i;
      rows.push_back(calls[i].n_tokens);
      size_t l = 1;
      for (; l + 1 < layers_ && i + l < calls.size(); ++l)
        EXPECT_EQ(calls[i + l].n_tokens, calls[i].n_tokens);
      if (i + l < calls.size() && calls[i + l].slot != first) {
        if (mtp_)
          EXPECT_EQ(calls[i + l].n_tokens, calls[i].n_tokens);
        else
          EXPECT_LE(calls[i + l].n_tokens, calls[i].n_tokens);
        ++l;
      } else {
        EXPECT_FALSE(mtp_) << "the MTP module needs the last layer's rows";
      }
      i += l;
    }
    return rows;
  }

  std::string plan_name_ = "qwen3-moe";
  bool kv_f16_ = false;
  bool mtp_ = false; // the engine's MTP module and the batcher's MTP drafts
  std::unique_ptr<LoadedPlan> plan_;
  std::unique_ptr<FakeFfnRunner> runner_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Batcher> batcher_;
  std::thread run_;
  uint32_t layers_ = 0;
  std::atomic<uint64_t> steps_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

// Two prompts of 6 with a chunk of 4: A's first 4 rows; A's last 2 and
// B's first 2; A decoding and B's last 4; both decoding; B alone.
TEST_F(BatcherTest, StepsCarryDecodeRowsPlusAChunkOfPromptOldestFirst) {
  Make(2);
  Rec a, b;
  const auto pa = Prompt(6, 1), pb = Prompt(6, 2);
  Submit(Request(&a, pa, 3));
  Submit(Request(&b, pb, 3));
  StartRun();
  ASSERT_TRUE(WaitDone({&a, &b}));
  EXPECT_EQ(StepRows(), (std::vector<uint32_t>{4, 4, 5, 2, 1}));
  EXPECT_EQ(a.why, FinishReason::kLength);
  EXPECT_EQ(b.why, FinishReason::kLength);
  EXPECT_EQ(a.done, 1);
  EXPECT_EQ(a.tokens, Alone(pa, 3));
  EXPECT_EQ(b.tokens, Alone(pb, 3));
  // A's first token after step 2, B's after step 3 (steps_ counts the
  // steps finished before the token's).
  EXPECT_EQ(a.token_steps, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(b.token_steps, (std::vector<uint64_t>{2, 3, 4}));
  StopRun();
  BatcherStats st = batcher_->Stats();
  EXPECT_EQ(st.steps, 5u);
  EXPECT_EQ(st.rows, 16u);
  EXPECT_EQ(st.prompt_tokens, 12u);
  EXPECT_EQ(st.generated_tokens, 6u);
  EXPECT_EQ(st.max_decode_rows, 2u);
  EXPECT_EQ(st.active, 0u);
  EXPECT_FALSE(batcher_->Busy());
}

// Prefix reuse: a second turn (the first turn's prompt, the tokens it
// generated and a few more) takes the slot the first left, skips the 25
// positions its cache already holds (the prompt and the 5 generated tokens
// that were fed; the 6th never was) and computes only the 3 new rows, yet
// gets the very tokens a cold prefill of the whole prompt gives.
TEST_F(BatcherTest, ASecondTurnReusesTheCachedPrefixAndMatchesAColdRun) {
  Make(1);
  Rec a, b;
  const auto pa = Prompt(20, 7);
  Submit(Request(&a, pa, 6));
  StartRun();
  ASSERT_TRUE(WaitDone({&a}));
  ASSERT_EQ(a.tokens.size(), 6u);
  std::vector<int32_t> pb = pa;
  pb.insert(pb.end(), a.tokens.begin(), a.tokens.begin() + 5);
  for (int32_t t : Prompt(3, 9))
    pb.push_back(t);
  std::atomic<int64_t> cached{-1};
  GenRequest rb = Request(&b, pb, 5);
  rb.on_admit = [&](uint32_t n) { cached = n; };
  const BatcherStats before = batcher_->Stats();
  Submit(std::move(rb));
  ASSERT_TRUE(WaitDone({&b}));
  EXPECT_EQ(cached.load(), 25);
  const BatcherStats after = batcher_->Stats();
  EXPECT_EQ(after.cached_tokens - before.cached_tokens, 25u);
  EXPECT_EQ(after.prompt_tokens - before.prompt_tokens, 3u);
  EXPECT_EQ(b.tokens, Alone(pb, 5));
  // A prompt that shares nothing starts from position 0 in the same slot,
  // and one that is wholly cached still runs its last token (its logits).
  Rec c, d;
  Submit(Request(&c, Prompt(12, 3), 2));
  ASSERT_TRUE(WaitDone({&c}));
  EXPECT_EQ(c.tokens, Alone(Prompt(12, 3), 2));
  std::atomic<int64_t> cachedD{-1};
  GenRequest rd = Request(&d, Prompt(10, 3), 2);
  rd.on_admit = [&](uint32_t n) { cachedD = n; };
  Submit(std::move(rd));
  ASSERT_TRUE(WaitDone({&d}));
  EXPECT_EQ(cachedD.load(), 9);
  EXPECT_EQ(d.tokens, Alone(Prompt(10, 3), 2));
}

// With two free slots a request goes to the one holding its prefix, not
// to the next in order; with reuse off it takes the next and recomputes.
// Either way it gets the tokens a cold run gives.
TEST_F(BatcherTest, ARequestPicksTheSlotHoldingItsPrefix) {
  for (bool reuse : {true, false}) {
    SCOPED_TRACE(reuse ? "reuse" : "no reuse");
    auto e = Engine::Create(*plan_, runner_.get(), Options(2));
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    BatcherOptions bo;
    bo.parallel = 2;
    bo.prefill_chunk = kChunk;
    bo.reuse_prefix = reuse;
    batcher_ = std::make_unique<Batcher>(*engine_, bo);
    Rec a, b, c;
    Submit(Request(&a, Prompt(8, 1), 2)); // slot 0
    Submit(Request(&b, Prompt(8, 2), 3)); // slot 1, done last
    StartRun();
    ASSERT_TRUE(WaitDone({&a, &b}));
    // Slot 1 is the next in order now; slot 0 holds a's prompt.
    std::vector<int32_t> pc = Prompt(8, 1);
    pc.push_back(a.tokens[0] == 5 ? 6 : 5);
    std::atomic<int64_t> cached{-1};
    GenRequest rc = Request(&c, pc, 2);
    rc.on_admit = [&](uint32_t n) { cached = n; };
    Submit(std::move(rc));
    ASSERT_TRUE(WaitDone({&c}));
    // a's prompt and its one fed token; c shares the prompt.
    EXPECT_EQ(cached.load(), reuse ? 8 : 0);
    EXPECT_EQ(c.tokens, Alone(pc, 2));
    StopRun();
  }
}

// The prefix store (--kv-budget) over every cache kind: "qwen3-f16" is the
// dense plan with --kv-cache f16; deepseek keeps MLA latents and indexer
// keys.
class BatcherStoreTest : public BatcherTest,
                         public ::testing::WithParamInterface<const char *> {
protected:
  void SetUp() override {
    const std::string p = GetParam();
    kv_f16_ = p == "qwen3-f16";
    plan_name_ = kv_f16_ ? "qwen3" : p;
    BatcherTest::SetUp();
  }
  /// A generation's tokens and, for each, its log probability and the
  /// kTop best (LogprobsAt of its logits row): equal answers had the same
  /// logits, not only the same argmax.
  static constexpr uint32_t kTop = 64;
  struct Answer {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    bool operator==(const Answer &o) const {
      return tokens == o.tokens && logprobs == o.logprobs;
    }
    friend std::ostream &operator<<(std::ostream &os, const Answer &a) {
      for (size_t i = 0; i < a.tokens.size(); ++i)
        os << a.tokens[i] << "(" << a.logprobs[i] << ") ";
      return os;
    }
  };
  /// Runs `prompt` for `n` tokens (lookup drafts: `speculative`, from the
  /// text and `corpus`); the cached tokens its admission reported go to
  /// `*cached`.
  Answer Run(const std::vector<int32_t> &prompt, uint32_t n, int64_t *cached,
             uint32_t speculative = 0, std::vector<int32_t> corpus = {}) {
    Rec r;
    Answer out;
    std::atomic<int64_t> c{-1};
    GenRequest g = Recording(&r, prompt, n, &out, &c);
    g.speculative = speculative;
    g.lookup_corpus = std::move(corpus);
    Submit(std::move(g));
    EXPECT_TRUE(WaitDone({&r}));
    *cached = c.load();
    out.tokens = r.tokens;
    return out;
  }
  /// A request recording into `rec` and `out` (tokens when done) and the
  /// cached tokens its admission reports into `cached`.
  GenRequest Recording(Rec *rec, const std::vector<int32_t> &prompt, uint32_t n,
                       Answer *out, std::atomic<int64_t> *cached) {
    GenRequest g = Request(rec, prompt, n);
    g.on_admit = [cached](uint32_t k) { *cached = k; };
    g.top_logprobs = kTop;
    g.on_logprobs = [out](int32_t, const TokenLogprobs &lp) {
      out->logprobs.push_back(lp.logprob);
      for (const auto &[id, v] : lp.top)
        out->logprobs.push_back(v);
    };
    return g;
  }
  /// What `prompt` gets alone, one-shot on its own engine (Alone's tokens).
  Answer Cold(const std::vector<int32_t> &prompt, uint32_t n) {
    FakeFfnRunner runner(plan_->def().model()->hidden());
    auto e = Engine::Create(*plan_, &runner, Options(1));
    EXPECT_TRUE(e.ok()) << e.status();
    Answer out;
    Sampler sampler(SamplerOptions{});
    std::vector<float> logits;
    EXPECT_TRUE(e.ok() && (*e)->Forward(prompt, &logits).ok());
    for (uint32_t i = 0; e.ok() && i < n; ++i) {
      out.tokens.push_back(sampler.Sample(logits));
      const TokenLogprobs lp = LogprobsAt(logits, out.tokens.back(), kTop);
      out.logprobs.push_back(lp.logprob);
      for (const auto &[id, v] : lp.top)
        out.logprobs.push_back(v);
      if (i + 1 < n) {
        EXPECT_TRUE((*e)->Forward({out.tokens.back()}, &logits).ok());
      }
    }
    return out;
  }
};

// One slot, conversations A, B, then A' (A's prompt, the 3 tokens it fed
// back and 4 new ones): B overwrote the slot, so only the store can give
// A' its 15 positions; with budget 0 it gets none. Either way every answer
// is a cold run's.
TEST_P(BatcherStoreTest, AConversationComesBackAfterAnotherTookTheSlot) {
  for (uint64_t budget : {uint64_t{64} << 20, uint64_t{0}}) {
    SCOPED_TRACE(budget ? "store" : "no store");
    Make(1, 64, budget);
    StartRun();
    const auto pa = Prompt(12, 1), pb = Prompt(10, 2);
    int64_t cached = -1;
    const Answer a = Run(pa, 4, &cached);
    EXPECT_EQ(a, Cold(pa, 4));
    EXPECT_EQ(Run(pb, 3, &cached), Cold(pb, 3));
    EXPECT_EQ(cached, 0);
    std::vector<int32_t> pa2 = pa;
    pa2.insert(pa2.end(), a.tokens.begin(), a.tokens.begin() + 3);
    for (int32_t t : Prompt(4, 3))
      pa2.push_back(t);
    EXPECT_EQ(Run(pa2, 5, &cached), Cold(pa2, 5));
    EXPECT_EQ(cached, budget ? 15 : 0);
    StopRun();
    const BatcherStats st = batcher_->Stats();
    EXPECT_EQ(st.cached_tokens, budget ? 15u : 0u);
    if (budget) {
      // A's 15 positions went in when B took the slot, B's 12 when A'
      // did (the store keeps them; A' itself is still in the slot): a page
      // each.
      EXPECT_EQ(st.store.tokens, 27u);
      EXPECT_EQ(st.store.bytes,
                2 * PrefixStore::kPageTokens * engine_->kv_bytes_per_token());
      EXPECT_EQ(st.store.entries, 2u);
      EXPECT_EQ(st.store.budget, budget);
    } else {
      EXPECT_EQ(st.store.entries, 0u);
    }
  }
}

// A budget of a page and a half keeps the first page of A's 21 positions
// (16): A' reuses those, and the rest it computes gives the same tokens.
// B does not fit beside them and does not evict them: A' is about to read
// them.
TEST_P(BatcherStoreTest, ASmallBudgetKeepsWhatFits) {
  Make(1);
  const uint64_t page =
      engine_->kv_bytes_per_token() * PrefixStore::kPageTokens;
  Make(1, 64, page + page / 2);
  StartRun();
  const auto pa = Prompt(20, 4), pb = Prompt(9, 5);
  int64_t cached = -1;
  Run(pa, 2, &cached);
  Run(pb, 2, &cached);
  std::vector<int32_t> pa2 = pa;
  pa2.push_back(pa[0] == 5 ? 6 : 5);
  EXPECT_EQ(Run(pa2, 4, &cached), Cold(pa2, 4));
  EXPECT_EQ(cached, 16);
  StopRun();
  EXPECT_EQ(batcher_->Stats().store.tokens, 16u);
  EXPECT_EQ(batcher_->Stats().store.evicted_tokens, 0u);
}

// Speculative decoding writes rows for drafts that are then rejected (a
// corpus that continues the prompt with wrong tokens); only accepted
// positions are stored, so A' after B still gets a cold run's tokens from
// A's stored prefix.
TEST_P(BatcherStoreTest, OnlyAcceptedSpeculativePositionsAreStored) {
  Make(1, 64, uint64_t{64} << 20);
  StartRun();
  const std::vector<int32_t> pa = Prompt(12, 6);
  const Answer want = Cold(pa, 10);
  // The prompt's tail and the first token, then wrong ones: the first
  // decode step's drafts.
  std::vector<int32_t> corpus(pa.end() - 4, pa.end());
  corpus.push_back(want.tokens[0]);
  for (size_t i = 1; i < want.tokens.size(); ++i)
    corpus.push_back((want.tokens[i] + 1) %
                     (int32_t)plan_->def().model()->vocab());
  int64_t cached = -1;
  const Answer a = Run(pa, 10, &cached, 4, corpus);
  EXPECT_EQ(a, want);
  const BatcherStats st = batcher_->Stats();
  EXPECT_GT(st.drafts_proposed, st.drafts_accepted); // some were rejected
  Run(Prompt(7, 7), 2, &cached);
  std::vector<int32_t> pa2 = pa;
  pa2.insert(pa2.end(), a.tokens.begin(), a.tokens.begin() + 9);
  pa2.push_back(3);
  EXPECT_EQ(Run(pa2, 6, &cached, 4), Cold(pa2, 6));
  EXPECT_EQ(cached, 21); // the prompt and the 9 tokens fed back
  StopRun();
}

// Two slots: A and B, then C and D together (both slots overwritten, A
// and B into the store), then A' and B' together (B' submitted as A' is
// admitted): each gets its own stored prefix copied into its slot, and
// both decode together to a cold run's answer.
TEST_P(BatcherStoreTest, TwoSlotsTakeTheirPrefixesBackTogether) {
  Make(2, 64, uint64_t{64} << 20);
  StartRun();
  int64_t cached = -1;
  const auto pa = Prompt(10, 11), pb = Prompt(9, 12);
  const Answer a = Run(pa, 3, &cached), b = Run(pb, 3, &cached);
  const auto both = [&](const std::vector<int32_t> &p,
                        const std::vector<int32_t> &q, uint32_t n, int64_t *cp,
                        int64_t *cq) {
    Rec rp, rq;
    Answer ap, aq;
    std::atomic<int64_t> kp{-1}, kq{-1};
    // q is submitted as p is admitted (on Run's thread, before p's first
    // step), so that it joins at the next step whatever the timing: the
    // two decode together.
    GenRequest gq = Recording(&rq, q, n, &aq, &kq);
    GenRequest gp = Recording(&rp, p, n, &ap, &kp);
    gp.on_admit = [this, &kp, &gq](uint32_t k) {
      kp = k;
      Submit(std::move(gq));
    };
    Submit(std::move(gp));
    EXPECT_TRUE(WaitDone({&rp, &rq}));
    ap.tokens = rp.tokens;
    aq.tokens = rq.tokens;
    *cp = kp.load();
    *cq = kq.load();
    return std::make_pair(ap, aq);
  };
  int64_t c1 = -1, c2 = -1;
  both(Prompt(8, 13), Prompt(8, 14), 2, &c1, &c2);
  EXPECT_EQ(c1 + c2, 0);
  std::vector<int32_t> pa2 = pa, pb2 = pb;
  pa2.insert(pa2.end(), a.tokens.begin(), a.tokens.begin() + 2);
  pb2.insert(pb2.end(), b.tokens.begin(), b.tokens.begin() + 2);
  pa2.push_back(7);
  pb2.push_back(8);
  const auto [a2, b2] = both(pa2, pb2, 4, &c1, &c2);
  EXPECT_EQ(c1, 12); // the prompt and the 2 tokens fed back
  EXPECT_EQ(c2, 11);
  EXPECT_EQ(a2, Cold(pa2, 4));
  EXPECT_EQ(b2, Cold(pb2, 4));
  StopRun();
  EXPECT_GE(batcher_->Stats().max_decode_rows, 2u);
}

INSTANTIATE_TEST_SUITE_P(Plans, BatcherStoreTest,
                         ::testing::Values("qwen3-moe", "qwen3", "qwen3-f16",
                                           "deepseek"),
                         [](const auto &info) {
                           std::string p = info.param;
                           std::replace(p.begin(), p.end(), '-', '_');
                           return p;
                         });

// Speculative decoding in the batcher: two requests with lookup drafts (one
// from a corpus holding its expected text, one from its text alone) and
// one without, decoded together (drafts take the rows the step has to
// spare, steps mix rows of different draft lengths); each gets the tokens
// it gets alone, and the corpus's drafts are accepted, several a step.
TEST_F(BatcherTest, SpeculativeRowsGiveTheTokensOfAPlainRun) {
  Make(3);
  std::vector<int32_t> rep;
  for (int r = 0; r < 4; ++r)
    for (int32_t t : Prompt(5, 3))
      rep.push_back(t);
  Rec a, b, c;
  GenRequest ra = Request(&a, rep, 20), rb = Request(&b, Prompt(7, 4), 12),
             rc = Request(&c, rep, 16);
  ra.speculative = 3;
  ra.lookup_corpus = rep; // the prompt and what follows it
  for (int32_t t : Alone(rep, 20))
    ra.lookup_corpus.push_back(t);
  rb.speculative = 4; // the text alone
  Submit(std::move(ra));
  Submit(std::move(rb));
  Submit(std::move(rc));
  StartRun();
  ASSERT_TRUE(WaitDone({&a, &b, &c}));
  EXPECT_EQ(a.tokens, Alone(rep, 20));
  EXPECT_EQ(b.tokens, Alone(Prompt(7, 4), 12));
  EXPECT_EQ(c.tokens, Alone(rep, 16));
  StopRun();
  const BatcherStats st = batcher_->Stats();
  EXPECT_GT(st.drafts_proposed, 0u);
  EXPECT_GT(st.drafts_accepted, 0u);
  EXPECT_EQ(st.generated_tokens, 48u);
  // Each verify step gives its accepted drafts and one token more.
  EXPECT_GT(st.verify_steps, 0u);
  EXPECT_LE(st.drafts_accepted + st.verify_steps, st.generated_tokens);
  // Fewer steps than tokens for a: some steps gave it several.
  EXPECT_LT(a.token_steps.back() - a.token_steps.front(), 19u);
}

// MTP drafts in the batcher (duckrun serve --speculative mtp) on a tiny
// DeepSeek-V3.2 plan with its module: two drafting requests and one not,
// prompts in chunks beside decoding rows, decoded together: each gets the
// tokens it gets alone. The random module's drafts are proposed, and a
// request whose first four all fail stops drafting.
class BatcherMtpTest : public BatcherTest {
protected:
  void SetUp() override {
    plan_name_ = "deepseek-mtp";
    mtp_ = true;
    BatcherTest::SetUp();
  }
};

TEST_F(BatcherMtpTest, MtpDraftsGiveTheTokensOfAPlainRun) {
  Make(3);
  ASSERT_TRUE(engine_->has_mtp());
  Rec a, b, c;
  GenRequest ra = Request(&a, Prompt(9, 1), 16),
             rb = Request(&b, Prompt(6, 2), 12),
             rc = Request(&c, Prompt(7, 3), 16);
  ra.speculative = 1;
  rb.speculative = 3; // MTP drafts one a step whatever it asks
  Submit(std::move(ra));
  Submit(std::move(rb));
  Submit(std::move(rc));
  StartRun();
  ASSERT_TRUE(WaitDone({&a, &b, &c}));
  EXPECT_EQ(a.tokens, Alone(Prompt(9, 1), 16));
  EXPECT_EQ(b.tokens, Alone(Prompt(6, 2), 12));
  EXPECT_EQ(c.tokens, Alone(Prompt(7, 3), 16));
  StopRun();
  const BatcherStats st = batcher_->Stats();
  EXPECT_GT(st.drafts_proposed, 0u);
  EXPECT_EQ(st.drafts_proposed, st.verify_steps) << "one draft a step";
  if (st.drafts_accepted == 0) {
    EXPECT_LE(st.drafts_proposed, 8u) << "each stops after 4 failed drafts";
  }
  EXPECT_EQ(st.generated_tokens, 44u);
}

// One sequence at a time (--parallel 1): its prompt goes in whole chunks,
// as the one-shot CLI's does; no row is kept for a decode that cannot
// share the step.
TEST_F(BatcherTest, OneSequenceGetsWholePromptChunks) {
  Make(1);
  Rec a;
  const auto pa = Prompt(9, 20);
  Submit(Request(&a, pa, 2));
  StartRun();
  ASSERT_TRUE(WaitDone({&a}));
  EXPECT_EQ(StepRows(), (std::vector<uint32_t>{4, 4, 1, 1}));
  EXPECT_EQ(a.tokens, Alone(pa, 2));
}

// Three sequences in every mix of prefill and decode, the third waiting
// for a slot: each gets exactly its one-shot tokens, and no step carries
// more than its decode rows plus a chunk.
TEST_F(BatcherTest, EveryRequestGetsItsOneShotTokens) {
  Make(2);
  Rec r[3];
  const std::vector<int32_t> prompts[3] = {Prompt(5, 3), Prompt(9, 4),
                                           Prompt(3, 5)};
  const uint32_t n[3] = {6, 4, 5};
  for (int i = 0; i < 3; ++i)
    Submit(Request(&r[i], prompts[i], n[i]));
  StartRun();
  ASSERT_TRUE(WaitDone({&r[0], &r[1], &r[2]}));
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(r[i].why, FinishReason::kLength);
    EXPECT_EQ(r[i].tokens, Alone(prompts[i], n[i]));
  }
  for (uint32_t rows : StepRows())
    EXPECT_LE(rows, 2 + kChunk);
  // The third started only when a slot was free: after the first two's
  // prompts (5 + 9 rows in chunks of 4) it cannot have had a token before
  // the shorter request finished.
  EXPECT_GT(r[2].token_steps.front(),
            std::min(r[0].token_steps.back(), r[1].token_steps.back()));
}

// A request submitted between steps (from a callback, on Run's thread)
// is in the very next step; one that waits for a slot joins the step
// after the running one leaves.
TEST_F(BatcherTest, RequestsJoinAtTheNextStepAndWhenASlotFrees) {
  Make(2);
  Rec a, b;
  const auto pb = Prompt(2, 7);
  GenRequest ra = Request(&a, Prompt(3, 6), 3, [&](size_t n) {
    if (n == 1)
      Submit(Request(&b, pb, 2));
    return TokenVerdict::kContinue;
  });
  Submit(std::move(ra));
  StartRun();
  ASSERT_TRUE(WaitDone({&a, &b}));
  // A's prompt; A decoding + B's prompt; both decoding.
  EXPECT_EQ(StepRows(), (std::vector<uint32_t>{3, 3, 2}));
  EXPECT_EQ(b.tokens, Alone(pb, 2));
  StopRun();

  // One slot: B waits for A.
  runner_->Clear();
  steps_ = 0;
  Make(1);
  Rec c, d;
  BatcherStats seen;
  Submit(Request(&c, Prompt(2, 8), 2, [&](size_t) {
    seen = batcher_->Stats();
    return TokenVerdict::kContinue;
  }));
  Submit(Request(&d, Prompt(3, 9), 1));
  StartRun();
  ASSERT_TRUE(WaitDone({&c, &d}));
  EXPECT_EQ(seen.active, 1u);
  EXPECT_EQ(seen.queued, 1u);
  EXPECT_EQ(StepRows(), (std::vector<uint32_t>{2, 1, 3}));
  EXPECT_EQ(d.token_steps, (std::vector<uint64_t>{2}));
}

TEST_F(BatcherTest, CancelEndsQueuedAndRunningRequestsAtTheNextStep) {
  Make(1);
  Rec a, b;
  std::atomic<uint64_t> ida{0}, idb{0};
  GenRequest ra = Request(&a, Prompt(3, 10), 50, [&](size_t n) {
    if (n == 1)
      batcher_->Cancel(idb); // B is queued behind A
    if (n == 3)
      batcher_->Cancel(ida); // A itself
    return TokenVerdict::kContinue;
  });
  ida = Submit(std::move(ra));
  idb = Submit(Request(&b, Prompt(3, 11), 5));
  StartRun();
  ASSERT_TRUE(WaitDone({&a, &b}));
  EXPECT_EQ(b.why, FinishReason::kCancelled);
  EXPECT_TRUE(b.tokens.empty());
  EXPECT_EQ(a.why, FinishReason::kCancelled);
  EXPECT_EQ(a.tokens.size(), 3u) << "the cancel takes effect before the "
                                    "next step";
  EXPECT_EQ(a.done, 1);
  EXPECT_EQ(b.done, 1);
  // Unknown and finished ids are ignored; the slot is free again.
  batcher_->Cancel(999);
  batcher_->Cancel(ida);
  Rec c;
  Submit(Request(&c, Prompt(2, 12), 2));
  ASSERT_TRUE(WaitDone({&c}));
  EXPECT_EQ(c.why, FinishReason::kLength);
  EXPECT_EQ(c.tokens.size(), 2u);
}

TEST_F(BatcherTest, VerdictsAndStopIdsFinishRequests) {
  Make(2);
  const auto p = Prompt(4, 13);
  const std::vector<int32_t> alone = Alone(p, 8);
  Rec cancel, stop, ids;
  Submit(Request(&cancel, p, 8, [](size_t n) {
    return n == 2 ? TokenVerdict::kCancel : TokenVerdict::kContinue;
  }));
  Submit(Request(&stop, p, 8, [](size_t n) {
    return n == 3 ? TokenVerdict::kStop : TokenVerdict::kContinue;
  }));
  StartRun();
  ASSERT_TRUE(WaitDone({&cancel, &stop}));
  EXPECT_EQ(cancel.why, FinishReason::kCancelled);
  EXPECT_EQ(cancel.tokens, std::vector<int32_t>(alone.begin(), alone.begin() + 2));
  EXPECT_EQ(stop.why, FinishReason::kStop);
  EXPECT_EQ(stop.tokens, std::vector<int32_t>(alone.begin(), alone.begin() + 3));
  // A stop id ends the request and is not passed on.
  const size_t k = std::find(alone.begin(), alone.end(), alone[4]) - alone.begin();
  GenRequest r = Request(&ids, p, 8);
  r.stop_ids = {12345, alone[4]};
  Submit(std::move(r));
  ASSERT_TRUE(WaitDone({&ids}));
  EXPECT_EQ(ids.why, FinishReason::kStop);
  EXPECT_EQ(ids.tokens, std::vector<int32_t>(alone.begin(), alone.begin() + k));
}

TEST_F(BatcherTest, SubmitRefusesWhatCannotRun) {
  Make(1, /*queue_limit=*/1);
  Rec r;
  auto s = batcher_->Submit(Request(&r, {}, 4));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  s = batcher_->Submit(Request(&r, Prompt(64, 1), 4));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("the prompt has 64 tokens; this "
                                      "server's context is 64"),
            std::string::npos)
      << s.status();
  EXPECT_TRUE(batcher_->Submit(Request(&r, Prompt(63, 1), 1)).ok());
  // The free slot does not count as waiting: one more fits, then full.
  EXPECT_TRUE(batcher_->Submit(Request(&r, Prompt(2, 1), 1)).ok());
  s = batcher_->Submit(Request(&r, Prompt(2, 1), 1));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted) << s.status();
  EXPECT_TRUE(batcher_->Busy());
  EXPECT_EQ(batcher_->Stats().queued, 2u);
}

// Stop ends every request still queued or running (cancelled), Run
// returns, and nothing more is taken.
TEST_F(BatcherTest, StopCancelsEverythingAndRefusesMore) {
  Make(1);
  Rec a, b;
  std::mutex m;
  std::condition_variable cv;
  bool started = false, release = false;
  Submit(Request(&a, Prompt(3, 14), 50, [&](size_t) {
    std::unique_lock<std::mutex> lock(m);
    started = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; }); // hold Run between steps
    return TokenVerdict::kContinue;
  }));
  Submit(Request(&b, Prompt(3, 15), 5));
  StartRun();
  {
    std::unique_lock<std::mutex> lock(m);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return started; }));
  }
  batcher_->Stop();
  {
    std::lock_guard<std::mutex> lock(m);
    release = true;
    cv.notify_all();
  }
  run_.join();
  EXPECT_EQ(a.why, FinishReason::kCancelled);
  EXPECT_EQ(b.why, FinishReason::kCancelled);
  EXPECT_EQ(a.done, 1);
  EXPECT_EQ(b.done, 1);
  EXPECT_EQ(a.tokens.size(), 1u);
  EXPECT_FALSE(batcher_->Busy());
  Rec c;
  auto s = batcher_->Submit(Request(&c, Prompt(3, 16), 5));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
}

// A failed step ends the running requests with its error; the batcher
// goes on with the next ones.
TEST_F(BatcherTest, AFailedStepEndsTheRunningRequestsWithItsError) {
  Make(2);
  runner_->Fail(absl::UnavailableError("the ducks are gone"));
  Rec a, b;
  Submit(Request(&a, Prompt(3, 17), 4));
  Submit(Request(&b, Prompt(2, 18), 4));
  StartRun();
  ASSERT_TRUE(WaitDone({&a, &b}));
  EXPECT_EQ(a.why, FinishReason::kError);
  EXPECT_EQ(a.error.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(b.why, FinishReason::kError);
  EXPECT_TRUE(a.tokens.empty());
  runner_->Fail(absl::OkStatus());
  Rec c;
  const auto pc = Prompt(4, 19);
  Submit(Request(&c, pc, 3));
  ASSERT_TRUE(WaitDone({&c}));
  EXPECT_EQ(c.why, FinishReason::kLength);
  EXPECT_EQ(c.tokens, Alone(pc, 3));
}

// The log probabilities a request can ask for: the log-softmax in double,
// the best alternatives most likely first, ties to the lower id.
TEST(LogprobsAt, LogSoftmaxAndBestAlternatives) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  double z = 0;
  for (float v : logits)
    z += std::exp((double)v);
  const TokenLogprobs lp = LogprobsAt(logits, 2, 3);
  EXPECT_NEAR(lp.logprob, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1); // 3.0, the lower of the tied ids
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 2);
  EXPECT_NEAR(lp.top[0].second, 3.0 - std::log(z), 1e-6);
  EXPECT_EQ(LogprobsAt(logits, 0, 9).top.size(), logits.size());
  // Large logits do not overflow: the maximum is taken out first.
  const std::vector<float> big = {1000.0f, 1000.0f};
  EXPECT_NEAR(LogprobsAt(big, 0, 0).logprob, -std::log(2.0), 1e-6);
}

} // namespace
