//===- TokenChooser.h - a request's own logit processing and sampling -*- C++
//-*-===//
//
// What a request may ask beyond the engine's Sampler, applied on the host
// to the logits row of that sequence only, in this order:
//
//   1. `logit_bias`: bias[t] added to logit[t];
//   2. `presence_penalty` p and `frequency_penalty` f (OpenAI's): logit[t]
//      -= p * (count[t] > 0) + f * count[t], count over the tokens this
//      request generated so far;
//   3. with grammars (`response_format` json_object / json_schema, or a
//      tool call: one grammar a tool, the text may follow any of them):
//      the candidates are walked best first and the first one a grammar
//      accepts is taken. Best first is by logit at temperature 0, else by
//      logit / temperature + Gumbel noise (the Gumbel-max trick: the first
//      candidate is a sample of the softmax, and the first accepted one a
//      sample of the softmax restricted to the accepted tokens); with
//      top_k / top_p, the tokens of that nucleus (of the unconstrained
//      distribution) come first, the rest after in logit order. A token is
//      accepted when the grammar takes its bytes and the fewest bytes
//      that then close the JSON (JsonState::ClosingLength) fit in the
//      tokens the request has left after it; an end-of-sequence token only
//      where the JSON is complete; special tokens never. Once the JSON is
//      complete and nothing may follow, the request ends ("stop").
//      Unconstrained requests never come here; a constrained one usually
//      checks a few tokens.
//
// Without a grammar the adjusted row goes to the engine's Sampler, so
// requests with neither penalties nor biases are sampled exactly as
// before. Log probabilities are reported from the raw row (the model's
// distribution), not from the adjusted one.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_SERVE_TOKENCHOOSER_H
#define DUCK_RUNTIME_SERVE_TOKENCHOOSER_H

#include "duck/runtime/engine/Engine.h"
#include "duck/runtime/serve/JsonGrammar.h"
#include "duck/runtime/text/Tokenizer.h"

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

#include <memory>
#include <vector>

namespace duck::runtime {

struct ChooserOptions {
  float presence_penalty = 0, frequency_penalty = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;
  /// The text follows one of these; none: unconstrained.
  std::vector<std::shared_ptr<const JsonGrammar>> grammars;
  SamplerOptions sampler;
  std::vector<int32_t> stop_ids; // what ends a sequence (EOS)
};

class TokenChooser {
public:
  /// `tokenizer` (its byte strings) must outlive the chooser.
  TokenChooser(ChooserOptions o, const Tokenizer &tokenizer);

  /// The next token from this sequence's logits; `budget`: the tokens the
  /// request may still generate, this one included. Records the token.
  int32_t Choose(absl::Span<const float> logits, Sampler &sampler,
                 uint32_t budget);
  /// True once a grammar's text is complete and nothing may follow.
  bool Finished() const;

private:
  struct Cand {
    uint8_t tier;
    float key;
    int32_t id;
  };
  /// Each grammar still possible (its index) and where its text is.
  using States = std::vector<std::pair<size_t, JsonState>>;
  /// Whether a grammar takes token `id` with `after` tokens left after
  /// it; *next is the states then.
  bool Accepts(int32_t id, uint32_t after, States *next) const;
  /// The fewest bytes that complete the text (UINT32_MAX: none can).
  uint32_t Closing(const States &s) const;
  /// The candidates, best first in [0, sorted); the rest unsorted.
  void Rank(absl::Span<const float> row);
  int32_t Constrained(absl::Span<const float> row, uint32_t budget);
  void Record(int32_t id);

  ChooserOptions o_;
  const Tokenizer &tok_;
  States states_;
  absl::flat_hash_map<int32_t, uint32_t> counts_;
  std::vector<float> row_;
  std::vector<Cand> cands_;
  uint64_t rng_;
};

} // namespace duck::runtime

#endif
