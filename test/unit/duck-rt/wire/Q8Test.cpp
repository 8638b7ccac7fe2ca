// q8 rows (duck_rt/abi.h: DUCK_IB_X_Q8, DUCK_IB_OUT_Q8, duckc
// --wire-activations q8 / --wire-results q8): the byte layout, rounding to
// nearest even, the error bound every value keeps, zero and non-finite
// blocks, and encoding a row in its own storage.
#include "duck_rt/abi.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

std::vector<uint8_t> Encode(const std::vector<float> &v) {
  std::vector<uint8_t> out(duck_q8_row_bytes(v.size()), 0xEE);
  duck_q8_encode_row(v.data(), v.size(), out.data());
  return out;
}

std::vector<float> Decode(const std::vector<uint8_t> &b, size_t n) {
  std::vector<float> v(n);
  duck_q8_decode_row(b.data(), n, v.data());
  return v;
}

float ScaleAt(const std::vector<uint8_t> &b, size_t off) {
  uint16_t s;
  std::memcpy(&s, b.data() + off, 2);
  return duck_bf16_to_f32(s);
}

TEST(Q8Test, LayoutAndRounding) {
  EXPECT_EQ(duck_q8_row_bytes(32), 34u);
  EXPECT_EQ(duck_q8_row_bytes(40), 44u); // a block of 32, one of 8
  EXPECT_EQ(duck_q8_row_bytes(7168), 7616u);
  EXPECT_EQ(duck_x_row_bytes(7168, DUCK_IB_X_Q8), 7616u);
  EXPECT_EQ(duck_x_row_bytes(7168, DUCK_IB_X_BF16), 14336u);
  EXPECT_EQ(duck_out_row_bytes(200, DUCK_IB_OUT_Q8), 214u);
  EXPECT_EQ(duck_out_row_bytes(200, DUCK_IB_X_Q8), 800u); // x's flag only
  // Block 0's largest magnitude is 127: its scale is exactly 1, so each
  // value's q is the value rounded to nearest, ties to even.
  std::vector<float> v(40, 0.0f);
  v[0] = 127.0f, v[1] = -63.5f, v[2] = 0.5f, v[3] = 1.5f, v[4] = -2.5f;
  v[5] = 3.25f;
  // Block 1 (8 values): largest 2.0, scale 2/127 rounded up to bf16.
  v[32] = 2.0f, v[33] = -1.0f;
  const std::vector<uint8_t> b = Encode(v);
  ASSERT_EQ(b.size(), 44u);
  EXPECT_EQ(ScaleAt(b, 0), 1.0f);
  const int8_t want[] = {127, -64, 0, 2, -2, 3};
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(int8_t(b[2 + i]), want[i]) << i;
  // 2/127 = 1.00787 x 2^-6 rounds up to 1.015625 x 2^-6 (bf16 keeps 7
  // bits of fraction): 2 and -1 become 126 and -63 of it.
  const float s1 = ScaleAt(b, 34);
  EXPECT_EQ(s1, 0.015869140625f);
  EXPECT_EQ(int8_t(b[36]), 126);
  EXPECT_EQ(int8_t(b[37]), -63);
  const std::vector<float> d = Decode(b, 40);
  EXPECT_EQ(d[0], 127.0f);
  EXPECT_EQ(d[1], -64.0f);
  EXPECT_EQ(d[32], 126 * s1);
}

// Random rows over 60 orders of magnitude: every scale is the block's
// largest over 127 rounded up by less than a bf16 step, no |q| passes 127,
// and every value decodes within half a scale of itself.
TEST(Q8Test, EveryValueWithinHalfAScale) {
  std::mt19937_64 rng(42);
  std::normal_distribution<float> g;
  std::uniform_int_distribution<int> e(-30, 30);
  for (int row = 0; row < 200; ++row) {
    const size_t n = 1 + rng() % 300;
    std::vector<float> v(n);
    const float mag = std::ldexp(1.0f, e(rng));
    for (float &x : v)
      x = g(rng) * mag * (rng() % 7 == 0 ? 100.0f : 1.0f);
    const std::vector<uint8_t> b = Encode(v);
    ASSERT_EQ(b.size(), duck_q8_row_bytes(n));
    const std::vector<float> d = Decode(b, n);
    size_t off = 0;
    for (size_t blk = 0; blk < n; blk += 32) {
      const size_t m = std::min<size_t>(32, n - blk);
      float amax = 0;
      for (size_t i = 0; i < m; ++i)
        amax = std::max(amax, std::fabs(v[blk + i]));
      const float s = ScaleAt(b, off);
      ASSERT_GE(s, amax / 127.0f) << row;
      ASSERT_LT(s, amax / 127.0f * (1 + 1.0f / 64)) << row;
      for (size_t i = 0; i < m; ++i) {
        const int q = int8_t(b[off + 2 + i]);
        ASSERT_LE(std::abs(q), 127);
        ASSERT_LE(std::fabs(d[blk + i] - v[blk + i]), s / 2)
            << "row " << row << " value " << blk + i;
      }
      off += 2 + m;
    }
  }
}

// A block of zeros has scale 0 and decodes to zeros; a NaN or an infinity
// turns its own block (only) into NaNs.
TEST(Q8Test, ZeroAndNonFiniteBlocks) {
  std::vector<float> v(96, 0.25f);
  for (int i = 0; i < 32; ++i)
    v[i] = i % 2 ? 0.0f : -0.0f;
  v[40] = std::numeric_limits<float>::quiet_NaN();
  v[70] = -std::numeric_limits<float>::infinity();
  const std::vector<uint8_t> b = Encode(v);
  EXPECT_EQ(ScaleAt(b, 0), 0.0f);
  const std::vector<float> d = Decode(b, 96);
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(d[i], 0.0f) << i;
  for (int i = 32; i < 96; ++i)
    EXPECT_TRUE(std::isnan(d[i])) << i;
  v[40] = v[70] = 0.25f;
  const std::vector<float> ok = Decode(Encode(v), 96);
  for (int i = 32; i < 96; ++i)
    EXPECT_NEAR(ok[i], 0.25f, 0.25f / 254 * 1.01f) << i;
}

// The AVX2 blocks (this test is built with AVX2, as the host and the ELF
// are) give the bytes and values of the scalar definition, ties, zeros,
// subnormals, huge values and non-finite ones included.
TEST(Q8Test, Avx2EqualsTheScalarDefinition) {
#if !defined(__AVX2__)
  GTEST_FAIL() << "built without AVX2: the host and the ELF use it";
#else
  std::mt19937_64 rng(11);
  std::normal_distribution<float> g;
  const float special[] = {0.0f, -0.0f, 1e-40f, -3e38f, 0.5f, 2.5f, 127.0f,
                           std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  for (int row = 0; row < 300; ++row) {
    const size_t n = 32 * (1 + rng() % 8);
    std::vector<float> v(n);
    for (float &x : v)
      x = g(rng) * std::ldexp(1.0f, int(rng() % 40) - 20);
    if (row % 3 == 0) // multiples of a power of two: ties for the rounding
      for (float &x : v)
        x = std::ldexp(std::round(x * 4), -2);
    if (row % 5 == 0)
      v[rng() % n] = special[rng() % 9];
    if (row % 7 == 0)
      std::fill(v.begin(), v.begin() + 32, 0.0f);
    std::vector<uint8_t> want(duck_q8_row_bytes(n));
    for (size_t b = 0; b < n; b += 32)
      duck_q8_encode_block(v.data() + b, 32, want.data() + b / 32 * 34);
    const std::vector<uint8_t> got = Encode(v);
    ASSERT_EQ(got, want) << "row " << row;
    const std::vector<float> d = Decode(got, n);
    for (size_t b = 0; b < n; b += 32) {
      const float s = ScaleAt(got, b / 32 * 34);
      for (size_t i = 0; i < 32; ++i) {
        const float w = float(int8_t(got[b / 32 * 34 + 2 + i])) * s;
        ASSERT_TRUE(std::memcmp(&w, &d[b + i], 4) == 0 ||
                    (std::isnan(w) && std::isnan(d[b + i])))
            << "row " << row << " value " << b + i;
      }
    }
  }
#endif
}

// Rows encoded in their own storage (as the ELF narrows its results) are
// the bytes of a separate encoding.
TEST(Q8Test, InPlaceEqualsSeparate) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> g;
  const size_t rows = 5, n = 200; // 6 blocks of 32 and one of 8 a row
  std::vector<float> v(rows * n);
  for (float &x : v)
    x = g(rng);
  std::vector<uint8_t> want;
  for (size_t r = 0; r < rows; ++r) {
    std::vector<float> row(v.begin() + r * n, v.begin() + (r + 1) * n);
    const std::vector<uint8_t> e = Encode(row);
    want.insert(want.end(), e.begin(), e.end());
  }
  auto *bytes = reinterpret_cast<uint8_t *>(v.data());
  for (size_t r = 0; r < rows; ++r)
    duck_q8_encode_row(v.data() + r * n, n,
                       bytes + r * duck_q8_row_bytes(n));
  EXPECT_EQ(std::memcmp(bytes, want.data(), want.size()), 0);
}

} // namespace
