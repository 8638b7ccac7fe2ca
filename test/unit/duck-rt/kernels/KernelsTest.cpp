// Randomised tests of the AVX2 kernels against the scalar references, and of
// their bit-identity across kernels, decode paths, core counts and prefill.
#include "duck_rt/kernels.h"
#include "Fp8Matrix.h"
#include "duck_rt/kernels_ref.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace {

/// 64-byte aligned float/byte storage.
template <typename T> struct Aligned {
  std::vector<uint64_t> raw;
  T *ptr = nullptr;
  explicit Aligned(uint64_t n = 0) { resize(n); }
  void resize(uint64_t n) {
    raw.assign(n * sizeof(T) / 8 + 16, 0);
    auto p = reinterpret_cast<uintptr_t>(raw.data());
    ptr = reinterpret_cast<T *>((p + 63) / 64 * 64);
  }
  T *get() { return ptr; }
};

/// A random FP8 source matrix packed to fp9 (a slice starting at row0),
/// with its e4m3 bytes (duck::fixtures::Fp8Matrix).
struct TestMatrix {
  duck::fixtures::Fp8Matrix m;
  duck_fp9_desc desc;
  duck_fp9_matrix view;

  TestMatrix(uint32_t rows, uint32_t k, uint32_t block, uint32_t row0,
             std::mt19937 &rng)
      : m(rows, k, block, row0, rng), desc(m.desc()), view(m.fp9()) {
    EXPECT_TRUE(m.ok()) << rows << " x " << k << ", block " << block;
  }
  duck::ref::Matrix ref() { return {desc, m.packed()}; }
  /// The slice's e4m3 bytes with the fp9 scale plane, as the host holds an
  /// FP8 matrix.
  duck_fp9_matrix e4m3View() const { return m.e4m3(); }
};

std::vector<float> randomVector(uint32_t n, std::mt19937 &rng, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto &x : v)
    x = d(rng);
  return v;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// fp32 rounding bound for a K-term dot product: (K + 2) u sum|w x|.
double tolerance(uint32_t k, double absSum) {
  return (k + 2) * std::ldexp(1.0, -24) * absSum + 1e-30;
}

/// The test host may run more threads than it has cores.
void yieldThread() { std::this_thread::yield(); }

/// Runs fn(core) on `cores` threads (core 0 on the calling thread).
void onCores(uint32_t cores, const std::function<void(uint32_t)> &fn) {
  std::vector<std::thread> threads;
  for (uint32_t c = 1; c < cores; ++c)
    threads.emplace_back(fn, c);
  fn(0);
  for (auto &t : threads)
    t.join();
}

struct Shape {
  uint32_t rows, k, block, row0;
};

const Shape kShapes[] = {
    {64, 7168, 128, 64}, // DeepSeek gate/up slice at tp32 (phase 64)
    {130, 64, 64, 0},    // exact64 (DeepSeek down at tp32)
    {67, 128, 128, 5},   // exact128 (Qwen3-235B down at tp12), odd rows
    {50, 768, 64, 128},  // general64
    {37, 256, 32, 100},  // general32, tile boundary inside
    {300, 64, 32, 0},    // K == 64 with 32-blocks: general32
    {70, 32, 32, 60},    // exact32 (Qwen3-30B-A3B down at tp24), odd rows
    {3, 2048, 128, 0},
    {7, 1056, 32, 3}, // K a panel segment of 1024 (four of 256) and a chunk
    {7, 288, 32, 3},  // K a panel segment of 256 and one chunk more
    {9, 512, 128, 0}, // K two panel segments of 256, half of 1024
};

TEST(Kernels, SelectionRule) {
  EXPECT_EQ(duck_select_kernel(64, 64), DUCK_KERNEL_EXACT64);
  EXPECT_EQ(duck_select_kernel(128, 128), DUCK_KERNEL_EXACT128);
  EXPECT_EQ(duck_select_kernel(7168, 128), DUCK_KERNEL_GENERAL128);
  EXPECT_EQ(duck_select_kernel(768, 64), DUCK_KERNEL_GENERAL64);
  EXPECT_EQ(duck_select_kernel(64, 32), DUCK_KERNEL_GENERAL32);
  EXPECT_EQ(duck_select_kernel(32, 32), DUCK_KERNEL_EXACT32);
  EXPECT_STREQ(duck_kernel_name(DUCK_KERNEL_EXACT64), "exact64");
}

// Every kernel on every shape agrees with the fp64 reference within the
// fp32 summation bound, on full row ranges and on sub-ranges.
TEST(Kernels, GemvMatchesReference) {
  std::mt19937 rng(11);
  for (const Shape &s : kShapes) {
    TestMatrix m(s.rows, s.k, s.block, s.row0, rng);
    auto x = randomVector(s.k, rng);
    std::vector<double> want, absSum;
    duck::ref::gemv(m.ref(), x.data(), want, &absSum);
    Aligned<float> xs(2 * s.k);
    for (duck_decode_path path : {DUCK_DECODE_SHIFT, DUCK_DECODE_F16C}) {
      std::vector<float> y(s.rows);
      duck_gemv(&m.view, x.data(), y.data(), 0, s.rows, xs.get(), path);
      for (uint32_t r = 0; r < s.rows; ++r)
        ASSERT_NEAR(y[r], want[r], tolerance(s.k, absSum[r]))
            << "shape " << s.rows << "x" << s.k << " block " << s.block
            << " row " << r << " path " << path;
      // A sub-range gives the same bits as the full range.
      uint32_t b = s.rows / 3, e = s.rows - s.rows / 4;
      std::vector<float> part(e - b);
      duck_gemv(&m.view, x.data(), part.data(), b, e, xs.get(), path);
      for (uint32_t r = b; r < e; ++r)
        ASSERT_EQ(bits(part[r - b]), bits(y[r])) << r;
    }
  }
}

// Each weight, read alone (x one-hot), is its own magnitude code times its
// sign and scale, bit for bit: the decode puts every code and every sign
// (all 32 positions of a sign word) where they belong, in the GEMV's exact
// and general kernels (GemmEqualsGemvPerToken holds the GEMM's paths to the
// GEMV's bits).
TEST(Kernels, EveryWeightIsItsCodeSignAndScale) {
  std::mt19937 rng(10);
  const Shape shapes[] = {{40, 256, 128, 64},
                          {24, 64, 64, 0},
                          {12, 128, 128, 0},
                          {33, 32, 32, 0},
                          {20, 96, 32, 3}};
  for (const Shape &s : shapes) {
    TestMatrix m(s.rows, s.k, s.block, s.row0, rng);
    const duck_fp9_matrix &v = m.view;
    Aligned<float> xs(2 * s.k);
    std::vector<float> x(s.k, 0.0f), y(s.rows);
    uint32_t negatives = 0;
    for (uint32_t i = 0; i < s.k; ++i) {
      x.assign(s.k, 0.0f);
      x[i] = 1.0f;
      duck_gemv(&v, x.data(), y.data(), 0, s.rows, xs.get(), DUCK_DECODE_SHIFT);
      for (uint32_t r = 0; r < s.rows; ++r) {
        const uint8_t code = v.mag[(uint64_t)r * s.k + i];
        const uint32_t sign =
            v.sign[(uint64_t)r * (s.k / 32) + i / 32] >> (i % 32) & 1;
        const uint32_t tile = (r + v.row_phase) / v.scale_rows;
        const float scale =
            v.scale[(uint64_t)tile * (s.k / s.block) + i / s.block];
        const float want = duck_fp9_decode(sign, code) * scale;
        negatives += sign;
        ASSERT_EQ(y[r], want)
            << s.rows << "x" << s.k << " row " << r << " column " << i
            << " code " << unsigned(code) << " sign " << sign;
      }
    }
    EXPECT_GT(negatives, 0u);
  }
}

// Exact and general kernels share one accumulation order: identical bits;
// the F16C path agrees within the fp32 rounding bound.
TEST(Kernels, ExactAndGeneralKernelsAreBitIdentical) {
  std::mt19937 rng(12);
  for (const Shape &s : kShapes) {
    TestMatrix m(s.rows, s.k, s.block, s.row0, rng);
    auto x = randomVector(s.k, rng, 3.0f);
    Aligned<float> xs(2 * s.k);
    std::vector<float> a(s.rows), b(s.rows), c(s.rows);
    duck_gemv(&m.view, x.data(), a.data(), 0, s.rows, xs.get(), DUCK_DECODE_SHIFT);
    duck_gemv(&m.view, x.data(), b.data(), 0, s.rows, xs.get(), DUCK_DECODE_F16C);
    duck_fp9_matrix general = m.view;
    general.kernel = duck_select_kernel(s.k + 1024, s.block); // force general
    duck_gemv(&general, x.data(), c.data(), 0, s.rows, xs.get(), DUCK_DECODE_SHIFT);
    std::vector<double> want, absSum;
    duck::ref::gemv(m.ref(), x.data(), want, &absSum);
    for (uint32_t r = 0; r < s.rows; ++r) {
      // The F16C path reads weights in natural order, the shift path in its
      // shuffle-free order: both within the fp32 bound, not bit-equal.
      ASSERT_NEAR(b[r], a[r], 2 * tolerance(s.k, absSum[r]))
          << "F16C, row " << r;
      ASSERT_EQ(bits(a[r]), bits(c[r])) << "general differs, row " << r;
    }
  }
}

/// Runs `body` with the kernels' panel segment (1024 columns) and two
/// shorter ones, then sets the kernels' own again.
template <typename Body> void forEachPanelSegment(Body body) {
  for (uint32_t seg : {256u, 512u, 1024u}) {
    SCOPED_TRACE(testing::Message() << "panel segment " << seg);
    duck_gemm_set_panel_segment(seg);
    body();
  }
  duck_gemm_set_panel_segment(0);
}

// GEMM over token tiles equals GEMV token by token, bit for bit (odd token
// counts exercise the half tile; 17 and 37 the group-pair order's tiles of
// 3 tokens with 2 and 1 left over), with every panel segment.
TEST(Kernels, GemmEqualsGemvPerToken) {
  forEachPanelSegment([] {
    std::mt19937 rng(13);
    for (const Shape &s : kShapes) {
      TestMatrix m(s.rows, s.k, s.block, s.row0, rng);
      for (uint32_t tokens : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 17u, 37u}) {
        auto x = randomVector(tokens * s.k, rng);
        // The scratch the contract names, and a guard after it.
        const uint64_t scratch = 2ull * tokens * s.k, guard = 64;
        Aligned<float> xs(scratch + guard);
        std::fill_n(xs.get() + scratch, guard, 1234.5f);
        std::vector<float> y(tokens * s.rows);
        duck_gemm(&m.view, x.data(), s.k, tokens, y.data(), s.rows, 0, s.rows,
                  xs.get());
        for (uint64_t i = 0; i < guard; ++i)
          ASSERT_EQ(xs.get()[scratch + i], 1234.5f)
              << "duck_gemm wrote past its scratch, k " << s.k << " tokens "
              << tokens;
        Aligned<float> xs1(2 * s.k);
        std::vector<float> one(s.rows);
        for (uint32_t t = 0; t < tokens; ++t) {
          duck_gemv(&m.view, x.data() + t * s.k, one.data(), 0, s.rows,
                    xs1.get(), DUCK_DECODE_SHIFT);
          for (uint32_t r = 0; r < s.rows; ++r)
            ASSERT_EQ(bits(y[t * s.rows + r]), bits(one[r]))
                << "token " << t << " row " << r << " k " << s.k;
        }
      }
    }
  });
}

// An FP8 matrix read as its e4m3 bytes (a host without AVX-512) gives the
// fp9 kernels' bits, for one token (the GEMV), 2 to 4 (in registers) and
// more (the panel, either segment), on every shape and on a range of rows.
TEST(Kernels, E4m3HasTheFp9KernelsBits) {
  forEachPanelSegment([] {
    std::mt19937 rng(21);
    for (const Shape &s : kShapes) {
      TestMatrix m(s.rows, s.k, s.block, s.row0, rng);
      const duck_fp9_matrix e = m.e4m3View();
      for (uint32_t tokens : {1u, 2u, 3u, 4u, 5u, 9u, 16u, 17u, 37u}) {
        auto x = randomVector(tokens * s.k, rng);
        Aligned<float> xs(2 * tokens * s.k);
        const uint64_t scratch = duck_e4m3_gemm_scratch_floats(tokens, s.k);
        Aligned<float> xe(scratch + 64);
        std::fill_n(xe.get() + scratch, 64, 1234.5f);
        std::vector<float> want(tokens * s.rows), got(tokens * s.rows, -1.0f);
        duck_gemm(&m.view, x.data(), s.k, tokens, want.data(), s.rows, 0,
                  s.rows, xs.get());
        duck_e4m3_gemm(&e, x.data(), s.k, tokens, got.data(), s.rows, 0, s.rows,
                       xe.get());
        for (uint64_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(bits(got[i]), bits(want[i]))
              << "k " << s.k << " tokens " << tokens << " token " << i / s.rows
              << " row " << i % s.rows;
        for (int i = 0; i < 64; ++i)
          ASSERT_EQ(xe.get()[scratch + i], 1234.5f) << "past the scratch";
        const uint32_t b = s.rows / 3, end = s.rows - s.rows / 4;
        std::vector<float> part(tokens * (end - b));
        duck_e4m3_gemm(&e, x.data(), s.k, tokens, part.data(), end - b, b, end,
                       xe.get());
        for (uint32_t t = 0; t < tokens; ++t)
          for (uint32_t r = b; r < end; ++r)
            ASSERT_EQ(bits(part[t * (end - b) + r - b]),
                      bits(want[t * s.rows + r]))
                << "rows from " << b << ", k " << s.k << " token " << t;
      }
    }
  });
}

struct TestFfn {
  std::unique_ptr<TestMatrix> gate, up, down;
  duck_ffn_weights w{};
  TestFfn(uint32_t hidden, uint32_t inter, uint32_t block, std::mt19937 &rng) {
    gate = std::make_unique<TestMatrix>(inter, hidden, block, 0, rng);
    up = std::make_unique<TestMatrix>(inter, hidden, block, 0, rng);
    down = std::make_unique<TestMatrix>(hidden, inter, block, 0, rng);
    w = {gate->view, up->view, down->view};
  }
  duck::ref::Ffn ref() { return {gate->ref(), up->ref(), down->ref()}; }
};

/// Per-core scratch for the FFN entry points.
/// A barrier and the SMP context over it for `cores` test threads.
struct SmpTeam {
  explicit SmpTeam(uint32_t cores) : smp{cores, &bar} {
    duck_barrier_init(&bar, cores);
    bar.yield = yieldThread;
  }
  SmpTeam(const SmpTeam &) = delete;
  SmpTeam &operator=(const SmpTeam &) = delete;
  duck_barrier bar;
  duck_smp_ctx smp;
};

struct CoreScratch {
  std::vector<std::unique_ptr<Aligned<float>>> per;
  CoreScratch(uint32_t cores, uint64_t floats) {
    for (uint32_t c = 0; c < cores; ++c)
      per.push_back(std::make_unique<Aligned<float>>(floats));
  }
  float *operator[](uint32_t c) { return per[c]->get(); }
};

// Dense MLP decode: identical bits on 1..4 cores, close to the reference.
TEST(Kernels, MlpDecodeAcrossCores) {
  std::mt19937 rng(14);
  const uint32_t hidden = 256, inter = 192;
  TestFfn f(hidden, inter, 64, rng);
  auto x = randomVector(hidden, rng);
  std::vector<double> want, absSum;
  duck::ref::ffn(f.ref(), x.data(), want, &absSum);
  std::vector<float> first;
  for (uint32_t cores = 1; cores <= 4; ++cores) {
    SmpTeam team(cores);
    const duck_smp_ctx &smp = team.smp;
    CoreScratch scratch(cores, duck_ffn_scratch_floats(hidden, inter, 1));
    Aligned<float> shared(inter);
    std::vector<float> out(hidden);
    onCores(cores, [&](uint32_t c) {
      duck_mlp_decode(&smp, c, &f.w, x.data(), out.data(), shared.get(),
                      scratch[c]);
    });
    for (uint32_t j = 0; j < hidden; ++j) {
      // The hidden activation is rounded to fp32 in both; the down GEMV's
      // bound applies, plus the gate/up error propagated through SiLU.
      ASSERT_NEAR(out[j], want[j], 4 * tolerance(inter + hidden, absSum[j]))
          << j;
    }
    if (cores == 1)
      first = out;
    else
      for (uint32_t j = 0; j < hidden; ++j)
        ASSERT_EQ(bits(out[j]), bits(first[j])) << cores << " cores, " << j;
  }
}

std::vector<duck_expert_slot> randomSlots(uint32_t n, uint32_t experts,
                                          std::mt19937 &rng) {
  std::vector<uint32_t> ids(experts);
  for (uint32_t i = 0; i < experts; ++i)
    ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  std::uniform_real_distribution<float> w(0.05f, 0.5f);
  std::vector<duck_expert_slot> s(n);
  for (uint32_t i = 0; i < n; ++i)
    s[i] = {ids[i], w(rng)};
  return s;
}

struct MoeFixture {
  uint32_t hidden, inter, nExperts;
  std::vector<std::unique_ptr<TestFfn>> experts;
  std::vector<duck_ffn_weights> w;
  std::vector<duck::ref::Ffn> refs;
  MoeFixture(uint32_t h, uint32_t i, uint32_t e, uint32_t block, std::mt19937 &rng)
      : hidden(h), inter(i), nExperts(e) {
    for (uint32_t j = 0; j < e; ++j) {
      experts.push_back(std::make_unique<TestFfn>(h, i, block, rng));
      w.push_back(experts.back()->w);
      refs.push_back(experts.back()->ref());
    }
  }
};

// MoE decode (modes 1 and 4): identical bits whatever the core count (more
// cores than slots too), close to the reference.
TEST(Kernels, MoeDecodeAcrossCores) {
  std::mt19937 rng(15);
  MoeFixture f(128, 64, 16, 64, rng);
  for (uint32_t topk : {1u, 3u, 8u}) {
    auto slots = randomSlots(topk, f.nExperts, rng);
    auto x = randomVector(f.hidden, rng);
    std::vector<double> want, absSum;
    duck::ref::moe(f.refs, slots.data(), topk, x.data(), want, &absSum);
    std::vector<float> first;
    for (uint32_t cores = 1; cores <= 4; ++cores) {
      SmpTeam team(cores);
      const duck_smp_ctx &smp = team.smp;
      CoreScratch scratch(cores, duck_ffn_scratch_floats(f.hidden, f.inter, 1));
      Aligned<float> slotOut((uint64_t)topk * f.hidden);
      std::vector<float> out(f.hidden);
      auto s = slots;
      onCores(cores, [&](uint32_t c) {
        duck_moe_decode(&smp, c, f.w.data(), f.nExperts, s.data(), topk,
                        x.data(), out.data(), slotOut.get(), scratch[c]);
      });
      for (uint32_t j = 0; j < f.hidden; ++j)
        ASSERT_NEAR(out[j], want[j],
                    4 * tolerance(f.inter + f.hidden, absSum[j]) +
                        topk * std::ldexp(std::fabs(want[j]), -22))
            << "topk " << topk << " j " << j;
      if (cores == 1)
        first = out;
      else
        for (uint32_t j = 0; j < f.hidden; ++j)
          ASSERT_EQ(bits(out[j]), bits(first[j])) << cores << " cores";
    }
  }
}

// One slot over every core (duck_moe_decode_one, a staged step's shared
// expert): the bits of duck_moe_decode's one slot on one core, for each
// K-block (64, 128) and intermediate, and
// zeros for an expert the duck does not hold.
TEST(Kernels, MoeDecodeOneSlotSplitOverCores) {
  std::mt19937 rng(151);
  for (auto [block, inter] : {std::pair<uint32_t, uint32_t>{64, 64},
                              {64, 192},
                              {128, 128},
                              {128, 384}}) {
    MoeFixture f(256, inter, 4, block, rng);
    auto x = randomVector(f.hidden, rng);
    for (duck_expert_slot slot :
         {duck_expert_slot{2, 0.37f}, duck_expert_slot{3, 1.0f},
          duck_expert_slot{9, 1.0f}}) {
      std::vector<float> want(f.hidden);
      {
        SmpTeam team(1);
        const duck_smp_ctx &smp = team.smp;
        CoreScratch scratch(1, duck_ffn_scratch_floats(f.hidden, f.inter, 1));
        Aligned<float> slotOut(f.hidden);
        auto s = slot;
        duck_moe_decode(&smp, 0, f.w.data(), f.nExperts, &s, 1, x.data(),
                        want.data(), slotOut.get(), scratch[0]);
      }
      for (uint32_t cores = 1; cores <= 4; ++cores) {
        SmpTeam team(cores);
        const duck_smp_ctx &smp = team.smp;
        CoreScratch scratch(cores,
                            duck_ffn_scratch_floats(f.hidden, f.inter, 1));
        Aligned<float> shared(f.inter);
        std::vector<float> out(f.hidden, 1.0f);
        onCores(cores, [&](uint32_t c) {
          duck_moe_decode_one(&smp, c, f.w.data(), f.nExperts, &slot, x.data(),
                              out.data(), shared.get(), scratch[c]);
        });
        for (uint32_t j = 0; j < f.hidden; ++j)
          ASSERT_EQ(bits(out[j]), bits(want[j]))
              << cores << " cores, block " << block << ", inter " << inter
              << ", expert " << slot.expert << ", j " << j;
      }
    }
  }
}

// Dense prefill (mode 5) equals decode token by token, on any core count.
TEST(Kernels, MlpPrefillEqualsDecode) {
  std::mt19937 rng(16);
  const uint32_t hidden = 128, inter = 256, tokens = 7;
  TestFfn f(hidden, inter, 128, rng);
  auto x = randomVector(tokens * hidden, rng);
  std::vector<float> decoded(tokens * hidden);
  {
    SmpTeam team(1);
    const duck_smp_ctx &smp = team.smp;
    CoreScratch scratch(1, duck_ffn_scratch_floats(hidden, inter, 1));
    Aligned<float> shared(inter);
    for (uint32_t t = 0; t < tokens; ++t)
      duck_mlp_decode(&smp, 0, &f.w, x.data() + t * hidden,
                      decoded.data() + t * hidden, shared.get(), scratch[0]);
  }
  for (uint32_t cores = 1; cores <= 3; ++cores) {
    SmpTeam team(cores);
    const duck_smp_ctx &smp = team.smp;
    CoreScratch scratch(cores, duck_ffn_scratch_floats(hidden, inter, tokens));
    Aligned<float> shared((uint64_t)tokens * inter);
    std::vector<float> out(tokens * hidden);
    onCores(cores, [&](uint32_t c) {
      duck_mlp_prefill(&smp, c, &f.w, x.data(), tokens, out.data(),
                       shared.get(), scratch[c]);
    });
    for (uint32_t i = 0; i < tokens * hidden; ++i)
      ASSERT_EQ(bits(out[i]), bits(decoded[i])) << cores << " cores, " << i;
  }
}

// MoE prefill (mode 6): counting sort, balanced expert groups, reduction in
// expert order; equals MoE decode token by token on any core count.
TEST(Kernels, MoePrefillEqualsDecode) {
  std::mt19937 rng(17);
  MoeFixture f(64, 96, 12, 32, rng);
  const uint32_t tokens = 9, topk = 4;
  std::vector<duck_expert_slot> slots;
  for (uint32_t t = 0; t < tokens; ++t) {
    auto s = randomSlots(topk, f.nExperts, rng);
    slots.insert(slots.end(), s.begin(), s.end());
  }
  auto x = randomVector(tokens * f.hidden, rng);
  std::vector<float> decoded(tokens * f.hidden);
  {
    SmpTeam team(1);
    const duck_smp_ctx &smp = team.smp;
    CoreScratch scratch(1, duck_ffn_scratch_floats(f.hidden, f.inter, 1));
    Aligned<float> slotOut((uint64_t)topk * f.hidden);
    for (uint32_t t = 0; t < tokens; ++t) {
      std::vector<duck_expert_slot> s(slots.begin() + t * topk,
                                      slots.begin() + (t + 1) * topk);
      duck_moe_decode(&smp, 0, f.w.data(), f.nExperts, s.data(), topk,
                      x.data() + t * f.hidden, decoded.data() + t * f.hidden,
                      slotOut.get(), scratch[0]);
    }
  }
  for (uint32_t cores = 1; cores <= 4; ++cores) {
    SmpTeam team(cores);
    const duck_smp_ctx &smp = team.smp;
    CoreScratch scratch(cores,
                        duck_ffn_scratch_floats(f.hidden, f.inter, tokens));
    std::vector<uint32_t> work(
        duck_moe_prefill_work_words(tokens, topk, f.nExperts, cores));
    Aligned<float> pairOut((uint64_t)tokens * topk * f.hidden);
    std::vector<float> out(tokens * f.hidden);
    onCores(cores, [&](uint32_t c) {
      duck_moe_prefill(&smp, c, f.w.data(), f.nExperts, slots.data(), topk,
                       x.data(), tokens, out.data(), pairOut.get(), work.data(),
                       scratch[c]);
    });
    for (uint32_t i = 0; i < tokens * f.hidden; ++i)
      ASSERT_EQ(bits(out[i]), bits(decoded[i])) << cores << " cores, " << i;
  }
}

// The barrier separates phases: no core sees a counter from the next round.
TEST(Smp, BarrierSeparatesRounds) {
  const uint32_t cores = 4, rounds = 2000;
  duck_barrier bar;
  duck_barrier_init(&bar, cores);
    bar.yield = yieldThread;
  std::vector<std::atomic<uint32_t>> counter(rounds);
  std::atomic<int> errors{0};
  onCores(cores, [&](uint32_t c) {
    for (uint32_t r = 0; r < rounds; ++r) {
      counter[r].fetch_add(1);
      duck_barrier_wait(&bar);
      if (counter[r].load() != cores)
        errors.fetch_add(1);
      duck_barrier_wait(&bar);
    }
  });
  EXPECT_EQ(errors.load(), 0);
}

// A secondary core that arrives late (after core 0 retired step s and
// published step s+1) must neither run step s's job again nor take step
// s+1's job for step s: it is told it missed step s, and then runs s+1.
TEST(Smp, LateWorkerRunsNeitherPreviousNorNextJob) {
  duck_job_board board;
  duck_job_board_init(&board);
  board.yield = yieldThread;
  int jobA = 1, jobB = 2;
  duck_job_publish(&board, &jobA, 1);
  EXPECT_EQ(duck_job_wait(&board, 1), &jobA);
  duck_job_retire(&board, 1);
  duck_job_publish(&board, &jobB, 2);
  // Late for step 1: the board has moved on.
  EXPECT_EQ(duck_job_wait(&board, 1), nullptr);
  EXPECT_EQ(duck_job_wait(&board, 2), &jobB);

  // A core waiting for step 3 while step 2 is still ACTIVE (a stale phase)
  // does not run step 2's job: it waits until 3 is published.
  std::atomic<const void *> seen{nullptr};
  std::thread late([&] { seen = duck_job_wait(&board, 3); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(seen.load(), nullptr);
  duck_job_retire(&board, 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(seen.load(), nullptr);
  int jobC = 3;
  duck_job_publish(&board, &jobC, 3);
  late.join();
  EXPECT_EQ(seen.load(), &jobC);
}

// Many steps with a secondary core delayed at random: every step runs each
// job exactly once per core.
TEST(Smp, JobBoardUnderRandomDelays) {
  const uint32_t cores = 3, steps = 300;
  duck_job_board board;
  duck_job_board_init(&board);
  board.yield = yieldThread;
  duck_barrier bar;
  duck_barrier_init(&bar, cores);
    bar.yield = yieldThread;
  std::vector<uint32_t> jobs(steps + 1);
  std::vector<std::atomic<uint32_t>> ran(steps + 1);
  onCores(cores, [&](uint32_t c) {
    std::mt19937 rng(c);
    for (uint64_t s = 1; s <= steps; ++s) {
      if (c == 0) {
        jobs[s] = (uint32_t)s;
        duck_job_publish(&board, &jobs[s], s);
      } else {
        if (rng() % 7 == 0)
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
        const void *j = duck_job_wait(&board, s);
        ASSERT_NE(j, nullptr);
        ASSERT_EQ(*static_cast<const uint32_t *>(j), s);
      }
      ran[s].fetch_add(1);
      duck_barrier_wait(&bar);
      if (c == 0)
        duck_job_retire(&board, s);
    }
  });
  for (uint32_t s = 1; s <= steps; ++s)
    EXPECT_EQ(ran[s].load(), cores) << s;
}

} // namespace
