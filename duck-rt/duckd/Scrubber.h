// duckd's memory scrub: while the duck is idle, the finished parts of the
// weight cache (the image head and every finished slot) are hashed again
// in small chunks, at a bounded rate, and compared with the checksum they
// were finished with. Bytes that changed under a running duckd (a bad DIMM,
// a stray write to the weights file) would otherwise be used silently until
// the next start; a part that no longer matches is marked damaged in the
// cache (WeightCache::MarkDamaged): unfinished, so the next prepare uploads
// it again, and refused by every step meanwhile.
//
// The Scrubber does no scheduling of its own: duckd's event loop calls
// Chunk() when the duck is idle and the chunk is due (due()), one chunk at
// a time, and checks for work between chunks, so a step or a frame waits at
// most one chunk's hashing (256 KiB: tens of microseconds).
#ifndef DUCK_RT_DUCKD_SCRUBBER_H
#define DUCK_RT_DUCKD_SCRUBBER_H

#include "WeightCache.h"

#include "absl/time/time.h"

#include <cstdint>
#include <memory>
#include <optional>

namespace duck::duckd {

class Scrubber {
public:
  struct Options {
    /// Bytes a second at most (0: the scrub is off).
    uint64_t bytes_per_second = 64'000'000;
    /// Bytes hashed in one call of Chunk: the longest a step can find the
    /// scrub in its way.
    uint64_t chunk_bytes = 256 << 10;
  };
  struct Damage {
    int64_t slot = -1; // -1: the image head (header and slot table)
    uint32_t layer = 0, kind = 0;
    uint64_t offset = 0, bytes = 0; // in the image
    uint64_t got = 0, want = 0;     // XXH3-64 now, and when finished
    uint32_t unfinished = 0;        // parts it unfinished (head: all)
  };
  struct Stats {
    uint64_t passes = 0;  // full passes over every finished part
    uint64_t slots = 0;   // slots hashed whole
    uint64_t bytes = 0;   // bytes hashed
    uint64_t damaged = 0; // parts found damaged
    absl::Time last_pass = absl::InfinitePast(); // when the last pass ended
    absl::Duration last_pass_took;
    uint64_t last_pass_damaged = 0;
  };

  Scrubber(WeightCache *cache, const Options &options);
  ~Scrubber();

  bool enabled() const { return options_.bytes_per_second > 0; }
  uint64_t bytes_per_second() const { return options_.bytes_per_second; }
  /// Whether there is anything to hash: the scrub is on, a prepare of this
  /// process has checked the cache (WeightCache::checked) and its head is
  /// finished.
  bool HasWork() const;
  /// When the next chunk may start (the rate limit).
  absl::Time due() const { return due_; }
  /// Hashes the next chunk of the next finished part. A part whose bytes
  /// changed is marked damaged in the cache and returned. A part written
  /// since its hash began (a prepare) is started again.
  std::optional<Damage> Chunk(absl::Time now);
  /// True once after a full pass ended (for its log line).
  bool TakePassEnded();
  const Stats &stats() const { return stats_; }

private:
  void NextPart(absl::Time now, const duckd_cache_header &h,
                uint64_t generation);
  bool LocatePart(const duckd_cache_header &h, Damage &d) const;
  Damage DamagedHead(const duckd_cache_header &h);
  void HashChunk(absl::Time now, const Damage &d, uint64_t generation);

  WeightCache *cache_;
  Options options_;
  absl::Time due_ = absl::InfinitePast();
  int64_t part_ = -1;         // -1: the head, else a slot
  uint64_t done_ = 0;         // bytes of the part hashed so far
  uint64_t part_generation_ = 0; // the cache's generation when it began
  absl::Time pass_start_ = absl::InfinitePast();
  uint64_t pass_damaged_ = 0;
  bool pass_ended_ = false;
  struct State;
  std::unique_ptr<State> state_; // XXH3 streaming state of the part
  Stats stats_;
};

} // namespace duck::duckd

#endif // DUCK_RT_DUCKD_SCRUBBER_H
