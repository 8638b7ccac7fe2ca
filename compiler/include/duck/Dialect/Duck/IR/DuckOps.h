//===- DuckOps.h - duck dialect ops and attributes --------------*- C++ -*-===//
#ifndef DUCK_DIALECT_DUCK_IR_DUCKOPS_H
#define DUCK_DIALECT_DUCK_IR_DUCKOPS_H

#include "duck/Dialect/Duck/IR/DuckDialect.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/RegionKindInterface.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "duck/Dialect/Duck/IR/DuckEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "duck/Dialect/Duck/IR/DuckAttrs.h.inc"

#define GET_OP_CLASSES
#include "duck/Dialect/Duck/IR/DuckOps.h.inc"

#endif
