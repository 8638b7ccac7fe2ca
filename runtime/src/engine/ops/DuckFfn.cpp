//===- DuckFfn.cpp - dense and MoE FFNs, run on the ducks -----------------===//
//
// A dense FFN is one duck step: every duck runs its slice of the layer and
// the runner adds the partial outputs in rank order. A MoE FFN routes on
// the host first (Routers.h) and sends the (expert, weight) slots with the
// rows; shared experts are extra slots of weight 1. A plan with
// stage_shared sends a decode step's shared experts ahead, before the
// router runs (FfnRunner::Stage), and then the routed slots.
//===----------------------------------------------------------------------===//
#include "HostOp.h"
#include "Routers.h"

#include <algorithm>

namespace duck::runtime::ops {
namespace {

class DenseFfn final : public HostOp {
public:
  DenseFfn(const pl::DuckStepDef &step, FfnRunner *runner, uint32_t hidden)
      : step_(step), runner_(runner), hidden_(hidden) {}

  absl::Status Run(const Step &s) override {
    float *out = Out(s);
    std::fill(out, out + (uint64_t)s.rows() * hidden_, 0.0f);
    return runner_->Run(s.prefill ? step_.prefill_mode() : step_.decode_mode(),
                        step_.slot(), s.rows(), 0, nullptr, In(s, 0), out);
  }

private:
  pl::DuckStepDef step_;
  FfnRunner *runner_;
  uint32_t hidden_;
};

class MoeFfn final : public HostOp {
public:
  MoeFfn(const pl::DuckStepDef &step, const RouterConfig &rc, FfnRunner *r,
         ThreadPool *pool, uint32_t hidden, uint32_t maxRows, bool stage)
      : step_(step), router_(rc), runner_(r), pool_(pool), hidden_(hidden),
        perRow_(rc.top_k + rc.shared), slots_((uint64_t)maxRows * perRow_),
        logits_((uint64_t)std::max(1u, maxRows) * rc.experts),
        stage_(stage && rc.shared > 0) {
    // The shared experts' slots of every row, as Router::Route writes them.
    for (uint32_t t = 0; stage_ && t < maxRows; ++t)
      for (uint32_t s = 0; s < rc.shared; ++s)
        shared_.push_back({rc.experts + s, 1.0f});
  }

  HostMatrix gate_;
  std::vector<float> bias_;

  uint64_t WeightBytesPerToken() const override { return MatrixBytes(gate_); }
  void HostWeights(std::vector<ByteRange> *out) const override {
    AppendMatrixRanges(gate_, out);
  }

  absl::Status Run(const Step &s) override {
    const float *x = In(s, 0);
    const uint32_t mode =
        s.prefill ? step_.prefill_mode() : step_.decode_mode();
    if (stage_ && !s.prefill)
      runner_->Stage(mode, step_.slot(), s.rows(), router_.config().shared,
                     shared_.data(), x);
    // Every row's logits in one product over the pool (the router's
    // weights read once a step, its rows split over the threads; a row's
    // bits are MatVecRows'), then each row routed.
    const uint64_t E = gate_.rows;
    logits_.resize(std::max<uint64_t>(logits_.size(), s.rows() * E));
    if (s.rows() == 1)
      MatVec(*pool_, gate_, x, logits_.data());
    else
      MatMul(*pool_, gate_, x, s.rows(), logits_.data());
    for (uint32_t t = 0; t < s.rows(); ++t)
      router_.Route(logits_.data() + t * E,
                    bias_.empty() ? nullptr : bias_.data(),
                    slots_.data() + (uint64_t)t * perRow_);
    float *out = Out(s);
    std::fill(out, out + (uint64_t)s.rows() * hidden_, 0.0f);
    return runner_->Run(mode, step_.slot(), s.rows(), perRow_, slots_.data(), x,
                        out);
  }

private:
  pl::DuckStepDef step_;
  Router router_;
  FfnRunner *runner_;
  ThreadPool *pool_;
  uint32_t hidden_, perRow_;
  std::vector<duck_expert_slot> slots_;
  std::vector<float> logits_;
  bool stage_;
  std::vector<duck_expert_slot> shared_;
};

} // namespace

HostOpOr CreateDenseFfn(const OpEnv &env) {
  const pl::DenseFfnOpDef *p = env.def.params_as_DenseFfnOpDef();
  if (!p->step())
    return env.Error("no duck step (slot and modes)");
  return std::make_unique<DenseFfn>(*p->step(), env.runner, env.hidden);
}

HostOpOr CreateMoeFfn(const OpEnv &env) {
  const pl::MoeFfnOpDef *p = env.def.params_as_MoeFfnOpDef();
  if (!p->step())
    return env.Error("no duck step (slot and modes)");
  RouterConfig rc;
  rc.sigmoid = p->router() == pl::Router::Sigmoid;
  rc.experts = p->num_experts();
  rc.top_k = p->top_k();
  rc.shared = p->num_shared();
  rc.norm_topk_prob = p->norm_topk_prob();
  rc.n_group = p->n_group() ? p->n_group() : 1;
  rc.topk_group = p->topk_group() ? p->topk_group() : rc.n_group;
  rc.scaling = p->routed_scaling_factor();
  if (rc.top_k == 0 || rc.top_k > rc.experts || rc.experts % rc.n_group ||
      rc.topk_group > rc.n_group ||
      (uint64_t)rc.topk_group * (rc.experts / rc.n_group) < rc.top_k)
    return env.Error("bad router (top ", rc.top_k, " of ", rc.experts,
                     " experts in ", rc.n_group, " groups, ", rc.topk_group,
                     " kept)");
  auto op =
      std::make_unique<MoeFfn>(*p->step(), rc, env.runner, env.pool, env.hidden,
                               env.max_rows, env.plan.def().stage_shared());
  const pl::TensorDef *t;
  DUCK_ASSIGN_OR_RETURN(t, env.Need(p->router_weight(), "router"));
  DUCK_ASSIGN_OR_RETURN(op->gate_, env.weights.Matrix(*t));
  if (op->gate_.rows != rc.experts || op->gate_.cols != env.hidden)
    return env.Error("router weight is ", op->gate_.rows, "x", op->gate_.cols,
                     ", expected ", rc.experts, "x", env.hidden);
  if (const pl::TensorDef *b = p->correction_bias()) {
    DUCK_ASSIGN_OR_RETURN(op->bias_, env.weights.ReadAll(*b));
    if (op->bias_.size() != rc.experts)
      return env.Error("correction bias of ", op->bias_.size(), " for ",
                       rc.experts, " experts");
  }
  return op;
}

namespace {
void MoeTensors(const pl::OpDef &op, HostTensors *out) {
  const pl::MoeFfnOpDef *p = op.params_as_MoeFfnOpDef();
  AppendTensors(out, {p->router_weight(), p->correction_bias()});
}
const pl::DuckStepDef *DenseStep(const pl::OpDef &op) {
  return op.params_as_DenseFfnOpDef()->step();
}
const pl::DuckStepDef *MoeStep(const pl::OpDef &op) {
  return op.params_as_MoeFfnOpDef()->step();
}
// The duck ELF's modes (docs/architecture.md): dense decode 0, prefill 5;
// MoE decode 1 (one core) or 4 (every core), prefill 6.
bool DenseModes(uint32_t decode, uint32_t prefill) {
  return decode == 0 && prefill == 5;
}
bool MoeModes(uint32_t decode, uint32_t prefill) {
  return (decode == 1 || decode == 4) && prefill == 6;
}
std::string MoeCheck(const pl::OpDef &op) {
  const pl::MoeFfnOpDef *m = op.params_as_MoeFfnOpDef();
  if (pl::EnumNameRouter(m->router())[0] && m->top_k() != 0 &&
      m->top_k() <= m->num_experts())
    return "";
  return absl::StrCat("has router ", (int)m->router(), " with top ", m->top_k(),
                      " of ", m->num_experts(), " experts");
}
} // namespace

const HostOpKind kDenseFfnKind{{pl::OpParams::DenseFfnOpDef,
                                TimeBucket::kDuckFfn, NoHostTensors, DenseStep,
                                /*moe=*/false, DenseModes, "dense (0/5)"},
                               CreateDenseFfn};
const HostOpKind kMoeFfnKind{{pl::OpParams::MoeFfnOpDef, TimeBucket::kDuckFfn,
                              MoeTensors, MoeStep, /*moe=*/true, MoeModes,
                              "MoE (1 or 4/6)", MoeCheck},
                             CreateMoeFfn};

} // namespace duck::runtime::ops
