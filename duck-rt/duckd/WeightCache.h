// duckd's weight buffer: a file-backed mapping that survives restarts.
//
//   file = [duckd_cache_header: 64 KiB][weight image region: capacity bytes]
//
// The header is duckd's own metadata, separate from the image (the ELF sees
// only the image region, which starts with duck_image_header). It names the
// cached image (its full duck_image_header: model key, tp size/rank, slot
// count, size, header checksum) and holds a finish flag and checksum per
// slot plus one for the image head (header + slot table). A flag is set
// only after the bytes it covers verified against their XXH3-64 and were
// msync'ed; the header is msync'ed after every change and carries its own
// checksum, so a crash or kill mid-prepare never leaves a part marked
// finished with half its bytes (docs/protocol.md, "Weight cache").
#ifndef DUCK_RT_DUCKD_WEIGHTCACHE_H
#define DUCK_RT_DUCKD_WEIGHTCACHE_H

#include "duck_rt/duckd_protocol.h"

#include "absl/status/statusor.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

extern "C" {

#define DUCKD_CACHE_MAGIC 0x3143574B44435544ull /* "DUCKDWC1" */
enum {
  DUCKD_CACHE_FORMAT_VERSION = 1,
  DUCKD_CACHE_HEADER_BYTES = 65536,
};

typedef struct duckd_cache_slot {
  uint64_t checksum; // the verified XXH3-64 of the slot's bytes
  uint32_t finished;
  /// 1: the slot was finished and its bytes were later found changed (by
  /// the scrub or the re-hash before a prepare trusts the cache); it is
  /// unfinished, and steps on it are refused until a prepare finishes it
  /// again. (Was `reserved`, always 0: files written before read as "not
  /// damaged", and older duckds ignore it.)
  uint32_t damaged;
} duckd_cache_slot;

typedef struct duckd_cache_header {
  uint64_t magic; // DUCKD_CACHE_MAGIC
  uint32_t format_version;
  uint32_t header_bytes; // DUCKD_CACHE_HEADER_BYTES: the image starts here
  uint64_t capacity;     // bytes of the image region
  uint64_t generation;   // bumped on every change of the image region
  uint32_t valid;        // 1: `image` names the cached image
  uint32_t head_finished;
  uint64_t head_checksum; // XXH3-64 of image bytes [0, slot table end)
  duck_image_header image;
  uint32_t slot_capacity; // entries `slots` can hold
  uint32_t finished_slots;
  uint64_t meta_checksum; // XXH3-64 of header + slots[image.slot_count]
                          // with this field zero
  duckd_cache_slot slots[];
} duckd_cache_header;

} // extern "C"

namespace duck::duckd {

static_assert(sizeof(duckd_cache_header) == 144, "cache header layout");
static_assert(sizeof(duckd_cache_slot) == 16, "cache slot layout");

class WeightCache {
public:
  struct Options {
    std::string path;
    uint64_t capacity = 0;
    bool sync = true; // msync data before flags (off: tests on tmpfs)
  };

  /// Opens or creates the file, locks it (one duckd per file), maps it and
  /// checks the header; a header that fails its checksum is reset (logged
  /// through `out_note`).
  static absl::StatusOr<std::unique_ptr<WeightCache>>
  Open(const Options &options, std::string *out_note);
  ~WeightCache();

  uint8_t *image() const { return map_ + DUCKD_CACHE_HEADER_BYTES; }
  uint64_t capacity() const { return capacity_; }
  int fd() const { return fd_; }
  uint8_t *mapping() const { return map_; }
  uint64_t mapping_bytes() const { return DUCKD_CACHE_HEADER_BYTES + capacity_; }
  const duckd_cache_header &header() const { return *hdr(); }
  uint64_t generation() const { return generation_; }
  /// Bytes the ELF may see: the image once its head verified, else 0.
  uint64_t usable_bytes() const;
  std::vector<uint8_t> FinishedBitmap() const;
  /// How the mapping sits in memory, from /proc/self/smaps: "N of M MiB in
  /// memory, K MiB of them in 2 MiB pages" (the kernels stream the image
  /// 14-20 % slower from 4 KiB pages); empty if smaps cannot be read.
  std::string PagesNote() const;

  struct Result {
    duckd_cache_result result = DUCKD_CACHE_MISS;
    duckd_prepare_reply reply{};
    std::vector<uint8_t> bitmap;
    uint32_t damaged = 0; // finished parts whose bytes no longer verified
  };
  /// Starts a cache session for `image`: hit, partial (resume) or miss
  /// (reset to the new identity with nothing finished). Before it trusts
  /// the finished parts of a matching image the first time (after duckd
  /// starts, or after any write), it re-hashes them and unfinishes those
  /// whose bytes changed, so a damaged slot is uploaded again, alone.
  absl::StatusOr<Result> Begin(const duck_image_header &image, bool invalidate);
  /// Where `bytes` at image `offset` go; clears (and syncs) the flags of
  /// every finished part they overlap before returning.
  absl::StatusOr<uint8_t *> BeginWrite(uint64_t offset, uint64_t bytes);
  /// Verifies the head and every unfinished slot this session wrote whole,
  /// syncs the data, then sets the flags. Fails naming the first parts
  /// that did not verify, or how many were not written whole (a host that
  /// stopped an upload part way: the slots it sent whole are kept).
  absl::StatusOr<Result> Finish();

  /// True once a prepare_begin of this process has re-hashed (or reset)
  /// the cache: from then on every finished part has verified in this
  /// process, which is what the scrub keeps checking (before that, the
  /// first prepare does the whole check itself).
  bool checked() const { return checked_; }
  /// Bytes [0, TableEnd()) of the image: the image header and slot table.
  uint64_t HeadBytes() const { return TableEnd(); }
  /// Marks a finished slot (or with slot -1, the head: then every finished
  /// slot) damaged: unfinished and flagged in the metadata, durably, so
  /// the next prepare uploads it again and no step runs on it meanwhile.
  /// Returns how many parts it unfinished.
  uint32_t MarkDamaged(int64_t slot);
  /// Slots flagged damaged now (awaiting a prepare).
  uint32_t DamagedSlots() const;

private:
  WeightCache() = default;
  duckd_cache_header *hdr() const {
    return reinterpret_cast<duckd_cache_header *>(map_);
  }
  void Reset(const duck_image_header *image);
  void Commit(); // recompute the checksum, msync the header
  void SyncData(uint64_t offset, uint64_t bytes);
  uint64_t TableEnd() const;
  Result MakeResult(duckd_cache_result r) const;
  /// Re-hashes the finished head and slots; returns how many failed (they
  /// are unfinished, durably).
  uint32_t VerifyFinished();

  int fd_ = -1;
  uint8_t *map_ = nullptr;
  uint64_t capacity_ = 0;
  uint64_t generation_ = 0;
  uint64_t verified_generation_ = ~0ull; // the image state last re-hashed
  bool checked_ = false;
  bool sync_ = true;
  /// Bytes this cache session (since Begin) has written into each slot:
  /// Finish checksums only the slots written whole (and the head), so a
  /// host that stopped part way does not pay for reading what it never
  /// sent.
  std::vector<uint64_t> written_;
};

/// Checks an image header from a host (magic, versions, sizes, checksum).
absl::Status CheckImageHeader(const duck_image_header &h, uint64_t capacity);
/// XXH3-64 of a duck_image_header with header_checksum zero.
uint64_t ImageHeaderChecksum(const duck_image_header &h);

/// Why a step with this IB must not run: its slot (duck_ib_header.slot) is
/// flagged damaged in the cache metadata at `mapping` (the start of the
/// weights file's mapping, as WeightCache::mapping()); empty when it may
/// (no such slot, an IB the ELF will refuse anyway, or an undamaged slot).
/// Read-only and lock-free: a session worker calls it before every step.
std::string DamagedSlotRefusal(const uint8_t *mapping, const uint8_t *ib,
                               uint64_t ib_bytes);

} // namespace duck::duckd

#endif // DUCK_RT_DUCKD_WEIGHTCACHE_H
