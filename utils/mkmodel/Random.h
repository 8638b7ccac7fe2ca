//===- Random.h - Counter-based random numbers for duck-mkmodel -*- C++ -*-===//
//
// Every weight is a pure function of (seed, tensor name, element index), so
// the output does not depend on chunking, sharding or the order tensors are
// written in, and no std:: distribution (whose output differs between
// standard libraries) is involved. Only integer arithmetic and exact float
// operations are used.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_MKMODEL_RANDOM_H
#define DUCK_MKMODEL_RANDOM_H

#include "llvm/ADT/StringRef.h"

#include <cstdint>

namespace duck::mkmodel {

/// The splitmix64 increment (2^64 / golden ratio).
constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;

/// The splitmix64 output function (Stafford's "mix13" variant).
inline uint64_t splitMix64Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Sequential splitmix64: state += gamma, output mix(state).
class SplitMix64 {
public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += kSplitMixGamma;
    return splitMix64Mix(state_);
  }

private:
  uint64_t state_;
};

/// Output number `index` (0-based) of SplitMix64(key), in O(1).
inline uint64_t counterRandom(uint64_t key, uint64_t index) {
  return splitMix64Mix(key + (index + 1) * kSplitMixGamma);
}

/// A 64-bit key for a named stream: FNV-1a of the name, mixed with the seed.
inline uint64_t streamKey(uint64_t seed, llvm::StringRef name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return splitMix64Mix(h ^ splitMix64Mix(seed));
}

/// A bell-shaped sample with mean 0 and standard deviation ~1 from the low
/// 48 bits of `r` (Irwin-Hall sum of three 16-bit uniforms, range about
/// +-3). Exact: an odd integer times 2^-16.
inline float bellSample(uint64_t r) {
  int32_t sum = static_cast<int32_t>(r & 0xFFFF) +
                static_cast<int32_t>((r >> 16) & 0xFFFF) +
                static_cast<int32_t>((r >> 32) & 0xFFFF);
  return static_cast<float>(2 * sum - 3 * 65535) * 0x1p-16f;
}

/// The top 16 bits of `r`, independent of bellSample's bits; used to pick
/// rare events (exact zeros, tiny values, outliers).
inline uint32_t eventBits(uint64_t r) { return static_cast<uint32_t>(r >> 48); }

} // namespace duck::mkmodel

#endif // DUCK_MKMODEL_RANDOM_H
