//===- Measure.h - A duck's own rates, for the compiler's cost model -*- C++ -*-===//
//
// What `duckc measure-cluster` asks every duckd for (the protocol's
// `measure` request): the read bandwidth of the duck's cores and the cold
// fp9 GEMV rate of each kernel class on them, measured with the kernels the
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
  uint64_t arena_bytes = 256 << 20; // cold copies cycle through this much
  double seconds = 0.15;          // budget of each measurement
};

struct DuckRates {
  double read_gbs = 0; // streaming read, all cores
  /// Cold fp9 GEMV, all cores, by duck_kernel_id: parameters a second / 1e9.
  double gparam_s[DUCK_KERNEL_COUNT] = {};
  /// The matrix each class was measured on.
  uint32_t rows[DUCK_KERNEL_COUNT] = {}, k[DUCK_KERNEL_COUNT] = {};
  /// Cores' worth of CPU other processes used meanwhile (the noisiest
  /// measurement's); NaN if unknown.
  double other_load = 0;
};

/// Runs the measurements; about 8 x `seconds` plus packing.
DuckRates measureDuck(const DuckMeasureOptions &options);

} // namespace duck::bench

#endif // DUCK_BENCH_MEASURE_H
