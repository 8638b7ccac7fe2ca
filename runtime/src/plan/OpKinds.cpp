//===- OpKinds.cpp - a table of op kinds ----------------------------------===//
#include "duck/runtime/plan/OpKinds.h"

namespace duck::runtime {

const OpKind *OpKindTable::Find(::duck::plan::OpParams kind) const {
  for (const OpKind *k : kinds_)
    if (k->kind == kind)
      return k;
  return nullptr;
}

} // namespace duck::runtime
