//===- Quantize.h - bf16 rounding, FP8 E4M3 quantisation --------*- C++ -*-===//
//
// The number formats duck-mkmodel writes: bf16 (round to nearest even) and
// FP8 E4M3 ("e4m3fn": no infinities, 0x7F/0xFF are NaN, max 448) with one
// fp32 scale per 128x128 tile, scale = amax / 448, as in the DeepSeek and
// Qwen3 FP8 checkpoints (reference/TENSORS.md, "Common rule for FP8").
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_MKMODEL_QUANTIZE_H
#define DUCK_MKMODEL_QUANTIZE_H

#include <cstdint>

namespace duck::mkmodel {

/// Largest finite E4M3 magnitude.
constexpr float kE4M3Max = 448.0f;
/// Rows and columns of one FP8 scale tile.
constexpr int64_t kFp8Tile = 128;

/// Rounds `value` to bf16, nearest even. NaN stays a quiet NaN.
uint16_t floatToBF16(float value);

/// Rounds `count` floats to bf16, stored little-endian (2 bytes each).
void floatsToBF16LE(const float *values, int64_t count, uint8_t *out_bytes);

/// Encodes `value` as E4M3, round to nearest, ties to the even code.
/// Magnitudes above 448 saturate to +-448 (never a NaN code); the sign of
/// zero is kept. NaN input is a caller bug and encodes as +0.
uint8_t encodeE4M3(float value);

/// The multiplier stored in `weight_scale_inv` for a tile whose largest
/// magnitude is `amax`: amax / 448, or 1 for an all-zero tile.
float fp8TileScale(float amax);

/// Quantises `cols` values of one row with the given per-tile scales
/// (`scales[c / 128]`) into E4M3 codes: code = encode(w / scale).
void quantizeRowE4M3(const float *row, int64_t cols, const float *scales,
                     uint8_t *out_codes);

/// Per-tile scales of a band of at most 128 rows x `cols` (row-major): one
/// scale per 128-column tile, ceil(cols / 128) values into `out_scales`.
void computeBandScales(const float *band, int64_t rows, int64_t cols,
                       float *out_scales);

} // namespace duck::mkmodel

#endif // DUCK_MKMODEL_QUANTIZE_H
