// An FfnRunner with no ducks, for engine and batcher tests: every FFN
// step's output is a fixed function of each row's own activations and
// routed experts (so, like the ducks, a row's result does not depend on
// the other rows of the step), and every step is recorded.
#ifndef DUCK_TEST_UNIT_RUNTIME_FAKEFFNRUNNER_H
#define DUCK_TEST_UNIT_RUNTIME_FAKEFFNRUNNER_H

#include "duck/runtime/engine/Engine.h"

#include <cmath>
#include <mutex>
#include <vector>

namespace duck::runtime::test {

class FakeFfnRunner : public FfnRunner {
public:
  struct Call {
    uint32_t mode, slot, n_tokens, top_k;
  };
  explicit FakeFfnRunner(uint32_t hidden) : hidden_(hidden) {}

  absl::Status Run(uint32_t mode, uint32_t slot, uint32_t n_tokens,
                   uint32_t top_k, const duck_expert_slot *slots,
                   const float *x, float *out) override {
    absl::Status fail;
    {
      std::lock_guard<std::mutex> lock(mu_);
      calls_.push_back({mode, slot, n_tokens, top_k});
      fail = fail_;
    }
    if (!fail.ok())
      return fail;
    for (uint32_t t = 0; t < n_tokens; ++t) {
      const float *xt = x + (uint64_t)t * hidden_;
      float *ot = out + (uint64_t)t * hidden_;
      if (top_k == 0)
        for (uint32_t i = 0; i < hidden_; ++i)
          ot[i] = std::tanh(xt[i]) * (1.0f + 0.125f * (float)slot);
      for (uint32_t k = 0; k < top_k; ++k) {
        const duck_expert_slot &s = slots[(uint64_t)t * top_k + k];
        const float f = 0.5f + 0.0625f * (float)(s.expert % 8);
        for (uint32_t i = 0; i < hidden_; ++i)
          ot[i] += s.weight * std::tanh(f * xt[i]);
      }
    }
    return absl::OkStatus();
  }

  std::vector<Call> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.clear();
  }
  /// Every step fails with `s` from now on (OkStatus: none).
  void Fail(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_ = std::move(s);
  }

private:
  uint32_t hidden_;
  mutable std::mutex mu_;
  std::vector<Call> calls_;
  absl::Status fail_;
};

} // namespace duck::runtime::test

#endif
