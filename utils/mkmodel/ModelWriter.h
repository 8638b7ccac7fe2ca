//===- ModelWriter.h - Writes a HF model directory --------------*- C++ -*-===//
//
// Turns a validated ModelSpec into a model directory (config.json,
// generation_config.json, tokenizer.json, tokenizer_config.json, safetensors
// shards, index) without holding the weights in memory: every shard's header
// is computed first, then each tensor is generated and written in bands (128
// rows for FP8, so a tile's scale is known before its codes). The directory
// appears atomically: all files go to "<dir>.tmp-<pid>", renamed to <dir> at
// the end, removed on error.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_MKMODEL_MODELWRITER_H
#define DUCK_MKMODEL_MODELWRITER_H

#include "ModelSpec.h"

#include "llvm/Support/Error.h"

#include <cstdint>
#include <string>
#include <vector>

namespace llvm {
class raw_ostream;
} // namespace llvm

namespace duck::mkmodel {

struct WriteOptions {
  std::string out_dir;
  /// Replace an existing output directory.
  bool force = false;
  /// Progress reports on `progress_os`: shown on a terminal for long
  /// writes unless `quiet`; `progress` shows them anywhere.
  bool quiet = false;
  bool progress = false;
  unsigned shards = 1;
};

struct WriteSummary {
  std::string out_dir;
  uint64_t params = 0;            ///< model parameters (FP8 scales not counted)
  uint64_t tensors = 0;           ///< safetensors entries, scales included
  uint64_t bytes = 0;             ///< all files together
  std::vector<std::string> files; ///< file names, sorted
};

/// Writes `spec` to `options.out_dir`. `progress_is_tty` tells whether
/// `progress_os` is a terminal.
llvm::Expected<WriteSummary> writeModelDirectory(const ModelSpec &spec,
                                                 const WriteOptions &options,
                                                 llvm::raw_ostream &progress_os,
                                                 bool progress_is_tty);

} // namespace duck::mkmodel

#endif // DUCK_MKMODEL_MODELWRITER_H
