// e^x on 8 AVX2 lanes from its reduction: the one polynomial the duck
// kernels (SiLU) and the host kernels (softmax) share. Header-only, no libc,
// so the freestanding duck ELF can use it. Needs AVX2 and FMA.
#ifndef DUCK_RT_EXP_AVX2_H
#define DUCK_RT_EXP_AVX2_H

#include <immintrin.h>

/// 2^n * p(r) with r = x - n ln 2 (Cody-Waite, two parts) and p the
/// degree-6 Taylor polynomial: e^x for x in [-87, 88] when n is x / ln 2
/// rounded to an integer (the caller chooses the rounding and clamps x);
/// relative error below 2e-7.
static inline __m256 duck_exp8_reduced(__m256 x, __m256 n) {
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

#endif // DUCK_RT_EXP_AVX2_H
