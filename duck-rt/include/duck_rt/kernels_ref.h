// Scalar reference implementations of the duck kernels (host only): plain
// C++, weights dequantised with duck_fp9_unpack_row, fp64 accumulation.
// The tests compare every AVX2 kernel against these.
#ifndef DUCK_RT_KERNELS_REF_H
#define DUCK_RT_KERNELS_REF_H

#include "duck_rt/kernels.h"

#include <vector>

namespace duck::ref {

/// A packed matrix together with its descriptor.
struct Matrix {
  duck_fp9_desc desc;
  const void *packed;
};

struct Ffn {
  Matrix gate, up, down;
};

/// y[r] = sum_k W[r][k] x[k] in fp64; out_abs[r] = sum_k |W[r][k] x[k]|
/// (the scale of the rounding error an fp32 kernel may make).
void gemv(const Matrix &m, const float *x, std::vector<double> &out_y,
          std::vector<double> *out_abs = nullptr);

double silu(double g);

/// down(silu(gate x) * up x) in fp64 (the hidden activation rounded to
/// fp32 first, as the kernels do, so the comparison measures GEMV error).
void ffn(const Ffn &w, const float *x, std::vector<double> &out_y,
         std::vector<double> *out_abs = nullptr);

/// sum over slots of weight * ffn(expert, x).
void moe(const std::vector<Ffn> &experts, const duck_expert_slot *slots,
         uint32_t n_slots, const float *x, std::vector<double> &out_y,
         std::vector<double> *out_abs = nullptr);

} // namespace duck::ref

#endif // DUCK_RT_KERNELS_REF_H
