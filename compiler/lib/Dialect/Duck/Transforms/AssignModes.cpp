//===- AssignModes.cpp - duck-assign-modes --------------------------------===//
#include "duck/Dialect/Duck/Transforms/Passes.h"

#include "duck_rt/abi.h"

#include "mlir/IR/Builders.h"

namespace mlir::duck {
#define GEN_PASS_DEF_DUCKASSIGNMODES
#include "duck/Dialect/Duck/Transforms/Passes.h.inc"
} // namespace mlir::duck

using namespace mlir;
using namespace mlir::duck;

namespace {

struct DuckAssignModesPass
    : public mlir::duck::impl::DuckAssignModesBase<DuckAssignModesPass> {
  using Base::Base;
  void runOnOperation() override {
    // Cast the option: an Option<int64_t> streams into a diagnostic as `char`.
    if (coresPerDuck < 1) {
      getOperation().emitError() << "duck-assign-modes: cores-per-duck must be "
                                    "at least 1, got "
                                 << (int64_t)coresPerDuck;
      return signalPassFailure();
    }
    Builder b(&getContext());
    const bool smp = coresPerDuck > 1;
    getOperation().walk([&](Fp9FfnOp shard) {
      bool moe = isa<MoeOp>(shard->getParentOp());
      int32_t decode = !moe ? DUCK_MODE_DENSE_DECODE
                       : smp ? DUCK_MODE_MOE_DECODE_SMP
                             : DUCK_MODE_MOE_DECODE;
      int32_t prefill = moe ? DUCK_MODE_MOE_PREFILL : DUCK_MODE_DENSE_PREFILL;
      shard.setDecodeModeAttr(b.getI32IntegerAttr(decode));
      shard.setPrefillModeAttr(b.getI32IntegerAttr(prefill));
      shard.setSmpAttr(b.getBoolAttr(smp));
    });
  }
};

} // namespace
