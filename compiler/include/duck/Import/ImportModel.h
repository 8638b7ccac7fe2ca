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

/// Whether to import DeepSeek's MTP module (docs/mtp.md) for `mode`
/// (duckc compile --mtp): "off" never; "on" always, an error naming what
/// is missing when the checkpoint has no module or lacks one of its
/// tensors; "auto" when the config declares one (num_nextn_predict_layers)
/// and, with weights, every tensor of the first is there; when "auto"
/// leaves a declared module out, `note` (if given) says why.
llvm::Expected<bool> wantMtp(const Checkpoint &ckpt, llvm::StringRef mode,
                             std::string *note = nullptr);

/// Imports `ckpt`. Diagnostics (a tensor missing, a dtype or shape at odds
/// with the config) are emitted at config.json's location; returns null on
/// failure. With `mtp`, the first MTP layer follows the model: the body
/// takes a second argument (the tokens after each row) and returns the
/// module's hidden state after its shared head's norm after the logits.
OwningOpRef<ModuleOp> importModel(MLIRContext &ctx, const Checkpoint &ckpt,
                                  bool mtp = false);

/// A stable identity of the checkpoint: a hash of config.json's text and of
/// every weight file's name, size and header. Used in the model key.
std::string checkpointIdentity(const Checkpoint &ckpt);

} // namespace mlir::duck::import

#endif
