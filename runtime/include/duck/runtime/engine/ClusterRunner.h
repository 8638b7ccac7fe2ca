//===- ClusterRunner.h - FFN steps on a cluster of ducks --------*- C++ -*-===//
//
// The FfnRunner of duckrun: encodes each FFN op as one step (IB per
// duck_rt/abi.h), sends it to every duck at once through a DuckClient,
// checks each OB and adds the partial outputs in rank order, so results do
// not depend on which duck answers first. Keeps per-step judge metrics and
// per-duck kernel throughput.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_CLUSTERRUNNER_H
#define DUCK_RUNTIME_CLUSTERRUNNER_H

#include "duck/runtime/cluster/DuckClient.h"
#include "duck/runtime/engine/Engine.h"

#include <functional>

#include <vector>

namespace duck::runtime {

struct RunnerStats {
  /// FFN steps (the LM head's steps, when it is on the ducks, are timed
  /// as the LM head op and kept apart; so are the attention o_proj steps
  /// of duckc --o-proj ducks, decode ones in attn_decode_steps).
  std::vector<StepMetrics> decode_steps, prefill_steps, head_steps,
      attn_decode_steps, attn_prefill_steps;
  /// 0: keep every step's metrics (one run); else keep between
  /// max_steps and 2 x max_steps of the newest (a server).
  size_t max_steps = 0;
  /// Staged steps (FfnRunner::Stage): stages sent, and their steps that
  /// went as only the routed slots.
  uint64_t stages = 0, staged_steps = 0;
  /// Per duck: fp9 weights processed and ns spent in the ELF (max core).
  std::vector<double> params, kernel_ns;
};

class ClusterFfnRunner : public FfnRunner {
public:
  ClusterFfnRunner(const LoadedPlan &plan, DuckClient *client);
  absl::Status Run(uint32_t mode, uint32_t slot, uint32_t n_tokens,
                   uint32_t top_k, const duck_expert_slot *slots,
                   const float *x, float *out) override;
  bool Stage(uint32_t mode, uint32_t slot, uint32_t n_tokens, uint32_t shared,
             const duck_expert_slot *slots, const float *x) override;
  absl::Status RunRows(Rows what, uint32_t slot, uint32_t n_tokens, const float *x,
                       uint32_t k, float *out, uint64_t width) override;
  absl::Status RunScatter(Rows what, uint32_t slot, uint32_t n_tokens,
                          const float *x, uint64_t x_stride,
                          absl::Span<const uint64_t> offsets, float *out,
                          uint32_t width) override;
  const RunnerStats &stats() const { return stats_; }
  void ResetStats();
  /// Bounds the per-step metrics kept (RunnerStats::max_steps).
  void KeepSteps(size_t n) { stats_.max_steps = n; }
  /// Maps the step buffers for steps of up to `ib_bytes` and replies of up
  /// to `ob_bytes` a duck now, not in the first prompt's steps.
  void Reserve(uint64_t ib_bytes, uint64_t ob_bytes);

  /// Called when a step fails (a duck died, hung or dropped its
  /// connection): brings the ducks back and returns the client to use, or
  /// the error to give up with. The step is then sent again; steps are
  /// idempotent because the KV state lives on the host. A step that still
  /// fails after kMaxRecoveriesAStep recoveries ends the run with its
  /// error.
  using Recover =
      std::function<absl::StatusOr<DuckClient *>(const absl::Status &why)>;
  void SetRecover(Recover recover) { recover_ = std::move(recover); }
  /// The recoveries one step may take before its failure is final.
  static constexpr int kMaxRecoveriesAStep = 3;
  /// Fault injection for tests: called before step `index` is sent, and
  /// again before each time it is resent.
  void SetBeforeStep(std::function<void(uint64_t index)> f) {
    before_step_ = std::move(f);
  }
  /// The loss tests: every n-th stage is not sent, so that its staged
  /// step finds none (stage_missed) and goes whole. 0: every stage goes.
  void SetStageSkipEvery(uint32_t n) { stage_skip_every_ = n; }
  uint64_t recoveries() const { return recoveries_; }
  /// Steps sent so far (each counted once, however often it was resent).
  uint64_t steps() const { return steps_; }
  /// Runs after each step is sent, before its replies are awaited
  /// (duckrun parks its host threads there: ThreadPool::Park).
  void SetAfterSend(std::function<void()> f) { after_send_ = std::move(f); }

private:
  /// Sends ib_ to every duck, or duck r its own scatter_ibs_[r] (a
  /// scattered step), recovering as set; keeps the step's metrics in
  /// `kept`.
  absl::Status SendStep(std::vector<StepMetrics> &kept, bool scatter = false,
                        bool staged = false);
  /// Whether Run's step completes the stage sent last (the same mode,
  /// slot and rows, each row's last slots the staged ones); the stage is
  /// spent either way.
  bool TakeStage(uint32_t mode, uint32_t slot, uint32_t n_tokens,
                 uint32_t top_k, const duck_expert_slot *slots);
  /// The stats a head step's metrics go to (the LM head's or an
  /// attention's, decode or prefill).
  std::vector<StepMetrics> &HeadSteps(Rows what, uint32_t n_tokens);
  /// Duck r's output floats after a checked OB header (width per token).
  absl::StatusOr<const float *> Output(size_t r, uint32_t mode, uint32_t slot,
                                       uint32_t n_tokens, uint32_t width);
  /// Per-duck throughput bookkeeping: `params` weights processed.
  void Account(size_t r, double params);

  const LoadedPlan &plan_;
  DuckClient *client_;
  Recover recover_;
  std::function<void(uint64_t)> before_step_;
  std::function<void()> after_send_;
  uint64_t steps_ = 0, recoveries_ = 0;
  uint32_t stage_skip_every_ = 0;
  uint32_t hidden_;
  uint32_t ib_flags_; // DUCK_IB_X_BF16, DUCK_IB_OUT_BF16 as the plan says
  std::vector<float> widened_; // a bf16 answer widened (Output)
  std::vector<uint8_t> ib_;
  // The stage in flight (Stage) and its step's routed slots alone.
  struct PendingStage {
    bool sent = false;
    uint32_t mode = 0, slot = 0, n_tokens = 0, shared = 0;
    std::vector<duck_expert_slot> slots;
  } stage_;
  std::vector<uint8_t> stage_ib_, staged_ib_;
  std::vector<duck_expert_slot> routed_;
  std::vector<std::vector<uint8_t>> scatter_ibs_; // a scattered step's
  std::vector<float> gathered_; // one duck's part of a scattered x
  std::vector<DuckOutput> outputs_;
  RunnerStats stats_;
};

} // namespace duck::runtime

#endif
