//===- Bf16Gemv.h - The plain bf16 GEMV fp9 is compared with ----*- C++ -*-===//

#ifndef DUCK_BENCH_BF16GEMV_H
#define DUCK_BENCH_BF16GEMV_H

#include <cstdint>

namespace duck::bench {

/// y[r - rowBegin] = sum_k w[r][k] * x[k] for bf16 w [rows][k] (k a
/// multiple of 32): 8 bf16 a load, widened to fp32 by a shift, FMA into
/// four accumulators. The baseline an AVX2 box without fp9 would run.
void bf16Gemv(const uint16_t *w, uint32_t k, const float *x, float *y,
              uint32_t rowBegin, uint32_t rowEnd);

} // namespace duck::bench

#endif // DUCK_BENCH_BF16GEMV_H
