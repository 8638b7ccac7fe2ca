// The few libc symbols a freestanding x86-64 object may still call: the
// compiler emits memcpy/memset/memmove/memcmp for struct copies and loops,
// and floorf for __builtin_floorf (the kernels' exp).
// Written with `rep movsb`/`rep stosb` so the optimiser cannot turn them back
// into calls to themselves. Hidden: they never leave the ELF.
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define DUCK_ELF_HIDDEN __attribute__((visibility("hidden")))

extern "C" {

DUCK_ELF_HIDDEN void *memcpy(void *dst, const void *src, size_t n) {
  void *ret = dst;
  __asm__ volatile("rep movsb"
                   : "+D"(dst), "+S"(src), "+c"(n)
                   :
                   : "memory");
  return ret;
}

DUCK_ELF_HIDDEN void *memset(void *dst, int c, size_t n) {
  void *ret = dst;
  __asm__ volatile("rep stosb" : "+D"(dst), "+c"(n) : "a"(c) : "memory");
  return ret;
}

DUCK_ELF_HIDDEN void *memmove(void *dst, const void *src, size_t n) {
  unsigned char *d = (unsigned char *)dst;
  const unsigned char *s = (const unsigned char *)src;
  if (d <= s || d >= s + n)
    return memcpy(dst, src, n);
  // Overlapping with dst above src: copy backwards (direction flag set).
  d += n - 1;
  s += n - 1;
  __asm__ volatile("std\n\trep movsb\n\tcld"
                   : "+D"(d), "+S"(s), "+c"(n)
                   :
                   : "memory");
  return dst;
}

DUCK_ELF_HIDDEN int memcmp(const void *a, const void *b, size_t n) {
  const volatile unsigned char *x = (const volatile unsigned char *)a;
  const volatile unsigned char *y = (const volatile unsigned char *)b;
  for (size_t i = 0; i < n; ++i)
    if (x[i] != y[i])
      return x[i] < y[i] ? -1 : 1;
  return 0;
}

/// floor is exact, so SSE4.1 roundss gives the same bits as libm's floorf.
DUCK_ELF_HIDDEN float floorf(float x) {
  __m128 v = _mm_set_ss(x);
  return _mm_cvtss_f32(_mm_round_ss(v, v, _MM_FROUND_TO_NEG_INF |
                                              _MM_FROUND_NO_EXC));
}

} // extern "C"
