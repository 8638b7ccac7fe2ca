// The host kernels' batching contract: a row of a many-token MatMul has
// exactly the bits of that token's own MatVec, so a sequence batched with
// others (duckrun serve) gets what it gets alone.
#include "duck/runtime/engine/HostKernels.h"

#include "Fp8Matrix.h"

#include <gtest/gtest.h>

#include <immintrin.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace duck::runtime {
namespace {

/// Chunks claimed by whoever comes first: every index runs exactly once,
/// chunk bounds are multiples of `align` (but the last), and back-to-back
/// jobs never mix, whether the workers spin or sleep between them.
TEST(HostKernels, ParallelForRunsEveryIndexOnceInAlignedChunks) {
  for (unsigned threads : {1u, 2u, 3u}) {
    ThreadPool pool(threads);
    for (int round = 0; round < 200; ++round) {
      const uint64_t n = 1 + (uint64_t)round * 37 % 1000,
                     align = round % 3 == 0 ? 64 : 1 + round % 5;
      std::vector<std::atomic<int>> hits(n);
      std::atomic<bool> misaligned{false};
      pool.ParallelFor(
          n,
          [&](uint64_t b, uint64_t e) {
            if (b % align != 0 || (e != n && e % align != 0) || b >= e)
              misaligned = true;
            for (uint64_t i = b; i < e; ++i)
              hits[i].fetch_add(1);
          },
          align);
      for (uint64_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[i].load(), 1)
            << "threads " << threads << ", n " << n << ", index " << i;
      ASSERT_FALSE(misaligned) << "threads " << threads << ", n " << n;
      if (round % 50 == 49) // let the workers fall asleep
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
}

/// A worker never runs a chunk on the CPU the caller was on when the job
/// started: the caller would otherwise run the whole job alone while the
/// worker waits behind it.
TEST(HostKernels, ParallelForKeepsWorkersOffTheCallersCpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(0, sched_getaffinity(0, sizeof set, &set));
  const int cpus = CPU_COUNT(&set);
  ThreadPool pool(3);
  const std::thread::id caller = std::this_thread::get_id();
  for (int round = 0; round < 100; ++round) {
    std::mutex mu;
    std::vector<int> workerCpus;
    pool.ParallelFor(64, [&](uint64_t, uint64_t) {
      // Long enough that the workers claim chunks too.
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::microseconds(20);
      while (std::chrono::steady_clock::now() < until) {
      }
      if (std::this_thread::get_id() != caller) {
        std::lock_guard<std::mutex> l(mu);
        workerCpus.push_back(sched_getcpu());
      }
    });
    if (cpus < 2) {
      EXPECT_EQ(pool.caller_cpu(), -1) << "one CPU: the workers stay put";
      continue;
    }
    ASSERT_GE(pool.caller_cpu(), 0);
    for (int c : workerCpus)
      ASSERT_NE(c, pool.caller_cpu()) << "round " << round;
    if (round % 10 == 9) // let the caller move now and then
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

/// Park() sends idle workers to sleep at once rather than after their
/// spin (here 10 s, so without it they would still be spinning), and a
/// parked pool still runs every chunk of the next job.
TEST(HostKernels, ParkedWorkersSleepAtOnceAndWakeForTheNextJob) {
  ThreadPool pool(3, /*spin_ns=*/10'000'000'000ull);
  auto job = [&] {
    std::vector<std::atomic<int>> hits(1000);
    pool.ParallelFor(hits.size(), [&](uint64_t b, uint64_t e) {
      for (uint64_t i = b; i < e; ++i)
        hits[i].fetch_add(1);
    });
    for (auto &h : hits)
      ASSERT_EQ(h.load(), 1);
  };
  // The count that ended the wait: read again, it can be one less for a
  // moment on a loaded machine, where a worker the last job notified but
  // did not need wakes late (counted asleep until then), finds no chunk
  // and parks again.
  auto sleepersAfter = [&](std::chrono::milliseconds wait) {
    const auto until = std::chrono::steady_clock::now() + wait;
    unsigned n = pool.sleepers();
    while (n < 2 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      n = pool.sleepers();
    }
    return n;
  };
  job();
  EXPECT_EQ(sleepersAfter(std::chrono::milliseconds(50)), 0u)
      << "not parked: the workers spin";
  for (int round = 0; round < 5; ++round) {
    pool.Park();
    EXPECT_EQ(sleepersAfter(std::chrono::seconds(5)), 2u) << "round " << round;
    job();
  }
}

/// The VmFlags line of the /proc/self/smaps entry that holds `p`.
static std::string VmFlagsOf(const void *p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in = false;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    unsigned long lo, hi;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 &&
        line.find(':') > line.find('-')) {
      in = a >= lo && a < hi;
      continue;
    }
    if (in && line.rfind("VmFlags:", 0) == 0)
      return line;
  }
  return "";
}

TEST(HostKernels, LargeWeightArraysAreHugePageMappings) {
  // 2 MiB and up: its own 2 MiB-aligned mapping, advised for huge pages
  // ("hg" in VmFlags) before any byte of it is touched.
  HugePageVector<uint64_t> big(3 * kHugePageBytes / 8 + 5, 7);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(big.data()) % kHugePageBytes, 0u);
  EXPECT_NE(VmFlagsOf(big.data()).find(" hg"), std::string::npos)
      << VmFlagsOf(big.data());
  EXPECT_EQ(big.back(), 7u);
  big.resize(big.size() * 2, 9); // grows by a new mapping, keeps the values
  ASSERT_EQ(reinterpret_cast<uintptr_t>(big.data()) % kHugePageBytes, 0u);
  EXPECT_EQ(big[10], 7u);
  EXPECT_EQ(big.back(), 9u);
  // Small ones come from malloc: no mapping of their own, no advice.
  HugePageVector<int8_t> small(4096, 1);
  EXPECT_EQ(VmFlagsOf(small.data()).find(" hg"), std::string::npos);
  EXPECT_EQ(small[4095], 1);
}

/// n bf16 values: normal floats from `d`, their top 16 bits.
std::vector<uint16_t>
RandomBf16(std::mt19937 &rng, std::normal_distribution<float> &d, uint64_t n) {
  std::vector<uint16_t> w(n);
  for (auto &v : w) {
    float f = d(rng);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    v = (uint16_t)(b >> 16);
  }
  return w;
}

TEST(HostKernels, Bf16MatMulRowsEqualMatVecBits) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (uint64_t cols : {16u, 40u, 1024u, 1037u}) {
    const uint64_t rows = 67;
    std::vector<uint16_t> w = RandomBf16(rng, d, rows * cols);
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
          // Four rows at a time in MatVecRows: each still DotBf16's bits.
          for (uint64_t r = 0; r < rows; ++r) {
            const float dot =
                DotBf16(w.data() + r * cols, x.data() + t * cols, cols);
            ASSERT_EQ(0, std::memcmp(&dot, &one[r], 4))
                << "cols " << cols << ", row " << r;
          }
        }
      }
    }
  }
}

/// The order every bf16 product sums in, spelled out in scalars: two
/// accumulators of eight lanes (lane j of the first takes weights 16i + j,
/// of the second 16i + 8 + j, each a fused multiply-add), added lane by
/// lane, then lanes k and k + 4, then pairs. n is a multiple of 16.
float Bf16DotInOrder(const uint16_t *w, const float *x, uint64_t n) {
  float a0[8] = {}, a1[8] = {};
  auto f = [](uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
  };
  for (uint64_t i = 0; i < n; i += 16)
    for (int j = 0; j < 8; ++j) {
      a0[j] = std::fma(f(w[i + j]), x[i + j], a0[j]);
      a1[j] = std::fma(f(w[i + 8 + j]), x[i + 8 + j], a1[j]);
    }
  float v[8], s[4];
  for (int j = 0; j < 8; ++j)
    v[j] = a0[j] + a1[j];
  for (int k = 0; k < 4; ++k)
    s[k] = v[k] + v[k + 4];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// The kernels widen and group the weights their own way (four rows at a
// time, a lane-wise widening); the bits stay those of the order above.
TEST(HostKernels, Bf16ProductsSumInTheirDefinedOrder) {
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const uint64_t rows = 7, cols = 1024;
  std::vector<uint16_t> w = RandomBf16(rng, d, rows * cols);
  std::vector<float> x(4 * cols), y(4 * rows);
  for (auto &v : x)
    v = d(rng);
  HostMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.bf16 = w.data();
  ThreadPool pool(1);
  MatMul(pool, m, x.data(), 4, y.data());
  for (uint64_t t = 0; t < 4; ++t) {
    std::vector<float> one(rows);
    MatVec(pool, m, x.data() + t * cols, one.data());
    for (uint64_t r = 0; r < rows; ++r) {
      const float want =
          Bf16DotInOrder(w.data() + r * cols, x.data() + t * cols, cols);
      const float dot = DotBf16(w.data() + r * cols, x.data() + t * cols, cols);
      EXPECT_EQ(0, std::memcmp(&want, &dot, 4)) << "row " << r;
      EXPECT_EQ(0, std::memcmp(&want, &one[r], 4)) << "row " << r;
      EXPECT_EQ(0, std::memcmp(&want, &y[t * rows + r], 4)) << "row " << r;
    }
  }
}

TEST(HostKernels, MatrixRangesAreWhatMatrixBytesCountsAndPrefetchStops) {
  std::vector<uint16_t> w(12 * 64, 0x3f80);
  HostMatrix bf;
  bf.rows = 12;
  bf.cols = 64;
  bf.bf16 = w.data();
  std::vector<ByteRange> r;
  AppendMatrixRanges(bf, &r);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].data, reinterpret_cast<const uint8_t *>(w.data()));
  EXPECT_EQ(r[0].bytes, MatrixBytes(bf));
  // int8: the values and the scales, as MatrixBytes counts them.
  ThreadPool pool(1);
  HostMatrix q = QuantizeInt8(pool, 12, 64, [](uint64_t row, float *b) {
    for (uint64_t i = 0; i < 64; ++i)
      b[i] = 0.01f * (float)(row + i);
  });
  r.clear();
  AppendMatrixRanges(q, &r);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].bytes + r[1].bytes, MatrixBytes(q));
  EXPECT_EQ(r[1].data, reinterpret_cast<const uint8_t *>(q.i8_scale));
  // An empty matrix has none.
  r.clear();
  AppendMatrixRanges(HostMatrix{}, &r);
  EXPECT_TRUE(r.empty());
  // The prefetch covers every range, or stops at its limit.
  AppendMatrixRanges(bf, &r);
  AppendMatrixRanges(q, &r);
  EXPECT_EQ(PrefetchRanges(r, ~0ull), MatrixBytes(bf) + MatrixBytes(q));
  EXPECT_EQ(PrefetchRanges(r, 1000), 1000u);
  EXPECT_EQ(PrefetchRanges(r, MatrixBytes(bf) + 7), MatrixBytes(bf) + 7);
  EXPECT_EQ(PrefetchRanges({}, 1000), 0u);
}

/// int8 matrices (duckc --lm-head int8): every weight within half a step
/// of its block's scale, an all-zero block stays zero, the GEMV within
/// float rounding of the exact product of the quantised weights, and the
/// batching contract as for bf16.
/// QuantizeInt8 (vectorised) has the bits of the rule written out one
/// weight at a time: scale = amax / 127 rounded to a half, q = lrint(w *
/// (1 / scale)) clamped, in Int8Position's order, and sum |q * scale| a
/// row; over whole groups and a last partial one (416 columns = one group
/// of 256 and five blocks), all-zero, tiny and huge blocks, and ties.
TEST(HostKernels, Int8QuantisationIsTheScalarRule) {
  std::mt19937 rng(41);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const uint64_t rows = 37, cols = 416, blocks = cols / kInt8Block;
  std::vector<float> src(rows * cols);
  for (auto &v : src)
    v = d(rng);
  std::fill_n(src.begin() + 2 * cols + 32, 32, 0.0f); // all zero
  for (uint64_t i = 0; i < 32; ++i) {
    src[3 * cols + 288 + i] = 1e-30f * (float)(i + 1); // tiny, partial group
    src[4 * cols + i] = 8e6f * (i % 2 ? -1.0f : 1.0f); // a scale near half max
    src[5 * cols + 64 + i] = 0.5f * (float)i - 8.0f;   // halves: ties
  }
  ThreadPool pool(2);
  HostMatrix m = QuantizeInt8(pool, rows, cols, [&](uint64_t r, float *b) {
    std::memcpy(b, src.data() + r * cols, cols * 4);
  });
  for (uint64_t r = 0; r < rows; ++r) {
    double l1 = 0;
    for (uint64_t k = 0; k < blocks; ++k) {
      const float *v = src.data() + r * cols + k * kInt8Block;
      float amax = 0.0f;
      for (uint64_t i = 0; i < kInt8Block; ++i)
        amax = std::max(amax, std::fabs(v[i]));
      const uint16_t half = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
      const float scale = _cvtsh_ss(half);
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      ASSERT_EQ(m.i8_scale[r * blocks + k], half)
          << "row " << r << " block " << k;
      uint32_t qsum = 0;
      for (uint64_t i = 0; i < kInt8Block; ++i) {
        const int q = (int)std::clamp(std::lrint(v[i] * inv), -127L, 127L);
        const uint64_t c = k * kInt8Block + i;
        ASSERT_EQ(m.i8[r * cols + Int8Position(c, cols)], q)
            << "row " << r << " col " << c;
        qsum += (uint32_t)std::abs(q);
      }
      l1 += (double)scale * qsum;
    }
    ASSERT_EQ(m.i8_l1[r], (float)l1) << "row " << r;
  }
}

TEST(HostKernels, Int8QuantisesWithinHalfAStepAndBatchesBitExactly) {
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const uint64_t rows = 53, cols = 1024;
  std::vector<float> src(rows * cols);
  for (auto &v : src)
    v = d(rng);
  std::fill_n(src.begin() + 5 * cols + 64, 32, 0.0f); // an all-zero block
  src[7 * cols + 3] = 1e4f;                            // an outlier
  for (unsigned threads : {1u, 2u}) {
    ThreadPool pool(threads);
    HostMatrix m = QuantizeInt8(pool, rows, cols, [&](uint64_t r, float *b) {
      std::memcpy(b, src.data() + r * cols, cols * 4);
    });
    // An IEEE half a scale: 1.0625 bytes a weight, as llama.cpp's Q8_0.
    ASSERT_EQ(MatrixBytes(m), rows * cols + rows * cols / 32 * 2);
    for (uint64_t r = 0; r < rows; ++r)
      for (uint64_t c = 0; c < cols; ++c) {
        const float scale = duck_f16_to_f32(m.i8_scale[r * cols / 32 + c / 32]);
        const float q = m.i8[r * cols + Int8Position(c, cols)];
        ASSERT_LE(std::fabs(q * scale - src[r * cols + c]), 0.5f * scale * 1.0001f)
            << "row " << r << ", col " << c;
        ASSERT_LE(std::fabs(q), 127.0f);
      }
    EXPECT_EQ(m.i8_scale[5 * cols / 32 + 2], 0u);
    EXPECT_EQ(m.i8[7 * cols + Int8Position(3, cols)], 127);

    std::vector<float> x(cols), y(rows);
    for (auto &v : x)
      v = d(rng);
    MatVec(pool, m, x.data(), y.data());
    float amax = 0;
    for (float v : x)
      amax = std::max(amax, std::fabs(v));
    for (uint64_t r = 0; r < rows; ++r) {
      // The quantised weights' exact product with x; the int16 inputs move
      // it by at most 0.51 of their step a unit of sum |w|.
      double exact = 0, mag = 0, l1w = 0;
      for (uint64_t c = 0; c < cols; ++c) {
        const double w = (double)m.i8[r * cols + Int8Position(c, cols)] *
                         duck_f16_to_f32(m.i8_scale[r * cols / 32 + c / 32]);
        exact += w * x[c];
        mag += std::fabs(w * x[c]);
        l1w += std::fabs(w);
      }
      ASSERT_NEAR(y[r], exact, 1e-5 * mag + 0.51 * amax / 32767.0 * l1w)
          << "row " << r;
    }
    for (uint64_t n : {1u, 2u, 3u, 4u, 5u, 8u, 9u}) {
      std::vector<float> xs(n * cols), ys(n * rows), one(rows);
      for (auto &v : xs)
        v = d(rng);
      MatMul(pool, m, xs.data(), n, ys.data());
      for (uint64_t t = 0; t < n; ++t) {
        MatVec(pool, m, xs.data() + t * cols, one.data());
        ASSERT_EQ(0, std::memcmp(one.data(), ys.data() + t * rows, rows * 4))
            << "tokens " << n << ", token " << t;
      }
    }
  }
}

// MatVec and MatMul of an int8 matrix large enough to split over the
// pool's threads: every row is the one-row dot of the rounded input.
TEST(HostKernels, Int8ProductsOverThreadsAreTheRowDots) {
  std::mt19937 rng(23);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const uint64_t rows = 1000, cols = 256;
  ThreadPool pool(2);
  HostMatrix m = QuantizeInt8(pool, rows, cols, [&](uint64_t, float *b) {
    for (uint64_t c = 0; c < cols; ++c)
      b[c] = d(rng);
  });
  std::vector<float> x(3 * cols), y(3 * rows);
  for (auto &v : x)
    v = d(rng);
  MatMul(pool, m, x.data(), 3, y.data());
  std::vector<float> one(rows);
  std::vector<int16_t> q(cols);
  for (uint64_t t = 0; t < 3; ++t) {
    const float sx = QuantizeX16(x.data() + t * cols, cols, q.data());
    MatVec(pool, m, x.data() + t * cols, one.data());
    for (uint64_t r = 0; r < rows; ++r) {
      const float want = DotI8X16(m.i8 + r * cols, m.i8_scale + r * cols / 32,
                                  q.data(), sx, cols);
      ASSERT_EQ(want, one[r]) << "MatVec, token " << t << ", row " << r;
      ASSERT_EQ(want, y[t * rows + r])
          << "MatMul, token " << t << ", row " << r;
    }
  }
}

// ArgMax is std::max_element's index: the first of equal largest values,
// short and ragged lengths, signed zeros, and NaNs (max_element's answer).
TEST(HostKernels, ArgMaxIsMaxElementsIndex) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> d(-50, 50);
  for (uint64_t n : {1u, 7u, 63u, 64u, 65u, 200u, 151936u}) {
    std::vector<float> v(n);
    for (int round = 0; round < 20; ++round) {
      for (auto &x : v)
        x = (float)d(rng) * 0.25f; // many ties
      if (round == 1)
        std::fill(v.begin(), v.end(), -0.0f), v[n - 1] = 0.0f;
      if (round == 2)
        v[n / 2] = std::numeric_limits<float>::quiet_NaN();
      if (round == 3)
        v[0] = std::numeric_limits<float>::quiet_NaN();
      if (round == 4)
        v[n - 1] = std::numeric_limits<float>::infinity();
      ASSERT_EQ(ArgMax(v.data(), n),
                (uint64_t)(std::max_element(v.begin(), v.end()) - v.begin()))
          << n << " values, round " << round;
    }
  }
}

// The interleaved order of an int8 row is a permutation inside each full
// group of 256 columns, pairs of a block's columns side by side, 8 blocks
// a 16-value vector; a last partial group keeps its order.
TEST(HostKernels, Int8PositionPermutesEachFullGroup) {
  for (uint64_t n : {32u, 256u, 288u, 1024u, 2080u}) {
    std::vector<int> seen(n, 0);
    for (uint64_t c = 0; c < n; ++c) {
      const uint64_t p = Int8Position(c, n);
      ASSERT_LT(p, n);
      ++seen[p];
      ASSERT_EQ(p / kInt8Group, c / kInt8Group) << n << " col " << c;
      if (c / kInt8Group * kInt8Group + kInt8Group > n) {
        ASSERT_EQ(p, c);
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), (long)n);
  }
  EXPECT_EQ(Int8Position(0, 256), 0u);
  EXPECT_EQ(Int8Position(1, 256), 1u);
  EXPECT_EQ(Int8Position(32, 256), 2u); // block 1's first column
  EXPECT_EQ(Int8Position(2, 256), 16u); // block 0's second pair
  EXPECT_EQ(Int8Position(255, 256), 255u);
  std::vector<int16_t> v(300);
  for (uint64_t c = 0; c < v.size(); ++c)
    v[c] = (int16_t)c;
  Int8Interleave(v.data(), v.size());
  for (uint64_t c = 0; c < v.size(); ++c)
    ASSERT_EQ(v[Int8Position(c, v.size())], (int16_t)c);
}

// The int8 head's input rounding and dot: QuantizeX16 keeps every input
// within 0.51 of its step of the largest, and DotI8X16 is the exact sum
// of the quantised products up to the fp32 bound ExactTop uses, for row
// lengths with and without a partial group of 8 blocks.
TEST(HostKernels, Int8TimesInt16IsTheIntegerSumWithinItsBound) {
  std::mt19937 rng(17);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> q(-127, 127);
  for (uint64_t n : {32u, 96u, 256u, 1024u, 2080u}) {
    std::vector<int8_t> w(n);
    std::vector<uint16_t> scale(n / kInt8Block);
    for (auto &v : w)
      v = (int8_t)q(rng);
    for (auto &v : scale)
      v = _cvtss_sh(std::fabs(d(rng)) * 0.01f + 1e-4f, 0);
    std::vector<float> x(n);
    for (auto &v : x)
      v = d(rng);
    x[n / 2] = 7.5f; // the largest input: q = 32767
    std::vector<int16_t> xq(n);
    const float sx = QuantizeX16(x.data(), n, xq.data());
    ASSERT_FLOAT_EQ(sx, 7.5f / 32767.0f);
    // Column c's weight and input are at Int8Position(c, n).
    auto at = [n](uint64_t c) { return Int8Position(c, n); };
    EXPECT_EQ(xq[at(n / 2)], 32767);
    for (uint64_t i = 0; i < n; ++i)
      ASSERT_LE(std::fabs(x[i] - sx * xq[at(i)]), 0.51f * sx) << "input " << i;
    // The exact value of what the kernel computes, and the bound.
    double exact = 0, mag = 0;
    for (uint64_t b = 0; b < n / kInt8Block; ++b) {
      int64_t isum = 0, iabs = 0;
      for (uint64_t i = b * kInt8Block; i < (b + 1) * kInt8Block; ++i) {
        isum += (int64_t)w[at(i)] * xq[at(i)];
        iabs += std::abs((int64_t)w[at(i)] * xq[at(i)]);
      }
      exact += (double)duck_f16_to_f32(scale[b]) * isum;
      mag += (double)duck_f16_to_f32(scale[b]) * iabs;
    }
    exact *= sx;
    mag *= sx;
    const double bound =
        (double)(n / kInt8Block / 8 + 8) * std::ldexp(1.0, -24) * mag;
    const float got = DotI8X16(w.data(), scale.data(), xq.data(), sx, n);
    ASSERT_LE(std::fabs(got - exact), bound) << n << " weights";
    // A zero input gives zero; a NaN or an infinity, NaN.
    std::vector<float> zero(n, 0.0f);
    EXPECT_EQ(QuantizeX16(zero.data(), n, xq.data()), 0.0f);
    EXPECT_EQ(DotI8X16(w.data(), scale.data(), xq.data(), 0.0f, n), 0.0f);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity()}) {
      x[n - 1] = bad;
      const float sbad = QuantizeX16(x.data(), n, xq.data());
      EXPECT_TRUE(
          std::isnan(DotI8X16(w.data(), scale.data(), xq.data(), sbad, n)))
          << bad;
    }
  }
}

/// The host's AVX-512 fp9 GEMV has duck_gemv's bits (the AVX2 shift path
/// the ducks and the host's GEMM run), for every kernel class (K of 32, 64,
/// 128 and general), block, row phase and row range.
// The AVX-512 bf16 dot products keep DotBf16's bits: one row, and four
// tokens against one row, with lengths that leave a scalar tail.
TEST(HostKernels, Bf16Avx512HasTheAvx2Bits) {
  if (!HostHasAvx512())
    GTEST_SKIP() << "this CPU has no AVX-512F/DQ";
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (uint64_t n : {16u, 48u, 1000u, 1024u, 1037u}) {
    std::vector<uint16_t> w = RandomBf16(rng, d, n);
    std::vector<float> x(4 * n);
    for (auto &v : x)
      v = d(rng);
    float four[4];
    DotBf16x4Avx512(w.data(), x.data(), n, n, four, 1);
    for (int t = 0; t < 4; ++t) {
      const float a = DotBf16(w.data(), x.data() + t * n, n);
      const float b = DotBf16Avx512(w.data(), x.data() + t * n, n);
      ASSERT_EQ(0, std::memcmp(&a, &b, 4)) << "n " << n << " token " << t;
      ASSERT_EQ(0, std::memcmp(&a, &four[t], 4)) << "n " << n << " token " << t;
    }
  }
}

TEST(HostKernels, Fp9GemvAndGemmAvx512HaveTheAvx2KernelsBits) {
  if (!HostHasAvx512())
    GTEST_SKIP() << "this CPU has no AVX-512F/DQ: the AVX2 kernel is the "
                    "only host path here";
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  struct Shape { uint32_t k, block, phase; };
  for (Shape sh : {Shape{32, 32, 0}, Shape{64, 64, 3}, Shape{128, 128, 0},
                   Shape{96, 32, 100}, Shape{1024, 128, 0}, Shape{1056, 32, 37},
                   Shape{2048, 64, 127}}) {
    const uint32_t rows = 300;
    // The packed slice starts at source row `phase` (its row phase).
    std::vector<float> w((uint64_t)(sh.phase + rows) * sh.k);
    for (auto &v : w)
      v = d(rng) * (rng() % 7 == 0 ? 30.0f : 1.0f);
    duck_fp9_desc desc{rows, sh.k, sh.block, 128, sh.phase};
    duck_fp9_layout lay;
    ASSERT_EQ(duck_fp9_compute_layout(&desc, &lay), DUCK_FP9_OK);
    std::vector<uint64_t> store(lay.total_bytes / 8 + 8);
    void *base = reinterpret_cast<void *>(
        (reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t(63));
    duck_fp9_source src{};
    src.type = DUCK_FP9_SRC_F32;
    src.data = w.data();
    src.src_rows = sh.phase + rows;
    src.src_cols = sh.k;
    src.row0 = sh.phase;
    ASSERT_EQ(duck_fp9_pack(&src, &desc, base, nullptr), DUCK_FP9_OK);
    const duck_fp9_matrix m = duck_fp9_matrix_view(&desc, base);
    std::vector<float> x(sh.k);
    for (auto &v : x)
      v = d(rng);
    std::vector<float> s2(2 * sh.k + 16), s5(sh.k + 32);
    float *xs2 = reinterpret_cast<float *>((reinterpret_cast<uintptr_t>(s2.data()) + 31) & ~uintptr_t(31));
    float *xs5 = reinterpret_cast<float *>((reinterpret_cast<uintptr_t>(s5.data()) + 63) & ~uintptr_t(63));
    for (auto [b, e] : {std::pair<uint32_t, uint32_t>{0, rows}, {5, 200}, {130, 131}}) {
      std::vector<float> ya(e - b), yb(e - b, -1.0f);
      duck_gemv(&m, x.data(), ya.data(), b, e, xs2, DUCK_DECODE_SHIFT);
      Fp9GemvAvx512(&m, x.data(), yb.data(), b, e, xs5);
      ASSERT_EQ(0, std::memcmp(ya.data(), yb.data(), ya.size() * 4))
          << "K " << sh.k << ", block " << sh.block << ", phase " << sh.phase
          << ", rows [" << b << ", " << e << ")";
    }
    // The GEMM: every token of 1..9 and 19 has the GEMV's bits.
    for (uint32_t n : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 19u}) {
      std::vector<float> xt((uint64_t)n * sh.k);
      for (auto &v : xt)
        v = d(rng);
      std::vector<float> sg(8 * sh.k + 16), yg((uint64_t)n * rows), one(rows);
      float *xsg = reinterpret_cast<float *>((reinterpret_cast<uintptr_t>(sg.data()) + 63) & ~uintptr_t(63));
      Fp9GemmAvx512(&m, xt.data(), sh.k, n, yg.data(), rows, 0, rows, xsg);
      for (uint32_t t = 0; t < n; ++t) {
        duck_gemv(&m, xt.data() + (uint64_t)t * sh.k, one.data(), 0, rows, xs2,
                  DUCK_DECODE_SHIFT);
        ASSERT_EQ(0, std::memcmp(one.data(), yg.data() + (uint64_t)t * rows, rows * 4))
            << "GEMM, K " << sh.k << ", " << n << " tokens, token " << t;
      }
      // Rows [5, 200) only (a thread's share), output rows 195 apart.
      std::vector<float> part((uint64_t)n * 195);
      Fp9GemmAvx512(&m, xt.data(), sh.k, n, part.data(), 195, 5, 200, xsg);
      for (uint32_t t = 0; t < n; ++t)
        ASSERT_EQ(0, std::memcmp(yg.data() + (uint64_t)t * rows + 5,
                                 part.data() + (uint64_t)t * 195, 195 * 4))
            << "GEMM rows [5, 200), K " << sh.k << ", token " << t;
      if (n < kFp9Avx512PanelMinTokens)
        continue;
      // The panel GEMM with the AVX-512 panel decoder: the same bits, over
      // all rows and over rows [5, 200) (panels of 3, then a tail).
      std::vector<float> sp(2ull * n * sh.k + 16), yp((uint64_t)n * rows);
      float *xsp = reinterpret_cast<float *>((reinterpret_cast<uintptr_t>(sp.data()) + 63) & ~uintptr_t(63));
      duck_gemm_with_decoder(&m, xt.data(), sh.k, n, yp.data(), rows, 0, rows,
                             xsp, Fp9DecodePanelAvx512);
      ASSERT_EQ(0, std::memcmp(yp.data(), yg.data(), yp.size() * 4))
          << "panel GEMM, K " << sh.k << ", " << n << " tokens";
      duck_gemm_with_decoder(&m, xt.data(), sh.k, n, part.data(), 195, 5, 200,
                             xsp, Fp9DecodePanelAvx512);
      for (uint32_t t = 0; t < n; ++t)
        ASSERT_EQ(0, std::memcmp(yg.data() + (uint64_t)t * rows + 5,
                                 part.data() + (uint64_t)t * 195, 195 * 4))
            << "panel GEMM rows [5, 200), K " << sh.k << ", token " << t;
      // The panel GEMM with 512-bit multiply-adds: the same bits again.
      std::vector<float> sz(Fp9GemmPanelAvx512ScratchFloats(n, sh.k) + 16);
      xsp = reinterpret_cast<float *>((reinterpret_cast<uintptr_t>(sz.data()) + 63) & ~uintptr_t(63));
      std::fill(yp.begin(), yp.end(), -1.0f);
      Fp9GemmPanelAvx512(&m, xt.data(), sh.k, n, yp.data(), rows, 0, rows, xsp);
      ASSERT_EQ(0, std::memcmp(yp.data(), yg.data(), yp.size() * 4))
          << "AVX-512 panel GEMM, K " << sh.k << ", " << n << " tokens";
      std::fill(part.begin(), part.end(), -1.0f);
      Fp9GemmPanelAvx512(&m, xt.data(), sh.k, n, part.data(), 195, 5, 200, xsp);
      for (uint32_t t = 0; t < n; ++t)
        ASSERT_EQ(0, std::memcmp(yg.data() + (uint64_t)t * rows + 5,
                                 part.data() + (uint64_t)t * 195, 195 * 4))
            << "AVX-512 panel GEMM rows [5, 200), K " << sh.k << ", token "
            << t;
    }
  }
}

/// An FP8 matrix read as its e4m3 bytes with AVX-512 (the GEMV, tiles of 1
/// to 8 tokens and the panel) has the fp9 kernel's bits for the same
/// weights: every e4m3 byte but NaN (subnormals and both zeros included),
/// slices that start inside a scale tile, and a thread's range of rows.
TEST(HostKernels, E4m3Avx512HasTheFp9KernelsBits) {
  if (!HostHasAvx512())
    GTEST_SKIP() << "this CPU has no AVX-512F/DQ: duck_e4m3_gemv (AVX2, "
                    "Kernels.E4m3HasTheFp9KernelsBits) is the host's path";
  std::mt19937 rng(23);
  std::normal_distribution<float> d(0.0f, 1.0f);
  struct Shape { uint32_t k, block, row0; };
  for (Shape sh : {Shape{32, 32, 0}, Shape{128, 128, 5}, Shape{1024, 128, 0},
                   Shape{1056, 32, 37}, Shape{2048, 64, 127}}) {
    const uint32_t rows = 300;
    const fixtures::Fp8Matrix fm(rows, sh.k, sh.block, sh.row0, rng);
    ASSERT_TRUE(fm.ok()) << "K " << sh.k;
    const duck_fp9_matrix &m = fm.fp9();
    const duck_fp9_matrix em = fm.e4m3(); // the bytes as the host keeps them
    const auto aligned = [](std::vector<float> &v) {
      return reinterpret_cast<float *>(
          (reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t(63));
    };
    for (uint32_t n : {1u, 2u, 5u, 8u, 9u, 17u, 19u}) {
      std::vector<float> xt((uint64_t)n * sh.k);
      for (auto &v : xt)
        v = d(rng);
      std::vector<float> s2(2 * sh.k + 16), want((uint64_t)n * rows);
      for (uint32_t t = 0; t < n; ++t)
        duck_gemv(&m, xt.data() + (uint64_t)t * sh.k,
                  want.data() + (uint64_t)t * rows, 0, rows, aligned(s2),
                  DUCK_DECODE_SHIFT);
      std::vector<float> sg(Fp9GemmPanelAvx512ScratchFloats(n, sh.k) +
                            8ull * sh.k + 16);
      for (auto [b, end] : {std::pair<uint32_t, uint32_t>{0, rows}, {5, 200}}) {
        std::vector<float> got((uint64_t)n * (end - b), -1.0f);
        if (n == 1)
          E4m3GemvAvx512(&em, xt.data(), got.data(), b, end, aligned(sg));
        else if (n < kFp9Avx512PanelMinTokens)
          E4m3GemmAvx512(&em, xt.data(), sh.k, n, got.data(), end - b, b, end,
                         aligned(sg));
        else
          E4m3GemmPanelAvx512(&em, xt.data(), sh.k, n, got.data(), end - b, b,
                              end, aligned(sg));
        for (uint32_t t = 0; t < n; ++t)
          ASSERT_EQ(0, std::memcmp(want.data() + (uint64_t)t * rows + b,
                                   got.data() + (uint64_t)t * (end - b),
                                   (end - b) * 4))
              << "K " << sh.k << ", block " << sh.block << ", " << n
              << " tokens, token " << t << ", rows [" << b << ", " << end
              << ")";
      }
    }
  }
}

/// Products fused into one hand-off (q/k/v; MLA's q_a and kv_a) have the
/// bits of their own MatMul, whatever the pool size, for matrices whose
/// rows are not multiples of the chunk alignment and for bf16 and fp9.
TEST(HostKernels, MatMulManyHasEachMatMulsBits) {
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const uint32_t k = 1024;
  std::vector<HostMatrix> ms;
  std::vector<std::vector<float>> src;
  std::vector<std::vector<uint16_t>> bf16;
  ms.reserve(4);
  for (uint32_t rows : {300u, 64u, 130u}) { // fp9
    src.emplace_back((uint64_t)rows * k);
    for (auto &v : src.back())
      v = d(rng);
    duck_fp9_desc desc{rows, k, 128, 128, 0};
    duck_fp9_layout lay;
    ASSERT_EQ(duck_fp9_compute_layout(&desc, &lay), DUCK_FP9_OK);
    HostMatrix m;
    m.rows = rows;
    m.cols = k;
    m.is_fp9 = true;
    m.fp9_store.assign(lay.total_bytes / 8 + 8, 0);
    void *base = reinterpret_cast<void *>(
        (reinterpret_cast<uintptr_t>(m.fp9_store.data()) + 63) & ~uintptr_t(63));
    duck_fp9_source s{};
    s.type = DUCK_FP9_SRC_F32;
    s.data = src.back().data();
    s.src_rows = rows;
    s.src_cols = k;
    ASSERT_EQ(duck_fp9_pack(&s, &desc, base, nullptr), DUCK_FP9_OK);
    m.fp9 = duck_fp9_matrix_view(&desc, base);
    ms.push_back(std::move(m));
  }
  { // bf16, 67 rows
    bf16.emplace_back(67 * k);
    for (auto &v : bf16.back())
      v = (uint16_t)(0x3f00 + rng() % 0x200);
    HostMatrix m;
    m.rows = 67;
    m.cols = k;
    m.bf16 = bf16.back().data();
    ms.push_back(std::move(m));
  }
  for (unsigned threads : {1u, 2u, 3u}) {
    ThreadPool pool(threads);
    for (uint64_t n : {1u, 2u, 5u}) {
      std::vector<float> x(n * k);
      for (auto &v : x)
        v = d(rng);
      std::vector<std::vector<float>> one(ms.size()), many(ms.size());
      for (size_t i = 0; i < ms.size(); ++i) {
        one[i].assign(n * ms[i].rows, 0.0f);
        many[i].assign(n * ms[i].rows, -1.0f);
        MatMul(pool, ms[i], x.data(), n, one[i].data());
      }
      MatMulMany(pool, x.data(), n,
                 {{&ms[0], many[0].data()},
                  {&ms[1], many[1].data()},
                  {&ms[2], many[2].data()},
                  {&ms[3], many[3].data()}});
      for (size_t i = 0; i < ms.size(); ++i)
        ASSERT_EQ(0, std::memcmp(one[i].data(), many[i].data(),
                                 one[i].size() * 4))
            << "matrix " << i << ", threads " << threads << ", tokens " << n;
    }
  }
}

/// The scratch reserved at load (RowsProductScratchFloats) is what the
/// products then ask for: a thread that takes it allocates nothing more
/// for any token count up to the reserved one, in either host format, and
/// one that asks beyond it does allocate (the count can tell).
TEST(HostKernels, ReservedScratchCoversEveryRowsProduct) {
  std::mt19937 rng(31);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const uint32_t rows = 130, k = 2048, maxRows = 40;
  const fixtures::Fp8Matrix fm(rows, k, 128, 0, rng);
  ASSERT_TRUE(fm.ok());
  HostMatrix fp9, e4m3;
  fp9.rows = e4m3.rows = rows;
  fp9.cols = e4m3.cols = k;
  fp9.is_fp9 = true;
  fp9.fp9 = fm.fp9();
  e4m3.is_e4m3 = true;
  e4m3.fp9 = fm.e4m3();
  std::vector<float> x((uint64_t)maxRows * k), y((uint64_t)maxRows * rows);
  for (auto &v : x)
    v = d(rng);
  for (const HostMatrix *m : {&fp9, &e4m3}) {
    const uint64_t floats = RowsProductScratchFloats(*m, maxRows);
    ASSERT_GT(floats, 0u);
    ReserveKernelScratch(1, floats);
    const uint64_t before = KernelScratchAllocations();
    std::thread([&] { // a thread with no scratch yet, as a pool worker
      for (uint64_t n = 1; n <= maxRows; ++n)
        RowsProduct(*m, x.data(), k, n, y.data(), rows, 0, rows);
    })
        .join();
    EXPECT_EQ(KernelScratchAllocations(), before)
        << (m->is_fp9 ? "fp9" : "e4m3");
  }
  // With no spare left (none is 2^40 floats): a new thread allocates.
  ReserveKernelScratch(0, uint64_t(1) << 40);
  const uint64_t before = KernelScratchAllocations();
  std::thread([&] {
    RowsProduct(fp9, x.data(), k, maxRows, y.data(), rows, 0, rows);
  }).join();
  EXPECT_EQ(KernelScratchAllocations(), before + 1);
}

/// Absorbed MLA attention (every head over the shared latent rows, in
/// blocks) against a double-precision softmax-weighted sum, over a listed
/// subset of positions in any order, latent and rope widths with a tail.
TEST(HostKernels, MlaAttendMatchesDoubleReference) {
  std::mt19937 rng(12);
  std::normal_distribution<float> d(0.0f, 1.0f);
  struct Shape { uint64_t R, rope; };
  for (Shape sh : {Shape{512, 64}, Shape{36, 12}}) {
    const uint64_t W = sh.R + sh.rope, heads = 3, qk = 40 + sh.rope;
    const float scale = 0.125f;
    std::vector<float> cache(120 * W);
    for (auto &f : cache)
      f = d(rng);
    for (uint64_t n : {1u, 3u, 17u, 100u}) {
      std::vector<uint64_t> pos(n);
      for (uint64_t i = 0; i < n; ++i)
        pos[i] = (i * 37 + 5) % 120; // distinct for n <= 120
      std::vector<float> qt(heads * sh.R), q(heads * qk), olat(heads * sh.R);
      for (auto *v : {&qt, &q})
        for (auto &f : *v)
          f = 0.2f * d(rng);
      MlaAttend(qt.data(), q.data() + 40, qk, cache.data(), pos.data(), n,
                sh.R, sh.rope, scale, heads, olat.data());
      for (uint64_t h = 0; h < heads; ++h) {
        std::vector<double> p(n);
        double mx = -1e300, sum = 0;
        for (uint64_t i = 0; i < n; ++i) {
          const float *c = cache.data() + pos[i] * W;
          double dot = 0;
          for (uint64_t j = 0; j < sh.R; ++j)
            dot += (double)qt[h * sh.R + j] * c[j];
          for (uint64_t j = 0; j < sh.rope; ++j)
            dot += (double)q[h * qk + 40 + j] * c[sh.R + j];
          p[i] = dot * scale;
          mx = std::max(mx, p[i]);
        }
        for (auto &v : p)
          sum += (v = std::exp(v - mx));
        for (uint64_t j = 0; j < sh.R; ++j) {
          double want = 0, mag = 0;
          for (uint64_t i = 0; i < n; ++i) {
            want += p[i] / sum * cache[pos[i] * W + j];
            mag += p[i] / sum * std::fabs(cache[pos[i] * W + j]);
          }
          ASSERT_NEAR(olat[h * sh.R + j], want, 1e-5 * (1 + mag))
              << "R " << sh.R << ", n " << n << ", head " << h << ", dim "
              << j;
        }
      }
    }
  }
}

/// The V3.2 indexer's scores against double precision, and the same bits
/// whichever 4-aligned chunks the pool cuts the positions into.
TEST(HostKernels, IndexScoresMatchDoubleReferenceInAnyChunks) {
  std::mt19937 rng(13);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (uint64_t dim : {128u, 20u}) {
    const uint64_t heads = 5, n = 103;
    std::vector<float> q(heads * dim), w(heads), keys(n * dim);
    for (auto *v : {&q, &w, &keys})
      for (auto &f : *v)
        f = d(rng);
    std::vector<float> whole(n), parts(n);
    IndexScores(q.data(), w.data(), heads, dim, keys.data(), 0, n,
                whole.data());
    for (uint64_t j0 = 0; j0 < n; j0 += 12)
      IndexScores(q.data(), w.data(), heads, dim, keys.data(), j0,
                  std::min(n, j0 + 12), parts.data());
    ASSERT_EQ(0, std::memcmp(whole.data(), parts.data(), n * 4)) << "dim " << dim;
    for (uint64_t j = 0; j < n; ++j) {
      double want = 0, mag = 0;
      for (uint64_t h = 0; h < heads; ++h) {
        double dot = 0, m = 0;
        for (uint64_t i = 0; i < dim; ++i) {
          dot += (double)q[h * dim + i] * keys[j * dim + i];
          m += std::fabs((double)q[h * dim + i] * keys[j * dim + i]);
        }
        want += w[h] * std::max(dot, 0.0);
        mag += std::fabs(w[h]) * m;
      }
      ASSERT_NEAR(whole[j], want, 1e-5 * (1 + mag)) << "dim " << dim << ", j " << j;
    }
  }
}

/// A prompt chunk attends as a run of rows (AttendRows, keys and values
/// in blocks every row takes): each row has exactly the bits AttendHeads
/// gives it alone, whatever the run's length and start, the head range,
/// an odd group, or a head width with a tail.
TEST(HostKernels, AttendRowsHasEachRowsAttendHeadsBits) {
  std::mt19937 rng(4);
  std::normal_distribution<float> d(0.0f, 1.0f);
  struct Shape { uint64_t heads, kvHeads, dim; };
  for (Shape sh : {Shape{4, 2, 128}, Shape{6, 2, 64}, Shape{3, 3, 36}}) {
    const uint64_t stride = 200 * sh.dim, qw = sh.heads * sh.dim;
    std::vector<float> kc(sh.kvHeads * stride), vc(sh.kvHeads * stride);
    for (auto *v : {&kc, &vc})
      for (auto &f : *v)
        f = 2.0f * d(rng);
    for (uint64_t len0 : {1u, 3u, 64u, 65u, 130u})
      for (uint64_t rows : {1u, 5u, 64u, 70u}) {
        std::vector<float> q(rows * qw);
        for (auto &f : q)
          f = 2.0f * d(rng);
        for (auto [h0, h1] : {std::pair<uint64_t, uint64_t>{0, sh.heads},
                              {1, sh.heads - 1}}) {
          std::vector<float> many(rows * qw, -3.0f), one(qw, -3.0f);
          AttendRows(q.data(), qw, rows, len0, kc.data(), vc.data(), stride,
                     sh.heads, sh.kvHeads, sh.dim, h0, h1, many.data(), qw);
          for (uint64_t r = 0; r < rows; ++r) {
            AttendHeads(q.data() + r * qw, kc.data(), vc.data(), stride,
                        len0 + r, sh.heads, sh.kvHeads, sh.dim, h0, h1,
                        one.data());
            ASSERT_EQ(0, std::memcmp(one.data() + h0 * sh.dim,
                                     many.data() + r * qw + h0 * sh.dim,
                                     (h1 - h0) * sh.dim * 4))
                << "heads " << sh.heads << "/" << sh.kvHeads << ", dim "
                << sh.dim << ", len0 " << len0 << ", rows " << rows
                << ", row " << r << ", heads [" << h0 << ", " << h1 << ")";
          }
        }
      }
  }
}

/// --kv-cache f16: ToHalf rounds as the hardware's scalar conversion does
/// (to nearest even, overflow to infinity), and attention over a half cache
/// gives exactly the bits of attention over an fp32 cache holding the same
/// (rounded) values, for row runs, head ranges and a dim with a scalar tail.
TEST(HostKernels, HalfCacheAttendsAsTheSameValuesInFp32) {
  std::mt19937 rng(6);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x = {0.0f,     -0.0f, 1.0f,        -2.5f,   65504.0f,
                          65520.0f, 1e-8f, 3.14159265f, 6.1e-5f, -1e5f};
  for (int i = 0; i < 1000; ++i)
    x.push_back(4.0f * d(rng));
  std::vector<uint16_t> h(x.size());
  ToHalf(x.data(), x.size(), h.data());
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(h[i], _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT)) << x[i];
  EXPECT_EQ(h[2], 0x3C00); // 1.0
  EXPECT_EQ(h[4], 0x7BFF); // 65504, the largest half
  EXPECT_EQ(h[5], 0x7C00); // rounds past it: infinity
  struct Shape {
    uint64_t heads, kvHeads, dim;
  };
  for (Shape sh : {Shape{4, 2, 128}, Shape{3, 3, 36}}) {
    const uint64_t stride = 140 * sh.dim, qw = sh.heads * sh.dim;
    std::vector<float> kf(sh.kvHeads * stride), vf(sh.kvHeads * stride);
    std::vector<uint16_t> kh(kf.size()), vh(vf.size());
    for (auto [f, hv] : {std::pair{&kf, &kh}, {&vf, &vh}}) {
      for (auto &v : *f)
        v = 2.0f * d(rng);
      ToHalf(f->data(), f->size(), hv->data());
      for (size_t i = 0; i < f->size(); ++i)
        (*f)[i] = _cvtsh_ss((*hv)[i]); // the values the half cache holds
    }
    for (uint64_t len0 : {1u, 65u, 130u})
      for (uint64_t rows : {1u, 5u}) {
        std::vector<float> q(rows * qw);
        for (auto &f : q)
          f = 2.0f * d(rng);
        std::vector<float> a(rows * qw, -3.0f), b(rows * qw, -3.0f);
        AttendRows(q.data(), qw, rows, len0, kf.data(), vf.data(), stride,
                   sh.heads, sh.kvHeads, sh.dim, 1, sh.heads, a.data(), qw);
        AttendRows(q.data(), qw, rows, len0, kh.data(), vh.data(), stride,
                   sh.heads, sh.kvHeads, sh.dim, 1, sh.heads, b.data(), qw);
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
            << "dim " << sh.dim << ", len0 " << len0 << ", rows " << rows;
      }
  }
}

/// A cache in chunks of positions (GqaAttention's: chunk c of kv head h
/// at h * chunk + c * kvHeads * chunk rows) attends with the bits of the
/// same values with each head's positions contiguous, for lengths inside
/// one chunk, on its edge and across several, runs of rows, and a head
/// range that splits a group.
TEST(HostKernels, ChunkedCacheAttendsWithTheContiguousBits) {
  std::mt19937 rng(8);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const uint64_t heads = 6, kvHeads = 3, dim = 40, qw = heads * dim;
  const uint64_t maxSeq = 320, stride = maxSeq * dim;
  for (uint64_t chunk : {64u, 128u}) {
    std::vector<float> kf(kvHeads * stride), vf(kvHeads * stride);
    for (auto *v : {&kf, &vf})
      for (auto &f : *v)
        f = 2.0f * d(rng);
    // Room for whole chunks (GqaAttention rounds max_seq up to them).
    const uint64_t padded = (maxSeq + chunk - 1) / chunk * chunk;
    std::vector<float> kc(kvHeads * padded * dim), vc(kc.size());
    for (uint64_t h = 0; h < kvHeads; ++h)
      for (uint64_t p = 0; p < maxSeq; ++p) {
        const uint64_t row = (p / chunk * kvHeads + h) * chunk + p % chunk;
        std::copy_n(kf.data() + h * stride + p * dim, dim,
                    kc.data() + row * dim);
        std::copy_n(vf.data() + h * stride + p * dim, dim,
                    vc.data() + row * dim);
      }
    for (uint64_t len0 : {1u, 63u, 64u, 65u, 200u, 300u})
      for (uint64_t rows : {1u, 4u, 13u}) {
        if (len0 + rows - 1 > maxSeq)
          continue;
        std::vector<float> q(rows * qw);
        for (auto &f : q)
          f = 2.0f * d(rng);
        for (auto [h0, h1] : {std::pair<uint64_t, uint64_t>{0, 6}, {1, 4}}) {
          std::vector<float> a(rows * qw, -3.0f), b(rows * qw, -3.0f);
          AttendRows(q.data(), qw, rows, len0, kf.data(), vf.data(), stride,
                     heads, kvHeads, dim, h0, h1, a.data(), qw);
          AttendRows(q.data(), qw, rows, len0, kc.data(), vc.data(),
                     chunk * dim, heads, kvHeads, dim, h0, h1, b.data(), qw,
                     chunk, kvHeads * chunk * dim);
          ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
              << "chunk " << chunk << ", len0 " << len0 << ", rows " << rows
              << ", heads " << h0 << "-" << h1;
        }
      }
  }
}

/// Vectorised GQA attention against a double-precision softmax-weighted
/// sum, over head ranges that split a kv head's group or not, a head
/// width with a scalar tail, and lengths with a tail of the 8-wide loops.
TEST(HostKernels, AttendHeadsMatchesDoubleReference) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (uint64_t dim : {128u, 20u}) {
    const uint64_t heads = 8, kvHeads = 2, group = heads / kvHeads;
    for (uint64_t len : {1u, 7u, 64u, 301u}) {
      const uint64_t stride = 320 * dim; // room for 320 positions a head
      std::vector<float> q(heads * dim), kc(kvHeads * stride), vc(kvHeads * stride);
      for (auto *v : {&q, &kc, &vc})
        for (auto &f : *v)
          f = 3.0f * d(rng);
      for (auto [h0, h1] : {std::pair<uint64_t, uint64_t>{0, 8}, {1, 6}, {4, 5}}) {
        std::vector<float> out(heads * dim, -7.0f);
        AttendHeads(q.data(), kc.data(), vc.data(), stride, len, heads, kvHeads,
                    dim, h0, h1, out.data());
        for (uint64_t h = 0; h < heads; ++h) {
          const float *kh = kc.data() + h / group * stride;
          const float *vh = vc.data() + h / group * stride;
          std::vector<double> sc(len);
          double mx = -1e300, sum = 0;
          for (uint64_t t = 0; t < len; ++t) {
            double dot = 0;
            for (uint64_t i = 0; i < dim; ++i)
              dot += (double)q[h * dim + i] * kh[t * dim + i];
            sc[t] = dot / std::sqrt((double)dim);
            mx = std::max(mx, sc[t]);
          }
          for (auto &v : sc)
            sum += (v = std::exp(v - mx));
          for (uint64_t i = 0; i < dim; ++i) {
            double ref = 0, mag = 0;
            for (uint64_t t = 0; t < len; ++t) {
              ref += sc[t] / sum * vh[t * dim + i];
              mag += std::fabs(sc[t] / sum * vh[t * dim + i]);
            }
            if (h < h0 || h >= h1)
              ASSERT_EQ(out[h * dim + i], -7.0f) << "head " << h << " outside the range";
            else
              ASSERT_NEAR(out[h * dim + i], ref, 2e-5 * (mag + 1e-3))
                  << "dim " << dim << ", len " << len << ", head " << h << ", i " << i;
          }
        }
      }
    }
  }
}

} // namespace
} // namespace duck::runtime
