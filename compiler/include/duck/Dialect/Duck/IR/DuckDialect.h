//===- DuckDialect.h - the duck dialect -------------------------*- C++ -*-===//
#ifndef DUCK_DIALECT_DUCK_IR_DUCKDIALECT_H
#define DUCK_DIALECT_DUCK_IR_DUCKDIALECT_H

#include "mlir/IR/Dialect.h"

#include "duck/Dialect/Duck/IR/DuckDialect.h.inc"

#endif
