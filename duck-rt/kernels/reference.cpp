// Scalar reference kernels (see duck_rt/kernels_ref.h).
#include "duck_rt/kernels_ref.h"

#include <cmath>

namespace duck::ref {

void gemv(const Matrix &m, const float *x, std::vector<double> &y,
          std::vector<double> *absSum) {
  y.assign(m.desc.rows, 0.0);
  if (absSum)
    absSum->assign(m.desc.rows, 0.0);
  std::vector<float> row(m.desc.k);
  for (uint32_t r = 0; r < m.desc.rows; ++r) {
    duck_fp9_unpack_row(&m.desc, m.packed, r, row.data());
    double s = 0, a = 0;
    for (uint32_t k = 0; k < m.desc.k; ++k) {
      double p = (double)row[k] * x[k];
      s += p;
      a += std::fabs(p);
    }
    y[r] = s;
    if (absSum)
      (*absSum)[r] = a;
  }
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

void ffn(const Ffn &w, const float *x, std::vector<double> &y,
         std::vector<double> *absSum) {
  std::vector<double> g, u;
  gemv(w.gate, x, g);
  gemv(w.up, x, u);
  std::vector<float> h(g.size());
  for (size_t i = 0; i < g.size(); ++i)
    h[i] = (float)(silu(g[i]) * u[i]);
  gemv(w.down, h.data(), y, absSum);
}

void moe(const std::vector<Ffn> &experts, const duck_expert_slot *slots,
         uint32_t n, const float *x, std::vector<double> &y,
         std::vector<double> *absSum) {
  uint32_t hidden = experts.at(0).down.desc.rows;
  y.assign(hidden, 0.0);
  if (absSum)
    absSum->assign(hidden, 0.0);
  for (uint32_t i = 0; i < n; ++i) {
    std::vector<double> e, a;
    ffn(experts.at(slots[i].expert), x, e, &a);
    for (uint32_t j = 0; j < hidden; ++j) {
      y[j] += slots[i].weight * e[j];
      if (absSum)
        (*absSum)[j] += std::fabs(slots[i].weight) * a[j];
    }
  }
}

} // namespace duck::ref
