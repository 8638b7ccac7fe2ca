//===- Passes.h - duck dialect passes ---------------------------*- C++ -*-===//
#ifndef DUCK_DIALECT_DUCK_TRANSFORMS_PASSES_H
#define DUCK_DIALECT_DUCK_TRANSFORMS_PASSES_H

#include "duck/Dialect/Duck/IR/DuckOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::duck {

#define GEN_PASS_DECL
#include "duck/Dialect/Duck/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "duck/Dialect/Duck/Transforms/Passes.h.inc"

} // namespace mlir::duck

#endif
