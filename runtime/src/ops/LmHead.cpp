//===- LmHead.cpp - the final projection to the vocabulary ----------------===//
#include "HostOp.h"

namespace duck::runtime::ops {
namespace {

class LmHead final : public HostOp {
public:
  LmHead(HostMatrix w, ThreadPool *pool, uint32_t hidden, bool all)
      : w_(std::move(w)), pool_(pool), hidden_(hidden), all_(all) {}

  uint64_t WeightBytesPerToken() const override { return MatrixBytes(w_); }

  absl::Status Run(const Step &s) override {
    const float *x = In(s, 0);
    const uint64_t V = w_.rows;
    if (all_) { // every row's logits, appended (tests and --logits-out)
      const size_t at = s.logits->size();
      s.logits->resize(at + s.rows() * V);
      for (uint32_t t = 0; t < s.rows(); ++t)
        MatVec(*pool_, w_, x + (uint64_t)t * hidden_,
               s.logits->data() + at + t * V);
      return absl::OkStatus();
    }
    // Sampling needs only the last row; the vector keeps its capacity.
    s.logits->resize(V);
    MatVec(*pool_, w_, x + (uint64_t)(s.rows() - 1) * hidden_,
           s.logits->data());
    return absl::OkStatus();
  }

private:
  HostMatrix w_;
  ThreadPool *pool_;
  uint32_t hidden_;
  bool all_;
};

} // namespace

HostOpOr CreateLmHead(const OpEnv &env) {
  const pl::LmHeadOpDef *p = env.def.params_as_LmHeadOpDef();
  const pl::TensorDef *t;
  DUCK_ASSIGN_OR_RETURN(t, env.Need(p->weight(), "weight"));
  HostMatrix m;
  DUCK_ASSIGN_OR_RETURN(m, env.weights.Matrix(*t));
  if (p->fp9() && !m.is_fp9) { // duckc --lm-head fp9: accuracy for bytes
    DUCK_ASSIGN_OR_RETURN(m, env.weights.QuantizedFp9(*t));
  }
  if (m.cols != env.hidden)
    return env.Error("LM head width ", m.cols, " is not the hidden size ",
                     env.hidden);
  if (m.rows != env.plan.def().model()->vocab())
    return env.Error("LM head of ", m.rows, " rows for a vocabulary of ",
                     env.plan.def().model()->vocab());
  return std::make_unique<LmHead>(std::move(m), env.pool, env.hidden,
                                  env.all_logits);
}

} // namespace duck::runtime::ops
