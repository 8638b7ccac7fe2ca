//===- Routers.h - MoE routers: scores to (expert, weight) slots -*- C++
//-*-===//
//
// The host half of a MoE layer (MATH.md sections 2 and 3): router logits
// in, top_k routed slots plus one weight-1 slot per shared expert out.
// Scratch is sized once; Route allocates nothing.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_OPS_ROUTERS_H
#define DUCK_RUNTIME_OPS_ROUTERS_H

#include "duck_rt/abi.h"

#include <cstdint>
#include <vector>

namespace duck::runtime::ops {

struct RouterConfig {
  bool sigmoid = false; // DeepSeek scoring; else softmax (Qwen3)
  uint32_t experts = 0, top_k = 0, shared = 0;
  bool norm_topk_prob = false;
  uint32_t n_group = 1, topk_group = 1; // sigmoid: group-limited top-k
  float scaling = 1.0f;                 // routed_scaling_factor
};

class Router {
public:
  explicit Router(const RouterConfig &c);
  /// `logits` (experts floats, overwritten with the scores) to
  /// top_k + shared slots in `out`.
  void Route(float *logits, const float *bias, duck_expert_slot *out);
  const RouterConfig &config() const { return c_; }

private:
  void Softmax(float *p, duck_expert_slot *out);
  void SigmoidGrouped(float *s, const float *bias, duck_expert_slot *out);
  /// The k largest of v[0..n) by value, ties to the lower index.
  void TopK(const float *v, uint32_t n, uint32_t k, uint32_t *out);

  RouterConfig c_;
  std::vector<float> sel_, gscore_;
  std::vector<uint32_t> idx_, gidx_;
  std::vector<uint8_t> taken_;
};

} // namespace duck::runtime::ops

#endif
