//===- OpKinds.h - what a runtime knows of each op kind ---------*- C++ -*-===//
//
// The contract of an op kind of the schema's OpParams union, as the plan
// layer reads it: the checkpoint tensors the host reads (checked at load),
// the duck step an FFN kind runs and the modes it may use (checked at load),
// and the bucket its host time goes to in the decode breakdown. This layer
// defines the contract and checks plans against a table of them; it knows
// no kind itself. Each kind's descriptor lives in the file of its host op
// (engine/ops/<Op>.cpp, which adds the op's Create), and the engine's
// registry (engine/ops/HostOp.h, DUCK_HOST_OPS) lists them: adding an op is
// its schema table, its file and one registry line.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_PLAN_OPKINDS_H
#define DUCK_RUNTIME_PLAN_OPKINDS_H

#include "duck/plan/plan_generated.h"

#include <cstdint>
#include <initializer_list>
#include <string>
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

using HostTensors = std::vector<const ::duck::plan::TensorDef *>;

struct OpKind {
  ::duck::plan::OpParams kind;
  TimeBucket bucket;
  /// Appends the checkpoint tensors the host reads (absent optional ones
  /// and the ones on the ducks left out).
  void (*host_tensors)(const ::duck::plan::OpDef &op, HostTensors *out);
  /// FFN kinds: the duck step the op runs, whether its slots hold an MoE
  /// layer, and the (decode, prefill) modes the duck ELF has for it.
  const ::duck::plan::DuckStepDef *(*duck_step)(
      const ::duck::plan::OpDef &op) = nullptr;
  bool moe = false;
  bool (*modes_ok)(uint32_t decode_mode, uint32_t prefill_mode) = nullptr;
  const char *modes = ""; // the legal pairs, for the error
  /// What is wrong with the op's own table beyond its tensors and step
  /// (for example a router that does not exist); empty when nothing.
  std::string (*check)(const ::duck::plan::OpDef &op) = nullptr;
};

/// The kinds a runtime knows (the engine's registry builds the one table).
class OpKindTable {
public:
  explicit OpKindTable(std::vector<const OpKind *> kinds)
      : kinds_(std::move(kinds)) {}
  /// The descriptor of `kind`; null for NONE or a kind not in the table.
  const OpKind *Find(::duck::plan::OpParams kind) const;
  const std::vector<const OpKind *> &all() const { return kinds_; }

private:
  std::vector<const OpKind *> kinds_;
};

/// For host_tensors: appends the present ones of `ts` (null: absent or on
/// the ducks).
inline void
AppendTensors(HostTensors *out,
              std::initializer_list<const ::duck::plan::TensorDef *> ts) {
  for (const ::duck::plan::TensorDef *t : ts)
    if (t)
      out->push_back(t);
}

/// For kinds that read no checkpoint tensor on the host.
inline void NoHostTensors(const ::duck::plan::OpDef &, HostTensors *) {}

} // namespace duck::runtime

#endif
