//===- Sampler.h - Weight values of a planned tensor ------------*- C++ -*-===//
//
// Draws the float values of one tensor, row band by row band, as a pure
// function of (seed, tensor name, row, column). The values aim at two
// users: a runtime that generates text from them (sensible scales: Linear
// std ~ 1/sqrt(fan_in), norms ~ 1, small router) and fp9/FP8 tests (each
// 128x128 tile gets its own spread so block scales differ; exact zeros,
// values small enough to land on FP8 subnormals, and a few outliers).
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_MKMODEL_SAMPLER_H
#define DUCK_MKMODEL_SAMPLER_H

#include "TensorPlan.h"

#include <cstdint>

namespace duck::mkmodel {

class TensorSampler {
public:
  /// `tensor` must not be a BlockScale (sample its partner weight instead).
  TensorSampler(uint64_t seed, const PlannedTensor &tensor);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  /// Writes rows [row0, row0 + count) x cols(), row-major, into `out`.
  void fillRows(int64_t row0, int64_t count, float *out) const;
  /// One element (for tests; fillRows is the fast path).
  float at(int64_t row, int64_t col) const;

private:
  float tileSpread(int64_t row, int64_t col) const;
  /// Values of columns [c0, c1) of `row`, all inside one 128-column tile.
  void fillSpan(int64_t row, int64_t c0, int64_t c1, float *out) const;

  InitKind init_;
  float stddev_;
  float mean_;
  int64_t rows_;
  int64_t cols_;
  uint64_t key_;
  bool spreads_; ///< per-tile std multipliers (Linear weights)
};

} // namespace duck::mkmodel

#endif // DUCK_MKMODEL_SAMPLER_H
