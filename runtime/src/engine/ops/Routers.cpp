//===- Routers.cpp - softmax and sigmoid group-limited MoE routers --------===//
#include "Routers.h"

#include "duck/runtime/engine/HostKernels.h"

#include <algorithm>
#include <cmath>

namespace duck::runtime::ops {

Router::Router(const RouterConfig &c) : c_(c) {
  c_.n_group = std::max(1u, c_.n_group);
  c_.topk_group = c_.topk_group ? c_.topk_group : c_.n_group;
  sel_.resize(c_.experts);
  gscore_.resize(c_.n_group);
  idx_.resize(c_.top_k);
  gidx_.resize(c_.n_group);
  taken_.resize(std::max(c_.experts, c_.n_group));
}

void Router::TopK(const float *v, uint32_t n, uint32_t k, uint32_t *out) {
  // Small k: repeated selection keeps ties in index order.
  std::fill(taken_.begin(), taken_.begin() + n, 0);
  for (uint32_t j = 0; j < k; ++j) {
    uint32_t best = n;
    for (uint32_t i = 0; i < n; ++i)
      if (!taken_[i] && (best == n || v[i] > v[best]))
        best = i;
    taken_[best] = 1;
    out[j] = best;
  }
}

void Router::Route(float *logits, const float *bias, duck_expert_slot *out) {
  if (c_.sigmoid)
    SigmoidGrouped(logits, bias, out);
  else
    Softmax(logits, out);
  for (uint32_t s = 0; s < c_.shared; ++s)
    out[c_.top_k + s] = {c_.experts + s, 1.0f};
}

void Router::Softmax(float *p, duck_expert_slot *out) {
  const uint32_t E = c_.experts, K = c_.top_k;
  ::duck::runtime::Softmax(p, E);
  TopK(p, E, K, idx_.data());
  float sum = 0;
  for (uint32_t j = 0; j < K; ++j)
    sum += p[idx_[j]];
  for (uint32_t j = 0; j < K; ++j)
    out[j] = {idx_[j], c_.norm_topk_prob ? p[idx_[j]] / sum : p[idx_[j]]};
}

// DeepSeek: sigmoid scores; the correction bias only for selection; keep the
// topk_group groups with the largest sum of their two best biased scores.
void Router::SigmoidGrouped(float *s, const float *bias,
                            duck_expert_slot *out) {
  const uint32_t E = c_.experts, K = c_.top_k, G = c_.n_group, per = E / G;
  for (uint32_t i = 0; i < E; ++i) {
    s[i] = 1.0f / (1.0f + std::exp(-s[i]));
    sel_[i] = s[i] + (bias ? bias[i] : 0.0f);
  }
  for (uint32_t g = 0; g < G; ++g) {
    float a = -INFINITY, b = -INFINITY; // the two best of the group
    for (uint32_t i = g * per; i < (g + 1) * per; ++i) {
      if (sel_[i] > a) {
        b = a;
        a = sel_[i];
      } else if (sel_[i] > b) {
        b = sel_[i];
      }
    }
    gscore_[g] = a + (per > 1 ? b : 0.0f);
  }
  TopK(gscore_.data(), G, c_.topk_group, gidx_.data());
  for (uint32_t g = 0; g < G; ++g) {
    bool kept = std::find(gidx_.begin(), gidx_.begin() + c_.topk_group, g) !=
                gidx_.begin() + c_.topk_group;
    if (!kept)
      std::fill(sel_.begin() + g * per, sel_.begin() + (g + 1) * per,
                -INFINITY);
  }
  TopK(sel_.data(), E, K, idx_.data());
  float sum = 0;
  for (uint32_t j = 0; j < K; ++j)
    sum += s[idx_[j]];
  for (uint32_t j = 0; j < K; ++j) {
    float w = s[idx_[j]];
    if (c_.norm_topk_prob)
      w /= sum + 1e-20f;
    out[j] = {idx_[j], w * c_.scaling};
  }
}

} // namespace duck::runtime::ops
