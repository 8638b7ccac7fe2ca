//===- PlanVerifier.h - check a plan's weight images ------------*- C++ -*-===//
//
// Reads a compiled plan back and checks every duck's weight image against
// the plan and the checkpoint: header (magic, versions, tp, rank, model key,
// header checksum), every slot's checksum, and every packed matrix slice,
// dequantised, against the checkpoint's own values (bit-exact for FP8
// checkpoints, within half an fp9 step for bf16/f16/f32 ones).
//===----------------------------------------------------------------------===//
#ifndef DUCK_TARGET_PLAN_PLANVERIFIER_H
#define DUCK_TARGET_PLAN_PLANVERIFIER_H

#include "duck/Import/Checkpoint.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::duck {

struct PlanCheck {
  uint64_t ducks = 0, slots = 0, matrices = 0, elements = 0;
  uint64_t exactMatrices = 0; ///< bit-identical to the checkpoint
  double worstRelError = 0;   ///< max |fp9 - ckpt| / |ckpt| (non-zero ckpt)
};

/// Fails at the first inconsistency, naming the duck, slot, expert and
/// tensor. `ckpt` must be the checkpoint the plan was compiled from.
llvm::Expected<PlanCheck> verifyPlanImages(llvm::StringRef planDir,
                                           const import::Checkpoint &ckpt);

} // namespace mlir::duck

#endif
