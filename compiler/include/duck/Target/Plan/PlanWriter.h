//===- PlanWriter.h - plan and weight images from laid-out IR ---*- C++ -*-===//
//
// The last step of `duckc compile`: serialises a laid-out module (after
// duck-layout-weights) into the FlatBuffer plan (runtime/schemas/plan.fbs)
// and writes one weight image per duck whose bytes are exactly that duck's
// weight buffer (duck-rt/include/duck_rt/abi.h): fp9 packed straight from
// the checkpoint, streamed, with an XXH3-64 checksum per slot.
//===----------------------------------------------------------------------===//
#ifndef DUCK_TARGET_PLAN_PLANWRITER_H
#define DUCK_TARGET_PLAN_PLANWRITER_H

#include "duck/Import/Checkpoint.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"

#include <atomic>
#include <functional>
#include <string>

namespace mlir::duck {

constexpr const char *kPlanFileName = "model.duckplan";

struct PlanWriteOptions {
  int64_t coresPerDuck = 1;
  bool lmHeadFp9 = false;  // LmHeadOpDef.fp9
  bool lmHeadInt8 = false; // LmHeadOpDef.int8
  bool wireBf16 = false;   // PlanDef.wire_x_bf16
  bool wireOutBf16 = false; // PlanDef.wire_out_bf16
  bool wireQ8 = false;      // PlanDef.wire_x_q8
  bool wireOutQ8 = false;   // PlanDef.wire_out_q8
  bool multicast = false;   // PlanDef.fanout_multicast
  bool stageShared = false; // PlanDef.stage_shared
  /// Called with (rank, bytes done, bytes total) while images are written.
  std::function<void(int64_t, uint64_t, uint64_t)> progress;
  /// Set by the caller (Ctrl-C) to stop: the write fails with
  /// "interrupted" at its next chunk.
  const std::atomic<bool> *cancel = nullptr;
};

/// Writes `model.duckplan` and `duck-<rank>.weights` into `dir` (which must
/// exist). Fails with an error naming the tensor, duck and slot at fault.
llvm::Error writePlan(ModuleOp module, const import::Checkpoint &ckpt,
                      llvm::StringRef dir, const PlanWriteOptions &opts);

/// The weight image file name of `rank`.
std::string imageFileName(int64_t rank);

} // namespace mlir::duck

#endif
