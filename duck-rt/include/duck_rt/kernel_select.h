// The kernel selection rule, shared by the compiler (duck-select-kernels)
// and the duck: shape decides, once, outside any loop. Plain C, no SIMD.
#ifndef DUCK_RT_KERNEL_SELECT_H
#define DUCK_RT_KERNEL_SELECT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Kernel variants; append only (the value is stored in plans).
typedef enum duck_kernel_id {
  DUCK_KERNEL_GENERAL128 = 0,
  DUCK_KERNEL_GENERAL64 = 1,
  DUCK_KERNEL_GENERAL32 = 2,
  DUCK_KERNEL_EXACT64 = 3,  // K == 64, block 64: one block a row
  DUCK_KERNEL_EXACT128 = 4, // K == 128, block 128
  DUCK_KERNEL_EXACT32 = 5,  // K == 32, block 32 (tp24/32 down slices)
  DUCK_KERNEL_COUNT = 6,
} duck_kernel_id;

static inline duck_kernel_id duck_select_kernel(uint32_t k, uint32_t block) {
  if (k == 64 && block == 64)
    return DUCK_KERNEL_EXACT64;
  if (k == 128 && block == 128)
    return DUCK_KERNEL_EXACT128;
  if (k == 32 && block == 32)
    return DUCK_KERNEL_EXACT32;
  if (block == 128)
    return DUCK_KERNEL_GENERAL128;
  if (block == 64)
    return DUCK_KERNEL_GENERAL64;
  return DUCK_KERNEL_GENERAL32;
}

static inline const char *duck_kernel_name(duck_kernel_id id) {
  switch (id) {
  case DUCK_KERNEL_GENERAL128:
    return "general128";
  case DUCK_KERNEL_GENERAL64:
    return "general64";
  case DUCK_KERNEL_GENERAL32:
    return "general32";
  case DUCK_KERNEL_EXACT64:
    return "exact64";
  case DUCK_KERNEL_EXACT128:
    return "exact128";
  case DUCK_KERNEL_EXACT32:
    return "exact32";
  default:
    return "unknown";
  }
}

#ifdef __cplusplus
} // extern "C"
#endif

#endif // DUCK_RT_KERNEL_SELECT_H
