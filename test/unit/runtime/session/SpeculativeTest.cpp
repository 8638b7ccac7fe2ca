// Lookup drafts and their budget (session/Speculative.h).
#include "duck/runtime/session/Speculative.h"

#include <gtest/gtest.h>

namespace {

using namespace duck::runtime;
using V = std::vector<int32_t>;

TEST(LookupDrafterTest, TheTextFirstThenTheCorpusLongestNgramFirst) {
  LookupDrafter none({});
  // "5 6" occurred before, followed by 7 8 9.
  EXPECT_EQ(none.Propose(V{1, 5, 6, 7, 8, 9, 2, 5, 6}, 3), (V{7, 8, 9}));
  EXPECT_EQ(none.Propose(V{1, 5, 6, 7, 8, 9, 2, 5, 6}, 2), (V{7, 8}));
  // A single token is not enough of a match; nothing found, no drafts.
  EXPECT_TRUE(none.Propose(V{1, 2, 3, 4, 3}, 3).empty());
  EXPECT_TRUE(none.Propose(V{1, 2}, 3).empty());
  EXPECT_TRUE(none.Propose(V{1, 5, 6, 7, 5, 6}, 0).empty());
  // The corpus when the text has no match.
  LookupDrafter corpus(V{9, 3, 4, 10, 11, 12, 13});
  EXPECT_EQ(corpus.Propose(V{1, 2, 3, 4}, 3), (V{10, 11, 12}));
  // The longer n-gram wins: "2 3 4" in the corpus beats "3 4" in the text.
  LookupDrafter longer(V{2, 3, 4, 50, 51});
  EXPECT_EQ(longer.Propose(V{3, 4, 60, 61, 2, 3, 4}, 2), (V{50, 51}));
}

TEST(LookupDrafterTest, TheContinuationThatFollowsMostOftenWins) {
  // "4 4" is followed by "4 4" three times and by "9 9" once, the latest
  // time: the most frequent continuation, not the latest.
  LookupDrafter corpus(V{4, 4, 4, 4, 4, 4, 9, 9});
  EXPECT_EQ(corpus.Propose(V{1, 4, 4}, 2), (V{4, 4}));
  // A tie goes to the latest occurrence.
  LookupDrafter tie(V{5, 6, 1, 2, 5, 6, 3, 4});
  EXPECT_EQ(tie.Propose(V{0, 5, 6}, 2), (V{3, 4}));
  // Counting stays within one n-gram's occurrences: "5 6" after "8" once
  // beats the shorter tail's votes (the longest n-gram first).
  LookupDrafter longer(V{8, 5, 6, 7, 7, 5, 6, 1, 1, 5, 6, 1, 1});
  EXPECT_EQ(longer.Propose(V{8, 5, 6}, 2), (V{7, 7}));
  EXPECT_EQ(longer.Propose(V{0, 5, 6}, 2), (V{1, 1}));
}

TEST(LookupDrafterTest, AnOccurrenceWithKTokensAfterItBeatsALaterOne) {
  LookupDrafter none({});
  // 7 7 7 7 7: the latest "7 7" has one 7 after it, an earlier one three.
  EXPECT_EQ(none.Propose(V{7, 7, 7, 7, 7}, 3), (V{7, 7, 7}));
  // Only short continuations exist: the longest of them.
  EXPECT_EQ(none.Propose(V{1, 2, 9, 1, 2}, 3), (V{9, 1, 2}));
}

TEST(DraftBudgetTest, GrowsWhenAcceptedBacksOffAndPausesWhenNot) {
  DraftBudget b(4);
  EXPECT_EQ(b.Next(), 4u);
  b.Record(4, 1); // partial: one more than accepted
  EXPECT_EQ(b.Next(), 2u);
  b.Record(2, 2); // all: one more
  EXPECT_EQ(b.Next(), 3u);
  b.Record(3, 0); // none of several: one draft next, no pause
  EXPECT_EQ(b.Next(), 1u);
  b.Record(1, 0); // that one too: a pause of 4 steps, then one
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(b.Next(), 0u) << i;
  EXPECT_EQ(b.Next(), 1u);
  b.Record(1, 0); // again: the pause doubles
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(b.Next(), 0u) << i;
  EXPECT_EQ(b.Next(), 1u);
  b.Record(0, 0); // nothing proposed: no change
  EXPECT_EQ(b.Next(), 1u);
  b.Record(1, 1); // all accepted: one more, and the pause is 4 again
  EXPECT_EQ(b.Next(), 2u);
  b.Record(2, 0);
  EXPECT_EQ(b.Next(), 1u);
  b.Record(1, 0); // the pause is 4 again
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(b.Next(), 0u) << i;
  EXPECT_EQ(b.Next(), 1u);
}

TEST(DraftBudgetTest, AlwaysWrongDraftsCostFewSteps) {
  // Drafts never accepted, 3 a step at first: of 128 tokens' steps, the
  // ones that carry drafts (steps 1, 2 (one draft), 7, 16, 33, 66 and then
  // every 65th).
  DraftBudget b(3);
  std::vector<int> drafted;
  for (int step = 1; step <= 128; ++step)
    if (uint32_t k = b.Next(); k > 0) {
      drafted.push_back(step);
      b.Record(k, 0);
    }
  EXPECT_EQ(drafted, (std::vector<int>{1, 2, 7, 16, 33, 66}));
}

TEST(ParseSpeculativeTest, ValuesAndErrors) {
  EXPECT_FALSE(ParseSpeculative("none")->lookup);
  EXPECT_FALSE(ParseSpeculative("")->lookup);
  auto l = ParseSpeculative("lookup");
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->lookup);
  EXPECT_EQ(l->k, 3u);
  EXPECT_EQ(ParseSpeculative("lookup:7")->k, 7u);
  EXPECT_FALSE(ParseSpeculative("lookup:17").ok());
  EXPECT_FALSE(ParseSpeculative("lookup:x").ok());
  auto m = ParseSpeculative("mtp");
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->mtp);
  EXPECT_FALSE(m->lookup);
  EXPECT_EQ(m->k, 1u);
  EXPECT_EQ(ParseSpeculative("mtp:1")->k, 1u);
  EXPECT_EQ(ParseSpeculative("mtp:3")->k, 3u); // the module chained
  EXPECT_FALSE(ParseSpeculative("mtp:17").ok());
  EXPECT_FALSE(ParseSpeculative("eagle").ok());
  EXPECT_FALSE(ParseSpeculative("lookup:2:3").ok());
}

} // namespace
