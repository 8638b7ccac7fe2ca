//===- Measure.h - A duck's own rates, for the compiler's cost model -*- C++ -*-===//
//
// What `duckc measure-cluster` asks every duckd for (the protocol's
// `measure` request): the read bandwidth of the duck's cores and the cold
// fp9 GEMV rate of each kernel class and the fp9 GEMM rate of a prompt
// chunk (dense prefill) on them, measured with the kernels the
// duck ELF runs (duck_gemv, the same source) on random weights in memory of
// its own, so the duck's weight cache is not touched.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_BENCH_MEASURE_H
#define DUCK_BENCH_MEASURE_H

#include "duck_rt/kernel_select.h"

#include <cstdint>
#include <vector>

namespace duck::bench {

struct DuckMeasureOptions {
  uint32_t cores = 1;
  std::vector<int> cpus;          // core c runs on cpus[c % size]; empty: any
  uint64_t arena_bytes = 1ull << 30; // cold copies cycle through this much
  double seconds = 0.15;          // budget of each measurement
};

struct DuckRates {
  double read_gbs = 0; // streaming read, all cores
  /// Cold fp9 GEMV, all cores, by duck_kernel_id: parameters a second / 1e9.
  double gparam_s[DUCK_KERNEL_COUNT] = {};
  /// The matrix each class was measured on.
  uint32_t rows[DUCK_KERNEL_COUNT] = {}, k[DUCK_KERNEL_COUNT] = {};
  /// Cold dense prefill (duck_mlp_prefill, the fp9 GEMM) of gemm_tokens
  /// rows on a [gemm_hidden, gemm_inter] FFN, all cores: multiply-adds a
  /// second / 1e9 (the cost model's fp9_gemm_gmac_s).
  double gemm_gmac_s = 0;
  uint32_t gemm_tokens = 0, gemm_hidden = 0, gemm_inter = 0;
  /// A cold GEMV call's fixed cost, all cores, microseconds: a small
  /// general128 matrix (an expert's, gemv_call_rows x gemv_call_k) timed
  /// against its weights at the general128 rate above. Small products
  /// (experts, tensor-parallel slices) read slower than a large one by
  /// about this much a call.
  double gemv_call_us = 0;
  uint32_t gemv_call_rows = 0, gemv_call_k = 0;
  /// Cores' worth of CPU other processes used meanwhile (the noisiest
  /// measurement's); NaN if unknown.
  double other_load = 0;
};

/// Runs the measurements; about 10 x `seconds` plus packing.
DuckRates measureDuck(const DuckMeasureOptions &options);

} // namespace duck::bench

#endif // DUCK_BENCH_MEASURE_H
