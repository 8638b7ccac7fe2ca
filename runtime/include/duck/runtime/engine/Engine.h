//===- Engine.h - runs a plan's host program ---------------------*- C++ -*-===//
//
// The host side of a forward pass: embedding, norms, attention with a KV
// cache, MoE routing and the LM head run here; every FFN op becomes one step
// on the ducks through an FfnRunner. Prefill runs a whole chunk of prompt
// tokens per op (duck modes 5/6), decode one token (modes 0/1/4). Each op
// kind is a file under runtime/src/engine/ops/ (HostOp.h); the engine builds them
// once from the plan and walks them for every chunk.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_ENGINE_H
#define DUCK_RUNTIME_ENGINE_H

#include "duck/runtime/engine/HostKernels.h"
#include "duck/runtime/plan/Plan.h"
#include "duck_rt/abi.h"

#include "absl/status/statusor.h"
#include "absl/types/span.h"

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <vector>

namespace duck::runtime {
namespace ops {
class HostOp;
class ValueArena;
struct Step;
class WeightReader;
} // namespace ops

/// Every op kind this engine can run (engine/ops/HostOp.h, DUCK_HOST_OPS):
/// the table LoadedPlan::Load checks a plan against.
const OpKindTable &HostOpKinds();

/// Runs one FFN op on the ducks: out[t] = sum over ducks of their partial
/// outputs for x[t], added in rank order.
class FfnRunner {
public:
  virtual ~FfnRunner() = default;
  /// `slots` holds n_tokens * top_k entries (MoE) or is empty (dense).
  virtual absl::Status Run(uint32_t mode, uint32_t slot, uint32_t n_tokens,
                           uint32_t top_k, const duck_expert_slot *slots,
                           const float *x, float *out) = 0;
  /// A MoE decode step's shared experts sent ahead, before the host routes
  /// (a plan's stage_shared; abi.h DUCK_IB_STAGE): `slots` holds n_tokens
  /// * shared entries (each row's shared experts, as the last `shared` of
  /// its Run slots). The ducks run them while the host computes the
  /// router; the next Run of the same mode, slot and rows sends only the
  /// routed slots, and its sums have the bits of the whole step. false:
  /// this runner does not stage (the next Run sends the whole step).
  virtual bool Stage(uint32_t mode, uint32_t slot, uint32_t n_tokens,
                     uint32_t shared, const duck_expert_slot *slots,
                     const float *x) {
    (void)mode, (void)slot, (void)n_tokens, (void)shared, (void)slots, (void)x;
    return false;
  }
  /// What a row-split step computes (its time is counted apart).
  enum class Rows { kAttention, kLmHead };
  /// A matrix whose rows are split over the ducks (a head slot on each:
  /// the LM head, an o_proj): out[t][i] for all `width` rows, the ducks'
  /// answers (their slots' OB rows) one after another in rank order; x is
  /// n_tokens x k floats.
  virtual absl::Status RunRows(Rows what, uint32_t slot, uint32_t n_tokens,
                               const float *x, uint32_t k, float *out,
                               uint64_t width) {
    (void)what, (void)slot, (void)n_tokens, (void)x, (void)k, (void)out,
        (void)width;
    return absl::UnimplementedError(
        "this runner has no row-split matrices on the ducks");
  }
  /// A step whose input is split over the ducks (DUCK_MODE_HEAD; an
  /// absorbed MLA's output step: each duck its heads' latent outputs):
  /// duck r gets floats [offsets[r], offsets[r+1]) of every row of x (rows
  /// x_stride floats apart; tp + 1 offsets) and answers `width` floats a
  /// row; out (n_tokens x width) is overwritten with their sum, added in
  /// rank order (duck 0's, then duck 1's, ...) so that it does not depend
  /// on which duck answers first.
  virtual absl::Status RunScatter(Rows what, uint32_t slot, uint32_t n_tokens,
                                  const float *x, uint64_t x_stride,
                                  absl::Span<const uint64_t> offsets,
                                  float *out, uint32_t width) {
    (void)what, (void)slot, (void)n_tokens, (void)x, (void)x_stride,
        (void)offsets, (void)out, (void)width;
    return absl::UnimplementedError(
        "this runner has no scattered steps on the ducks");
  }

  /// Host work that does not need the next step's answers, so that host
  /// and ducks work at once: a runner that sends its steps away runs it
  /// once the next step is on its way and before it awaits the answers.
  /// RunMeanwhile() runs it if no step did (a runner that computes in
  /// place, or no step came); the caller calls it after the step. Once.
  void Meanwhile(std::function<void()> work) { meanwhile_ = std::move(work); }
  void RunMeanwhile() { RunOnce(meanwhile_); }

  /// Reads for the host's next products (the engine's prefetch of the
  /// next ops' weights, EngineOptions::host_prefetch_bytes): run by a
  /// runner that sends its steps away after Meanwhile's work, once, at the
  /// op's first step; DropPrefetch() forgets it where no step came (there
  /// the reads would only come twice).
  void Prefetch(std::function<void()> work) { prefetch_ = std::move(work); }
  void RunPrefetch() { RunOnce(prefetch_); }
  void DropPrefetch() { prefetch_ = nullptr; }

private:
  /// Runs `slot`'s work, if any, emptied first (the work may set it anew).
  static void RunOnce(std::function<void()> &slot) {
    if (!slot)
      return;
    std::function<void()> work = std::move(slot);
    slot = nullptr;
    work();
  }

  std::function<void()> meanwhile_;
  std::function<void()> prefetch_;
};

struct EngineOptions {
  uint32_t max_seq = 4096;     // KV cache length of a sequence
  uint32_t threads = 1;        // host threads (the pool includes the caller)
  uint32_t prefill_chunk = 32; // prompt tokens per duck step
  bool all_logits = false;     // LM head on every token, not just the last
  uint32_t max_seqs = 1;       // sequences with their own KV cache
  uint32_t max_rows = 0;       // rows a step may carry; 0: prefill_chunk
  /// GQA's k/v cache in IEEE half (half the bytes a position to keep and
  /// to read; values rounded to 11 significant bits); else fp32.
  bool kv_f16 = false;
  /// Sequences whose caches get their first 2 MiB mapped when the engine
  /// is built (SeqCacheOf::PopulateFirstPages), the rest as they grow.
  uint32_t populate_seqs = 1;
  /// Run the plan's MTP module (PlanDef.mtp; duckrun --speculative mtp):
  /// its ops are built (its weights read, its caches reserved), Forward
  /// runs it over the prompt and MtpDraft after every step. Without it the
  /// module is never built.
  bool mtp = false;
  /// With mtp: every MTP row's logits are kept for TakeMtpLogits (duckrun
  /// --mtp-logits-out), not only the drafts'.
  bool mtp_all_logits = false;
  /// While an op's first step is on the ducks, read up to this many bytes
  /// of the host weights the next ops read (those up to and including the
  /// next op with host weights) into this core's caches, so that the host
  /// reads them from there (HostOp::HostWeights, PrefetchRanges). Pays
  /// where the host's memory is idle while the ducks work (ducks on other
  /// boxes); on one box the ducks' streams share the memory and the
  /// caches. 0: off.
  uint64_t host_prefetch_bytes = 0;
};

/// One sequence's rows in a batched step: `tokens` at positions
/// pos..pos+n-1 of sequence `seq`.
struct SeqChunk {
  uint32_t seq = 0;
  uint32_t pos = 0;
  absl::Span<const int32_t> tokens;
  bool logits = false; // the LM head on its last row (every row with
                       // EngineOptions::all_logits)
  bool every_row = false; // with logits: the LM head on every row (a
                          // speculative verify step)
  bool mtp = false;       // keep its rows for MtpBatch (serving's MTP drafts)
};

/// One sequence's part of MtpBatch: the first `rows` rows its last step
/// kept (SeqChunk::mtp), `next` the token after the last of them; `draft`:
/// the module's logits of that last row (the draft after `next`).
struct MtpRun {
  uint32_t seq = 0;
  uint32_t rows = 0;
  int32_t next = 0;
  bool draft = false;
  /// With draft: as many more drafts chained on it (mtp:K, K - 1), each
  /// the module once more one position on, reading the last draft (the
  /// argmax) and its own layer output, as MtpChain does.
  uint32_t chain = 0;
};

class Engine {
public:
  static absl::StatusOr<std::unique_ptr<Engine>>
  Create(const LoadedPlan &plan, FfnRunner *runner, const EngineOptions &opts);
  ~Engine();

  /// Runs `tokens` at positions position()..position()+n-1 (prefill when
  /// n > 1, in chunks), appending to the KV cache; writes the logits of the
  /// last token into out_logits (vocab floats). With
  /// EngineOptions::all_logits, out_logits gets every token's logits
  /// instead (n rows of vocab floats, in order). `logits` false: the
  /// caller needs no logits from these tokens (a prompt's leading chunks)
  /// and none are computed (out_logits is left empty), unless all_logits.
  absl::Status Forward(absl::Span<const int32_t> tokens,
                       std::vector<float> *out_logits, bool logits = true);
  /// Like Forward, one token at a time through the decode modes only.
  absl::Status ForwardDecodeOnly(absl::Span<const int32_t> tokens,
                                 std::vector<float> *out_logits);

  /// One step over the rows of several sequences (each at most once, at
  /// most max_rows rows in all): their tokens go through every op together,
  /// so the ducks see one step, and each sequence's rows attend over its
  /// own cache. The logits of every chunk that asks for them are appended
  /// to `out_logits` (vocab floats a row, in order). A row's result does
  /// not depend on what else is in the step (the kernels' contract), so a
  /// batched sequence gets exactly what it would alone.
  absl::Status RunBatch(absl::Span<const SeqChunk> chunks,
                        std::vector<float> *out_logits);

  /// Speculative decoding's verify step for sequence 0: `tokens` (the
  /// next token and its drafts) as one step at position()..+n-1, the
  /// logits of every row into out_logits (n rows of vocab floats). Row i's
  /// logits are the bits a one-token step would give if rows before it
  /// were right. Rewind then drops the rejected positions.
  absl::Status Verify(absl::Span<const int32_t> tokens,
                      std::vector<float> *out_logits);
  /// Whether the engine runs an MTP module (EngineOptions::mtp and a plan
  /// that has one).
  bool has_mtp() const { return !mtp_ops_.empty(); }
  /// What MtpDraft does with the rows it is given.
  enum class MtpMode {
    kDraft, ///< run the module over every row waiting, project the last
    kFlush, ///< run it, no logits
    kDefer, ///< keep the rows for later (drafts paused): the next step's
            ///< first token is the one after them; they run with the next
            ///< kDraft, or when the rows waiting would pass max_rows
  };
  /// The MTP module (docs/mtp.md) over the first `rows` positions of
  /// sequence 0's last step (Forward's last chunk, a decode step or
  /// Verify's rows, of which the caller accepted rows - 1 drafts), and
  /// before them any rows deferred since it last ran (the prompt's chunks,
  /// steps whose drafts were paused): row i reads the main model's hidden
  /// state at its position and the token after it; `next` (the token just
  /// sampled) follows the last. Its cache gets those positions. kDraft
  /// writes the last row's logits (vocab floats: the token after `next`,
  /// a draft) to out_logits. Rows deferred cost nothing until they run,
  /// then one step for all of them.
  absl::Status MtpDraft(uint32_t rows, int32_t next, MtpMode mode,
                        std::vector<float> *out_logits);
  /// A chained draft (speculative mtp:K, K > 1, as DeepSeek and vLLM
  /// chain one module): the module once more, one position past its last
  /// row, reading `draft` (its last draft) and its own last layer output
  /// as the hidden state; the logits (vocab floats: the draft after it) to
  /// out_logits. After MtpDraft(kDraft) or another MtpChain.
  absl::Status MtpChain(int32_t draft, std::vector<float> *out_logits);
  /// Stops running the MTP module for sequence 0 (its drafts are never
  /// accepted): the rows waiting are dropped and no step keeps any until
  /// Reset.
  void MtpStop() {
    mtp_tokens_.clear();
    mtp_open_ = false;
    mtp_stopped_ = true;
  }
  /// Serving's MTP module, several sequences in one module step (and as
  /// few more as max_rows needs): each run's kept rows (the chunk of its
  /// sequence's last RunBatch marked `mtp`) with the token after each,
  /// into that sequence's module caches; the logits (vocab floats) of every
  /// `draft` run's last row appended to out_logits in run order. A row's
  /// result does not depend on the other rows in the step, so a sequence
  /// gets the drafts it would get alone. The kept rows are used up.
  /// With `chained`: for each draft run, its chained drafts (tokens; fewer
  /// than asked where they would pass max_seq), all sequences' n-th
  /// chained rows in one module step.
  absl::Status MtpBatch(absl::Span<const MtpRun> runs,
                        std::vector<float> *out_logits,
                        std::vector<std::vector<int32_t>> *chained = nullptr);
  /// With EngineOptions::mtp_all_logits: every MTP row's logits since the
  /// last call, in position order (the prompt's, then each step's).
  std::vector<float> TakeMtpLogits() {
    std::vector<float> out;
    out.swap(mtp_logits_all_);
    return out;
  }
  /// Rows of sequence 0's last step (MtpDraft's most).
  uint32_t mtp_step_rows() const {
    return (uint32_t)mtp_tokens_.size() - mtp_step_at_;
  }
  /// Sequence 0 back to `pos` (<= position()): the positions after it are
  /// forgotten and written again by the next step (every cache is indexed
  /// by position; nothing reads past a sequence's position).
  void Rewind(uint32_t pos) { pos_ = std::min(pos, pos_); }
  /// Position of sequence 0, the one Forward runs.
  uint32_t position() const { return pos_; }
  uint32_t max_seq() const { return opts_.max_seq; }
  uint32_t max_seqs() const { return opts_.max_seqs; }
  uint32_t max_rows() const { return opts_.max_rows; }
  uint32_t vocab() const;
  /// Wall time spent in each op kind (indexed by plan::OpParams), over the
  /// tokens run so far; FFN kinds include the wait for the ducks.
  struct OpTimes {
    std::array<double, (size_t)::duck::plan::OpParams::MAX + 1> seconds{};
    uint64_t tokens = 0;
  };
  const OpTimes &decode_times() const { return decode_times_; }
  const OpTimes &prefill_times() const { return prefill_times_; }
  /// Host cache bytes a token of the sequence takes over all layers (fp32
  /// keys and values; DeepSeek: the MLA latent, rope key and indexer key).
  uint64_t kv_bytes_per_token() const;
  /// The MTP module's caches a token (EngineOptions::mtp; not in
  /// kv_bytes_per_token, which SaveKv's rows follow).
  uint64_t mtp_kv_bytes_per_token() const;
  /// Weight bytes the host streams for one decoded token.
  uint64_t host_weight_bytes_per_token() const;
  /// Host weight bytes read into the caches while steps were on the ducks
  /// (EngineOptions::host_prefetch_bytes), over the steps run so far.
  uint64_t host_prefetched_bytes() const { return prefetched_bytes_; }
  /// Cache bytes one decoded token reads on the host at `positions`
  /// positions of context (the attention ops' KV caches).
  uint64_t cache_read_bytes_per_token(uint64_t positions) const;
  /// The bytes a position of SaveKv's rows: the model's caches and, when
  /// the engine runs an MTP module, the module's.
  uint64_t saved_kv_bytes_per_token() const;
  /// Prefix reuse (serve's prefix store): the cache rows of positions
  /// pos..pos+n-1 of sequence `seq`, every cache of every op (in op
  /// order, the MTP module's after the model's;
  /// saved_kv_bytes_per_token() bytes a position, position-major), into
  /// `out`; LoadKv writes such rows back into a sequence's caches. A
  /// position's rows depend only on its token and the rows before it, so
  /// rows saved from one sequence are the rows another with the same
  /// tokens would compute.
  void SaveKv(uint32_t seq, uint32_t pos, uint32_t n, uint8_t *out);
  void LoadKv(uint32_t seq, uint32_t pos, uint32_t n, const uint8_t *in);
  void Reset() {
    pos_ = 0;
    mtp_tokens_.clear();
    mtp_open_ = mtp_stopped_ = false;
  }
  /// The host threads (attention, the LM head).
  ThreadPool *pool() { return pool_.get(); }

private:
  Engine();
  absl::Status Prepare();
  /// Sequence 0's next tokens (Forward), one batched step.
  absl::Status RunChunk(absl::Span<const int32_t> tokens,
                        std::vector<float> *out_logits, bool logits = true);
  absl::Status RunRows(bool prefill, std::vector<float> *out_logits);
  /// SaveKv (save) and LoadKv.
  void CopyKvRows(uint32_t seq, uint32_t pos, uint32_t n, uint8_t *buf,
                  bool save);
  /// Builds the ops of `defs` into `out` (and their kinds), widening
  /// `widths` for the values they write.
  absl::Status BuildOps(const std::vector<const ::duck::plan::OpDef *> &defs,
                        const ops::WeightReader &weights,
                        std::vector<uint64_t> &widths,
                        std::vector<std::unique_ptr<ops::HostOp>> &out,
                        std::vector<::duck::plan::OpParams> &kinds);
  /// Walks `ops` over the rows set up in row_*_ (times by kind).
  absl::Status RunOps(const std::vector<std::unique_ptr<ops::HostOp>> &ops,
                      const std::vector<::duck::plan::OpParams> &kinds,
                      bool prefill, std::vector<float> *out_logits);
  /// Walks ops[begin, end) over `step`'s rows (times by kind).
  /// For each op, the host weights of the ops after it (cyclically, the
  /// first ops after the last) up to and including the next with any, at
  /// most `limit` bytes.
  static std::vector<std::vector<ByteRange>>
  PrefetchPlan(const std::vector<std::unique_ptr<ops::HostOp>> &ops,
               uint64_t limit);
  absl::Status RunOpRange(const std::vector<std::unique_ptr<ops::HostOp>> &ops,
                          const std::vector<::duck::plan::OpParams> &kinds,
                          size_t begin, size_t end, const ops::Step &step);
  /// The main program's tail (ops past its last cache op) needs only the
  /// rows that want logits: sets tail_ and tail_values_ at Prepare.
  void FindTail();
  /// Moves the logit rows of every value the tail reads to the front (in
  /// order: row j takes row logit_rows_[j]) and sets up kept_*_ for them.
  void KeepLogitRows();
  /// After a step of sequence 0 at `pos`: its tokens and hidden rows, for
  /// MtpDraft (with an MTP module).
  void KeepMtpRows(absl::Span<const int32_t> tokens, uint32_t pos);
  /// Before a step of sequence 0 of `rows` rows, `next` its first token:
  /// runs the MTP rows waiting when they and the step's would pass
  /// max_rows (else they wait on), drops them when the step does not
  /// follow them.
  absl::Status MtpCatchUp(int32_t next, uint32_t rows);
  /// Runs every MTP row waiting, `next` after the last.
  absl::Status RunPendingMtp(int32_t next, bool logits,
                             std::vector<float> *out_logits);
  /// The MTP module over positions pos..pos+n-1 with the kept hidden rows
  /// and `next` (n tokens); the logits of the rows in `logit_rows`.
  absl::Status RunMtp(uint32_t pos, absl::Span<const int32_t> next,
                      bool last_logits, std::vector<float> *out_logits,
                      const float *hidden = nullptr);

  const LoadedPlan *plan_ = nullptr;
  FfnRunner *runner_ = nullptr;
  EngineOptions opts_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<std::unique_ptr<ops::HostOp>> ops_;
  std::unique_ptr<ops::ValueArena> values_;
  std::vector<::duck::plan::OpParams> kinds_; // of ops_
  // The rows of the step being run (capacity max_rows, kept).
  std::vector<int32_t> row_tokens_;
  std::vector<uint32_t> row_pos_, row_seq_, logit_rows_;
  // The tail: ops_[tail_, end) come after the last op that keeps a cache
  // (the last layer's attention), so a row whose logits nobody wants (a
  // prompt row before the last) has nothing left to give there, and only
  // the logit rows run them (as llama.cpp's last layer keeps only its
  // output rows); that attention itself, where it can, writes every row's
  // cache entries but queries, attends and projects for the logit rows
  // only. tail_values_: the values made before the tail and read in it
  // (moved to the logit rows); kept_*_: the logit rows' tokens, positions
  // and sequences.
  size_t tail_ = 0;
  bool tail_compacts_ = false; // ops_[tail_ - 1] keeps its logit rows only
  std::vector<uint32_t> tail_values_;
  std::vector<int32_t> kept_tokens_;
  std::vector<uint32_t> kept_pos_, kept_seq_, kept_logit_rows_;
  OpTimes decode_times_, prefill_times_;
  // EngineOptions::host_prefetch_bytes: for each op of ops_ (mtp_ops_),
  // the host weights to read while its first step is out (PrefetchPlan).
  std::vector<std::vector<ByteRange>> prefetch_, mtp_prefetch_;
  uint64_t prefetched_bytes_ = 0;
  uint32_t pos_ = 0;
  uint32_t hidden_ = 0;
  // The MTP module (EngineOptions::mtp): its ops, the main program's LM
  // head (which projects its result too), and sequence 0's last step.
  std::vector<std::unique_ptr<ops::HostOp>> mtp_ops_;
  std::vector<::duck::plan::OpParams> mtp_kinds_;
  ops::HostOp *head_ = nullptr;
  uint32_t mtp_hidden_ = 0, mtp_result_ = 0, mtp_layer_out_ = 0;
  std::vector<float> mtp_y_; // the last MTP row's layer output
  uint32_t mtp_last_pos_ = 0;
  // Rows waiting for the module: positions mtp_pos_.., their tokens and
  // hidden rows; the last step's begin at mtp_step_at_.
  std::vector<float> mtp_h_;
  std::vector<int32_t> mtp_tokens_;
  uint32_t mtp_step_at_ = 0;
  std::vector<int32_t> mtp_next_; // RunPendingMtp's tokens (kept)
  uint32_t mtp_pos_ = 0;
  bool mtp_open_ = false;    // the last step awaits MtpDraft
  bool mtp_stopped_ = false; // MtpStop
  std::vector<float> mtp_logits_all_;
  std::vector<float> mtp_scratch_; // logits nobody asked for
  /// MtpBatch's rows: each sequence's last RunBatch chunk marked `mtp`
  /// (its first position, tokens and hidden rows).
  struct MtpKept {
    uint32_t pos = 0;
    std::vector<int32_t> tokens;
    std::vector<float> h;
  };
  std::vector<MtpKept> mtp_kept_;
  void KeepBatchMtpRows(absl::Span<const SeqChunk> chunks);
  /// One of MtpBatch's chains: the draft run `run` of sequence `seq`, its
  /// last row at `pos`, the last draft `token`, the module's layer output
  /// there `y`, `left` drafts to go.
  struct MtpLink {
    size_t run;
    uint32_t seq, pos, left;
    int32_t token;
    std::vector<float> y;
  };
  /// Runs of MtpBatch from `i` that fit one module step: their rows, and
  /// the draft runs' logits (out_logits) and chains (links).
  absl::StatusOr<size_t> MtpBatchStep(absl::Span<const MtpRun> runs, size_t i,
                                      std::vector<float> *out_logits,
                                      std::vector<MtpLink> *links);
  /// The module's result rows through the main LM head (the rows set up
  /// in row_*_, logits of logit_rows_ appended to `sink`).
  absl::Status ProjectMtpRows(std::vector<float> *sink);
  void ClearRows();
  /// Every link one draft on, all in one module step, until none is left.
  absl::Status MtpChainLinks(std::vector<MtpLink> links,
                             std::vector<std::vector<int32_t>> *chained);
};

/// Sampling of the next token from logits.
struct SamplerOptions {
  float temperature = 0.0f; // 0: greedy
  uint32_t top_k = 0;       // 0: off
  float top_p = 1.0f;       // 1: off
  uint64_t seed = 0;
};

class Sampler {
public:
  explicit Sampler(const SamplerOptions &o);
  int32_t Sample(absl::Span<const float> logits);

private:
  SamplerOptions o_;
  uint64_t state_;
  std::vector<std::pair<float, int32_t>> buf_;
};

} // namespace duck::runtime

#endif
