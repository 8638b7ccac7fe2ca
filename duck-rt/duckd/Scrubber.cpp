// duckd's memory scrub (Scrubber.h).
#include "Scrubber.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace duck::duckd {

struct Scrubber::State {
  XXH3_state_t *xxh = XXH3_createState();
  ~State() { XXH3_freeState(xxh); }
};

Scrubber::Scrubber(WeightCache *cache, const Options &options)
    : cache_(cache), options_(options), state_(std::make_unique<State>()) {
  options_.chunk_bytes = std::max<uint64_t>(options_.chunk_bytes, 4096);
}

Scrubber::~Scrubber() = default;

bool Scrubber::HasWork() const {
  const duckd_cache_header &h = cache_->header();
  return enabled() && cache_->checked() && h.valid && h.head_finished;
}

bool Scrubber::TakePassEnded() {
  const bool ended = pass_ended_;
  pass_ended_ = false;
  return ended;
}

// Moves to the next finished part, from the start of a part written since
// its hash began, and ends the pass past the last slot.
void Scrubber::NextPart(absl::Time now, const duckd_cache_header &h,
                        uint64_t generation) {
  if (done_ && generation != part_generation_)
    done_ = 0; // written since its hash began: those bytes are new
  // The next finished part; past the last slot the pass has ended.
  while (part_ >= 0 && part_ < int64_t(h.image.slot_count) &&
         !h.slots[part_].finished) {
    ++part_;
    done_ = 0;
  }
  if (part_ >= int64_t(h.image.slot_count)) {
    ++stats_.passes;
    stats_.last_pass = now;
    stats_.last_pass_took = pass_start_ == absl::InfinitePast()
                                ? absl::ZeroDuration()
                                : now - pass_start_;
    stats_.last_pass_damaged = pass_damaged_;
    pass_damaged_ = 0;
    pass_ended_ = true;
    part_ = -1;
    done_ = 0;
  }
  if (part_ == -1 && done_ == 0)
    pass_start_ = now;
}

// The part's bytes in the image and the checksum it was finished with; false
// when its slot table entry points out of the image.
bool Scrubber::LocatePart(const duckd_cache_header &h, Damage &d) const {
  d.slot = part_;
  if (part_ < 0) {
    d.bytes = cache_->HeadBytes();
    d.want = h.head_checksum;
    return true;
  }
  duck_slot_entry e;
  std::memcpy(&e,
              cache_->image() + h.image.slot_table_offset +
                  uint64_t(part_) * sizeof(duck_slot_entry),
              sizeof e);
  d.layer = e.layer;
  d.kind = e.kind;
  d.offset = e.offset;
  d.bytes = e.bytes;
  d.want = h.slots[part_].checksum;
  return e.offset <= h.image.total_bytes &&
         e.bytes <= h.image.total_bytes - e.offset;
}

// Only a changed slot table can point a slot out of the image (the head
// verified when it was finished): the head is what is damaged.
Scrubber::Damage Scrubber::DamagedHead(const duckd_cache_header &h) {
  part_ = -1;
  done_ = 0;
  Damage head;
  head.bytes = cache_->HeadBytes();
  head.want = h.head_checksum;
  head.got = XXH3_64bits(cache_->image(), head.bytes);
  head.unfinished = cache_->MarkDamaged(-1);
  ++stats_.damaged;
  ++pass_damaged_;
  return head;
}

// Hashes the part's next chunk into the streaming state and pushes the next
// chunk back by the rate.
void Scrubber::HashChunk(absl::Time now, const Damage &d,
                         uint64_t generation) {
  if (done_ == 0) {
    XXH3_64bits_reset(state_->xxh);
    part_generation_ = generation;
  }
  const uint64_t n = std::min(options_.chunk_bytes, d.bytes - done_);
  XXH3_64bits_update(state_->xxh, cache_->image() + d.offset + done_, n);
  done_ += n;
  stats_.bytes += n;
  // The rate: each chunk pushes the next one back by its share of a
  // second, a short one (the head, a small slot) as much as a whole one,
  // so the loop wakes at most rate / chunk times a second (250 at 64
  // MB/s) whatever the parts; an idle spell earns at most one chunk of
  // catching up.
  const absl::Duration cost =
      absl::Seconds(double(options_.chunk_bytes) /
                    double(options_.bytes_per_second));
  due_ = std::max(due_, now - cost) + cost;
}

std::optional<Scrubber::Damage> Scrubber::Chunk(absl::Time now) {
  if (!HasWork()) {
    // Nothing trusted to check (no image, its head unfinished, or not yet
    // checked by a prepare): the next pass starts from the head.
    part_ = -1;
    done_ = 0;
    pass_start_ = absl::InfinitePast();
    return std::nullopt;
  }
  const duckd_cache_header &h = cache_->header();
  const uint64_t generation = cache_->generation();
  NextPart(now, h, generation);

  Damage d;
  if (!LocatePart(h, d))
    return DamagedHead(h);
  HashChunk(now, d, generation);
  if (done_ < d.bytes)
    return std::nullopt;

  d.got = XXH3_64bits_digest(state_->xxh);
  done_ = 0;
  part_ = part_ + 1; // the head (-1) is followed by slot 0
  if (d.slot >= 0)
    ++stats_.slots;
  if (d.got == d.want)
    return std::nullopt;
  d.unfinished = cache_->MarkDamaged(d.slot);
  ++stats_.damaged;
  ++pass_damaged_;
  return d;
}

} // namespace duck::duckd
