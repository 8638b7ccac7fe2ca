//===- duck-opt.cpp - mlir-opt for the duck dialect and passes ------------===//
#include "duck/Dialect/Duck/IR/DuckDialect.h"
#include "duck/Dialect/Duck/Transforms/Passes.h"
#include "duck/Pipelines/Compile.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::duck::DuckDialect>();
  mlir::duck::registerDuckPasses();
  mlir::duck::registerDuckCompilePipeline();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "Duck optimizer driver\n", registry));
}
