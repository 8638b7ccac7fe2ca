// Exhaustive and property tests of the fp9 scalar format (duck_rt/fp9.h).
#include "duck_rt/fp9.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace {

uint32_t bitsOf(float f) { return duck_fp9_f32_bits(f); }

bool isValidCode(int c) {
  return c == 0 || (c >= DUCK_FP9_MIN_CODE && c <= DUCK_FP9_MAX_CODE);
}

// Every finite E4M3 byte (both signs, subnormals, both zeros) converts to an
// fp9 (sign, code) that decodes to the bit-identical fp32 value.
TEST(Fp9, EveryE4M3CodeConvertsExactly) {
  int finite = 0;
  for (int b = 0; b < 256; ++b) {
    if (duck_e4m3_is_nan((uint8_t)b)) {
      EXPECT_TRUE(std::isnan(duck_e4m3_to_f32((uint8_t)b))) << b;
      continue;
    }
    ++finite;
    uint32_t sign = 99;
    uint8_t code = duck_fp9_from_e4m3((uint8_t)b, &sign);
    EXPECT_EQ(sign, (uint32_t)(b >> 7)) << b;
    float want = duck_e4m3_to_f32((uint8_t)b);
    float got = duck_fp9_decode(sign, code);
    EXPECT_EQ(bitsOf(got), bitsOf(want)) << "e4m3 byte " << b;
    EXPECT_TRUE(isValidCode(code)) << b;
    if ((b & 0x7F) != 0) {
      int E = code >> 3;
      EXPECT_GE(E, 13) << b; // 2^-9, the smallest E4M3 subnormal
      EXPECT_LE(E, 30) << b; // 448
    } else {
      EXPECT_EQ(code, 0) << "zero must stay exactly zero";
    }
  }
  EXPECT_EQ(finite, 254);
}

// Known anchor values of the E4M3 decoder itself.
TEST(Fp9, E4M3DecoderAnchors) {
  EXPECT_EQ(duck_e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(duck_e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(duck_e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_EQ(duck_e4m3_to_f32(0x07), 7.0f * 0x1p-9f);
  EXPECT_EQ(duck_e4m3_to_f32(0x08), 0x1p-6f);
  EXPECT_EQ(duck_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(bitsOf(duck_e4m3_to_f32(0x80)), 0x80000000u); // -0
}

// The product with a block scale is the same fp32 operation as the
// checkpoint's dequantisation, so it is bit-identical too.
TEST(Fp9, E4M3TimesScaleIsIdentical) {
  const float scales[] = {0x1p-40f, 1.3e-4f, 0.0123f, 1.0f, 3.7f, 0x1p10f};
  for (float s : scales)
    for (int b = 0; b < 256; ++b) {
      if (duck_e4m3_is_nan((uint8_t)b))
        continue;
      uint32_t sign;
      uint8_t code = duck_fp9_from_e4m3((uint8_t)b, &sign);
      EXPECT_EQ(bitsOf(duck_fp9_decode(sign, code) * s),
                bitsOf(duck_e4m3_to_f32((uint8_t)b) * s))
          << "byte " << b << " scale " << s;
    }
}

// Both decode paths are a shift of the code and exact; zero stays zero.
TEST(Fp9, ShiftAndF16CPathsAreExact) {
  for (int c = 0; c < 256; ++c) {
    if (!isValidCode(c))
      continue;
    float v = duck_fp9_decode_magnitude((uint8_t)c);
    float shifted = duck_fp9_bits_f32((uint32_t)c << DUCK_FP9_F32_SHIFT);
    EXPECT_EQ(shifted, std::ldexp(v, DUCK_FP9_SHIFT_PATH_LOG2)) << c;
    float half = duck_f16_to_f32((uint16_t)(c << DUCK_FP9_F16_SHIFT));
    EXPECT_EQ(half, std::ldexp(v, DUCK_FP9_F16C_PATH_LOG2)) << c;
    if (c == 0) {
      EXPECT_EQ(bitsOf(shifted), 0u);
      EXPECT_EQ(bitsOf(half), 0u);
    } else {
      EXPECT_EQ(std::fpclassify(shifted), FP_NORMAL) << c;
      EXPECT_EQ(std::fpclassify(half), FP_NORMAL) << c;
      EXPECT_TRUE(std::isfinite(half)) << "code " << c << " is inf in fp16";
    }
  }
  EXPECT_EQ(duck_fp9_decode_magnitude(DUCK_FP9_MAX_CODE), DUCK_FP9_MAX_VALUE);
  EXPECT_EQ(duck_fp9_decode_magnitude(DUCK_FP9_MIN_CODE), 0x1p-21f);
}

// encode(decode(c)) == c for every valid code.
TEST(Fp9, EncodeInvertsDecode) {
  for (int c = 0; c < 256; ++c) {
    if (!isValidCode(c))
      continue;
    EXPECT_EQ(duck_fp9_encode_magnitude(duck_fp9_decode_magnitude((uint8_t)c)),
              c);
  }
}

// The encoder picks the nearest code, ties to the even code, for values
// spread over the whole range and for every exact midpoint.
TEST(Fp9, EncodeRoundsToNearestEven) {
  std::vector<float> values;
  for (int c = DUCK_FP9_MIN_CODE; c < DUCK_FP9_MAX_CODE; ++c) {
    float lo = duck_fp9_decode_magnitude((uint8_t)c);
    float hi = duck_fp9_decode_magnitude((uint8_t)(c + 1));
    float mid = (lo + hi) / 2; // exact in fp32
    int got = duck_fp9_encode_magnitude(mid);
    int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(got, even) << "midpoint of codes " << c << " and " << c + 1;
    EXPECT_EQ(duck_fp9_encode_magnitude(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(duck_fp9_encode_magnitude(std::nextafter(mid, 1e9f)), c + 1);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> e(-24.0f, 9.0f);
  for (int i = 0; i < 200000; ++i) {
    float v = std::exp2(e(rng));
    int got = duck_fp9_encode_magnitude(v);
    ASSERT_TRUE(isValidCode(got));
    double err = std::fabs((double)v - duck_fp9_decode_magnitude((uint8_t)got));
    for (int c = 0; c < 256; ++c) {
      if (!isValidCode(c))
        continue;
      double other = std::fabs((double)v - duck_fp9_decode_magnitude((uint8_t)c));
      ASSERT_LE(err, other) << "v=" << v << " picked " << got << " but " << c
                            << " is nearer";
    }
  }
}

TEST(Fp9, EncodeSaturatesAndUnderflows) {
  EXPECT_EQ(duck_fp9_encode_magnitude(1e30f), DUCK_FP9_MAX_CODE);
  EXPECT_EQ(duck_fp9_encode_magnitude(INFINITY), DUCK_FP9_MAX_CODE);
  EXPECT_EQ(duck_fp9_encode_magnitude(495.9f), DUCK_FP9_MAX_CODE);
  EXPECT_EQ(duck_fp9_encode_magnitude(0x1p-22f), 0);          // tie -> 0
  EXPECT_EQ(duck_fp9_encode_magnitude(0x1.01p-22f), DUCK_FP9_MIN_CODE);
  EXPECT_EQ(duck_fp9_encode_magnitude(1e-30f), 0);
  EXPECT_EQ(duck_fp9_encode_magnitude(-3.0f), duck_fp9_encode_magnitude(3.0f));
  EXPECT_TRUE(duck_fp9_is_nan_f32(NAN));
  EXPECT_FALSE(duck_fp9_is_nan_f32(INFINITY));
}

// The range guarantee of docs/fp9.md: for |x| in {0} U [2^-62, 65504] and
// scale in [2^-40, 2^10], the kernel's pre-scaled input and every product
// with a decoded weight are normal (or zero) and finite, on both paths.
TEST(Fp9, KernelArithmeticStaysNormal) {
  const float xs[] = {0.0f, 0x1p-62f, 1e-10f, 1.0f, 300.0f, 65504.0f};
  const float scales[] = {0x1p-40f, 1e-6f, 1.0f, 0x1p10f};
  for (float x : xs)
    for (float s : scales) {
      float xShift = x * s * 0x1p60f * 0x1p42f; // 2^102
      float xHalf = x * s * 0x1p-10f;
      for (float xp : {xShift, xHalf}) {
        ASSERT_TRUE(std::isfinite(xp)) << x << " " << s;
        if (x != 0) {
          ASSERT_EQ(std::fpclassify(xp), FP_NORMAL) << x << " " << s;
        }
      }
      for (int c = 1; c < 256; ++c) {
        if (!isValidCode(c))
          continue;
        float wShift = duck_fp9_bits_f32((uint32_t)c << DUCK_FP9_F32_SHIFT);
        float wHalf = duck_f16_to_f32((uint16_t)(c << DUCK_FP9_F16_SHIFT));
        double exact = (double)duck_fp9_decode_magnitude((uint8_t)c) * x * s / 8;
        for (float p : {wShift * xShift, wHalf * xHalf}) {
          ASSERT_TRUE(std::isfinite(p));
          if (x != 0) {
            ASSERT_EQ(std::fpclassify(p), FP_NORMAL)
                << "code " << c << " x " << x << " scale " << s;
            ASSERT_NEAR(p / exact, 1.0, 1e-6);
          }
        }
      }
    }
}

TEST(Fp9, Bf16AndF16Helpers) {
  EXPECT_EQ(duck_bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(duck_bf16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(duck_f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(duck_f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(duck_f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_TRUE(std::isinf(duck_f16_to_f32(0x7C00)));
}

} // namespace
