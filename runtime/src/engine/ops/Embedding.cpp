//===- Embedding.cpp - token embedding lookup -----------------------------===//
#include "HostOp.h"

#include <cstring>

namespace duck::runtime::ops {
namespace {

class Embedding final : public HostOp {
public:
  Embedding(HostMatrix table, uint32_t hidden)
      : table_(std::move(table)), hidden_(hidden) {}

  uint64_t WeightBytesPerToken() const override {
    return (uint64_t)hidden_ * (table_.bf16 ? 2 : 4);
  }

  absl::Status Run(const Step &s) override {
    float *out = Out(s);
    for (uint32_t t = 0; t < s.rows(); ++t) {
      const int32_t id = s.tokens[t];
      if (id < 0 || (uint64_t)id >= table_.rows)
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", id, " is outside the vocabulary of ", table_.rows));
      float *dst = out + (uint64_t)t * hidden_;
      if (table_.bf16)
        for (uint32_t c = 0; c < hidden_; ++c)
          dst[c] = duck_bf16_to_f32(table_.bf16[(uint64_t)id * hidden_ + c]);
      else
        std::memcpy(dst, table_.f32 + (uint64_t)id * hidden_, hidden_ * 4);
    }
    return absl::OkStatus();
  }

private:
  HostMatrix table_;
  uint32_t hidden_;
};

} // namespace

HostOpOr CreateEmbedding(const OpEnv &env) {
  const pl::EmbeddingOpDef *p = env.def.params_as_EmbeddingOpDef();
  const pl::TensorDef *t;
  DUCK_ASSIGN_OR_RETURN(t, env.Need(p->weight(), "weight"));
  HostMatrix m;
  DUCK_ASSIGN_OR_RETURN(m, env.weights.Matrix(*t));
  if (m.is_fp9 || m.is_e4m3)
    return absl::UnimplementedError(
        "FP8 embeddings are not supported (row lookup needs bf16/fp32)");
  if (m.cols != env.hidden)
    return env.Error("embedding width ", m.cols, " is not the hidden size ",
                     env.hidden);
  return std::make_unique<Embedding>(std::move(m), env.hidden);
}

namespace {
void EmbeddingTensors(const pl::OpDef &op, HostTensors *out) {
  AppendTensors(out, {op.params_as_EmbeddingOpDef()->weight()});
}
} // namespace

const HostOpKind kEmbeddingKind{{pl::OpParams::EmbeddingOpDef,
                                 TimeBucket::kHostNormsRouter,
                                 EmbeddingTensors},
                                CreateEmbedding};

} // namespace duck::runtime::ops
