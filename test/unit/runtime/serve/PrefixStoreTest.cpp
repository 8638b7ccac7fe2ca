// The prefix store (serve/PrefixStore.h) alone: a radix tree over token
// ids whose nodes hold rows (here 4 bytes a position: the position and
// the token, as a cache row depends on both and on what came before),
// found by longest prefix, evicted least recently used under a budget.
// Pages of one position unless a test is about pages.
#include "duck/runtime/serve/PrefixStore.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace {

using duck::runtime::ParseByteSize;
using duck::runtime::PrefixStore;

constexpr uint64_t kRow = 4; // bytes a position

/// A fake slot cache: row p of `tokens` is p * 1000 + tokens[p]; Save
/// counts the positions it was asked for.
struct FakeSlot {
  std::vector<int32_t> tokens;
  uint64_t saved = 0;
  PrefixStore::SaveRows Save() {
    return [this](uint32_t pos, uint32_t n, uint8_t *out) {
      for (uint32_t i = 0; i < n; ++i) {
        const uint32_t v = (pos + i) * 1000 + (uint32_t)tokens[pos + i];
        std::memcpy(out + i * kRow, &v, kRow);
      }
      saved += n;
    };
  }
};

/// The rows Read hands over for positions [from, to) of `tokens`, or a
/// shorter list when it stops early.
std::vector<uint32_t> ReadRows(const PrefixStore &s,
                               const std::vector<int32_t> &tokens,
                               uint32_t from, uint32_t to) {
  std::vector<uint32_t> rows;
  uint32_t next = from;
  s.Read(tokens, from, to, [&](uint32_t pos, uint32_t n, const uint8_t *in) {
    EXPECT_EQ(pos, next); // in order, no gap
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t v;
      std::memcpy(&v, in + i * kRow, kRow);
      rows.push_back(v);
    }
    next = pos + n;
  });
  return rows;
}

std::vector<uint32_t> Expected(const std::vector<int32_t> &tokens,
                               uint32_t from, uint32_t to) {
  std::vector<uint32_t> rows;
  for (uint32_t p = from; p < to; ++p)
    rows.push_back(p * 1000 + (uint32_t)tokens[p]);
  return rows;
}

void Insert(PrefixStore &s, const std::vector<int32_t> &tokens,
            uint64_t *saved = nullptr, const std::vector<int32_t> &keep = {}) {
  FakeSlot slot{tokens};
  s.Insert(tokens, slot.Save(), keep);
  if (saved)
    *saved = slot.saved;
}

TEST(PrefixStore, FindsTheLongestStoredPrefixTokenByToken) {
  PrefixStore s(1 << 20, kRow, 1);
  ASSERT_TRUE(s.enabled());
  EXPECT_EQ(s.Find({1, 2, 3}), 0u);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6}, b = {1, 2, 3, 9, 9};
  uint64_t saved = 0;
  Insert(s, a, &saved);
  EXPECT_EQ(saved, 6u);
  EXPECT_EQ(s.Find({1, 2, 3, 4, 7}), 4u); // inside a's edge
  EXPECT_EQ(s.Find({1, 2, 3, 4, 5, 6, 7, 8}), 6u);
  EXPECT_EQ(s.Find({2, 2, 3}), 0u);
  // b shares 3 tokens with a: only its 2 new positions are saved, and a's
  // edge splits after 3.
  Insert(s, b, &saved);
  EXPECT_EQ(saved, 2u);
  EXPECT_EQ(s.stats().tokens, 8u);
  EXPECT_EQ(s.stats().entries, 3u); // [1,2,3], [4,5,6], [9,9]
  EXPECT_EQ(s.stats().bytes, 8 * kRow);
  EXPECT_EQ(s.Find({1, 2, 3, 9, 9, 9}), 5u);
  EXPECT_EQ(s.Find(a), 6u);
  // A sequence already held saves nothing.
  Insert(s, {1, 2, 3, 4}, &saved);
  EXPECT_EQ(saved, 0u);
  EXPECT_EQ(s.stats().tokens, 8u);
  // Read hands back each position's own row, across the split, from any
  // start.
  EXPECT_EQ(ReadRows(s, a, 0, 6), Expected(a, 0, 6));
  EXPECT_EQ(ReadRows(s, a, 2, 5), Expected(a, 2, 5));
  EXPECT_EQ(ReadRows(s, b, 1, 5), Expected(b, 1, 5));
  // Past the stored prefix it stops.
  EXPECT_EQ(ReadRows(s, {1, 2, 8}, 0, 3), Expected({1, 2, 8}, 0, 2));
}

// Budget of 10 positions: a (6) and b (4) fill it; c needs 4 more, so the
// least recently used leaf goes, and a Find counts as a use.
TEST(PrefixStore, EvictsLeastRecentlyUsedLeavesUnderTheBudget) {
  PrefixStore s(10 * kRow, kRow, 1);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6}, b = {7, 8, 9, 10},
                             c = {11, 12, 13, 14};
  Insert(s, a);
  Insert(s, b);
  EXPECT_EQ(s.stats().tokens, 10u);
  EXPECT_EQ(s.Find(a), 6u); // a is now the most recent
  Insert(s, c);
  EXPECT_EQ(s.Find(b), 0u); // b, the oldest, went
  EXPECT_EQ(s.Find(a), 6u);
  EXPECT_EQ(s.Find(c), 4u);
  EXPECT_EQ(s.stats().evicted_tokens, 4u);
  EXPECT_LE(s.stats().bytes, 10 * kRow);
  // a was last found before c: d (5) evicts a whole (a leaf goes as
  // one), then fits beside c.
  const std::vector<int32_t> d = {20, 21, 22, 23, 24};
  Insert(s, d);
  EXPECT_EQ(s.Find(a), 0u);
  EXPECT_EQ(s.Find(c), 4u);
  EXPECT_EQ(s.Find(d), 5u);
  EXPECT_EQ(s.stats().tokens, 9u);
  EXPECT_EQ(s.stats().evicted_tokens, 10u);
}

// An interior node is evicted only once its children have gone: it
// becomes a leaf with the last use of any path through it.
TEST(PrefixStore, AnInteriorNodeGoesAfterItsChildren) {
  PrefixStore s(9 * kRow, kRow, 1);
  Insert(s, {1, 2, 3, 4, 5}); // [1,2,3] then [4,5] once b splits it
  Insert(s, {1, 2, 3, 6, 7}); // [6,7]
  Insert(s, {8, 9});          // 9 positions: full
  EXPECT_EQ(s.stats().entries, 4u);
  EXPECT_EQ(s.Find({1, 2, 3, 6}), 4u); // [1,2,3] and [6,7] used now
  Insert(s, {30, 31});                 // evicts [4,5] (older than [8,9])
  EXPECT_EQ(s.Find({1, 2, 3, 4, 5}), 3u);
  EXPECT_EQ(s.Find({8, 9}), 2u);
  // 5 more: [6,7] (the oldest leaf), then [30,31], then [1,2,3] (a leaf
  // now, last used before [8,9]) go; [8,9] stays.
  Insert(s, {40, 41, 42, 43, 44});
  EXPECT_LE(s.stats().bytes, 9 * kRow);
  EXPECT_EQ(s.Find({40, 41, 42, 43, 44}), 5u);
  EXPECT_EQ(s.Find({1, 2, 3, 6, 7}), 0u);
  EXPECT_EQ(s.Find({8, 9}), 2u); // used after [1,2,3]'s last use
}

// A prompt about to be read (keep) and the sequence being stored are not
// evicted for it; what does not fit then is stored as far as it fits.
TEST(PrefixStore, KeepsThePromptBeingReadAndStoresWhatFits) {
  PrefixStore s(8 * kRow, kRow, 1);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6};
  Insert(s, a);
  uint64_t saved = 0;
  Insert(s, {7, 8, 9, 10, 11}, &saved, /*keep=*/{1, 2, 3, 4, 5, 6, 99});
  EXPECT_EQ(saved, 2u); // 8 - 6 positions left
  EXPECT_EQ(s.Find(a), 6u);
  EXPECT_EQ(s.Find({7, 8, 9, 10, 11}), 2u);
  EXPECT_EQ(ReadRows(s, {7, 8, 9}, 0, 2), Expected({7, 8, 9}, 0, 2));
  // Longer than the whole budget: its first 8 positions.
  Insert(s, {50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60}, &saved);
  EXPECT_EQ(saved, 8u);
  EXPECT_EQ(s.stats().tokens, 8u);
  EXPECT_EQ(s.Find({50, 51, 52, 53, 54, 55, 56, 57, 58, 59}), 8u);
}

// Pages of 4 positions: splitting an edge copies nothing (the halves
// share the page they meet in), a new branch starts a page of its own, and
// a page's bytes go only with the last node that uses it.
TEST(PrefixStore, PagesAreSharedAcrossASplitAndFreedWithTheirLastNode) {
  const uint64_t page = 4 * kRow;
  PrefixStore s(5 * page, kRow, 4);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
                             b = {1, 2, 3, 4, 5, 6, 20, 21, 22};
  uint64_t saved = 0;
  Insert(s, a, &saved);
  EXPECT_EQ(saved, 10u);
  EXPECT_EQ(s.stats().bytes, 3 * page); // positions 0-3, 4-7, 8-9
  // b leaves a after 6 positions, inside a's second page: a's edge splits
  // with nothing copied; b's 3 positions take a second page of their own
  // (6, 7) and a third (8).
  Insert(s, b, &saved);
  EXPECT_EQ(saved, 3u);
  EXPECT_EQ(s.stats().bytes, 5 * page);
  EXPECT_EQ(s.stats().entries, 3u);
  EXPECT_EQ(ReadRows(s, a, 0, 10), Expected(a, 0, 10));
  EXPECT_EQ(ReadRows(s, b, 3, 9), Expected(b, 3, 9));
  // Full. c needs a page: a's tail ([7..10], the least recently used
  // leaf) goes, but of its two pages only the last is freed: the other
  // still holds positions 4 and 5 of [1..6].
  EXPECT_EQ(s.Find(b), 9u);
  const std::vector<int32_t> c = {50, 51, 52};
  Insert(s, c);
  EXPECT_EQ(s.stats().evicted_tokens, 4u);
  EXPECT_EQ(s.stats().bytes, 5 * page);
  EXPECT_EQ(s.Find(a), 6u);
  EXPECT_EQ(ReadRows(s, a, 0, 6), Expected(a, 0, 6));
  EXPECT_EQ(s.Find(b), 9u);
  EXPECT_EQ(ReadRows(s, b, 0, 9), Expected(b, 0, 9));
  EXPECT_EQ(s.Find(c), 3u);
  // A sequence larger than the budget is stored to the end of the pages
  // that fit: 8 of a's 10 positions in 2 pages.
  PrefixStore t(2 * page, kRow, 4);
  Insert(t, a, &saved);
  EXPECT_EQ(saved, 8u);
  EXPECT_EQ(t.Find(a), 8u);
  EXPECT_EQ(t.stats().bytes, 2 * page);
}

TEST(PrefixStore, ABudgetUnderOnePageDisablesIt) {
  for (uint64_t budget : {uint64_t{0}, kRow - 1, 4 * kRow - 1}) {
    PrefixStore s(budget, kRow, budget < kRow ? 1 : 4);
    EXPECT_FALSE(s.enabled());
    uint64_t saved = 0;
    Insert(s, {1, 2, 3}, &saved);
    EXPECT_EQ(saved, 0u);
    EXPECT_EQ(s.Find({1, 2, 3}), 0u);
    EXPECT_EQ(s.stats().bytes, 0u);
    EXPECT_EQ(s.stats().entries, 0u);
  }
}

TEST(ParseByteSize, UnitsArePowersOf1024) {
  uint64_t v = 0;
  EXPECT_TRUE(ParseByteSize("2GiB", &v));
  EXPECT_EQ(v, 2ull << 30);
  EXPECT_TRUE(ParseByteSize("512M", &v));
  EXPECT_EQ(v, 512ull << 20);
  EXPECT_TRUE(ParseByteSize("1.5gb", &v));
  EXPECT_EQ(v, 3ull << 29);
  EXPECT_TRUE(ParseByteSize("0", &v));
  EXPECT_EQ(v, 0u);
  EXPECT_TRUE(ParseByteSize("4096", &v));
  EXPECT_EQ(v, 4096u);
  EXPECT_TRUE(ParseByteSize("64KiB", &v));
  EXPECT_EQ(v, 65536u);
  for (const char *bad : {"", "GiB", "-1G", "2 parsecs", "2X", "nan", "1e30T"})
    EXPECT_FALSE(ParseByteSize(bad, &v)) << bad;
}

} // namespace
