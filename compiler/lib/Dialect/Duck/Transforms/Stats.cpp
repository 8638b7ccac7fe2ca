//===- Stats.cpp - duck-stats ---------------------------------------------===//
#include "duck/Dialect/Duck/Transforms/Layout.h"
#include "duck/Dialect/Duck/Transforms/Passes.h"

#include "llvm/Support/raw_ostream.h"

namespace mlir::duck {
#define GEN_PASS_DEF_DUCKSTATS
#include "duck/Dialect/Duck/Transforms/Passes.h.inc"
} // namespace mlir::duck

using namespace mlir;
using namespace mlir::duck;

namespace {

struct DuckStatsPass : public mlir::duck::impl::DuckStatsBase<DuckStatsPass> {
  using Base::Base;
  void runOnOperation() override {
    ClusterModel c;
    c.bandwidthGbs = bandwidthGbs;
    c.stepOverheadUs = stepOverheadUs;
    auto st = computeStats(getOperation(), c);
    if (failed(st))
      return signalPassFailure();
    if (json)
      llvm::outs() << llvm::json::Value(statsToJson(*st, c)) << "\n";
    else
      printStatsText(*st, c, llvm::outs());
    markAllAnalysesPreserved();
  }
};

} // namespace
