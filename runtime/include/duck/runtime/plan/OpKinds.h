//===- OpKinds.h - what the runtime knows of each op kind -------*- C++ -*-===//
//
// One descriptor per kind of the schema's OpParams union, in one table
// (plan/OpKinds.cpp): the checkpoint tensors the host reads (checked at
// load), the duck step an FFN kind runs and the modes it may use (checked
// at load), and the bucket its host time goes to in the decode breakdown.
// The plan's checks and the breakdown read only this table; the engine's
// ops/Registry.cpp maps the same kinds to their Create functions. Adding an
// op: its schema table, its file under engine/ops, its entry here and its
// line in the registry.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_PLAN_OPKINDS_H
#define DUCK_RUNTIME_PLAN_OPKINDS_H

#include "duck/plan/plan_generated.h"

#include <cstdint>
#include <vector>

namespace duck::runtime {

/// Where a decoded token's host time in an op of this kind is counted
/// (session/Breakdown.cpp).
enum class TimeBucket {
  kHostAttention,   // attention and the indexer (their duck waits taken out)
  kHostNormsRouter, // embedding, norms, residual adds
  kLmHead,
  kDuckFfn, // host time around the FFN step: routing, encoding, the sum
  kCount,
};

struct OpKind {
  ::duck::plan::OpParams kind;
  TimeBucket bucket;
  /// Appends the checkpoint tensors the host reads (absent optional ones
  /// and the ones on the ducks left out).
  void (*host_tensors)(const ::duck::plan::OpDef &op,
                       std::vector<const ::duck::plan::TensorDef *> *out);
  /// FFN kinds: the duck step the op runs, whether its slots hold an MoE
  /// layer, and the (decode, prefill) modes the duck ELF has for it.
  const ::duck::plan::DuckStepDef *(*duck_step)(
      const ::duck::plan::OpDef &op) = nullptr;
  bool moe = false;
  bool (*modes_ok)(uint32_t decode_mode, uint32_t prefill_mode) = nullptr;
  const char *modes = ""; // the legal pairs, for the error
};

/// The descriptor of `kind`; null for NONE or a kind this runtime does not
/// know.
const OpKind *FindOpKind(::duck::plan::OpParams kind);

} // namespace duck::runtime

#endif
