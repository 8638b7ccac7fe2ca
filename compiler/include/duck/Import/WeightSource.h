//===- WeightSource.h - checkpoint matrices as fp9 sources ------*- C++ -*-===//
#ifndef DUCK_IMPORT_WEIGHTSOURCE_H
#define DUCK_IMPORT_WEIGHTSOURCE_H

#include "duck/Import/Checkpoint.h"
#include "duck_rt/fp9_pack.h"

#include <string>
#include <vector>

namespace mlir::duck {

/// One checkpoint matrix as an fp9 packing source (owns converted scales).
struct WeightSource {
  duck_fp9_source src{};
  std::vector<float> scales;
  std::string name;
};

/// Opens tensor `name` of `ckpt` (F32, BF16, F16, or F8_E4M3 with its
/// block scales). Errors name the tensor.
llvm::Expected<WeightSource> openWeightSource(const import::Checkpoint &ckpt,
                                              llvm::StringRef name);

/// Checkpoint names of gate/up/down of FFN `expert` in `layer`, and where
/// that expert starts inside them (rows of gate/up, columns of down).
/// Dense layers have one expert; MoE experts >= numRouted are the shared
/// experts, cut into `inter`-neuron pieces of the shared FFN.
struct ExpertTensorNames {
  std::string gate, up, down;
  int64_t base = 0;
};
ExpertTensorNames expertTensorNames(int64_t layer, bool moe, int64_t expert,
                                    int64_t numRouted, int64_t inter);

} // namespace mlir::duck

#endif
