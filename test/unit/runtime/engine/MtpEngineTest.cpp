// The engine's MTP module (docs/mtp.md) on a compiled tiny DeepSeek-V3.2
// plan with its module, the FFN steps answered by a fake runner: drafts
// do not depend on whether the module's rows ran step by step, waited
// (kDefer) or had chained rows written past them; it refuses what it
// cannot do, and stops when told.
#include "duck/runtime/engine/Engine.h"

#include "TestPlans.h"
#include "engine/FakeFfnRunner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

namespace {

using namespace duck::runtime;
using duck::runtime::test::FakeFfnRunner;
using duck::runtime::test::PlanDir;

class MtpEngineTest : public ::testing::Test {
protected:
  void SetUp() override {
    auto p = LoadedPlan::Load(PlanDir("deepseek-mtp"), HostOpKinds());
    ASSERT_TRUE(p.ok()) << p.status();
    plan_ = std::move(*p);
    ASSERT_NE(plan_->def().mtp(), nullptr) << "the plan has no MTP module";
    runner_ = std::make_unique<FakeFfnRunner>(plan_->def().model()->hidden());
    vocab_ = plan_->def().model()->vocab();
  }
  /// One sequence, or (two) two sequences with steps of up to 16 rows
  /// (serving's MtpBatch).
  std::unique_ptr<Engine> Make(bool mtp = true, bool two = false) {
    EngineOptions o;
    o.max_seq = 64;
    o.prefill_chunk = 8;
    o.mtp = mtp;
    if (two) {
      o.max_rows = 16;
      o.max_seqs = 2;
    }
    auto e = Engine::Create(*plan_, runner_.get(), o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }
  std::unique_ptr<Engine> MakeTwo() { return Make(true, true); }
  int32_t Token(uint32_t i) const { return (int32_t)((i * 37 + 11) % vocab_); }
  /// The prompt (9 tokens, two chunks) through `e`.
  void Prefill(Engine &e) {
    std::vector<int32_t> p;
    for (uint32_t i = 0; i < 9; ++i)
      p.push_back(Token(i));
    std::vector<float> l;
    ASSERT_TRUE(e.Forward(p, &l).ok());
  }
  static bool SameBits(const std::vector<float> &a,
                       const std::vector<float> &b) {
    return a.size() == b.size() &&
           std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  }

  std::unique_ptr<LoadedPlan> plan_;
  std::unique_ptr<FakeFfnRunner> runner_;
  uint32_t vocab_ = 0;
};

// Six decode steps; the module drafts after every one, or waits over
// steps 0-3 (kDefer) and drafts after 4 and 5: the drafts after 4 and 5
// are the same bits. A chained draft after every step (mtp:2) writes rows
// past the kept ones; the next drafts are still the same bits.
TEST_F(MtpEngineTest, DeferredAndChainedRowsGiveTheSameDrafts) {
  auto every = Make(), waits = Make(), chains = Make();
  ASSERT_TRUE(every && waits && chains);
  Prefill(*every);
  Prefill(*waits);
  Prefill(*chains);
  std::vector<float> l, a, b, c, chained;
  for (uint32_t i = 0; i < 6; ++i) {
    // Step i feeds token i; the module's row for it reads token i + 1.
    const int32_t t = Token(100 + i), next = Token(100 + i + 1);
    for (Engine *e : {every.get(), waits.get(), chains.get()})
      ASSERT_TRUE(e->Forward({t}, &l).ok());
    ASSERT_EQ(every->mtp_step_rows(), 1u);
    ASSERT_TRUE(every->MtpDraft(1, next, Engine::MtpMode::kDraft, &a).ok());
    ASSERT_EQ(a.size(), vocab_);
    ASSERT_TRUE(chains->MtpDraft(1, next, Engine::MtpMode::kDraft, &c).ok());
    EXPECT_TRUE(SameBits(a, c)) << "after step " << i << " (chained)";
    ASSERT_TRUE(chains->MtpChain(Token(300 + i), &chained).ok());
    EXPECT_EQ(chained.size(), vocab_);
    const bool draft = i >= 4;
    ASSERT_TRUE(waits
                    ->MtpDraft(1, next,
                               draft ? Engine::MtpMode::kDraft
                                     : Engine::MtpMode::kDefer,
                               &b)
                    .ok());
    if (draft) {
      EXPECT_TRUE(SameBits(a, b)) << "after step " << i << " (deferred)";
    }
  }
}

// Serving's MTP (MtpBatch): two sequences with the same tokens in every
// step, each chunk marked `mtp`, the module run for both at once: a
// prompt chunk kept whole and run as it goes (where sequence 0's path
// defers it), verify steps of two rows of which one or both are kept.
// Every draft is the bits of the one-sequence engine's (Verify, Rewind,
// MtpDraft) for both sequences, and each draft's chain of two more (mtp:3)
// the one-sequence engine's MtpChain's.
TEST_F(MtpEngineTest, BatchedDraftsAreTheOneSequenceDrafts) {
  auto one = Make(), made = MakeTwo();
  ASSERT_TRUE(one && made);
  Engine &two = *made;
  std::vector<int32_t> p;
  for (uint32_t i = 0; i < 9; ++i)
    p.push_back(Token(i));
  std::vector<float> l, want, got;
  ASSERT_TRUE(one->Forward(p, &l).ok());
  const int32_t first = Token(50);
  ASSERT_TRUE(one->MtpDraft(1, first, Engine::MtpMode::kDraft, &want).ok());
  // The prompt in chunks of 8 and 1, both sequences in each step.
  auto both = [&](uint32_t pos, absl::Span<const int32_t> t, bool every) {
    std::vector<SeqChunk> c(2);
    for (uint32_t s = 0; s < 2; ++s) {
      c[s] = SeqChunk{s, pos, t, true};
      c[s].every_row = every;
      c[s].mtp = true;
    }
    return two.RunBatch(c, &l);
  };
  // Drafting runs chain two more drafts (mtp:3); `chained` gets them.
  std::vector<std::vector<int32_t>> chained;
  auto draftBoth = [&](uint32_t rows, int32_t next, bool draft) {
    const uint32_t chain = draft ? 2 : 0;
    const MtpRun r[2] = {{0, rows, next, draft, chain},
                         {1, rows, next, draft, chain}};
    return two.MtpBatch(r, &got, &chained);
  };
  auto argmax = [&](const float *l) {
    return (int32_t)(std::max_element(l, l + vocab_) - l);
  };
  // The one-sequence engine's chain after its draft `want`.
  auto chainOne = [&]() {
    std::vector<int32_t> out;
    std::vector<float> c;
    int32_t d = argmax(want.data());
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(one->MtpChain(d, &c).ok());
      d = argmax(c.data());
      out.push_back(d);
    }
    return out;
  };
  const absl::Span<const int32_t> ps(p);
  ASSERT_TRUE(both(0, ps.subspan(0, 8), false).ok());
  ASSERT_TRUE(draftBoth(8, p[8], false).ok());
  EXPECT_TRUE(got.empty());
  ASSERT_TRUE(both(8, ps.subspan(8, 1), false).ok());
  ASSERT_TRUE(draftBoth(1, first, true).ok());
  ASSERT_EQ(got.size(), 2u * vocab_);
  std::vector<int32_t> wantChain = chainOne();
  for (uint32_t s = 0; s < 2; ++s) {
    EXPECT_EQ(0, std::memcmp(want.data(), got.data() + s * vocab_, vocab_ * 4))
        << "sequence " << s << ", the prompt's draft";
    EXPECT_EQ(chained[s], wantChain) << "sequence " << s << ", its chain";
  }
  // Verify steps of the next token and one draft; the draft kept in odd
  // steps (two rows), rejected in even ones (one row).
  uint32_t pos = 9;
  int32_t t = first;
  for (uint32_t i = 0; i < 6; ++i) {
    const int32_t rows[2] = {t, Token(200 + i)};
    const uint32_t kept = 1 + i % 2;
    const int32_t next = Token(400 + i);
    ASSERT_TRUE(one->Verify(rows, &l).ok());
    one->Rewind(pos + kept);
    ASSERT_TRUE(one->MtpDraft(kept, next, Engine::MtpMode::kDraft, &want).ok());
    ASSERT_TRUE(both(pos, rows, true).ok());
    ASSERT_TRUE(draftBoth(kept, next, true).ok());
    ASSERT_EQ(got.size(), 2u * vocab_);
    wantChain = chainOne();
    for (uint32_t s = 0; s < 2; ++s) {
      EXPECT_EQ(0,
                std::memcmp(want.data(), got.data() + s * vocab_, vocab_ * 4))
          << "sequence " << s << ", step " << i;
      EXPECT_EQ(chained[s], wantChain) << "sequence " << s << ", step " << i;
    }
    pos += kept;
    t = next;
  }
  // The rows are used up; a run over more rows than were kept is refused.
  const MtpRun again[1] = {{0, 1, 3, true}};
  EXPECT_EQ(two.MtpBatch(again, &got).code(),
            absl::StatusCode::kInvalidArgument);
}

// The prefix store's rows (SaveKv/LoadKv) carry the module's caches: a
// sequence that takes another's 12 positions back drafts, at the next
// position, the bits the other drafts there, where its own earlier rows
// (another prompt's) would give another draft.
TEST_F(MtpEngineTest, SavedRowsCarryTheModulesCaches) {
  auto made = MakeTwo();
  ASSERT_TRUE(made);
  Engine &e = *made;
  EXPECT_EQ(e.saved_kv_bytes_per_token(),
            e.kv_bytes_per_token() + e.mtp_kv_bytes_per_token());
  std::vector<int32_t> p, q;
  for (uint32_t i = 0; i < 12; ++i) {
    p.push_back(Token(i));
    q.push_back(Token(60 + i));
  }
  const int32_t t = Token(90), u = Token(91);
  std::vector<float> l, drafts;
  // Each prompt in chunks of 8 and 4, the module over every position.
  for (uint32_t s = 0; s < 2; ++s) {
    const absl::Span<const int32_t> w(s ? q : p);
    SeqChunk c{s, 0, w.subspan(0, 8), false};
    c.mtp = true;
    ASSERT_TRUE(e.RunBatch({&c, 1}, &l).ok());
    const MtpRun head[1] = {{s, 8, w[8], false}};
    ASSERT_TRUE(e.MtpBatch(head, &drafts).ok());
    c = SeqChunk{s, 8, w.subspan(8), true};
    c.mtp = true;
    ASSERT_TRUE(e.RunBatch({&c, 1}, &l).ok());
    const MtpRun tail[1] = {{s, 4, t, false}};
    ASSERT_TRUE(e.MtpBatch(tail, &drafts).ok());
  }
  std::vector<uint8_t> rows(12 * e.saved_kv_bytes_per_token());
  e.SaveKv(0, 0, 12, rows.data());
  e.LoadKv(1, 0, 12, rows.data());
  // Both at position 12 with the same token: the same draft.
  std::vector<SeqChunk> step(2);
  for (uint32_t s = 0; s < 2; ++s) {
    step[s] = SeqChunk{s, 12, {&t, 1}, true};
    step[s].mtp = true;
  }
  ASSERT_TRUE(e.RunBatch(step, &l).ok());
  const MtpRun next[2] = {{0, 1, u, true}, {1, 1, u, true}};
  ASSERT_TRUE(e.MtpBatch(next, &drafts).ok());
  ASSERT_EQ(drafts.size(), 2u * vocab_);
  EXPECT_EQ(0, std::memcmp(drafts.data(), drafts.data() + vocab_, vocab_ * 4))
      << "the module's rows of the loaded positions were not carried";
}

TEST_F(MtpEngineTest, RefusesWhatItCannotDoAndStops) {
  auto none = Make(/*mtp=*/false);
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->has_mtp());
  std::vector<float> l;
  EXPECT_EQ(none->MtpDraft(1, 3, Engine::MtpMode::kDraft, &l).code(),
            absl::StatusCode::kFailedPrecondition);
  auto e = Make();
  ASSERT_TRUE(e);
  EXPECT_TRUE(e->has_mtp());
  // Nothing to draft after before a step.
  EXPECT_EQ(e->MtpDraft(1, 3, Engine::MtpMode::kDraft, &l).code(),
            absl::StatusCode::kFailedPrecondition);
  Prefill(*e);
  EXPECT_EQ(e->mtp_step_rows(), 1u); // 9 tokens in chunks of 8 and 1
  EXPECT_EQ(e->MtpDraft(2, 3, Engine::MtpMode::kDraft, &l).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(e->MtpDraft(1, 3, Engine::MtpMode::kDraft, &l).ok());
  EXPECT_EQ(l.size(), vocab_);
  // Once a step.
  EXPECT_EQ(e->MtpDraft(1, 3, Engine::MtpMode::kDraft, &l).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(e->Forward({3}, &l).ok());
  e->MtpStop();
  EXPECT_EQ(e->MtpDraft(1, 4, Engine::MtpMode::kDraft, &l).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(e->Forward({4}, &l).ok());
  EXPECT_EQ(e->MtpDraft(1, 5, Engine::MtpMode::kDraft, &l).code(),
            absl::StatusCode::kFailedPrecondition)
      << "a stopped module keeps no rows";
  EXPECT_GT(e->mtp_kv_bytes_per_token(), 0u);
}

} // namespace
