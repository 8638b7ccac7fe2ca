//===- Speculative.cpp - lookup drafts and their budget -------------------===//
#include "duck/runtime/session/Speculative.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace duck::runtime {

absl::StatusOr<SpeculativeOptions> ParseSpeculative(const std::string &spec) {
  SpeculativeOptions o;
  if (spec.empty() || spec == "none")
    return o;
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  if ((parts[0] != "lookup" && parts[0] != "wrong" && parts[0] != "mtp") ||
      parts.size() > 2)
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative must be none, lookup[:K], mtp[:K] or "
                     "wrong[:K], got '",
                     spec, "'"));
  o.lookup = parts[0] == "lookup";
  o.wrong = parts[0] == "wrong";
  o.mtp = parts[0] == "mtp";
  if (o.mtp)
    o.k = 1; // the module's own depth; more chain it
  if (parts.size() == 2 &&
      (!absl::SimpleAtoi(parts[1], &o.k) || o.k < 1 || o.k > 16))
    return absl::InvalidArgumentError(absl::StrCat("--speculative ", parts[0],
                                                   ":K needs K from 1 to 16, "
                                                   "got '",
                                                   parts[1], "'"));
  return o;
}

std::vector<int32_t> WrongDrafter::Propose(uint32_t vocab, uint32_t k) {
  std::vector<int32_t> out;
  for (uint32_t i = 0; i < k && vocab > 0; ++i) {
    // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    out.push_back((int32_t)((z ^ (z >> 31)) % vocab));
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> ReadTokenIds(const std::string &path) {
  std::ifstream f(path);
  if (!f)
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<int32_t> ids;
  for (absl::string_view w :
       absl::StrSplit(ss.str(), absl::ByAnyChar(" ,\n\t\r"), absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(w, &id) || id < 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "'", path, "': '", w, "' is not a token id (ids 0 and up, "
          "separated by spaces, commas or newlines)"));
    ids.push_back(id);
  }
  return ids;
}

namespace {
/// The tokens after `tail` in `hay`, among its occurrences that end before
/// `limit` (so the tail itself is not its own match): of those with k
/// tokens after them, the k tokens that follow most often (the latest on
/// a tie, counting the latest kMaxVotes occurrences), as llama.cpp's n-gram
/// caches draft the most frequent continuation; else those after the
/// occurrence with the most.
bool Follow(absl::Span<const int32_t> hay, size_t limit,
            absl::Span<const int32_t> tail, uint32_t k,
            std::vector<int32_t> *out) {
  constexpr uint32_t kMaxVotes = 64;
  struct Vote {
    size_t end;
    uint32_t count;
  };
  std::vector<Vote> votes; // distinct continuations, latest first
  uint32_t cast = 0;
  const size_t n = tail.size();
  size_t best = 0, bestEnd = 0;
  for (size_t end = std::min(limit, hay.size());
       end >= n && end > 0 && cast < kMaxVotes; --end) {
    const size_t take = std::min<size_t>(k, hay.size() - end);
    if (take == 0 ||
        !std::equal(tail.begin(), tail.end(), hay.begin() + (end - n)))
      continue;
    if (take < k) {
      if (votes.empty() && take > best)
        best = take, bestEnd = end;
      continue;
    }
    ++cast;
    auto same = [&](const Vote &v) {
      return std::equal(hay.begin() + v.end, hay.begin() + v.end + k,
                        hay.begin() + end);
    };
    auto it = std::find_if(votes.begin(), votes.end(), same);
    if (it != votes.end())
      ++it->count;
    else
      votes.push_back({end, 1});
  }
  if (!votes.empty()) {
    // The first of the most counted: the latest on a tie.
    const Vote *top = &votes[0];
    for (const Vote &v : votes)
      if (v.count > top->count)
        top = &v;
    best = k;
    bestEnd = top->end;
  }
  if (best == 0)
    return false;
  out->assign(hay.begin() + bestEnd, hay.begin() + bestEnd + best);
  return true;
}
} // namespace

std::vector<int32_t> LookupDrafter::Propose(absl::Span<const int32_t> text,
                                            uint32_t k) const {
  // The longest n-gram that gives k drafts; else the most drafts any gives
  // (the longer n-gram on a tie).
  std::vector<int32_t> best, got;
  if (k == 0)
    return best;
  for (uint32_t n = std::min<uint32_t>(kMaxNgram, (uint32_t)text.size());
       n >= kMinNgram; --n) {
    absl::Span<const int32_t> tail = text.subspan(text.size() - n);
    // Earlier in the text (not the tail itself), then the corpus.
    const std::pair<absl::Span<const int32_t>, size_t> hays[] = {
        {text, text.size() - 1}, {corpus_, corpus_.size()}};
    for (const auto &[hay, limit] : hays) {
      if (Follow(hay, limit, tail, k, &got) && got.size() > best.size())
        best = got;
      if (best.size() == k)
        return best;
    }
  }
  return best;
}

uint32_t DraftBudget::Next() {
  if (pause_ > 0) {
    --pause_;
    return 0;
  }
  return k_;
}

void DraftBudget::Record(uint32_t proposed, uint32_t accepted) {
  if (proposed == 0)
    return;
  if (accepted == proposed) {
    k_ = std::min(max_, k_ + 1);
    pause_len_ = 4;
  } else if (accepted > 0) {
    k_ = std::min(max_, accepted + 1);
  } else if (proposed > 1) {
    // None of several accepted: one draft next step (two rows, little more
    // than one), which tells a turn the drafts missed (the text left the
    // corpus's path at the first draft) from drafts that are wrong.
    k_ = 1;
  } else {
    // A single draft rejected too: none for a while, so that drafts that
    // are always wrong cost a few steps in a hundred.
    k_ = 1;
    pause_ = pause_len_;
    pause_len_ = std::min(64u, pause_len_ * 2);
  }
}

} // namespace duck::runtime
