//===- BenchHost.cpp - duck-bench host: the host's kernels against memory -===//
//
// The host's share of a decoded token on this machine, each figure beside
// the streaming read rate measured in the same run:
//
//  - fp9 GEMV through the host's thread pool (MatMulMany / MatVec, the
//    AVX-512 kernel where the CPU has it) on the Qwen3-0.6B host matrices:
//    q/k/v fused (2048 + 1024 + 1024 rows x 1024), o_proj (1024 x 2048),
//    an fp9 LM head (151936 x 1024) and duckc's default int8 head of the
//    same shape;
//  - the fp9 GEMM of a batched decode step (4, 8, 16 rows through the
//    q/k/v matrix): the AVX2 duck_gemm (four rows in registers, a panel
//    from five), the panel decoded with AVX-512 (and its multiply-adds
//    512 bits wide as well) and AVX-512 in registers, in
//    multiply-adds a second (compute-bound: a decoded weight serves only
//    T rows);
//  - GQA attention over the KV cache (AttendHeads, 16 query / 8 kv heads of
//    128, the pool splitting the kv heads) at several context lengths,
//    with a plain read of the same cache bytes through the same pool as
//    its floor;
//  - DeepSeek's absorbed MLA attention (MlaAttend: 128 heads over 2048
//    cached latents of 576 floats), in multiply-adds a second: the rate
//    the cost model's `host_gmac_s` stands for.
//
// Everything is cold: copies of the weights (or layers of cache) are cycled
// through a set of --cold-mib, so each call reads memory, not cache.
//
//===----------------------------------------------------------------------===//
#include "BenchSubcommands.h"
#include "Common.h"

#include "duck/runtime/engine/HostKernels.h"
#include "duck_rt/kernel_select.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using namespace duck::bench;
using duck::runtime::HostMatrix;
using duck::runtime::ThreadPool;

namespace {

struct HostOptions {
  uint32_t threads = 0; // 0: every online core
  uint64_t cold_mib = 0; // 0: four times the last-level cache, >= 1 GiB
  std::vector<uint32_t> contexts = {128, 1024, 4096};
  uint32_t reps = 5;
  bool json = false;
  // Sections: gemv, gemm, attention, mla (all by default). Without gemv
  // and attention the plain-read reference is skipped too.
  bool gemv = true, gemm = true, attention = true, mla = true;
};

void PrintUsage(FILE *out) {
  std::fprintf(
      out,
      "usage: duck-bench host [--threads=N] [--cold-mib=4xLLC]\n"
      "  [--contexts=128,1024,4096] [--reps=5] "
      "[--only=gemv,gemm,attention,mla]\n"
      "  [--json]\n\n"
      "Measures the host's kernels on this machine, cold (weights or KV\n"
      "cache cycled through --cold-mib MiB, by default four times the\n"
      "last-level cache and at least 1 GiB), against the streaming read\n"
      "rate of the same run (a plain read of a cold set of that size over\n"
      "the same threads): the fp9 GEMV of the Qwen3-0.6B host matrices\n"
      "(q/k/v fused, o_proj, an fp9 LM head), q/k/v and o_proj as e4m3 (an\n"
      "FP8 checkpoint's host matrices; with AVX-512 where the CPU has it and\n"
      "DUCK_HOST_ISA is not avx2), the default int8 head\n"
      "(one row, and the 4 rows of a speculative verify step);\n"
      "the fp9 GEMM of 2, 4, 8, 16, 24 and 32\n"
      "rows (a batched decode step) through the q/k/v matrix in GMAC/s\n"
      "(and as e4m3: AVX2, and AVX-512 in registers),\n"
      "by the AVX2 duck_gemm and (where the CPU has it) by AVX-512: the\n"
      "panel decoded with it, with 512-bit multiply-adds as well, and\n"
      "each chunk decoded in registers for up to 8 rows (what the host runs\n"
      "below 17 rows);\n"
      "GQA attention (16/8 heads of 128) over --contexts cached\n"
      "positions laid out as duckrun keeps them, from an fp32 cache and\n"
      "from an IEEE half one (duckrun --kv-cache f16): a decoded row, and up\n"
      "to 1024 positions a 64-row prompt run; and DeepSeek's absorbed MLA\n"
      "attention (128 heads over\n"
      "2048 cached latents) in GMAC/s, the figure `duckc measure-cluster\n"
      "--host` records as host_gmac_s. A figure is the best of --reps\n"
      "passes; GB/s counts the bytes a call must read. --only runs some\n"
      "sections (without gemv and attention the plain-read reference is\n"
      "skipped).\n");
}

/// Fills `o`; on a bad argument returns false with it in *bad.
bool Parse(int argc, char **argv, HostOptions *o, std::string *bad) {
  bool badNumber = false; // said on stderr by parseWhole
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    *bad = a;
    auto val = [&](const char *key) { return flagValue(argv[i], key); };
    if (a == "--json")
      o->json = true;
    else if (const char *v = val("--threads"))
      o->threads = uint32_t(parseWhole("--threads", v, &badNumber));
    else if (const char *v = val("--cold-mib"))
      o->cold_mib = parseWhole("--cold-mib", v, &badNumber, UINT64_MAX);
    else if (const char *v = val("--reps"))
      o->reps = uint32_t(parseWhole("--reps", v, &badNumber));
    else if (const char *v = val("--only")) {
      o->gemv = o->gemm = o->attention = o->mla = false;
      for (const std::string &name : splitCommas(v)) {
        if (name == "gemv")
          o->gemv = true;
        else if (name == "gemm")
          o->gemm = true;
        else if (name == "attention")
          o->attention = true;
        else if (name == "mla")
          o->mla = true;
        else
          return false;
      }
    } else if (const char *v = val("--contexts")) {
      if (!parseUintList(v, o->contexts, 1u << 20))
        return false;
    } else
      return false;
    if (badNumber) // *bad is the option
      return false;
  }
  *bad = o->reps < 1 ? "--reps below 1" : "--cold-mib below 16";
  return (o->cold_mib == 0 || o->cold_mib >= 16) && o->reps >= 1;
}

/// `copies` fp9 matrices [rows, k] (block 128) with magnitudes of normal
/// floats and mixed signs: the kernels' speed does not depend on values.
/// With `e4m3`, the host's e4m3 matrices instead (the same bytes read as
/// e4m3 weights, no sign plane), as an FP8 checkpoint loads without AVX-512.
struct Fp9Set {
  Buffer planes;
  std::vector<float> scale;
  std::vector<HostMatrix> m;
  uint64_t bytes = 0; // of one matrix: magnitudes + signs
};

Fp9Set MakeFp9(uint32_t rows, uint32_t k, uint64_t copies, bool e4m3 = false) {
  Fp9Set s;
  const uint64_t mag = (uint64_t)rows * k, sign = e4m3 ? 0 : mag / 8;
  s.bytes = mag + sign;
  s.planes = Buffer(s.bytes * copies);
  uint8_t *p = s.planes.data();
  for (uint64_t i = 0; i < copies * s.bytes; ++i)
    p[i] = (uint8_t)(0x60 + (i * 7) % 64);
  s.scale.assign((uint64_t)(rows + 127) / 128 * (k / 128), 1.0f);
  for (uint64_t c = 0; c < copies; ++c) {
    HostMatrix h;
    h.rows = rows;
    h.cols = k;
    h.is_fp9 = !e4m3;
    h.is_e4m3 = e4m3;
    h.fp9.mag = p + c * s.bytes;
    h.fp9.sign =
        reinterpret_cast<const uint32_t *>(p + c * s.bytes + (e4m3 ? 0 : mag));
    h.fp9.scale = s.scale.data();
    h.fp9.rows = rows;
    h.fp9.k = k;
    h.fp9.block = 128;
    h.fp9.scale_rows = 128;
    h.fp9.row_phase = 0;
    h.fp9.kernel = duck_select_kernel(k, 128);
    s.m.push_back(h);
  }
  return s;
}

uint64_t CopiesFor(uint64_t bytes, uint64_t coldBytes) {
  return std::max<uint64_t>(2, (coldBytes + bytes - 1) / bytes);
}

/// Best seconds a call of fn(copy) over `reps` passes of every copy.
template <typename Fn>
double BestPerCall(uint64_t copies, uint32_t reps, Fn fn) {
  double best = 1e30;
  for (uint32_t r = 0; r <= reps; ++r) { // the first pass warms up
    const double t0 = nowSeconds();
    for (uint64_t c = 0; c < copies; ++c)
      fn(c);
    if (r)
      best = std::min(best, (nowSeconds() - t0) / (double)copies);
  }
  return best;
}

struct Result {
  std::string what;
  double bytes, seconds, floor_seconds; // floor: a plain read, or 0
  double macs = 0;                      // multiply-adds a call (attention)
};

/// duckc's default LM head of the 0.6B shape (int8, 151936 x 1024) as
/// MatVec reads it (or MatMul, for the `tokens` rows of a verify step):
/// one matrix quantised once, its bytes copied to cycle through the cold
/// set.
Result BenchInt8Head(duck::runtime::ThreadPool &pool, uint64_t cold,
                     uint32_t reps, uint64_t tokens) {
  using duck::runtime::HostMatrix;
  const uint64_t rows = 151936, k = 1024,
                 blocks = k / duck::runtime::kInt8Block;
  HostMatrix src =
      duck::runtime::QuantizeInt8(pool, rows, k, [](uint64_t r, float *b) {
        Rng rng(r + 1);
        for (uint64_t i = 0; i < 1024; ++i)
          b[i] = (float)((int64_t)(rng.next() % 2001) - 1000) * 1e-5f;
      });
  const uint64_t bytes = duck::runtime::MatrixBytes(src);
  const uint64_t copies = CopiesFor(bytes, cold);
  Buffer q(copies * rows * k), sc(copies * rows * blocks * 2);
  std::vector<HostMatrix> m(copies);
  for (uint64_t c = 0; c < copies; ++c) {
    std::memcpy(q.data() + c * rows * k, src.i8, rows * k);
    std::memcpy(sc.data() + c * rows * blocks * 2, src.i8_scale,
                rows * blocks * 2);
    m[c].rows = rows;
    m[c].cols = k;
    m[c].i8 = reinterpret_cast<const int8_t *>(q.data() + c * rows * k);
    m[c].i8_scale =
        reinterpret_cast<const uint16_t *>(sc.data() + c * rows * blocks * 2);
  }
  std::vector<float> x(tokens * k, 0.5f), y(tokens * rows);
  for (uint64_t i = 0; i < x.size(); ++i) // tokens that differ
    x[i] = 0.5f - (float)(i % 97) * 0.01f;
  const double s = BestPerCall(copies, reps, [&](uint64_t c) {
    if (tokens == 1)
      duck::runtime::MatVec(pool, m[c], x.data(), y.data());
    else
      duck::runtime::MatMul(pool, m[c], x.data(), tokens, y.data());
  });
  return {tokens == 1 ? "gemv int8 LM head 151936x1024 (0.6B, default)"
                      : "int8 LM head 151936x1024, 4 rows (a verify step)",
          (double)bytes, s, 0};
}

/// Seconds a call to read, plainly, the rows a GQA layer's attention
/// reads (BenchAttention's layout: `chunk` positions of each of 8 kv heads
/// of 128 together), best of the runs, over the pool by kv head.
double PlainReadOfRows(duck::runtime::ThreadPool &pool, const Buffer &kc,
                       const Buffer &vc, uint64_t layers, uint64_t layerValues,
                       uint64_t chunk, uint64_t len, uint32_t reps) {
  const uint64_t KV = 8, D = 128;
  std::atomic<uint64_t> sink{0};
  return BestPerCall(layers, reps, [&](uint64_t l) {
    pool.ParallelFor(KV, [&](uint64_t b, uint64_t e) {
      __m256i a0 = _mm256_setzero_si256(), a1 = a0;
      for (const Buffer *buf : {&kc, &vc})
        for (uint64_t h = b; h < e; ++h)
          for (uint64_t c0 = 0; c0 < len; c0 += chunk) {
            const auto *p = reinterpret_cast<const __m256i *>(
                buf->as<float>() + l * layerValues +
                ((c0 / chunk) * KV + h) * chunk * D);
            const uint64_t vecs = std::min(chunk, len - c0) * D / 8;
            for (uint64_t i = 0; i + 1 < vecs; i += 2) {
              a0 = _mm256_xor_si256(a0, _mm256_loadu_si256(p + i));
              a1 = _mm256_xor_si256(a1, _mm256_loadu_si256(p + i + 1));
            }
          }
      sink += (uint64_t)_mm256_extract_epi64(_mm256_xor_si256(a0, a1), 0);
    });
  });
}

/// One layer's GQA attention, 16 query heads over 8 kv heads of 128, at
/// `len` cached positions laid out as GqaAttention keeps them (each kv
/// head's positions contiguous for KvCacheChunk of them, that chunk of
/// every head together), in fp32 or IEEE half (`duckrun --kv-cache f16`),
/// copies of it cycled through the cold set: a decoded row, and (up to
/// 1024 positions) a 64-row prompt run ending at `len`, which reads the
/// cache once for all its rows. The fp32 row has a plain read of the same
/// bytes beside it.
template <typename T>
void BenchAttention(duck::runtime::ThreadPool &pool, uint32_t len,
                    uint64_t cold, uint32_t reps, std::vector<Result> *out) {
  const uint64_t H = 16, KV = 8, D = 128, run = 64;
  const uint64_t chunk = duck::runtime::KvCacheChunk(KV, D, sizeof(T));
  const uint64_t chunks = (len + chunk - 1) / chunk;
  const uint64_t layerValues = chunks * KV * chunk * D;
  const uint64_t usedBytes = 2 * KV * len * D * sizeof(T);
  const uint64_t layers = CopiesFor(2 * layerValues * sizeof(T), cold);
  Buffer kc(layerValues * sizeof(T) * layers),
      vc(layerValues * sizeof(T) * layers);
  for (uint64_t i = 0; i < layerValues * layers; ++i) {
    const float k = 0.001f * (float)(i % 97), v = 0.002f * (float)(i % 89);
    if constexpr (std::is_same_v<T, float>) {
      kc.as<T>()[i] = k;
      vc.as<T>()[i] = v;
    } else {
      duck::runtime::ToHalf(&k, 1, &kc.as<T>()[i]);
      duck::runtime::ToHalf(&v, 1, &vc.as<T>()[i]);
    }
  }
  const bool half = !std::is_same_v<T, float>;
  const std::string name = format("attention 16/8 heads x 128, context %u%s",
                                  len, half ? ", f16 cache" : "");
  for (uint64_t rows : {uint64_t(1), run}) {
    if (rows > 1 && (len > 1024 || len < run))
      break;
    std::vector<float> q(rows * H * D, 0.1f), o(rows * H * D);
    const double s = BestPerCall(layers, reps, [&](uint64_t l) {
      const T *k = kc.as<T>() + l * layerValues,
              *v = vc.as<T>() + l * layerValues;
      pool.ParallelFor(KV, [&](uint64_t b, uint64_t e) {
        duck::runtime::AttendRows(
            q.data(), H * D, rows, len - rows + 1, k, v, chunk * D, H, KV, D,
            b * (H / KV), e * (H / KV), o.data(), H * D, chunk, KV * chunk * D);
      });
    });
    // The fp32 row's floor: a plain read of the rows it reads.
    const double floor = half || rows > 1
                             ? 0
                             : PlainReadOfRows(pool, kc, vc, layers,
                                               layerValues, chunk, len, reps);
    const double macs = 2.0 * H * D * (double)rows * (double)(len - rows / 2);
    out->push_back({rows > 1 ? name + ", 64-row prompt run" : name,
                    (double)usedBytes, s, floor, macs});
  }
}

} // namespace

int duckBenchHost(int argc, char **argv) {
  HostOptions o;
  if (argc > 1 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
    PrintUsage(stdout);
    return 0;
  }
  std::string bad;
  if (!Parse(argc, argv, &o, &bad)) {
    std::fprintf(stderr, "duck-bench host: bad argument: %s\n\n", bad.c_str());
    PrintUsage(stderr);
    return 2;
  }
  const MachineInfo machine = detectMachine();
  const unsigned threads =
      o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  ThreadPool pool(threads);
  const uint64_t cold =
      o.cold_mib ? o.cold_mib << 20 : defaultColdBytes(machine.llcBytes);
  std::fprintf(stderr, "duck-bench host: %u thread(s), %s, AVX-512 %s\n",
               threads, machine.cpuModel.c_str(),
               duck::runtime::HostHasAvx512() ? "yes" : "no");
  // The reference: a plain read of a cold set of the same size.
  double readGbs = 0;
  if (o.gemv || o.attention) {
    Buffer set(cold);
    std::memset(set.data(), 1, cold);
    const uint64_t lanes = cold / 32;
    std::atomic<uint64_t> sink{0};
    const double s = BestPerCall(1, o.reps, [&](uint64_t) {
      pool.ParallelFor(
          lanes,
          [&](uint64_t b, uint64_t e) {
            const auto *p = set.as<const __m256i>();
            __m256i a0 = _mm256_setzero_si256(), a1 = a0;
            for (uint64_t i = b; i + 1 < e; i += 2) {
              a0 = _mm256_xor_si256(a0, _mm256_loadu_si256(p + i));
              a1 = _mm256_xor_si256(a1, _mm256_loadu_si256(p + i + 1));
            }
            sink += (uint64_t)_mm256_extract_epi64(_mm256_xor_si256(a0, a1), 0);
          },
          2);
    });
    readGbs = (double)cold / s / 1e9;
  }

  std::vector<Result> results;
  // q/k/v fused: three matrices of one input, one hand-off; fp9 and e4m3.
  for (bool e4m3 : {false, true}) {
    if (!o.gemv)
      break;
    const uint32_t k = 1024;
    const uint64_t one =
        (2048 + 1024 + 1024) * (uint64_t)k * (e4m3 ? 8 : 9) / 8;
    const uint64_t copies = CopiesFor(one, cold);
    Fp9Set qs = MakeFp9(2048, k, copies, e4m3),
           ks = MakeFp9(1024, k, copies, e4m3),
           vs = MakeFp9(1024, k, copies, e4m3);
    std::vector<float> x(k, 0.5f), yq(2048), yk(1024), yv(1024);
    const double s = BestPerCall(copies, o.reps, [&](uint64_t c) {
      duck::runtime::MatMulMany(pool, x.data(), 1,
                                {{&qs.m[c], yq.data()},
                                 {&ks.m[c], yk.data()},
                                 {&vs.m[c], yv.data()}});
    });
    results.push_back({e4m3 ? "gemv q/k/v 4096x1024 (0.6B, e4m3)"
                            : "gemv q/k/v 4096x1024 (0.6B)",
                       (double)one, s, 0});
  }
  struct Shape {
    const char *what;
    uint32_t rows, k;
    bool e4m3;
  };
  for (Shape sh :
       {Shape{"gemv o_proj 1024x2048 (0.6B)", 1024, 2048, false},
        Shape{"gemv o_proj 1024x2048 (0.6B, e4m3)", 1024, 2048, true},
        Shape{"gemv LM head 151936x1024 (0.6B)", 151936, 1024, false}}) {
    if (!o.gemv)
      break;
    const uint64_t bytes = (uint64_t)sh.rows * sh.k * (sh.e4m3 ? 8 : 9) / 8;
    const uint64_t copies = CopiesFor(bytes, cold);
    Fp9Set set = MakeFp9(sh.rows, sh.k, copies, sh.e4m3);
    std::vector<float> x(sh.k, 0.5f), y(sh.rows);
    const double s = BestPerCall(copies, o.reps, [&](uint64_t c) {
      duck::runtime::MatVec(pool, set.m[c], x.data(), y.data());
    });
    results.push_back({sh.what, (double)set.bytes, s, 0});
  }
  if (o.gemv) { // the default LM head: int8 with a half scale per 32 weights
    results.push_back(BenchInt8Head(pool, cold, o.reps, 1));
    results.push_back(BenchInt8Head(pool, cold, o.reps, 4));
  }
  // The GEMM of a batched decode step: T rows through the q/k/v matrix
  // (4096 x 1024), the rows of the matrix split over the pool as the
  // runtime does (64-row chunks); the panel decoded by each decoder.
  if (o.gemm) {
    const uint32_t rows = 4096, k = 1024;
    const uint64_t bytes = (uint64_t)rows * k * 9 / 8;
    const uint64_t copies = CopiesFor(bytes, cold);
    Fp9Set set = MakeFp9(rows, k, copies),
           e4m3 = MakeFp9(rows, k, copies, /*e4m3=*/true);
    enum class Kind { duck, panel, widePanel, registers, e4m3, e4m3Avx512 };
    struct Decoder {
      const char *name;
      duck_panel_decode_fn fn;
      Kind kind;
    };
    std::vector<Decoder> decoders = {{"AVX2 duck_gemm", nullptr, Kind::duck},
                                     {"e4m3, AVX2", nullptr, Kind::e4m3}};
    if (duck::runtime::HostHasAvx512()) {
      decoders.push_back({"AVX-512 decoded panel",
                          duck::runtime::Fp9DecodePanelAvx512, Kind::panel});
      decoders.push_back({"AVX-512 panel, 512-bit FMAs",
                          duck::runtime::Fp9DecodePanelAvx512,
                          Kind::widePanel});
      decoders.push_back({"AVX-512 in registers", nullptr, Kind::registers});
      decoders.push_back(
          {"e4m3, AVX-512 in registers", nullptr, Kind::e4m3Avx512});
    }
    for (uint32_t T : {2u, 4u, 8u, 16u, 24u, 32u}) {
      std::vector<float> x((uint64_t)T * k, 0.5f), y((uint64_t)T * rows);
      for (const Decoder &d : decoders) {
        const double s = BestPerCall(copies, o.reps, [&](uint64_t c) {
          pool.ParallelFor(
              rows,
              [&](uint64_t b, uint64_t e) {
                thread_local std::vector<float> scratch;
                scratch.resize(
                    std::max<uint64_t>(
                        std::max<uint64_t>(2ull * T * k,
                                           duck_e4m3_gemm_scratch_floats(T, k)),
                        duck::runtime::Fp9GemmPanelAvx512ScratchFloats(T, k)) +
                    16);
                float *xs = reinterpret_cast<float *>(
                    (reinterpret_cast<uintptr_t>(scratch.data()) + 63) &
                    ~uintptr_t(63));
                if (d.kind == Kind::e4m3)
                  duck_e4m3_gemm(&e4m3.m[c].fp9, x.data(), k, T, y.data() + b,
                                 rows, (uint32_t)b, (uint32_t)e, xs);
                else if (d.kind == Kind::e4m3Avx512)
                  duck::runtime::E4m3GemmAvx512(&e4m3.m[c].fp9, x.data(), k, T,
                                                y.data() + b, rows, (uint32_t)b,
                                                (uint32_t)e, xs);
                else if (d.kind == Kind::registers)
                  duck::runtime::Fp9GemmAvx512(&set.m[c].fp9, x.data(), k, T,
                                               y.data() + b, rows, (uint32_t)b,
                                               (uint32_t)e, xs);
                else if (d.kind == Kind::widePanel)
                  duck::runtime::Fp9GemmPanelAvx512(
                      &set.m[c].fp9, x.data(), k, T, y.data() + b, rows,
                      (uint32_t)b, (uint32_t)e, xs);
                else
                  duck_gemm_with_decoder(&set.m[c].fp9, x.data(), k, T,
                                         y.data() + b, rows, (uint32_t)b,
                                         (uint32_t)e, xs, d.fn);
              },
              64);
        });
        results.push_back({format("gemm %u rows x 4096x1024, %s", T, d.name),
                           (double)(d.kind == Kind::e4m3 || d.kind == Kind::e4m3Avx512
                                     ? e4m3
                                     : set)
                               .bytes, s,
                           0, (double)T * rows * k});
      }
    }
  }
  for (uint32_t len : o.contexts) {
    if (!o.attention)
      break;
    BenchAttention<float>(pool, len, cold, o.reps, &results);
    BenchAttention<uint16_t>(pool, len, cold, o.reps, &results);
  }
  // DeepSeek's absorbed MLA: 128 heads over one latent cache of 512 + 64
  // floats a position, the heads split over the pool as the runtime does.
  if (o.mla) {
    const duck::runtime::MlaTiming t =
        duck::runtime::TimeMlaAttend(pool, 2048, cold, o.reps);
    results.push_back({"MLA attention 128 heads, 2048 positions",
                       t.cache_bytes, t.seconds, 0, t.macs});
  }

  if (o.json) {
    std::string rows;
    for (const Result &r : results) {
      JsonObject j;
      j.str("what", r.what)
          .num("bytes", r.bytes)
          .num("us", r.seconds * 1e6)
          .num("gb_s", r.bytes / r.seconds / 1e9)
          .num("bw_fraction",
               readGbs > 0 ? r.bytes / r.seconds / 1e9 / readGbs : NAN);
      if (r.floor_seconds > 0)
        j.num("plain_read_gb_s", r.bytes / r.floor_seconds / 1e9);
      if (r.macs > 0)
        j.num("gmac_s", r.macs / r.seconds / 1e9);
      rows += (rows.empty() ? "" : ",") + j.text();
    }
    JsonObject top;
    top.str("date", machine.date)
        .str("cpu", machine.cpuModel)
        .str("load_average", machine.loadAverage)
        .integer("threads", threads)
        .boolean("avx512", duck::runtime::HostHasAvx512())
        .num("read_gb_s", readGbs > 0 ? readGbs : NAN)
        .num("cold_bytes", (double)cold)
        .raw("results", "[" + rows + "]");
    std::printf("%s\n", top.text().c_str());
    return 0;
  }
  if (readGbs > 0)
    std::printf("read bandwidth: %.1f GB/s (a plain read of %.0f MiB, %u "
                "threads, %s; load %s)\n\n",
                readGbs, (double)cold / (1 << 20), threads,
                machine.date.c_str(), machine.loadAverage.c_str());
  else
    std::printf("%u threads, %s; load %s\n\n", threads, machine.date.c_str(),
                machine.loadAverage.c_str());
  std::printf("%-68s %10s %9s %8s %10s %7s\n", "kernel (cold)", "us a call",
              "GB/s", "of read", "plain read", "GMAC/s");
  for (const Result &r : results) {
    const double gbs = r.bytes / r.seconds / 1e9;
    std::printf(
        "%-68s %10.1f %9.1f %8s %10s %7s\n", r.what.c_str(), r.seconds * 1e6,
        gbs, readGbs > 0 ? format("%.2f", gbs / readGbs).c_str() : "-",
        r.floor_seconds > 0
            ? format("%.1f", r.bytes / r.floor_seconds / 1e9).c_str()
            : "-",
        r.macs > 0 ? format("%.1f", r.macs / r.seconds / 1e9).c_str() : "-");
  }
  return 0;
}
