//===- Sampler.cpp - Weight values of a planned tensor --------------------===//

#include "Sampler.h"

#include "Quantize.h"
#include "Random.h"

#include <cassert>

namespace duck::mkmodel {

// Per-tile multipliers of a Linear's std: a few binades apart, so the FP8
// block scales (and the fp9 block scales derived from bf16) differ by tile.
static const float kTileSpread[8] = {0.375f, 0.5f,  0.75f, 1.0f,
                                     1.0f,   1.25f, 1.5f,  2.0f};

// Rare events, out of 65536 (eventBits): about 1/1024 exact zeros, 1/1024
// values ~1e-4 std (FP8 subnormals once divided by the tile scale) and
// 1/512 outliers at 3x.
static constexpr uint32_t kZeroBelow = 64;
static constexpr uint32_t kTinyBelow = 128;
static constexpr uint32_t kOutlierBelow = 256;

TensorSampler::TensorSampler(uint64_t seed, const PlannedTensor &tensor)
    : init_(tensor.init), stddev_(tensor.stddev), mean_(tensor.mean),
      rows_(tensor.rows()), cols_(tensor.cols()),
      key_(streamKey(seed, tensor.values_of.empty() ? tensor.name
                                                    : tensor.values_of)),
      spreads_(tensor.init == InitKind::Linear) {
  assert(init_ != InitKind::BlockScale && "sample the weight, not its scale");
}

float TensorSampler::tileSpread(int64_t row, int64_t col) const {
  uint64_t tile = (static_cast<uint64_t>(row / kFp8Tile) << 32) |
                  static_cast<uint64_t>(col / kFp8Tile);
  return kTileSpread[counterRandom(~key_, tile) & 7];
}

/// A Linear/router value of std `sd` from random bits `r`.
static inline float spreadValue(uint64_t r, float sd) {
  float z = bellSample(r);
  uint32_t event = eventBits(r);
  if (event >= kOutlierBelow)
    return z * sd;
  if (event < kZeroBelow)
    return 0.0f;
  if (event < kTinyBelow)
    return z * sd * 1e-4f;
  return z * sd * 3.0f;
}

float TensorSampler::at(int64_t row, int64_t col) const {
  float value;
  fillSpan(row, col, col + 1, &value);
  return value;
}

void TensorSampler::fillSpan(int64_t row, int64_t c0, int64_t c1,
                             float *out) const {
  uint64_t base = static_cast<uint64_t>(row * cols_);
  switch (init_) {
  case InitKind::Linear:
  case InitKind::Router: {
    float sd = spreads_ ? stddev_ * tileSpread(row, c0) : stddev_;
    for (int64_t c = c0; c < c1; ++c)
      *out++ = spreadValue(counterRandom(key_, base + c), sd);
    return;
  }
  case InitKind::Embedding:
    for (int64_t c = c0; c < c1; ++c) {
      uint64_t r = counterRandom(key_, base + c);
      *out++ = eventBits(r) < kZeroBelow ? 0.0f : bellSample(r) * stddev_;
    }
    return;
  case InitKind::Norm:
  case InitKind::Bias:
  case InitKind::BlockScale:
    for (int64_t c = c0; c < c1; ++c)
      *out++ = mean_ + bellSample(counterRandom(key_, base + c)) * stddev_;
    return;
  }
}

void TensorSampler::fillRows(int64_t row0, int64_t count, float *out) const {
  // Spans never cross a 128-column tile, so one spread covers each.
  for (int64_t r = row0; r < row0 + count; ++r) {
    for (int64_t c0 = 0; c0 < cols_; c0 += kFp8Tile) {
      int64_t c1 = c0 + kFp8Tile < cols_ ? c0 + kFp8Tile : cols_;
      fillSpan(r, c0, c1, out);
      out += c1 - c0;
    }
  }
}

} // namespace duck::mkmodel
