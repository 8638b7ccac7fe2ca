//===- Batcher.h - continuous batching of sequences over the ducks -*- C++
//-*-===//
//
// Many generations share one engine: up to `parallel` sequences are active,
// each with its own KV cache slot and sampler. Every step carries one row
// for each decoding sequence plus up to prefill_chunk prompt rows of the
// sequences still in prefill, oldest first (so prompts never stall the
// running streams for more than a chunk's worth), and the ducks run all of
// them in one step. New requests join at the next step; finished or
// cancelled ones leave and free their slot. Every row's result depends only
// on its token and its sequence's cache, not on what else is in the step
// or where a prompt was cut (the kernels' contract: GEMM rows are
// bit-identical to the GEMV), so a sequence gets exactly the tokens the
// one-shot CLI gives for the same prompt and sampling settings.
//
// Submit and Cancel are thread-safe; Run is the loop and owns the engine.
// The callbacks run on Run's thread between steps: keep them short.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_BATCHER_H
#define DUCK_RUNTIME_BATCHER_H

#include "duck/runtime/engine/Engine.h"
#include "duck/runtime/serve/PrefixStore.h"
#include "duck/runtime/serve/TokenChooser.h"
#include "duck/runtime/session/Speculative.h"

#include "absl/status/statusor.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace duck::runtime {

/// What a request's on_token says after seeing a token.
enum class TokenVerdict {
  kContinue, // keep generating
  kStop,     // a stop string matched: finish with reason "stop"
  kCancel,   // the client is gone: free the slot
};

enum class FinishReason { kStop, kLength, kCancelled, kError };
const char *FinishReasonName(FinishReason r);

/// A generated token's log probability under the model (the log-softmax
/// of its logits row, before temperature or any other sampling setting)
/// and the most likely tokens' (most likely first, ties by lower id).
struct TokenLogprobs {
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

/// The log-softmax of `logits` at `token`, in double, and its `top` most
/// likely entries.
TokenLogprobs LogprobsAt(absl::Span<const float> logits, int32_t token,
                         uint32_t top);

struct GenRequest {
  std::vector<int32_t> prompt;
  uint32_t max_tokens = 16;
  SamplerOptions sampler;
  std::vector<int32_t> stop_ids; // end the generation (not passed on)
  /// When set, picks each token instead of the sampler alone (penalties,
  /// logit biases, a JSON grammar); a finished grammar ends the request
  /// with kStop.
  std::shared_ptr<TokenChooser> chooser;
  /// Each generated token, in order.
  std::function<TokenVerdict(int32_t id)> on_token;
  /// When set, called just before on_token with that token's log
  /// probabilities (`top_logprobs` alternatives).
  std::function<void(int32_t id, const TokenLogprobs &lp)> on_logprobs;
  uint32_t top_logprobs = 0;
  /// Speculative decoding with lookup drafts from the prompt and the text
  /// so far (session/Speculative.h): up to this many drafts ride with the
  /// next token in a step (0: none). The tokens are the same either way.
  uint32_t speculative = 0;
  /// Token ids the lookup also searches (duckrun --lookup-corpus).
  std::vector<int32_t> lookup_corpus;
  /// Once, when the request gets its slot: the prompt tokens whose KV
  /// cache it takes over from the slot's last sequence or the prefix
  /// store (prefix reuse).
  std::function<void(uint32_t cached_tokens)> on_admit;
  /// Once, at the end; `error` is set for kError.
  std::function<void(FinishReason why, const absl::Status &error)> on_done;
};

struct BatcherOptions {
  uint32_t parallel = 1;     // sequences active at once (engine max_seqs)
  uint32_t queue_limit = 64; // waiting requests before Submit refuses
  uint32_t prefill_chunk = 32;
  /// Prefix reuse: a slot keeps the tokens of the cache its last sequence
  /// left, and a new request takes the free slot that shares the longest
  /// prefix with its prompt and starts its prefill after it. The rows
  /// skipped are the very rows it would compute (a row depends only on its
  /// token and the cache before it), so results are bit-identical.
  bool reuse_prefix = true;
  /// With reuse_prefix: bytes of the prefix store (PrefixStore.h; 0:
  /// none). A slot's tokens that a new request would overwrite go into it
  /// first, and a request whose prompt shares a longer prefix with a
  /// stored sequence than with its slot gets those rows copied into its
  /// slot, bit-identical to computing them.
  uint64_t kv_budget = 0;
  /// Drafts from the plan's MTP module (duckrun serve --speculative
  /// mtp[:K]; the engine built with EngineOptions::mtp) instead of lookup:
  /// a request with `speculative` n > 0 gets up to min(n, mtp_drafts)
  /// drafts a step (the module's draft, chained on itself for more), the
  /// module run over every row the sequence keeps, all such sequences in
  /// one module step. A sequence whose first 4 drafts are all rejected
  /// stops it.
  bool mtp = false;
  uint32_t mtp_drafts = 1;
};

/// A snapshot for /metrics and tests.
struct BatcherStats {
  uint64_t steps = 0, rows = 0, prompt_tokens = 0, generated_tokens = 0;
  uint64_t cached_tokens = 0; // prompt tokens taken from a slot's cache
                              // or the prefix store
  PrefixStoreStats store;     // the prefix store (zeros: none)
  uint64_t drafts_proposed = 0, drafts_accepted = 0; // speculative
  uint64_t verify_steps = 0; // a sequence's rows with drafts in a step
  uint32_t active = 0, queued = 0;
  uint32_t max_decode_rows = 0; // most sequences decoding in one step
};

class Batcher {
public:
  Batcher(Engine &engine, const BatcherOptions &opts);

  /// Queues a request; its id (for Cancel). ResourceExhausted when the
  /// queue is full, FailedPrecondition once Stop was called, InvalidArgument
  /// for a prompt that does not fit the cache.
  absl::StatusOr<uint64_t> Submit(GenRequest r);
  /// Ends a queued or running request (on_done gets kCancelled) at the
  /// next step. Unknown or finished ids are ignored.
  void Cancel(uint64_t id);
  /// Runs steps until Stop; sleeps while there is nothing to do.
  void Run();
  /// Makes Run return after cancelling every request still queued or
  /// running.
  void Stop();
  /// True while requests are queued or running.
  bool Busy() const;
  BatcherStats Stats() const;
  /// Called on Run's thread after every step (metrics snapshots).
  void SetAfterStep(std::function<void()> f) { after_step_ = std::move(f); }

private:
  struct Seq {
    uint64_t id = 0;
    GenRequest req;
    uint32_t slot = 0;
    uint32_t pos = 0;       // tokens in the cache
    uint32_t generated = 0; // tokens handed to on_token
    int32_t next = -1;      // the token to feed next (decode)
    std::unique_ptr<Sampler> sampler;
    // Speculative: the prompt and the tokens so far, this step's rows (the
    // next token and its drafts) and how many drafts to try.
    std::vector<int32_t> text, rows;
    std::unique_ptr<DraftBudget> budget;
    std::unique_ptr<LookupDrafter> drafter;
    // MTP drafts (BatcherOptions::mtp): the module's drafts for the next
    // step (its draft and those chained on it), and its record until it
    // has one accepted.
    bool mtp = false;
    std::vector<int32_t> mtp_drafts;
    uint32_t mtp_rejected = 0;
    bool mtp_accepted = false;
  };

  void Admit();
  /// The free slot (index into free_slots_) whose cached tokens share the
  /// longest prefix with `prompt`, and that prefix's length.
  size_t PickSlot(const std::vector<int32_t> &prompt, uint32_t *common) const;
  /// The prefix store around a request just given slot s.slot, whose
  /// tokens share `common` with its prompt: the slot's tokens past that go
  /// into the store first, then the store's rows of the prompt beyond
  /// s.pos are copied in (s.pos moves on).
  void UseStore(Seq &s, uint32_t common);
  void Finish(Seq &s, FinishReason why, const absl::Status &error);
  void Step();
  /// This step's rows into chunks_ (and the sequences that sample into
  /// sampling_); returns the prompt rows, and the decode rows in
  /// `decode_rows`.
  uint32_t GatherChunks(size_t *decode_rows);
  /// A decoding sequence's rows: its next token and, when it speculates,
  /// up to `spare` drafts.
  void DecodeRows(Seq &s, uint32_t *spare);
  /// Samples a step's rows of `s` (from `at` in the logits) and hands the
  /// tokens on; false when the sequence has finished.
  bool SampleRows(Seq &s, size_t at, uint32_t pos0);
  /// After a sampled token: hand it on and decide whether the sequence
  /// goes on; false when it has finished.
  bool Deliver(Seq &s, int32_t token, absl::Span<const float> row);
  /// After a step's sampling: the MTP module over the rows each MTP
  /// sequence of the step kept (its accepted rows, or its prompt chunk),
  /// one module step for all, and the next draft of each still decoding.
  /// The sequences in `done` have finished.
  void DraftWithMtp(const std::vector<Seq *> &done);

  Engine &engine_;
  BatcherOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Seq>> queue_;   // guarded by mu_
  std::vector<uint64_t> cancels_;            // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  BatcherStats stats_;                       // guarded by mu_
  uint64_t next_id_ = 1;                     // guarded by mu_
  std::vector<std::unique_ptr<Seq>> active_; // Run's thread only
  std::vector<uint32_t> free_slots_;         // guarded by mu_
  /// For each slot, the tokens at the positions its KV caches hold.
  std::vector<std::vector<int32_t>> slot_tokens_; // Run's thread only
  std::unique_ptr<PrefixStore> store_;            // Run's thread only
  std::vector<SeqChunk> chunks_;
  std::vector<Seq *> sampling_;
  std::vector<float> logits_;
  std::function<void()> after_step_;
};

} // namespace duck::runtime

#endif
