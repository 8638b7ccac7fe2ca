// fp9 GEMV and GEMM kernels, AVX2 + FMA (+ F16C for the alternative decode
// path). See docs/fp9.md for the arithmetic contract these implement.
//
// Every shift-path kernel accumulates one row in the same canonical order,
// so they (general, exact, GEMM tiles) give bit-identical results: 32
// weights per sign word; accumulator acc[q] takes lane j = weight
// 32c+4j+q (SignedDecoder: the bytes reordered within each half and
// unpacked with sign bytes, two groups a pair); then (acc0+acc1)+
// (acc2+acc3), then the hadd pattern ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)),
// times 2^3. The pre-scaled input is stored in the same permuted order. The
// F16C path (a benchmark alternative) reads weights in natural order.
#include "duck_rt/kernels.h"

#include <cpuid.h>
#include <immintrin.h>

namespace {

constexpr float kShiftXFactor = 0x1p102f; // 2^DUCK_FP9_SHIFT_X_LOG2
/// How far ahead of the decode the magnitudes are prefetched. 8 KiB since
/// the byte-unpack decode: on the Zen 5 VM 4 KiB left the faster loop
/// waiting on memory (two cores cold 35.9 / 36.5 against 39.4 / 38.0
/// Gparam/s, K = 7168); the exact kernels' four tiles ahead (0.5-1 KiB)
/// and 2 KiB measured the same as 8 KiB there.
constexpr uint32_t kPrefetchBytes = 8192;
/// The weights are read once a call: prefetched non-temporally, so the
/// stream does not push the inputs and the caches' other contents out.
/// On the Zen 5 VM a cold GEMV (K = 7168) read 3-14 % faster than with
/// T0 in one window and within 5 % either way in two others (2026-12-07):
/// a small gain near that machine's noise.
constexpr auto kWeightsHint = _MM_HINT_NTA; // GCC: enum _mm_hint; clang: int
constexpr float kF16cXFactor = 0x1p-10f;  // 2^DUCK_FP9_F16C_X_LOG2
constexpr float kAccFactor = 8.0f;        // 2^DUCK_FP9_ACC_LOG2
static_assert(DUCK_FP9_SHIFT_X_LOG2 == 102 && DUCK_FP9_F16C_X_LOG2 == -10 &&
                  DUCK_FP9_ACC_LOG2 == 3,
              "kernel constants out of sync with duck_rt/fp9.h");

/// F16C path: lane j of the result holds (sign word) << (31 - (8g + j)):
/// bit 31 is the sign of weight 8g + j, the bits below are don't-care for a
/// blend.
inline __m256i signLanes(__m256i word, __m256i shift) {
  return _mm256_sllv_epi32(word, shift);
}

inline __m256i shiftCounts(int g) {
  return _mm256_setr_epi32(31 - 8 * g, 30 - 8 * g, 29 - 8 * g, 28 - 8 * g,
                           27 - 8 * g, 26 - 8 * g, 25 - 8 * g, 24 - 8 * g);
}

/// Shift path: the 32 weights of one sign word, decoded with their signs.
/// Group q (lane j = weight 4j + q) comes out as fp32 bits: sign in bit 31,
/// magnitude code in bits 20..27 (value * 2^-105), zeros elsewhere.
///
/// The magnitudes are reordered within each 128-bit half so that one byte
/// unpack with the signs, made bytes (8 or 0xF8 for a negative weight, 0
/// otherwise), gives dwords [s1 m1 s0 m0] holding two groups' weights: the
/// first is the dword shifted left 20 (s0's bit 3 lands on bit 31, m0 on
/// 20..27, s1 and m1 fall off), the second the dword's high word [s1 m1]
/// shifted left 4 within its word, the low word cleared: one 16-bit
/// multiply by (16, 0), the bits of (dword << 4) & 0xFFF00000 in one
/// operation, and on a multiply unit rather than the shift units the first
/// group and the sign bytes keep busy. Ten vector operations a 32-chunk
/// where shifting each group out of the loaded vector and applying each
/// sign with an AND and an XOR took twenty; the bits are the same. The
/// multiply took the one-core GEMV from 29 to 32-33 GB/s hot on the Zen 5
/// VM (2026-12-07, docs/perf-log); the first group as a 32-bit multiply by
/// 2^20 instead of its shift measured 1-5 % slower.
struct SignedDecoder {
  // Byte t of each half of the reordered magnitudes: weight kOrder[t].
  //   kOrder = 0 1 4 5 8 9 12 13 | 2 3 6 7 10 11 14 15
  // so unpacklo's dwords are groups 0 / 1, unpackhi's groups 2 / 3.
  __m256i order =
      _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0,
                       1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  // Which byte of the sign word holds weight 16h + kOrder[t]'s bit ...
  __m256i spread =
      _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                       2, 3, 3, 3, 3, 2, 2, 2, 2, 3, 3, 3, 3);
  // ... and which bit of that byte.
  __m256i bit = _mm256_setr_epi8(1, 2, 16, 32, 1, 2, 16, 32, 4, 8, 64, -128, 4,
                                 8, 64, -128, 1, 2, 16, 32, 1, 2, 16, 32, 4, 8,
                                 64, -128, 4, 8, 64, -128);
  __m256i eight = _mm256_set1_epi8(8);
  // 16-bit multipliers: 16 for each dword's high word, 0 for its low one.
  __m256i sixteenHigh = _mm256_set1_epi32(16 << 16);

  /// The sign bytes of a word, in the reordered magnitudes' order: 0 for a
  /// clear bit (a positive weight), 8 for a set one, 0xF8 where the set bit
  /// is bit 7 of its byte (vpsignb negates 8 by 0x80, -128 as a signed
  /// byte). Either way bit 3, the bit that moves to bit 31, is set and bits
  /// 0..2 are clear.
  __m256i signBytes(uint32_t word) const {
    const __m256i b = _mm256_set1_epi32((int)word);
    return _mm256_sign_epi8(
        eight, _mm256_and_si256(_mm256_shuffle_epi8(b, spread), bit));
  }
  /// The chunk's 32 magnitude bytes, reordered.
  __m256i magnitudes(const uint8_t *mag) const {
    return _mm256_shuffle_epi8(
        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(mag)), order);
  }
  /// Groups 0 and 1 (lo) and groups 2 and 3 (hi) as packed dwords.
  void pairs(const uint8_t *mag, uint32_t word, __m256i *lo,
             __m256i *hi) const {
    const __m256i v = magnitudes(mag), s = signBytes(word);
    *lo = _mm256_unpacklo_epi8(v, s);
    *hi = _mm256_unpackhi_epi8(v, s);
  }
  /// One pair only: groups 0 / 1 when Hi is false, 2 / 3 when true.
  template <bool Hi> __m256i pair(const uint8_t *mag, uint32_t word) const {
    const __m256i v = magnitudes(mag), s = signBytes(word);
    return Hi ? _mm256_unpackhi_epi8(v, s) : _mm256_unpacklo_epi8(v, s);
  }
  /// The pair's first group (0 or 2) and second group (1 or 3).
  static __m256 first(__m256i u) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 20));
  }
  __m256 second(__m256i u) const {
    return _mm256_castsi256_ps(_mm256_mullo_epi16(u, sixteenHigh));
  }
  /// All four groups of a chunk.
  void chunk(const uint8_t *mag, uint32_t word, __m256 (&w)[4]) const {
    __m256i lo, hi;
    pairs(mag, word, &lo, &hi);
    w[0] = first(lo);
    w[1] = second(lo);
    w[2] = first(hi);
    w[3] = second(hi);
  }
};

/// Decodes 16 weights with the F16C path into two vectors (w * 2^7).
inline void decodeF16c(const uint8_t *p, __m256 *lo, __m256 *hi) {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
  __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 7);
  *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/// Canonical horizontal reduction of one row's four accumulators.
inline float reduceRow(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  __m256 h = _mm256_hadd_ps(v, v);
  h = _mm256_hadd_ps(h, h);
  __m128 r = _mm_add_ss(_mm256_castps256_ps128(h),
                        _mm256_extractf128_ps(h, 1));
  return _mm_cvtss_f32(r) * kAccFactor;
}

/// The same reduction for four rows at once: out[i] = reduce(row i).
inline __m128 reduceFourRows(__m256 r0, __m256 r1, __m256 r2, __m256 r3) {
  __m256 t0 = _mm256_hadd_ps(r0, r1);
  __m256 t1 = _mm256_hadd_ps(r2, r3);
  __m256 t2 = _mm256_hadd_ps(t0, t1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(t2), _mm256_extractf128_ps(t2, 1));
  return _mm_mul_ps(s, _mm_set1_ps(kAccFactor));
}

/// The same reduction for two rows: out[0..1] = reduce(row 0), reduce(row 1).
inline void reduceTwoRows(__m256 r0, __m256 r1, float *out) {
  __m256 t0 = _mm256_hadd_ps(r0, r1);
  __m256 t1 = _mm256_hadd_ps(t0, t0);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(t1), _mm256_extractf128_ps(t1, 1));
  s = _mm_mul_ps(s, _mm_set1_ps(kAccFactor));
  out[0] = _mm_cvtss_f32(s);
  out[1] = _mm_cvtss_f32(_mm_shuffle_ps(s, s, 1));
}

/// One 32-chunk pre-scaled into the shift path's order: out[8q + j] =
/// x[4j + q] * sf (a 8x4 -> 4x8 transpose in registers: unpack, shuffle,
/// lane permute).
inline void prescaleChunk32(const float *x, __m256 sf, float *out) {
  const __m256 r0 = _mm256_mul_ps(_mm256_loadu_ps(x), sf);
  const __m256 r1 = _mm256_mul_ps(_mm256_loadu_ps(x + 8), sf);
  const __m256 r2 = _mm256_mul_ps(_mm256_loadu_ps(x + 16), sf);
  const __m256 r3 = _mm256_mul_ps(_mm256_loadu_ps(x + 24), sf);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  // u_q = [x_q x_{8+q} x_{16+q} x_{24+q} | x_{4+q} x_{12+q} x_{20+q} x_{28+q}]
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44);
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44);
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_store_ps(out, _mm256_permutevar8x32_ps(u0, order));
  _mm256_store_ps(out + 8, _mm256_permutevar8x32_ps(u1, order));
  _mm256_store_ps(out + 16, _mm256_permutevar8x32_ps(u2, order));
  _mm256_store_ps(out + 24, _mm256_permutevar8x32_ps(u3, order));
}

/// Pre-scales x for one row tile: xs = x[k] * scale[k / BLOCK] * factor.
/// PERMUTED (the shift path, which flips the weights' signs itself) stores
/// each 32-chunk in its order: position 8q + j holds element 4j + q. The
/// F16C path blends with xn = -xs, so it gets that copy as well.
template <uint32_t BLOCK, bool PERMUTED>
void prescale(const float *x, const float *scale, uint32_t k, float factor,
              float *xs, float *xn) {
  const __m256 neg = _mm256_set1_ps(-0.0f);
  for (uint32_t b = 0; b < k / BLOCK; ++b) {
    const float sf = scale[b] * factor;
    if constexpr (PERMUTED) {
      const __m256 sv = _mm256_set1_ps(sf);
      for (uint32_t c = b * BLOCK; c < (b + 1) * BLOCK; c += 32)
        prescaleChunk32(x + c, sv, xs + c);
    } else {
      __m256 sv = _mm256_set1_ps(sf);
      for (uint32_t i = b * BLOCK; i < (b + 1) * BLOCK; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sv);
        _mm256_store_ps(xs + i, v);
        _mm256_store_ps(xn + i, _mm256_xor_ps(v, neg));
      }
    }
  }
}

template <bool PERMUTED>
void prescaleAny(uint32_t block, const float *x, const float *scale,
                 uint32_t k, float factor, float *xs, float *xn) {
  switch (block) {
  case 128:
    return prescale<128, PERMUTED>(x, scale, k, factor, xs, xn);
  case 64:
    return prescale<64, PERMUTED>(x, scale, k, factor, xs, xn);
  default:
    return prescale<32, PERMUTED>(x, scale, k, factor, xs, xn);
  }
}

/// Accumulates 32 weights of one row into acc0..acc3 (shift path).
inline void accumulate32(const uint8_t *mag, uint32_t word, const float *xs,
                         __m256 &acc0, __m256 &acc1, __m256 &acc2,
                         __m256 &acc3) {
  __m256 w[4];
  SignedDecoder().chunk(mag, word, w);
  acc0 = _mm256_fmadd_ps(w[0], _mm256_load_ps(xs), acc0);
  acc1 = _mm256_fmadd_ps(w[1], _mm256_load_ps(xs + 8), acc1);
  acc2 = _mm256_fmadd_ps(w[2], _mm256_load_ps(xs + 16), acc2);
  acc3 = _mm256_fmadd_ps(w[3], _mm256_load_ps(xs + 24), acc3);
}

/// One row, shift path: two chunks a pass (one prefetch of their 64
/// magnitude bytes), then the odd last chunk of a K that is 32 times an odd
/// number; pointers stepped rather than indexed, so the loop's scalar work
/// shrinks (1-5 % hot on the Zen 5 VM). The chunks go through the
/// accumulators in the same order as one a pass: the same bits.
inline float dotRowShift(const uint8_t *mag, const uint32_t *sign,
                         const float *xs, uint32_t k) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  const uint8_t *const end = mag + k;
  for (; mag + 64 <= end; mag += 64, sign += 2, xs += 64) {
    _mm_prefetch(reinterpret_cast<const char *>(mag + kPrefetchBytes),
                 kWeightsHint);
    accumulate32(mag, sign[0], xs, acc0, acc1, acc2, acc3);
    accumulate32(mag + 32, sign[1], xs + 32, acc0, acc1, acc2, acc3);
  }
  if (mag < end)
    accumulate32(mag, sign[0], xs, acc0, acc1, acc2, acc3);
  return reduceRow(acc0, acc1, acc2, acc3);
}

/// One row, F16C path (same accumulation order as the shift path).
inline float dotRowF16c(const uint8_t *mag, const uint32_t *sign,
                        const float *xs, const float *xn, uint32_t k) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  const __m256i s0 = shiftCounts(0), s1 = shiftCounts(1), s2 = shiftCounts(2),
                s3 = shiftCounts(3);
  for (uint32_t c = 0; c < k; c += 32) {
    _mm_prefetch(reinterpret_cast<const char *>(mag + c + kPrefetchBytes),
                 kWeightsHint);
    __m256i word = _mm256_set1_epi32((int)sign[c / 32]);
    __m256 w0, w1, w2, w3;
    decodeF16c(mag + c, &w0, &w1);
    decodeF16c(mag + c + 16, &w2, &w3);
    __m256 x0 = _mm256_blendv_ps(_mm256_load_ps(xs + c), _mm256_load_ps(xn + c),
                                 _mm256_castsi256_ps(signLanes(word, s0)));
    acc0 = _mm256_fmadd_ps(w0, x0, acc0);
    __m256 x1 = _mm256_blendv_ps(_mm256_load_ps(xs + c + 8),
                                 _mm256_load_ps(xn + c + 8),
                                 _mm256_castsi256_ps(signLanes(word, s1)));
    acc1 = _mm256_fmadd_ps(w1, x1, acc1);
    __m256 x2 = _mm256_blendv_ps(_mm256_load_ps(xs + c + 16),
                                 _mm256_load_ps(xn + c + 16),
                                 _mm256_castsi256_ps(signLanes(word, s2)));
    acc2 = _mm256_fmadd_ps(w2, x2, acc2);
    __m256 x3 = _mm256_blendv_ps(_mm256_load_ps(xs + c + 24),
                                 _mm256_load_ps(xn + c + 24),
                                 _mm256_castsi256_ps(signLanes(word, s3)));
    acc3 = _mm256_fmadd_ps(w3, x3, acc3);
  }
  return reduceRow(acc0, acc1, acc2, acc3);
}

/// One row's accumulators summed, before the horizontal reduction.
template <uint32_t K>
inline __m256 rowSum(const uint8_t *mag, const uint32_t *sign,
                     const float *xs) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
#pragma GCC unroll 4
  for (uint32_t c = 0; c < K; c += 32)
    accumulate32(mag + c, sign[c / 32], xs + c, acc0, acc1, acc2, acc3);
  return _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
}

/// Rows of a K == 32 or 64 (four rows a tile) or K == 128 (two rows a tile)
/// matrix: the sign words and the horizontal reduction are shared by the
/// rows of a tile, and the next tile is prefetched. K == 128 uses two rows
/// because four would need more than the 16 ymm registers.
template <uint32_t K>
void exactRows(const duck_fp9_matrix *m, const float *xs,
               uint32_t r0, uint32_t r1, float *y) {
  constexpr uint32_t W = K / 32;
  constexpr uint32_t R = K <= 64 ? 4 : 2;
  uint32_t r = r0;
  for (; r + R <= r1; r += R) {
    const uint8_t *mag = m->mag + (uint64_t)r * K;
    const uint32_t *sign = m->sign + (uint64_t)r * W;
    // The tile kPrefetchBytes on (4 lines: a tile is R * K <= 256 bytes).
    const char *ahead = reinterpret_cast<const char *>(mag) + kPrefetchBytes;
    _mm_prefetch(ahead, kWeightsHint);
    _mm_prefetch(ahead + 64, kWeightsHint);
    _mm_prefetch(ahead + 128, kWeightsHint);
    _mm_prefetch(ahead + 192, kWeightsHint);
    if constexpr (R == 4) {
      __m256 v0 = rowSum<K>(mag, sign, xs);
      __m256 v1 = rowSum<K>(mag + K, sign + W, xs);
      __m256 v2 = rowSum<K>(mag + 2 * K, sign + 2 * W, xs);
      __m256 v3 = rowSum<K>(mag + 3 * K, sign + 3 * W, xs);
      _mm_storeu_ps(y + (r - r0), reduceFourRows(v0, v1, v2, v3));
    } else {
      __m256 v0 = rowSum<K>(mag, sign, xs);
      __m256 v1 = rowSum<K>(mag + K, sign + W, xs);
      reduceTwoRows(v0, v1, y + (r - r0));
    }
  }
  for (; r < r1; ++r)
    y[r - r0] = dotRowShift(m->mag + (uint64_t)r * K, m->sign + (uint64_t)r * W,
                            xs, K);
}

/// One weight row against T tokens (1 or 2 here): the row is decoded once and
/// the sign flips the weight, so each token's sum has the same bits as
/// duck_gemv's. xs holds the tokens' pre-scaled inputs k apart; y[t * y_ld]
/// receives token t's result.
template <int T>
inline void gemmRow(const uint8_t *mag, const uint32_t *sign, const float *xs,
                    uint32_t k, float *y, uint32_t y_ld) {
  const SignedDecoder d;
  __m256 acc[T][4];
  for (int t = 0; t < T; ++t)
    for (int q = 0; q < 4; ++q)
      acc[t][q] = _mm256_setzero_ps();
  for (uint32_t c = 0; c < k; c += 32) {
    // The GEMV's prefetch distance: weights stream from DRAM in prefill.
    _mm_prefetch(reinterpret_cast<const char *>(mag + c + kPrefetchBytes),
                 kWeightsHint);
    // The two pairs, then one decoded group at a time beside the 4 x T
    // accumulators.
    __m256i lo, hi;
    d.pairs(mag + c, sign[c / 32], &lo, &hi);
    for (int q = 0; q < 4; ++q) {
      const __m256i u = q < 2 ? lo : hi;
      const __m256 w = q % 2 == 0 ? SignedDecoder::first(u) : d.second(u);
      for (int t = 0; t < T; ++t)
        acc[t][q] = _mm256_fmadd_ps(
            w, _mm256_load_ps(xs + (uint64_t)t * k + c + 8 * q), acc[t][q]);
    }
  }
  for (int t = 0; t < T; ++t)
    y[(uint64_t)t * y_ld] = reduceRow(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
}

/// One weight row against T = 3 or 4 tokens (a verify step of 2 or 3
/// drafts, an expert's few tokens), two accumulator groups a pass: pass
/// Q0 decodes groups Q0 and Q0 + 1 of every 32-chunk (the row's bytes stay
/// in L1 for the second pass), so 2T accumulators are live where gemmRow<T>
/// needs 4T (gemmRow<3>'s 12 spill beside the decode). Each takes the FMAs
/// duck_gemv's accumulator q takes for its token, in the same order, with
/// the same decoded weight (SignedDecoder's pair Q0 / 2): the GEMV's
/// bits. Two groups a pass, not
/// one: with four chains an iteration the FMA latency set the pace (1245
/// against 1581 us one core, the 0.6B FFN at four tokens). Hot, one core,
/// 768 x 2048: three tokens 148-150 us against gemmRow<3>'s 183-199; two
/// tokens stay with gemmRow<2> (120-128 against 132-157).
template <int T, int Q0>
inline void gemmRowPass(const uint8_t *mag, const uint32_t *sign,
                        const float *xs, uint32_t k, __m256 (&sums)[4][4]) {
  const SignedDecoder d;
  // Token t's inputs of group Q0 (Q0 + 1 is 8 floats on).
  const float *x[T];
  for (int t = 0; t < T; ++t)
    x[t] = xs + (uint64_t)t * k + 8 * Q0;
  __m256 a[T], b[T];
  for (int t = 0; t < T; ++t)
    a[t] = b[t] = _mm256_setzero_ps();
  for (uint32_t c = 0; c < k; c += 32) {
    // The first pass streams the row in (the GEMV's prefetch distance).
    if (Q0 == 0)
      _mm_prefetch(reinterpret_cast<const char *>(mag + c + kPrefetchBytes),
                   kWeightsHint);
    // Groups Q0 and Q0 + 1 are one pair of the decoder's.
    const __m256i u = d.pair<Q0 == 2>(mag + c, sign[c / 32]);
    const __m256 wA = SignedDecoder::first(u);
    for (int t = 0; t < T; ++t)
      a[t] = _mm256_fmadd_ps(wA, _mm256_load_ps(x[t] + c), a[t]);
    const __m256 wB = d.second(u);
    for (int t = 0; t < T; ++t)
      b[t] = _mm256_fmadd_ps(wB, _mm256_load_ps(x[t] + c + 8), b[t]);
  }
  for (int t = 0; t < T; ++t) {
    sums[Q0][t] = a[t];
    sums[Q0 + 1][t] = b[t];
  }
}

/// gemmRowPass's two passes, then each token's canonical reduction.
template <int T>
inline void gemmRowPasses(const uint8_t *mag, const uint32_t *sign,
                          const float *xs, uint32_t k, float *y,
                          uint32_t y_ld) {
  __m256 sums[4][4];
  gemmRowPass<T, 0>(mag, sign, xs, k, sums);
  gemmRowPass<T, 2>(mag, sign, xs, k, sums);
  for (int t = 0; t < T; ++t)
    y[(uint64_t)t * y_ld] =
        reduceRow(sums[0][t], sums[1][t], sums[2][t], sums[3][t]);
}

/// Columns [c0, c1) of rows [i, i + R) decoded into `panel` (R x (c1 - c0)
/// floats, row r at r * (c1 - c0)): each 32-chunk in the shift path's
/// permuted order (position 8q + j holds weight 4j + q), as fp32 bits with
/// the weight's sign applied: exactly the operand gemmRow and duck_gemv
/// multiply.
template <int R>
inline void decodePanel(const uint8_t *mag, const uint32_t *sign, uint32_t k,
                        uint32_t c0, uint32_t c1, float *panel) {
  const SignedDecoder d;
  for (int r = 0; r < R; ++r) {
    const uint8_t *m = mag + (uint64_t)r * k;
    const uint32_t *s = sign + (uint64_t)r * (k / 32);
    float *p = panel + (uint64_t)r * (c1 - c0) - c0;
    for (uint32_t c = c0; c < c1; c += 32) {
      _mm_prefetch(reinterpret_cast<const char *>(m + c + kPrefetchBytes),
                   kWeightsHint);
      __m256 w[4];
      d.chunk(m + c, s[c / 32], w);
      for (int q = 0; q < 4; ++q)
        _mm256_store_ps(p + c + 8 * q, w[q]);
    }
  }
}

/// One 32-chunk's FMAs of one accumulator group: R panel rows (`len`
/// floats apart from p) against T tokens' inputs (k floats apart from xp).
/// Where R weights, one input and R x T accumulators would overflow the 16
/// registers (4 x 3), the T inputs stay in registers and the weights come
/// one at a time. Its loops unrolled (panelPass: the accumulators then
/// stay in registers).
template <int R, int T>
__attribute__((always_inline)) inline void
chunkFmas(const float *p, uint32_t len, const float *xp, uint32_t k,
          __m256 (&acc)[R][T]) {
  if constexpr (R * T + R + 1 > 16) {
    __m256 xv[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      xv[t] = _mm256_load_ps(xp + (uint64_t)t * k);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_load_ps(p + (uint64_t)r * len);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t)
        acc[r][t] = _mm256_fmadd_ps(w, xv[t], acc[r][t]);
    }
  } else {
    __m256 w[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      w[r] = _mm256_load_ps(p + (uint64_t)r * len);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_load_ps(xp + (uint64_t)t * k);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
        acc[r][t] = _mm256_fmadd_ps(w[r], xv, acc[r][t]);
    }
  }
}

/// One accumulator group q of R decoded rows (a panel of `len` columns,
/// rows len apart) against T tokens (inputs k apart): acc[r][t] takes, for
/// every 32-chunk in order, the FMA duck_gemv's accumulator q of row r
/// takes for token t. One group at a time, a chunk's R weights and T inputs
/// (7 loads for 3 x 4) feed 12 FMAs, and the 12 accumulators, 3 weights and
/// one input fill the 16 registers: the FMA ports, not the loads, set the
/// pace (all four groups at once fit only 3 row-token pairs, 16 loads for
/// 12 FMAs).
template <int R, int T>
inline void panelGroup(const float *panel, uint32_t len, const float *x,
                       uint32_t k, const char *next, __m256 (&acc)[R][T]) {
  const float *p = panel, *end = panel + len, *xp = x;
  for (; p < end; p += 32, xp += 32, next += 128) {
    // `next`: one input row of the next tokens, 128 bytes an iteration,
    // into L1 while this one computes (7 % here: L2 alone lags the FMAs).
    _mm_prefetch(next, _MM_HINT_T0);
    _mm_prefetch(next + 64, _MM_HINT_T0);
    chunkFmas<R, T>(p, len, xp, k, acc);
  }
}

/// Token t's results for R rows: y[0..R) from each row's four group sums.
template <int R>
inline void storeRows(const __m256 (&g)[4][R], float *yt) {
  __m256 v[R];
  for (int r = 0; r < R; ++r)
    v[r] = _mm256_add_ps(_mm256_add_ps(g[0][r], g[1][r]),
                         _mm256_add_ps(g[2][r], g[3][r]));
  if constexpr (R == 4) {
    _mm_storeu_ps(yt, reduceFourRows(v[0], v[1], v[2], v[3]));
  } else if constexpr (R == 3) {
    alignas(16) float o[4];
    _mm_store_ps(o, reduceFourRows(v[0], v[1], v[2], v[2]));
    yt[0] = o[0];
    yt[1] = o[1];
    yt[2] = o[2];
  } else if constexpr (R == 2) {
    reduceTwoRows(v[0], v[1], yt);
  } else {
    yt[0] = _mm_cvtss_f32(reduceFourRows(v[0], v[0], v[0], v[0]));
  }
}

/// This core's L1 data cache in KiB (CPUID: AMD's leaf 0x80000005, else
/// the deterministic cache leaf 4), 32 when neither tells.
uint32_t l1DataKib() {
  unsigned a, b, c, d;
  if (__get_cpuid(0x80000000u, &a, &b, &c, &d) && a >= 0x80000005u &&
      __get_cpuid(0x80000005u, &a, &b, &c, &d) && (c >> 24) != 0)
    return c >> 24;
  if (__get_cpuid(0, &a, &b, &c, &d) && a >= 4)
    for (unsigned i = 0; i < 8; ++i) {
      __cpuid_count(4, i, a, b, c, d);
      const unsigned type = a & 31, level = (a >> 5) & 7;
      if (type == 0)
        break;
      if (level == 1 && (type == 1 || type == 3))
        return ((b >> 22) + 1) * (((b >> 12) & 0x3FF) + 1) * ((b & 0xFFF) + 1) *
               (c + 1) / 1024;
    }
  return 32;
}

/// K a panel segment (duck_gemm_set_panel_segment sets one for both
/// orders, for tests of every segment). The group-pair order (from 16
/// tokens, gemmPanelRowsByPairs) takes 1024 columns on any L1: it keeps
/// half of a segment's panel in L1 (6 KiB of 3 rows) with half of 4
/// tokens' inputs (8 KiB) and of the next 4 tokens' coming in (8 KiB).
/// The four groups a pass (gemmPanelRows) keep all of it: 1024 where L1
/// holds 48 KiB or more, 512 on a 32 KiB L1 (Zen 2 and 3, Skylake), which
/// 1024 overflows (44 KiB): on Zen 3, with the inputs padded, the
/// 64-token dense and MoE prefill 6-9 % faster than at 256, which was 3-8 %
/// faster than 1024 unpadded; 8 tokens of DeepSeek's tp 32 expert 2-5 %
/// faster than at 1024.
uint32_t gPanelSegment = 0; // 0: none set
uint32_t gQuadSegment = 0;  // the four-group order's, once known

uint32_t panelSegment(bool pairs) {
  const uint32_t set = __atomic_load_n(&gPanelSegment, __ATOMIC_RELAXED);
  if (set != 0)
    return set;
  if (pairs)
    return 1024;
  uint32_t s = __atomic_load_n(&gQuadSegment, __ATOMIC_RELAXED);
  if (s == 0) { // a race computes and stores the same value
    s = l1DataKib() >= 48 ? 1024 : 512;
    __atomic_store_n(&gQuadSegment, s, __ATOMIC_RELAXED);
  }
  return s;
}

/// The group-pair order's panels: 4 rows, passed by 3 tokens a pass (the
/// four-group order's: 3 rows, 4 tokens).
constexpr uint32_t kPairRows = 4, kPairTokens = 3, kQuadRows = 3;

/// Rows a panel in either order.
constexpr uint32_t panelRows(bool pairs) {
  return pairs ? kPairRows : kQuadRows;
}

/// The floats of gemmPanel's scratch after the inputs: the panel (3 rows
/// of a segment, 4 in the group-pair order), then the tokens'
/// accumulators (32 floats a row a token) where the group-pair order
/// keeps them, or where K takes more than one segment.
inline uint32_t panelFloats(uint32_t k, uint32_t seg, bool pairs) {
  return panelRows(pairs) * (k < seg ? k : seg);
}
uint64_t panelExtraFloats(uint32_t n_tokens, uint32_t k, uint32_t seg,
                          bool pairs) {
  return panelFloats(k, seg, pairs) +
         (pairs || k > seg ? 32ull * panelRows(pairs) * n_tokens : 0);
}

/// The panel path's distance between two tokens' pre-scaled inputs: k,
/// padded by one cache line where k floats are a multiple of 2 KiB, so the
/// 8 tokens' inputs a pass reads and prefetches do not share one L1 set
/// (4 % on the dense 64-token prefill on Zen 3).
inline uint32_t panelTokenStride(uint32_t k) {
  return k % 512 == 0 ? k + 16 : k;
}

/// One segment [c0, c1) of R panel rows against tokens [t0, t0 + T): the
/// four group passes, each continuing its accumulators from `mem` (unless
/// `first`), then either the results (`last`) or the accumulators back.
template <int R, int T>
void panelTokens(const float *panel, uint32_t len, const float *xs, uint32_t k,
                 uint32_t c0, uint32_t following, bool first, bool last,
                 __m256 *mem, float *y, uint32_t y_ld) {
  __m256 sums[T][4][R];
  for (int q = 0; q < 4; ++q) {
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t)
        acc[r][t] = first ? _mm256_setzero_ps() : mem[(t * 4 + q) * R + r];
    // Group pass q fetches the segment of the q-th token after these.
    const float *next = (uint32_t)q < following
                            ? xs + (uint64_t)(T + q) * k + c0
                            : xs + c0;
    panelGroup<R, T>(panel + 8 * q, len, xs + c0 + 8 * q, k,
                     reinterpret_cast<const char *>(next), acc);
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) {
        if (last)
          sums[t][q][r] = acc[r][t];
        else
          mem[(t * 4 + q) * R + r] = acc[r][t];
      }
  }
  if (last)
    for (int t = 0; t < T; ++t)
      storeRows<R>(sums[t], y + (uint64_t)t * y_ld);
}

template <int R>
void panelTokensAny(uint32_t T, const float *panel, uint32_t len,
                    const float *xs, uint32_t k, uint32_t c0,
                    uint32_t following, bool first, bool last, __m256 *mem,
                    float *y, uint32_t y_ld) {
#define DUCK_PANEL_TOKENS(N)                                                   \
  panelTokens<R, N>(panel, len, xs, k, c0, following, first, last, mem, y, y_ld)
  switch (T) {
  case 4: return DUCK_PANEL_TOKENS(4);
  case 3: return DUCK_PANEL_TOKENS(3);
  case 2: return DUCK_PANEL_TOKENS(2);
  default: return DUCK_PANEL_TOKENS(1);
  }
#undef DUCK_PANEL_TOKENS
}

/// Rows [i, i + R) of one scale tile against all n tokens: each segment of
/// the rows is decoded once into the panel (L1), then the tokens' pre-scaled
/// inputs (xs, ld apart) pass it four at a time. Each weight is read from
/// memory once a step and decoded once for all n tokens. With K beyond one
/// segment, the accumulators wait in `accMem` (n x 4 x R vectors) between
/// segments: stored and reloaded exactly, the FMA chains are unchanged.
template <int R>
void gemmPanelRows(const uint8_t *mag, const uint32_t *sign, const float *xs,
                   uint32_t k, uint32_t ld, uint32_t seg, uint32_t n,
                   float *panel, __m256 *accMem, float *y, uint32_t y_ld,
                   duck_panel_decode_fn decode) {
  for (uint32_t c0 = 0; c0 < k; c0 += seg) {
    const uint32_t c1 = k - c0 < seg ? k : c0 + seg;
    if (decode)
      decode(mag, sign, k, R, c0, c1, panel);
    else
      decodePanel<R>(mag, sign, k, c0, c1, panel);
    for (uint32_t t = 0; t < n; t += 4)
      panelTokensAny<R>(
          n - t < 4 ? n - t : 4, panel, c1 - c0, xs + (uint64_t)t * ld, ld, c0,
          n - t > 4 ? n - t - 4 : 0, c0 == 0, c1 == k,
          accMem + (uint64_t)t * 4 * R, y + (uint64_t)t * y_ld, y_ld);
  }
}

/// Group pass q of one segment [c0, c0 + len) of R panel rows against
/// tokens [t0, t0 + T) (inputs k apart): panelGroup's FMAs, the
/// accumulators continuing from `mem` (unless `first`) and going back to
/// it. `next` and `next` + one token: the pair's cache line of two tokens
/// that pass next, 128 bytes on an iteration. Its own function with the
/// loop inside, and every loop over rows and tokens unrolled, so the
/// accumulators stay in registers from their loads to their stores
/// (through panelGroup's reference the compiler copied them to the stack
/// and back around the loop, 1.10x on the pairs; without the unrolling it
/// still did, 1.05-1.08x more; Zen 3).
template <int R, int T>
__attribute__((noinline)) void
panelPass(int q, const float *panel, uint32_t len, const float *xs, uint32_t k,
          uint32_t c0, const float *next, bool first, __m256 *mem) {
  __m256 acc[R][T];
  __m256 *m = mem + q * R;
  if (first) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t)
        acc[r][t] = _mm256_setzero_ps();
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t)
        acc[r][t] = m[t * 4 * R + r];
  }
  const float *p = panel + 8 * q, *end = p + len, *xp = xs + c0 + 8 * q;
  const char *nx = reinterpret_cast<const char *>(next);
  const uint64_t gap = 4ull * k;
  for (; p < end; p += 32, xp += 32, nx += 128) {
    _mm_prefetch(nx, _MM_HINT_T0);
    _mm_prefetch(nx + gap, _MM_HINT_T0);
    chunkFmas<R, T>(p, len, xp, k, acc);
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      m[t * 4 * R + r] = acc[r][t];
}

template <int R>
void panelPassAny(uint32_t T, int q, const float *panel, uint32_t len,
                  const float *xs, uint32_t k, uint32_t c0, const float *next,
                  bool first, __m256 *mem) {
  switch (T) {
  case 3:
    return panelPass<R, 3>(q, panel, len, xs, k, c0, next, first, mem);
  case 2:
    return panelPass<R, 2>(q, panel, len, xs, k, c0, next, first, mem);
  default:
    return panelPass<R, 1>(q, panel, len, xs, k, c0, next, first, mem);
  }
}

/// gemmPanelRows with the groups outermost, in pairs: each segment of the
/// rows (4 of them, kPairRows) is decoded once, then groups 0 and 1 of
/// every token pass it three tokens at a time (kPairTokens), then groups 2
/// and 3. Groups 0 and 1 read the first cache line of every 128-byte chunk
/// of the panel and of the inputs, 2 and 3 the second, so half the panel
/// stays in L1 while all the tokens pass, and a segment of 1024 columns
/// fits a 32 KiB L1 (half the panel 8 KiB, half of 3 tokens' inputs 6 KiB
/// and of the next 3 coming in 6 KiB; gemmPanelRows needs 44 KiB there):
/// a pass runs 32 chunks, not 16. On Zen 3, 64 tokens, one core, 3 x 4
/// with panelPass: 3072 x 1024 5.78 against 7.05 ms (1.22x), 1024 x 3072
/// 6.77 against 7.61 (1.12x); 4 x 3 (each input read from L2 feeds 4 FMAs,
/// not 3) 1.035x and 1.08x more, two cores 1.04x and 1.11x; bits
/// unchanged. The accumulators of every token wait in `accMem` (n x 4 x R
/// vectors a panel) between passes and are reduced at the end. `panels`
/// panels of R rows (consecutive rows) take each segment in turn, so that
/// with K beyond one segment the tokens' inputs of a segment are read from
/// L2 `panels` times in a row rather than from L3 once a panel.
template <int R>
void gemmPanelRowsByPairs(const uint8_t *mag, const uint32_t *sign,
                          const float *xs, uint32_t k, uint32_t ld,
                          uint32_t seg, uint32_t n, uint32_t panels,
                          float *panel, __m256 *accMem, float *y, uint32_t y_ld,
                          duck_panel_decode_fn decode) {
  const uint64_t accPanel = (uint64_t)n * 4 * R; // vectors a panel waits in
  for (uint32_t c0 = 0; c0 < k; c0 += seg) {
    const uint32_t c1 = k - c0 < seg ? k : c0 + seg;
    for (uint32_t p = 0; p < panels; ++p) {
      const uint8_t *pm = mag + (uint64_t)p * R * k;
      const uint32_t *ps = sign + (uint64_t)p * R * (k / 32);
      __m256 *acc = accMem + p * accPanel;
      if (decode)
        decode(pm, ps, k, R, c0, c1, panel);
      else
        decodePanel<R>(pm, ps, k, c0, c1, panel);
      constexpr uint32_t TG = kPairTokens;
      for (int pair = 0; pair < 4; pair += 2)
        for (uint32_t t = 0; t < n; t += TG) {
          // The tokens after these (or, after the last, the first ones of
          // the next pair): two of them a pass, the pair's cache line.
          const bool more = t + TG < n;
          const float *next = xs + (more ? (uint64_t)(t + TG) * ld : 0) + c0 +
                              8 * (more ? pair : pair + 2);
          for (int q = pair; q < pair + 2; ++q)
            panelPassAny<R>(n - t < TG ? n - t : TG, q, panel, c1 - c0,
                            xs + (uint64_t)t * ld, ld, c0,
                            next + (uint64_t)(q - pair) * 2 * ld, c0 == 0,
                            acc + (uint64_t)t * 4 * R);
        }
    }
  }
  for (uint32_t p = 0; p < panels; ++p)
    for (uint32_t t = 0; t < n; ++t)
      storeRows<R>(*reinterpret_cast<const __m256(*)[4][R]>(
                       accMem + p * accPanel + (uint64_t)t * 4 * R),
                   y + p * R + (uint64_t)t * y_ld);
}

/// 32 e4m3 weights (lane j of group q is weight 4j + q) as fp32 with their
/// signs: byte q moved to the top byte of its 16-bit word, the word shifted
/// right arithmetically by 4 (the sign stays in the word's bit 15, the
/// other 7 bits land at 4..10), then the low word moved up to the high
/// one (groups 0 and 1), and the copies of the sign (bits 27..30) and the
/// bits below 20 masked off. The value is the weight times 2^-120
/// (subnormals included: fp32 denormals then).
///
/// Shifting 16-bit words serves two groups with one shift: nine vector
/// operations a 32-chunk, five of them shifts, where shifting each byte to
/// the top of its dword took eleven and seven. The same bits; on the Zen 5
/// VM (2026-12-07), one core hot 28.8 -> 31.0 Gparam/s in a stand-alone
/// loop, and `duck-bench host` (AVX2, cold, two threads) q/k/v 98.8 -> 92.0
/// us, o_proj 52.4 -> 48.5 (medians of four alternated runs).
struct E4m3Chunk {
  __m256 w[4];
};
/// Groups 1 and 3: bytes 1 and 3 are already their words' top bytes.
inline __m256i e4m3Odd(__m256i v) { return _mm256_srai_epi16(v, 4); }
/// Groups 0 and 2: bytes 0 and 2 moved to their words' tops first.
inline __m256i e4m3Even(__m256i v) {
  return _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4);
}
/// The group in the low words (0 or 1) and in the high words (2 or 3) of
/// e4m3Even's or e4m3Odd's result.
inline __m256 e4m3Low(__m256i h) {
  return _mm256_castsi256_ps(_mm256_and_si256(
      _mm256_slli_epi32(h, 16), _mm256_set1_epi32((int)0x87F00000u)));
}
inline __m256 e4m3High(__m256i h) {
  return _mm256_castsi256_ps(
      _mm256_and_si256(h, _mm256_set1_epi32((int)0x87F00000u)));
}
inline E4m3Chunk decodeE4m3(const uint8_t *p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
  const __m256i even = e4m3Even(v), odd = e4m3Odd(v);
  return {{e4m3Low(even), e4m3Low(odd), e4m3High(even), e4m3High(odd)}};
}

/// fp9's operand (value times 2^-105) from an e4m3 one.
constexpr float kE4m3ToFp9 = 0x1p15f;

/// One e4m3 row against the shift path's pre-scaled input: the products
/// are duck_gemv's times 2^-15, summed in its order; the result has its
/// bits.
inline float dotRowE4m3(const uint8_t *w, const float *xs, uint32_t k) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (uint32_t c = 0; c < k; c += 32) {
    _mm_prefetch(reinterpret_cast<const char *>(w + c + kPrefetchBytes),
                 kWeightsHint);
    const E4m3Chunk d = decodeE4m3(w + c);
    acc0 = _mm256_fmadd_ps(d.w[0], _mm256_load_ps(xs + c), acc0);
    acc1 = _mm256_fmadd_ps(d.w[1], _mm256_load_ps(xs + c + 8), acc1);
    acc2 = _mm256_fmadd_ps(d.w[2], _mm256_load_ps(xs + c + 16), acc2);
    acc3 = _mm256_fmadd_ps(d.w[3], _mm256_load_ps(xs + c + 24), acc3);
  }
  return reduceRow(acc0, acc1, acc2, acc3) * kE4m3ToFp9;
}

/// Groups Q and Q + 2 of one e4m3 row (Q 0: the even groups, 1: the odd
/// ones, each pair decoded from one 16-bit shift) against T tokens
/// (gemmRowPass's shape: 2T accumulators live, the row in L1 for the
/// second pass).
template <int T, int Q>
inline void e4m3RowPass(const uint8_t *w, const float *xs, uint32_t k,
                        __m256 (&sums)[4][4]) {
  __m256 a[T], b[T];
  for (int t = 0; t < T; ++t)
    a[t] = b[t] = _mm256_setzero_ps();
  for (uint32_t c = 0; c < k; c += 32) {
    if (Q == 0)
      _mm_prefetch(reinterpret_cast<const char *>(w + c + kPrefetchBytes),
                   kWeightsHint);
    const __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(w + c));
    const __m256i h = Q == 0 ? e4m3Even(v) : e4m3Odd(v);
    const __m256 wA = e4m3Low(h);
    for (int t = 0; t < T; ++t)
      a[t] = _mm256_fmadd_ps(
          wA, _mm256_load_ps(xs + (uint64_t)t * k + c + 8 * Q), a[t]);
    const __m256 wB = e4m3High(h);
    for (int t = 0; t < T; ++t)
      b[t] = _mm256_fmadd_ps(
          wB, _mm256_load_ps(xs + (uint64_t)t * k + c + 8 * Q + 16), b[t]);
  }
  for (int t = 0; t < T; ++t) {
    sums[Q][t] = a[t];
    sums[Q + 2][t] = b[t];
  }
}

/// One e4m3 row against 2 to 4 tokens (a verify step, a few rows of a
/// batch): each token's FMAs and reduction are dotRowE4m3's.
template <int T>
inline void e4m3RowPasses(const uint8_t *w, const float *xs, uint32_t k,
                          float *y, uint32_t y_ld) {
  __m256 sums[4][4];
  e4m3RowPass<T, 0>(w, xs, k, sums);
  e4m3RowPass<T, 1>(w, xs, k, sums);
  for (int t = 0; t < T; ++t)
    y[(uint64_t)t * y_ld] =
        reduceRow(sums[0][t], sums[1][t], sums[2][t], sums[3][t]) * kE4m3ToFp9;
}

inline uint32_t tileEnd(const duck_fp9_matrix *m, uint32_t r) {
  // First local row of the next scale tile after row r.
  uint32_t t = (r + m->row_phase) / m->scale_rows;
  return (t + 1) * m->scale_rows - m->row_phase;
}

} // namespace

extern "C" {

duck_fp9_matrix duck_fp9_matrix_view(const duck_fp9_desc *desc,
                                     const void *base) {
  duck_fp9_matrix m{};
  duck_fp9_layout l;
  if (duck_fp9_compute_layout(desc, &l) != DUCK_FP9_OK)
    return m;
  const uint8_t *b = static_cast<const uint8_t *>(base);
  m.mag = b + l.mag_offset;
  m.sign = reinterpret_cast<const uint32_t *>(b + l.sign_offset);
  m.scale = reinterpret_cast<const float *>(b + l.scale_offset);
  m.rows = desc->rows;
  m.k = desc->k;
  m.block = desc->block;
  m.scale_rows = desc->scale_rows;
  m.row_phase = desc->row_phase;
  m.kernel = duck_select_kernel(desc->k, desc->block);
  return m;
}

void duck_gemv(const duck_fp9_matrix *m, const float *x, float *y,
               uint32_t row_begin, uint32_t row_end, float *xs,
               duck_decode_path path) {
  const uint32_t k = m->k, bpr = k / m->block;
  float *xn = xs + k; // the negated copy lives right after xs
  const float factor = path == DUCK_DECODE_F16C ? kF16cXFactor : kShiftXFactor;
  uint32_t r = row_begin;
  while (r < row_end) {
    uint32_t end = tileEnd(m, r);
    if (end > row_end)
      end = row_end;
    uint32_t tile = (r + m->row_phase) / m->scale_rows;
    if (path == DUCK_DECODE_F16C)
      prescaleAny<false>(m->block, x, m->scale + (uint64_t)tile * bpr, k,
                         factor, xs, xn);
    else
      prescaleAny<true>(m->block, x, m->scale + (uint64_t)tile * bpr, k,
                        factor, xs, xn);
    float *out = y + (r - row_begin);
    if (path == DUCK_DECODE_SHIFT && m->kernel == DUCK_KERNEL_EXACT32) {
      exactRows<32>(m, xs, r, end, out);
    } else if (path == DUCK_DECODE_SHIFT && m->kernel == DUCK_KERNEL_EXACT64) {
      exactRows<64>(m, xs, r, end, out);
    } else if (path == DUCK_DECODE_SHIFT && m->kernel == DUCK_KERNEL_EXACT128) {
      exactRows<128>(m, xs, r, end, out);
    } else if (path == DUCK_DECODE_F16C) {
      for (uint32_t i = r; i < end; ++i)
        out[i - r] = dotRowF16c(m->mag + (uint64_t)i * k,
                                m->sign + (uint64_t)i * (k / 32), xs, xn, k);
    } else {
      for (uint32_t i = r; i < end; ++i)
        out[i - r] = dotRowShift(m->mag + (uint64_t)i * k,
                                 m->sign + (uint64_t)i * (k / 32), xs, k);
    }
    r = end;
  }
}

static void gemmFew(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
                    uint32_t n_tokens, float *y, uint32_t y_ld,
                    uint32_t row_begin, uint32_t row_end, float *xs);
static void gemmPanel(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
                      uint32_t n_tokens, float *y, uint32_t y_ld,
                      uint32_t row_begin, uint32_t row_end, float *xs,
                      uint64_t xs_floats, duck_panel_decode_fn decode);

void duck_gemm_with_decoder(const duck_fp9_matrix *m, const float *x,
                            uint32_t x_ld, uint32_t n_tokens, float *y,
                            uint32_t y_ld, uint32_t row_begin,
                            uint32_t row_end, float *xs,
                            duck_panel_decode_fn decode) {
  if (n_tokens >= DUCK_GEMM_PANEL_MIN)
    gemmPanel(m, x, x_ld, n_tokens, y, y_ld, row_begin, row_end, xs,
              2ull * n_tokens * m->k, decode);
  else if (n_tokens > 0)
    gemmFew(m, x, x_ld, n_tokens, y, y_ld, row_begin, row_end, xs);
}

void duck_gemm(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
               uint32_t n_tokens, float *y, uint32_t y_ld, uint32_t row_begin,
               uint32_t row_end, float *xs) {
  duck_gemm_with_decoder(m, x, x_ld, n_tokens, y, y_ld, row_begin, row_end, xs,
                         nullptr);
}

/// Pre-scales every token's input for one scale tile in the shift path's
/// permuted order (no negated copy: the GEMM flips the weight's sign, which
/// gives the same product bits as flipping x).
static void prescaleTokens(const duck_fp9_matrix *m, const float *scale,
                           const float *x, uint32_t x_ld, uint32_t n, float *xs,
                           uint32_t xs_ld) {
  const uint32_t k = m->k, bpr = k / m->block;
  for (uint32_t t = 0; t < n; ++t) {
    const float *xt = x + (uint64_t)t * x_ld;
    float *st = xs + (uint64_t)t * xs_ld;
    for (uint32_t b = 0; b < bpr; ++b) {
      const __m256 sf = _mm256_set1_ps(scale[b] * kShiftXFactor);
      for (uint32_t c = b * m->block; c < (b + 1) * m->block; c += 32)
        prescaleChunk32(xt + c, sf, st + c);
    }
  }
}

/// Rows [row_begin, row_end) one scale tile at a time: every token's input
/// pre-scaled for the tile into xs (xs_ld floats apart), then rows(first,
/// end) of the tile.
extern "C++" template <typename Rows>
inline void eachScaleTile(const duck_fp9_matrix *m, const float *x,
                          uint32_t x_ld, uint32_t n_tokens, uint32_t row_begin,
                          uint32_t row_end, float *xs, uint32_t xs_ld,
                          Rows rows) {
  const uint32_t bpr = m->k / m->block;
  for (uint32_t r = row_begin; r < row_end;) {
    const uint32_t end = tileEnd(m, r) < row_end ? tileEnd(m, r) : row_end;
    const uint32_t tile = (r + m->row_phase) / m->scale_rows;
    prescaleTokens(m, m->scale + (uint64_t)tile * bpr, x, x_ld, n_tokens, xs,
                   xs_ld);
    rows(r, end);
    r = end;
  }
}

/// Fewer tokens than a panel pays for: each row decoded in registers for
/// all of them at once (gemmRow's 1 or 2 tokens, gemmRowPasses' 3 or 4).
static void gemmFew(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
                    uint32_t n_tokens, float *y, uint32_t y_ld,
                    uint32_t row_begin, uint32_t row_end, float *xs) {
  const uint32_t k = m->k;
  eachScaleTile(m, x, x_ld, n_tokens, row_begin, row_end, xs, k,
                [&](uint32_t r, uint32_t end) {
    for (uint32_t i = r; i < end; ++i) {
      const uint8_t *mag = m->mag + (uint64_t)i * k;
      const uint32_t *sign = m->sign + (uint64_t)i * (k / 32);
      float *yi = y + (i - row_begin);
      switch (n_tokens) {
      case 4:
        gemmRowPasses<4>(mag, sign, xs, k, yi, y_ld);
        break;
      case 3:
        gemmRowPasses<3>(mag, sign, xs, k, yi, y_ld);
        break;
      case 2: gemmRow<2>(mag, sign, xs, k, yi, y_ld); break;
      default: gemmRow<1>(mag, sign, xs, k, yi, y_ld); break;
      }
    }
  });
}

/// Whether gemmPanel takes the group-pair order: from 16 tokens (below,
/// the four groups a pass are as fast or faster: 8 tokens 2 % on Zen 3;
/// 16 tokens 5 % slower), where `xs_floats` of scratch holds every
/// token's accumulators: the contract's 2 * n * k does for any K of 512
/// and more (the dense and expert FFNs' prefill), not for the smallest K
/// (an expert slice of 64 at tp 32).
inline bool panelByPairs(uint32_t n_tokens, uint32_t k, uint64_t xs_floats) {
  return n_tokens >= 16 &&
         (uint64_t)n_tokens * panelTokenStride(k) +
                 panelExtraFloats(n_tokens, k, panelSegment(true), true) <=
             xs_floats;
}

static void gemmPanel(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
                      uint32_t n_tokens, float *y, uint32_t y_ld,
                      uint32_t row_begin, uint32_t row_end, float *xs,
                      uint64_t xs_floats, duck_panel_decode_fn decode) {
  const uint32_t k = m->k, ld = panelTokenStride(k);
  const bool pairs = panelByPairs(n_tokens, k, xs_floats);
  const uint32_t seg = panelSegment(pairs);
  // After the inputs (n_tokens * ld floats), panelExtraFloats: without the
  // pairs it fits 2 * n_tokens * k floats for n_tokens >= DUCK_GEMM_PANEL_MIN.
  float *panel = xs + (uint64_t)n_tokens * ld;
  __m256 *accMem =
      reinterpret_cast<__m256 *>(panel + panelFloats(k, seg, pairs));
  // With K beyond one segment and the tokens' inputs beyond 512 KiB (an
  // L2 on Zen 2 and 3), up to kPanelBlock panels take each segment in
  // turn, as many as the scratch holds the accumulators of (64 tokens,
  // two cores, Zen 3: 1024 x 3072 1.12x, 192 x 7168 1.29x; where the
  // inputs fit L2 a block is as fast or up to 4 % slower, and with few
  // tokens the weights, streaming from memory, lose their prefetch).
  constexpr uint64_t kPanelBlock = 8;
  const uint32_t R = panelRows(pairs);
  const uint64_t inputs = (uint64_t)n_tokens * ld;
  const uint64_t spare = xs_floats - inputs - panelFloats(k, seg, pairs);
  uint64_t block = 1;
  if (pairs && k > seg && inputs * 4 > (512u << 10))
    block = spare / (32ull * R * n_tokens);
  block = block > kPanelBlock ? kPanelBlock : block;
  eachScaleTile(m, x, x_ld, n_tokens, row_begin, row_end, xs, ld,
                [&](uint32_t r, uint32_t end) {
    for (uint32_t i = r; i < end;) {
      const uint8_t *mag = m->mag + (uint64_t)i * k;
      const uint32_t *sign = m->sign + (uint64_t)i * (k / 32);
      float *yi = y + (i - row_begin);
      const uint32_t rows = end - i < R ? end - i : R;
      const uint64_t whole = rows < R ? 1 : (end - i) / R;
      const uint32_t panels = (uint32_t)(whole < block ? whole : block);
#define DUCK_PAIR_ROWS(N)                                                      \
  gemmPanelRowsByPairs<N>(mag, sign, xs, k, ld, seg, n_tokens, panels, panel,  \
                          accMem, yi, y_ld, decode)
#define DUCK_QUAD_ROWS(N)                                                      \
  gemmPanelRows<N>(mag, sign, xs, k, ld, seg, n_tokens, panel, accMem, yi,     \
                   y_ld, decode)
      if (pairs) {
        switch (rows) {
        case 4:
          DUCK_PAIR_ROWS(4);
          break;
        case 3:
          DUCK_PAIR_ROWS(3);
          break;
        case 2:
          DUCK_PAIR_ROWS(2);
          break;
        default:
          DUCK_PAIR_ROWS(1);
          break;
        }
      } else {
        switch (rows) {
        case 3:
          DUCK_QUAD_ROWS(3);
          break;
        case 2:
          DUCK_QUAD_ROWS(2);
          break;
        default:
          DUCK_QUAD_ROWS(1);
          break;
        }
      }
#undef DUCK_PAIR_ROWS
#undef DUCK_QUAD_ROWS
      i += rows * panels;
    }
  });
}

/// The panel of an e4m3 matrix: the decoded weights as they are (the
/// value times 2^-120; scaling them to fp9's operand here would multiply
/// e4m3 subnormals, fp32 denormals, which costs a microcode assist a
/// vector on Zen 3, where the FMAs take them at full rate). duck_e4m3_gemm
/// scales the results by 2^15 instead.
static void decodePanelE4m3(const uint8_t *mag, const uint32_t *, uint32_t k,
                            uint32_t rows, uint32_t c0, uint32_t c1,
                            float *panel) {
  for (uint32_t r = 0; r < rows; ++r) {
    const uint8_t *m = mag + (uint64_t)r * k;
    float *p = panel + (uint64_t)r * (c1 - c0) - c0;
    for (uint32_t c = c0; c < c1; c += 32) {
      _mm_prefetch(reinterpret_cast<const char *>(m + c + kPrefetchBytes),
                   kWeightsHint);
      const E4m3Chunk d = decodeE4m3(m + c);
      for (int q = 0; q < 4; ++q)
        _mm256_store_ps(p + c + 8 * q, d.w[q]);
    }
  }
}

void duck_e4m3_gemv(const duck_fp9_matrix *m, const float *x, float *y,
                    uint32_t row_begin, uint32_t row_end, float *xs) {
  const uint32_t k = m->k, bpr = k / m->block;
  for (uint32_t r = row_begin; r < row_end;) {
    const uint32_t end = tileEnd(m, r) < row_end ? tileEnd(m, r) : row_end;
    const uint32_t tile = (r + m->row_phase) / m->scale_rows;
    prescaleAny<true>(m->block, x, m->scale + (uint64_t)tile * bpr, k,
                      kShiftXFactor, xs, nullptr);
    for (uint32_t i = r; i < end; ++i)
      y[i - row_begin] = dotRowE4m3(m->mag + (uint64_t)i * k, xs, k);
    r = end;
  }
}

void duck_gemm_set_panel_segment(uint32_t columns) {
  __atomic_store_n(&gPanelSegment, columns, __ATOMIC_RELAXED);
}

uint64_t duck_e4m3_gemm_scratch_floats(uint32_t n_tokens, uint32_t k) {
  // The panel path's inputs, panel and accumulators (gemmPanel).
  const uint64_t panel =
      (uint64_t)n_tokens * panelTokenStride(k) +
      panelExtraFloats(n_tokens, k, panelSegment(true), true);
  const uint64_t contract = 2ull * n_tokens * k;
  return panel > contract ? panel : contract;
}

void duck_e4m3_gemm(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
                    uint32_t n_tokens, float *y, uint32_t y_ld,
                    uint32_t row_begin, uint32_t row_end, float *xs) {
  const uint32_t k = m->k;
  if (n_tokens == 1) {
    duck_e4m3_gemv(m, x, y, row_begin, row_end, xs);
  } else if (n_tokens < DUCK_GEMM_PANEL_MIN) { // each row in registers
    eachScaleTile(m, x, x_ld, n_tokens, row_begin, row_end, xs, k,
                  [&](uint32_t r, uint32_t end) {
                    for (uint32_t i = r; i < end; ++i) {
                      const uint8_t *w = m->mag + (uint64_t)i * k;
                      float *yi = y + (i - row_begin);
                      if (n_tokens == 4)
                        e4m3RowPasses<4>(w, xs, k, yi, y_ld);
                      else if (n_tokens == 3)
                        e4m3RowPasses<3>(w, xs, k, yi, y_ld);
                      else
                        e4m3RowPasses<2>(w, xs, k, yi, y_ld);
                    }
                  });
  } else if (n_tokens > 0) {
    gemmPanel(m, x, x_ld, n_tokens, y, y_ld, row_begin, row_end, xs,
              duck_e4m3_gemm_scratch_floats(n_tokens, k), decodePanelE4m3);
    // Each product was fp9's times 2^-15: the sums back, exactly.
    for (uint32_t t = 0; t < n_tokens; ++t)
      for (uint32_t r = 0; r < row_end - row_begin; ++r)
        y[(uint64_t)t * y_ld + r] *= kE4m3ToFp9;
  }
}

} // extern "C"
