//===- BenchPrefetch.cpp - duck-bench prefetch: host weights read early ---===//
//
// What EngineOptions::host_prefetch_bytes buys on this machine: a MoE
// router's product (DeepSeek-V3.2's, 256 x 7168 in bf16, or a --rows x
// --k matrix; MatVec over the pool's --threads, as the runtime's router
// runs it, and MatVecRows on one core beside it) read cold, against the
// same product right after PrefetchRanges brought its weights in, each
// after a wait of --wait-us (the ducks' step it hides behind, in which the
// pool's threads park). Copies of the matrix are cycled through --cold-mib
// MiB, so each is cold before its prefetch. Prints the three times and
// rates and the warm product's speed-up; the prefetch's own time is what
// it costs while the ducks work (duckc's cost model does not count it).
//
//===----------------------------------------------------------------------===//
#include "BenchSubcommands.h"
#include "Common.h"

#include "duck/runtime/engine/HostKernels.h"
#include "duck_rt/abi.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace duck::bench;
using duck::runtime::ByteRange;
using duck::runtime::HostMatrix;

namespace {

struct PrefetchOptions {
  uint32_t rows = 256, k = 7168;
  uint64_t cold_mib = 0; // 0: four times the last-level cache, >= 256 MiB
  uint32_t wait_us = 200;
  uint32_t reps = 5;
  uint32_t threads = 0; // 0: every online core
  bool json = false;
};

void PrintUsage(FILE *out) {
  std::fprintf(
      out,
      "usage: duck-bench prefetch [--rows=256] [--k=7168] [--wait-us=200]\n"
      "  [--threads=N] [--cold-mib=4xLLC] [--reps=5] [--json]\n\n"
      "Times a bf16 router's product (rows x k, DeepSeek-V3.2's 256 x 7168\n"
      "by default; over the pool's --threads as the runtime routes a token,\n"
      "and on one core) cold, and again right after its weights were read\n"
      "into the caches (PrefetchRanges, what duckrun --host-prefetch does\n"
      "while a step is on the ducks); each product after a wait of --wait-us\n"
      "(the pool's threads park in it, as while the ducks work). Copies\n"
      "cycle through --cold-mib MiB so that each is cold before its read.\n"
      "Prints the time and GB/s of the cold product, of the prefetch and of\n"
      "the product after it, medians over --reps passes.\n");
}

bool Parse(int argc, char **argv, PrefetchOptions *o, std::string *bad) {
  bool badNumber = false; // said on stderr by parseWhole
  for (int i = 1; i < argc; ++i) {
    *bad = argv[i];
    auto val = [&](const char *key) { return flagValue(argv[i], key); };
    if (!std::strcmp(argv[i], "--json"))
      o->json = true;
    else if (const char *v = val("--rows"))
      o->rows = uint32_t(parseWhole("--rows", v, &badNumber));
    else if (const char *v = val("--k"))
      o->k = uint32_t(parseWhole("--k", v, &badNumber));
    else if (const char *v = val("--wait-us"))
      o->wait_us = uint32_t(parseWhole("--wait-us", v, &badNumber));
    else if (const char *v = val("--cold-mib"))
      o->cold_mib = parseWhole("--cold-mib", v, &badNumber, UINT64_MAX);
    else if (const char *v = val("--reps"))
      o->reps = uint32_t(parseWhole("--reps", v, &badNumber));
    else if (const char *v = val("--threads"))
      o->threads = uint32_t(parseWhole("--threads", v, &badNumber));
    else
      return false;
    if (badNumber) // *bad is the option
      return false;
  }
  if (o->rows < 1 || o->k < 16 || o->k % 16) {
    *bad = "--rows below 1 or --k not a multiple of 16";
    return false;
  }
  *bad = "--reps below 1";
  return o->reps >= 1;
}

struct Times {
  double cold = 0, prefetch = 0, warm = 0; // seconds a call, medians
};

/// `product(m, x, y)` over copies of the matrix cycled through coldBytes.
template <typename Product>
Times Measure(const PrefetchOptions &o, uint64_t coldBytes, Product product) {
  const uint64_t bytes = (uint64_t)o.rows * o.k * 2;
  const uint64_t copies =
      std::max<uint64_t>(2, (coldBytes + bytes - 1) / bytes);
  Buffer w(bytes * copies);
  for (uint64_t i = 0; i < bytes * copies / 2; ++i) // small bf16 values
    w.as<uint16_t>()[i] = (uint16_t)(0x3c00 + (i * 7) % 512);
  std::vector<HostMatrix> m(copies);
  std::vector<std::vector<ByteRange>> ranges(copies);
  for (uint64_t c = 0; c < copies; ++c) {
    m[c].rows = o.rows;
    m[c].cols = o.k;
    m[c].bf16 = w.as<uint16_t>() + c * bytes / 2;
    duck::runtime::AppendMatrixRanges(m[c], &ranges[c]);
  }
  std::vector<float> x(o.k, 0.01f), y(o.rows);
  std::vector<double> cold, pre, warm;
  for (uint32_t r = 0; r <= o.reps; ++r) { // the first pass warms up
    double tc = 0, tp = 0, tw = 0;
    for (uint64_t c = 0; c < copies; c += 2) {
      // An even copy cold, the next one prefetched; each read after the
      // same wait (the pool's threads park in it, as while the ducks work).
      const double w0 = nowSeconds();
      while (nowSeconds() - w0 < o.wait_us * 1e-6) {
      }
      double t0 = nowSeconds();
      product(m[c], x.data(), y.data());
      tc += nowSeconds() - t0;
      const uint64_t n = std::min(c + 1, copies - 1);
      t0 = nowSeconds();
      duck::runtime::PrefetchRanges(ranges[n], ~0ull);
      const double t1 = nowSeconds();
      tp += t1 - t0;
      while (nowSeconds() - t1 < o.wait_us * 1e-6) {
      }
      const double t2 = nowSeconds();
      product(m[n], x.data(), y.data());
      tw += nowSeconds() - t2;
    }
    const double calls = double((copies + 1) / 2);
    if (r) {
      cold.push_back(tc / calls);
      pre.push_back(tp / calls);
      warm.push_back(tw / calls);
    }
  }
  return {median(cold), median(pre), median(warm)};
}

} // namespace

int duckBenchPrefetch(int argc, char **argv) {
  PrefetchOptions o;
  if (argc > 1 &&
      (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
    PrintUsage(stdout);
    return 0;
  }
  std::string bad;
  if (!Parse(argc, argv, &o, &bad)) {
    std::fprintf(stderr, "duck-bench prefetch: bad argument: %s\n\n",
                 bad.c_str());
    PrintUsage(stderr);
    return 2;
  }
  const MachineInfo machine = detectMachine();
  const uint64_t coldBytes =
      o.cold_mib ? o.cold_mib << 20
                 : std::max<uint64_t>(256ull << 20, 4 * machine.llcBytes);
  const unsigned threads =
      o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  duck::runtime::ThreadPool pool(threads);
  const Times t =
      Measure(o, coldBytes, [&](const HostMatrix &m, const float *x, float *y) {
        duck::runtime::MatVec(pool, m, x, y);
      });
  const Times one =
      Measure(o, coldBytes, [&](const HostMatrix &m, const float *x, float *y) {
        duck::runtime::MatVecRows(m, x, y, 0, m.rows);
      });
  const double bytes = (double)o.rows * o.k * 2;
  const double coldGbs = bytes / t.cold / 1e9,
               preGbs = bytes / t.prefetch / 1e9,
               warmGbs = bytes / t.warm / 1e9;
  if (o.json) {
    JsonObject j;
    j.str("cpu", machine.cpuModel)
        .str("date", machine.date)
        .integer("rows", o.rows)
        .integer("k", o.k)
        .integer("bytes", (int64_t)bytes)
        .integer("wait_us", o.wait_us)
        .integer("threads", threads)
        .num("one_core_cold_gbs", bytes / one.cold / 1e9)
        .num("one_core_warm_gbs", bytes / one.warm / 1e9)
        .num("cold_us", t.cold * 1e6)
        .num("prefetch_us", t.prefetch * 1e6)
        .num("warm_us", t.warm * 1e6)
        .num("cold_gbs", coldGbs)
        .num("prefetch_gbs", preGbs)
        .num("warm_gbs", warmGbs)
        .num("warm_over_cold", t.cold / t.warm);
    std::printf("%s\n", j.text().c_str());
    return 0;
  }
  std::printf("duck-bench prefetch: %s, last-level cache %.0f MiB (%s)\n",
              machine.cpuModel.c_str(), machine.llcBytes / 1048576.0,
              machine.llcSource.c_str());
  std::printf("router %u x %u bf16 (%.2f MB), one core (MatVecRows): cold "
              "%.1f GB/s, after a prefetch %.1f GB/s\n",
              o.rows, o.k, bytes / 1e6, bytes / one.cold / 1e9,
              bytes / one.warm / 1e9);
  std::printf("over %u thread(s) (MatVec, the runtime's router):\n", threads);
  std::printf("  cold product         %8.1f us  %6.1f GB/s\n", t.cold * 1e6,
              coldGbs);
  std::printf("  prefetch             %8.1f us  %6.1f GB/s (while the ducks "
              "work)\n",
              t.prefetch * 1e6, preGbs);
  std::printf("  product after it     %8.1f us  %6.1f GB/s (%u us later)\n",
              t.warm * 1e6, warmGbs, o.wait_us);
  std::printf("  warm / cold rate     %8.2fx\n", t.cold / t.warm);
  return 0;
}
