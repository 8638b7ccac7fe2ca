//===- MtpInput.cpp - DeepSeek's MTP module input -------------------------===//
//
// eh_proj([enorm(e) | hnorm(h)]) (docs/mtp.md): e is the embedding of the
// token after the row's position, h the main model's hidden state after its
// final norm at that position; the embedding half comes first.
//===----------------------------------------------------------------------===//
#include "HostOp.h"

namespace duck::runtime::ops {
namespace {

class MtpInputOp final : public HostOp {
public:
  absl::Status Run(const Step &s) override {
    const uint64_t H = enorm_.size();
    const float *e = In(s, 0), *h = In(s, 1);
    for (uint32_t t = 0; t < s.rows(); ++t) {
      float *cat = cat_.data() + t * 2 * H;
      RmsNorm(e + t * H, enorm_.data(), H, eps_, cat);
      RmsNorm(h + t * H, hnorm_.data(), H, eps_, cat + H);
    }
    MatMul(*pool_, eh_, cat_.data(), s.rows(), Out(s));
    return absl::OkStatus();
  }
  uint64_t WeightBytesPerToken() const override { return MatrixBytes(eh_); }
  void HostWeights(std::vector<ByteRange> *out) const override {
    AppendMatrixRanges(eh_, out);
  }

  std::vector<float> enorm_, hnorm_;
  HostMatrix eh_;
  float eps_ = 0;
  ThreadPool *pool_ = nullptr;
  std::vector<float> cat_; // max_rows x 2H
};

} // namespace

HostOpOr CreateMtpInput(const OpEnv &env) {
  const pl::MtpInputOpDef *p = env.def.params_as_MtpInputOpDef();
  if (!env.def.inputs() || env.def.inputs()->size() != 2)
    return env.Error("needs two inputs (the embedding, the hidden state)");
  auto op = std::make_unique<MtpInputOp>();
  DUCK_RETURN_IF_ERROR(env.Load(p->enorm(), "enorm", &op->enorm_));
  DUCK_RETURN_IF_ERROR(env.Load(p->hnorm(), "hnorm", &op->hnorm_));
  DUCK_RETURN_IF_ERROR(env.Load(p->eh_proj(), "eh_proj", &op->eh_));
  const uint64_t H = env.hidden;
  if (op->enorm_.size() != H || op->hnorm_.size() != H)
    return env.Error("enorm/hnorm of ", op->enorm_.size(), "/",
                     op->hnorm_.size(), " for hidden size ", H);
  if (op->eh_.rows != H || op->eh_.cols != 2 * H)
    return env.Error("eh_proj is [", op->eh_.rows, ", ", op->eh_.cols,
                     "], expected [", H, ", ", 2 * H, "]");
  if (p->eps() <= 0)
    return env.Error("eps must be positive");
  op->eps_ = (float)p->eps();
  op->pool_ = env.pool;
  op->cat_.assign((uint64_t)env.max_rows * 2 * H, 0.0f);
  return op;
}

namespace {
void MtpInputTensors(const pl::OpDef &op, HostTensors *out) {
  const pl::MtpInputOpDef *p = op.params_as_MtpInputOpDef();
  AppendTensors(out, {p->enorm(), p->hnorm(), p->eh_proj()});
}
} // namespace

const HostOpKind kMtpInputKind{
    {pl::OpParams::MtpInputOpDef, TimeBucket::kHostAttention, MtpInputTensors},
    CreateMtpInput};

} // namespace duck::runtime::ops
