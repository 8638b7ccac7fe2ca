//===- Support.h - Clock, memory, random numbers for measuring -*- C++ -*-===//
//
// Shared by the duck's own measurement (Measure.h: duckd's `measure`
// request, duck-measure-cluster --host) and the kernel benchmark. duck-rt:
// nothing here may use LLVM.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_MEASURE_SUPPORT_H
#define DUCK_MEASURE_SUPPORT_H

#include <cstdint>
#include <vector>

namespace duck::bench {

/// Monotonic wall clock in seconds.
double nowSeconds();

/// Page-aligned anonymous memory (mmap), transparent huge pages advised,
/// every page touched once at allocation so no page fault is ever timed.
class Buffer {
public:
  Buffer() = default;
  explicit Buffer(uint64_t bytes);
  ~Buffer();
  Buffer(Buffer &&other) noexcept;
  Buffer &operator=(Buffer &&other) noexcept;
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;

  uint8_t *data() const { return data_; }
  uint64_t size() const { return size_; }
  template <typename T> T *as() const { return reinterpret_cast<T *>(data_); }

private:
  uint8_t *data_ = nullptr;
  uint64_t size_ = 0;
};

/// splitmix64: fast, reproducible, good enough for benchmark weights.
class Rng {
public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [-1, 1).
  float symmetric() {
    return (float)((int64_t)(next() >> 40) - (1ll << 23)) * 0x1p-23f;
  }
  uint32_t below(uint32_t n) { return (uint32_t)((next() >> 32) * n >> 32); }

private:
  uint64_t state_;
};

/// Median of a non-empty sample (copied, not reordered in place).
double median(std::vector<double> v);

} // namespace duck::bench

#endif // DUCK_MEASURE_SUPPORT_H
