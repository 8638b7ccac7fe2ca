//===- DuckDialect.cpp - the duck dialect ---------------------------------===//
#include "duck/Dialect/Duck/IR/DuckDialect.h"
#include "duck/Dialect/Duck/IR/DuckOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::duck;

#include "duck/Dialect/Duck/IR/DuckDialect.cpp.inc"
#include "duck/Dialect/Duck/IR/DuckEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "duck/Dialect/Duck/IR/DuckAttrs.cpp.inc"

void DuckDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "duck/Dialect/Duck/IR/DuckOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "duck/Dialect/Duck/IR/DuckAttrs.cpp.inc"
      >();
}
