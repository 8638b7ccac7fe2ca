//===- Measure.cpp - A duck's own rates (Measure.h) -----------------------===//
#include "Measure.h"

#include "Team.h"
#include "Weights.h"

#include "duck_rt/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>

namespace duck::bench {
namespace {

/// The shape each kernel class is measured on: a DeepSeek-sized row count
/// and the K that selects the class.
struct ClassShape {
  duck_kernel_id kernel;
  uint32_t rows, k, block;
};
constexpr ClassShape kShapes[] = {
    {DUCK_KERNEL_GENERAL128, 2048, 7168, 128},
    {DUCK_KERNEL_GENERAL64, 2048, 7168, 64},
    {DUCK_KERNEL_GENERAL32, 2048, 7168, 32},
    {DUCK_KERNEL_EXACT128, 7168, 128, 128},
    {DUCK_KERNEL_EXACT64, 7168, 64, 64},
    {DUCK_KERNEL_EXACT32, 7168, 32, 32},
};

/// What every measurement of one run shares: the team, the cold arena,
/// the input vector and each core's GEMV scratch.
struct Bench {
  TeamConfig team;
  uint32_t cores;
  Buffer arena;
  Buffer x{7168 * sizeof(float)}, y{7168 * sizeof(float)};
  std::vector<std::vector<float>> xs;
  DuckRates *r;

  /// Keeps the worst load other processes put on the cores.
  void Noted(const Timing &t) {
    if (std::isnan(t.otherLoad) || std::isnan(r->other_load))
      r->other_load = NAN;
    else
      r->other_load = std::max(r->other_load, t.otherLoad);
  }
};

/// Streaming read of the arena, each core its part.
void MeasureRead(Bench &b) {
  std::atomic<uint64_t> sink{0};
  const uint64_t part = b.arena.size() / b.cores / 4096 * 4096;
  Timing t = measureOnCores(b.team, b.cores, [&](uint32_t core, uint64_t) {
    sink.fetch_xor(streamRead(b.arena.data() + core * part, part),
                   std::memory_order_relaxed);
  });
  b.r->read_gbs = double(part * b.cores) / t.callSeconds * 1e-9;
  b.Noted(t);
}

/// One GEMV of a random `rows` x `k` fp9 matrix, cold (cycled over copies
/// that fill the arena), its rows split over the cores as a duck's are.
Timing TimeColdGemv(Bench &b, uint32_t rows, uint32_t k, uint32_t block,
                    uint64_t seed) {
  const duck_fp9_desc desc = fp9Desc(rows, k, block);
  Buffer image(fp9ImageBytes(desc));
  packRandomFp9(desc, image.data(), seed);
  ColdSet set = fillCopies(b.arena, image.data(), fp9ImageBytes(desc));
  std::vector<duck_fp9_matrix> views;
  for (uint64_t i = 0; i < set.copies; ++i)
    views.push_back(duck_fp9_matrix_view(&desc, set.copy(i)));
  for (auto &v : b.xs)
    v.assign(2 * (uint64_t)k + 16, 0.0f);
  Timing t = measureOnCores(b.team, b.cores, [&](uint32_t core, uint64_t call) {
    uint32_t lo, hi;
    duck_smp_split(rows, b.cores, core, &lo, &hi);
    float *scratch = reinterpret_cast<float *>(
        (reinterpret_cast<uintptr_t>(b.xs[core].data()) + 31) & ~uintptr_t(31));
    if (lo < hi)
      duck_gemv(&views[call % views.size()], b.x.as<float>(),
                b.y.as<float>() + lo, lo, hi, scratch, DUCK_DECODE_SHIFT);
  });
  b.Noted(t);
  return t;
}

/// Each kernel class's rate on its shape.
void MeasureClasses(Bench &b) {
  for (const ClassShape &s : kShapes) {
    if (duck_select_kernel(s.k, s.block) != s.kernel)
      continue; // the selection rule changed; do not report a wrong class
    Timing t = TimeColdGemv(b, s.rows, s.k, s.block, 7 + s.kernel);
    b.r->gparam_s[s.kernel] = double(s.rows) * s.k / t.callSeconds * 1e-9;
    b.r->rows[s.kernel] = s.rows;
    b.r->k[s.kernel] = s.k;
  }
}

/// One small matrix (a Qwen3-30B-A3B expert's gate, 768 x 2048), cold,
/// against the large general128 matrix's rate: what a call costs beyond
/// its weights (its streams' start and its tail).
void MeasureCallCost(Bench &b) {
  if (b.r->gparam_s[DUCK_KERNEL_GENERAL128] <= 0)
    return;
  constexpr uint32_t kRows = 768, kK = 2048;
  Timing t = TimeColdGemv(b, kRows, kK, 128, 23);
  const double atRate =
      double(kRows) * kK / (b.r->gparam_s[DUCK_KERNEL_GENERAL128] * 1e9);
  b.r->gemv_call_us = std::max(0.0, t.callSeconds - atRate) * 1e6;
  b.r->gemv_call_rows = kRows;
  b.r->gemv_call_k = kK;
}

/// A prompt chunk: the dense prefill of kTokens rows through a
/// Qwen3-0.6B-sized FFN (gate/up then down, every weight decoded once a
/// chunk), cold, the cores sharing it as a duck's do.
void MeasurePrefill(Bench &b) {
  constexpr uint32_t kHidden = 1024, kInter = 3072, kTokens = 64;
  const uint32_t cores = b.cores;
  const FfnLayout ffn = ffnLayout(kHidden, kInter, 128);
  Buffer image(ffn.bytes);
  packRandomFfn(ffn, image.data(), 41);
  ColdSet set = fillCopies(b.arena, image.data(), ffn.bytes);
  std::vector<duck_ffn_weights> views;
  for (uint64_t i = 0; i < set.copies; ++i)
    views.push_back(ffnView(ffn, set.copy(i)));
  Buffer xin((uint64_t)kTokens * kHidden * sizeof(float));
  std::fill_n(xin.as<float>(), (uint64_t)kTokens * kHidden, 0.25f);
  Buffer out((uint64_t)kTokens * kHidden * sizeof(float));
  Buffer shared((uint64_t)kTokens * kInter * sizeof(float));
  std::vector<Buffer> scratch;
  for (uint32_t c = 0; c < cores; ++c)
    scratch.emplace_back(
        duck_ffn_scratch_floats(kHidden, kInter, kTokens) * sizeof(float));
  duck_barrier inner;
  duck_barrier_init(&inner, cores);
  inner.yield = yieldThread;
  const duck_smp_ctx smp{cores, &inner};
  Timing t = measureOnCores(b.team, cores, [&](uint32_t core, uint64_t call) {
    duck_mlp_prefill(&smp, core, &views[call % views.size()], xin.as<float>(),
                     kTokens, out.as<float>(), shared.as<float>(),
                     scratch[core].as<float>());
  });
  b.r->gemm_gmac_s = double(ffn.params()) * kTokens / t.callSeconds * 1e-9;
  b.r->gemm_tokens = kTokens;
  b.r->gemm_hidden = kHidden;
  b.r->gemm_inter = kInter;
  b.Noted(t);
}

} // namespace

DuckRates measureDuck(const DuckMeasureOptions &o) {
  DuckRates r;
  Bench b;
  b.cores = std::max(1u, o.cores);
  b.team.seconds = o.seconds;
  b.team.batches = 5;
  b.team.cpus = o.cpus;
  b.arena = Buffer(std::max<uint64_t>(o.arena_bytes, 16 << 20) / 4096 * 4096);
  std::fill_n(b.x.as<float>(), 7168, 0.5f);
  b.xs.resize(b.cores);
  b.r = &r;
  MeasureRead(b);
  MeasureClasses(b);
  MeasureCallCost(b);
  MeasurePrefill(b);
  return r;
}

} // namespace duck::bench
