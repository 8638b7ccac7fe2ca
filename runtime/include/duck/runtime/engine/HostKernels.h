//===- HostKernels.h - the host's share of the forward pass -----*- C++ -*-===//
//
// Embedding, RMSNorm, RoPE, grouped-query attention over a KV cache, router
// top-k, matrix-vector products for the attention projections and the LM
// head. AVX2 where it matters, a ThreadPool for the big products; no
// allocation in the per-token path beyond the caller's buffers.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_HOSTKERNELS_H
#define DUCK_RUNTIME_HOSTKERNELS_H

#include "duck_rt/kernels.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <thread>
#include <vector>

namespace duck::runtime {

/// Backing store for the host's large weight arrays: an allocation of 2
/// MiB or more is its own mapping, 2 MiB-aligned and advised for
/// transparent huge pages (MADV_HUGEPAGE) before it is first touched;
/// smaller ones come from malloc. A GEMV streams its matrix once a token,
/// and with 4 KiB pages every 4 KiB of it is a TLB miss: the 0.6B shape's
/// fp9 LM head took 7.3-7.5 ms a token in 4 KiB pages and 6.0-6.2 in
/// 2 MiB ones (docs/perf.md). Where THP is off, the mapping gets ordinary
/// pages and nothing else changes.
void *HugePageAlloc(size_t bytes);
/// The mapping behind it: `bytes` (rounded up to 4 KiB) of anonymous
/// memory, 2 MiB-aligned and advised for huge pages, MAP_NORESERVE if
/// asked; nullptr (errno set) if mmap fails. munmap releases it.
void *HugePageMap(size_t bytes, bool noreserve);
void HugePageFree(void *p, size_t bytes);
inline constexpr size_t kHugePageBytes = size_t(2) << 20;

/// Maps [p, p + bytes) in now, every page it touches whole
/// (MADV_POPULATE_WRITE), as its first writes would; contents never change.
/// Best effort: nothing happens where the kernel or headers lack it.
void PopulateRange(void *p, size_t bytes);

/// Maps memory in ahead of its first write (MADV_POPULATE_WRITE) on a
/// thread of its own in the idle scheduling class (SCHED_IDLE), so that a
/// KV cache's next 2 MiB pages are in before a decoded token writes them
/// (a first write maps a whole huge page: 4-5 ms each on a VM that backs
/// guest memory lazily, 56 of them on one Qwen3-0.6B-shape token every
/// 512 positions; docs/perf.md) without that token, or any other, waiting
/// for it: the thread runs only while a CPU would idle, and a request it
/// has not reached when the writes come costs what it did before (the
/// write maps the page). Contents never change: populating a mapped page
/// does nothing.
class BackgroundPopulate {
public:
  /// The process's one populator (its thread starts on the first request).
  static BackgroundPopulate &Get();
  /// Queues PopulateRange(p, bytes).
  void Request(void *p, size_t bytes);
  /// Drops the queued requests that touch [p, p + bytes) and waits for a
  /// running one there: call before unmapping it.
  void Forget(const void *p, size_t bytes);
  /// Requests queued or running (for tests).
  size_t Pending();
  /// Blocks until every queued request has run (for tests).
  void Drain();

private:
  BackgroundPopulate() = default;
  void Loop();
  struct Range {
    uintptr_t b = 0, e = 0;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Range> queue_; // FIFO: front first
  Range running_;
  bool started_ = false;
};

template <typename T> struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U> HugePageAllocator(const HugePageAllocator<U> &) {}
  T *allocate(size_t n) {
    return static_cast<T *>(HugePageAlloc(n * sizeof(T)));
  }
  void deallocate(T *p, size_t n) { HugePageFree(p, n * sizeof(T)); }
  template <typename U> bool operator==(const HugePageAllocator<U> &) const {
    return true;
  }
  template <typename U> bool operator!=(const HugePageAllocator<U> &) const {
    return false;
  }
};
template <typename T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

/// A fixed set of worker threads, created and owned explicitly by its user.
class ThreadPool {
public:
  /// `spin_ns`: how long an idle worker spins before it sleeps.
  explicit ThreadPool(unsigned threads, uint64_t spin_ns = kSpinNs);
  ~ThreadPool();
  unsigned size() const { return (unsigned)workers_.size() + 1; }
  /// Runs fn(begin, end) over [0, n): the range is cut into up to
  /// kChunksPerThread x size() chunks (their bounds multiples of `align`,
  /// but the last), which the caller and the workers claim one at a time
  /// until none is left. Returns when every chunk is done. Each index is
  /// run exactly once, by one thread.
  ///
  /// A step calls this a few times a layer, between steps on the ducks
  /// that take longer than a worker spins, so a worker is often asleep
  /// when a job comes, and waking a sleeping thread costs 100-150 us on a
  /// VM. The caller does not wait for it: it starts on the chunks at once,
  /// a worker joins in when it wakes, and the caller waits only for
  /// chunks a worker has claimed. Idle workers spin (`pause`, yielding now
  /// and then) for kSpinNs after their last chunk before they sleep on a
  /// condition variable.
  ///
  /// A woken worker must not land on the caller's CPU: it then waits for
  /// the caller to finish every chunk, and the job runs on one core. The
  /// scheduler does that when the other CPUs were busy a moment before (a
  /// duck of one core beside the host on a two-core box: half the jobs
  /// ran on one core, 13 % of the token lost). So the workers' affinity
  /// is every CPU of the process but the one the caller is on, updated
  /// when the caller moves (sched_getcpu, no syscall, each call;
  /// pthread_setaffinity_np for each worker only when the caller moved, a
  /// few times a run).
  void ParallelFor(uint64_t n, const std::function<void(uint64_t, uint64_t)> &fn,
                   uint64_t align = 1);

  static constexpr uint64_t kSpinNs = 50000;
  static constexpr uint64_t kChunksPerThread = 4;

  /// No job is coming for a while (the caller has sent a step to the ducks
  /// and waits for it): the idle workers sleep now instead of spinning
  /// out kSpinNs. A spinning worker holds its CPU against the duck worker
  /// that the step has just woken there; and once that duck is done, a CPU
  /// left with nothing to run halts, which on a VM costs 100-150 us to
  /// wake from. Sleeping as soon as the step is out hands the CPU straight
  /// to the duck.
  void Park() { park_.store(generation_.load()); }

  /// The CPU the caller ran on when it last moved the workers off it (-1:
  /// never; the workers may run anywhere the process may).
  int caller_cpu() const { return caller_cpu_; }
  /// Workers asleep now (for tests).
  unsigned sleepers() const { return sleepers_.load(); }

private:
  void Loop();
  /// Keeps the workers off the CPU the caller runs on (see ParallelFor).
  void AvoidCallerCpu();
  /// Claims the next chunk of job `gen`; false when it has none left or a
  /// newer job has started.
  bool Claim(uint64_t gen, uint64_t *begin, uint64_t *end);
  void RunChunks(uint64_t gen);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  // The current job. Written only between jobs (when every chunk of the
  // last one is done), before claim_ announces the new one.
  std::atomic<const std::function<void(uint64_t, uint64_t)> *> job_{nullptr};
  std::atomic<uint64_t> n_{0}, chunk_{0};
  /// (job generation << 32) | (chunks << 16) | next chunk: everything a
  /// claim checks in one word, so a worker that read a finished job's
  /// fields can never claim a chunk of the next one.
  std::atomic<uint64_t> claim_{0};
  std::atomic<uint64_t> done_{0}; // chunks of the current job finished
  std::atomic<uint64_t> generation_{0};
  std::atomic<unsigned> sleepers_{0};
  std::atomic<bool> stop_{false};
  /// The generation after which Park() was called: no job soon.
  std::atomic<uint64_t> park_{~0ull};
  const uint64_t spin_ns_;
  /// The CPUs this process may use when the pool was made (empty: the
  /// workers are never moved), and where the caller was last seen.
  std::vector<int> cpus_;
  int caller_cpu_ = -1;
};

/// A host weight matrix [rows, cols], row-major: bf16 (mapped straight
/// from the checkpoint), fp9 (FP8 checkpoints on an AVX-512 host: converted
/// losslessly at load, 1.125 bytes a weight, read with the duck GEMV
/// kernels), e4m3 (FP8 checkpoints elsewhere: the checkpoint's bytes, 1 byte
/// a weight, read by duck_e4m3_gemv with fp9's bits), or fp32.
struct HostMatrix {
  uint64_t rows = 0, cols = 0;
  const uint16_t *bf16 = nullptr;
  const float *f32 = nullptr;
  bool is_fp9 = false;
  /// e4m3: `fp9` views the bytes in e4m3_store (sign inside) with the
  /// scale plane in e4m3_scale (see duck_e4m3_gemv).
  bool is_e4m3 = false;
  duck_fp9_matrix fp9{};
  HugePageVector<uint8_t> e4m3_store;
  std::vector<float> e4m3_scale;
  std::vector<float> owned;       // backing store of f32 when converted
  HugePageVector<uint64_t> fp9_store; // backing store of the fp9 planes
  /// int8 (duckc --lm-head int8): a weight is q * i8_scale[row, k / 32],
  /// q in [-127, 127] (column k of row r at i8[r * cols + Int8Position(k,
  /// cols)]), the scale an IEEE half (1.0625 bytes a weight, as llama.cpp's
  /// Q8_0); quantised at load from a bf16/f16/f32 tensor.
  const int8_t *i8 = nullptr;
  const uint16_t *i8_scale = nullptr;
  HugePageVector<int8_t> i8_store;
  std::vector<uint16_t> i8_scale_store;
  /// sum |q * scale| over each row (the int8 head's error bound).
  std::vector<float> i8_l1;
};

/// Weights a scale of an int8 matrix (along a row).
inline constexpr uint64_t kInt8Block = 32;
/// Weights of a group of 8 blocks, stored interleaved.
inline constexpr uint64_t kInt8Group = 8 * kInt8Block;

/// Where column c of an int8 row of n weights is stored (and its int16
/// input, QuantizeX16's output): each full group of 8 blocks (256 columns
/// from a multiple of 256) interleaved so that its i-th 16 values hold
/// columns 2i and 2i + 1 of each of the 8 blocks, block j's at 2j and
/// 2j + 1 (one vpmaddwd then sums a pair of every block, 8 blocks in the
/// 8 lanes, with no horizontal adds); the columns of a last group of
/// fewer than 8 blocks in order.
inline uint64_t Int8Position(uint64_t c, uint64_t n) {
  const uint64_t g = c / kInt8Group * kInt8Group, o = c - g;
  if (g + kInt8Group > n)
    return c;
  const uint64_t j = o / kInt8Block, k = o % kInt8Block;
  return g + 16 * (k / 2) + 2 * j + k % 2;
}

/// Puts n int16 values that are in column order into Int8Position's.
void Int8Interleave(int16_t *v, uint64_t n);

/// Quantises `rows` x `cols` floats (cols a multiple of kInt8Block) to an
/// int8 matrix: per block of 32 weights of a row, scale = amax / 127
/// rounded to an IEEE half and q = round-to-nearest(w / that scale),
/// clamped to [-127, 127]. `row(r, buf)` fills buf with row r.
HostMatrix QuantizeInt8(ThreadPool &pool, uint64_t rows, uint64_t cols,
                        const std::function<void(uint64_t, float *)> &row);

/// Dot products with AVX2 (8 lanes, two accumulators).
float DotF32(const float *w, const float *x, uint64_t n);
float DotBf16(const uint16_t *w, const float *x, uint64_t n);
/// DotBf16 with AVX-512 (one zmm holds its two accumulators): the same
/// bits; and four tokens (x_ld floats apart) against one row.
float DotBf16Avx512(const uint16_t *w, const float *x, uint64_t n);
void DotBf16x4Avx512(const uint16_t *w, const float *x, uint64_t x_ld,
                     uint64_t n, float *out, uint64_t out_ld);
/// The int8 head's input: x rounded to int16 with one scale, returned
/// (stored in Int8Position's order):
/// max|x| / 32767 (q = round-to-nearest-even(x * 32767 / max|x|), so
/// |x - scale * q| <= 0.51 * scale). A zero input gives scale 0, one with
/// a NaN or an infinity a NaN scale (so the logits are NaN, as in fp32).
float QuantizeX16(const float *x, uint64_t n, int16_t *q);
/// One int8 row (n weights, a multiple of kInt8Block, an IEEE-half scale a
/// block, in Int8Position's order) against a QuantizeX16 input: each
/// block's 32 products summed exactly in integers (vpmaddwd), then sx *
/// sum over blocks of scale * block sum in fp32 (8 lanes, blocks b, b + 8,
/// ... in lane b % 8): about 5 vector operations a block where widening,
/// scaling and multiply-adding in fp32 took 16-20.
float DotI8X16(const int8_t *w, const uint16_t *scale, const int16_t *xq,
               float sx, uint64_t n);

/// The index std::max_element gives over v[0, n) (the first of equal
/// largest values), 8 values a vector; with a NaN in v, max_element
/// itself.
uint64_t ArgMax(const float *v, uint64_t n);

/// Bytes of the matrix as the kernels read it (fp9 planes and scales,
/// bf16 or fp32).
uint64_t MatrixBytes(const HostMatrix &w);

/// Bytes in memory: a piece of what a product reads.
struct ByteRange {
  const uint8_t *data = nullptr;
  uint64_t bytes = 0;
};
/// Appends the memory MatrixBytes counts (its planes, values and scales),
/// in the order the kernels read it; nothing for an empty matrix.
void AppendMatrixRanges(const HostMatrix &w, std::vector<ByteRange> *out);
/// Reads one byte of every 64-byte line of `ranges`, in order, up to
/// `limit` bytes in all: it brings a product's weights into this core's
/// caches (L2, and the last level as they leave it) before the product
/// runs, while the host would only wait for the ducks. Returns the bytes
/// covered.
uint64_t PrefetchRanges(const std::vector<ByteRange> &ranges, uint64_t limit);
/// The last-level cache of this machine in bytes (sysconf; 0 if unknown).
uint64_t LastLevelCacheBytes();

/// Streaming read bandwidth of this machine in GB/s: the best of three
/// passes over a set of at least 1 GiB and 4x the last-level cache (at
/// most `maxBytes`), in 2 MiB pages, with every thread of the pool
/// (~0.5 s).
double MeasureReadBandwidthGbs(ThreadPool &pool,
                               uint64_t maxBytes = ~uint64_t(0));

/// True when fp9 host matrices are read with the AVX-512 GEMV (the CPU has
/// AVX-512F/DQ and DUCK_HOST_ISA is not "avx2").
bool HostHasAvx512();
/// Whether the host keeps an FP8 checkpoint's matrices as e4m3: yes unless
/// DUCK_HOST_FP8=fp9 (the results have the same bits either way). e4m3
/// reads 1 byte a weight where fp9 takes 1.125 and decodes with fewer
/// vector operations: without AVX-512 duck_e4m3_gemv, 11 a 32-chunk
/// against 20 (1.33x the GEMV rate on Zen 3); with it E4m3GemvAvx512, 6
/// against 8 and a broadcast (the 0.6B shape's q/k/v 1.26x on Zen 5).
bool HostReadsE4m3();
/// duck_gemv's shift path with AVX-512: the same bits (HostFp9Avx512.cpp).
/// `xs` is k floats, 64-byte aligned.
void Fp9GemvAvx512(const duck_fp9_matrix *m, const float *x, float *y,
                   uint32_t row_begin, uint32_t row_end, float *xs);
/// duck_gemm's panel decoder (duck_panel_decode_fn) with AVX-512: the
/// same exact operands, about 11 vector uops a 32-chunk against 26.
void Fp9DecodePanelAvx512(const uint8_t *mag, const uint32_t *sign,
                          uint32_t k, uint32_t rows, uint32_t c0, uint32_t c1,
                          float *panel);
/// From this many tokens on, an AVX-512 host runs the panel GEMM below;
/// under it, Fp9GemmAvx512's tiles of up to 8 tokens, each chunk decoded
/// in registers once a tile (`duck-bench host`: 4 rows in 0.6x the
/// panel's time, 16 rows in 0.9x, on the Zen 5 VM of docs/perf.md).
constexpr uint32_t kFp9Avx512PanelMinTokens = 17;
/// duck_gemm's panel GEMM with AVX-512: the panel decoded as above, its
/// multiply-adds 512 bits wide (twice the AVX2 kernel's on CPUs with two
/// 512-bit FMA units); every token's result has the GEMV's bits. For
/// n_tokens >= kFp9Avx512PanelMinTokens; `xs` is
/// Fp9GemmPanelAvx512ScratchFloats(n_tokens, k) floats, 64-byte aligned.
uint64_t Fp9GemmPanelAvx512ScratchFloats(uint32_t n_tokens, uint32_t k);
void Fp9GemmPanelAvx512(const duck_fp9_matrix *m, const float *x,
                        uint32_t x_ld, uint32_t n_tokens, float *y,
                        uint32_t y_ld, uint32_t row_begin, uint32_t row_end,
                        float *xs);
/// duck_gemm with AVX-512, tiles of up to 8 tokens (the host uses it below
/// kFp9Avx512PanelMinTokens tokens): every token's result has the GEMV's bits.
/// `xs` is min(n_tokens, 8) * k floats, 64-byte aligned.
void Fp9GemmAvx512(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
                   uint32_t n_tokens, float *y, uint32_t y_ld,
                   uint32_t row_begin, uint32_t row_end, float *xs);
/// The same three for an e4m3 matrix (duck_e4m3_gemv's operands: 1 byte a
/// weight, its sign inside, no sign plane), with AVX-512: 6 vector
/// operations a 32-chunk to decode where fp9 takes 8 and a broadcast; every
/// result has the fp9 kernels' bits for the same weights. Scratch as the
/// fp9 functions' (the panel's: Fp9GemmPanelAvx512ScratchFloats).
void E4m3GemvAvx512(const duck_fp9_matrix *m, const float *x, float *y,
                    uint32_t row_begin, uint32_t row_end, float *xs);
void E4m3GemmAvx512(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
                    uint32_t n_tokens, float *y, uint32_t y_ld,
                    uint32_t row_begin, uint32_t row_end, float *xs);
void E4m3GemmPanelAvx512(const duck_fp9_matrix *m, const float *x,
                         uint32_t x_ld, uint32_t n_tokens, float *y,
                         uint32_t y_ld, uint32_t row_begin, uint32_t row_end,
                         float *xs);

/// y[r] = W[r] . x for rows [r0, r1).
void MatVecRows(const HostMatrix &w, const float *x, float *y, uint64_t r0,
                uint64_t r1);
/// y = W x over all rows, split across the pool.
void MatVec(ThreadPool &pool, const HostMatrix &w, const float *x, float *y);
/// Y[t] = W X[t] for n rows of X (row stride = cols), split across the pool.
void MatMul(ThreadPool &pool, const HostMatrix &w, const float *x, uint64_t n,
            float *y);
/// The most scratch RowsProduct takes on one thread for `w` at up to
/// `max_rows` tokens a call (0 for the formats that take none).
uint64_t RowsProductScratchFloats(const HostMatrix &w, uint64_t max_rows);
/// Maps `threads` kernel scratch buffers of `floats` now, for the threads
/// that run RowsProduct to take when they first need that much: a prompt's
/// first chunk then takes no page faults for them (a Qwen3-30B-A3B-shape
/// prompt took ~600, on a VM that charges several microseconds for each).
/// Spares smaller than `floats` are dropped (with threads 0, only that).
void ReserveKernelScratch(unsigned threads, uint64_t floats);
/// How many times a thread has allocated (or grown) its kernel scratch
/// rather than taking a reserved buffer, in this process.
uint64_t KernelScratchAllocations();
/// Rows [b, e) of W against n inputs (token t at x + t * x_ld): row r of
/// token t goes to out[t * out_ld + (r - b)]. One thread; the kernels of
/// MatVec (n = 1) and MatMul, so a token's bits are MatVecRows'.
void RowsProduct(const HostMatrix &w, const float *x, uint64_t x_ld,
                 uint64_t n, float *out, uint64_t out_ld, uint64_t b,
                 uint64_t e);
/// One product of MatMulMany: y = w x, y [n, w->rows].
struct Product {
  const HostMatrix *w;
  float *y;
};
/// Several matrices of the same cols against the same n inputs in one
/// hand-off to the pool: their rows are cut into chunks together, so
/// q/k/v (or MLA's q_a and kv_a) stream as one matrix instead of three,
/// with one start and one tail. Each product's bits are MatMul's.
void MatMulMany(ThreadPool &pool, const float *x, uint64_t n,
                std::initializer_list<Product> products);

/// y = w * x / sqrt(mean(x^2) + eps), in place allowed.
void RmsNorm(const float *x, const float *w, uint64_t n, float eps, float *y);

/// NeoX (half-split) rotary embedding of one head of `dim` at `pos`.
void RopeNeox(float *head, uint64_t dim, int64_t pos, double theta);

/// Positions of one kv head a GQA cache keeps together (GqaAttention's
/// chunk): the largest power of two from 64 up whose rows of every kv head
/// (`kvHeads` x `dim` values of `valueBytes`) fit one 2 MiB page, so that
/// the rows a decoded token writes into its heads share a page.
uint64_t KvCacheChunk(uint64_t kvHeads, uint64_t dim, uint64_t valueBytes);

/// Causal GQA attention of one query token over cached keys/values
/// [0, len), for query heads [h0, h1) (the pool splits the heads): q
/// [heads][dim], out [heads][dim]; the k/v caches are head-major, kv head
/// h's positions contiguous ([len][dim]) from kc + h * kvStride, so a
/// head's keys stream from consecutive memory.
/// The query heads of one kv head are done together, so each cached key
/// and value row is read once for the group; AVX2 throughout (the softmax
/// with a polynomial exp, relative error below 2e-7). The scores live in
/// a buffer of the calling thread that only grows.
void AttendHeads(const float *q, const float *kc, const float *vc,
                 uint64_t kvStride, uint64_t len, uint64_t heads,
                 uint64_t kvHeads, uint64_t dim, uint64_t h0, uint64_t h1,
                 float *out);
/// AttendHeads for a run of `rows` query rows of one sequence at
/// consecutive positions (a prompt chunk): row r (q + r * qStride, out +
/// r * outStride) attends over [0, len0 + r). Keys and values go in blocks
/// of 64 positions that every row takes while they are in L1, so a chunk
/// reads the cache once instead of once a row. Each row gets exactly the
/// bits AttendHeads gives it alone: a score depends only on its key, its
/// query and the row's length, and every output lane is one FMA chain over
/// the positions in order (prefill == decode, and a row's result does not
/// depend on the rows batched with it). T is float (an fp32 cache) or
/// uint16_t (IEEE half, `duckrun --kv-cache f16`: each value converted to
/// fp32 as it is read, then the same operations in the same order).
/// `chunk` > 0 (a multiple of 64): a head's positions are contiguous only
/// in chunks of that many, chunk c of kv head h at kc + h * kvStride + c *
/// chunkStride (GqaAttention's cache: every head's chunk of positions in
/// one 2 MiB page); the same bits.
template <typename T>
void AttendRows(const float *q, uint64_t qStride, uint64_t rows, uint64_t len0,
                const T *kc, const T *vc, uint64_t kvStride, uint64_t heads,
                uint64_t kvHeads, uint64_t dim, uint64_t h0, uint64_t h1,
                float *out, uint64_t outStride, uint64_t chunk = 0,
                uint64_t chunkStride = 0);
extern template void AttendRows<float>(const float *, uint64_t, uint64_t,
                                       uint64_t, const float *, const float *,
                                       uint64_t, uint64_t, uint64_t, uint64_t,
                                       uint64_t, uint64_t, float *, uint64_t,
                                       uint64_t, uint64_t);
extern template void AttendRows<uint16_t>(const float *, uint64_t, uint64_t,
                                          uint64_t, const uint16_t *,
                                          const uint16_t *, uint64_t, uint64_t,
                                          uint64_t, uint64_t, uint64_t,
                                          uint64_t, float *, uint64_t, uint64_t,
                                          uint64_t);
/// out[i] = x[i] rounded to IEEE half (to nearest even).
void ToHalf(const float *x, uint64_t n, uint16_t *out);

/// Absorbed MLA attention of one query row for `heads` heads over n cached
/// rows (row pos[i] of `cache`, R + rope floats: the normalised latent,
/// then the rope key): score = (qt_h . c[0:R] + qpe_h . c[R:]) * scale,
/// p = softmax, olat_h = sum_i p_i c_i[0:R]. qt [heads][R]; a head's rope
/// query at qpe + h * qpeStride; olat [heads][R]. The latent is shared by
/// every head, so the rows go in blocks that all the heads take while
/// they are in L1 (one read of the cache a row and call, not one a head).
/// AVX2; a score's and an output's bits depend only on the row's inputs
/// and n.
void MlaAttend(const float *qt, const float *qpe, uint64_t qpeStride,
               const float *cache, const uint64_t *pos, uint64_t n,
               uint64_t R, uint64_t rope, float scale, uint64_t heads,
               float *olat);

/// DeepSeek-V3.2's indexer scores, out[j] = sum_h w[h] * relu(q_h . k_j)
/// for positions j in [j0, j1) (j0 a multiple of 4), keys [n][dim]
/// contiguous, q [heads][dim]: four keys a pass, the heads summed in
/// order; a score's bits depend on its position and the row's length
/// only, not on how [0, len) is cut (the pool splits it).
void IndexScores(const float *q, const float *w, uint64_t heads,
                 uint64_t dim, const float *keys, uint64_t j0, uint64_t j1,
                 float *out);

/// One call of MlaAttend for DeepSeek's shape (128 heads, kv_lora 512,
/// rope 64) over `positions` cached rows, the heads split over the pool
/// as the runtime splits them, timed cold (layers of cache cycled through
/// coldBytes), best of `reps` passes: duck-bench host's MLA figure, and
/// `duckc measure-cluster --host`'s host_gmac_s (macs / seconds).
struct MlaTiming {
  double seconds = 0, macs = 0, cache_bytes = 0;
};
MlaTiming TimeMlaAttend(ThreadPool &pool, uint64_t positions,
                        uint64_t coldBytes, uint32_t reps);

/// Softmax in place over n values.
void Softmax(float *v, uint64_t n);

/// The k largest values' indices, largest first (ties: lower index).
void TopK(const float *v, uint64_t n, uint64_t k, uint32_t *out_idx);

} // namespace duck::runtime

#endif
