// Synthetic weight images and IBs for tests and benchmarks (SyntheticImage.h).
#include "SyntheticImage.h"

#include "duck_rt/slot_layout.h"

#include "absl/strings/str_cat.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

namespace duck::duckd {
namespace {

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/// splitmix64: small, fast, deterministic.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return double(Next() >> 11) * 0x1p-53; }
};

struct Layout {
  duck_fp9_desc gate{}, up{}, down{};
  duck_fp9_layout lg{}, lu{}, ld{};
  uint64_t table_bytes = 0, up_offset = 0, down_offset = 0, expert_bytes = 0,
           total = 0;
  uint32_t experts = 0, held = 0;
  // A HEAD slot: its matrices and their offsets in the slot.
  std::vector<duck_fp9_desc> pieces;
  std::vector<uint64_t> piece_offsets;
};

/// The slot's layout: the same duck_compute_slot_layout the compiler uses.
Layout LayoutOf(const SyntheticSpec &spec, const SyntheticSlot &s) {
  Layout l;
  if (s.kind == DUCK_SLOT_HEAD) { // [rows, k] matrices, rows concatenated
    std::vector<uint32_t> rows = s.pieces;
    if (rows.empty())
      rows.push_back(s.inter);
    const std::vector<uint32_t> phase(rows.size(), 0);
    l.pieces.resize(rows.size());
    l.piece_offsets.resize(rows.size());
    (void)duck_compute_head_slot_pieces(
        (uint32_t)rows.size(), rows.data(), phase.data(),
        s.k ? s.k : spec.hidden, spec.block, 128, l.pieces.data(),
        l.piece_offsets.data(), &l.total);
    l.experts = l.held = (uint32_t)rows.size();
    l.gate = l.pieces[0];
    l.table_bytes = l.piece_offsets[0];
    return l;
  }
  l.experts = s.kind == DUCK_SLOT_DENSE ? 1 : s.experts;
  for (uint32_t e = 0; e < l.experts; ++e)
    l.held += (s.present.empty() || s.present[e]) ? 1 : 0;
  const duck_slot_shape shape{spec.hidden, s.inter, spec.block, 128, 0,
                              l.experts, l.held};
  duck_slot_layout sl{};
  (void)duck_compute_slot_layout(&shape, &sl); // shapes checked by the spec
  l.gate = sl.gate;
  l.up = sl.up;
  l.down = sl.down;
  l.lg = sl.gate_layout;
  l.lu = sl.up_layout;
  l.ld = sl.down_layout;
  l.table_bytes = sl.table_bytes;
  l.up_offset = sl.up_offset;
  l.down_offset = sl.down_offset;
  l.expert_bytes = sl.expert_bytes;
  l.total = sl.total_bytes;
  return l;
}

uint64_t PrologueBytes(size_t slots) {
  return AlignUp(DUCK_IMAGE_HEADER_BYTES + slots * sizeof(duck_slot_entry),
                 DUCK_IMAGE_ALIGN);
}

/// One matrix: packed from a random FP8 source, or valid planes directly.
absl::Status FillMatrix(const duck_fp9_desc &d, const duck_fp9_layout &l,
                        bool pack, Rng &rng, uint8_t *out) {
  if (pack) {
    std::vector<uint8_t> w(uint64_t(d.rows) * d.k);
    for (uint8_t &b : w) {
      do
        b = uint8_t(rng.Next());
      while (duck_e4m3_is_nan(b));
    }
    const uint64_t tr = (d.rows + 127) / 128, tc = (d.k + 127) / 128;
    std::vector<float> scales(tr * tc);
    for (float &s : scales)
      s = float(std::exp2(-12.0 + 8.0 * rng.Uniform()));
    duck_fp9_source src{};
    src.type = DUCK_FP9_SRC_E4M3;
    src.data = w.data();
    src.src_rows = d.rows;
    src.src_cols = d.k;
    src.scale_inv = scales.data();
    src.tile_rows = 128;
    src.tile_cols = 128;
    duck_fp9_status st = duck_fp9_pack(&src, &d, out, nullptr);
    if (st != DUCK_FP9_OK)
      return absl::InternalError(
          absl::StrCat("duck_fp9_pack: ", duck_fp9_status_str(st)));
    return absl::OkStatus();
  }
  std::memset(out, 0, l.total_bytes);
  uint8_t *mag = out + l.mag_offset;
  for (uint64_t i = 0; i < l.mag_bytes; i += 8) {
    uint64_t r = rng.Next();
    for (uint64_t j = 0; j < 8 && i + j < l.mag_bytes; ++j) {
      uint8_t c = uint8_t(r >> (8 * j));
      // Valid codes only: 0 or 0x08..0xF7, mostly mid-range values.
      mag[i + j] = c < 8 ? 0 : uint8_t(0x60 + (c % 0x80));
    }
  }
  uint8_t *sign = out + l.sign_offset;
  for (uint64_t i = 0; i < l.sign_bytes; i += 8) {
    uint64_t r = rng.Next();
    std::memcpy(sign + i, &r, std::min<uint64_t>(8, l.sign_bytes - i));
  }
  auto *scale = reinterpret_cast<float *>(out + l.scale_offset);
  for (uint64_t i = 0; i < l.scale_bytes / 4; ++i)
    scale[i] = float(std::exp2(-12.0 + 8.0 * rng.Uniform()));
  return absl::OkStatus();
}

/// Writes slot `s` (l.total bytes) into `out`.
absl::Status BuildSlot(const SyntheticSpec &spec, const SyntheticSlot &s,
                       const Layout &l, Rng &rng, uint8_t *out) {
  std::memset(out, 0, l.total);
  duck_slot_header h{};
  h.magic = DUCK_SLOT_MAGIC;
  h.kind = s.kind;
  h.layer = s.layer;
  h.hidden = s.kind == DUCK_SLOT_HEAD && s.k ? s.k : spec.hidden;
  h.inter = s.inter;
  h.n_experts = l.experts;
  h.block = spec.block;
  std::memcpy(out, &h, sizeof h);
  auto *descs = reinterpret_cast<duck_ffn_desc *>(out + sizeof h);
  uint64_t pos = l.table_bytes;
  if (s.kind == DUCK_SLOT_HEAD) { // each `gate` holds a matrix's rows
    for (size_t i = 0; i < l.pieces.size(); ++i) {
      const duck_fp9_desc &d = l.pieces[i];
      duck_fp9_layout lay;
      (void)duck_fp9_compute_layout(&d, &lay);
      descs[i].present = 1;
      descs[i].gate = {l.piece_offsets[i], d, duck_select_kernel(d.k, d.block),
                       0};
      if (absl::Status st = FillMatrix(d, lay, spec.pack, rng,
                                       out + l.piece_offsets[i]);
          !st.ok())
        return st;
    }
    return absl::OkStatus();
  }
  const uint32_t gk = duck_select_kernel(l.gate.k, l.gate.block);
  const uint32_t dk = duck_select_kernel(l.down.k, l.down.block);
  for (uint32_t e = 0; e < l.experts; ++e) {
    if (!(s.present.empty() || s.present[e]))
      continue;
    duck_ffn_desc &d = descs[e];
    d.present = 1;
    d.gate = {pos, l.gate, gk, 0};
    d.up = {pos + l.up_offset, l.up, gk, 0};
    d.down = {pos + l.down_offset, l.down, dk, 0};
    if (absl::Status st = FillMatrix(l.gate, l.lg, spec.pack, rng,
                                     out + d.gate.offset);
        !st.ok())
      return st;
    if (absl::Status st =
            FillMatrix(l.up, l.lu, spec.pack, rng, out + d.up.offset);
        !st.ok())
      return st;
    if (absl::Status st =
            FillMatrix(l.down, l.ld, spec.pack, rng, out + d.down.offset);
        !st.ok())
      return st;
    pos += l.expert_bytes;
  }
  return absl::OkStatus();
}

duck_image_header MakeHeader(const SyntheticSpec &spec, uint64_t total) {
  duck_image_header ih{};
  ih.magic = DUCK_IMAGE_MAGIC;
  ih.format_version = DUCK_IMAGE_FORMAT_VERSION;
  ih.abi_version = DUCK_ABI_VERSION;
  ih.fp9_version = DUCK_FP9_FORMAT_VERSION;
  ih.tp_size = spec.tp_size;
  ih.tp_rank = spec.tp_rank;
  ih.slot_count = uint32_t(spec.slots.size());
  Rng key(spec.seed ^ 0x6B6579ull);
  for (int i = 0; i < DUCK_MODEL_KEY_BYTES; ++i)
    ih.model_key[i] = uint8_t(key.Next());
  ih.slot_table_offset = DUCK_IMAGE_HEADER_BYTES;
  ih.total_bytes = total;
  ih.hidden = spec.hidden;
  return ih;
}

void SealHeader(duck_image_header *ih) {
  ih->header_checksum = 0;
  ih->header_checksum = XXH3_64bits(ih, sizeof *ih);
}

} // namespace

uint64_t SyntheticImageBytes(const SyntheticSpec &spec) {
  uint64_t total = PrologueBytes(spec.slots.size());
  for (const SyntheticSlot &s : spec.slots)
    total += LayoutOf(spec, s).total;
  return total;
}

absl::StatusOr<std::vector<uint8_t>>
BuildSyntheticImage(const SyntheticSpec &spec) {
  std::vector<uint8_t> img(SyntheticImageBytes(spec), 0);
  duck_image_header ih = MakeHeader(spec, img.size());
  auto *table = reinterpret_cast<duck_slot_entry *>(img.data() +
                                                    DUCK_IMAGE_HEADER_BYTES);
  uint64_t pos = PrologueBytes(spec.slots.size());
  Rng rng(spec.seed);
  for (size_t i = 0; i < spec.slots.size(); ++i) {
    const SyntheticSlot &s = spec.slots[i];
    Layout l = LayoutOf(spec, s);
    if (absl::Status st = BuildSlot(spec, s, l, rng, img.data() + pos);
        !st.ok())
      return st;
    table[i] = {pos, l.total, XXH3_64bits(img.data() + pos, l.total), s.layer,
                uint32_t(s.kind)};
    pos += l.total;
  }
  SealHeader(&ih);
  std::memcpy(img.data(), &ih, sizeof ih);
  return img;
}

absl::Status WriteSyntheticImage(const SyntheticSpec &spec,
                                 const std::string &path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    return absl::NotFoundError(absl::StrCat("cannot write ", path));
  const uint64_t prologue = PrologueBytes(spec.slots.size());
  std::vector<uint8_t> pro(prologue, 0);
  out.write(reinterpret_cast<const char *>(pro.data()), std::streamsize(prologue));
  std::vector<duck_slot_entry> table;
  uint64_t pos = prologue;
  Rng rng(spec.seed);
  std::vector<uint8_t> buf;
  for (const SyntheticSlot &s : spec.slots) {
    Layout l = LayoutOf(spec, s);
    buf.resize(l.total);
    if (absl::Status st = BuildSlot(spec, s, l, rng, buf.data()); !st.ok())
      return st;
    table.push_back({pos, l.total, XXH3_64bits(buf.data(), l.total), s.layer,
                     uint32_t(s.kind)});
    out.write(reinterpret_cast<const char *>(buf.data()), std::streamsize(l.total));
    pos += l.total;
  }
  duck_image_header ih = MakeHeader(spec, pos);
  SealHeader(&ih);
  std::memcpy(pro.data(), &ih, sizeof ih);
  std::memcpy(pro.data() + DUCK_IMAGE_HEADER_BYTES, table.data(),
              table.size() * sizeof(duck_slot_entry));
  out.seekp(0);
  out.write(reinterpret_cast<const char *>(pro.data()), std::streamsize(prologue));
  out.close();
  if (!out)
    return absl::DataLossError(absl::StrCat("write of ", path, " failed"));
  return absl::OkStatus();
}

std::vector<duck_ffn_weights> SlotViews(const uint8_t *image, uint32_t slot) {
  duck_image_header ih;
  std::memcpy(&ih, image, sizeof ih);
  duck_slot_entry e;
  std::memcpy(&e, image + ih.slot_table_offset + slot * sizeof e, sizeof e);
  const uint8_t *base = image + e.offset;
  duck_slot_header h;
  std::memcpy(&h, base, sizeof h);
  const auto *descs = reinterpret_cast<const duck_ffn_desc *>(base + sizeof h);
  std::vector<duck_ffn_weights> w(h.n_experts);
  for (uint32_t x = 0; x < h.n_experts; ++x) {
    if (!descs[x].present) {
      w[x].gate.rows = w[x].up.rows = h.inter;
      w[x].gate.k = w[x].up.k = h.hidden;
      w[x].down.rows = h.hidden;
      w[x].down.k = h.inter;
      continue;
    }
    w[x].gate = duck_fp9_matrix_view(&descs[x].gate.desc,
                                     base + descs[x].gate.offset);
    if (h.kind == DUCK_SLOT_HEAD)
      continue; // up and down are empty
    w[x].up = duck_fp9_matrix_view(&descs[x].up.desc, base + descs[x].up.offset);
    w[x].down = duck_fp9_matrix_view(&descs[x].down.desc,
                                     base + descs[x].down.offset);
  }
  return w;
}

std::vector<uint8_t> MakeIb(uint32_t mode, uint32_t slot, uint32_t n_tokens,
                            uint32_t top_k,
                            const std::vector<duck_expert_slot> &slots,
                            const std::vector<float> &x) {
  duck_ib_header h{};
  h.magic = DUCK_IB_MAGIC;
  h.abi_version = DUCK_ABI_VERSION;
  h.mode = mode;
  h.slot = slot;
  h.n_tokens = n_tokens;
  h.top_k = top_k;
  // Slots and x are copied as given (tests of the ELF's validation pass
  // ones that disagree with n_tokens); the offset rule is the ABI's.
  h.x_offset = duck_ib_x_offset(slots.size());
  std::vector<uint8_t> ib(h.x_offset + x.size() * sizeof(float), 0);
  std::memcpy(ib.data(), &h, sizeof h);
  if (!slots.empty())
    std::memcpy(ib.data() + sizeof h, slots.data(),
                slots.size() * sizeof(duck_expert_slot));
  if (!x.empty())
    std::memcpy(ib.data() + h.x_offset, x.data(), x.size() * sizeof(float));
  return ib;
}

std::vector<float> RandomX(uint32_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (float &v : x) // roughly normal: sum of uniforms
    v = float((rng.Uniform() + rng.Uniform() + rng.Uniform() - 1.5) * 2.0);
  return x;
}

std::vector<duck_expert_slot> RandomRouting(uint32_t n_tokens, uint32_t top_k,
                                            uint32_t experts, uint64_t seed) {
  Rng rng(seed);
  std::vector<duck_expert_slot> out;
  std::vector<uint32_t> ids(experts);
  for (uint32_t t = 0; t < n_tokens; ++t) {
    for (uint32_t i = 0; i < experts; ++i)
      ids[i] = i;
    for (uint32_t i = experts; i > 1; --i)
      std::swap(ids[i - 1], ids[rng.Next() % i]);
    for (uint32_t k = 0; k < top_k; ++k)
      out.push_back({ids[k % experts], float(0.05 + 0.45 * rng.Uniform())});
  }
  return out;
}

} // namespace duck::duckd
