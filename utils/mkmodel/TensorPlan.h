//===- TensorPlan.h - The tensors of a synthetic checkpoint -----*- C++ -*-===//
//
// Lists every tensor a ModelSpec's checkpoint holds, with the names, shapes
// and dtypes of reference/TENSORS.md, how its values are drawn, and for FP8
// weights the `_scale_inv` sibling. Also splits a checkpoint into shards.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_MKMODEL_TENSORPLAN_H
#define DUCK_MKMODEL_TENSORPLAN_H

#include "ModelSpec.h"

#include "llvm/ADT/ArrayRef.h"

#include <cstdint>
#include <string>
#include <vector>

namespace duck::mkmodel {

/// How a tensor's values are drawn (see Sampler.h).
enum class InitKind : uint8_t {
  Linear,     ///< bell-shaped, per-128x128-tile spread, zeros/tiny/outliers
  Embedding,  ///< bell-shaped, a few exact zeros
  Norm,       ///< mean 1 plus small noise
  Bias,       ///< small noise around 0 (LayerNorm bias, router bias)
  Router,     ///< small bell-shaped weights
  BlockScale, ///< `_scale_inv` of the FP8 weight `partner`
};

struct PlannedTensor {
  std::string name;
  std::string dtype; ///< safetensors dtype: "BF16", "F8_E4M3" or "F32"
  std::vector<int64_t> shape;
  InitKind init = InitKind::Linear;
  float stddev = 0.0f;
  float mean = 0.0f;
  /// For an FP8 weight: index of its scale; for a scale: index of its
  /// weight; -1 otherwise.
  int partner = -1;
  /// A copy: the values are drawn as those of the tensor of this name
  /// (the MTP module's embedding and head); "" draws its own.
  std::string values_of;

  int64_t rows() const { return shape.size() == 2 ? shape[0] : 1; }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  uint64_t numElements() const;
  uint64_t byteSize() const;
};

/// Every tensor of `spec`'s checkpoint in model order (embedding, layers,
/// final norm, lm_head, then DeepSeek's MTP module); an FP8 weight's scale
/// follows it directly.
std::vector<PlannedTensor> planTensors(const ModelSpec &spec);

/// Number of model parameters (scales not counted).
uint64_t countParams(llvm::ArrayRef<PlannedTensor> plan);

/// Splits consecutive units of the given byte sizes into `shards` non-empty
/// runs of roughly equal size; returns the shard of each unit. Requires
/// 1 <= shards <= unit_bytes.size().
std::vector<unsigned> assignShards(llvm::ArrayRef<uint64_t> unit_bytes,
                                   unsigned shards);

/// "model-00002-of-00005.safetensors" (1-based `shard`), or
/// "model.safetensors" when there is one shard.
std::string shardFileName(unsigned shard, unsigned shards);

} // namespace duck::mkmodel

#endif // DUCK_MKMODEL_TENSORPLAN_H
