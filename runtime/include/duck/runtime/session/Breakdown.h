//===- Breakdown.h - where a decoded token's time and bytes go --*- C++ -*-===//
//
// From the engine's time by op, the runner's step metrics and the plan:
// milliseconds a decoded token in host attention, host norms/router and
// other FFN-side host work, the LM head, the ducks' kernels (slowest duck),
// the dispatch gap and the rest; the weight bytes a token streams on the
// host and on the ducks; and how close the token rate comes to what those
// bytes allow at the machine's read bandwidth.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_BREAKDOWN_H
#define DUCK_RUNTIME_BREAKDOWN_H

#include "duck/runtime/engine/ClusterRunner.h"
#include "duck/runtime/engine/Engine.h"

#include <string>

namespace duck::runtime {

struct DecodeBreakdown {
  double tpot_ms = 0;
  double host_attention_ms = 0, host_norms_router_ms = 0, lm_head_ms = 0,
         duck_kernel_ms = 0, dispatch_gap_ms = 0, other_ms = 0;
  double host_bytes = 0, duck_bytes_total = 0, duck_bytes_max = 0;
  /// The KV cache the host's attention reads a token at the decode's mean
  /// context (counted in the bound with the weights).
  double host_cache_bytes = 0, mean_context = 0;
  double host_read_gbs = 0, duck_read_gbs = 0;
  bool one_box = true; // host and ducks share one memory system
  double bound_ms = 0; // the TPOT the bytes allow at the read bandwidth
  double decode_bound_fraction = 0;
};

/// Weight bytes one decoded token streams on each duck: dense slots whole,
/// MoE slots by their expected active experts (top_k routed spread over
/// the routed experts, plus the shared ones).
std::vector<double> DuckBytesPerToken(const LoadedPlan &plan);

/// `tpot_ms` is the measured decode time a token and `mean_context` the
/// positions a decoded token attended over, on average. Host and duck read
/// bandwidths in GB/s; `one_box` when the ducks run on the host's machine.
DecodeBreakdown ComputeDecodeBreakdown(const LoadedPlan &plan,
                                       const Engine &engine,
                                       const RunnerStats &stats, double tpot_ms,
                                       double mean_context,
                                       double host_read_gbs,
                                       double duck_read_gbs, bool one_box);

/// One line for the summary.
std::string FormatDecodeBreakdown(const DecodeBreakdown &b);

} // namespace duck::runtime

#endif
