//===- HostFp9Avx512.cpp - the host's fp9, e4m3 and bf16 GEMV, AVX-512 ---===//
//
// Host matrices (attention projections, an fp9 LM head, MLA) are read with
// this GEMV when the host CPU has AVX-512F (ducks stay AVX2: duck-rt's
// gemv_avx2.cpp); an FP8 checkpoint's own matrices as their e4m3 bytes
// (E4m3Decoder, duck_e4m3_gemv's operands), others as fp9. It does the
// very arithmetic of the AVX2 shift path, lane for lane, so its results
// are bit-identical to duck_gemv and duck_gemm (and prefill still equals
// decode):
//
//  - the AVX2 kernel keeps four accumulators acc[q] whose lane j takes
//    weight 32c + 4j + q; here one zmm holds acc[0] | acc[1] and another
//    acc[2] | acc[3], each lane doing the same FMA on the same operands;
//  - a weight is decoded by the same shift and mask (a rotate whose
//    wrapped bits fall outside the mask), its sign flipped by the same
//    XOR (one ternary-logic op instead of an AND and an XOR);
//  - the row ends with (acc0 + acc1) + (acc2 + acc3) and the same
//    horizontal pattern.
//
// Per 32 weights that is about 11 vector uops against the AVX2 kernel's
// 26, so the host's share of a token is read at memory speed instead of
// being bound by the decode. From kFp9Avx512PanelMinTokens tokens on, the panel
// GEMM: this file's decode fills the panel, and its multiply-adds are 512
// bits wide, on the same lanes as the AVX2 panel's.
//===----------------------------------------------------------------------===//
#include "duck/runtime/engine/HostKernels.h"

#include <immintrin.h>

#include <cstdlib>
#include <cstring>

namespace duck::runtime {
namespace {

constexpr float kShiftXFactor = 0x1p102f; // 2^DUCK_FP9_SHIFT_X_LOG2
constexpr float kAccFactor = 8.0f;        // 2^DUCK_FP9_ACC_LOG2
static_assert(DUCK_FP9_SHIFT_X_LOG2 == 102 && DUCK_FP9_ACC_LOG2 == 3,
              "constants out of sync with duck_rt/fp9.h");

/// The input of one row tile, pre-scaled per K-block and stored in the
/// shift path's order (position 8q + j of a 32-chunk holds element 4j + q):
/// x * (scale * 2^102), as the AVX2 kernel computes it.
void Prescale(const float *x, const float *scale, uint32_t k, uint32_t block,
              float *xs) {
  // Output lane p of a 32-chunk reads input element 4 (p % 8) + p / 8.
  alignas(64) int32_t lo[16], hi[16];
  for (int p = 0; p < 16; ++p) {
    lo[p] = 4 * (p % 8) + p / 8;
    hi[p] = 4 * ((p + 16) % 8) + (p + 16) / 8;
  }
  const __m512i ilo = _mm512_load_si512(lo), ihi = _mm512_load_si512(hi);
  for (uint32_t b = 0; b < k / block; ++b) {
    const __m512 sf = _mm512_set1_ps(scale[b] * kShiftXFactor);
    for (uint32_t c = b * block; c < (b + 1) * block; c += 32) {
      const __m512 a = _mm512_mul_ps(_mm512_loadu_ps(x + c), sf);
      const __m512 d = _mm512_mul_ps(_mm512_loadu_ps(x + c + 16), sf);
      _mm512_store_ps(xs + c, _mm512_permutex2var_ps(a, ilo, d));
      _mm512_store_ps(xs + c + 16, _mm512_permutex2var_ps(a, ihi, d));
    }
  }
}

inline __m512i Lanes(int32_t a, int32_t stepA, int32_t b, int32_t stepB) {
  return _mm512_setr_epi32(a, a - stepA, a - 2 * stepA, a - 3 * stepA,
                           a - 4 * stepA, a - 5 * stepA, a - 6 * stepA,
                           a - 7 * stepA, b, b - stepB, b - 2 * stepB,
                           b - 3 * stepB, b - 4 * stepB, b - 5 * stepB,
                           b - 6 * stepB, b - 7 * stepB);
}

/// The decode of one 32-chunk into the two zmm of the file comment: chunk
/// `c` of a row's magnitudes and sign words. kPost multiplies each row's
/// reduced sum (fp9's operands need none).
struct Fp9Decoder {
  static constexpr float kPost = 1.0f;
  const __m512i rotA = Lanes(20, 0, 12, 0), rotB = Lanes(4, 0, 28, 0);
  const __m512i sgnA = Lanes(31, 4, 30, 4), sgnB = Lanes(29, 4, 28, 4);
  const __m512i magMask = _mm512_set1_epi32(0x0FF00000);
  const __m512i signBit = _mm512_set1_epi32((int32_t)0x80000000u);
  inline void Decode(const uint8_t *mag, const uint32_t *sign, uint32_t c,
                     __m512 *wA, __m512 *wB) const {
    const __m512i v = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(mag + c)));
    const __m512i w = _mm512_set1_epi32((int32_t)sign[c / 32]);
    const __m512i mA = _mm512_and_si512(_mm512_rolv_epi32(v, rotA), magMask);
    const __m512i mB = _mm512_and_si512(_mm512_rolv_epi32(v, rotB), magMask);
    *wA = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        mA, _mm512_sllv_epi32(w, sgnA), signBit, 0x78));
    *wB = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        mB, _mm512_sllv_epi32(w, sgnB), signBit, 0x78));
  }
};

/// An FP8 checkpoint's matrix kept as its e4m3 bytes (duck_e4m3_gemv's
/// operands, lane for lane): byte q of lane j moved to the top by a
/// variable shift (24 - 8q), shifted right arithmetically by 4 and masked,
/// the weight with its sign times 2^-120; no sign plane. 6 vector
/// operations a 32-chunk where fp9 takes 8 and a broadcast, 1 byte a
/// weight where fp9 takes 1.125. Each product is fp9's times 2^-15, so a
/// row's reduced sum times 2^15 has fp9's bits.
struct E4m3Decoder {
  static constexpr float kPost = 0x1p15f;
  const __m512i shA = Lanes(24, 0, 16, 0), shB = Lanes(8, 0, 0, 0);
  const __m512i keep = _mm512_set1_epi32((int32_t)0x87F00000u);
  inline void Decode(const uint8_t *mag, const uint32_t *, uint32_t c,
                     __m512 *wA, __m512 *wB) const {
    const __m512i v = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(mag + c)));
    *wA = _mm512_castsi512_ps(_mm512_and_si512(
        _mm512_srai_epi32(_mm512_sllv_epi32(v, shA), 4), keep));
    *wB = _mm512_castsi512_ps(_mm512_and_si512(
        _mm512_srai_epi32(_mm512_sllv_epi32(v, shB), 4), keep));
  }
};

/// The AVX2 kernel's reduction of one row's accumulators.
inline float Reduce(__m512 a01, __m512 a23) {
  const __m256 s01 = _mm256_add_ps(_mm512_castps512_ps256(a01),
                                   _mm512_extractf32x8_ps(a01, 1));
  const __m256 s23 = _mm256_add_ps(_mm512_castps512_ps256(a23),
                                   _mm512_extractf32x8_ps(a23, 1));
  const __m256 v = _mm256_add_ps(s01, s23);
  __m256 h = _mm256_hadd_ps(v, v);
  h = _mm256_hadd_ps(h, h);
  const __m128 r =
      _mm_add_ss(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  return _mm_cvtss_f32(r) * kAccFactor;
}

/// Reduce, then the decoder's kPost (the e4m3 sums back to fp9's, exactly).
template <class Dec> inline float ReduceFor(__m512 a01, __m512 a23) {
  const float s = Reduce(a01, a23);
  if constexpr (Dec::kPost != 1.0f)
    return s * Dec::kPost;
  return s;
}

/// GEMM rows [i0, i1) (at most kRows) against T tokens whose pre-scaled
/// inputs are k apart in xs: each chunk is decoded once for all T; K goes
/// in segments whose inputs stay in L1 while the rows of the block take
/// them, the accumulators carried in memory between segments (the order
/// of every accumulator's operations stays the GEMV's).
constexpr uint32_t kRows = 8, kSegment = 1024;

template <class Dec, int T>
void GemmRows(const duck_fp9_matrix *m, uint32_t i0, uint32_t i1,
              const float *xs, float *y, uint32_t y_ld) {
  const uint32_t k = m->k;
  const Dec dec;
  __m512 acc[kRows][2][T];
  for (uint32_t i = 0; i < i1 - i0; ++i)
    for (int t = 0; t < T; ++t)
      acc[i][0][t] = acc[i][1][t] = _mm512_setzero_ps();
  for (uint32_t c0 = 0; c0 < k; c0 += kSegment) {
    const uint32_t c1 = k - c0 < kSegment ? k : c0 + kSegment;
    for (uint32_t i = i0; i < i1; ++i) {
      const uint8_t *mag = m->mag + (uint64_t)i * k;
      const uint32_t *sign = m->sign + (uint64_t)i * (k / 32);
      __m512 a01[T], a23[T];
      for (int t = 0; t < T; ++t) {
        a01[t] = acc[i - i0][0][t];
        a23[t] = acc[i - i0][1][t];
      }
      for (uint32_t c = c0; c < c1; c += 32) {
        _mm_prefetch(reinterpret_cast<const char *>(mag + c + 4096),
                     _MM_HINT_T0);
        __m512 wA, wB;
        dec.Decode(mag, sign, c, &wA, &wB);
        for (int t = 0; t < T; ++t) {
          a01[t] = _mm512_fmadd_ps(wA, _mm512_load_ps(xs + (uint64_t)t * k + c),
                                   a01[t]);
          a23[t] = _mm512_fmadd_ps(
              wB, _mm512_load_ps(xs + (uint64_t)t * k + c + 16), a23[t]);
        }
      }
      for (int t = 0; t < T; ++t) {
        acc[i - i0][0][t] = a01[t];
        acc[i - i0][1][t] = a23[t];
      }
    }
  }
  for (uint32_t i = 0; i < i1 - i0; ++i)
    for (int t = 0; t < T; ++t)
      y[(uint64_t)t * y_ld + i] = ReduceFor<Dec>(acc[i][0][t], acc[i][1][t]);
}

/// One row: see the file comment.
template <class Dec>
inline float DotRow(const Dec &dec, const uint8_t *mag, const uint32_t *sign,
                    const float *xs, uint32_t k) {
  __m512 a01 = _mm512_setzero_ps(), a23 = a01;
  for (uint32_t c = 0; c < k; c += 32) {
    _mm_prefetch(reinterpret_cast<const char *>(mag + c + 4096), _MM_HINT_T0);
    __m512 wA, wB;
    dec.Decode(mag, sign, c, &wA, &wB);
    a01 = _mm512_fmadd_ps(wA, _mm512_load_ps(xs + c), a01);
    a23 = _mm512_fmadd_ps(wB, _mm512_load_ps(xs + c + 16), a23);
  }
  return ReduceFor<Dec>(a01, a23);
}

/// The GEMV over rows [row_begin, row_end), a scale tile at a time.
template <class Dec>
void Gemv(const duck_fp9_matrix *m, const float *x, float *y,
          uint32_t row_begin, uint32_t row_end, float *xs) {
  const uint32_t k = m->k, bpr = k / m->block;
  for (uint32_t r = row_begin; r < row_end;) {
    const uint32_t tile = (r + m->row_phase) / m->scale_rows;
    uint32_t end = (tile + 1) * m->scale_rows - m->row_phase;
    if (end > row_end)
      end = row_end;
    Prescale(x, m->scale + (uint64_t)tile * bpr, k, m->block, xs);
    const Dec dec;
    for (uint32_t i = r; i < end; ++i)
      y[i - row_begin] = DotRow(dec, m->mag + (uint64_t)i * k,
                                m->sign + (uint64_t)i * (k / 32), xs, k);
    r = end;
  }
}

using GemmRowsFn = void (*)(const duck_fp9_matrix *, uint32_t, uint32_t,
                           const float *, float *, uint32_t);
/// Tokens a tile: the host calls this GEMM below kFp9Avx512PanelMinTokens
/// tokens only (from there the AVX2 panel GEMM is FMA-bound and faster).
constexpr uint32_t kTileTokens = 8;
template <class Dec>
constexpr GemmRowsFn kGemmRows[kTileTokens] = {
    GemmRows<Dec, 1>, GemmRows<Dec, 2>, GemmRows<Dec, 3>, GemmRows<Dec, 4>,
    GemmRows<Dec, 5>, GemmRows<Dec, 6>, GemmRows<Dec, 7>, GemmRows<Dec, 8>};

/// A panel of `rows` rows' chunks [c0, c1) decoded (the e4m3 weights as
/// they are: see E4m3Decoder; the results take kPost).
template <class Dec>
void DecodePanel(const uint8_t *mag, const uint32_t *sign, uint32_t k,
                 uint32_t rows, uint32_t c0, uint32_t c1, float *panel) {
  const Dec dec;
  const uint32_t len = c1 - c0;
  for (uint32_t r = 0; r < rows; ++r) {
    const uint8_t *m = mag + (uint64_t)r * k;
    const uint32_t *s = sign + (uint64_t)r * (k / 32);
    float *p = panel + (uint64_t)r * len - c0;
    for (uint32_t c = c0; c < c1; c += 32) {
      _mm_prefetch(reinterpret_cast<const char *>(m + c + 4096), _MM_HINT_T0);
      __m512 wA, wB; // positions 0-15 (q = 0, 1) and 16-31 (q = 2, 3)
      dec.Decode(m, s, c, &wA, &wB);
      _mm512_storeu_ps(p + c, wA);
      _mm512_storeu_ps(p + c + 16, wB);
    }
  }
}

/// Tiles of up to kTileTokens tokens, each chunk decoded in registers.
template <class Dec>
void GemmTiles(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
               uint32_t n_tokens, float *y, uint32_t y_ld, uint32_t row_begin,
               uint32_t row_end, float *xs) {
  const uint32_t k = m->k, bpr = k / m->block;
  for (uint32_t t0 = 0; t0 < n_tokens; t0 += kTileTokens) {
    const uint32_t n =
        n_tokens - t0 < kTileTokens ? n_tokens - t0 : kTileTokens;
    for (uint32_t r = row_begin; r < row_end;) {
      const uint32_t tile = (r + m->row_phase) / m->scale_rows;
      uint32_t end = (tile + 1) * m->scale_rows - m->row_phase;
      if (end > row_end)
        end = row_end;
      for (uint32_t t = 0; t < n; ++t)
        Prescale(x + (uint64_t)(t0 + t) * x_ld, m->scale + (uint64_t)tile * bpr,
                 k, m->block, xs + (uint64_t)t * k);
      for (uint32_t i0 = r; i0 < end; i0 += kRows) {
        const uint32_t i1 = end - i0 < kRows ? end : i0 + kRows;
        kGemmRows<Dec>[n - 1](m, i0, i1, xs,
                              y + (uint64_t)t0 * y_ld + (i0 - row_begin), y_ld);
      }
      r = end;
    }
  }
}

/// The panel GEMM's tiles: kPanelRows decoded rows against up to
/// kPanelTokens tokens a pass, two zmm accumulators a (row, token) pair
/// (24 of the 32 registers, with 4 weights and an input beside them; 4 x 3
/// measured a little faster than 3 x 4 and 6 x 2: each input loaded
/// serves more rows).
constexpr uint32_t kPanelRows = 4, kPanelTokens = 3, kPanelSegment = 1024;

/// One pass of the panel: R decoded rows (`len` columns of segment c0, rows
/// `len` apart) against T tokens (pre-scaled inputs k apart). Each
/// accumulator takes its chunks in order, the GEMV's order, so each result
/// has the GEMV's bits; between segments the accumulators wait in `mem`.
template <class Dec, int R, int T>
void PanelPass(const float *panel, uint32_t len, const float *xs, uint32_t k,
               uint32_t c0, bool first, bool last, __m512 *mem, float *y,
               uint32_t y_ld) {
  __m512 acc[R][T][2];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < 2; ++h)
        acc[r][t][h] =
            first ? _mm512_setzero_ps() : mem[(t * kPanelRows + r) * 2 + h];
  for (uint32_t c = 0; c < len; c += 32)
    for (int h = 0; h < 2; ++h) {
      __m512 w[R];
      for (int r = 0; r < R; ++r)
        w[r] = _mm512_load_ps(panel + (uint64_t)r * len + c + 16 * h);
      for (int t = 0; t < T; ++t) {
        const __m512 xv =
            _mm512_load_ps(xs + (uint64_t)t * k + c0 + c + 16 * h);
        for (int r = 0; r < R; ++r)
          acc[r][t][h] = _mm512_fmadd_ps(w[r], xv, acc[r][t][h]);
      }
    }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      if (last)
        y[(uint64_t)t * y_ld + r] = ReduceFor<Dec>(acc[r][t][0], acc[r][t][1]);
      else
        for (int h = 0; h < 2; ++h)
          mem[(t * kPanelRows + r) * 2 + h] = acc[r][t][h];
    }
}

template <class Dec, int R>
void PanelPassAny(uint32_t T, const float *panel, uint32_t len,
                  const float *xs, uint32_t k, uint32_t c0, bool first,
                  bool last, __m512 *mem, float *y, uint32_t y_ld) {
  switch (T) {
  case 3: return PanelPass<Dec, R, 3>(panel, len, xs, k, c0, first, last, mem, y, y_ld);
  case 2: return PanelPass<Dec, R, 2>(panel, len, xs, k, c0, first, last, mem, y, y_ld);
  default: return PanelPass<Dec, R, 1>(panel, len, xs, k, c0, first, last, mem, y, y_ld);
  }
}

template <class Dec>
void GemmPanel(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
               uint32_t n_tokens, float *y, uint32_t y_ld, uint32_t row_begin,
               uint32_t row_end, float *xs) {
  const uint32_t k = m->k, bpr = k / m->block;
  // Scratch (Fp9GemmPanelAvx512ScratchFloats): the tokens' pre-scaled
  // inputs (n x k), then the panel (kPanelRows x one segment), then, when
  // K takes more than one segment, the accumulators between segments
  // (n x kPanelRows x 2 zmm).
  float *panel = xs + (uint64_t)n_tokens * k;
  __m512 *mem = reinterpret_cast<__m512 *>(panel + kPanelRows * kPanelSegment);
  for (uint32_t r = row_begin; r < row_end;) {
    const uint32_t tile = (r + m->row_phase) / m->scale_rows;
    uint32_t end = (tile + 1) * m->scale_rows - m->row_phase;
    if (end > row_end)
      end = row_end;
    for (uint32_t t = 0; t < n_tokens; ++t)
      Prescale(x + (uint64_t)t * x_ld, m->scale + (uint64_t)tile * bpr, k,
               m->block, xs + (uint64_t)t * k);
    for (uint32_t i = r; i < end; i += kPanelRows) {
      const uint32_t rows = end - i < kPanelRows ? end - i : kPanelRows;
      const uint8_t *mag = m->mag + (uint64_t)i * k;
      const uint32_t *sign = m->sign + (uint64_t)i * (k / 32);
      for (uint32_t c0 = 0; c0 < k; c0 += kPanelSegment) {
        const uint32_t c1 = k - c0 < kPanelSegment ? k : c0 + kPanelSegment;
        DecodePanel<Dec>(mag, sign, k, rows, c0, c1, panel);
        for (uint32_t t = 0; t < n_tokens; t += kPanelTokens) {
          const uint32_t T =
              n_tokens - t < kPanelTokens ? n_tokens - t : kPanelTokens;
          const float *xt = xs + (uint64_t)t * k;
          __m512 *mt = mem + (uint64_t)t * kPanelRows * 2;
          float *yt = y + (uint64_t)t * y_ld + (i - row_begin);
          const bool first = c0 == 0, last = c1 == k;
          switch (rows) {
          case 4: PanelPassAny<Dec, 4>(T, panel, c1 - c0, xt, k, c0, first, last, mt, yt, y_ld); break;
          case 3: PanelPassAny<Dec, 3>(T, panel, c1 - c0, xt, k, c0, first, last, mt, yt, y_ld); break;
          case 2: PanelPassAny<Dec, 2>(T, panel, c1 - c0, xt, k, c0, first, last, mt, yt, y_ld); break;
          default: PanelPassAny<Dec, 1>(T, panel, c1 - c0, xt, k, c0, first, last, mt, yt, y_ld); break;
          }
        }
      }
    }
    r = end;
  }
}
} // namespace

void Fp9DecodePanelAvx512(const uint8_t *mag, const uint32_t *sign,
                          uint32_t k, uint32_t rows, uint32_t c0, uint32_t c1,
                          float *panel) {
  DecodePanel<Fp9Decoder>(mag, sign, k, rows, c0, c1, panel);
}

void Fp9GemvAvx512(const duck_fp9_matrix *m, const float *x, float *y,
                   uint32_t row_begin, uint32_t row_end, float *xs) {
  Gemv<Fp9Decoder>(m, x, y, row_begin, row_end, xs);
}

void Fp9GemmAvx512(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
                   uint32_t n_tokens, float *y, uint32_t y_ld,
                   uint32_t row_begin, uint32_t row_end, float *xs) {
  GemmTiles<Fp9Decoder>(m, x, x_ld, n_tokens, y, y_ld, row_begin, row_end, xs);
}

uint64_t Fp9GemmPanelAvx512ScratchFloats(uint32_t n_tokens, uint32_t k) {
  const uint64_t segment = k < kPanelSegment ? k : kPanelSegment;
  return (uint64_t)n_tokens * k + kPanelRows * segment +
         (k > kPanelSegment ? (uint64_t)n_tokens * kPanelRows * 32 : 0);
}

void Fp9GemmPanelAvx512(const duck_fp9_matrix *m, const float *x,
                        uint32_t x_ld, uint32_t n_tokens, float *y,
                        uint32_t y_ld, uint32_t row_begin, uint32_t row_end,
                        float *xs) {
  GemmPanel<Fp9Decoder>(m, x, x_ld, n_tokens, y, y_ld, row_begin, row_end, xs);
}

void E4m3GemvAvx512(const duck_fp9_matrix *m, const float *x, float *y,
                    uint32_t row_begin, uint32_t row_end, float *xs) {
  Gemv<E4m3Decoder>(m, x, y, row_begin, row_end, xs);
}

void E4m3GemmAvx512(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
                    uint32_t n_tokens, float *y, uint32_t y_ld,
                    uint32_t row_begin, uint32_t row_end, float *xs) {
  GemmTiles<E4m3Decoder>(m, x, x_ld, n_tokens, y, y_ld, row_begin, row_end,
                         xs);
}

void E4m3GemmPanelAvx512(const duck_fp9_matrix *m, const float *x,
                         uint32_t x_ld, uint32_t n_tokens, float *y,
                         uint32_t y_ld, uint32_t row_begin, uint32_t row_end,
                         float *xs) {
  GemmPanel<E4m3Decoder>(m, x, x_ld, n_tokens, y, y_ld, row_begin, row_end,
                         xs);
}

namespace {
/// DotBf16's final sum, op for op: (a0 + a1), then its horizontal sum
/// (low + high half, two hadds), then the scalar tail.
inline float FinishBf16(__m512 acc, const uint16_t *w, const float *x,
                        uint64_t i, uint64_t n) {
  const __m256 v = _mm256_add_ps(_mm512_extractf32x8_ps(acc, 0),
                                 _mm512_extractf32x8_ps(acc, 1));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_hadd_ps(h, h);
  h = _mm_hadd_ps(h, h);
  float s = _mm_cvtss_f32(h);
  for (uint64_t j = i; j < n; ++j) {
    const uint32_t b = (uint32_t)w[j] << 16;
    float f;
    std::memcpy(&f, &b, 4);
    s += f * x[j];
  }
  return s;
}

/// 16 bf16 weights widened to fp32: lane j is weight i + j, so lanes 0-7
/// are the AVX2 kernel's `lo` and 8-15 its `hi`.
inline __m512 WidenBf16(const uint16_t *w) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i *>(w))),
      16));
}
} // namespace

float DotBf16Avx512(const uint16_t *w, const float *x, uint64_t n) {
  __m512 acc = _mm512_setzero_ps(); // a0 | a1 of the AVX2 kernel
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16)
    acc = _mm512_fmadd_ps(WidenBf16(w + i), _mm512_loadu_ps(x + i), acc);
  return FinishBf16(acc, w, x, i, n);
}

void DotBf16x4Avx512(const uint16_t *w, const float *x, uint64_t x_ld,
                     uint64_t n, float *out, uint64_t out_ld) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps(), _mm512_setzero_ps()};
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 wv = WidenBf16(w + i);
    for (int t = 0; t < 4; ++t)
      acc[t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + t * x_ld + i), acc[t]);
  }
  for (int t = 0; t < 4; ++t)
    out[t * out_ld] = FinishBf16(acc[t], w, x + t * x_ld, i, n);
}

bool HostHasAvx512() {
  static const bool has = [] {
    const char *isa = std::getenv("DUCK_HOST_ISA");
    if (isa && std::strcmp(isa, "avx2") == 0)
      return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512dq");
  }();
  return has;
}

bool HostReadsE4m3() {
  const char *f = std::getenv("DUCK_HOST_FP8");
  return !(f && std::strcmp(f, "fp9") == 0);
}

} // namespace duck::runtime
