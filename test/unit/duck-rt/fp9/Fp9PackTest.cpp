// Tests of the fp9 packed matrix layout and the packers (duck_rt/fp9_pack.h).
#include "duck_rt/fp9_pack.h"
#include "duck_rt/slot_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace {

// 64-byte aligned scratch for one packed matrix.
struct Packed {
  std::vector<uint64_t> storage;
  explicit Packed(uint64_t bytes) : storage(bytes / 8 + 8) {}
  void *data() {
    auto p = reinterpret_cast<uintptr_t>(storage.data());
    return reinterpret_cast<void *>((p + 63) / 64 * 64);
  }
};

uint8_t randomFiniteE4M3(std::mt19937 &rng) {
  for (;;) {
    uint8_t b = (uint8_t)(rng() & 0xFF);
    if (!duck_e4m3_is_nan(b))
      return b;
  }
}

struct Fp8Matrix {
  uint64_t rows, cols;
  uint32_t tileRows, tileCols; // the declared block; edge tiles may be partial
  std::vector<uint8_t> w;
  std::vector<float> scaleInv; // [ceil(rows/tileRows)][ceil(cols/tileCols)]
  Fp8Matrix(uint64_t r, uint64_t c, unsigned seed, uint32_t tr = 128,
            uint32_t tc = 128)
      : rows(r), cols(c), tileRows(tr), tileCols(tc), w(r * c) {
    std::mt19937 rng(seed);
    for (auto &b : w)
      b = randomFiniteE4M3(rng);
    std::uniform_real_distribution<float> e(-20.0f, 2.0f);
    scaleInv.resize(((r + tr - 1) / tr) * ((c + tc - 1) / tc));
    for (auto &s : scaleInv)
      s = std::exp2(e(rng)) * 1.37f;
  }
  duck_fp9_source source(uint64_t row0, uint64_t col0) const {
    duck_fp9_source s{};
    s.type = DUCK_FP9_SRC_E4M3;
    s.data = w.data();
    s.src_rows = rows;
    s.src_cols = cols;
    s.row0 = row0;
    s.col0 = col0;
    s.scale_inv = scaleInv.data();
    s.tile_rows = tileRows;
    s.tile_cols = tileCols;
    return s;
  }
  /// The checkpoint's own dequantisation, written from the FP8 definition
  /// (FORMATS.md) and the declared block, not with the packer's helpers:
  /// fp32(e4m3(W[i][j]) * S[i / tileRows][j / tileCols]).
  float dequant(uint64_t i, uint64_t j) const {
    uint8_t b = w[i * cols + j];
    int e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1 + m / 8.0, e - 7);
    const uint64_t tilesPerRow = (cols + tileCols - 1) / tileCols;
    float scale = scaleInv[(i / tileRows) * tilesPerRow + j / tileCols];
    return (float)((b & 0x80) ? -v : v) * scale;
  }
};

TEST(Fp9Pack, LayoutIsAlignedAndSized) {
  duck_fp9_desc d{64, 7168, 128, 128, 64};
  duck_fp9_layout l;
  ASSERT_EQ(duck_fp9_compute_layout(&d, &l), DUCK_FP9_OK);
  EXPECT_EQ(l.mag_offset, 0u);
  EXPECT_EQ(l.mag_bytes, 64u * 7168);
  EXPECT_EQ(l.sign_offset % 64, 0u);
  EXPECT_EQ(l.sign_bytes, 64u * 7168 / 8);
  EXPECT_EQ(l.scale_offset % 64, 0u);
  EXPECT_EQ(l.scale_tiles, 1u); // rows 64..127 of one 128-row tile
  EXPECT_EQ(l.blocks_per_row, 56u);
  EXPECT_EQ(l.total_bytes % 64, 0u);
  // 9 bits a weight plus the scales.
  EXPECT_EQ(l.total_bytes, (64u * 7168 + 64u * 7168 / 8 + 56 * 4 + 63) / 64 * 64);

  duck_fp9_desc straddle{128, 256, 32, 128, 64}; // rows 64..191: two tiles
  ASSERT_EQ(duck_fp9_compute_layout(&straddle, &l), DUCK_FP9_OK);
  EXPECT_EQ(l.scale_tiles, 2u);
  EXPECT_EQ(l.scale_bytes, 2u * 8 * 4);
}

TEST(Fp9Pack, RejectsBadShapes) {
  duck_fp9_layout l;
  duck_fp9_desc badBlock{4, 256, 16, 128, 0};
  EXPECT_EQ(duck_fp9_compute_layout(&badBlock, &l), DUCK_FP9_BAD_BLOCK);
  duck_fp9_desc badK{4, 96, 64, 128, 0};
  EXPECT_EQ(duck_fp9_compute_layout(&badK, &l), DUCK_FP9_BAD_SHAPE);
  duck_fp9_desc badPhase{4, 128, 64, 128, 128};
  EXPECT_EQ(duck_fp9_compute_layout(&badPhase, &l), DUCK_FP9_BAD_SHAPE);
  EXPECT_STRNE(duck_fp9_status_str(DUCK_FP9_BAD_BLOCK), "ok");
}

// FP8 slices (row phase, K ranges, every block size) unpack bit-exactly to
// the checkpoint's own dequantisation W[i][j] * S[i/tile][j/tile], also
// when the last tile of a row or column is partial and when the declared
// block is not 128.
TEST(Fp9Pack, Fp8SlicesAreLossless) {
  struct Case {
    uint64_t row0, rows, col0, k;
    uint32_t block;
  };
  struct Matrix {
    uint64_t rows, cols;
    uint32_t tile;
    std::vector<Case> cases;
  };
  const Matrix matrices[] = {
      {320, 512, 128,
       {{0, 320, 0, 512, 128}, {64, 64, 0, 512, 64}, {96, 100, 128, 256, 32},
        {0, 1, 448, 64, 64}, {200, 120, 32, 96, 32}}},
      // 320 x 864: 2.5 x 6.75 tiles of 128 (the ragged shapes of the
      // oracle tests), and the same with 64-wide tiles.
      {320, 864, 128,
       {{0, 320, 0, 864, 32}, {0, 320, 0, 832, 64}, {256, 64, 768, 96, 32},
        {100, 220, 384, 480, 32}}},
      {320, 864, 64, {{0, 320, 0, 864, 32}, {192, 128, 448, 416, 32}}},
  };
  for (const Matrix &mx : matrices) {
    Fp8Matrix m(mx.rows, mx.cols, 1, mx.tile, mx.tile);
    for (const Case &c : mx.cases) {
      duck_fp9_desc d{(uint32_t)c.rows, (uint32_t)c.k, c.block, mx.tile,
                      (uint32_t)(c.row0 % mx.tile)};
      duck_fp9_layout l;
      ASSERT_EQ(duck_fp9_compute_layout(&d, &l), DUCK_FP9_OK);
      Packed p(l.total_bytes);
      duck_fp9_source src = m.source(c.row0, c.col0);
      ASSERT_EQ(duck_fp9_pack(&src, &d, p.data(), nullptr), DUCK_FP9_OK);
      std::vector<float> row(c.k);
      for (uint32_t r = 0; r < c.rows; ++r) {
        duck_fp9_unpack_row(&d, p.data(), r, row.data());
        for (uint32_t k = 0; k < c.k; ++k) {
          float want = m.dequant(c.row0 + r, c.col0 + k);
          ASSERT_EQ(duck_fp9_f32_bits(row[k]), duck_fp9_f32_bits(want))
              << mx.rows << "x" << mx.cols << " tile " << mx.tile << ": row "
              << c.row0 + r << " col " << c.col0 + k << " block " << c.block;
        }
      }
    }
  }
}

// The planes hold exactly what the header promises: magnitude bytes in
// row-major order, sign bit i of word w for column 32w+i, repeated scales.
TEST(Fp9Pack, PlaneContentsFollowTheLayout) {
  Fp8Matrix m(128, 128, 2);
  duck_fp9_desc d{2, 128, 32, 128, 0};
  duck_fp9_layout l;
  ASSERT_EQ(duck_fp9_compute_layout(&d, &l), DUCK_FP9_OK);
  Packed p(l.total_bytes);
  duck_fp9_source src = m.source(0, 0);
  ASSERT_EQ(duck_fp9_pack(&src, &d, p.data(), nullptr), DUCK_FP9_OK);
  auto *base = static_cast<const uint8_t *>(p.data());
  auto *signs = reinterpret_cast<const uint32_t *>(base + l.sign_offset);
  auto *scales = reinterpret_cast<const float *>(base + l.scale_offset);
  for (uint32_t r = 0; r < 2; ++r)
    for (uint32_t k = 0; k < 128; ++k) {
      uint8_t byte = m.w[r * 128 + k];
      uint32_t s;
      EXPECT_EQ(base[l.mag_offset + r * 128 + k], duck_fp9_from_e4m3(byte, &s));
      EXPECT_EQ((signs[r * 4 + k / 32] >> (k % 32)) & 1u, (uint32_t)(byte >> 7));
    }
  for (uint32_t b = 0; b < 4; ++b) // one 128x128 tile cut into four 32-blocks
    EXPECT_EQ(scales[b], m.scaleInv[0]);
}

// Quantising float sources: per (row tile, block) scale = amax/480, every
// weight at most half an fp9 step away; the measured error is reported.
TEST(Fp9Pack, FloatQuantisationErrorIsBounded) {
  const uint64_t rows = 192, cols = 384;
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 0.02f);
  std::vector<float> w(rows * cols);
  for (auto &v : w)
    v = n(rng);
  w[5] = 0.0f;
  w[77] = -0.0f;
  for (duck_fp9_src_type type : {DUCK_FP9_SRC_F32, DUCK_FP9_SRC_BF16,
                                 DUCK_FP9_SRC_F16}) {
    std::vector<uint16_t> half(rows * cols);
    const void *data = w.data();
    if (type == DUCK_FP9_SRC_BF16) {
      for (size_t i = 0; i < w.size(); ++i)
        half[i] = (uint16_t)(duck_fp9_f32_bits(w[i]) >> 16);
      data = half.data();
    } else if (type == DUCK_FP9_SRC_F16) {
      for (size_t i = 0; i < w.size(); ++i) {
        _Float16 h = (_Float16)w[i];
        std::memcpy(&half[i], &h, 2);
      }
      data = half.data();
    }
    for (uint32_t block : {32u, 64u, 128u}) {
      duck_fp9_desc d{(uint32_t)rows, (uint32_t)cols, block, 128, 0};
      duck_fp9_layout l;
      ASSERT_EQ(duck_fp9_compute_layout(&d, &l), DUCK_FP9_OK);
      Packed p(l.total_bytes);
      duck_fp9_source src{};
      src.type = type;
      src.data = data;
      src.src_rows = rows;
      src.src_cols = cols;
      ASSERT_EQ(duck_fp9_pack(&src, &d, p.data(), nullptr), DUCK_FP9_OK);
      std::vector<float> row(cols);
      double sumSq = 0, sumRef = 0, worstRel = 0;
      for (uint32_t r = 0; r < rows; ++r) {
        duck_fp9_unpack_row(&d, p.data(), r, row.data());
        for (uint32_t k = 0; k < cols; ++k) {
          double ref = duck_fp9_source_value(&src, r, k);
          double err = std::fabs(row[k] - ref);
          sumSq += err * err;
          sumRef += ref * ref;
          if (ref == 0) {
            ASSERT_EQ(row[k], 0.0f) << "zero must stay zero";
            continue;
          }
          double rel = err / std::fabs(ref);
          worstRel = std::max(worstRel, rel);
          // Half a step of a 3-bit mantissa: 2^-4 relative, plus the
          // rounding of the fp32 scale multiply.
          ASSERT_LE(rel, 0x1p-4 * (1 + 1e-6)) << r << "," << k;
        }
      }
      double rms = std::sqrt(sumSq / sumRef);
      // Rounding to a 3-bit mantissa costs about 2.6% RMS on Gaussian weights.
      EXPECT_LT(rms, 0.03) << "type " << type << " block " << block;
      RecordProperty("rms_rel_error_b" + std::to_string(block) + "_t" +
                         std::to_string(type),
                     std::to_string(rms));
      std::printf("fp9 quantisation: src type %d block %u: rms rel error %.4f, "
                  "worst rel error %.4f\n",
                  (int)type, block, rms, worstRel);
    }
  }
}

TEST(Fp9Pack, ReportsNaNScaleAndSliceErrors) {
  Fp8Matrix m(128, 256, 4);
  duck_fp9_desc d{128, 256, 64, 128, 0};
  duck_fp9_layout l;
  ASSERT_EQ(duck_fp9_compute_layout(&d, &l), DUCK_FP9_OK);
  Packed p(l.total_bytes);

  m.w[3 * 256 + 17] = 0x7F; // NaN
  duck_fp9_source src = m.source(0, 0);
  duck_fp9_error_at at{};
  EXPECT_EQ(duck_fp9_pack(&src, &d, p.data(), &at), DUCK_FP9_NAN);
  EXPECT_EQ(at.row, 3u);
  EXPECT_EQ(at.col, 17u);
  m.w[3 * 256 + 17] = 0x01;

  m.scaleInv[1] = 0x1p20f;
  EXPECT_EQ(duck_fp9_pack(&src, &d, p.data(), &at), DUCK_FP9_SCALE_RANGE);
  EXPECT_EQ(at.col, 128u);
  m.scaleInv[1] = 1.0f;

  duck_fp9_source off = m.source(1, 0); // 128 rows from row 1 overrun
  duck_fp9_desc d1 = d;
  d1.row_phase = 1;
  EXPECT_EQ(duck_fp9_pack(&off, &d1, p.data(), nullptr), DUCK_FP9_BAD_SLICE);
  duck_fp9_source unaligned = m.source(0, 32); // K start not a block multiple
  duck_fp9_desc d2{128, 128, 64, 128, 0};
  EXPECT_EQ(duck_fp9_pack(&unaligned, &d2, p.data(), nullptr),
            DUCK_FP9_BAD_SLICE);
  duck_fp9_desc wrongTile{128, 256, 64, 64, 0}; // scale rows != tile rows
  EXPECT_EQ(duck_fp9_pack(&src, &wrongTile, p.data(), nullptr),
            DUCK_FP9_BAD_TILE);

  std::vector<float> f(64 * 64, 1.0f);
  f[100] = NAN;
  duck_fp9_source fs{};
  fs.type = DUCK_FP9_SRC_F32;
  fs.data = f.data();
  fs.src_rows = 64;
  fs.src_cols = 64;
  duck_fp9_desc fd{64, 64, 64, 128, 0};
  EXPECT_EQ(duck_fp9_pack(&fs, &fd, p.data(), &at), DUCK_FP9_NAN);
  EXPECT_EQ(at.row, 1u);
  EXPECT_EQ(at.col, 36u);
}

} // namespace

// A slot's layout (duck_rt/slot_layout.h, the one the compiler, duckd's
// synthetic images and the benchmarks share): the expert's matrices back
// to back, the descriptor table and the slot aligned as the ABI says.
TEST(SlotLayout, IsItsPartsAligned) {
  const duck_slot_shape shape{7168, 256, 128, 128, 64, 257, 9};
  duck_slot_layout l{};
  ASSERT_EQ(duck_compute_slot_layout(&shape, &l), DUCK_FP9_OK);
  EXPECT_EQ(l.gate.rows, 256u);
  EXPECT_EQ(l.gate.k, 7168u);
  EXPECT_EQ(l.gate.row_phase, 64u);
  EXPECT_EQ(l.down.rows, 7168u);
  EXPECT_EQ(l.down.k, 256u);
  EXPECT_EQ(l.down.row_phase, 0u);
  duck_fp9_layout g{}, d{};
  ASSERT_EQ(duck_fp9_compute_layout(&l.gate, &g), DUCK_FP9_OK);
  ASSERT_EQ(duck_fp9_compute_layout(&l.down, &d), DUCK_FP9_OK);
  EXPECT_EQ(l.up_offset, g.total_bytes);
  EXPECT_EQ(l.down_offset, 2 * g.total_bytes);
  EXPECT_EQ(l.expert_bytes, 2 * g.total_bytes + d.total_bytes);
  const uint64_t table = sizeof(duck_slot_header) + 257 * sizeof(duck_ffn_desc);
  EXPECT_EQ(l.table_bytes, (table + 63) / 64 * 64);
  EXPECT_EQ(l.total_bytes % DUCK_IMAGE_ALIGN, 0u);
  EXPECT_GE(l.total_bytes, l.table_bytes + 9 * l.expert_bytes);
  EXPECT_LT(l.total_bytes, l.table_bytes + 9 * l.expert_bytes + DUCK_IMAGE_ALIGN);
  EXPECT_EQ(duck_slot_expert_offset(&l, 2), l.table_bytes + 2 * l.expert_bytes);
  const duck_slot_shape bad{7168, 256, 100, 128, 0, 1, 1}; // no such block
  EXPECT_NE(duck_compute_slot_layout(&bad, &l), DUCK_FP9_OK);
}
