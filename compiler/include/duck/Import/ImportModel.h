//===- ImportModel.h - checkpoint to duck dialect ---------------*- C++ -*-===//
//
// Builds the graph-level duck IR of a model directory: one duck.model op
// whose body is the forward pass, with every weight a #duck.weight /
// #duck.experts reference into the checkpoint (or, without weights, into the
// tensors its config implies). Locations point at config.json and carry the
// layer name.
//===----------------------------------------------------------------------===//
#ifndef DUCK_IMPORT_IMPORTMODEL_H
#define DUCK_IMPORT_IMPORTMODEL_H

#include "duck/Import/Checkpoint.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace mlir::duck::import {

/// Imports `ckpt`. Diagnostics (a tensor missing, a dtype or shape at odds
/// with the config) are emitted at config.json's location; returns null on
/// failure.
OwningOpRef<ModuleOp> importModel(MLIRContext &ctx, const Checkpoint &ckpt);

/// A stable identity of the checkpoint: a hash of config.json's text and of
/// every weight file's name, size and header. Used in the model key.
std::string checkpointIdentity(const Checkpoint &ckpt);

} // namespace mlir::duck::import

#endif
