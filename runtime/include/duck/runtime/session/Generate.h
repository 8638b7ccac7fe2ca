//===- Generate.h - duckrun: plan + cluster + tokenizer -> text -*- C++ -*-===//
#ifndef DUCK_RUNTIME_GENERATE_H
#define DUCK_RUNTIME_GENERATE_H

#include "duck/runtime/engine/Engine.h"
#include "duck/runtime/session/Session.h"
#include "duck/runtime/session/Speculative.h"

#include "absl/status/status.h"

#include <atomic>
#include <iosfwd>
#include <string>
#include <vector>

namespace duck::runtime {

struct GenerateOptions {
  /// The plan, the ducks and the engine (Session.h). Generate sets
  /// need_tokenizer (not for prompt_ids), all_logits (for logits_out) and
  /// cancel (from the field below).
  SessionOptions session;
  std::string prompt;              // text (tokenised), or
  std::vector<int32_t> prompt_ids; // ids given directly
  bool chat = false;               // a user message, in the chat format
  uint32_t max_tokens = 32;
  SamplerOptions sampler;
  bool decode_only = false;        // run the prompt through decode modes
  bool stream = true;              // print tokens as they come
  std::string summary_json;        // write the summary here
  /// The read bandwidth decode_bound_fraction divides by, GB/s (0: this
  /// machine's, measured once and cached: HostReadBandwidthGbs). A
  /// benchmark passes the figure it measured in the same window.
  double read_bw_gbs = 0;
  std::string logits_out;          // every position's logits (f32 rows)
  /// The MTP module's logits at every position whose next token is known
  /// (the prompt's and the generated tokens' but the last), f32 rows.
  std::string mtp_logits_out;
  bool stop_at_eos = true;
  bool print_ids = false;          // print token ids instead of text
  /// --speculative: drafts verified with the next token in one step; the
  /// output is unchanged (Speculative.h).
  SpeculativeOptions speculative;
  /// Set by the caller (duckrun's signal handler) to stop between steps.
  const std::atomic<bool> *cancel = nullptr;
};

/// Runs a whole duckrun: load + verify the plan, bring up the ducks,
/// prepare weights through the cache, prefill, decode, print. Text goes to
/// `out`, progress and the summary to `err`. Ducks it started are torn down
/// on every path.
absl::Status Generate(const GenerateOptions &opts, std::ostream &out,
                      std::ostream &err);

} // namespace duck::runtime

#endif
