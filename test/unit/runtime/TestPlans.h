// The tiny plans test/unit/runtime/CMakeLists.txt compiles at build time
// (duck-mkmodel, then duckc compile --tp 2): "qwen3-moe" (FP8 128x128
// blocks, 2 MoE layers of 16 experts, softmax router), "qwen3" (bf16,
// dense FFNs) and "deepseek" (FP8 DeepSeek-V3.2: MLA, the indexer, a dense
// layer, then MoE layers with the sigmoid router and a shared expert).
#ifndef DUCK_TEST_UNIT_RUNTIME_TESTPLANS_H
#define DUCK_TEST_UNIT_RUNTIME_TESTPLANS_H

#include <string>

namespace duck::runtime::test {

inline std::string PlanDir(const std::string &name) {
  return std::string(DUCK_TEST_PLANS) + "/" + name + "/plan";
}
inline std::string ModelDir(const std::string &name) {
  return std::string(DUCK_TEST_PLANS) + "/" + name + "/model";
}

} // namespace duck::runtime::test

#endif
