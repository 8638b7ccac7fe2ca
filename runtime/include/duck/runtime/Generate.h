//===- Generate.h - duckrun: plan + cluster + tokenizer -> text -*- C++ -*-===//
#ifndef DUCK_RUNTIME_GENERATE_H
#define DUCK_RUNTIME_GENERATE_H

#include "duck/runtime/Engine.h"

#include "absl/status/status.h"

#include <atomic>
#include <iosfwd>
#include <string>
#include <vector>

namespace duck::runtime {

struct GenerateOptions {
  std::string plan_dir;
  std::string prompt;            // text (tokenised), or
  std::vector<int32_t> prompt_ids; // ids given directly
  bool chat = false;             // wrap in the Qwen3 chat template
  uint32_t max_tokens = 32;
  SamplerOptions sampler;
  uint32_t max_seq = 0;          // 0: min(model max positions, 4096)
  std::string tokenizer_path;    // "": tokenizer.json next to the checkpoint
  std::string cluster_file;      // "": start a local embedded cluster
  uint32_t cores_per_duck = 0;   // local cluster; 0: spread this machine
  std::string duckd_path;
  bool persistent = true;
  bool invalidate_cache = false;
  bool verify_weights = false;
  bool decode_only = false;      // run the prompt through decode modes
  uint32_t threads = 0;          // host threads; 0: every core
  uint32_t prefill_chunk = 32;
  bool stream = true;            // print tokens as they come
  bool quiet = false;            // no progress or summary on stderr
  std::string summary_json;      // write the summary here
  std::string logits_out;        // every position's logits (f32 rows)
  bool stop_at_eos = true;
  bool print_ids = false;        // print token ids instead of text
  uint32_t recover_seconds = 60; // bring failed ducks back for this long
  int32_t reply_spin_us = 0;     // spin this long for step replies
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
