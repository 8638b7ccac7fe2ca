//===- SelectKernels.cpp - duck-select-kernels ----------------------------===//
#include "duck/Dialect/Duck/Transforms/Layout.h"
#include "duck/Dialect/Duck/Transforms/Passes.h"

#include "duck_rt/kernel_select.h"

namespace mlir::duck {
#define GEN_PASS_DEF_DUCKSELECTKERNELS
#include "duck/Dialect/Duck/Transforms/Passes.h.inc"
} // namespace mlir::duck

using namespace mlir;
using namespace mlir::duck;

// The dialect's kernel enum is the duck's duck_kernel_id, value for value:
// plans store it, and the ELF checks each matrix's stored id against the
// same rule (duck_select_kernel) rather than choosing again.
static_assert(static_cast<uint32_t>(KernelKind::general128) ==
              DUCK_KERNEL_GENERAL128);
static_assert(static_cast<uint32_t>(KernelKind::general64) ==
              DUCK_KERNEL_GENERAL64);
static_assert(static_cast<uint32_t>(KernelKind::general32) ==
              DUCK_KERNEL_GENERAL32);
static_assert(static_cast<uint32_t>(KernelKind::exact64) ==
              DUCK_KERNEL_EXACT64);
static_assert(static_cast<uint32_t>(KernelKind::exact128) ==
              DUCK_KERNEL_EXACT128);
static_assert(static_cast<uint32_t>(KernelKind::exact32) ==
              DUCK_KERNEL_EXACT32);
static_assert(DUCK_KERNEL_COUNT == 6,
              "a new duck_kernel_id needs its KernelKind case (DuckAttrs.td)");

namespace {

KernelAttr select(MLIRContext *ctx, int64_t k, int64_t block) {
  duck_kernel_id id = duck_select_kernel((uint32_t)k, (uint32_t)block);
  std::string why;
  switch (id) {
  case DUCK_KERNEL_EXACT32:
    why = "K == 32 == block: one block a row, four rows a tile";
    break;
  case DUCK_KERNEL_EXACT64:
    why = "K == 64 == block: one block a row, four rows a tile";
    break;
  case DUCK_KERNEL_EXACT128:
    why = "K == 128 == block: one block a row, two rows a tile";
    break;
  default:
    why = "K = " + std::to_string(k) + " is " + std::to_string(k / block) +
          (k == block ? " block of " : " blocks of ") + std::to_string(block);
    break;
  }
  return KernelAttr::get(ctx, static_cast<KernelKind>(id), why);
}

struct DuckSelectKernelsPass
    : public mlir::duck::impl::DuckSelectKernelsBase<DuckSelectKernelsPass> {
  void runOnOperation() override {
    MLIRContext *ctx = &getContext();
    auto result = getOperation().walk([&](Fp9FfnOp shard) -> WalkResult {
      FfnShape s = ffnShapeOf(shard);
      int64_t block = shard.getBlock();
      if (s.hidden % block != 0) {
        shard.emitOpError() << "hidden size " << s.hidden
                            << " (gate/up K) is not a multiple of block "
                            << block;
        return WalkResult::interrupt();
      }
      KernelAttr gu = select(ctx, s.hidden, block);
      shard.setGateKernelAttr(gu);
      shard.setUpKernelAttr(gu);
      shard.setDownKernelAttr(select(ctx, shard.getLocalInter(), block));
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      signalPassFailure();
  }
};

} // namespace
