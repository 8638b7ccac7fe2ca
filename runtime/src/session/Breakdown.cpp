//===- Breakdown.cpp - where a decoded token's time and bytes go ----------===//
#include "duck/runtime/session/Breakdown.h"
#include "duck/runtime/plan/OpKinds.h"

#include "absl/strings/str_format.h"

#include <algorithm>
#include <cmath>

namespace duck::runtime {
namespace pl = ::duck::plan;

std::vector<double> DuckBytesPerToken(const LoadedPlan &plan) {
  const pl::PlanDef &d = plan.def();
  // The MTP module's slots (its layer index, the LM head's slot aside)
  // are read only when it drafts: not a token's bytes.
  const int mtpLayer = d.mtp() ? (int)d.mtp()->layer() : -1;
  uint32_t headSlot = UINT32_MAX;
  for (const pl::OpDef *op : *d.ops())
    if (const auto *h = op->params_as_LmHeadOpDef(); h && h->on_ducks())
      headSlot = h->duck_slot();
  std::vector<double> out;
  for (const pl::DuckDef *duck : *d.ducks()) {
    double bytes = 0;
    for (uint32_t i = 0; i < duck->slots()->size(); ++i) {
      const pl::SlotDef *s = duck->slots()->Get(i);
      if ((int)s->layer() == mtpLayer && i != headSlot)
        continue;
      if (!s->moe()) {
        bytes += s->bytes();
        continue;
      }
      const pl::MoeFfnOpDef *moe = nullptr;
      for (const pl::OpDef *op : *d.ops())
        if (op->layer() == (int)s->layer() && op->params_as_MoeFfnOpDef())
          moe = op->params_as_MoeFfnOpDef();
      const uint32_t E = moe ? moe->num_experts() : 1;
      const uint32_t b = s->expert_begin(), e = s->expert_end();
      if (e <= b || !moe)
        continue;
      const double routed = b < E ? std::min(e, E) - b : 0;
      const double shared = e > E ? e - std::max(b, E) : 0;
      const double active = moe->top_k() * routed / E + shared;
      bytes += s->bytes() * active / (e - b);
    }
    out.push_back(bytes);
  }
  return out;
}

DecodeBreakdown ComputeDecodeBreakdown(const LoadedPlan &plan,
                                       const Engine &engine,
                                       const RunnerStats &stats, double tpot_ms,
                                       double mean_context,
                                       double host_read_gbs,
                                       double duck_read_gbs, bool one_box) {
  DecodeBreakdown b;
  b.tpot_ms = tpot_ms;
  const Engine::OpTimes &t = engine.decode_times();
  const double perTok = t.tokens ? 1e3 / t.tokens : 0;
  // Each kind's time to its bucket (its descriptor, engine/ops): a new kind is
  // counted where its descriptor says, never silently in `other`.
  double bucketMs[(int)TimeBucket::kCount] = {};
  for (size_t k = 0; k < t.seconds.size(); ++k)
    if (const OpKind *kind = plan.kinds().Find((pl::OpParams)k))
      bucketMs[(int)kind->bucket] += t.seconds[k] * perTok;
  b.host_attention_ms = bucketMs[(int)TimeBucket::kHostAttention];
  b.lm_head_ms = bucketMs[(int)TimeBucket::kLmHead];
  double waitUs = 0, kernelUs = 0, gapUs = 0;
  for (const StepMetrics &m : stats.decode_steps) {
    waitUs += m.judge_wait_us;
    kernelUs += m.duck_max_us;
    gapUs += m.judge_gap_us;
  }
  // o_proj on the ducks: its steps wait inside the attention ops; their
  // kernel and gap are the ducks', not the host's.
  double attnWaitUs = 0;
  for (const StepMetrics &m : stats.attn_decode_steps) {
    attnWaitUs += m.judge_wait_us;
    kernelUs += m.duck_max_us;
    gapUs += m.judge_gap_us;
  }
  const double steps = t.tokens ? (double)t.tokens : 1;
  b.duck_kernel_ms = kernelUs / 1e3 / steps;
  b.dispatch_gap_ms = gapUs / 1e3 / steps;
  b.host_attention_ms =
      std::max(0.0, b.host_attention_ms - attnWaitUs / 1e3 / steps);
  // FFN ops: routing, step encoding and the partials' sum happen on the
  // host around the wait for the ducks.
  const double ffnHost =
      bucketMs[(int)TimeBucket::kDuckFfn] - waitUs / 1e3 / steps;
  b.host_norms_router_ms =
      bucketMs[(int)TimeBucket::kHostNormsRouter] + std::max(0.0, ffnHost);
  b.other_ms =
      std::max(0.0, tpot_ms - b.host_attention_ms - b.host_norms_router_ms -
                        b.lm_head_ms - b.duck_kernel_ms - b.dispatch_gap_ms);
  b.host_bytes = (double)engine.host_weight_bytes_per_token();
  b.mean_context = mean_context;
  b.host_cache_bytes = (double)engine.cache_read_bytes_per_token(
      (uint64_t)std::llround(std::max(0.0, mean_context)));
  for (double x : DuckBytesPerToken(plan)) {
    b.duck_bytes_total += x;
    b.duck_bytes_max = std::max(b.duck_bytes_max, x);
  }
  b.host_read_gbs = host_read_gbs;
  b.duck_read_gbs = duck_read_gbs;
  b.one_box = one_box;
  // One box: host and ducks take turns on one memory system. A cluster:
  // the host's bytes at its bandwidth, then the slowest duck's at theirs.
  if (host_read_gbs > 0 && duck_read_gbs > 0)
    b.bound_ms = one_box ? (b.host_bytes + b.host_cache_bytes +
                            b.duck_bytes_total) /
                               host_read_gbs / 1e6
                         : (b.host_bytes + b.host_cache_bytes) /
                                   host_read_gbs / 1e6 +
                               b.duck_bytes_max / duck_read_gbs / 1e6;
  b.decode_bound_fraction = tpot_ms > 0 ? b.bound_ms / tpot_ms : 0;
  return b;
}

std::string FormatDecodeBreakdown(const DecodeBreakdown &b) {
  return absl::StrFormat(
      "duckrun: decode ms a token: host attention %.2f, host norms/router "
      "%.2f, LM head %.2f, duck kernel %.2f, dispatch gap %.2f, other %.2f\n"
      "duckrun: bytes a token: host %.1f MB, ducks %.1f MB, KV cache %.1f MB "
      "(%.0f positions on average); read bandwidth %.1f GB/s%s; "
      "decode_bound_fraction %.3f (bound %.2f ms of %.2f)\n",
      b.host_attention_ms, b.host_norms_router_ms, b.lm_head_ms,
      b.duck_kernel_ms, b.dispatch_gap_ms, b.other_ms, b.host_bytes / 1e6,
      b.duck_bytes_total / 1e6, b.host_cache_bytes / 1e6, b.mean_context,
      b.host_read_gbs,
      b.one_box ? " (host and ducks share it)" : "", b.decode_bound_fraction,
      b.bound_ms, b.tpot_ms);
}

} // namespace duck::runtime
