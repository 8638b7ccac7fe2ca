//===- Quantize.cpp - bf16 rounding and FP8 E4M3 block quantisation -------===//

#include "Quantize.h"

#include <cassert>
#include <cmath>
#include <cstring>

namespace duck::mkmodel {

static uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

static float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t floatToBF16(float value) {
  uint32_t bits = bitsOf(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

void floatsToBF16LE(const float *values, int64_t count, uint8_t *out_bytes) {
  for (int64_t i = 0; i < count; ++i) {
    uint16_t h = floatToBF16(values[i]);
    out_bytes[2 * i] = static_cast<uint8_t>(h & 0xFF);
    out_bytes[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
}

uint8_t encodeE4M3(float value) {
  uint32_t bits = bitsOf(value);
  uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  uint32_t mag = bits & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) {
    assert(false && "NaN has no E4M3 weight encoding");
    return 0;
  }
  // 448 = 0x43E00000. Everything at or above it (inf too) saturates; the
  // next code, 0x7F, would be NaN.
  if (mag >= 0x43E00000u)
    return sign | 0x7Eu;
  uint32_t exp32 = mag >> 23;
  if (exp32 < 121) {
    // Below 2^-6 the grid is uniform with step 2^-9: codes 0..7 are the
    // subnormals m * 2^-9 and code 8 is 2^-6, the smallest normal, so the
    // rounded multiple of 2^-9 is the code itself. The scaling is exact and
    // nearbyint rounds ties to even in the default rounding mode.
    float steps = std::nearbyint(floatOf(mag) * 512.0f);
    return sign | static_cast<uint8_t>(steps);
  }
  // Normal: keep exponent and the top 3 mantissa bits, rounding the other
  // 20 bits to nearest even. A carry out of the mantissa moves into the
  // exponent, which is the next binade's first value: still correct.
  uint32_t lsb = (mag >> 20) & 1u;
  uint32_t rounded = (mag + 0x7FFFFu + lsb) >> 20;
  uint32_t code = rounded - (120u << 3); // fp32 bias 127 -> e4m3 bias 7
  if (code > 0x7Eu)
    code = 0x7Eu;
  return sign | static_cast<uint8_t>(code);
}

float fp8TileScale(float amax) { return amax > 0.0f ? amax / kE4M3Max : 1.0f; }

void quantizeRowE4M3(const float *row, int64_t cols, const float *scales,
                     uint8_t *out_codes) {
  for (int64_t c = 0; c < cols; ++c)
    out_codes[c] = encodeE4M3(row[c] / scales[c / kFp8Tile]);
}

void computeBandScales(const float *band, int64_t rows, int64_t cols,
                       float *out_scales) {
  int64_t tiles = (cols + kFp8Tile - 1) / kFp8Tile;
  for (int64_t t = 0; t < tiles; ++t) {
    int64_t c0 = t * kFp8Tile;
    int64_t c1 = c0 + kFp8Tile < cols ? c0 + kFp8Tile : cols;
    float amax = 0.0f;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = c0; c < c1; ++c) {
        float a = std::fabs(band[r * cols + c]);
        amax = a > amax ? a : amax;
      }
    out_scales[t] = fp8TileScale(amax);
  }
}

} // namespace duck::mkmodel
