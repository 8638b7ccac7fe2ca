// fp9: Duck's 9-bit weight format (sign apart + 8-bit e5m3 magnitude).
//
// This header is the single definition of the format. It is freestanding:
// only compiler builtins and fixed-width integers, no libc, no heap, so the
// duck ELF, the kernels, the compiler and the tests all include the same
// code. docs/fp9.md gives the numerical argument behind every constant.
//
//   magnitude code M (8 bits) = E << 3 | m     E: 5-bit exponent, m: 3 bits
//   M == 0            -> 0.0
//   1 <= E <= 30      -> 2^(E - 22) * (1 + m / 8)
//   E == 31, E == 0 with m != 0: reserved, never produced by the encoder
//   sign              -> kept apart, bit i of a 32-bit sign word
//
// Decode paths (both exact, both keep zero exactly zero):
//   shift : bits_as_f32(M << 20)         == value * 2^-105
//   F16C  : half_to_f32((uint16_t)M << 7) == value * 2^7
#ifndef DUCK_RT_FP9_H
#define DUCK_RT_FP9_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  DUCK_FP9_FORMAT_VERSION = 1,
  /// Exponent bias of the magnitude code (the "e_bias" design parameter).
  DUCK_FP9_EXP_BIAS = 22,
  /// Largest magnitude code the encoder emits: E = 30, m = 7 -> 480.0.
  DUCK_FP9_MAX_CODE = 0xF7,
  /// Smallest non-zero code: E = 1, m = 0 -> 2^-21.
  DUCK_FP9_MIN_CODE = 0x08,
  /// Left shift that turns a magnitude code into fp32 bits (shift path).
  DUCK_FP9_F32_SHIFT = 20,
  /// Left shift that turns a magnitude code into fp16 bits (F16C path).
  DUCK_FP9_F16_SHIFT = 7,
  /// log2 of the factor the shift path's decoded value carries: 2^-105.
  DUCK_FP9_SHIFT_PATH_LOG2 = -105,
  /// log2 of the factor the F16C path's decoded value carries: 2^7.
  DUCK_FP9_F16C_PATH_LOG2 = 7,
  /// Weights per sign word.
  DUCK_FP9_SIGN_WORD_BITS = 32,

  // Kernel contract (docs/fp9.md, "Range guarantee"): with the pre-scaled
  // input x' = x * scale * 2^X_LOG2 and the decoded weight w' of the path,
  // y = 2^ACC_LOG2 * sum(w' * x'). Both paths give w' * x' = w*x*scale/8.
  DUCK_FP9_SHIFT_X_LOG2 = 102,
  DUCK_FP9_F16C_X_LOG2 = -10,
  DUCK_FP9_ACC_LOG2 = 3,
};

/// Largest finite fp9 magnitude.
#define DUCK_FP9_MAX_VALUE 480.0f

static inline uint32_t duck_fp9_f32_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
}

static inline float duck_fp9_bits_f32(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

/// Exact value of a magnitude code times 2^-105 (the shift path).
static inline float duck_fp9_decode_shifted(uint8_t code) {
  return duck_fp9_bits_f32((uint32_t)code << DUCK_FP9_F32_SHIFT);
}

/// Exact value of a magnitude code (no sign).
static inline float duck_fp9_decode_magnitude(uint8_t code) {
  // 2^105 is split in two exact power-of-two factors to stay in range.
  return duck_fp9_decode_shifted(code) * 0x1p+60f * 0x1p+45f;
}

/// Exact signed value of (sign, code).
static inline float duck_fp9_decode(uint32_t sign, uint8_t code) {
  float v = duck_fp9_decode_magnitude(code);
  return sign ? -v : v;
}

/// Encodes |v| to the nearest magnitude code (round to nearest, ties to
/// even code). Saturates at 480; values below 2^-22 become zero. NaN is the
/// caller's to reject (see duck_fp9_is_nan_f32); it encodes as the max code.
static inline uint8_t duck_fp9_encode_magnitude(float v) {
  uint32_t bits = duck_fp9_f32_bits(v) & 0x7FFFFFFFu;
  if (bits >= 0x7F800000u) // inf or NaN
    return DUCK_FP9_MAX_CODE;
  uint32_t exp32 = bits >> 23;
  // fp9 E = exp32 - 127 + 22 = exp32 - 105. E >= 1 is a normal code.
  if (exp32 >= 106) {
    // Round the 23-bit mantissa to 3 bits, ties to even; a carry moves
    // into the exponent, which is exactly the next binade.
    uint32_t lsb = (bits >> DUCK_FP9_F32_SHIFT) & 1u;
    uint32_t rounded = (bits + 0x7FFFFu + lsb) >> DUCK_FP9_F32_SHIFT;
    uint32_t code = rounded - (105u << 3);
    return code > DUCK_FP9_MAX_CODE ? (uint8_t)DUCK_FP9_MAX_CODE
                                    : (uint8_t)code;
  }
  // Below 2^-21: the only representable neighbours are 0 and 2^-21.
  // Halfway (2^-22) ties to the even code, which is 0.
  float a = duck_fp9_bits_f32(bits);
  return a > 0x1p-22f ? (uint8_t)DUCK_FP9_MIN_CODE : (uint8_t)0;
}

static inline int duck_fp9_is_nan_f32(float v) {
  return (duck_fp9_f32_bits(v) & 0x7FFFFFFFu) > 0x7F800000u;
}

/// Decodes one FP8 E4M3 (e4m3fn) byte exactly. 0x7F/0xFF are NaN.
static inline float duck_e4m3_to_f32(uint8_t b) {
  uint32_t s = b >> 7, e = (b >> 3) & 0xFu, m = b & 7u;
  float v;
  if (e == 0)
    v = (float)m * 0x1p-9f; // subnormal: m/8 * 2^-6
  else if (e == 15 && m == 7)
    v = __builtin_nanf("");
  else
    v = duck_fp9_bits_f32(((e + 120u) << 23) | (m << 20)); // (1+m/8)2^(e-7)
  return s ? -v : v;
}

static inline int duck_e4m3_is_nan(uint8_t b) { return (b & 0x7Fu) == 0x7Fu; }

/// Converts one E4M3 byte to fp9 losslessly: returns the magnitude code and
/// stores the sign in *out_sign. Every finite E4M3 value (subnormals and
/// both zeros included) maps to a normal fp9 code, E in [13, 30], or to 0.
/// The NaN bytes are the caller's to reject.
static inline uint8_t duck_fp9_from_e4m3(uint8_t b, uint32_t *out_sign) {
  *out_sign = b >> 7;
  uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
  if (e != 0) // normal: exponent e - 7 -> E = e - 7 + 22
    return (uint8_t)(((e + 15u) << 3) | m);
  if (m == 0)
    return 0;
  // Subnormal m/8 * 2^-6: normalise m = 1.f * 2^p, p = floor(log2 m).
  uint32_t p = 31u - (uint32_t)__builtin_clz(m);
  uint32_t frac = (m << (3u - p)) & 7u; // the bits below the leading one
  uint32_t E = p - 9u + 22u;             // exponent p - 9
  return (uint8_t)((E << 3) | frac);
}

/// Converts a bf16 bit pattern to fp32 exactly.
static inline float duck_bf16_to_f32(uint16_t h) {
  return duck_fp9_bits_f32((uint32_t)h << 16);
}

/// Converts an IEEE binary16 bit pattern to fp32 exactly (no F16C needed).
static inline float duck_f16_to_f32(uint16_t h) {
  uint32_t s = (uint32_t)(h >> 15) << 31;
  uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 31)
    return duck_fp9_bits_f32(s | 0x7F800000u | (m << 13));
  if (e == 0) {
    float v = (float)m * 0x1p-24f;
    return s ? -v : v;
  }
  return duck_fp9_bits_f32(s | ((e + 112u) << 23) | (m << 13));
}

#ifdef __cplusplus
} // extern "C"
#endif

#endif // DUCK_RT_FP9_H
