//===- Norms.cpp - RMSNorm and the residual add ---------------------------===//
#include "HostOp.h"

namespace duck::runtime::ops {
namespace {

class RmsNormOp final : public HostOp {
public:
  RmsNormOp(std::vector<float> w, float eps) : w_(std::move(w)), eps_(eps) {}

  absl::Status Run(const Step &s) override {
    const uint64_t H = w_.size();
    const float *x = In(s, 0);
    float *out = Out(s);
    for (uint32_t t = 0; t < s.rows(); ++t)
      RmsNorm(x + t * H, w_.data(), H, eps_, out + t * H);
    return absl::OkStatus();
  }

private:
  std::vector<float> w_;
  float eps_;
};

class AddOp final : public HostOp {
public:
  explicit AddOp(uint32_t hidden) : hidden_(hidden) {}

  absl::Status Run(const Step &s) override {
    const float *a = In(s, 0), *b = In(s, 1);
    float *out = Out(s);
    const uint64_t n = (uint64_t)s.rows() * hidden_;
    for (uint64_t i = 0; i < n; ++i)
      out[i] = a[i] + b[i];
    return absl::OkStatus();
  }

private:
  uint32_t hidden_;
};

} // namespace

HostOpOr CreateRmsNorm(const OpEnv &env) {
  const pl::RmsNormOpDef *p = env.def.params_as_RmsNormOpDef();
  const pl::TensorDef *t;
  DUCK_ASSIGN_OR_RETURN(t, env.Need(p->weight(), "weight"));
  std::vector<float> w;
  DUCK_ASSIGN_OR_RETURN(w, env.weights.ReadAll(*t));
  if (w.size() != env.hidden)
    return env.Error("norm weight of ", w.size(), " for hidden size ",
                     env.hidden);
  if (!env.def.inputs() || env.def.inputs()->size() != 1)
    return env.Error("needs one input");
  return std::make_unique<RmsNormOp>(std::move(w), (float)p->eps());
}

HostOpOr CreateAdd(const OpEnv &env) {
  if (!env.def.inputs() || env.def.inputs()->size() != 2)
    return env.Error("needs two inputs");
  return std::make_unique<AddOp>(env.hidden);
}

namespace {
void RmsNormTensors(const pl::OpDef &op, HostTensors *out) {
  AppendTensors(out, {op.params_as_RmsNormOpDef()->weight()});
}
} // namespace

const HostOpKind kRmsNormKind{
    {pl::OpParams::RmsNormOpDef, TimeBucket::kHostNormsRouter, RmsNormTensors},
    CreateRmsNorm};
const HostOpKind kAddKind{
    {pl::OpParams::AddOpDef, TimeBucket::kHostNormsRouter, NoHostTensors},
    CreateAdd};

} // namespace duck::runtime::ops
