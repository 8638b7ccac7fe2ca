//===- ChoosePlan.h - duckc compile --tp auto / --explain -------*- C++ -*-===//
//
// Lays out every candidate the flags leave open (a dry run each, stats
// only) and keeps the one the cost model ranks first
// (duck/CostModel/Candidates.h).
//===----------------------------------------------------------------------===//
#ifndef DUCK_PIPELINES_CHOOSEPLAN_H
#define DUCK_PIPELINES_CHOOSEPLAN_H

#include "duck/CostModel/Candidates.h"
#include "duck/Import/ModelConfig.h"
#include "duck/Pipelines/Compile.h"

namespace mlir::duck {

/// What `duckc compile` leaves to the cost model.
struct PlanChoice {
  bool tpOpen = false, multipleOfOpen = false, strategyOpen = false;
  /// No --lm-head; no --o-proj, --q-proj nor --in-proj (their places are
  /// open when the cluster file also gives the host's bandwidth).
  bool lmHeadFree = false, projFree = false;
  /// No --fanout and the cluster file names a cast address: the search
  /// runs once with each of unicast and multicast and keeps the faster.
  bool fanoutOpen = false;
  /// --wire-activations / --wire-results auto (the default): that way of
  /// the wire is open. Where the cluster file gives link speeds the search
  /// also runs with it at the coarsest format the checkpoint's own
  /// inference admits (checkpointWire) and keeps that where it is faster
  /// than the exact wire by more than the ties' 3 %; otherwise f32.
  bool wireXOpen = false, wireOutOpen = false;
  bool explain = false;
};

/// The coarsest wire (duckc --wire-activations / --wire-results) that
/// moves the logits less than the checkpoint's own published inference
/// does by rounding its activations, and why: q8 for block-FP8
/// checkpoints with dynamic activations (each token's inputs to an FP8
/// matrix in blocks of 128 e4m3 values), bf16 for bf16 checkpoints (their
/// inference holds bf16 values), f32 otherwise. test/e2e/wire-auto.test
/// measures both premises against the float64 reference on test models.
struct WireAdmission {
  ClusterModel::Wire wire = ClusterModel::Wire::f32;
  std::string why;
};
WireAdmission checkpointWire(const import::ModelDesc &model);

/// --tp auto / --explain: every legal (tp, multiple_of, strategy, places)
/// `open` leaves, predicted with the cost model (fp9 bytes a token per
/// duck over its bandwidth, plus the dispatch cost of every FFN step;
/// host work not counted, unless the cluster file times it); with the
/// strategy open, the per-layer mix of each pair too. The fastest that
/// fits wins (cost::pickBest); with `explain` the comparison goes to `out`.
llvm::Expected<cost::Candidate> choosePlan(const CompileOptions &base,
                                           const PlanChoice &open,
                                           llvm::raw_ostream &out);

} // namespace mlir::duck

#endif
