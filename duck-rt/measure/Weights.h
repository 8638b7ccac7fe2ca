//===- Weights.h - Random packed weights and cold copies --------*- C++ -*-===//
//
// Benchmark weights: random FP8 E4M3 matrices packed to fp9 through the
// real packer (duck_fp9_pack), bf16 matrices for the baseline, FFN images
// (gate | up | down), and "cold sets": copies of one image back to back in
// a large arena, cycled so that every call reads its copy from DRAM.
// Speed does not depend on the weight values, so large matrices pack a
// small block of rows and repeat it; copies are memcpy'd.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_BENCH_WEIGHTS_H
#define DUCK_BENCH_WEIGHTS_H

#include "Support.h"

#include "duck_rt/kernels.h"

#include <cstdint>

namespace duck::bench {

/// [rows, k] with K-blocks of `block`, scale tiles of 128 source rows,
/// starting on a tile boundary (row_phase 0).
duck_fp9_desc fp9Desc(uint32_t rows, uint32_t k, uint32_t block);

/// Bytes of a packed image (planes and padding).
uint64_t fp9ImageBytes(const duck_fp9_desc &desc);

/// Weight bytes a GEMV over the whole matrix reads: magnitudes + signs +
/// scales, without plane padding.
uint64_t fp9WeightBytes(const duck_fp9_desc &desc);

/// Packs a random matrix into `out` (fp9ImageBytes bytes, 64-byte aligned,
/// zeroed). At most kPackedRows rows go through the packer; the rest
/// repeat them plane by plane.
void packRandomFp9(const duck_fp9_desc &desc, uint8_t *out, uint64_t seed);
constexpr uint32_t kPackedRows = 256;

/// One FFN slice: gate/up [inter, hidden], down [hidden, inter], all with
/// the same block, in one image at 64-byte aligned offsets.
struct FfnLayout {
  duck_fp9_desc gate, up, down;
  uint64_t upOffset = 0, downOffset = 0, bytes = 0;
  uint64_t params() const;
  uint64_t weightBytes() const;
};

FfnLayout ffnLayout(uint32_t hidden, uint32_t inter, uint32_t block);
void packRandomFfn(const FfnLayout &layout, uint8_t *out, uint64_t seed);
duck_ffn_weights ffnView(const FfnLayout &layout, const uint8_t *base);

/// Random bf16 weights of magnitude in [2^-7, 1), rows x k.
void fillRandomBf16(uint16_t *w, uint64_t rows, uint32_t k, uint64_t seed);

/// `copies` copies of one image laid out back to back.
struct ColdSet {
  const uint8_t *base = nullptr;
  uint64_t stride = 0, copies = 0;
  const uint8_t *copy(uint64_t i) const { return base + (i % copies) * stride; }
  uint64_t bytes() const { return stride * copies; }
};

/// Fills `arena` with as many copies of `image` as fit (at least one; the
/// arena must hold one).
ColdSet fillCopies(const Buffer &arena, const uint8_t *image, uint64_t bytes);

} // namespace duck::bench

#endif // DUCK_BENCH_WEIGHTS_H
