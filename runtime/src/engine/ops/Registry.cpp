//===- Registry.cpp - the table of op kinds (DUCK_HOST_OPS) ---------------===//
#include "HostOp.h"

namespace duck::runtime {
namespace ops {
namespace {
#define DUCK_HOST_OP_ENTRY(name) &k##name##Kind,
const HostOpKind *const kHostOpKinds[] = {DUCK_HOST_OPS(DUCK_HOST_OP_ENTRY)};
#undef DUCK_HOST_OP_ENTRY
} // namespace

const HostOpKind *FindHostOpKind(pl::OpParams kind) {
  for (const HostOpKind *k : kHostOpKinds)
    if (k->kind == kind)
      return k;
  return nullptr;
}
} // namespace ops

const OpKindTable &HostOpKinds() {
  static const OpKindTable table(std::vector<const OpKind *>(
      std::begin(ops::kHostOpKinds), std::end(ops::kHostOpKinds)));
  return table;
}

} // namespace duck::runtime
