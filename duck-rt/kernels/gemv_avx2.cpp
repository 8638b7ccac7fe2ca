// fp9 GEMV and GEMM kernels, AVX2 + FMA (+ F16C for the alternative decode
// path). See docs/fp9.md for the arithmetic contract these implement.
//
// Every shift-path kernel accumulates one row in the same canonical order,
// so they (general, exact, GEMM tiles) give bit-identical results: 32
// weights per sign word, loaded as one 32-byte vector whose dword lane j
// holds weights 4j..4j+3; accumulator acc[q] takes lane j = weight 32c+4j+q
// (one shift and one mask per group, no shuffle); then (acc0+acc1)+
// (acc2+acc3), then the hadd pattern ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)),
// times 2^3. The pre-scaled input is stored in the same permuted order. The
// F16C path (a benchmark alternative) reads weights in natural order.
#include "duck_rt/kernels.h"

#include <immintrin.h>

namespace {

constexpr float kShiftXFactor = 0x1p102f; // 2^DUCK_FP9_SHIFT_X_LOG2
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

/// Shift path: 32 weights (one sign word) decoded into four groups; lane j
/// of group q is weight 4j + q. w[q] holds the magnitudes as fp32 bits
/// (value * 2^-105), s[q] has the weight's sign in bit 31 (don't-care
/// below, for a blend or a mask).
struct Chunk32 {
  __m256 w[4];
  __m256 s[4];
};

inline Chunk32 decodeChunk(const uint8_t *mag, uint32_t word) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(mag));
  const __m256i mask = _mm256_set1_epi32(0x0FF00000);
  Chunk32 c;
  c.w[0] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 20), mask));
  c.w[1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 12), mask));
  c.w[2] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 4), mask));
  c.w[3] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srli_epi32(v, 4), mask));
  // Sign bit 4j+q must reach bit 31 of lane j: shift by 31-4j-q. Group 3
  // needs 28-4j; each lower group one more, which is an add to itself.
  const __m256i base = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);
  __m256i t3 = _mm256_sllv_epi32(_mm256_set1_epi32((int)word), base);
  __m256i t2 = _mm256_add_epi32(t3, t3);
  __m256i t1 = _mm256_add_epi32(t2, t2);
  __m256i t0 = _mm256_add_epi32(t1, t1);
  c.s[0] = _mm256_castsi256_ps(t0);
  c.s[1] = _mm256_castsi256_ps(t1);
  c.s[2] = _mm256_castsi256_ps(t2);
  c.s[3] = _mm256_castsi256_ps(t3);
  return c;
}

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

/// Accumulates 32 weights of one row into acc0..acc3 (shift path). The
/// sign flips the decoded weight (an AND and an XOR) rather than choosing
/// between the pre-scaled input and its negation with a blend: the product
/// has the same bits either way, and a variable blend costs up to three
/// uops and a second load on recent cores.
#define DUCK_ACC32(mag, word, xs, acc0, acc1, acc2, acc3)                      \
  do {                                                                         \
    const Chunk32 d_ = decodeChunk((mag), (word));                             \
    const __m256 nz_ = _mm256_set1_ps(-0.0f);                                  \
    acc0 = _mm256_fmadd_ps(                                                    \
        _mm256_xor_ps(d_.w[0], _mm256_and_ps(d_.s[0], nz_)),                   \
        _mm256_load_ps(xs), acc0);                                             \
    acc1 = _mm256_fmadd_ps(                                                    \
        _mm256_xor_ps(d_.w[1], _mm256_and_ps(d_.s[1], nz_)),                   \
        _mm256_load_ps((xs) + 8), acc1);                                       \
    acc2 = _mm256_fmadd_ps(                                                    \
        _mm256_xor_ps(d_.w[2], _mm256_and_ps(d_.s[2], nz_)),                   \
        _mm256_load_ps((xs) + 16), acc2);                                      \
    acc3 = _mm256_fmadd_ps(                                                    \
        _mm256_xor_ps(d_.w[3], _mm256_and_ps(d_.s[3], nz_)),                   \
        _mm256_load_ps((xs) + 24), acc3);                                      \
  } while (0)

/// One row, shift path.
inline float dotRowShift(const uint8_t *mag, const uint32_t *sign,
                         const float *xs, uint32_t k) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (uint32_t c = 0; c < k; c += 32) {
    _mm_prefetch(reinterpret_cast<const char *>(mag + c + 4096), _MM_HINT_T0);
    DUCK_ACC32(mag + c, sign[c / 32], xs + c, acc0, acc1, acc2, acc3);
  }
  return reduceRow(acc0, acc1, acc2, acc3);
}

/// One row, F16C path (same accumulation order as the shift path).
inline float dotRowF16c(const uint8_t *mag, const uint32_t *sign,
                        const float *xs, const float *xn, uint32_t k) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  const __m256i s0 = shiftCounts(0), s1 = shiftCounts(1), s2 = shiftCounts(2),
                s3 = shiftCounts(3);
  for (uint32_t c = 0; c < k; c += 32) {
    _mm_prefetch(reinterpret_cast<const char *>(mag + c + 4096), _MM_HINT_T0);
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
    DUCK_ACC32(mag + c, sign[c / 32], xs + c, acc0, acc1, acc2, acc3);
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
    _mm_prefetch(reinterpret_cast<const char *>(mag + 4 * R * K), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char *>(mag + 4 * R * K + 64),
                 _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char *>(mag + 4 * R * K + 128),
                 _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char *>(mag + 4 * R * K + 192),
                 _MM_HINT_T0);
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

/// One weight row against T tokens (a tile of up to DUCK_N_TILE): the row is decoded once and the sign flips the weight, so each
/// token's sum has the same bits as duck_gemv's. xs holds the tokens'
/// pre-scaled inputs k apart; y[t * y_ld] receives token t's result.
template <int T>
inline void gemmRow(const uint8_t *mag, const uint32_t *sign, const float *xs,
                    uint32_t k, float *y, uint32_t y_ld) {
  const __m256 negZero = _mm256_set1_ps(-0.0f);
  const __m256i mask = _mm256_set1_epi32(0x0FF00000);
  const __m256i base = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);
  __m256 acc[T][4];
  for (int t = 0; t < T; ++t)
    for (int q = 0; q < 4; ++q)
      acc[t][q] = _mm256_setzero_ps();
  for (uint32_t c = 0; c < k; c += 32) {
    // The GEMV's prefetch distance: weights stream from DRAM in prefill.
    _mm_prefetch(reinterpret_cast<const char *>(mag + c + 4096), _MM_HINT_T0);
    // decodeChunk's arithmetic, one group at a time from q = 3 down (its
    // sign shift is the smallest), so only one decoded group is live: the
    // 4 x T accumulators then fit the register file.
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(mag + c));
    __m256i sg = _mm256_sllv_epi32(_mm256_set1_epi32((int)sign[c / 32]), base);
    for (int q = 3; q >= 0; --q) {
      __m256i bits = q == 3 ? _mm256_srli_epi32(v, 4)
                            : _mm256_slli_epi32(v, 20 - 8 * q);
      __m256 w = _mm256_castsi256_ps(_mm256_and_si256(bits, mask));
      w = _mm256_xor_ps(w, _mm256_and_ps(_mm256_castsi256_ps(sg), negZero));
      for (int t = 0; t < T; ++t)
        acc[t][q] = _mm256_fmadd_ps(
            w, _mm256_load_ps(xs + (uint64_t)t * k + c + 8 * q), acc[t][q]);
      sg = _mm256_add_epi32(sg, sg);
    }
  }
  for (int t = 0; t < T; ++t)
    y[(uint64_t)t * y_ld] = reduceRow(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
}

/// One pass of gemmRowsGroups over chunks [c0, c1) of a row: group Q
/// (lane j = weight 32c + 4j + Q) against T tokens; acc[t] is token t's
/// accumulator for that group, carried in memory from the previous
/// segment (canonical order: c ascending).
template <int Q, int T>
inline void gemmGroupSegment(const uint8_t *mag, const uint32_t *sign,
                             const float *xs, uint32_t k, uint32_t c0,
                             uint32_t c1, __m256 *accMem) {
  const __m256 negZero = _mm256_set1_ps(-0.0f);
  const __m256i mask = _mm256_set1_epi32(0x0FF00000);
  // Sign bit 4j + Q of the word to bit 31 of lane j.
  const __m256i sgn = _mm256_setr_epi32(31 - Q, 27 - Q, 23 - Q, 19 - Q,
                                        15 - Q, 11 - Q, 7 - Q, 3 - Q);
  __m256 acc[T];
  for (int t = 0; t < T; ++t)
    acc[t] = accMem[t];
  for (uint32_t c = c0; c < c1; c += 32) {
    if (Q == 0) // the first pass streams the row; the others find it in L1
      _mm_prefetch(reinterpret_cast<const char *>(mag + c + 4096), _MM_HINT_T0);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(mag + c));
    const __m256i bits = Q == 3 ? _mm256_srli_epi32(v, 4)
                                : _mm256_slli_epi32(v, 20 - 8 * Q);
    __m256 w = _mm256_castsi256_ps(_mm256_and_si256(bits, mask));
    const __m256i s = _mm256_sllv_epi32(_mm256_set1_epi32((int)sign[c / 32]), sgn);
    w = _mm256_xor_ps(w, _mm256_and_ps(_mm256_castsi256_ps(s), negZero));
    for (int t = 0; t < T; ++t)
      acc[t] = _mm256_fmadd_ps(
          w, _mm256_load_ps(xs + (uint64_t)t * k + c + 8 * Q), acc[t]);
  }
  for (int t = 0; t < T; ++t)
    accMem[t] = acc[t];
}

/// Rows [i0, i1) (at most kGroupRows) against T tokens (4 to 8): each
/// weight is decoded one accumulator group at a time (four passes over a
/// row segment, the first from memory, the rest from L1; about 5 ALU ops
/// a group for T FMAs, where gemmRow decodes all four groups for at most
/// 3 tokens, since the four accumulators a token needs fill the
/// registers). K goes in segments whose T pre-scaled inputs fit L1, every
/// row of the block taking a segment before the next. Each accumulator
/// sees the same operations in the same order as in gemmRow and duck_gemv,
/// so every token's result has the same bits.
constexpr uint32_t kGroupRows = 8;
constexpr uint32_t kGroupSegment = 1024; // K a segment: 8 tokens x 4 KiB

template <int T>
void gemmRowsGroups(const uint8_t *mag, const uint32_t *sign, uint32_t i0,
                    uint32_t i1, const float *xs, uint32_t k, float *y,
                    uint32_t y_ld) {
  __m256 acc[kGroupRows][4][T];
  for (uint32_t i = 0; i < i1 - i0; ++i)
    for (int q = 0; q < 4; ++q)
      for (int t = 0; t < T; ++t)
        acc[i][q][t] = _mm256_setzero_ps();
  for (uint32_t c0 = 0; c0 < k; c0 += kGroupSegment) {
    const uint32_t c1 = k - c0 < kGroupSegment ? k : c0 + kGroupSegment;
    for (uint32_t i = i0; i < i1; ++i) {
      const uint8_t *m = mag + (uint64_t)i * k;
      const uint32_t *s = sign + (uint64_t)i * (k / 32);
      gemmGroupSegment<0, T>(m, s, xs, k, c0, c1, acc[i - i0][0]);
      gemmGroupSegment<1, T>(m, s, xs, k, c0, c1, acc[i - i0][1]);
      gemmGroupSegment<2, T>(m, s, xs, k, c0, c1, acc[i - i0][2]);
      gemmGroupSegment<3, T>(m, s, xs, k, c0, c1, acc[i - i0][3]);
    }
  }
  for (uint32_t i = 0; i < i1 - i0; ++i)
    for (int t = 0; t < T; ++t)
      y[(uint64_t)t * y_ld + i] =
          reduceRow(acc[i][0][t], acc[i][1][t], acc[i][2][t], acc[i][3][t]);
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

/// Token chunk of one GEMM pass: the pre-scaled inputs of a chunk (8 x K
/// floats) stay in L1/L2 while every row of the weight tile streams past
/// (16 tokens a chunk measured ~10% slower a token: their inputs spill
/// L1 once K is 1024).
constexpr uint32_t kGemmTokenChunk = DUCK_GEMM_TOKEN_CHUNK;
static_assert(kGemmTokenChunk <= 8, "gemmChunk's tiles go up to 8 tokens");

static void gemmChunk(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
                      uint32_t n_tokens, float *y, uint32_t y_ld,
                      uint32_t row_begin, uint32_t row_end, float *xs);

void duck_gemm(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
               uint32_t n_tokens, float *y, uint32_t y_ld, uint32_t row_begin,
               uint32_t row_end, float *xs) {
  for (uint32_t t = 0; t < n_tokens; t += kGemmTokenChunk) {
    uint32_t n = n_tokens - t < kGemmTokenChunk ? n_tokens - t : kGemmTokenChunk;
    gemmChunk(m, x + (uint64_t)t * x_ld, x_ld, n, y + (uint64_t)t * y_ld, y_ld,
              row_begin, row_end, xs);
  }
}

static void gemmChunk(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
                      uint32_t n_tokens, float *y, uint32_t y_ld,
                      uint32_t row_begin, uint32_t row_end, float *xs) {
  const uint32_t k = m->k, bpr = k / m->block;
  uint32_t r = row_begin;
  while (r < row_end) {
    uint32_t end = tileEnd(m, r);
    if (end > row_end)
      end = row_end;
    uint32_t tile = (r + m->row_phase) / m->scale_rows;
    const float *scale = m->scale + (uint64_t)tile * bpr;
    // Pre-scale every token in the shift path's permuted order (no negated
    // copy: GEMM flips the weight's sign, which gives the same product bits
    // as flipping x, so results equal duck_gemv's).
    for (uint32_t t = 0; t < n_tokens; ++t) {
      const float *xt = x + (uint64_t)t * x_ld;
      float *st = xs + (uint64_t)t * k;
      for (uint32_t b = 0; b < bpr; ++b) {
        const __m256 sf = _mm256_set1_ps(scale[b] * kShiftXFactor);
        for (uint32_t c = b * m->block; c < (b + 1) * m->block; c += 32)
          prescaleChunk32(xt + c, sf, st + c);
      }
    }
    // Four or more tokens: blocks of rows, one tile of all the tokens.
    if (n_tokens >= 4) {
      for (uint32_t i0 = r; i0 < end; i0 += kGroupRows) {
        const uint32_t i1 = end - i0 < kGroupRows ? end : i0 + kGroupRows;
        float *yi = y + (i0 - row_begin);
        switch (n_tokens) {
        case 4: gemmRowsGroups<4>(m->mag, m->sign, i0, i1, xs, k, yi, y_ld); break;
        case 5: gemmRowsGroups<5>(m->mag, m->sign, i0, i1, xs, k, yi, y_ld); break;
        case 6: gemmRowsGroups<6>(m->mag, m->sign, i0, i1, xs, k, yi, y_ld); break;
        case 7: gemmRowsGroups<7>(m->mag, m->sign, i0, i1, xs, k, yi, y_ld); break;
        default: gemmRowsGroups<8>(m->mag, m->sign, i0, i1, xs, k, yi, y_ld); break;
        }
      }
      r = end;
      continue;
    }
    for (uint32_t i = r; i < end; ++i) {
      const uint8_t *mag = m->mag + (uint64_t)i * k;
      const uint32_t *sign = m->sign + (uint64_t)i * (k / 32);
      float *yi = y + (i - row_begin);
      // Fewer: one tile with all four groups decoded at once (at most 12
      // accumulators, what the register file holds beside the decode).
      switch (n_tokens) {
      case 3: gemmRow<3>(mag, sign, xs, k, yi, y_ld); break;
      case 2: gemmRow<2>(mag, sign, xs, k, yi, y_ld); break;
      default: gemmRow<1>(mag, sign, xs, k, yi, y_ld); break;
      }
    }
    r = end;
  }
}

} // extern "C"
