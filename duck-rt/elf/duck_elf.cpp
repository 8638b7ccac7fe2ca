// The duck ELF: every kernel behind one mode dispatch (abi.h). duckd calls
// duck_rt_step (persistent session: globals survive between steps) or
// duck_rt_run (one-shot) on every core of the duck with its own duck_info.
//
// Freestanding: no libc, no system headers, no allocation. Everything the
// ELF reads from the IB or the weight buffer is validated before use; a bad
// input gives a status in the OB header, never a fault.
//
// Defined state: each call starts from a state core 0 establishes before
// any secondary core reads shared state. Secondary cores wait on the
// duck_job_board for the call's step_seq; core 0 re-initialises the barrier,
// writes the job and only then publishes. A barrier count, a phase or a job
// left behind by an earlier call therefore never reaches the next one. The
// cached slot views are keyed by the weight buffer's address, size and
// generation and by the slot table entry, so stale views are never used.
#include "step_layout.h"

#include "duck_rt/abi.h"
#include "duck_rt/kernels.h"
#include "duck_rt/smp.h"

namespace {

/* --------------------------------------------------------------------------
 * Log: a tiny formatter into duck_info.log (no libc).
 * ------------------------------------------------------------------------ */

class Log {
public:
  explicit Log(duck_info *info) : info_(info) {}
  Log &operator<<(const char *s) {
    while (*s)
      put(*s++);
    return *this;
  }
  Log &operator<<(uint64_t v) {
    char tmp[24];
    int n = 0;
    do {
      tmp[n++] = (char)('0' + v % 10);
      v /= 10;
    } while (v);
    while (n)
      put(tmp[--n]);
    return *this;
  }
  Log &operator<<(uint32_t v) { return *this << (uint64_t)v; }
  void end() { put('\n'); }

private:
  void put(char c) {
    if (!info_->log || info_->log_size + 1 >= info_->log_limit)
      return;
    info_->log[info_->log_size++] = c;
    info_->log[info_->log_size] = 0;
  }
  duck_info *info_;
};

/* --------------------------------------------------------------------------
 * Global state (survives between persistent steps).
 * ------------------------------------------------------------------------ */

enum {
  kCacheEntries = 1024, // direct-mapped by slot index
  kViewPool = 32768,    // duck_ffn_weights shared by all cached slots
};

/// The views of one attached slot and the key they are valid for.
struct CachedSlot {
  uint32_t valid;
  uint32_t slot;
  uint64_t weights_addr, weights_size, generation;
  duck_slot_entry entry;
  uint32_t kind, hidden, inter, n_experts;
  uint32_t view_base;
  uint32_t ob_begin; // head slots: the first result row the OB carries
  bool chained;      // head slots: some piece reads the slot's results
};

/// What core 0 decided for this call; secondaries read it after the
/// publish (acquire) on the job board.
struct Job {
  uint64_t seq;
  int32_t status;
  uint32_t mode, cores, n_tokens, top_k, hidden, inter, n_experts;
  uint32_t out_width; // floats a token in the OB: hidden, or a head's rows
  uint32_t ob_begin;  // head: the first result row in the OB
  uint32_t out_flags; // DUCK_IB_OUT_BF16 or DUCK_IB_OUT_Q8: the OB's form
  bool chained;       // head: results in scratch, the OB from ob_begin on
  const duck_ffn_desc *descs; // head: each piece's input
  const duck_ffn_weights *experts;
  const float *x;
  float *out;
  uint8_t *scratch;
  duck_step_layout layout;
};

struct State {
  uint32_t init_state; // 0 untouched, 1 initialising, 2 ready
  duck_job_board board;
  duck_barrier barrier;
  Job job;
  uint32_t views_used;
  CachedSlot cache[kCacheEntries];
  duck_ffn_weights views[kViewPool];
};

State g_state;

/// Spin with the host's yield hook (the board's and barrier's own loops use
/// the same hook, installed here once per loaded ELF).
void ensureInit(const duck_info *info) {
  uint32_t st = __atomic_load_n(&g_state.init_state, __ATOMIC_ACQUIRE);
  if (st == 2)
    return;
  uint32_t expected = 0;
  if (__atomic_compare_exchange_n(&g_state.init_state, &expected, 1, false,
                                  __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    duck_job_board_init(&g_state.board);
    g_state.board.yield = info->yield;
    duck_barrier_init(&g_state.barrier, 1);
    g_state.barrier.yield = info->yield;
    __atomic_store_n(&g_state.init_state, 2, __ATOMIC_RELEASE);
    return;
  }
  uint32_t spins = 0;
  while (__atomic_load_n(&g_state.init_state, __ATOMIC_ACQUIRE) != 2)
    duck_spin_pause(info->yield, &spins);
}

inline uint64_t rdtsc() { return __builtin_ia32_rdtsc(); }

inline bool isFinite(float f) {
  return (duck_fp9_f32_bits(f) & 0x7F800000u) != 0x7F800000u;
}

/* --------------------------------------------------------------------------
 * Weight image validation and slot attach (core 0 only).
 * ------------------------------------------------------------------------ */

/// Validates the image header; returns its address or null.
const duck_image_header *imageHeader(const duck_info *info, Log &log) {
  if (!info->weights || info->weights_size < DUCK_IMAGE_HEADER_BYTES) {
    log << "weights: no weight image (buffer " << info->weights_size
        << " bytes)";
    log.end();
    return nullptr;
  }
  const auto *h = reinterpret_cast<const duck_image_header *>(info->weights);
  if (h->magic != DUCK_IMAGE_MAGIC ||
      !duck_image_format_known(h->format_version) ||
      h->abi_version != DUCK_ABI_VERSION ||
      h->fp9_version != DUCK_FP9_FORMAT_VERSION) {
    log << "weights: bad image header (magic/version)";
    log.end();
    return nullptr;
  }
  const uint64_t tableEnd =
      h->slot_table_offset + (uint64_t)h->slot_count * sizeof(duck_slot_entry);
  if (h->total_bytes > info->weights_size || h->slot_count > (1u << 20) ||
      h->slot_table_offset < sizeof(duck_image_header) ||
      h->slot_table_offset % 8 != 0 || tableEnd > h->total_bytes ||
      h->hidden == 0 || h->hidden > DUCK_STEP_MAX_DIM) {
    log << "weights: image header out of bounds (total " << h->total_bytes
        << ", buffer " << info->weights_size << ")";
    log.end();
    return nullptr;
  }
  return h;
}

/// Checks one packed matrix reference of a present expert.
bool checkMatrix(const duck_matrix_ref &ref, uint32_t rows, uint32_t k,
                 uint32_t block, uint64_t tableEnd, uint64_t slotBytes,
                 const char *what, uint32_t expert, Log &log) {
  duck_fp9_layout l;
  const duck_fp9_desc &d = ref.desc;
  if (d.rows != rows || d.k != k || d.block != block) {
    log << "weights: expert " << expert << " " << what << " shape "
        << d.rows << "x" << d.k << "/" << d.block << ", want " << rows << "x"
        << k << "/" << block;
    log.end();
    return false;
  }
  if (duck_fp9_compute_layout(&d, &l) != DUCK_FP9_OK) {
    log << "weights: expert " << expert << " " << what << " bad descriptor";
    log.end();
    return false;
  }
  if (ref.offset % DUCK_FP9_PLANE_ALIGN != 0 || ref.offset < tableEnd ||
      ref.offset > slotBytes || l.total_bytes > slotBytes - ref.offset) {
    log << "weights: expert " << expert << " " << what << " offset "
        << ref.offset << " (+" << l.total_bytes << ") outside slot of "
        << slotBytes << " bytes";
    log.end();
    return false;
  }
  if (ref.kernel >= DUCK_KERNEL_COUNT ||
      ref.kernel != (uint32_t)duck_select_kernel(d.k, d.block)) {
    log << "weights: expert " << expert << " " << what << " kernel id "
        << ref.kernel << " does not match its shape";
    log.end();
    return false;
  }
  return true;
}

/// Cache key check: the entry is valid for this buffer, generation and
/// slot table row.
bool keyMatches(const CachedSlot &c, uint32_t slot, const duck_info *info,
                const duck_slot_entry &e) {
  return c.valid && c.slot == slot &&
         c.weights_addr == (uint64_t)(uintptr_t)info->weights &&
         c.weights_size == info->weights_size && info->weights_generation &&
         c.generation == info->weights_generation &&
         c.entry.offset == e.offset && c.entry.bytes == e.bytes &&
         c.entry.checksum == e.checksum && c.entry.layer == e.layer &&
         c.entry.kind == e.kind;
}

/// The slot's table row lies in the image, after the slot table, and has
/// room for a slot header.
bool slotEntryInImage(const duck_image_header *h, uint32_t slot,
                      const duck_slot_entry &e, Log &log) {
  const uint64_t tableEnd =
      h->slot_table_offset + (uint64_t)h->slot_count * sizeof(duck_slot_entry);
  if (e.offset % DUCK_IMAGE_ALIGN != 0 || e.offset < tableEnd ||
      e.offset > h->total_bytes || e.bytes > h->total_bytes - e.offset ||
      e.bytes < sizeof(duck_slot_header)) {
    log << "weights: slot " << slot << " at " << e.offset << " (+" << e.bytes
        << ") outside the image of " << h->total_bytes << " bytes";
    log.end();
    return false;
  }
  return true;
}

/// The slot header matches its table row, is of the mode's kind (else
/// BAD_INPUT in `out_status`), has a shape the kernels take, and its
/// descriptor table fits the slot.
bool checkSlotHeader(const duck_image_header *h, uint32_t slot,
                     const duck_slot_entry &e, const duck_slot_header *sh,
                     int want_kind, Log &log, int32_t *out_status) {
  // A head slot's K is its own (an o_proj's is heads x v_head_dim); every
  // FFN slot's is the model's hidden size.
  if (sh->magic != DUCK_SLOT_MAGIC || sh->kind != e.kind ||
      sh->kind > DUCK_SLOT_HEAD || sh->layer != e.layer ||
      (sh->kind == DUCK_SLOT_HEAD
           ? sh->hidden == 0 || sh->hidden > DUCK_STEP_MAX_DIM
           : sh->hidden != h->hidden)) {
    log << "weights: slot " << slot << " header does not match its table row";
    log.end();
    return false;
  }
  if (want_kind >= 0 && sh->kind != (uint32_t)want_kind) {
    *out_status = DUCK_STATUS_BAD_INPUT;
    log << "ib: slot " << slot << " is not of the mode's kind";
    log.end();
    return false;
  }
  if ((sh->block != 32 && sh->block != 64 && sh->block != 128) ||
      sh->inter == 0 || sh->inter > DUCK_STEP_MAX_DIM || sh->n_experts == 0 ||
      sh->n_experts > DUCK_STEP_MAX_EXPERTS ||
      (sh->kind == DUCK_SLOT_DENSE && sh->n_experts != 1) ||
      (sh->kind == DUCK_SLOT_HEAD ? sh->ob_begin >= sh->inter
                                  : sh->ob_begin != 0)) {
    log << "weights: slot " << slot << " bad shape (inter " << sh->inter
        << ", experts " << sh->n_experts << ", block " << sh->block << ")";
    log.end();
    return false;
  }
  const uint64_t descEnd = sizeof(duck_slot_header) +
                           (uint64_t)sh->n_experts * sizeof(duck_ffn_desc);
  if (descEnd > e.bytes) {
    log << "weights: slot " << slot << " descriptor table exceeds the slot";
    log.end();
    return false;
  }
  return true;
}

/// The K a head piece reads: floats [offset, offset + k) of x (within the
/// slot's K) or of the rows earlier pieces produced (below `row0`).
bool headInputFits(const duck_ffn_desc &d, const duck_slot_header *sh,
                   uint64_t row0) {
  const uint64_t off = d.input & DUCK_HEAD_INPUT_OFFSET_MASK, k = d.gate.desc.k;
  return (d.input & DUCK_HEAD_INPUT_RESULTS) ? off + k <= row0
                                             : off + k <= sh->hidden;
}

/// A head slot's piece: a matrix [rows_x, k] in the descriptor's `gate`
/// (up and down stay empty) over its input (headInputFits); the pieces'
/// rows, summed in `headRows`, concatenate to the slot's `inter`.
bool headView(const duck_ffn_desc &d, const duck_slot_header *sh,
              const uint8_t *base, uint64_t descEnd, uint64_t slotBytes,
              uint32_t slot, uint32_t x, uint64_t &headRows,
              duck_ffn_weights &w, Log &log) {
  const duck_matrix_ref none{};
  if (__builtin_memcmp(&d.up, &none, sizeof none) != 0 ||
      __builtin_memcmp(&d.down, &none, sizeof none) != 0) {
    log << "weights: head slot " << slot << " has an up or down matrix";
    log.end();
    return false;
  }
  if (d.gate.desc.k == 0 || !headInputFits(d, sh, headRows)) {
    log << "weights: head slot " << slot << " matrix " << x
        << " reads outside its input";
    log.end();
    return false;
  }
  headRows += d.gate.desc.rows;
  if (d.gate.desc.rows == 0 || headRows > sh->inter ||
      !checkMatrix(d.gate, d.gate.desc.rows, d.gate.desc.k, sh->block, descEnd,
                   slotBytes, "head", x, log)) {
    if (d.gate.desc.rows == 0 || headRows > sh->inter) {
      log << "weights: head slot " << slot << " matrix " << x
          << " has no rows or exceeds the slot's " << sh->inter;
      log.end();
    }
    return false;
  }
  w = duck_ffn_weights{};
  w.gate = duck_fp9_matrix_view(&d.gate.desc, base + d.gate.offset);
  return true;
}

/// Checks every descriptor of a slot and writes its views: an FFN expert's
/// gate, up and down; a head slot's pieces; a missing expert's shape only.
bool buildViews(const duck_slot_header *sh, const uint8_t *base,
                uint64_t slotBytes, uint32_t slot, duck_ffn_weights *views,
                Log &log) {
  const uint64_t descEnd = sizeof(duck_slot_header) +
                           (uint64_t)sh->n_experts * sizeof(duck_ffn_desc);
  const auto *descs = reinterpret_cast<const duck_ffn_desc *>(sh + 1);
  const uint32_t hidden = sh->hidden, inter = sh->inter, block = sh->block;
  uint64_t headRows = 0; // a head slot's matrices' rows, concatenated
  for (uint32_t x = 0; x < sh->n_experts; ++x) {
    const duck_ffn_desc &d = descs[x];
    duck_ffn_weights &w = views[x];
    if (d.present > 1 || (sh->kind != DUCK_SLOT_MOE && d.present != 1) ||
        (sh->kind != DUCK_SLOT_HEAD && d.input != 0)) {
      log << "weights: slot " << slot << " expert " << x
          << " bad present flag or input";
      log.end();
      return false;
    }
    if (!d.present) {
      // Shape only: the kernels read rows/k of experts[0]; a slot naming a
      // missing expert is remapped before any kernel runs.
      w = duck_ffn_weights{};
      w.gate.rows = w.up.rows = inter;
      w.gate.k = w.up.k = hidden;
      w.down.rows = hidden;
      w.down.k = inter;
      continue;
    }
    if (sh->kind == DUCK_SLOT_HEAD) {
      if (!headView(d, sh, base, descEnd, slotBytes, slot, x, headRows, w,
                    log))
        return false;
      continue;
    }
    if (!checkMatrix(d.gate, inter, hidden, block, descEnd, slotBytes, "gate",
                     x, log) ||
        !checkMatrix(d.up, inter, hidden, block, descEnd, slotBytes, "up", x,
                     log) ||
        !checkMatrix(d.down, hidden, inter, block, descEnd, slotBytes, "down",
                     x, log))
      return false;
    w.gate = duck_fp9_matrix_view(&d.gate.desc, base + d.gate.offset);
    w.up = duck_fp9_matrix_view(&d.up.desc, base + d.up.offset);
    w.down = duck_fp9_matrix_view(&d.down.desc, base + d.down.offset);
  }
  if (sh->kind == DUCK_SLOT_HEAD && headRows != inter) {
    log << "weights: head slot " << slot << " matrices hold " << headRows
        << " rows, the header " << inter;
    log.end();
    return false;
  }
  return true;
}

/// Whether a head slot's pieces read its own results (then they run in
/// stages and the results live in scratch).
bool headChained(const duck_slot_header *sh) {
  const auto *descs = reinterpret_cast<const duck_ffn_desc *>(sh + 1);
  for (uint32_t x = 0; x < sh->n_experts; ++x)
    if (descs[x].input & DUCK_HEAD_INPUT_RESULTS)
      return true;
  return false;
}

/// Validates slot `slot` and returns its cached views (attaching it when
/// the cache has no valid entry). `want_kind` < 0 accepts either kind.
const CachedSlot *attachSlot(const duck_info *info, uint32_t slot,
                             int want_kind, bool use_cache, Log &log,
                             int32_t *out_status) {
  *out_status = DUCK_STATUS_BAD_WEIGHTS;
  const duck_image_header *h = imageHeader(info, log);
  if (!h)
    return nullptr;
  if (slot >= h->slot_count) {
    *out_status = DUCK_STATUS_BAD_INPUT;
    log << "ib: slot " << slot << " >= slot count " << h->slot_count;
    log.end();
    return nullptr;
  }
  const duck_slot_entry e = reinterpret_cast<const duck_slot_entry *>(
      info->weights + h->slot_table_offset)[slot];
  CachedSlot &c = g_state.cache[slot % kCacheEntries];
  if (use_cache && keyMatches(c, slot, info, e)) {
    if (want_kind >= 0 && c.kind != (uint32_t)want_kind) {
      *out_status = DUCK_STATUS_BAD_INPUT;
      log << "ib: slot " << slot << " is not of the mode's kind";
      log.end();
      return nullptr;
    }
    *out_status = DUCK_STATUS_OK;
    return &c;
  }
  c.valid = 0;

  if (!slotEntryInImage(h, slot, e, log))
    return nullptr;
  const uint8_t *base = info->weights + e.offset;
  const auto *sh = reinterpret_cast<const duck_slot_header *>(base);
  if (!checkSlotHeader(h, slot, e, sh, want_kind, log, out_status))
    return nullptr;
  if (g_state.views_used + sh->n_experts > kViewPool) {
    // Pool exhausted: drop every cached slot (they re-attach on use).
    for (uint32_t i = 0; i < kCacheEntries; ++i)
      g_state.cache[i].valid = 0;
    g_state.views_used = 0;
  }
  if (!buildViews(sh, base, e.bytes, slot, g_state.views + g_state.views_used,
                  log))
    return nullptr;
  c.slot = slot;
  c.weights_addr = (uint64_t)(uintptr_t)info->weights;
  c.weights_size = info->weights_size;
  c.generation = info->weights_generation;
  c.entry = e;
  c.kind = sh->kind;
  c.hidden = sh->hidden;
  c.inter = sh->inter;
  c.n_experts = sh->n_experts;
  c.view_base = g_state.views_used;
  c.ob_begin = sh->ob_begin;
  c.chained = sh->kind == DUCK_SLOT_HEAD && (sh->ob_begin || headChained(sh));
  g_state.views_used += sh->n_experts;
  c.valid = 1;
  *out_status = DUCK_STATUS_OK;
  return &c;
}

/* --------------------------------------------------------------------------
 * Step
 * ------------------------------------------------------------------------ */

void writeOb(duck_info *info, int32_t status, uint32_t n_tokens,
             uint32_t hidden, uint64_t out_bytes) {
  if (!info->ob || info->ob_limit < sizeof(duck_ob_header)) {
    info->ob_size = 0;
    return;
  }
  auto *oh = reinterpret_cast<duck_ob_header *>(info->ob);
  *oh = duck_ob_header{};
  oh->magic = DUCK_OB_MAGIC;
  oh->status = (uint32_t)status;
  oh->n_tokens = status == DUCK_STATUS_OK ? n_tokens : 0;
  oh->hidden = hidden;
  oh->out_offset = sizeof(duck_ob_header);
  info->ob_size =
      sizeof(duck_ob_header) + (status == DUCK_STATUS_OK ? out_bytes : 0);
}

bool isMoeMode(uint32_t mode) {
  return mode == DUCK_MODE_MOE_DECODE || mode == DUCK_MODE_MOE_DECODE_SMP ||
         mode == DUCK_MODE_MOE_PREFILL;
}

/// The IB header's step: tokens in range, top_k as the mode needs, no
/// unknown flags.
int32_t checkIbHeader(const duck_ib_header &ih, bool moe, Log &log) {
  if (ih.n_tokens == 0 || ih.n_tokens > DUCK_STEP_MAX_TOKENS) {
    log << "ib: n_tokens " << ih.n_tokens << " outside [1, "
        << (uint32_t)DUCK_STEP_MAX_TOKENS << "]";
    log.end();
    return DUCK_STATUS_BAD_INPUT;
  }
  if (moe ? (ih.top_k == 0 || ih.top_k > DUCK_STEP_MAX_TOP_K) : ih.top_k != 0) {
    log << "ib: top_k " << ih.top_k << " invalid for mode " << ih.mode;
    log.end();
    return DUCK_STATUS_BAD_INPUT;
  }
  if ((ih.flags & ~(uint32_t)(DUCK_IB_X_BF16 | DUCK_IB_OUT_BF16 | DUCK_IB_X_Q8 |
                              DUCK_IB_OUT_Q8)) ||
      (ih.flags & DUCK_IB_X_BF16 && ih.flags & DUCK_IB_X_Q8) ||
      (ih.flags & DUCK_IB_OUT_BF16 && ih.flags & DUCK_IB_OUT_Q8)) {
    log << "ib: unknown or conflicting flags " << ih.flags;
    log.end();
    return DUCK_STATUS_BAD_INPUT;
  }
  return DUCK_STATUS_OK;
}

/// Points the job at x in the IB (after the expert slots, aligned, inside
/// the IB) and at its output in the OB (which must hold it).
int32_t placeInOut(duck_info *info, const duck_ib_header &ih, Job &j,
                   Log &log) {
  const uint64_t nSlots = (uint64_t)ih.n_tokens * ih.top_k;
  const uint64_t slotsEnd = sizeof(duck_ib_header) + nSlots * 8;
  const uint64_t xBytes =
      (uint64_t)ih.n_tokens * duck_x_row_bytes(j.hidden, ih.flags);
  if (ih.x_offset % 32 != 0 || ih.x_offset < slotsEnd ||
      ih.x_offset > info->ib_size || xBytes > info->ib_size - ih.x_offset) {
    log << "ib: x at " << ih.x_offset << " (+" << xBytes
        << ") overlaps the slots, is unaligned or exceeds the IB of "
        << info->ib_size << " bytes";
    log.end();
    return DUCK_STATUS_BAD_INPUT;
  }
  j.x = reinterpret_cast<const float *>(info->ib + ih.x_offset);
  const uint64_t outBytes = (uint64_t)ih.n_tokens * j.out_width * 4;
  if (info->ob_limit < sizeof(duck_ob_header) + outBytes) {
    log << "ob: " << info->ob_limit << " bytes, need "
        << (uint64_t)(sizeof(duck_ob_header) + outBytes);
    log.end();
    return DUCK_STATUS_OB_TOO_SMALL;
  }
  j.out = reinterpret_cast<float *>(info->ob + sizeof(duck_ob_header));
  return DUCK_STATUS_OK;
}

/// Copies the IB's expert slots into scratch: ids beyond the slot are
/// refused, experts this duck does not hold become the "contributes
/// nothing" id.
int32_t copyExpertSlots(const duck_info *info, const CachedSlot *c,
                        uint64_t nSlots, Job &j, Log &log) {
  const auto *in = reinterpret_cast<const duck_expert_slot *>(
      info->ib + sizeof(duck_ib_header));
  auto *out =
      reinterpret_cast<duck_expert_slot *>(j.scratch + j.layout.slots_offset);
  const auto *sh = reinterpret_cast<const duck_slot_header *>(
      info->weights + c->entry.offset);
  const auto *descs = reinterpret_cast<const duck_ffn_desc *>(sh + 1);
  for (uint64_t i = 0; i < nSlots; ++i) {
    duck_expert_slot s = in[i];
    if (s.expert >= j.n_experts || !isFinite(s.weight)) {
      log << "ib: slot " << i << " names expert " << s.expert << " of "
          << j.n_experts << " or has a non-finite weight";
      log.end();
      return DUCK_STATUS_BAD_INPUT;
    }
    if (!descs[s.expert].present)
      s.expert = j.n_experts;
    out[i] = s;
  }
  return DUCK_STATUS_OK;
}

/// bf16 or q8 x widened once into scratch: every kernel then reads fp32 x
/// as from an fp32 IB (the same bits as an fp32 IB of the decoded values).
void widenX(const duck_ib_header &ih, Job &j) {
  float *x = reinterpret_cast<float *>(j.scratch + j.layout.x_offset);
  if (ih.flags & DUCK_IB_X_Q8) {
    const auto *in = reinterpret_cast<const uint8_t *>(j.x);
    const uint64_t row = duck_q8_row_bytes(j.hidden);
    for (uint64_t t = 0; t < ih.n_tokens; ++t)
      duck_q8_decode_row(in + t * row, j.hidden, x + t * j.hidden);
  } else {
    const auto *in = reinterpret_cast<const uint16_t *>(j.x);
    for (uint64_t i = 0; i < (uint64_t)ih.n_tokens * j.hidden; ++i)
      x[i] = duck_bf16_to_f32(in[i]);
  }
  j.x = x;
}

/// The results narrowed in place, front to back, as the IB asked
/// (DUCK_IB_OUT_BF16 or DUCK_IB_OUT_Q8): a row's bytes land at or below
/// the floats they were read from (bytes moved as bytes: no aliasing).
/// Returns the OB's bytes of results.
uint64_t narrowOut(const Job &j, uint64_t rows, uint64_t width) {
  return duck_narrow_out(j.out, rows, width, j.out_flags);
}

/// Core 0: validates everything the call reads and fills g_state.job.
int32_t planJob(duck_info *info, const duck_ib_header &ih, uint32_t cores,
                bool use_cache, Log &log) {
  Job &j = g_state.job;
  const uint64_t seq = j.seq;
  j = Job{};
  j.seq = seq;
  j.mode = ih.mode;
  j.cores = cores;
  const bool prepare = ih.mode == DUCK_MODE_DENSE_PREPARE ||
                       ih.mode == DUCK_MODE_MOE_PREPARE;
  const bool moe = isMoeMode(ih.mode) || ih.mode == DUCK_MODE_MOE_PREPARE;
  const bool head = ih.mode == DUCK_MODE_HEAD;
  int32_t st;
  const CachedSlot *c = attachSlot(
      info, ih.slot,
      head ? DUCK_SLOT_HEAD : moe ? DUCK_SLOT_MOE : DUCK_SLOT_DENSE,
      use_cache && !prepare, log, &st);
  if (!c)
    return st;
  j.hidden = c->hidden;
  j.inter = c->inter;
  j.n_experts = c->n_experts;
  j.out_width = head ? c->inter - c->ob_begin : c->hidden;
  j.ob_begin = c->ob_begin;
  j.chained = c->chained;
  j.descs = reinterpret_cast<const duck_ffn_desc *>(
      info->weights + c->entry.offset + sizeof(duck_slot_header));
  j.experts = g_state.views + c->view_base;
  if (prepare)
    return DUCK_STATUS_OK;

  if ((st = checkIbHeader(ih, moe, log)) != DUCK_STATUS_OK)
    return st;
  j.out_flags = ih.flags & (DUCK_IB_OUT_BF16 | DUCK_IB_OUT_Q8);
  j.n_tokens = ih.n_tokens;
  j.top_k = ih.top_k;
  if ((st = placeInOut(info, ih, j, log)) != DUCK_STATUS_OK)
    return st;

  // A head needs only the per-core GEMM scratch (2 x tokens x hidden),
  // and a chained one its results ([tokens][inter], `shared`).
  if (!duck_step_layout_of(j.hidden, head && !j.chained ? 0 : j.inter,
                           j.n_tokens, j.top_k, j.n_experts, cores,
                           &j.layout) ||
      !info->scratch || info->scratch_size < j.layout.total_bytes ||
      (uintptr_t)info->scratch % DUCK_STEP_SCRATCH_ALIGN != 0) {
    log << "scratch: " << info->scratch_size << " bytes, need "
        << j.layout.total_bytes << " (64-byte aligned)";
    log.end();
    return DUCK_STATUS_SCRATCH_TOO_SMALL;
  }
  j.scratch = info->scratch;
  if (ih.flags & (DUCK_IB_X_BF16 | DUCK_IB_X_Q8))
    widenX(ih, j);
  if (moe)
    return copyExpertSlots(info, c, (uint64_t)ih.n_tokens * ih.top_k, j, log);
  return DUCK_STATUS_OK;
}

/// Rows [b, e) of a head slot's pieces [x0, x1) (whose first row is
/// `row0`) into `res` ([tokens][inter]); every row's result is its
/// duck_gemv's (duck_gemm's for several tokens).
void runHeadRows(const Job &j, uint32_t x0, uint32_t x1, uint32_t row0,
                 uint32_t b, uint32_t e, float *res, float *coreScratch) {
  for (uint32_t x = x0; x < x1 && b < e; ++x) {
    const duck_fp9_matrix &m = j.experts[x].gate;
    const uint32_t lo = b > row0 ? b - row0 : 0;
    const uint32_t hi = e - row0 < m.rows ? e - row0 : m.rows;
    if (e > row0 && lo < hi) {
      const uint32_t in = j.descs[x].input;
      const bool fromRes = (in & DUCK_HEAD_INPUT_RESULTS) != 0;
      const float *src =
          (fromRes ? res : j.x) + (in & DUCK_HEAD_INPUT_OFFSET_MASK);
      float *out = res + row0 + lo;
      if (j.n_tokens == 1)
        duck_gemv(&m, src, out, lo, hi, coreScratch, DUCK_DECODE_SHIFT);
      else
        duck_gemm(&m, src, fromRes ? j.inter : j.hidden, j.n_tokens, out,
                  j.inter, lo, hi, coreScratch);
    }
    row0 += m.rows;
  }
}

/// DUCK_MODE_HEAD: the slot's rows (its pieces' rows, concatenated) split
/// over the cores. A chained slot runs in stages: a piece that reads rows
/// of the current stage starts the next one, after a barrier; its results
/// live in `shared` and the OB gets rows [ob_begin, inter).
void runHead(const Job &j, uint32_t core, duck_smp_ctx *smp, float *coreScratch,
             float *shared) {
  float *res = j.chained ? shared : j.out;
  uint32_t x0 = 0, row0 = 0; // the stage's first piece and row
  while (x0 < j.n_experts) {
    uint32_t x1 = x0 + 1, row1 = row0 + j.experts[x0].gate.rows;
    for (; x1 < j.n_experts; ++x1) {
      const uint32_t in = j.descs[x1].input;
      if ((in & DUCK_HEAD_INPUT_RESULTS) &&
          (in & DUCK_HEAD_INPUT_OFFSET_MASK) + j.experts[x1].gate.k > row0)
        break;
      row1 += j.experts[x1].gate.rows;
    }
    uint32_t b, e;
    duck_smp_split(row1 - row0, j.cores, core, &b, &e);
    runHeadRows(j, x0, x1, row0, row0 + b, row0 + e, res, coreScratch);
    duck_smp_sync(smp);
    x0 = x1;
    row0 = row1;
  }
  if (!j.chained)
    return;
  const uint64_t w = j.out_width;
  uint32_t b, e;
  duck_smp_split(j.n_tokens, j.cores, core, &b, &e);
  for (uint32_t t = b; t < e; ++t)
    for (uint64_t i = 0; i < w; ++i)
      j.out[t * w + i] = shared[(uint64_t)t * j.inter + j.ob_begin + i];
  duck_smp_sync(smp);
}

/// The kernel part of a call, run by every participating core.
void runJob(const Job &j, uint32_t core) {
  duck_smp_ctx smp{j.cores, &g_state.barrier};
  const duck_step_layout &l = j.layout;
  float *coreScratch =
      reinterpret_cast<float *>(j.scratch + (uint64_t)core * l.core_bytes);
  float *shared = reinterpret_cast<float *>(j.scratch + l.shared_offset);
  float *pairs = reinterpret_cast<float *>(j.scratch + l.pairs_offset);
  auto *slots =
      reinterpret_cast<duck_expert_slot *>(j.scratch + l.slots_offset);
  uint32_t *work = reinterpret_cast<uint32_t *>(j.scratch + l.work_offset);
  const uint64_t h = j.hidden;
  switch (j.mode) {
  case DUCK_MODE_DENSE_DECODE:
    for (uint32_t t = 0; t < j.n_tokens; ++t)
      duck_mlp_decode(&smp, core, &j.experts[0], j.x + t * h, j.out + t * h,
                      shared, coreScratch);
    break;
  case DUCK_MODE_MOE_DECODE:
  case DUCK_MODE_MOE_DECODE_SMP:
    // One slot a token (a staged step's shared expert): its rows over
    // every core rather than the slot on one.
    for (uint32_t t = 0; t < j.n_tokens && j.top_k == 1 && j.cores > 1; ++t)
      duck_moe_decode_one(&smp, core, j.experts, j.n_experts, slots + t,
                          j.x + t * h, j.out + t * h, shared, coreScratch);
    for (uint32_t t = 0; t < j.n_tokens && (j.top_k != 1 || j.cores == 1); ++t)
      duck_moe_decode(&smp, core, j.experts, j.n_experts,
                      slots + (uint64_t)t * j.top_k, j.top_k, j.x + t * h,
                      j.out + t * h, pairs, coreScratch);
    break;
  case DUCK_MODE_DENSE_PREFILL:
    duck_mlp_prefill(&smp, core, &j.experts[0], j.x, j.n_tokens, j.out, shared,
                     coreScratch);
    break;
  case DUCK_MODE_MOE_PREFILL:
    duck_moe_prefill(&smp, core, j.experts, j.n_experts, slots, j.top_k, j.x,
                     j.n_tokens, j.out, pairs, work, coreScratch);
    break;
  case DUCK_MODE_HEAD:
    runHead(j, core, &smp, coreScratch, shared);
    break;
  default:
    break;
  }
}

#ifdef DUCK_ELF_TEST_HOOKS
/// Test-only modes (the test ELF): deliberate faults and stale state.
enum {
  kModeTestCrash = 100, // the last core faults after the job is published
  kModeTestHang = 101,  // core 0 never returns
  kModeTestScribble = 102, // leaves barrier, board and cache mid-state
  kModeTestOpen = 103,     // core 0 opens a file (raw openat)
  kModeTestSocket = 104,   // core 0 opens a socket
  kModeTestFork = 105,     // core 0 forks
};

/// A raw system call: what hostile code would do (duckd's sandbox must
/// stop it).
long rawSyscall(long nr, long a, long b, long c) {
  long ret;
  asm volatile("syscall"
               : "=a"(ret)
               : "a"(nr), "D"(a), "S"(b), "d"(c)
               : "rcx", "r11", "memory");
  return ret;
}

int testMode(duck_info *info, uint32_t mode) {
  const uint32_t core = info->smp_cpu_index, cores = info->smp_cpu_count;
  if (mode >= kModeTestOpen) {
    if (core != 0)
      return DUCK_STATUS_OK;
    static const char path[] = "/etc/hostname";
    long r = 0;
    if (mode == kModeTestOpen)
      r = rawSyscall(257 /* openat */, -100 /* AT_FDCWD */, (long)path, 0);
    else if (mode == kModeTestSocket)
      r = rawSyscall(41 /* socket */, 2 /* AF_INET */, 1 /* STREAM */, 0);
    else if (mode == kModeTestFork) {
      r = rawSyscall(57 /* fork */, 0, 0, 0);
      if (r == 0)
        rawSyscall(60 /* exit */, 0, 0, 0); // the child, if it ran
    }
    // Reached only without a sandbox: say what the call gave.
    return r >= 0 ? DUCK_STATUS_OK : DUCK_STATUS_BAD_MODE;
  }
  if (mode == kModeTestCrash) {
    if (core == cores - 1) {
      volatile uintptr_t bad = 16; // a store to the zero page: SIGSEGV
      *reinterpret_cast<volatile uint32_t *>(bad) = 1;
    }
    uint32_t spins = 0;
    for (;;) // the others wait for a step that never ends
      duck_spin_pause(info->yield, &spins);
  }
  if (mode == kModeTestHang) {
    if (core != 0)
      return DUCK_STATUS_OK;
    uint32_t spins = 0;
    for (;;)
      duck_spin_pause(info->yield, &spins);
  }
  if (core == 0) { // kModeTestScribble
    g_state.barrier.count = cores > 1 ? cores - 1 : 7;
    g_state.barrier.generation = 0xdeadbeefu;
    g_state.barrier.n = 3;
    __atomic_store_n(&g_state.board.word,
                     duck_job_word(DUCK_PHASE_ACTIVE, info->step_seq),
                     __ATOMIC_RELEASE);
    g_state.board.job = &g_state.views[0];
    g_state.job.status = DUCK_STATUS_OK;
    g_state.job.mode = DUCK_MODE_DENSE_PREFILL;
    g_state.job.n_tokens = 0xFFFF;
    for (uint32_t i = 0; i < kCacheEntries; ++i) {
      g_state.cache[i].generation ^= 0x5555;
      g_state.cache[i].entry.checksum ^= 1;
    }
    writeOb(info, DUCK_STATUS_OK, 0, 0, 0);
  }
  return DUCK_STATUS_OK;
}
#endif

/// Every core reads the same IB header and takes the same early exits, so
/// no core can wait for a job core 0 never publishes: the header into
/// `ih`, or BAD_INPUT (core 0 logs why and writes the OB).
int32_t readIbHeader(duck_info *info, uint32_t core, duck_ib_header &ih,
                     Log &log) {
  if (!info->ib || info->ib_size < sizeof(duck_ib_header)) {
    if (core == 0) {
      log << "ib: " << info->ib_size << " bytes, need a header";
      log.end();
      writeOb(info, DUCK_STATUS_BAD_INPUT, 0, 0, 0);
    }
    return DUCK_STATUS_BAD_INPUT;
  }
  __builtin_memcpy(&ih, info->ib, sizeof ih);
  if (ih.magic != DUCK_IB_MAGIC || ih.abi_version != DUCK_ABI_VERSION) {
    if (core == 0) {
      log << "ib: bad magic or abi version " << ih.abi_version;
      log.end();
      writeOb(info, DUCK_STATUS_BAD_INPUT, 0, 0, 0);
    }
    return DUCK_STATUS_BAD_INPUT;
  }
  return DUCK_STATUS_OK;
}

/// A secondary core: waits for core 0's job for this call and runs its
/// share, or acknowledges a refused job at the barrier.
int32_t secondaryStep(duck_info *info, uint32_t core) {
  const void *p = duck_job_wait(&g_state.board, info->step_seq);
  if (!p) // missed the call (cannot happen under duckd): leave quietly
    return DUCK_STATUS_OK;
  const Job &j = *static_cast<const Job *>(p);
  const int32_t status = j.status;
  if (status != DUCK_STATUS_OK) {
    // Tell core 0 the job was seen before it retires the board.
    duck_barrier_wait(&g_state.barrier);
    return status;
  }
  runJob(j, core); // ends with a barrier every worker passes
  return DUCK_STATUS_OK;
}

/// Core 0: defines the call's shared state, publishes it to the `workers`
/// cores, runs its share, retires the board and writes the OB.
int32_t leadStep(duck_info *info, const duck_ib_header &ih, uint32_t workers,
                 bool persistent, Log &log) {
  Job &j = g_state.job;
  j.seq = info->step_seq;
  j.status = planJob(info, ih, workers, persistent, log);
  if (workers > 1) {
    duck_barrier_init(&g_state.barrier, workers);
    g_state.barrier.yield = info->yield;
    duck_job_publish(&g_state.board, &j, info->step_seq);
  }
  if (j.status == DUCK_STATUS_OK)
    runJob(j, 0);
  else if (workers > 1)
    duck_barrier_wait(&g_state.barrier);
  if (workers > 1)
    duck_job_retire(&g_state.board, info->step_seq);
  const bool prepare = ih.mode == DUCK_MODE_DENSE_PREPARE ||
                       ih.mode == DUCK_MODE_MOE_PREPARE;
  const uint64_t rows = prepare ? 0 : j.n_tokens;
  const uint64_t bytes = j.status == DUCK_STATUS_OK
                             ? narrowOut(j, rows, j.out_width)
                             : rows * j.out_width * 4;
  writeOb(info, j.status, prepare ? 0 : j.n_tokens,
          j.out_width ? j.out_width : j.hidden, bytes);
  return j.status;
}

int step(duck_info *info, bool persistent) {
  const uint64_t t0 = rdtsc();
  if (!info || info->abi_version != DUCK_ABI_VERSION ||
      info->info_size < sizeof(duck_info))
    return DUCK_STATUS_BAD_ABI;
  const uint32_t core = info->smp_cpu_index, cores = info->smp_cpu_count;
  info->log_size = 0;
  if (info->log && info->log_limit)
    info->log[0] = 0;
  if (core == 0)
    info->ob_size = 0;
  auto finish = [&](int32_t status) {
    if (info->core_cycles && core < cores)
      info->core_cycles[core] = rdtsc() - t0;
    return (int)status;
  };
  Log log(info);
  if (cores == 0 || cores > DUCK_STEP_MAX_CORES || core >= cores) {
    if (core == 0)
      writeOb(info, DUCK_STATUS_BAD_ABI, 0, 0, 0);
    return finish(DUCK_STATUS_BAD_ABI);
  }
  ensureInit(info);

  duck_ib_header ih;
  const int32_t ibStatus = readIbHeader(info, core, ih, log);
  if (ibStatus != DUCK_STATUS_OK)
    return finish(ibStatus);
#ifdef DUCK_ELF_TEST_HOOKS
  if (ih.mode >= 100 && ih.mode <= 105)
    return finish(testMode(info, ih.mode));
#endif
  if (ih.mode >= DUCK_MODE_COUNT) {
    if (core == 0) {
      log << "ib: unknown mode " << ih.mode;
      log.end();
      writeOb(info, DUCK_STATUS_BAD_MODE, 0, 0, 0);
    }
    return finish(DUCK_STATUS_BAD_MODE);
  }
  // Single-core modes: secondaries have nothing to do.
  const bool single = ih.mode == DUCK_MODE_MOE_DECODE ||
                      ih.mode == DUCK_MODE_DENSE_PREPARE ||
                      ih.mode == DUCK_MODE_MOE_PREPARE;
  if (single && core != 0)
    return finish(DUCK_STATUS_OK);
  const uint32_t workers = single ? 1 : cores;
  if (core != 0)
    return finish(secondaryStep(info, core));
  return finish(leadStep(info, ih, workers, persistent, log));
}

} // namespace

extern "C" {

DUCK_DECLARE_ENTRY(duck_rt_step) { return step(info, true); }

/// One-shot: assumes nothing about earlier calls (never uses cached views).
DUCK_DECLARE_ENTRY(duck_rt_run) { return step(info, false); }

} // extern "C"
