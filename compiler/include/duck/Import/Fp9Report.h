//===- Fp9Report.h - what fp9 conversion does to a checkpoint ---*- C++ -*-===//
//
// Packs every FFN weight of a checkpoint (dense MLPs, routed and shared
// experts) to fp9 and measures the result against the checkpoint's own
// values: FP8 weights must come back bit-exact, bf16/f16/f32 weights are
// quantised and their error is reported.
//===----------------------------------------------------------------------===//
#ifndef DUCK_IMPORT_FP9REPORT_H
#define DUCK_IMPORT_FP9REPORT_H

#include "duck/Import/Checkpoint.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::duck::import {

struct Fp9TensorReport {
  std::string name;
  std::string dtype;
  int64_t rows = 0, cols = 0;
  uint64_t sourceBytes = 0, fp9Bytes = 0;
  double maxAbsError = 0;  ///< max |fp9 - source|
  double rmsRelError = 0;  ///< sqrt(sum err^2 / sum source^2)
  uint64_t mismatches = 0; ///< elements not bit-identical to the source
  bool fp8 = false;
};

struct Fp9Report {
  uint32_t block = 128;
  std::vector<Fp9TensorReport> tensors;
  uint64_t params = 0, sourceBytes = 0, fp9Bytes = 0;
  uint64_t fp8Tensors = 0, fp8Exact = 0;
  double worstRmsRelError = 0; ///< over quantised (non-FP8) tensors
};

/// Converts every FFN weight; `maxTensors` > 0 limits the work (the report
/// says so). Errors name the tensor.
llvm::Expected<Fp9Report> buildFp9Report(const Checkpoint &ckpt,
                                         uint32_t block, size_t maxTensors = 0);
void printFp9Report(const Fp9Report &r, bool verbose, llvm::raw_ostream &os);
llvm::json::Value fp9ReportToJson(const Fp9Report &r);

} // namespace mlir::duck::import

#endif
