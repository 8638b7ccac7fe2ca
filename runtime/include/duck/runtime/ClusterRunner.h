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

#include "duck/runtime/DuckClient.h"
#include "duck/runtime/Engine.h"

#include <vector>

namespace duck::runtime {

struct RunnerStats {
  std::vector<StepMetrics> decode_steps, prefill_steps;
  /// Per duck: fp9 weights processed and ns spent in the ELF (max core).
  std::vector<double> params, kernel_ns;
};

class ClusterFfnRunner : public FfnRunner {
public:
  ClusterFfnRunner(const LoadedPlan &plan, DuckClient *client);
  absl::Status Run(uint32_t mode, uint32_t slot, uint32_t n_tokens,
                   uint32_t top_k, const duck_expert_slot *slots,
                   const float *x, float *out) override;
  const RunnerStats &stats() const { return stats_; }
  void ResetStats();

private:
  const LoadedPlan &plan_;
  DuckClient *client_;
  uint32_t hidden_;
  std::vector<uint8_t> ib_;
  std::vector<DuckOutput> outputs_;
  RunnerStats stats_;
};

} // namespace duck::runtime

#endif
