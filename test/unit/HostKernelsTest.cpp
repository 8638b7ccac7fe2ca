// The host kernels' batching contract: a row of a many-token MatMul has
// exactly the bits of that token's own MatVec, so a sequence batched with
// others (duckrun serve) gets what it gets alone.
#include "duck/runtime/HostKernels.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace duck::runtime {
namespace {

TEST(HostKernels, Bf16MatMulRowsEqualMatVecBits) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (uint64_t cols : {16u, 40u, 1024u, 1037u}) {
    const uint64_t rows = 67;
    std::vector<uint16_t> w(rows * cols);
    for (auto &v : w) {
      float f = d(rng);
      uint32_t b;
      std::memcpy(&b, &f, 4);
      v = (uint16_t)(b >> 16);
    }
    HostMatrix m;
    m.rows = rows;
    m.cols = cols;
    m.bf16 = w.data();
    for (unsigned threads : {1u, 2u}) {
      ThreadPool pool(threads);
      for (uint64_t n : {1u, 2u, 3u, 4u, 5u, 8u, 9u}) {
        std::vector<float> x(n * cols), y(n * rows), one(rows);
        for (auto &v : x)
          v = d(rng);
        MatMul(pool, m, x.data(), n, y.data());
        for (uint64_t t = 0; t < n; ++t) {
          MatVec(pool, m, x.data() + t * cols, one.data());
          ASSERT_EQ(0, std::memcmp(one.data(), y.data() + t * rows, rows * 4))
              << "cols " << cols << ", tokens " << n << ", token " << t;
        }
      }
    }
  }
}

} // namespace
} // namespace duck::runtime
