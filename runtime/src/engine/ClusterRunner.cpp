//===- ClusterRunner.cpp - FFN steps on a cluster of ducks ----------------===//
#include "duck/runtime/engine/ClusterRunner.h"

#include "duck/runtime/StatusMacros.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

namespace duck::runtime {
namespace pl = ::duck::plan;

ClusterFfnRunner::ClusterFfnRunner(const LoadedPlan &plan, DuckClient *client)
    : plan_(plan), client_(client), hidden_(plan.def().model()->hidden()),
      ib_flags_((plan.def().wire_x_bf16() ? DUCK_IB_X_BF16 : 0) |
                (plan.def().wire_out_bf16() ? DUCK_IB_OUT_BF16 : 0) |
                (plan.def().wire_x_q8() ? DUCK_IB_X_Q8 : 0) |
                (plan.def().wire_out_q8() ? DUCK_IB_OUT_Q8 : 0)) {
  ResetStats();
}

void ClusterFfnRunner::Reserve(uint64_t ib_bytes, uint64_t ob_bytes) {
  // Grown and cleared: the capacity (and its pages) stay for the steps.
  ib_.resize(std::max<uint64_t>(ib_.size(), ib_bytes));
  outputs_.resize(client_->size());
  for (DuckOutput &o : outputs_) {
    o.ob.resize(std::max<uint64_t>(o.ob.size(), ob_bytes));
    o.ob.clear();
  }
}

void ClusterFfnRunner::ResetStats() {
  const size_t keep = stats_.max_steps;
  stats_ = RunnerStats();
  stats_.max_steps = keep;
  stats_.params.assign(client_->size(), 0.0);
  stats_.kernel_ns.assign(client_->size(), 0.0);
}

absl::Status ClusterFfnRunner::SendStep(std::vector<StepMetrics> &kept,
                                        bool scatter, bool staged) {
  const size_t ducks = client_->size();
  // A staged step: its routed slots to every duck, the whole step (ib_)
  // to one that finds no stage.
  std::vector<absl::Span<const uint8_t>> whole;
  std::vector<absl::Span<const uint8_t>> ibs(ducks, absl::MakeConstSpan(ib_));
  if (staged) {
    whole = ibs;
    ibs.assign(ducks, absl::MakeConstSpan(staged_ib_));
  }
  for (size_t r = 0; scatter && r < ducks; ++r)
    ibs[r] = absl::MakeConstSpan(scatter_ibs_[r]);
  StepMetrics metrics;
  const uint64_t index = steps_++;
  for (int attempt = 0;; ++attempt) {
    if (before_step_)
      before_step_(index);
    // The host's own work for the meanwhile (FfnRunner::Meanwhile) first,
    // then the reads of the next ops' weights (FfnRunner::Prefetch), then
    // whatever parks the host's threads until the answers come.
    absl::Status s = client_->Step(
        ibs, &outputs_, &metrics,
        [this] {
          RunMeanwhile();
          RunPrefetch();
          if (after_send_)
            after_send_();
        },
        whole);
    if (s.ok())
      break;
    if (!recover_)
      return s;
    // A step that fails again after the ducks were brought back is not a
    // duck that died: it is this step (an input the ducks refuse, a kernel
    // that crashes on it). Bringing them back once more would not end.
    if (attempt == kMaxRecoveriesAStep)
      return absl::Status(
          s.code(), absl::StrCat("duck step ", index, " failed again after ",
                                 attempt, " recoveries: ", s.message()));
    auto client = recover_(s);
    if (!client.ok())
      return client.status();
    client_ = *client;
    ++recoveries_;
  }
  if (stats_.max_steps && kept.size() >= 2 * stats_.max_steps)
    kept.erase(kept.begin(), kept.begin() + stats_.max_steps);
  kept.push_back(metrics);
  return absl::OkStatus();
}

absl::StatusOr<const float *>
ClusterFfnRunner::Output(size_t r, uint32_t mode, uint32_t slot,
                         uint32_t n_tokens, uint32_t width) {
  const uint64_t values = (uint64_t)n_tokens * width;
  const uint64_t bytes = n_tokens * duck_out_row_bytes(width, ib_flags_);
  const DuckOutput &o = outputs_[r];
  const std::string who = client_->endpoint(r).ToString();
  if (o.ob.size() < sizeof(duck_ob_header))
    return absl::DataLossError(
        absl::StrCat("duck ", r, " (", who, ") sent a truncated output"));
  duck_ob_header oh;
  std::memcpy(&oh, o.ob.data(), sizeof oh);
  if (oh.magic != DUCK_OB_MAGIC || oh.status != DUCK_STATUS_OK ||
      oh.n_tokens != n_tokens || oh.hidden != width ||
      oh.out_offset + bytes > o.ob.size())
    return absl::DataLossError(absl::StrCat(
        "duck ", r, " (", who, ") answered step (mode ", mode, ", slot ",
        slot, ") with status ", oh.status, ", ", oh.n_tokens, " tokens of ",
        oh.hidden, " (expected ", n_tokens, " of ", width, ", ",
        sizeof(duck_ob_header) + bytes, " bytes)", o.log.empty() ? "" : ": ",
        o.log));
  if (!(ib_flags_ & (DUCK_IB_OUT_BF16 | DUCK_IB_OUT_Q8)))
    return reinterpret_cast<const float *>(o.ob.data() + oh.out_offset);
  // bf16 or q8 on the wire (the plan's wire_out_*): widened exactly.
  widened_.resize(values);
  const uint8_t *h = o.ob.data() + oh.out_offset;
  if (ib_flags_ & DUCK_IB_OUT_Q8) {
    const uint64_t row = duck_q8_row_bytes(width);
    for (uint64_t t = 0; t < n_tokens; ++t)
      duck_q8_decode_row(h + t * row, width, widened_.data() + t * width);
    return widened_.data();
  }
  for (uint64_t i = 0; i < values; ++i) {
    uint16_t v;
    std::memcpy(&v, h + 2 * i, 2);
    widened_[i] = duck_bf16_to_f32(v);
  }
  return widened_.data();
}

void ClusterFfnRunner::Account(size_t r, double params) {
  uint64_t maxNs = 0;
  for (uint64_t ns : outputs_[r].kernel_ns)
    maxNs = std::max(maxNs, ns);
  stats_.params[r] += params;
  stats_.kernel_ns[r] += maxNs;
}

bool ClusterFfnRunner::Stage(uint32_t mode, uint32_t slot, uint32_t n_tokens,
                             uint32_t shared, const duck_expert_slot *slots,
                             const float *x) {
  stage_.sent = false;
  if ((mode != DUCK_MODE_MOE_DECODE && mode != DUCK_MODE_MOE_DECODE_SMP) ||
      shared == 0 || n_tokens == 0 || !client_->persistent())
    return false;
  const uint32_t flags = ib_flags_ | DUCK_IB_STAGE;
  stage_ib_.resize(duck_ib_bytes_flags(n_tokens, shared, hidden_, flags));
  duck_ib_write_flags(stage_ib_.data(), mode, slot, n_tokens, shared, slots, x,
                      hidden_, flags);
  const std::vector<absl::Span<const uint8_t>> ibs(
      client_->size(), absl::MakeConstSpan(stage_ib_));
  const bool skip =
      stage_skip_every_ && (stats_.stages + 1) % stage_skip_every_ == 0;
  if (!skip && !client_->Stage(ibs).ok())
    return false; // the whole step goes (and meets the broken duck)
  stage_.sent = true;
  stage_.mode = mode;
  stage_.slot = slot;
  stage_.n_tokens = n_tokens;
  stage_.shared = shared;
  stage_.slots.assign(slots, slots + (uint64_t)n_tokens * shared);
  ++stats_.stages;
  return true;
}

bool ClusterFfnRunner::TakeStage(uint32_t mode, uint32_t slot,
                                 uint32_t n_tokens, uint32_t top_k,
                                 const duck_expert_slot *slots) {
  PendingStage &s = stage_;
  const bool sent = std::exchange(s.sent, false);
  if (!sent || s.mode != mode || s.slot != slot || s.n_tokens != n_tokens ||
      top_k <= s.shared)
    return false;
  const uint32_t routed = top_k - s.shared;
  for (uint64_t t = 0; t < n_tokens; ++t)
    for (uint32_t i = 0; i < s.shared; ++i) {
      const duck_expert_slot &a = slots[t * top_k + routed + i],
                             &b = s.slots[t * s.shared + i];
      if (a.expert != b.expert || a.weight != b.weight)
        return false;
    }
  routed_.resize((uint64_t)n_tokens * routed);
  for (uint64_t t = 0; t < n_tokens; ++t)
    std::copy(slots + t * top_k, slots + t * top_k + routed,
              routed_.begin() + t * routed);
  staged_ib_.resize(duck_ib_x_offset(routed_.size()));
  duck_ib_write_flags(staged_ib_.data(), mode, slot, n_tokens, routed,
                      routed_.data(), nullptr, hidden_,
                      ib_flags_ | DUCK_IB_STAGED);
  return true;
}

absl::Status ClusterFfnRunner::Run(uint32_t mode, uint32_t slot,
                                   uint32_t n_tokens, uint32_t top_k,
                                   const duck_expert_slot *slots,
                                   const float *x, float *out) {
  ib_.resize(duck_ib_bytes_flags(n_tokens, top_k, hidden_, ib_flags_));
  duck_ib_write_flags(ib_.data(), mode, slot, n_tokens, top_k, slots, x,
                      hidden_, ib_flags_);
  const bool staged = TakeStage(mode, slot, n_tokens, top_k, slots);
  stats_.staged_steps += staged;
  // A prompt's steps by their mode: its last layer's step may carry one
  // row (the row that samples), in the prefill mode all the same.
  const bool prompt =
      mode == DUCK_MODE_DENSE_PREFILL || mode == DUCK_MODE_MOE_PREFILL;
  if (absl::Status s = SendStep(
          prompt ? stats_.prefill_steps : stats_.decode_steps, false, staged);
      !s.ok())
    return s;

  // Partial outputs, added in rank order.
  for (size_t r = 0; r < client_->size(); ++r) {
    const float *p;
    DUCK_ASSIGN_OR_RETURN(p, Output(r, mode, slot, n_tokens, hidden_));
    for (uint64_t i = 0; i < (uint64_t)n_tokens * hidden_; ++i)
      out[i] += p[i];

    // Throughput bookkeeping: weights this duck streamed for the step.
    const pl::SlotDef *sd = plan_.def().ducks()->Get(r)->slots()->Get(slot);
    double perExpert = 3.0 * hidden_ * (sd->inter_end() - sd->inter_begin());
    double experts = 1;
    if (sd->moe()) {
      std::set<uint32_t> held;
      for (uint64_t i = 0; i < (uint64_t)n_tokens * top_k; ++i)
        if (slots[i].expert >= sd->expert_begin() &&
            slots[i].expert < sd->expert_end())
          held.insert(slots[i].expert);
      experts = held.size();
    }
    Account(r, perExpert * experts);
  }
  return absl::OkStatus();
}

absl::Status ClusterFfnRunner::RunRows(Rows what, uint32_t slot,
                                       uint32_t n_tokens, const float *x,
                                       uint32_t k, float *out, uint64_t width) {
  ib_.resize(duck_ib_bytes_flags(n_tokens, 0, k, ib_flags_));
  duck_ib_write_flags(ib_.data(), DUCK_MODE_HEAD, slot, n_tokens, 0, nullptr, x,
                      k, ib_flags_);
  if (absl::Status s = SendStep(HeadSteps(what, n_tokens)); !s.ok())
    return s;
  // Each duck's rows after the ones of the ducks before it, in every
  // token's output (a plain row split's are its slot's [inter_begin,
  // inter_end); an absorbed MLA's query step's, its OB's).
  uint64_t b = 0;
  for (size_t r = 0; r < client_->size(); ++r) {
    const pl::SlotDef *sd = plan_.def().ducks()->Get(r)->slots()->Get(slot);
    const uint32_t rows = sd->inter_end() - sd->inter_begin();
    if (b + rows > width)
      return absl::InternalError(absl::StrCat(
          "slot ", slot, " of the ducks answers more than ", width, " rows"));
    const float *p;
    DUCK_ASSIGN_OR_RETURN(p, Output(r, DUCK_MODE_HEAD, slot, n_tokens, rows));
    for (uint64_t t = 0; t < n_tokens; ++t)
      std::memcpy(out + t * width + b, p + t * rows, (uint64_t)rows * 4);
    Account(r, (double)rows * k);
    b += rows;
  }
  return absl::OkStatus();
}

std::vector<StepMetrics> &ClusterFfnRunner::HeadSteps(Rows what,
                                                      uint32_t n_tokens) {
  // The LM head's steps apart from an attention's (their op times differ).
  return what == Rows::kLmHead ? stats_.head_steps
         : n_tokens > 1        ? stats_.attn_prefill_steps
                               : stats_.attn_decode_steps;
}

absl::Status ClusterFfnRunner::RunScatter(Rows what, uint32_t slot,
                                          uint32_t n_tokens, const float *x,
                                          uint64_t x_stride,
                                          absl::Span<const uint64_t> offsets,
                                          float *out, uint32_t width) {
  const size_t ducks = client_->size();
  if (offsets.size() != ducks + 1)
    return absl::InvalidArgumentError(absl::StrCat("a scattered step for ",
                                                   ducks, " ducks has ",
                                                   offsets.size(), " offsets"));
  // Each duck its own IB: its columns of every row, gathered.
  scatter_ibs_.resize(ducks);
  for (size_t r = 0; r < ducks; ++r) {
    const uint64_t b = offsets[r], k = offsets[r + 1] - b;
    gathered_.resize((uint64_t)n_tokens * k);
    for (uint64_t t = 0; t < n_tokens; ++t)
      std::memcpy(gathered_.data() + t * k, x + t * x_stride + b, k * 4);
    std::vector<uint8_t> &ib = scatter_ibs_[r];
    ib.resize(duck_ib_bytes_flags(n_tokens, 0, (uint32_t)k, ib_flags_));
    duck_ib_write_flags(ib.data(), DUCK_MODE_HEAD, slot, n_tokens, 0, nullptr,
                        gathered_.data(), (uint32_t)k, ib_flags_);
  }
  if (absl::Status s = SendStep(HeadSteps(what, n_tokens), true); !s.ok())
    return s;
  // Partial sums, added in rank order.
  std::fill(out, out + (uint64_t)n_tokens * width, 0.0f);
  for (size_t r = 0; r < ducks; ++r) {
    const float *p;
    DUCK_ASSIGN_OR_RETURN(p, Output(r, DUCK_MODE_HEAD, slot, n_tokens, width));
    for (uint64_t i = 0; i < (uint64_t)n_tokens * width; ++i)
      out[i] += p[i];
    const pl::SlotDef *sd = plan_.def().ducks()->Get(r)->slots()->Get(slot);
    double params = 0;
    for (uint32_t m = 0; sd->matrices() && m < sd->matrices()->size(); ++m)
      params +=
          (double)sd->matrices()->Get(m)->rows() * sd->matrices()->Get(m)->k();
    Account(r, params);
  }
  return absl::OkStatus();
}

} // namespace duck::runtime
