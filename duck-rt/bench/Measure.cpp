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

} // namespace

DuckRates measureDuck(const DuckMeasureOptions &o) {
  DuckRates r;
  const uint32_t cores = std::max(1u, o.cores);
  TeamConfig team;
  team.seconds = o.seconds;
  team.batches = 5;
  team.cpus = o.cpus;
  std::atomic<uint64_t> sink{0};
  auto noted = [&](const Timing &t) {
    if (std::isnan(t.otherLoad) || std::isnan(r.other_load))
      r.other_load = NAN;
    else
      r.other_load = std::max(r.other_load, t.otherLoad);
  };

  Buffer arena(std::max<uint64_t>(o.arena_bytes, 16 << 20) / 4096 * 4096);
  {
    const uint64_t part = arena.size() / cores / 4096 * 4096;
    Timing t = measureOnCores(team, cores, [&](uint32_t core, uint64_t) {
      sink.fetch_xor(streamRead(arena.data() + core * part, part),
                     std::memory_order_relaxed);
    });
    r.read_gbs = double(part * cores) / t.callSeconds * 1e-9;
    noted(t);
  }

  Buffer x(7168 * sizeof(float)), y(7168 * sizeof(float));
  std::fill_n(x.as<float>(), 7168, 0.5f);
  std::vector<std::vector<float>> xs(cores);
  for (const ClassShape &s : kShapes) {
    const duck_fp9_desc desc = fp9Desc(s.rows, s.k, s.block);
    if (duck_select_kernel(s.k, s.block) != s.kernel)
      continue; // the selection rule changed; do not report a wrong class
    Buffer image(fp9ImageBytes(desc));
    packRandomFp9(desc, image.data(), 7 + s.kernel);
    ColdSet set = fillCopies(arena, image.data(), fp9ImageBytes(desc));
    std::vector<duck_fp9_matrix> views;
    for (uint64_t i = 0; i < set.copies; ++i)
      views.push_back(duck_fp9_matrix_view(&desc, set.copy(i)));
    for (auto &v : xs)
      v.assign(2 * (uint64_t)s.k + 16, 0.0f);
    Timing t = measureOnCores(team, cores, [&](uint32_t core, uint64_t call) {
      uint32_t b, e;
      duck_smp_split(s.rows, cores, core, &b, &e);
      float *scratch = reinterpret_cast<float *>(
          (reinterpret_cast<uintptr_t>(xs[core].data()) + 31) & ~uintptr_t(31));
      if (b < e)
        duck_gemv(&views[call % views.size()], x.as<float>(), y.as<float>() + b, b, e,
                  scratch, DUCK_DECODE_SHIFT);
    });
    r.gparam_s[s.kernel] = double(s.rows) * s.k / t.callSeconds * 1e-9;
    r.rows[s.kernel] = s.rows;
    r.k[s.kernel] = s.k;
    noted(t);
  }

  // One small matrix (a Qwen3-30B-A3B expert's gate, 768 x 2048), cold,
  // against the large general128 matrix's rate: what a call costs beyond
  // its weights (its streams' start and its tail).
  if (r.gparam_s[DUCK_KERNEL_GENERAL128] > 0) {
    constexpr uint32_t kRows = 768, kK = 2048;
    const duck_fp9_desc desc = fp9Desc(kRows, kK, 128);
    Buffer image(fp9ImageBytes(desc));
    packRandomFp9(desc, image.data(), 23);
    ColdSet set = fillCopies(arena, image.data(), fp9ImageBytes(desc));
    std::vector<duck_fp9_matrix> views;
    for (uint64_t i = 0; i < set.copies; ++i)
      views.push_back(duck_fp9_matrix_view(&desc, set.copy(i)));
    for (auto &v : xs)
      v.assign(2 * (uint64_t)kK + 16, 0.0f);
    Timing t = measureOnCores(team, cores, [&](uint32_t core, uint64_t call) {
      uint32_t b, e;
      duck_smp_split(kRows, cores, core, &b, &e);
      float *scratch = reinterpret_cast<float *>(
          (reinterpret_cast<uintptr_t>(xs[core].data()) + 31) & ~uintptr_t(31));
      if (b < e)
        duck_gemv(&views[call % views.size()], x.as<float>(), y.as<float>() + b,
                  b, e, scratch, DUCK_DECODE_SHIFT);
    });
    const double atRate =
        double(kRows) * kK / (r.gparam_s[DUCK_KERNEL_GENERAL128] * 1e9);
    r.gemv_call_us = std::max(0.0, t.callSeconds - atRate) * 1e6;
    r.gemv_call_rows = kRows;
    r.gemv_call_k = kK;
    noted(t);
  }

  // A prompt chunk: the dense prefill of kGemmTokens rows through a
  // Qwen3-0.6B-sized FFN (gate/up then down, every weight decoded once a
  // chunk), cold, the cores sharing it as a duck's do.
  {
    constexpr uint32_t kHidden = 1024, kInter = 3072, kTokens = 64;
    const FfnLayout ffn = ffnLayout(kHidden, kInter, 128);
    Buffer image(ffn.bytes);
    packRandomFfn(ffn, image.data(), 41);
    ColdSet set = fillCopies(arena, image.data(), ffn.bytes);
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
    Timing t = measureOnCores(team, cores, [&](uint32_t core, uint64_t call) {
      duck_mlp_prefill(&smp, core, &views[call % views.size()], xin.as<float>(),
                       kTokens, out.as<float>(), shared.as<float>(),
                       scratch[core].as<float>());
    });
    r.gemm_gmac_s = double(ffn.params()) * kTokens / t.callSeconds * 1e-9;
    r.gemm_tokens = kTokens;
    r.gemm_hidden = kHidden;
    r.gemm_inter = kInter;
    noted(t);
  }
  return r;
}

} // namespace duck::bench
