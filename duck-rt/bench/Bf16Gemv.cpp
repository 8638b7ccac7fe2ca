//===- Bf16Gemv.cpp - The plain bf16 GEMV fp9 is compared with ------------===//

#include "Bf16Gemv.h"

#include <immintrin.h>

namespace duck::bench {

namespace {

inline __m256 widen(const uint16_t *p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

} // namespace

void bf16Gemv(const uint16_t *w, uint32_t k, const float *x, float *y,
              uint32_t rowBegin, uint32_t rowEnd) {
  for (uint32_t r = rowBegin; r < rowEnd; ++r) {
    const uint16_t *row = w + (uint64_t)r * k;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (uint32_t c = 0; c < k; c += 32) {
      a0 = _mm256_fmadd_ps(widen(row + c), _mm256_loadu_ps(x + c), a0);
      a1 = _mm256_fmadd_ps(widen(row + c + 8), _mm256_loadu_ps(x + c + 8), a1);
      a2 =
          _mm256_fmadd_ps(widen(row + c + 16), _mm256_loadu_ps(x + c + 16), a2);
      a3 =
          _mm256_fmadd_ps(widen(row + c + 24), _mm256_loadu_ps(x + c + 24), a3);
    }
    __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 s =
        _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    y[r - rowBegin] = _mm_cvtss_f32(s);
  }
}

} // namespace duck::bench
