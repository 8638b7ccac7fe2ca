//===- Rope.cpp - DeepSeek's RoPE frequencies (YaRN) ----------------------===//
#include "Rope.h"

#include <algorithm>
#include <cmath>

namespace duck::runtime::ops {
namespace {

/// YaRN's attention factor (HF yarn_get_mscale).
double YarnMscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

} // namespace

YarnRope YarnRope::Make(uint32_t dim, double theta,
                        const ::duck::plan::RopeScalingDef *rs) {
  YarnRope r;
  r.inv_freq.resize(dim / 2);
  for (uint32_t i = 0; i < dim / 2; ++i)
    r.inv_freq[i] = std::pow(theta, -2.0 * i / dim);
  if (!rs || rs->factor() <= 1.0)
    return r;
  const double orig = rs->original_max_position_embeddings();
  auto corr = [&](double rot) {
    return dim * std::log(orig / (rot * 2 * M_PI)) / (2 * std::log(theta));
  };
  const double lo = std::max(std::floor(corr(rs->beta_fast())), 0.0);
  double hi = std::min(std::ceil(corr(rs->beta_slow())), dim - 1.0);
  if (lo == hi)
    hi += 0.001;
  for (uint32_t i = 0; i < dim / 2; ++i) {
    const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
    r.inv_freq[i] =
        r.inv_freq[i] / rs->factor() * ramp + r.inv_freq[i] * (1 - ramp);
  }
  if (rs->mscale_all_dim() > 0) {
    const double m = YarnMscale(rs->factor(), rs->mscale_all_dim());
    r.attn_scale = m * m;
  }
  r.cos_sin_scale = (float)(YarnMscale(rs->factor(), rs->mscale()) /
                            YarnMscale(rs->factor(), rs->mscale_all_dim()));
  return r;
}

void YarnRope::Interleaved(float *x, uint64_t pos) const {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double a = (double)pos * inv_freq[i];
    const float c = (float)std::cos(a) * cos_sin_scale,
                s = (float)std::sin(a) * cos_sin_scale;
    const float x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * c - x1 * s;
    x[2 * i + 1] = x0 * s + x1 * c;
  }
}

void YarnRope::HalfSplit(float *x, uint64_t pos) const {
  const size_t half = inv_freq.size();
  for (size_t i = 0; i < half; ++i) {
    const double a = (double)pos * inv_freq[i];
    const float c = (float)std::cos(a) * cos_sin_scale,
                s = (float)std::sin(a) * cos_sin_scale;
    const float x0 = x[i], x1 = x[i + half];
    x[i] = x0 * c - x1 * s;
    x[i + half] = x1 * c + x0 * s;
  }
}

} // namespace duck::runtime::ops
