//===- OpKinds.cpp - the one table of op kinds ----------------------------===//
#include "duck/runtime/plan/OpKinds.h"

#include <initializer_list>

namespace duck::runtime {
namespace pl = ::duck::plan;
namespace {

using Tensors = std::vector<const pl::TensorDef *>;

void Add(Tensors *out, std::initializer_list<const pl::TensorDef *> ts) {
  for (const pl::TensorDef *t : ts)
    if (t)
      out->push_back(t);
}

void EmbeddingTensors(const pl::OpDef &op, Tensors *out) {
  Add(out, {op.params_as_EmbeddingOpDef()->weight()});
}

void RmsNormTensors(const pl::OpDef &op, Tensors *out) {
  Add(out, {op.params_as_RmsNormOpDef()->weight()});
}

void NoTensors(const pl::OpDef &, Tensors *) {}

void GqaTensors(const pl::OpDef &op, Tensors *out) {
  const pl::GqaAttentionOpDef *p = op.params_as_GqaAttentionOpDef();
  // A projection on the ducks is never read by the host.
  const bool in = p->in_proj_on_ducks();
  Add(out, {p->q_proj_on_ducks() || in ? nullptr : p->q_proj(),
            in ? nullptr : p->k_proj(), in ? nullptr : p->v_proj(),
            p->o_proj_on_ducks() ? nullptr : p->o_proj(), p->q_norm(),
            p->k_norm()});
}

void MlaTensors(const pl::OpDef &op, Tensors *out) {
  const pl::MlaAttentionOpDef *p = op.params_as_MlaAttentionOpDef();
  // From its indexer: neither the query nor the kv_a projections.
  const bool in = p->in_proj_on_ducks() || p->from_indexer();
  const bool q = p->q_proj_on_ducks() || p->from_indexer();
  Add(out, {in ? nullptr : p->q_a_proj(),
            p->from_indexer() ? nullptr : p->q_a_layernorm(),
            q ? nullptr : p->q_b_proj(), q || in ? nullptr : p->q_proj(),
            in ? nullptr : p->kv_a_proj_with_mqa(), p->kv_a_layernorm(),
            p->kv_b_proj(), p->o_proj_on_ducks() ? nullptr : p->o_proj()});
}

void IndexerTensors(const pl::OpDef &op, Tensors *out) {
  const pl::IndexerOpDef *p = op.params_as_IndexerOpDef();
  const bool d = p->on_ducks();
  Add(out, {d ? nullptr : p->q_a_proj(), p->q_a_layernorm(),
            d ? nullptr : p->wq_b(), d ? nullptr : p->wk(), p->k_norm(),
            p->k_norm_bias(), p->weights_proj()});
}

void MoeTensors(const pl::OpDef &op, Tensors *out) {
  const pl::MoeFfnOpDef *p = op.params_as_MoeFfnOpDef();
  Add(out, {p->router_weight(), p->correction_bias()});
}

void LmHeadTensors(const pl::OpDef &op, Tensors *out) {
  const pl::LmHeadOpDef *p = op.params_as_LmHeadOpDef();
  if (!p->on_ducks()) // on the ducks the host never reads it
    Add(out, {p->weight()});
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

const OpKind kOpKinds[] = {
    {pl::OpParams::EmbeddingOpDef, TimeBucket::kHostNormsRouter,
     EmbeddingTensors},
    {pl::OpParams::RmsNormOpDef, TimeBucket::kHostNormsRouter, RmsNormTensors},
    {pl::OpParams::AddOpDef, TimeBucket::kHostNormsRouter, NoTensors},
    {pl::OpParams::GqaAttentionOpDef, TimeBucket::kHostAttention, GqaTensors},
    {pl::OpParams::MlaAttentionOpDef, TimeBucket::kHostAttention, MlaTensors},
    {pl::OpParams::IndexerOpDef, TimeBucket::kHostAttention, IndexerTensors},
    {pl::OpParams::DenseFfnOpDef, TimeBucket::kDuckFfn, NoTensors, DenseStep,
     /*moe=*/false, DenseModes, "dense (0/5)"},
    {pl::OpParams::MoeFfnOpDef, TimeBucket::kDuckFfn, MoeTensors, MoeStep,
     /*moe=*/true, MoeModes, "MoE (1 or 4/6)"},
    {pl::OpParams::LmHeadOpDef, TimeBucket::kLmHead, LmHeadTensors},
};

} // namespace

const OpKind *FindOpKind(pl::OpParams kind) {
  for (const OpKind &k : kOpKinds)
    if (k.kind == kind)
      return &k;
  return nullptr;
}

} // namespace duck::runtime
