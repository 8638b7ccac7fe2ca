//===- Rope.h - DeepSeek's RoPE frequencies (YaRN) ---------------*- C++
//-*-===//
#ifndef DUCK_RUNTIME_OPS_ROPE_H
#define DUCK_RUNTIME_OPS_ROPE_H

#include "duck/plan/plan_generated.h"

#include <cstdint>
#include <vector>

namespace duck::runtime::ops {

/// RoPE over `dim` dims with base `theta`, YaRN-corrected when the plan
/// has rope scaling (DS3 precompute_freqs_cis, applied at every length as
/// HF and vLLM do).
struct YarnRope {
  std::vector<double> inv_freq; // dim / 2
  float cos_sin_scale = 1.0f;   // mscale(mscale) / mscale(mscale_all_dim)
  double attn_scale = 1.0;      // mscale(mscale_all_dim)^2 for the softmax

  static YarnRope Make(uint32_t dim, double theta,
                       const ::duck::plan::RopeScalingDef *scaling);
  /// Rotates adjacent pairs (x[2i], x[2i+1]) by pos * inv_freq[i] (MLA).
  void Interleaved(float *x, uint64_t pos) const;
  /// Rotates (x[i], x[i + dim/2]) (the V3.2 indexer).
  void HalfSplit(float *x, uint64_t pos) const;
};

} // namespace duck::runtime::ops

#endif
