//===- HostKernels.cpp - the host's share of the forward pass -------------===//
#include "duck/runtime/engine/HostKernels.h"
#include "duck_rt/exp_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

namespace duck::runtime {

//===----------------------------------------------------------------------===//
// ThreadPool
//===----------------------------------------------------------------------===//

void *HugePageMap(size_t bytes, bool noreserve) {
  // Map 2 MiB more than asked, keep the aligned part, return the rest.
  const size_t len = (bytes + 4095) & ~size_t(4095);
  void *m = mmap(nullptr, len + kHugePageBytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | (noreserve ? MAP_NORESERVE : 0),
                 -1, 0);
  if (m == MAP_FAILED)
    return nullptr;
  uint8_t *raw = static_cast<uint8_t *>(m);
  uint8_t *at = reinterpret_cast<uint8_t *>(
      (reinterpret_cast<uintptr_t>(raw) + kHugePageBytes - 1) &
      ~uintptr_t(kHugePageBytes - 1));
  if (at > raw)
    munmap(raw, size_t(at - raw));
  if (const size_t tail = size_t(raw + len + kHugePageBytes - (at + len)))
    munmap(at + len, tail);
  (void)madvise(at, len, MADV_HUGEPAGE); // best effort: THP may be off
  return at;
}

void *HugePageAlloc(size_t bytes) {
  if (bytes < kHugePageBytes) {
    void *p = std::malloc(bytes ? bytes : 1);
    if (!p)
      throw std::bad_alloc();
    return p;
  }
  void *p = HugePageMap(bytes, false);
  if (!p)
    throw std::bad_alloc();
  return p;
}

void HugePageFree(void *p, size_t bytes) {
  if (bytes < kHugePageBytes)
    std::free(p);
  else if (p)
    munmap(p, (bytes + 4095) & ~size_t(4095));
}

BackgroundPopulate &BackgroundPopulate::Get() {
  // Never destroyed: its detached thread may still run at exit.
  static BackgroundPopulate *const p = new BackgroundPopulate;
  return *p;
}

void PopulateRange(void *p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  const uintptr_t b = (uintptr_t)p & ~uintptr_t(4095),
                  e = ((uintptr_t)p + bytes + 4095) & ~uintptr_t(4095);
  if (bytes)
    (void)madvise(reinterpret_cast<void *>(b), e - b, MADV_POPULATE_WRITE);
#else
  (void)p, (void)bytes;
#endif
}

void BackgroundPopulate::Request(void *p, size_t bytes) {
  if (bytes == 0)
    return;
  std::lock_guard<std::mutex> l(mu_);
  if (!started_) {
    started_ = true;
    std::thread([this] { Loop(); }).detach();
  }
  queue_.push_back({(uintptr_t)p, (uintptr_t)p + bytes});
  cv_.notify_all();
}

void BackgroundPopulate::Forget(const void *p, size_t bytes) {
  const uintptr_t b = (uintptr_t)p, e = b + bytes;
  auto touches = [&](const Range &r) { return r.b < e && b < r.e; };
  std::unique_lock<std::mutex> l(mu_);
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(), touches),
               queue_.end());
  cv_.wait(l, [&] { return !touches(running_); });
}

size_t BackgroundPopulate::Pending() {
  std::lock_guard<std::mutex> l(mu_);
  return queue_.size() + (running_.e > running_.b ? 1 : 0);
}

void BackgroundPopulate::Drain() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return queue_.empty() && running_.e == running_.b; });
}

void BackgroundPopulate::Loop() {
  // The idle class: a CPU another thread wants is given up at once (the
  // kernel's page clearing reschedules between pages). Where the class
  // cannot be had, the lowest priority.
  sched_param sp{};
  if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0)
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return !queue_.empty(); });
    running_ = queue_.front();
    queue_.erase(queue_.begin());
    const Range r = running_;
    l.unlock();
    PopulateRange(reinterpret_cast<void *>(r.b), r.e - r.b);
    l.lock();
    running_ = Range{};
    cv_.notify_all();
  }
}

ThreadPool::ThreadPool(unsigned threads, uint64_t spin_ns) : spin_ns_(spin_ns) {
  for (unsigned i = 1; i < std::max(1u, threads); ++i)
    workers_.emplace_back([this] { Loop(); });
  cpu_set_t set;
  CPU_ZERO(&set);
  if (!workers_.empty() && sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set))
        cpus_.push_back(c);
  if (cpus_.size() < 2)
    cpus_.clear(); // one CPU: nowhere else to go
}

void ThreadPool::AvoidCallerCpu() {
  const int cpu = sched_getcpu();
  if (cpus_.empty() || cpu < 0 || cpu == caller_cpu_)
    return;
  caller_cpu_ = cpu;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus_)
    if (c != cpu)
      CPU_SET(c, &set);
  // Best effort: a worker that cannot move still runs, only maybe beside
  // the caller.
  for (std::thread &w : workers_)
    pthread_setaffinity_np(w.native_handle(), sizeof set, &set);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto &t : workers_)
    t.join();
}

static uint64_t nowNs() {
  return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {
constexpr uint64_t kChunkBits = 16, kChunkMask = (1u << kChunkBits) - 1;
uint64_t ClaimWord(uint64_t gen, uint64_t chunks, uint64_t next) {
  return gen << 32 | chunks << kChunkBits | next;
}
} // namespace

bool ThreadPool::Claim(uint64_t gen, uint64_t *begin, uint64_t *end) {
  uint64_t v = claim_.load();
  for (;;) {
    const uint64_t chunks = (v >> kChunkBits) & kChunkMask,
                   next = v & kChunkMask;
    if ((v >> 32) != (gen & 0xffffffffu) || next >= chunks)
      return false;
    // Read before the claim: a successful claim means the job was still
    // unfinished, so these are its fields (see job_).
    const uint64_t n = n_.load(), chunk = chunk_.load();
    if (claim_.compare_exchange_weak(v, v + 1)) {
      *begin = next * chunk;
      *end = std::min(n, *begin + chunk);
      return true;
    }
  }
}

void ThreadPool::RunChunks(uint64_t gen) {
  uint64_t b, e;
  while (Claim(gen, &b, &e)) {
    (*job_.load())(b, e);
    done_.fetch_add(1);
  }
}

void ThreadPool::Loop() {
  uint64_t seen = 0;
  for (;;) {
    // Spin a while for the next job, then sleep. The caller bumps
    // generation_ before it reads sleepers_, and a sleeper counts itself
    // under mu_ before it re-checks generation_ (both seq_cst), so a job is
    // either seen here or notified.
    const uint64_t start = nowNs();
    for (uint32_t i = 0; generation_.load() == seen && !stop_.load(); ++i) {
      _mm_pause();
      if (i % 256 == 255 &&
          (park_.load() == seen || nowNs() - start > spin_ns_)) {
        std::unique_lock<std::mutex> l(mu_);
        ++sleepers_;
        cv_.wait(l, [&] { return stop_.load() || generation_.load() != seen; });
        --sleepers_;
        break;
      }
    }
    if (stop_.load())
      return;
    seen = generation_.load();
    RunChunks(seen);
  }
}

void ThreadPool::ParallelFor(uint64_t n,
                             const std::function<void(uint64_t, uint64_t)> &fn,
                             uint64_t align) {
  if (workers_.empty() || n < 2) {
    fn(0, n);
    return;
  }
  AvoidCallerCpu();
  align = std::max<uint64_t>(1, align);
  const uint64_t units = (n + align - 1) / align;
  const uint64_t want =
      std::min<uint64_t>({units, kChunksPerThread * size(), kChunkMask});
  const uint64_t chunk = (units + want - 1) / want * align;
  const uint64_t chunks = (n + chunk - 1) / chunk;
  // The last job is done (every chunk finished), so nobody reads these.
  job_.store(&fn);
  n_.store(n);
  chunk_.store(chunk);
  done_.store(0);
  const uint64_t gen = generation_.load() + 1;
  claim_.store(ClaimWord(gen & 0xffffffffu, chunks, 0));
  generation_.store(gen);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> l(mu_);
    cv_.notify_all();
  }
  RunChunks(gen);
  // Only chunks a worker claimed can still be running.
  for (uint32_t i = 0; done_.load() != chunks; ++i)
    if (i % 1024 == 1023)
      std::this_thread::yield();
    else
      _mm_pause();
}

//===----------------------------------------------------------------------===//
// Products
//===----------------------------------------------------------------------===//

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}


namespace {
/// One bf16 weight row against T tokens (x_ld floats apart): the row is
/// widened once for all of them; each token's sum has the same order (two
/// accumulators, then the tail), so a token's result does not depend on
/// T. DotBf16 is T = 1.
template <int T>
void DotBf16Tokens(const uint16_t *w, const float *x, uint64_t x_ld,
                   uint64_t n, float *out, uint64_t out_ld) {
  __m256 a0[T], a1[T];
  for (int t = 0; t < T; ++t)
    a0[t] = a1[t] = _mm256_setzero_ps();
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(w + i));
    __m256 lo = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16));
    __m256 hi = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16));
    for (int t = 0; t < T; ++t) {
      a0[t] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + t * x_ld + i), a0[t]);
      a1[t] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + t * x_ld + i + 8), a1[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    float s = hsum(_mm256_add_ps(a0[t], a1[t]));
    for (uint64_t j = i; j < n; ++j) {
      uint32_t b = (uint32_t)w[j] << 16;
      float f;
      __builtin_memcpy(&f, &b, 4);
      s += f * x[t * x_ld + j];
    }
    out[t * out_ld] = s;
  }
}
} // namespace

float QuantizeX16(const float *x, uint64_t n, int16_t *q) {
  float amax = 0.0f;
  bool finite = true;
  for (uint64_t i = 0; i < n; ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    finite &= std::isfinite(x[i]);
  }
  if (!finite || amax == 0.0f) {
    std::fill_n(q, n, (int16_t)0);
    // A NaN or infinite input makes every logit NaN, as the fp32 product
    // would: it must stay visible.
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const __m256 inv = _mm256_set1_ps(32767.0f / amax);
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // Round to nearest even, then pack with saturation (|x * inv| <= 32767
    // up to rounding, so nothing saturates but the extreme itself).
    const __m256i a =
        _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    const __m256i b =
        _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), inv));
    _mm256_storeu_si256(
        reinterpret_cast<__m256i *>(q + i),
        _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
  }
  for (; i < n; ++i)
    q[i] = (int16_t)std::clamp(
        _mm_cvtss_si32(_mm_set_ss(x[i] * (32767.0f / amax))), -32767, 32767);
  Int8Interleave(q, n);
  return amax / 32767.0f;
}

namespace {
/// One block's 32 products of int8 weights and int16 inputs, in 8 int32
/// lanes (exact: |sum| <= 32 * 127 * 32767 < 2^31).
inline __m256i BlockLanes(const int8_t *w, const int16_t *x) {
  const __m256i w0 = _mm256_cvtepi8_epi16(
      _mm_loadu_si128(reinterpret_cast<const __m128i *>(w)));
  const __m256i w1 = _mm256_cvtepi8_epi16(
      _mm_loadu_si128(reinterpret_cast<const __m128i *>(w + 16)));
  return _mm256_add_epi32(
      _mm256_madd_epi16(
          w0, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x))),
      _mm256_madd_epi16(
          w1, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + 16))));
}

/// The sums of up to 8 consecutive blocks, block j's in lane j (0 past nb).
inline __m256i EightBlockSums(const int8_t *w, const int16_t *x, uint64_t nb) {
  __m256i s[8];
  for (uint64_t j = 0; j < 8; ++j)
    s[j] = j < nb ? BlockLanes(w + 32 * j, x + 32 * j) : _mm256_setzero_si256();
  const __m256i t0 = _mm256_hadd_epi32(s[0], s[1]);
  const __m256i t1 = _mm256_hadd_epi32(s[2], s[3]);
  const __m256i t2 = _mm256_hadd_epi32(s[4], s[5]);
  const __m256i t3 = _mm256_hadd_epi32(s[6], s[7]);
  // u0: blocks 0-3's sums of lanes 0-3 in its low half, of lanes 4-7 in
  // its high half; u1 the same for blocks 4-7.
  const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}
} // namespace

namespace {
/// n tokens' inputs (x_ld floats apart) rounded to int16 for an int8
/// matrix of `cols` columns, token t's at q + t * cols with scale s[t].
struct X16 {
  std::vector<int16_t> q;
  std::vector<float> s;
  void Set(const float *x, uint64_t x_ld, uint64_t n, uint64_t cols) {
    q.resize(n * cols);
    s.resize(n);
    for (uint64_t t = 0; t < n; ++t)
      s[t] = QuantizeX16(x + t * x_ld, cols, q.data() + t * cols);
  }
};

/// The sums of the 8 blocks of a full group stored interleaved (see
/// Int8Position), block j's in lane j, for T tokens (x_ld int16 apart):
/// each 16 weights widened once, one vpmaddwd a token, no horizontal adds.
template <int T>
inline void GroupSums(const int8_t *w, const int16_t *x, uint64_t x_ld,
                      __m256i *sums) {
  for (int t = 0; t < T; ++t)
    sums[t] = _mm256_setzero_si256();
  for (int i = 0; i < 16; ++i) {
    const __m256i wi = _mm256_cvtepi8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i *>(w + 16 * i)));
    for (int t = 0; t < T; ++t)
      sums[t] = _mm256_add_epi32(
          sums[t], _mm256_madd_epi16(
                       wi, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(
                               x + t * x_ld + 16 * i))));
  }
}

/// One int8 row against T tokens (T <= 4), each group's weights widened
/// once for every token. A token's block sums are exact integers and are
/// scaled and added in the same fp32 order whatever T is, so its result
/// is the same bits in a step of one token or four.
template <int T>
void DotsI8X16(const int8_t *w, const uint16_t *scale, const int16_t *xq,
               uint64_t x_ld, const float *sx, uint64_t n, float *out,
               uint64_t out_ld) {
  const uint64_t blocks = n / kInt8Block;
  __m256 acc[T];
  for (int t = 0; t < T; ++t)
    acc[t] = _mm256_setzero_ps();
  __m256i sums[T];
  uint64_t b = 0;
  for (; b + 8 <= blocks; b += 8) {
    // Every line of the group (256 bytes) 2 KiB ahead. Prefetching only
    // half of them halved the head's rate on Zen 3 (16.6 -> 7.6 GB/s a
    // core), where the hardware prefetcher then fetches the rest late.
    for (int line = 0; line < 4; ++line)
      _mm_prefetch(reinterpret_cast<const char *>(w + 32 * b) + 2048 +
                       64 * line,
                   _MM_HINT_T0);
    GroupSums<T>(w + 32 * b, xq + 32 * b, x_ld, sums);
    const __m256 sc = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i *>(scale + b)));
    for (int t = 0; t < T; ++t)
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[t]), sc, acc[t]);
  }
  if (b < blocks) { // a last group of fewer than 8 blocks, in order
    alignas(16) uint16_t tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::copy_n(scale + b, blocks - b, tail);
    const __m256 sc = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i *>(tail)));
    for (int t = 0; t < T; ++t)
      acc[t] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(EightBlockSums(
                              w + 32 * b, xq + t * x_ld + 32 * b, blocks - b)),
                          sc, acc[t]);
  }
  for (int t = 0; t < T; ++t)
    out[t * out_ld] = hsum(acc[t]) * sx[t];
}

using DotsI8X16Fn = void (*)(const int8_t *, const uint16_t *,
                            const int16_t *, uint64_t, const float *, uint64_t,
                            float *, uint64_t);
constexpr DotsI8X16Fn kDotsI8X16[4] = {DotsI8X16<1>, DotsI8X16<2>,
                                       DotsI8X16<3>, DotsI8X16<4>};

/// Rows [r0, r1) of an int8 matrix against the tokens of `in`: a token's
/// result is the same whichever rows, tokens or threads share the call.
void Int8Rows(const HostMatrix &w, const X16 &in, float *out, uint64_t out_ld,
              uint64_t r0, uint64_t r1) {
  const uint64_t blocks = w.cols / kInt8Block, n = in.s.size();
  for (uint64_t r = r0; r < r1; ++r) {
    const int8_t *row = w.i8 + r * w.cols;
    const uint16_t *scale = w.i8_scale + r * blocks;
    // Up to 4 tokens a pass over the row.
    for (uint64_t t = 0; t < n; t += 4) {
      const int16_t *x = in.q.data() + t * w.cols;
      const float *s = in.s.data() + t;
      float *o = out + (r - r0) + t * out_ld;
      const uint64_t k = w.cols;
      kDotsI8X16[std::min<uint64_t>(4, n - t) - 1](row, scale, x, k, s, k, o,
                                                   out_ld);
    }
  }
}

/// The same from float inputs, rounded here (the callers that hand over
/// a range of rows; MatVec and MatMul round once for all their threads).
void Int8Rows(const HostMatrix &w, const float *x, uint64_t x_ld, uint64_t n,
              float *out, uint64_t out_ld, uint64_t r0, uint64_t r1) {
  thread_local X16 in;
  in.Set(x, x_ld, n, w.cols);
  Int8Rows(w, in, out, out_ld, r0, r1);
}

} // namespace

float DotI8X16(const int8_t *w, const uint16_t *scale, const int16_t *xq,
               float sx, uint64_t n) {
  float out;
  DotsI8X16<1>(w, scale, xq, 0, &sx, n, &out, 0);
  return out;
}

void Int8Interleave(int16_t *v, uint64_t n) {
  int16_t group[kInt8Group];
  for (uint64_t g = 0; g + kInt8Group <= n; g += kInt8Group) {
    std::copy_n(v + g, kInt8Group, group);
    for (uint64_t c = 0; c < kInt8Group; ++c)
      v[g + Int8Position(c, kInt8Group)] = group[c];
  }
}

namespace {
/// One block of 32 weights of QuantizeInt8: the block's scale (an IEEE
/// half), its 32 values q in column order, and sum |q|. scale = amax / 127
/// rounded to a half; q = the weight times 1 / scale rounded to nearest
/// even (vcvtps2dq under the default rounding, as lrint), clamped to
/// [-127, 127]; an all-zero block has scale 0 and q 0.
uint16_t QuantizeInt8Block(const float *v, int8_t *q, uint32_t *qsum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 a[4], m = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    a[i] = _mm256_loadu_ps(v + 8 * i);
    // max(|v|, m): a NaN weight leaves m as it was (as std::max(m, |v|)).
    m = _mm256_max_ps(_mm256_andnot_ps(sign, a[i]), m);
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  const float amax = _mm_cvtss_f32(h);
  const uint16_t half = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
  const float scale = _cvtsh_ss(half);
  const __m256 inv = _mm256_set1_ps(scale > 0.0f ? 1.0f / scale : 0.0f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  __m256i sum = _mm256_setzero_si256(), qi[4];
  for (int i = 0; i < 4; ++i) {
    qi[i] = _mm256_min_epi32(
        _mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(a[i], inv)), lo), hi);
    sum = _mm256_add_epi32(sum, _mm256_abs_epi32(qi[i]));
  }
  // int32 -> int8 in column order (the packs interleave 128-bit lanes).
  const __m256i w16 = _mm256_packs_epi32(qi[0], qi[1]); // 0-3 8-11 | 4-7 12-15
  const __m256i x16 = _mm256_packs_epi32(qi[2], qi[3]);
  const __m256i b8 = _mm256_packs_epi16(w16, x16);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i *>(q),
                      _mm256_permutevar8x32_epi32(b8, order));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum),
                             _mm256_extracti128_si256(sum, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  *qsum = (uint32_t)_mm_cvtsi128_si32(s4);
  return half;
}
} // namespace

HostMatrix QuantizeInt8(ThreadPool &pool, uint64_t rows, uint64_t cols,
                        const std::function<void(uint64_t, float *)> &row) {
  HostMatrix m;
  m.rows = rows;
  m.cols = cols;
  const uint64_t blocks = cols / kInt8Block;
  m.i8_store.resize(rows * cols);
  m.i8_scale_store.resize(rows * blocks);
  m.i8_l1.resize(rows);
  pool.ParallelFor(rows, [&](uint64_t b, uint64_t e) {
    std::vector<float> buf(cols);
    for (uint64_t r = b; r < e; ++r) {
      row(r, buf.data());
      int8_t *q = m.i8_store.data() + r * cols;
      double l1 = 0;
      for (uint64_t k = 0; k < blocks; ++k) {
        alignas(32) int8_t block[kInt8Block];
        uint32_t qsum = 0;
        const uint16_t half =
            QuantizeInt8Block(buf.data() + k * kInt8Block, block, &qsum);
        const uint64_t c0 = k * kInt8Block, g = c0 / kInt8Group * kInt8Group;
        if (g + kInt8Group <= cols) {
          // Int8Position in a whole group: values 2i and 2i + 1 of block j
          // are bytes 16 i + 2 j and the next.
          const uint64_t j = (c0 - g) / kInt8Block;
          for (uint64_t i = 0; i < kInt8Block / 2; ++i)
            std::memcpy(q + g + 16 * i + 2 * j, block + 2 * i, 2);
        } else {
          std::memcpy(q + c0, block, kInt8Block); // a last, partial group
        }
        m.i8_scale_store[r * blocks + k] = half;
        l1 += (double)_cvtsh_ss(half) * qsum;
      }
      m.i8_l1[r] = (float)l1;
    }
  });
  m.i8 = m.i8_store.data();
  m.i8_scale = m.i8_scale_store.data();
  return m;
}

float DotBf16(const uint16_t *w, const float *x, uint64_t n) {
  float s;
  DotBf16Tokens<1>(w, x, 0, n, &s, 0);
  return s;
}

namespace {
/// Four bf16 rows (`ld` weights apart) against one x: each row's sum in
/// DotBf16's order (two accumulators, then the tail), so each result has
/// its bits; eight chains in flight instead of two, so that the product
/// runs at the FMA units' rate rather than their latency's. Each 16
/// weights are widened in their 128-bit lanes (unpack with zero: weights
/// 0-3 and 8-11 in one register, 4-7 and 12-15 in the other) against x
/// permuted the same way once for the four rows; every weight meets its
/// own x in its own chain, and the chains are put back in DotBf16's lanes
/// before the sum. DeepSeek-V3.2's router (256 x 7168) on a core of the Zen
/// 3 VM: 106-117 us from the caches where DotBf16 a row took 188-212.
void DotBf16Rows4(const uint16_t *w, uint64_t ld, const float *x, uint64_t n,
                  float *out) {
  __m256 a0[4], a1[4];
  for (int r = 0; r < 4; ++r)
    a0[r] = a1[r] = _mm256_setzero_ps();
  const __m256i zero = _mm256_setzero_si256();
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
    const __m256 xa = _mm256_permute2f128_ps(x0, x1, 0x20), // x 0-3, 8-11
        xb = _mm256_permute2f128_ps(x0, x1, 0x31);          // x 4-7, 12-15
    for (int r = 0; r < 4; ++r) {
      const __m256i h =
          _mm256_loadu_si256(reinterpret_cast<const __m256i *>(w + r * ld + i));
      a0[r] = _mm256_fmadd_ps(
          _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, h)), xa, a0[r]);
      a1[r] = _mm256_fmadd_ps(
          _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, h)), xb, a1[r]);
    }
  }
  for (int r = 0; r < 4; ++r) {
    // Back to DotBf16's accumulators: weights 0-7's chains, then 8-15's.
    const __m256 lo = _mm256_permute2f128_ps(a0[r], a1[r], 0x20),
                 hi = _mm256_permute2f128_ps(a0[r], a1[r], 0x31);
    float s = hsum(_mm256_add_ps(lo, hi));
    for (uint64_t j = i; j < n; ++j) {
      uint32_t b = (uint32_t)w[r * ld + j] << 16;
      float f;
      __builtin_memcpy(&f, &b, 4);
      s += f * x[j];
    }
    out[r] = s;
  }
}
} // namespace

uint64_t ArgMax(const float *v, uint64_t n) {
  if (n < 64)
    return (uint64_t)(std::max_element(v, v + n) - v);
  __m256 m = _mm256_loadu_ps(v), nan = _mm256_cmp_ps(m, m, _CMP_UNORD_Q);
  uint64_t i = 8;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(v + i);
    m = _mm256_max_ps(m, x);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float best = lanes[0];
  for (int l = 1; l < 8; ++l)
    best = std::max(best, lanes[l]);
  for (; i < n; ++i) {
    if (v[i] != v[i])
      return (uint64_t)(std::max_element(v, v + n) - v);
    best = std::max(best, v[i]);
  }
  if (_mm256_movemask_ps(nan))
    return (uint64_t)(std::max_element(v, v + n) - v);
  // The first index holding the largest value.
  const __m256 b = _mm256_set1_ps(best);
  uint64_t j = 0;
  for (; j + 8 <= n; j += 8)
    if (const int bits = _mm256_movemask_ps(
            _mm256_cmp_ps(_mm256_loadu_ps(v + j), b, _CMP_EQ_OQ)))
      return j + (uint64_t)__builtin_ctz((unsigned)bits);
  for (; j < n; ++j)
    if (v[j] == best)
      break;
  return j;
}

float DotF32(const float *w, const float *x, uint64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8),
                         a1);
  }
  float s = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i)
    s += w[i] * x[i];
  return s;
}

uint64_t MatrixBytes(const HostMatrix &w) {
  if (w.is_fp9)
    return w.fp9_store.size() * 8;
  if (w.is_e4m3)
    return w.e4m3_store.size() + w.e4m3_scale.size() * 4;
  if (w.i8)
    return w.rows * w.cols + w.rows * (w.cols / kInt8Block) * 2;
  return w.rows * w.cols * (w.bf16 ? 2 : 4);
}

void AppendMatrixRanges(const HostMatrix &w, std::vector<ByteRange> *out) {
  auto add = [out](const void *p, uint64_t n) {
    if (p && n)
      out->push_back({static_cast<const uint8_t *>(p), n});
  };
  if (w.is_fp9) {
    add(w.fp9_store.data(), w.fp9_store.size() * 8);
  } else if (w.is_e4m3) {
    add(w.e4m3_store.data(), w.e4m3_store.size());
    add(w.e4m3_scale.data(), w.e4m3_scale.size() * 4);
  } else if (w.i8) {
    add(w.i8, w.rows * w.cols);
    add(w.i8_scale, w.rows * (w.cols / kInt8Block) * 2);
  } else if (w.bf16) {
    add(w.bf16, w.rows * w.cols * 2);
  } else {
    add(w.f32, w.rows * w.cols * 4);
  }
}

uint64_t PrefetchRanges(const std::vector<ByteRange> &ranges, uint64_t limit) {
  // Loads, not prefetch hints: a hint may be dropped when the line fill
  // buffers are full, a load waits. Four lines an iteration keep several
  // misses in flight; the sum keeps the loads.
  uint64_t done = 0, s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (const ByteRange &r : ranges) {
    const uint64_t n = std::min(r.bytes, limit - done);
    const volatile uint8_t *p = r.data;
    uint64_t i = 0;
    for (; i + 256 <= n; i += 256) {
      s0 += p[i];
      s1 += p[i + 64];
      s2 += p[i + 128];
      s3 += p[i + 192];
    }
    for (; i < n; i += 64)
      s0 += p[i];
    done += n;
    if (done >= limit)
      break;
  }
  static std::atomic<uint64_t> sink{0};
  sink.fetch_add(s0 + s1 + s2 + s3, std::memory_order_relaxed);
  return done;
}

uint64_t LastLevelCacheBytes() {
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long v = sysconf(name);
    if (v > 0)
      return (uint64_t)v;
  }
  return 0;
}

double MeasureReadBandwidthGbs(ThreadPool &pool, uint64_t maxBytes) {
  // A set no cache holds any part of: on a 2-vCPU Zen 5 VM that reports
  // 32 MiB of L3, 128 MiB still read at 80-97 GB/s against 42-51 from 512
  // MiB up (docs/perf-log, 2026-12-07), so at least 1 GiB and 4x the
  // last-level cache. In 2 MiB pages, as the weights are.
  const uint64_t want =
      std::max<uint64_t>(1ull << 30, 4 * LastLevelCacheBytes());
  const uint64_t bytes =
      std::max<uint64_t>(kHugePageBytes, std::min(want, maxBytes)) &
      ~uint64_t(kHugePageBytes - 1);
  // Filled (every page faulted in) before timing.
  const std::vector<uint8_t, HugePageAllocator<uint8_t>> buf(bytes, 1);
  const uint64_t n = bytes / 32; // 256-bit lanes
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    std::atomic<uint64_t> sink{0};
    auto t0 = std::chrono::steady_clock::now();
    pool.ParallelFor(n, [&](uint64_t b, uint64_t e) {
      __m256i a0 = _mm256_setzero_si256(), a1 = a0;
      const auto *p = reinterpret_cast<const __m256i *>(buf.data());
      for (uint64_t i = b; i + 1 < e; i += 2) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(p + i));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(p + i + 1));
      }
      sink += (uint64_t)_mm256_extract_epi64(_mm256_xor_si256(a0, a1), 0);
    });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                   .count();
    best = std::max(best, n * 32.0 / s / 1e9);
  }
  return best;
}

namespace {
/// Row chunks of a product start at multiples of 64 rows (as halves of
/// 128-row tiles did before chunks): a row's bits never depend on the
/// chunk, and a chunk re-scales its input at most once a tile.
constexpr uint64_t kRowAlign = 64;

/// Buffers ReserveKernelScratch mapped ahead, for threads to take.
struct ScratchSpares {
  std::mutex mu;
  std::vector<std::vector<float>> spares;
};
ScratchSpares &Spares() {
  static ScratchSpares *s = new ScratchSpares; // threads may outlive main
  return *s;
}
std::atomic<uint64_t> g_scratch_allocations{0};

/// The fp9 kernels' scratch (pre-scaled inputs), 64-byte aligned: one
/// buffer a thread that only grows, so a step allocates nothing once the
/// largest matrix has been seen. A thread that needs more first takes a
/// buffer ReserveKernelScratch mapped at load, if one is large enough.
float *KernelScratch(uint64_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats + 16) {
    ScratchSpares &s = Spares();
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.spares.empty() && s.spares.back().size() >= floats + 16) {
      buf.swap(s.spares.back());
      s.spares.pop_back();
    }
  }
  if (buf.size() < floats + 16) {
    buf.resize(floats + 16);
    g_scratch_allocations.fetch_add(1, std::memory_order_relaxed);
  }
  return reinterpret_cast<float *>(
      (reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
}
} // namespace

void MatVecRows(const HostMatrix &w, const float *x, float *y, uint64_t r0,
                uint64_t r1) {
  if (w.is_fp9 || w.is_e4m3) { // one token of RowsProduct: the GEMV
    if (r0 < r1)
      RowsProduct(w, x, w.cols, 1, y + r0, r1 - r0, r0, r1);
    return;
  }
  if (w.i8) {
    if (r0 < r1)
      Int8Rows(w, x, 0, 1, y + r0, 0, r0, r1);
    return;
  }
  if (w.bf16 && HostHasAvx512()) { // the same bits, fewer uops a weight
    for (uint64_t r = r0; r < r1; ++r)
      y[r] = DotBf16Avx512(w.bf16 + r * w.cols, x, w.cols);
    return;
  }
  uint64_t r = r0;
  if (w.bf16)
    for (; r + 4 <= r1; r += 4)
      DotBf16Rows4(w.bf16 + r * w.cols, w.cols, x, w.cols, y + r);
  for (; r < r1; ++r)
    y[r] = w.bf16 ? DotBf16(w.bf16 + r * w.cols, x, w.cols)
                  : DotF32(w.f32 + r * w.cols, x, w.cols);
}

namespace {
/// MatVec and MatMul of an int8 matrix: the inputs rounded once, the rows
/// split over the pool.
void Int8Product(ThreadPool &pool, const HostMatrix &w, const float *x,
                 uint64_t n, float *y) {
  thread_local X16 buffer;
  // The caller's buffer, by reference: inside the lambda a thread_local
  // name would be each worker's own.
  const X16 &in = buffer;
  buffer.Set(x, w.cols, n, w.cols);
  pool.ParallelFor(
      w.rows,
      [&](uint64_t b, uint64_t e) { Int8Rows(w, in, y + b, w.rows, b, e); },
      kRowAlign);
}
} // namespace

void MatVec(ThreadPool &pool, const HostMatrix &w, const float *x, float *y) {
  if (w.i8)
    return Int8Product(pool, w, x, 1, y);
  if (w.rows * w.cols < (1u << 16)) {
    MatVecRows(w, x, y, 0, w.rows);
    return;
  }
  pool.ParallelFor(
      w.rows, [&](uint64_t b, uint64_t e) { MatVecRows(w, x, y, b, e); },
      kRowAlign);
}

namespace {
/// One format's AVX-512 kernels (HostFp9Avx512.cpp): the GEMV, the tiles
/// decoded in registers and the panel with 512-bit multiply-adds.
struct Avx512Kernels {
  decltype(&Fp9GemvAvx512) gemv;
  decltype(&Fp9GemmAvx512) tiles;
  decltype(&Fp9GemmPanelAvx512) panel;
};
constexpr Avx512Kernels kFp9Avx512{Fp9GemvAvx512, Fp9GemmAvx512,
                                   Fp9GemmPanelAvx512};
constexpr Avx512Kernels kE4m3Avx512{E4m3GemvAvx512, E4m3GemmAvx512,
                                    E4m3GemmPanelAvx512};

/// RowsProduct with AVX-512: the GEMV for one token, each chunk decoded in
/// registers for tiles of up to 8 tokens, and from kFp9Avx512PanelMinTokens
/// tokens on the panel; every token's result has the GEMV's bits.
/// The scratch RowsProduct takes from KernelScratch for n tokens of w.
uint64_t RowsScratchFloats(const HostMatrix &w, uint64_t n) {
  const auto cols = (uint32_t)w.cols;
  if ((w.is_fp9 || w.is_e4m3) && HostHasAvx512())
    return n == 1 ? cols
           : n < kFp9Avx512PanelMinTokens
               ? std::min<uint64_t>(n, 8) * cols
               : Fp9GemmPanelAvx512ScratchFloats((uint32_t)n, cols);
  if (w.is_fp9)
    return n == 1 ? 2 * w.cols : 2 * n * w.cols;
  if (w.is_e4m3)
    return duck_e4m3_gemm_scratch_floats((uint32_t)n, cols);
  return 0;
}

void Avx512Rows(const Avx512Kernels &k, const HostMatrix &w, const float *x,
                uint64_t x_ld, uint64_t n, float *out, uint64_t out_ld,
                uint64_t b, uint64_t e) {
  float *scratch = KernelScratch(RowsScratchFloats(w, n));
  if (n == 1)
    k.gemv(&w.fp9, x, out, (uint32_t)b, (uint32_t)e, scratch);
  else if (n < kFp9Avx512PanelMinTokens)
    k.tiles(&w.fp9, x, (uint32_t)x_ld, (uint32_t)n, out, (uint32_t)out_ld,
            (uint32_t)b, (uint32_t)e, scratch);
  else
    k.panel(&w.fp9, x, (uint32_t)x_ld, (uint32_t)n, out, (uint32_t)out_ld,
            (uint32_t)b, (uint32_t)e, scratch);
}

/// RowsProduct of an fp9 matrix without AVX-512: the duck kernels (the
/// GEMV for one token, the GEMM, bit-identical to it, for more: prefill
/// == decode).
void Fp9Rows(const HostMatrix &w, const float *x, uint64_t x_ld, uint64_t n,
             float *out, uint64_t out_ld, uint64_t b, uint64_t e) {
  float *scratch = KernelScratch(RowsScratchFloats(w, n));
  if (n == 1)
    duck_gemv(&w.fp9, x, out, (uint32_t)b, (uint32_t)e, scratch,
              DUCK_DECODE_SHIFT);
  else
    duck_gemm(&w.fp9, x, (uint32_t)x_ld, (uint32_t)n, out, (uint32_t)out_ld,
              (uint32_t)b, (uint32_t)e, scratch);
}

} // namespace

uint64_t RowsProductScratchFloats(const HostMatrix &w, uint64_t max_rows) {
  // Each branch's size grows with n, so its largest n is enough.
  uint64_t most = 0;
  for (uint64_t n :
       {uint64_t(1), std::min<uint64_t>(max_rows, kFp9Avx512PanelMinTokens - 1),
        max_rows})
    if (n >= 1 && n <= max_rows)
      most = std::max(most, RowsScratchFloats(w, n));
  return most;
}

uint64_t KernelScratchAllocations() {
  return g_scratch_allocations.load(std::memory_order_relaxed);
}

void ReserveKernelScratch(unsigned threads, uint64_t floats) {
  if (floats == 0)
    return;
  ScratchSpares &s = Spares();
  std::lock_guard<std::mutex> lock(s.mu);
  // At most `threads` spares, each large enough (an engine built again
  // does not pile up buffers).
  s.spares.erase(std::remove_if(s.spares.begin(), s.spares.end(),
                                [&](const std::vector<float> &v) {
                                  return v.size() < floats + 16;
                                }),
                 s.spares.end());
  while (s.spares.size() < threads)
    s.spares.emplace_back(floats + 16); // zeroed: every page mapped now
}

void RowsProduct(const HostMatrix &w, const float *x, uint64_t x_ld, uint64_t n,
                 float *out, uint64_t out_ld, uint64_t b, uint64_t e) {
  if (n == 0 || b >= e)
    return;
  if ((w.is_fp9 || w.is_e4m3) && HostHasAvx512())
    return Avx512Rows(w.is_e4m3 ? kE4m3Avx512 : kFp9Avx512, w, x, x_ld, n, out,
                      out_ld, b, e);
  if (w.is_fp9)
    return Fp9Rows(w, x, x_ld, n, out, out_ld, b, e);
  // e4m3 without AVX-512: the GEMV, rows in registers below 5 tokens, then
  // the AVX2 panel; all with the GEMV's bits.
  if (w.is_e4m3)
    return duck_e4m3_gemm(&w.fp9, x, (uint32_t)x_ld, (uint32_t)n, out,
                          (uint32_t)out_ld, (uint32_t)b, (uint32_t)e,
                          KernelScratch(RowsScratchFloats(w, n)));
  if (w.i8)
    return Int8Rows(w, x, x_ld, n, out, out_ld, b, e);
  const bool avx512 = w.bf16 && HostHasAvx512();
  for (uint64_t r = b; r < e; ++r) {
    uint64_t t = 0;
    float *o = out + (r - b);
    if (w.bf16) // four tokens a pass: the row is widened once for them
      for (; t + 4 <= n; t += 4) {
        const uint16_t *row = w.bf16 + r * w.cols;
        if (avx512)
          DotBf16x4Avx512(row, x + t * x_ld, x_ld, w.cols, o + t * out_ld,
                          out_ld);
        else
          DotBf16Tokens<4>(row, x + t * x_ld, x_ld, w.cols, o + t * out_ld,
                           out_ld);
      }
    for (; t < n; ++t)
      o[t * out_ld] =
          !w.bf16  ? DotF32(w.f32 + r * w.cols, x + t * x_ld, w.cols)
          : avx512 ? DotBf16Avx512(w.bf16 + r * w.cols, x + t * x_ld, w.cols)
                   : DotBf16(w.bf16 + r * w.cols, x + t * x_ld, w.cols);
  }
}

/// Rows [b, e) of y = W x for n tokens (y is [n, rows]): the products of
/// MatMul and MatMulMany, which only cut the rows.
static void ProductRows(const HostMatrix &w, const float *x, uint64_t n,
                        float *y, uint64_t b, uint64_t e) {
  RowsProduct(w, x, w.cols, n, y + b, w.rows, b, e);
}

void MatMul(ThreadPool &pool, const HostMatrix &w, const float *x, uint64_t n,
            float *y) {
  if (w.i8)
    return Int8Product(pool, w, x, n, y);
  MatMulMany(pool, x, n, {{&w, y}});
}

void MatMulMany(ThreadPool &pool, const float *x, uint64_t n,
                std::initializer_list<Product> products) {
  // The matrices' rows one after another, each starting at a multiple of
  // kRowAlign, so a chunk's piece of any matrix starts on one too.
  uint64_t total = 0, weights = 0;
  for (const Product &p : products) {
    total += (p.w->rows + kRowAlign - 1) / kRowAlign * kRowAlign;
    weights += p.w->rows * p.w->cols;
  }
  auto rows = [&](uint64_t b, uint64_t e) {
    uint64_t at = 0;
    for (const Product &p : products) {
      const uint64_t lo = std::max(b, at), hi = std::min(e, at + p.w->rows);
      if (lo < hi)
        ProductRows(*p.w, x, n, p.y, lo - at, hi - at);
      at += (p.w->rows + kRowAlign - 1) / kRowAlign * kRowAlign;
    }
  };
  // Rows outer so each weight row is read once for all tokens; a small
  // product is not worth a hand-off.
  if (n * weights < (1u << 16))
    rows(0, total);
  else
    pool.ParallelFor(total, rows, kRowAlign);
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

void RmsNorm(const float *x, const float *w, uint64_t n, float eps, float *y) {
  // The squares summed in double over four accumulators, sixteen values a
  // pass, in a fixed order: one chain of n dependent adds took 1.2 us for a
  // 1024-wide row, this 0.14. The scale rounds to the same float unless the
  // two double sums fall on either side of a rounding boundary (none did
  // in 10 000 rows of 128-7168 normal values, 20 M outputs).
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v0)),
                  d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v0, 1)),
                  d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(v1)),
                  d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(v1, 1));
    a0 = _mm256_fmadd_pd(d0, d0, a0);
    a1 = _mm256_fmadd_pd(d1, d1, a1);
    a2 = _mm256_fmadd_pd(d2, d2, a2);
    a3 = _mm256_fmadd_pd(d3, d3, a3);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes,
                  _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
  double ss = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i)
    ss += (double)x[i] * x[i];
  float inv = (float)(1.0 / std::sqrt(ss / n + eps));
  for (i = 0; i < n; ++i)
    y[i] = w[i] * (x[i] * inv);
}

void RopeNeox(float *h, uint64_t dim, int64_t pos, double theta) {
  uint64_t half = dim / 2;
  for (uint64_t i = 0; i < half; ++i) {
    double freq = std::pow(theta, -2.0 * (double)i / (double)dim);
    double a = (double)pos * freq;
    float c = (float)std::cos(a), s = (float)std::sin(a);
    float x0 = h[i], x1 = h[i + half];
    h[i] = x0 * c - x1 * s;
    h[i + half] = x1 * c + x0 * s;
  }
}

void Softmax(float *v, uint64_t n) {
  float m = -INFINITY;
  for (uint64_t i = 0; i < n; ++i)
    m = std::max(m, v[i]);
  double s = 0;
  for (uint64_t i = 0; i < n; ++i) {
    v[i] = std::exp(v[i] - m);
    s += v[i];
  }
  float inv = (float)(1.0 / s);
  for (uint64_t i = 0; i < n; ++i)
    v[i] *= inv;
}

namespace {
/// e^x for x <= 0 (softmax after subtracting the maximum), 8 lanes: n
/// rounded to nearest (duck_exp8_reduced does the rest); 0 below -87.
inline __m256 ExpNonPositive(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(
      _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_andnot_ps(under, duck_exp8_reduced(x, n));
}

/// Softmax of attention scores in place (ExpNonPositive; the sum in
/// double).
void SoftmaxScores(float *v, uint64_t n) {
  __m256 mv = _mm256_set1_ps(-INFINITY);
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8)
    mv = _mm256_max_ps(mv, _mm256_loadu_ps(v + i));
  float lanes[8];
  _mm256_storeu_ps(lanes, mv);
  float m = *std::max_element(lanes, lanes + 8);
  for (; i < n; ++i)
    m = std::max(m, v[i]);
  const __m256 mb = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = ExpNonPositive(_mm256_sub_ps(_mm256_loadu_ps(v + i), mb));
    _mm256_storeu_ps(v + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  _mm256_storeu_ps(lanes, acc);
  double s = 0;
  for (float l : lanes)
    s += l;
  for (; i < n; ++i) {
    v[i] = std::exp(v[i] - m);
    s += v[i];
  }
  const __m256 inv = _mm256_set1_ps((float)(1.0 / s));
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(v + i, _mm256_mul_ps(_mm256_loadu_ps(v + i), inv));
  for (; i < n; ++i)
    v[i] *= (float)(1.0 / s);
}
} // namespace

namespace {
/// How far ahead (in cached positions) the attention prefetches keys and
/// values: at long contexts the cache streams from memory, and the hardware
/// prefetcher alone keeps too few lines in flight (`duck-bench host`,
/// context 2048, 2 threads: 0.97 ms a layer without, 0.69-0.74 with 8-32).
/// A decoded row's values go further ahead: each of a block's passes reads
/// two lines of a row, so 16 rows kept only 32 lines in flight (on the
/// Zen 5 VM, keys 32 and values 64 ahead read a context of 1024-4096 about
/// 20 % faster from an f16 cache, 4-6 % from an fp32 one). A run of prompt
/// rows reuses each block of keys and values from L1 for all its rows;
/// there the nearer distance keeps the rows fetched ahead from pushing the
/// block out (64 ahead: `duck-bench host`'s 64-row prompt run over 1024
/// fp32 positions 12 % slower, 4.71-4.77 ms against 4.20-4.23).
constexpr uint64_t kKeysAhead = 32, kValuesAhead = 64, kRunAhead = 16;

/// Where the rows ahead of a range of cached positions are, for their
/// prefetch: the positions of one cache chunk run from its base up to
/// `split` (relative to it), the next ones from `next`, and none exists
/// from `end` on (the sequence's length), so that nothing past the cache's
/// rows (another head's, or nothing) is fetched.
template <typename T> struct RowsAhead {
  const T *next = nullptr;
  uint64_t split = ~0ull, end = 0;
  uint64_t keys = kKeysAhead, values = kValuesAhead; // positions ahead
  // A decoded row's value rows [0, kValuesAhead), fetched while its last
  // keys are scored: key vfrom + u (chunk-relative) brings value row u of
  // vbase, the head's first chunk (null: none).
  const T *vbase = nullptr;
  uint64_t vfrom = 0;
  /// Row u (relative to `base`), or null where there is none.
  const char *Row(const T *base, uint64_t u, uint64_t dim) const {
    if (u >= end)
      return nullptr;
    return reinterpret_cast<const char *>(u < split ? base + u * dim
                                                    : next + (u - split) * dim);
  }
};

/// A decoded row: the value rows its weighing starts with are fetched
/// while its last kValuesAhead keys are scored, so that the weighing does
/// not start cold (duck-bench host, AVX2, 12 alternated rounds: 64
/// positions f16 14.1-19.0 -> 8.2-10.9 us, fp32 15.5-21.9 -> 13.1-17.6;
/// from 128 on within the rounds' swing). Those rows are in the head's
/// first chunk (V); the keys' rows are relative to the chunk at c0.
template <typename T>
void FirstValuesEarly(RowsAhead<T> *ahead, const T *V, uint64_t len,
                      uint64_t c0, uint64_t chunk) {
  if (chunk && chunk < kValuesAhead)
    return;
  const uint64_t from = len > kValuesAhead ? len - kValuesAhead : 0;
  if (from >= c0) {
    ahead->vbase = V;
    ahead->vfrom = from - c0;
  }
}

/// The four sums of a0..a3 in one vector: lane i = sum of the lanes of ai.
inline __m128 Hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 s01 = _mm256_hadd_ps(a0, a1), s23 = _mm256_hadd_ps(a2, a3);
  const __m256 s = _mm256_hadd_ps(s01, s23);
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/// a[j] += the eight-lane partial dot of q[0, n / 8 * 8) with rows[j] + off
/// (the scores of MlaAttend and IndexScores, four rows at once).
inline void Dot4Lanes(__m256 a[4], const float *q, const float *const rows[4],
                      uint64_t off, uint64_t n) {
  for (uint64_t d = 0; d + 8 <= n; d += 8) {
    const __m256 qd = _mm256_loadu_ps(q + d);
    for (int j = 0; j < 4; ++j)
      a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(rows[j] + off + d), qd, a[j]);
  }
}

/// tail[j] += the same dots' scalar rest, q[n / 8 * 8, n).
inline void Dot4Tail(float tail[4], const float *q, const float *const rows[4],
                     uint64_t off, uint64_t n) {
  for (int j = 0; j < 4; ++j)
    for (uint64_t d = n / 8 * 8; d < n; ++d)
      tail[j] = std::fma(rows[j][off + d], q[d], tail[j]);
}

/// A cached key or value: fp32, or IEEE half (`--kv-cache f16`, F16C).
inline __m256 Load8(const float *p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const uint16_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}
inline float Load1(const float *p) { return *p; }
inline float Load1(const uint16_t *p) { return _cvtsh_ss(*p); }
/// One key's dot with a query: the same operations in the same order for
/// either key type (the tail as explicit FMAs), so a half cache gives the
/// bits an fp32 cache of the same values gives.
template <typename T>
inline float DotKey(const T *k, const float *q, uint64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(Load8(k + i), _mm256_loadu_ps(q + i), a0);
    a1 = _mm256_fmadd_ps(Load8(k + i + 8), _mm256_loadu_ps(q + i + 8), a1);
  }
  float s = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i)
    s = std::fma(Load1(k + i), q[i], s);
  return s;
}

/// scores[g][t] = (k_t . q_g) * scale for t in [t0, t1), t0 a multiple of
/// 4, t1 <= len, for the G (1 or 2) query heads at q (dim apart), scores
/// rows `ld` apart. Keys go four a pass (eight FMA chains for two heads,
/// each key loaded once for both), the keys `ahead.keys` positions on
/// prefetched; the last len % 4 keys of a row, one at a time. So
/// a score's bits depend only on its key, its query and the row's length,
/// never on how a caller cuts [0, len) into ranges.
template <int G, typename T>
void ScoreRange(const float *q, const T *kc, uint64_t t0, uint64_t t1,
                uint64_t dim, float scale, float *scores, uint64_t ld,
                const RowsAhead<T> &ahead) {
  const uint64_t vec = dim / 8 * 8;
  const __m128 sc = _mm_set1_ps(scale);
  uint64_t t = t0;
  for (; t + 4 <= t1; t += 4) {
    const T *k = kc + t * dim;
    const char *pf[4];
    for (int j = 0; j < 4; ++j)
      pf[j] = ahead.Row(kc, t + ahead.keys + j, dim);
    if (ahead.vbase && t + 4 > ahead.vfrom && t < ahead.vfrom + kValuesAhead)
      for (uint64_t u = t < ahead.vfrom ? 0 : t - ahead.vfrom;
           u < t + 4 - ahead.vfrom && u < kValuesAhead; ++u)
        for (uint64_t b = 0; b < dim * sizeof(T); b += 64)
          _mm_prefetch(reinterpret_cast<const char *>(ahead.vbase + u * dim) +
                           b,
                       _MM_HINT_T0);
    __m256 a[G][4];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < 4; ++j)
        a[g][j] = _mm256_setzero_ps();
    for (uint64_t d = 0; d < vec; d += 8) {
      if (d * sizeof(T) % 64 == 0) // a line of each key kKeysAhead on
        for (int j = 0; j < 4; ++j)
          if (pf[j])
            _mm_prefetch(pf[j] + d * sizeof(T), _MM_HINT_T0);
      __m256 qd[G];
      for (int g = 0; g < G; ++g)
        qd[g] = _mm256_loadu_ps(q + g * dim + d);
      for (int j = 0; j < 4; ++j) {
        const __m256 kv = Load8(k + j * dim + d);
        for (int g = 0; g < G; ++g)
          a[g][j] = _mm256_fmadd_ps(kv, qd[g], a[g][j]);
      }
    }
    for (int g = 0; g < G; ++g) {
      __m128 r = Hsum4(a[g][0], a[g][1], a[g][2], a[g][3]);
      if (vec < dim) {
        alignas(16) float tail[4] = {0, 0, 0, 0};
        for (int j = 0; j < 4; ++j)
          for (uint64_t d = vec; d < dim; ++d)
            tail[j] = std::fma(Load1(k + j * dim + d), q[g * dim + d], tail[j]);
        r = _mm_add_ps(r, _mm_load_ps(tail));
      }
      _mm_storeu_ps(scores + g * ld + t, _mm_mul_ps(r, sc));
    }
  }
  for (; t < t1; ++t)
    for (int g = 0; g < G; ++g)
      scores[g * ld + t] = DotKey(kc + t * dim, q + g * dim, dim) * scale;
}

/// out[g] += sum_t p[g][t] v_t over t in [t0, t1) for G heads (p rows `ld`
/// apart, outputs dim apart; `first`: the outputs start from zero). Every
/// output lane is one FMA chain over t in order, so cutting [0, len) into
/// ranges does not change a bit; 32 dims of two heads a pass (eight
/// accumulators), each value row loaded once for both heads; the pass's
/// lines of the row `ahead.values` positions on prefetched.
template <typename T>
void WeighRange(const float *p, uint64_t ld, uint64_t G, const T *vc,
                uint64_t t0, uint64_t t1, uint64_t dim, float *out, bool first,
                const RowsAhead<T> &ahead) {
  const uint64_t vec = dim / 8 * 8;
  auto start = [&](const float *o) {
    return first ? _mm256_setzero_ps() : _mm256_loadu_ps(o);
  };
  for (uint64_t g = 0; g < G; g += 2) {
    const bool two = g + 1 < G;
    const float *p0 = p + g * ld, *p1 = two ? p0 + ld : p0;
    float *o0 = out + g * dim, *o1 = two ? o0 + dim : o0;
    uint64_t d = 0;
    for (; d + 32 <= vec; d += 32) {
      __m256 a[2][4];
      for (int j = 0; j < 4; ++j) {
        a[0][j] = start(o0 + d + 8 * j);
        a[1][j] = start(o1 + d + 8 * j);
      }
      for (uint64_t t = t0; t < t1; ++t) {
        const T *vr = vc + t * dim + d;
        if (const char *a = ahead.Row(vc, t + ahead.values, dim)) {
          _mm_prefetch(a + d * sizeof(T), _MM_HINT_T0);
          _mm_prefetch(a + (d + 16) * sizeof(T), _MM_HINT_T0);
        }
        const __m256 b0 = _mm256_set1_ps(p0[t]), b1 = _mm256_set1_ps(p1[t]);
        for (int j = 0; j < 4; ++j) {
          const __m256 v = Load8(vr + 8 * j);
          a[0][j] = _mm256_fmadd_ps(b0, v, a[0][j]);
          a[1][j] = _mm256_fmadd_ps(b1, v, a[1][j]);
        }
      }
      for (int j = 0; j < 4; ++j) {
        _mm256_storeu_ps(o0 + d + 8 * j, a[0][j]);
        if (two)
          _mm256_storeu_ps(o1 + d + 8 * j, a[1][j]);
      }
    }
    for (; d < vec; d += 8) {
      __m256 a0 = start(o0 + d), a1 = start(o1 + d);
      for (uint64_t t = t0; t < t1; ++t) {
        const __m256 v = Load8(vc + t * dim + d);
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(p0[t]), v, a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(p1[t]), v, a1);
      }
      _mm256_storeu_ps(o0 + d, a0);
      if (two)
        _mm256_storeu_ps(o1 + d, a1);
    }
    for (; d < dim; ++d) {
      float s0 = first ? 0.0f : o0[d], s1 = first ? 0.0f : o1[d];
      for (uint64_t t = t0; t < t1; ++t) {
        s0 = std::fma(p0[t], Load1(vc + t * dim + d), s0);
        s1 = std::fma(p1[t], Load1(vc + t * dim + d), s1);
      }
      o0[d] = s0;
      if (two)
        o1[d] = s1;
    }
  }
}

/// Positions of keys (or values) a block: a block stays in L1 while every
/// row of a run takes it.
constexpr uint64_t kAttendBlock = 64;
/// Cached MLA rows a block (16 x 576 floats, 36 KiB: in L1 while every
/// head takes them).
constexpr uint64_t kMlaBlock = 16;

/// MlaAttend's scores (heads x positions floats): a buffer of each thread's,
/// grown to the largest call it has seen, so a decode step allocates nothing.
inline float *MlaScoreBuffer(uint64_t size) {
  thread_local std::vector<float> buf;
  if (buf.size() < size)
    buf.resize(size);
  return buf.data();
}

/// The epilogue of MlaAttend's four-row score loop: rows [i, b1) (fewer
/// than four) one at a time, the same sums in the same order.
inline void MlaScoreRowsTail(const float *qh, const float *ph,
                             const float *cache, const uint64_t *pos,
                             uint64_t i, uint64_t b1, uint64_t W, uint64_t R,
                             uint64_t rope, float scale, float *sh) {
  const uint64_t Rv = R / 8 * 8, Pv = rope / 8 * 8;
  for (; i < b1; ++i) { // the last n % 4 rows, one at a time
    const float *c = cache + pos[i] * W;
    __m256 a = _mm256_setzero_ps();
    for (uint64_t d = 0; d < Rv; d += 8)
      a = _mm256_fmadd_ps(_mm256_loadu_ps(c + d), _mm256_loadu_ps(qh + d),
                          a);
    for (uint64_t d = 0; d < Pv; d += 8)
      a = _mm256_fmadd_ps(_mm256_loadu_ps(c + R + d),
                          _mm256_loadu_ps(ph + d), a);
    float s = hsum(a);
    for (uint64_t d = Rv; d < R; ++d)
      s = std::fma(c[d], qh[d], s);
    for (uint64_t d = Pv; d < rope; ++d)
      s = std::fma(c[R + d], ph[d], s);
    sh[i] = s * scale;
  }
}
} // namespace

uint64_t KvCacheChunk(uint64_t kvHeads, uint64_t dim, uint64_t valueBytes) {
  const uint64_t rowBytes = kvHeads * dim * valueBytes;
  uint64_t chunk = 64;
  while (chunk * 2 * rowBytes <= kHugePageBytes)
    chunk *= 2;
  return chunk;
}

void AttendHeads(const float *q, const float *kc, const float *vc,
                 uint64_t kvStride, uint64_t len, uint64_t heads,
                 uint64_t kvHeads, uint64_t dim, uint64_t h0, uint64_t h1,
                 float *out) {
  AttendRows(q, 0, 1, len, kc, vc, kvStride, heads, kvHeads, dim, h0, h1, out,
             0);
}

template <typename T>
void AttendRows(const float *q, uint64_t qStride, uint64_t rows, uint64_t len0,
                const T *kc, const T *vc, uint64_t kvStride, uint64_t heads,
                uint64_t kvHeads, uint64_t dim, uint64_t h0, uint64_t h1,
                float *out, uint64_t outStride, uint64_t chunk,
                uint64_t chunkStride) {
  if (rows == 0 || h0 >= h1)
    return;
  // Where block [t, ...) of a head's positions lives: its chunk's first
  // position, and that chunk's offset from the head's first one.
  auto chunkOf = [&](uint64_t t, uint64_t *c0) -> uint64_t {
    *c0 = chunk ? t / chunk * chunk : 0;
    return chunk ? t / chunk * chunkStride : 0;
  };
  const uint64_t group = kvHeads ? heads / kvHeads : 1;
  const uint64_t gmax = std::min(group, h1 - h0), ld = len0 + rows - 1;
  // The rows after those of the chunk at c0 of a head (`head`: its first
  // position's row), up to the longest row's length.
  auto aheadOf = [&](const T *head, uint64_t c0) {
    RowsAhead<T> a;
    a.end = ld - c0;
    if (rows > 1)
      a.keys = a.values = kRunAhead;
    if (chunk && c0 + chunk < ld) {
      uint64_t c1;
      a.split = chunk;
      a.next = head + chunkOf(c0 + chunk, &c1);
    }
    return a;
  };
  thread_local std::vector<float> buf;
  if (buf.size() < rows * gmax * ld)
    buf.resize(rows * gmax * ld);
  const float scale = 1.0f / std::sqrt((float)dim);
  for (uint64_t h = h0; h < h1;) {
    // The query heads [h, hEnd) of this range share kv head kvh; its keys
    // and values are read once for them and for every row.
    const uint64_t kvh = h / group;
    const uint64_t hEnd = std::min(h1, (kvh + 1) * group), G = hEnd - h;
    const T *K = kc + kvh * kvStride, *V = vc + kvh * kvStride;
    auto scores = [&](uint64_t r) { return buf.data() + r * gmax * ld; };
    for (uint64_t kb = 0; kb < ld; kb += kAttendBlock)
      for (uint64_t r = 0; r < rows; ++r) {
        const uint64_t len = len0 + r, t1 = std::min(kb + kAttendBlock, len);
        const float *qr = q + r * qStride + h * dim;
        uint64_t c0;
        const T *Kc = K + chunkOf(kb, &c0);
        RowsAhead<T> ahead = aheadOf(K, c0);
        if (rows == 1)
          FirstValuesEarly(&ahead, V, len0, c0, chunk);
        for (uint64_t g = 0; g < G && kb < len; g += 2) {
          if (g + 1 < G)
            ScoreRange<2, T>(qr + g * dim, Kc, kb - c0, t1 - c0, dim, scale,
                             scores(r) + g * ld + c0, ld, ahead);
          else
            ScoreRange<1, T>(qr + g * dim, Kc, kb - c0, t1 - c0, dim, scale,
                             scores(r) + g * ld + c0, ld, ahead);
          ahead.vbase = nullptr; // the group's first heads fetched them
        }
      }
    for (uint64_t r = 0; r < rows; ++r)
      for (uint64_t g = 0; g < G; ++g)
        SoftmaxScores(scores(r) + g * ld, len0 + r);
    for (uint64_t vb = 0; vb < ld; vb += kAttendBlock)
      for (uint64_t r = 0; r < rows; ++r) {
        const uint64_t len = len0 + r;
        uint64_t c0;
        const T *Vc = V + chunkOf(vb, &c0);
        if (vb < len)
          WeighRange(scores(r) + c0, ld, G, Vc, vb - c0,
                     std::min(vb + kAttendBlock, len) - c0, dim,
                     out + r * outStride + h * dim, vb == 0, aheadOf(V, c0));
      }
    h = hEnd;
  }
}

template void AttendRows<float>(const float *, uint64_t, uint64_t, uint64_t,
                                const float *, const float *, uint64_t,
                                uint64_t, uint64_t, uint64_t, uint64_t,
                                uint64_t, float *, uint64_t, uint64_t,
                                uint64_t);
template void AttendRows<uint16_t>(const float *, uint64_t, uint64_t, uint64_t,
                                   const uint16_t *, const uint16_t *, uint64_t,
                                   uint64_t, uint64_t, uint64_t, uint64_t,
                                   uint64_t, float *, uint64_t, uint64_t,
                                   uint64_t);

void ToHalf(const float *x, uint64_t n, uint16_t *out) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(
        reinterpret_cast<__m128i *>(out + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i)
    out[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

void MlaAttend(const float *qt, const float *qpe, uint64_t qpeStride,
               const float *cache, const uint64_t *pos, uint64_t n,
               uint64_t R, uint64_t rope, float scale, uint64_t heads,
               float *olat) {
  const uint64_t W = R + rope, Rv = R / 8 * 8;
  float *scores = MlaScoreBuffer(heads * n);
  const __m128 sc = _mm_set1_ps(scale);
  // One dot of a head's [qt | q_pe] with a cached row, in four lanes'
  // partial sums: the latent part, then the rope part, into the same
  // eight-lane accumulator.
  for (uint64_t b0 = 0; b0 < n; b0 += kMlaBlock) {
    const uint64_t b1 = std::min(n, b0 + kMlaBlock);
    for (uint64_t h = 0; h < heads; ++h) {
      const float *qh = qt + h * R, *ph = qpe + h * qpeStride;
      float *sh = scores + h * n;
      uint64_t i = b0;
      for (; i + 4 <= b1; i += 4) {
        const float *c[4];
        for (int j = 0; j < 4; ++j)
          c[j] = cache + pos[i + j] * W;
        __m256 a[4];
        alignas(16) float tail[4] = {0, 0, 0, 0};
        for (int j = 0; j < 4; ++j)
          a[j] = _mm256_setzero_ps();
        Dot4Lanes(a, qh, c, 0, R);
        Dot4Lanes(a, ph, c, R, rope);
        Dot4Tail(tail, qh, c, 0, R);
        Dot4Tail(tail, ph, c, R, rope);
        const __m128 r = _mm_add_ps(Hsum4(a[0], a[1], a[2], a[3]),
                                    _mm_load_ps(tail));
        _mm_storeu_ps(sh + i, _mm_mul_ps(r, sc));
      }
      MlaScoreRowsTail(qh, ph, cache, pos, i, b1, W, R, rope, scale, sh);
    }
  }
  for (uint64_t h = 0; h < heads; ++h)
    SoftmaxScores(scores + h * n, n);
  // olat[h] = sum_i p[h][i] c_i[0:R]: every lane one FMA chain over the
  // positions in order, 64 latent floats of a head a pass (eight
  // accumulators), the block's rows in L1 for every head.
  for (uint64_t b0 = 0; b0 < n; b0 += kMlaBlock) {
    const uint64_t b1 = std::min(n, b0 + kMlaBlock);
    for (uint64_t h = 0; h < heads; ++h) {
      const float *ph = scores + h * n;
      float *o = olat + h * R;
      uint64_t d = 0;
      for (; d + 64 <= Rv; d += 64) {
        __m256 a[8];
        for (int j = 0; j < 8; ++j)
          a[j] = b0 ? _mm256_loadu_ps(o + d + 8 * j) : _mm256_setzero_ps();
        for (uint64_t i = b0; i < b1; ++i) {
          const float *c = cache + pos[i] * W + d;
          const __m256 w = _mm256_set1_ps(ph[i]);
          for (int j = 0; j < 8; ++j)
            a[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(c + 8 * j), a[j]);
        }
        for (int j = 0; j < 8; ++j)
          _mm256_storeu_ps(o + d + 8 * j, a[j]);
      }
      for (; d < Rv; d += 8) {
        __m256 a = b0 ? _mm256_loadu_ps(o + d) : _mm256_setzero_ps();
        for (uint64_t i = b0; i < b1; ++i)
          a = _mm256_fmadd_ps(_mm256_set1_ps(ph[i]),
                              _mm256_loadu_ps(cache + pos[i] * W + d), a);
        _mm256_storeu_ps(o + d, a);
      }
      for (; d < R; ++d) {
        float a = b0 ? o[d] : 0.0f;
        for (uint64_t i = b0; i < b1; ++i)
          a = std::fma(ph[i], cache[pos[i] * W + d], a);
        o[d] = a;
      }
    }
  }
}

void IndexScores(const float *q, const float *w, uint64_t heads,
                 uint64_t dim, const float *keys, uint64_t j0, uint64_t j1,
                 float *out) {
  uint64_t j = j0;
  for (; j + 4 <= j1; j += 4) {
    const float *k = keys + j * dim;
    __m128 sum = _mm_setzero_ps();
    const float *const rows[4] = {k, k + dim, k + 2 * dim, k + 3 * dim};
    for (uint64_t h = 0; h < heads; ++h) {
      const float *qh = q + h * dim;
      __m256 a[4];
      alignas(16) float tail[4] = {0, 0, 0, 0};
      for (int i = 0; i < 4; ++i)
        a[i] = _mm256_setzero_ps();
      Dot4Lanes(a, qh, rows, 0, dim);
      Dot4Tail(tail, qh, rows, 0, dim);
      const __m128 r = _mm_add_ps(Hsum4(a[0], a[1], a[2], a[3]),
                                  _mm_load_ps(tail));
      sum = _mm_add_ps(sum, _mm_mul_ps(_mm_set1_ps(w[h]),
                                       _mm_max_ps(r, _mm_setzero_ps())));
    }
    _mm_storeu_ps(out + j, sum);
  }
  for (; j < j1; ++j) {
    float sum = 0.0f;
    for (uint64_t h = 0; h < heads; ++h)
      sum += w[h] * std::max(DotF32(keys + j * dim, q + h * dim, dim), 0.0f);
    out[j] = sum;
  }
}

MlaTiming TimeMlaAttend(ThreadPool &pool, uint64_t positions,
                        uint64_t coldBytes, uint32_t reps) {
  constexpr uint64_t H = 128, R = 512, rope = 64, W = R + rope, qk = 192;
  const uint64_t layer = positions * W;
  const uint64_t layers =
      std::max<uint64_t>(2, coldBytes / std::max<uint64_t>(1, layer * 4));
  std::vector<float> cache(layer * layers);
  for (uint64_t i = 0; i < cache.size(); ++i)
    cache[i] = 0.001f * (float)(i % 101);
  std::vector<float> qt(H * R, 0.01f), qpe(H * qk, 0.02f), olat(H * R);
  std::vector<uint64_t> pos(positions);
  for (uint64_t i = 0; i < positions; ++i)
    pos[i] = i;
  const uint64_t T = pool.size();
  double best = 1e30;
  for (uint32_t r = 0; r <= std::max(1u, reps); ++r) { // the first warms up
    const auto t0 = std::chrono::steady_clock::now();
    for (uint64_t l = 0; l < layers; ++l)
      pool.ParallelFor(T, [&](uint64_t b, uint64_t e) {
        for (uint64_t i = b; i < e; ++i) {
          const uint64_t h0 = i * H / T, h1 = (i + 1) * H / T;
          MlaAttend(qt.data() + h0 * R, qpe.data() + h0 * qk, qk,
                    cache.data() + l * layer, pos.data(), positions, R, rope,
                    0.1f, h1 - h0, olat.data() + h0 * R);
        }
      });
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (r)
      best = std::min(best, s / (double)layers);
  }
  MlaTiming t;
  t.seconds = best;
  t.macs = (double)H * positions * (W + R);
  t.cache_bytes = (double)layer * 4;
  return t;
}

void TopK(const float *v, uint64_t n, uint64_t k, uint32_t *out) {
  // Small k: repeated selection keeps ties in index order.
  std::vector<bool> taken(n, false);
  for (uint64_t j = 0; j < k; ++j) {
    uint64_t best = n;
    for (uint64_t i = 0; i < n; ++i)
      if (!taken[i] && (best == n || v[i] > v[best]))
        best = i;
    taken[best] = true;
    out[j] = (uint32_t)best;
  }
}

} // namespace duck::runtime
