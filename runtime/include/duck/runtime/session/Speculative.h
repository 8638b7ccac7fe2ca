//===- Speculative.h - drafts for speculative decoding ----------*- C++ -*-===//
//
// duckrun --speculative lookup[:K]: each decode step feeds the next token
// and up to K drafted tokens as the rows of one step (Engine::Verify),
// then samples row after row, accepting a draft while the sampled token is
// that draft. A row's logits are the bits a one-token step would give (the
// kernels' row contract), and every emitted token is one sampler draw on
// those logits, so the output is the very output of --speculative none, for
// greedy and for a temperature and seed alike. The rejected positions are
// rewound (Engine::Rewind).
//
// Drafts come from lookup (prompt-lookup decoding): the longest n-gram
// that ends the text so far, found earlier in the text or in a static
// corpus of token ids (--lookup-corpus), and the tokens that most often
// followed it there (the latest on a tie). A DraftBudget keeps the draft length
// where drafts are accepted and backs off where they are not.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_SESSION_SPECULATIVE_H
#define DUCK_RUNTIME_SESSION_SPECULATIVE_H

#include "absl/status/statusor.h"
#include "absl/types/span.h"

#include <cstdint>
#include <string>
#include <vector>

namespace duck::runtime {

struct SpeculativeOptions {
  bool lookup = false; // false: none
  /// Instead of lookup, drafts drawn at random (speculative "wrong[:K]"):
  /// almost never accepted, to measure what rejected drafts cost.
  bool wrong = false;
  /// Instead, DeepSeek's MTP module drafts (speculative "mtp[:K]"): the
  /// plan's MTP layer guesses the token after next; K > 1 chains it.
  bool mtp = false;
  uint32_t k = 3; // drafts a step at most
  std::vector<int32_t> corpus;
};

/// "none", "lookup", "lookup:K", "wrong", "wrong:K", "mtp" or "mtp:K" (K
/// in 1..16; lookup's default 3, mtp's 1).
absl::StatusOr<SpeculativeOptions> ParseSpeculative(const std::string &spec);
/// A corpus file: token ids separated by spaces, commas or newlines.
absl::StatusOr<std::vector<int32_t>> ReadTokenIds(const std::string &path);

class LookupDrafter {
public:
  /// n-grams of up to kMaxNgram tokens, at least kMinNgram.
  static constexpr uint32_t kMaxNgram = 4, kMinNgram = 2;
  explicit LookupDrafter(std::vector<int32_t> corpus)
      : corpus_(std::move(corpus)) {}
  /// Up to k drafts to follow `text` (empty: no match).
  std::vector<int32_t> Propose(absl::Span<const int32_t> text,
                               uint32_t k) const;

private:
  std::vector<int32_t> corpus_;
};

/// Drafts drawn at random from [0, vocab) (a fixed sequence): what drafts
/// that are always rejected cost.
class WrongDrafter {
public:
  std::vector<int32_t> Propose(uint32_t vocab, uint32_t k);

private:
  uint64_t state_ = 0x9E3779B97F4A7C15ull;
};

/// How many drafts to ask for next: up to the maximum while they are
/// accepted, one more than were accepted after a partial acceptance; after
/// a step of several drafts that accepted none, one draft; after a single
/// draft rejected, none for a while (a pause of 4 steps that doubles each
/// time, up to 64, and is 4 again once all drafts of a step are accepted),
/// then one.
class DraftBudget {
public:
  explicit DraftBudget(uint32_t max) : max_(max), k_(max) {}
  uint32_t Next();
  /// What Next() would give, without counting a paused step.
  uint32_t Peek() const { return pause_ > 0 ? 0 : k_; }
  void Record(uint32_t proposed, uint32_t accepted);

private:
  uint32_t max_, k_, pause_ = 0, pause_len_ = 4;
};

struct SpeculativeStats {
  uint64_t verify_steps = 0, proposed = 0, accepted = 0;
};

} // namespace duck::runtime

#endif
