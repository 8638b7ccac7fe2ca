//===- Team.cpp - Pinned threads that time work on 1..N cores -------------===//

#include "Team.h"

#include "Support.h"

#include "duck_rt/smp.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <thread>

namespace duck::bench {

void yieldThread() { sched_yield(); }

namespace {

/// Busy CPU seconds of the whole machine (user, nice, system, irq, softirq,
/// steal) from /proc/stat; negative if unreadable.
double machineBusySeconds() {
  FILE *f = std::fopen("/proc/stat", "r");
  if (!f)
    return -1;
  unsigned long long v[8] = {0};
  int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0],
                      &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
  std::fclose(f);
  if (n != 8)
    return -1;
  double ticks = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
  return ticks / (double)sysconf(_SC_CLK_TCK);
}

double processCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void pinToCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      std::fprintf(stderr,
                   "duck-bench: warning: cannot pin a thread to CPU %d\n", cpu);
  }
}

} // namespace

namespace {

/// Core 0's samples of the machine's and this process's CPU time before
/// the first timed batch and after the last.
struct Window {
  double busy0, own0, wall0, busy1, own1, wall1;
};

/// The medians over the batches, the cores' imbalance and the load other
/// processes put on the machine during the window.
Timing summarize(const std::vector<double> &wall,
                 const std::vector<std::vector<double>> &busy, uint64_t calls,
                 const Window &w) {
  Timing t;
  t.callSeconds = median(wall);
  t.bestCallSeconds = *std::min_element(wall.begin(), wall.end());
  double maxBusy = 0, sumBusy = 0;
  for (const std::vector<double> &core : busy) {
    t.coreSeconds.push_back(median(core));
    maxBusy = std::max(maxBusy, t.coreSeconds.back());
    sumBusy += t.coreSeconds.back();
  }
  t.imbalance =
      sumBusy > 0 ? maxBusy / (sumBusy / (double)busy.size()) : 1.0;
  t.calls = calls;
  // Core 0 samples before its first batch and after its last; the other
  // cores run the same batches, so the window covers all timed work.
  if (w.busy0 >= 0 && w.busy1 >= 0 && w.wall1 > w.wall0)
    t.otherLoad = std::max(0.0, ((w.busy1 - w.busy0) - (w.own1 - w.own0)) /
                                    (w.wall1 - w.wall0));
  else
    t.otherLoad = __builtin_nan("");
  return t;
}

} // namespace

Timing measureOnCores(const TeamConfig &config, uint32_t cores,
                      const CoreFn &fn) {
  const uint32_t batches = std::max<uint32_t>(config.batches, 1);
  duck_barrier barrier;
  duck_barrier_init(&barrier, cores);
  barrier.yield = yieldThread;
  // Core 0's decisions, published to the others between two barriers.
  std::atomic<uint64_t> warmMore{0}, perBatch{1};
  std::vector<double> wall(batches);
  double busy0 = 0, own0 = 0, wall0 = 0, busy1 = 0, own1 = 0, wall1 = 0;
  std::vector<std::vector<double>> busy(cores, std::vector<double>(batches));

  auto body = [&](uint32_t core) {
    if (!config.cpus.empty())
      pinToCpu(config.cpus[core % config.cpus.size()]);
    duck_barrier_wait(&barrier);
    uint64_t call = 0;
    // Warm-up: caches, TLB, branch predictors, clock ramp; also tells how
    // long one call takes.
    const double warmStart = nowSeconds();
    for (;;) {
      fn(core, call++);
      duck_barrier_wait(&barrier);
      if (core == 0) {
        double elapsed = nowSeconds() - warmStart;
        bool more = elapsed < config.seconds / 8 && call < 100000;
        warmMore.store(more, std::memory_order_relaxed);
        if (!more) {
          double perCall = elapsed / (double)call;
          double want = config.seconds * 7 / 8 / batches / perCall;
          perBatch.store(want < 1 ? 1 : (uint64_t)want,
                         std::memory_order_relaxed);
        }
      }
      duck_barrier_wait(&barrier);
      bool more = warmMore.load(std::memory_order_relaxed) != 0;
      duck_barrier_wait(&barrier); // core 0 may write again after this
      if (!more)
        break;
    }
    const uint64_t n = perBatch.load(std::memory_order_relaxed);
    if (core == 0) {
      busy0 = machineBusySeconds();
      own0 = processCpuSeconds();
      wall0 = nowSeconds();
    }
    for (uint32_t b = 0; b < batches; ++b) {
      duck_barrier_wait(&barrier);
      const double start = nowSeconds();
      double sum = 0;
      for (uint64_t i = 0; i < n; ++i) {
        double t0 = nowSeconds();
        fn(core, call++);
        sum += nowSeconds() - t0;
        duck_barrier_wait(&barrier);
      }
      if (core == 0)
        wall[b] = (nowSeconds() - start) / (double)n;
      busy[core][b] = sum / (double)n;
    }
    if (core == 0) {
      busy1 = machineBusySeconds();
      own1 = processCpuSeconds();
      wall1 = nowSeconds();
    }
  };

  std::vector<std::thread> threads;
  for (uint32_t c = 0; c < cores; ++c)
    threads.emplace_back(body, c);
  for (auto &t : threads)
    t.join();

  return summarize(wall, busy, perBatch.load() * batches,
                   {busy0, own0, wall0, busy1, own1, wall1});
}

uint64_t streamRead(const uint8_t *data, uint64_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (uint64_t i = 0; i + 128 <= bytes; i += 128) {
    const __m256i *p = reinterpret_cast<const __m256i *>(data + i);
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(p));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(p + 1));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(p + 2));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(p + 3));
  }
  __m256i s =
      _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  return (uint64_t)_mm256_extract_epi64(s, 0) ^
         (uint64_t)_mm256_extract_epi64(s, 3);
}

} // namespace duck::bench
