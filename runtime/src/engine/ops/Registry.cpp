//===- Registry.cpp - op kind to its Create function ----------------------===//
#include "HostOp.h"

namespace duck::runtime::ops {

HostOpFactory FindHostOp(pl::OpParams kind) {
  switch (kind) {
  case pl::OpParams::EmbeddingOpDef:
    return CreateEmbedding;
  case pl::OpParams::RmsNormOpDef:
    return CreateRmsNorm;
  case pl::OpParams::AddOpDef:
    return CreateAdd;
  case pl::OpParams::GqaAttentionOpDef:
    return CreateGqaAttention;
  case pl::OpParams::MlaAttentionOpDef:
    return CreateMlaAttention;
  case pl::OpParams::DenseFfnOpDef:
    return CreateDenseFfn;
  case pl::OpParams::MoeFfnOpDef:
    return CreateMoeFfn;
  case pl::OpParams::LmHeadOpDef:
    return CreateLmHead;
  case pl::OpParams::IndexerOpDef:
    return CreateIndexer;
  case pl::OpParams::NONE:
    break;
  }
  return nullptr;
}

} // namespace duck::runtime::ops
