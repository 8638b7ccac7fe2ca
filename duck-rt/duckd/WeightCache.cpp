// duckd's file-backed weight buffer and its cache metadata (WeightCache.h).
#include "WeightCache.h"

#include "duck_rt/wire_codec.h"

#include "absl/strings/str_cat.h"

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace duck::duckd {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint32_t kSlotCapacity =
    (DUCKD_CACHE_HEADER_BYTES - sizeof(duckd_cache_header)) /
    sizeof(duckd_cache_slot);

bool InRange(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

std::string Errno(const char *what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

uint64_t MetaBytes(uint32_t slots) {
  return sizeof(duckd_cache_header) + uint64_t(slots) * sizeof(duckd_cache_slot);
}

uint64_t MetaChecksum(const duckd_cache_header *h) {
  duckd_cache_header copy = *h;
  copy.meta_checksum = 0;
  StreamingChecksum sum;
  sum.Update(&copy, sizeof copy);
  const uint32_t n = std::min<uint32_t>(h->image.slot_count, kSlotCapacity);
  sum.Update(h->slots, uint64_t(n) * sizeof(duckd_cache_slot));
  return sum.Digest();
}

const duck_slot_entry *Table(const uint8_t *image, const duck_image_header &h) {
  return reinterpret_cast<const duck_slot_entry *>(image + h.slot_table_offset);
}

} // namespace

uint64_t ImageHeaderChecksum(const duck_image_header &h) {
  duck_image_header copy = h;
  copy.header_checksum = 0;
  return Checksum(&copy, sizeof copy);
}

absl::Status CheckImageHeader(const duck_image_header &h, uint64_t capacity) {
  if (h.magic != DUCK_IMAGE_MAGIC)
    return absl::InvalidArgumentError("not a duck weight image (bad magic)");
  if (!duck_image_format_known(h.format_version) ||
      h.abi_version != DUCK_ABI_VERSION ||
      h.fp9_version != DUCK_FP9_FORMAT_VERSION)
    return absl::FailedPreconditionError(absl::StrCat(
        "image versions format ", h.format_version, " abi ", h.abi_version,
        " fp9 ", h.fp9_version, "; duckd reads ", DUCK_IMAGE_FORMAT_VERSION,
        "-", DUCK_IMAGE_FORMAT_VERSION_CHAINED, "/", DUCK_ABI_VERSION, "/",
        DUCK_FP9_FORMAT_VERSION));
  if (h.header_checksum != ImageHeaderChecksum(h))
    return absl::DataLossError("image header checksum mismatch");
  if (h.total_bytes > capacity)
    return absl::ResourceExhaustedError(
        absl::StrCat("the image needs ", h.total_bytes,
                     " bytes; the weight buffer holds ", capacity,
                     " (duckd --weights-size)"));
  if (h.slot_count > kSlotCapacity)
    return absl::ResourceExhaustedError(absl::StrCat(
        "the image has ", h.slot_count, " slots; duckd caches at most ",
        kSlotCapacity));
  if (h.tp_size == 0 || h.tp_rank >= h.tp_size)
    return absl::InvalidArgumentError(
        absl::StrCat("tp rank ", h.tp_rank, " of ", h.tp_size));
  if (h.slot_table_offset < sizeof(duck_image_header) ||
      h.slot_table_offset % 8 != 0 ||
      !InRange(h.slot_table_offset,
               uint64_t(h.slot_count) * sizeof(duck_slot_entry),
               h.total_bytes))
    return absl::InvalidArgumentError("slot table outside the image");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WeightCache>>
WeightCache::Open(const Options &options, std::string *out_note) {
  if (options.capacity == 0 || options.capacity % kPage != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("weights size ", options.capacity,
                     " must be a positive multiple of 4096"));
  std::unique_ptr<WeightCache> c(new WeightCache());
  c->sync_ = options.sync;
  c->capacity_ = options.capacity;
  c->fd_ = ::open(options.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (c->fd_ < 0)
    return absl::NotFoundError(Errno(options.path.c_str()));
  if (::flock(c->fd_, LOCK_EX | LOCK_NB) != 0)
    return absl::FailedPreconditionError(absl::StrCat(
        "weights file ", options.path, " is in use by another duckd"));
  struct stat st;
  if (::fstat(c->fd_, &st) != 0)
    return absl::InternalError(Errno("fstat"));
  const uint64_t want = DUCKD_CACHE_HEADER_BYTES + options.capacity;
  const bool fresh = st.st_size == 0;
  if (uint64_t(st.st_size) != want && ::ftruncate(c->fd_, want) != 0)
    return absl::ResourceExhaustedError(Errno("ftruncate"));
  void *m = ::mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd_, 0);
  if (m == MAP_FAILED)
    return absl::ResourceExhaustedError(Errno("mmap weights file"));
  c->map_ = static_cast<uint8_t *>(m);
  // The kernels stream the image once a token: in 4 KiB pages every 4 KiB
  // is a TLB miss (Qwen3-0.6B shape, duck kernel 14.4-15.1 ms a token
  // against 12.6 with the image in 2 MiB mappings; docs/perf.md). A kernel
  // whose page cache keeps large folios for the file system (this
  // machine's Linux 6.18 on ext4) maps the file in 2 MiB pages, more of
  // them when the mapping asks for it as the folios are made (on prepare,
  // or read back after a restart); elsewhere this changes nothing.
  (void)::madvise(m, want, MADV_HUGEPAGE);

  duckd_cache_header *h = c->hdr();
  std::string problem;
  if (fresh)
    problem = "new weights file";
  else if (h->magic != DUCKD_CACHE_MAGIC ||
           h->format_version != DUCKD_CACHE_FORMAT_VERSION ||
           h->header_bytes != DUCKD_CACHE_HEADER_BYTES ||
           h->slot_capacity != kSlotCapacity ||
           h->image.slot_count > kSlotCapacity)
    problem = "unknown weights file header";
  else if (h->meta_checksum != MetaChecksum(h))
    problem = "cache metadata checksum mismatch (torn write?)";
  else if (h->valid && h->image.total_bytes > options.capacity)
    problem = "cached image larger than the new --weights-size";
  c->generation_ = (problem.empty() ? h->generation : 0) + 1;
  if (!problem.empty()) {
    if (out_note)
      *out_note = absl::StrCat(problem, ": starting with an empty cache");
    c->Reset(nullptr);
  } else {
    if (out_note)
      *out_note = h->valid ? absl::StrCat("cache holds an image of ",
                                          h->image.total_bytes, " bytes, ",
                                          h->finished_slots, "/",
                                          h->image.slot_count,
                                          " slots finished")
                           : "cache is empty";
    h->capacity = options.capacity;
    c->Commit();
  }
  return c;
}

WeightCache::~WeightCache() {
  if (map_)
    ::munmap(map_, mapping_bytes());
  if (fd_ >= 0)
    ::close(fd_);
}

void WeightCache::Reset(const duck_image_header *image) {
  duckd_cache_header *h = hdr();
  std::memset(h, 0, MetaBytes(kSlotCapacity));
  h->magic = DUCKD_CACHE_MAGIC;
  h->format_version = DUCKD_CACHE_FORMAT_VERSION;
  h->header_bytes = DUCKD_CACHE_HEADER_BYTES;
  h->capacity = capacity_;
  h->slot_capacity = kSlotCapacity;
  if (image) {
    h->valid = 1;
    h->image = *image;
  }
  ++generation_;
  Commit();
}

void WeightCache::Commit() {
  duckd_cache_header *h = hdr();
  uint32_t finished = 0;
  for (uint32_t s = 0; s < h->image.slot_count; ++s)
    finished += h->slots[s].finished ? 1 : 0;
  h->finished_slots = finished;
  h->generation = generation_;
  h->meta_checksum = MetaChecksum(h);
  if (sync_)
    ::msync(map_, DUCKD_CACHE_HEADER_BYTES, MS_SYNC);
}

void WeightCache::SyncData(uint64_t offset, uint64_t bytes) {
  if (!sync_ || !bytes)
    return;
  const uint64_t begin = DUCKD_CACHE_HEADER_BYTES + (offset & ~(kPage - 1));
  const uint64_t end = DUCKD_CACHE_HEADER_BYTES + offset + bytes;
  ::msync(map_ + begin, end - begin, MS_SYNC);
}

uint64_t WeightCache::TableEnd() const {
  const duck_image_header &h = hdr()->image;
  return h.slot_table_offset + uint64_t(h.slot_count) * sizeof(duck_slot_entry);
}

std::string WeightCache::PagesNote() const {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t start = reinterpret_cast<uintptr_t>(map_);
  bool in = false, seen = false;
  uint64_t rssKb = 0, pmdKb = 0;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    const size_t colon = line.find(':');
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 &&
        line.find('-') < colon) { // a mapping's first line
      in = lo == start;
      seen |= in;
      continue;
    }
    if (!in)
      continue;
    unsigned long kb = 0;
    if (std::sscanf(line.c_str(), "Rss: %lu kB", &kb) == 1)
      rssKb = kb;
    else if (std::sscanf(line.c_str(), "FilePmdMapped: %lu kB", &kb) == 1 ||
             std::sscanf(line.c_str(), "ShmemPmdMapped: %lu kB", &kb) == 1)
      pmdKb += kb; // a file system's page cache, or tmpfs's
  }
  if (!seen)
    return "";
  return absl::StrCat(rssKb / 1024, " of ", mapping_bytes() >> 20,
                      " MiB in memory, ", pmdKb / 1024,
                      " MiB of them in 2 MiB pages");
}

uint64_t WeightCache::usable_bytes() const {
  const duckd_cache_header *h = hdr();
  return h->valid && h->head_finished ? h->image.total_bytes : 0;
}

std::vector<uint8_t> WeightCache::FinishedBitmap() const {
  const duckd_cache_header *h = hdr();
  std::vector<uint8_t> bits((h->image.slot_count + 7) / 8, 0);
  for (uint32_t s = 0; s < h->image.slot_count; ++s)
    if (h->slots[s].finished)
      bits[s / 8] |= uint8_t(1u << (s % 8));
  return bits;
}

WeightCache::Result WeightCache::MakeResult(duckd_cache_result r) const {
  const duckd_cache_header *h = hdr();
  Result out;
  out.result = r;
  out.reply.result = r;
  out.reply.head_finished = h->head_finished;
  out.reply.slot_count = h->image.slot_count;
  out.reply.finished_slots = h->finished_slots;
  out.reply.generation = generation_;
  out.bitmap = FinishedBitmap();
  return out;
}

absl::StatusOr<WeightCache::Result>
WeightCache::Begin(const duck_image_header &image, bool invalidate) {
  if (absl::Status s = CheckImageHeader(image, capacity_); !s.ok())
    return s;
  written_.assign(image.slot_count, 0);
  const duckd_cache_header *h = hdr();
  if (!invalidate && h->valid &&
      std::memcmp(&h->image, &image, sizeof image) == 0) {
    uint32_t damaged = 0;
    if (verified_generation_ != generation_) {
      damaged = VerifyFinished();
      verified_generation_ = generation_;
    }
    checked_ = true;
    const bool all = h->head_finished && h->finished_slots == image.slot_count;
    Result r = MakeResult(all ? DUCKD_CACHE_HIT : DUCKD_CACHE_PARTIAL);
    r.damaged = damaged;
    return r;
  }
  Reset(&image);
  checked_ = true;
  return MakeResult(DUCKD_CACHE_MISS);
}

uint32_t WeightCache::VerifyFinished() {
  duckd_cache_header *h = hdr();
  if (h->head_finished &&
      XXH3_64bits(image(), TableEnd()) != h->head_checksum)
    return MarkDamaged(-1); // the slot table itself is suspect
  if (!h->head_finished)
    return 0;
  const duck_slot_entry *t = Table(image(), h->image);
  uint32_t bad = 0;
  for (uint32_t s = 0; s < h->image.slot_count; ++s)
    if (h->slots[s].finished &&
        XXH3_64bits(image() + t[s].offset, t[s].bytes) != h->slots[s].checksum)
      bad += MarkDamaged(s);
  return bad;
}

uint32_t WeightCache::MarkDamaged(int64_t slot) {
  duckd_cache_header *h = hdr();
  const uint32_t n = std::min<uint32_t>(h->image.slot_count, kSlotCapacity);
  uint32_t unfinished = 0;
  auto damage = [&](uint32_t s) {
    if (!h->slots[s].finished)
      return;
    // Flag first: a step that reads the flags between the two stores sees
    // a damaged slot refused, never an undamaged one running.
    __atomic_store_n(&h->slots[s].damaged, 1u, __ATOMIC_RELEASE);
    __atomic_store_n(&h->slots[s].finished, 0u, __ATOMIC_RELEASE);
    ++unfinished;
  };
  if (slot < 0) {
    // The head names every slot: nothing it describes can be trusted.
    if (h->head_finished) {
      h->head_finished = 0;
      ++unfinished;
    }
    for (uint32_t s = 0; s < n; ++s)
      damage(s);
  } else if (uint64_t(slot) < n) {
    damage(uint32_t(slot));
  }
  if (unfinished)
    Commit();
  return unfinished;
}

uint32_t WeightCache::DamagedSlots() const {
  const duckd_cache_header *h = hdr();
  uint32_t n = 0;
  for (uint32_t s = 0; s < h->image.slot_count && s < kSlotCapacity; ++s)
    n += h->slots[s].damaged ? 1 : 0;
  return n;
}

std::string DamagedSlotRefusal(const uint8_t *mapping, const uint8_t *ib,
                               uint64_t ib_bytes) {
  duck_ib_header ih;
  if (!mapping || ib_bytes < sizeof ih)
    return "";
  std::memcpy(&ih, ib, sizeof ih);
  const auto *h = reinterpret_cast<const duckd_cache_header *>(mapping);
  if (ih.magic != DUCK_IB_MAGIC || !h->valid ||
      ih.slot >= std::min<uint32_t>(h->image.slot_count, kSlotCapacity) ||
      !__atomic_load_n(&h->slots[ih.slot].damaged, __ATOMIC_ACQUIRE))
    return "";
  // The layer, from the slot table, only while the head still verifies
  // (a damaged table could name any layer).
  std::string layer;
  const uint64_t row =
      h->image.slot_table_offset + uint64_t(ih.slot) * sizeof(duck_slot_entry);
  if (h->head_finished && InRange(row, sizeof(duck_slot_entry), h->capacity)) {
    duck_slot_entry e;
    std::memcpy(&e, mapping + DUCKD_CACHE_HEADER_BYTES + row, sizeof e);
    layer = absl::StrCat(" (layer ", e.layer, ")");
  }
  return absl::StrCat(
      "slot ", ih.slot, layer,
      " of this duck's weight cache is damaged: its bytes no longer match "
      "the checksum they were finished with; it is unfinished, and no step "
      "runs on it until a prepare uploads it again");
}

absl::StatusOr<uint8_t *> WeightCache::BeginWrite(uint64_t offset,
                                                  uint64_t bytes) {
  duckd_cache_header *h = hdr();
  if (!h->valid)
    return absl::FailedPreconditionError(
        "prepare_write before prepare_begin named an image");
  if (!InRange(offset, bytes, h->image.total_bytes))
    return absl::OutOfRangeError(
        absl::StrCat("write at ", offset, " (+", bytes,
                     ") outside the image of ", h->image.total_bytes,
                     " bytes"));
  bool changed = false;
  if (h->head_finished) {
    if (offset < TableEnd()) {
      // The head names every slot: rewriting it unfinishes everything.
      h->head_finished = 0;
      for (uint32_t s = 0; s < h->image.slot_count; ++s)
        h->slots[s].finished = 0;
      changed = true;
    } else {
      const duck_slot_entry *t = Table(image(), h->image);
      for (uint32_t s = 0; s < h->image.slot_count; ++s)
        if (h->slots[s].finished && offset < t[s].offset + t[s].bytes &&
            t[s].offset < offset + bytes) {
          h->slots[s].finished = 0;
          changed = true;
        }
    }
  }
  // The slots this write lands in (by the table as it stands: a head
  // written this session is validated by Finish before any slot counts).
  if (offset + bytes > TableEnd()) {
    const duck_slot_entry *t = Table(image(), h->image);
    for (uint32_t s = 0; s < h->image.slot_count && s < written_.size(); ++s) {
      const uint64_t lo = std::max(offset, t[s].offset),
                     hi = std::min(offset + bytes, t[s].offset + t[s].bytes);
      if (lo < hi)
        written_[s] += hi - lo;
    }
  }
  ++generation_;
  if (changed)
    Commit(); // flags cleared durably before a byte changes
#ifdef MADV_POPULATE_WRITE
  // Fault the pages in with one call rather than one fault per page while
  // the socket data is copied in (several times faster on a cold file).
  const uint64_t begin = DUCKD_CACHE_HEADER_BYTES + (offset & ~(kPage - 1));
  const uint64_t end =
      (DUCKD_CACHE_HEADER_BYTES + offset + bytes + kPage - 1) & ~(kPage - 1);
  ::madvise(map_ + begin, end - begin, MADV_POPULATE_WRITE); // best effort
#endif
  return image() + offset;
}

absl::StatusOr<WeightCache::Result> WeightCache::Finish() {
  duckd_cache_header *h = hdr();
  if (!h->valid)
    return absl::FailedPreconditionError(
        "prepare_finish before prepare_begin named an image");
  const duck_image_header &want = h->image;
  const uint64_t tableEnd = TableEnd();
  bool newHead = false;
  if (!h->head_finished) {
    duck_image_header got;
    std::memcpy(&got, image(), sizeof got);
    if (std::memcmp(&got, &want, sizeof got) != 0)
      return absl::DataLossError(
          "the uploaded image header differs from the one prepare_begin "
          "named");
    const duck_slot_entry *t = Table(image(), want);
    uint64_t prevEnd = tableEnd;
    for (uint32_t s = 0; s < want.slot_count; ++s) {
      if (t[s].offset % DUCK_IMAGE_ALIGN != 0 || t[s].offset < prevEnd ||
          !InRange(t[s].offset, t[s].bytes, want.total_bytes))
        return absl::DataLossError(absl::StrCat(
            "slot table row ", s, " (offset ", t[s].offset, ", ", t[s].bytes,
            " bytes) is unaligned, overlapping or outside the image"));
      prevEnd = t[s].offset + t[s].bytes;
    }
    newHead = true;
  }
  const duck_slot_entry *t = Table(image(), want);
  std::vector<uint32_t> good, bad;
  uint32_t unwritten = 0;
  for (uint32_t s = 0; s < want.slot_count; ++s) {
    if (h->slots[s].finished && !newHead)
      continue;
    if (s >= written_.size() || written_[s] < t[s].bytes) { // not sent whole
      h->slots[s].finished = 0;
      ++unwritten;
      continue;
    }
    if (Checksum(image() + t[s].offset, t[s].bytes) == t[s].checksum)
      good.push_back(s);
    else
      bad.push_back(s);
  }
  // Data first, flags last.
  if (newHead)
    SyncData(0, tableEnd);
  for (uint32_t s : good)
    SyncData(t[s].offset, t[s].bytes);
  if (newHead) {
    h->head_finished = 1;
    h->head_checksum = Checksum(image(), tableEnd);
  }
  for (uint32_t s : good) {
    h->slots[s].finished = 1;
    h->slots[s].checksum = t[s].checksum;
    h->slots[s].damaged = 0; // uploaded again and verified
  }
  Commit();
  if (bad.empty() && unwritten)
    return absl::DataLossError(absl::StrCat(
        unwritten, " slot(s) were not written whole in this session and "
                   "stay unfinished"));
  if (!bad.empty()) {
    std::string list;
    for (size_t i = 0; i < bad.size() && i < 5; ++i)
      absl::StrAppend(&list, i ? ", " : "", bad[i], " (layer ",
                      t[bad[i]].layer, ", ", t[bad[i]].bytes, " bytes at ",
                      t[bad[i]].offset, ")");
    return absl::DataLossError(absl::StrCat(
        bad.size(), " slot(s) failed their checksum and stay unfinished: ",
        list, bad.size() > 5 ? ", ..." : ""));
  }
  return MakeResult(DUCKD_CACHE_HIT);
}

} // namespace duck::duckd
