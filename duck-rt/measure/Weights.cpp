//===- Weights.cpp - Random packed weights and cold copies ----------------===//

#include "Weights.h"

#include "duck_rt/slot_layout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace duck::bench {

namespace {

constexpr uint32_t kTile = 128; // FP8 checkpoints: 128x128 scale tiles

uint64_t alignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

duck_fp9_layout layoutOf(const duck_fp9_desc &desc) {
  duck_fp9_layout l;
  duck_fp9_status st = duck_fp9_compute_layout(&desc, &l);
  if (st != DUCK_FP9_OK) {
    std::fprintf(stderr, "duck-bench: bad fp9 shape %ux%u block %u: %s\n",
                 desc.rows, desc.k, desc.block, duck_fp9_status_str(st));
    std::exit(1);
  }
  return l;
}

/// Repeats the first `count` units of `unit` bytes until `total` units.
void repeatPrefix(uint8_t *p, uint64_t unit, uint64_t count, uint64_t total) {
  for (uint64_t done = count; done < total;) {
    uint64_t n = std::min(done, total - done);
    std::memcpy(p + done * unit, p, n * unit);
    done += n;
  }
}

} // namespace

duck_fp9_desc fp9Desc(uint32_t rows, uint32_t k, uint32_t block) {
  return duck_fp9_desc{rows, k, block, kTile, 0};
}

uint64_t fp9ImageBytes(const duck_fp9_desc &desc) {
  return layoutOf(desc).total_bytes;
}

uint64_t fp9WeightBytes(const duck_fp9_desc &desc) {
  duck_fp9_layout l = layoutOf(desc);
  return (uint64_t)desc.rows * desc.k +
         (uint64_t)desc.rows * (desc.k / 32) * 4 +
         (uint64_t)l.scale_tiles * l.blocks_per_row * 4;
}

void packRandomFp9(const duck_fp9_desc &desc, uint8_t *out, uint64_t seed) {
  Rng rng(seed);
  const uint32_t rows = std::min(desc.rows, kPackedRows);
  std::vector<uint8_t> w((uint64_t)rows * desc.k);
  for (size_t i = 0; i < w.size(); i += 8) {
    uint64_t r = rng.next();
    for (size_t j = 0; j < 8 && i + j < w.size(); ++j) {
      uint8_t b = (uint8_t)(r >> (8 * j));
      w[i + j] = (b & 0x7F) == 0x7F ? (uint8_t)(b ^ 1) : b; // no NaN
    }
  }
  const uint32_t tileRows = (rows + kTile - 1) / kTile;
  const uint32_t tileCols = (desc.k + kTile - 1) / kTile;
  std::vector<float> scales((uint64_t)tileRows * tileCols);
  for (float &s : scales) // 2^-12 .. 2^-4, typical of FP8 checkpoints
    s = std::ldexp(1.0f, -4 - (int)rng.below(9));
  duck_fp9_source src{};
  src.type = DUCK_FP9_SRC_E4M3;
  src.data = w.data();
  src.src_rows = rows;
  src.src_cols = desc.k;
  src.scale_inv = scales.data();
  src.tile_rows = kTile;
  src.tile_cols = kTile;
  duck_fp9_desc small = desc;
  small.rows = rows;
  duck_fp9_layout ls = layoutOf(small);
  Buffer tmp(rows == desc.rows ? 0 : ls.total_bytes);
  uint8_t *dst = rows == desc.rows ? out : tmp.data();
  duck_fp9_error_at where{};
  duck_fp9_status st = duck_fp9_pack(&src, &small, dst, &where);
  if (st != DUCK_FP9_OK) {
    std::fprintf(stderr, "duck-bench: packing failed at (%llu, %llu): %s\n",
                 (unsigned long long)where.row, (unsigned long long)where.col,
                 duck_fp9_status_str(st));
    std::exit(1);
  }
  if (rows == desc.rows)
    return;
  // rows == kPackedRows, a whole number of scale tiles: repeat each plane.
  duck_fp9_layout l = layoutOf(desc);
  const uint64_t words = desc.k / 32, signRow = words * 4;
  std::memcpy(out + l.mag_offset, dst + ls.mag_offset, (uint64_t)rows * desc.k);
  repeatPrefix(out + l.mag_offset, desc.k, rows, desc.rows);
  std::memcpy(out + l.sign_offset, dst + ls.sign_offset, rows * signRow);
  repeatPrefix(out + l.sign_offset, signRow, rows, desc.rows);
  const uint64_t scaleRow = (uint64_t)l.blocks_per_row * 4;
  std::memcpy(out + l.scale_offset, dst + ls.scale_offset,
              ls.scale_tiles * scaleRow);
  repeatPrefix(out + l.scale_offset, scaleRow, ls.scale_tiles, l.scale_tiles);
}

uint64_t FfnLayout::params() const {
  return (uint64_t)gate.rows * gate.k + (uint64_t)up.rows * up.k +
         (uint64_t)down.rows * down.k;
}

uint64_t FfnLayout::weightBytes() const {
  return fp9WeightBytes(gate) + fp9WeightBytes(up) + fp9WeightBytes(down);
}

FfnLayout ffnLayout(uint32_t hidden, uint32_t inter, uint32_t block) {
  // One expert of a weight-image slot, laid out as the compiler lays it
  // out (duck_rt/slot_layout.h).
  const duck_slot_shape shape{hidden, inter, block, kTile, 0, 1, 1};
  duck_slot_layout sl{};
  (void)duck_compute_slot_layout(&shape, &sl);
  FfnLayout f;
  f.gate = sl.gate;
  f.up = sl.up;
  f.down = sl.down;
  f.upOffset = sl.up_offset;
  f.downOffset = sl.down_offset;
  f.bytes = sl.expert_bytes;
  return f;
}

void packRandomFfn(const FfnLayout &layout, uint8_t *out, uint64_t seed) {
  packRandomFp9(layout.gate, out, seed);
  packRandomFp9(layout.up, out + layout.upOffset, seed + 1);
  packRandomFp9(layout.down, out + layout.downOffset, seed + 2);
}

duck_ffn_weights ffnView(const FfnLayout &layout, const uint8_t *base) {
  duck_ffn_weights w;
  w.gate = duck_fp9_matrix_view(&layout.gate, base);
  w.up = duck_fp9_matrix_view(&layout.up, base + layout.upOffset);
  w.down = duck_fp9_matrix_view(&layout.down, base + layout.downOffset);
  return w;
}

void fillRandomBf16(uint16_t *w, uint64_t rows, uint32_t k, uint64_t seed) {
  Rng rng(seed);
  const uint64_t first = std::min<uint64_t>(rows, kPackedRows) * k;
  for (uint64_t i = 0; i < first; ++i) {
    uint64_t r = rng.next();
    uint16_t sign = (uint16_t)((r & 1) << 15);
    uint16_t exp = (uint16_t)(120 + ((r >> 1) & 7)); // 2^-7 .. 2^0
    uint16_t man = (uint16_t)((r >> 4) & 0x7F);
    w[i] = (uint16_t)(sign | exp << 7 | man);
  }
  repeatPrefix(reinterpret_cast<uint8_t *>(w), (uint64_t)k * 2,
               std::min<uint64_t>(rows, kPackedRows), rows);
}

ColdSet fillCopies(const Buffer &arena, const uint8_t *image, uint64_t bytes) {
  ColdSet s;
  s.base = arena.data();
  s.stride = alignUp(bytes, 64);
  s.copies = std::max<uint64_t>(arena.size() / s.stride, 1);
  if (s.stride > arena.size()) {
    std::fprintf(stderr, "duck-bench: image of %llu bytes exceeds the arena\n",
                 (unsigned long long)bytes);
    std::exit(1);
  }
  for (uint64_t i = 0; i < s.copies; ++i)
    std::memcpy(arena.data() + i * s.stride, image, bytes);
  return s;
}

} // namespace duck::bench
