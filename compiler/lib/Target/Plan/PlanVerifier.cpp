//===- PlanVerifier.cpp - check a plan's weight images --------------------===//
#include "duck/Target/Plan/PlanVerifier.h"

#include "duck/Import/WeightSource.h"
#include "duck/Target/Plan/PlanWriter.h"
#include "duck/plan/plan_generated.h"
#include "duck_rt/abi.h"
#include "plan_ops.h"
#include "plan_trailer.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <map>

using namespace mlir::duck;
using namespace mlir::duck::import;
namespace pl = ::duck::plan;

static llvm::Error err(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

namespace {

/// The tensors whose rows head slot `si` concatenates, as the op that runs
/// it names them (empty: no op runs it).
std::vector<const pl::TensorDef *> headSlotTensors(const pl::PlanDef &plan,
                                                   uint32_t si) {
  std::vector<const pl::TensorDef *> out;
  if (!plan.ops())
    return out;
  // An indexer that runs its layer's projections takes the MLA's tensors.
  auto mlaOf = [&](int layer) -> const pl::MlaAttentionOpDef * {
    for (const pl::OpDef *op : pl::AllOps(plan))
      if (const auto *m = op->params_as_MlaAttentionOpDef();
          m && op->layer() == layer)
        return m;
    return nullptr;
  };
  for (const pl::OpDef *op : pl::AllOps(plan)) {
    if (const pl::LmHeadOpDef *h = op->params_as_LmHeadOpDef();
        h && h->on_ducks() && h->duck_slot() == si)
      out = {h->weight()};
    if (const auto *g = op->params_as_GqaAttentionOpDef()) {
      if (g->o_proj_on_ducks() && g->o_proj_slot() == si)
        out = {g->o_proj()};
      if (g->q_proj_on_ducks() && g->q_proj_slot() == si)
        out = {g->q_proj()};
      if (g->in_proj_on_ducks() && g->in_proj_slot() == si)
        out = {g->q_proj(), g->k_proj(), g->v_proj()};
    }
    if (const auto *m = op->params_as_MlaAttentionOpDef()) {
      const pl::TensorDef *q = m->q_a_proj() ? m->q_a_proj() : m->q_proj();
      if (m->o_proj_on_ducks() && m->o_proj_slot() == si)
        out = {m->o_proj()};
      if (m->q_proj_on_ducks() && m->q_proj_slot() == si)
        out = {m->q_b_proj() ? m->q_b_proj() : m->q_proj()};
      if (m->in_proj_on_ducks() && m->in_proj_slot() == si)
        out = {q, m->kv_a_proj_with_mqa()};
    }
    if (const auto *x = op->params_as_IndexerOpDef(); x && x->on_ducks()) {
      const pl::MlaAttentionOpDef *m = mlaOf(op->layer());
      if (m && x->in_proj_slot() == si)
        out = {x->q_a_proj(), m->kv_a_proj_with_mqa(), x->wk()};
      if (m && x->q_proj_slot() == si)
        out = {m->q_b_proj(), x->wq_b()};
    }
  }
  for (const pl::TensorDef *t : out)
    if (!t)
      return {};
  return out;
}
/// Element (r, c) of a checkpoint matrix as the checkpoint itself defines
/// it, written apart from the packer (whose scale indexing it checks): an
/// FP8 byte by the E4M3 definition times the scale of the declared
/// weight_block_size tile that holds it, the last tile possibly partial.
class CheckpointMatrix {
public:
  static llvm::Expected<CheckpointMatrix> open(const Checkpoint &ckpt,
                                               llvm::StringRef name) {
    CheckpointMatrix m;
    m.w = ckpt.find(name);
    if (!m.w || m.w.info->shape.size() != 2)
      return err("tensor '" + name + "' is missing or not a matrix");
    m.cols = m.w.info->shape[1];
    if (m.w.info->dtype == DType::F8_E4M3) {
      m.fp8 = ckpt.findFp8(name);
      const auto &bs = ckpt.model().quantization.weight_block_size;
      if (!m.fp8 || bs.size() != 2)
        return err("FP8 tensor '" + name + "' has no scales or no block size");
      m.br = bs[0];
      m.bc = bs[1];
      m.tilesPerRow = (m.cols + m.bc - 1) / m.bc;
    }
    return m;
  }

  bool isFp8() const { return fp8.has_value(); }

  float at(int64_t r, int64_t c) const {
    const uint8_t *p = w.data().data();
    const int64_t i = r * cols + c;
    switch (w.info->dtype) {
    case DType::F8_E4M3: {
      uint8_t b = p[i];
      int e = (b >> 3) & 15, mant = b & 7;
      double v = e == 0 ? std::ldexp(mant / 8.0, -6)
                        : std::ldexp(1 + mant / 8.0, e - 7);
      return (float)((b & 0x80) ? -v : v) * scale((r / br) * tilesPerRow + c / bc);
    }
    case DType::BF16:
      return bitsToFloat((uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16);
    case DType::F16:
      return duck_f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    default: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    }
  }

private:
  static float bitsToFloat(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  float scale(int64_t i) const {
    const uint8_t *s = fp8->scale.data().data();
    if (fp8->scale_dtype == DType::BF16)
      return bitsToFloat((uint32_t)(s[2 * i] | s[2 * i + 1] << 8) << 16);
    float f;
    std::memcpy(&f, s + 4 * i, 4);
    return f;
  }

  TensorRef w;
  std::optional<Fp8Weight> fp8;
  int64_t br = 0, bc = 0, cols = 0, tilesPerRow = 0;
};

/// The plan file read and checked (trailer, FlatBuffer); `buf` keeps it.
llvm::Expected<const pl::PlanDef *>
readPlan(llvm::StringRef planDir, std::unique_ptr<llvm::MemoryBuffer> &buf) {
  llvm::SmallString<256> planPath(planDir);
  llvm::sys::path::append(planPath, kPlanFileName);
  auto planBuf = llvm::MemoryBuffer::getFile(planPath);
  if (!planBuf)
    return err("cannot read '" + planPath + "': " +
               planBuf.getError().message());
  buf = std::move(*planBuf);
  const uint8_t *pb = reinterpret_cast<const uint8_t *>(buf->getBufferStart());
  uint64_t planSize = 0;
  if (!duck_plan_trailer_ok(pb, buf->getBufferSize(), &planSize))
    return err("'" + planPath + "' is corrupt or not written by duckc (its "
               "checksum trailer is missing or does not match)");
  flatbuffers::Verifier fv(pb, planSize);
  if (!pl::PlanDefBufferHasIdentifier(pb) || !pl::VerifyPlanDefBuffer(fv))
    return err("'" + planPath + "' is not a valid Duck plan");
  const pl::PlanDef *plan = pl::GetPlanDef(pb);
  if (!plan->ducks())
    return err("plan has no ducks");
  return plan;
}

/// An image's size and header (magic, version, checksum, rank, tp, slot
/// count) against the plan's DuckDef; the header into `h`.
llvm::Error checkImageHeader(const pl::PlanDef &plan, const pl::DuckDef &duck,
                             const uint8_t *base, uint64_t size,
                             duck_image_header &h) {
  const unsigned rank = duck.rank();
  if (size != duck.image_bytes())
    return err(llvm::formatv("duck {0}: image is {1} bytes, plan says {2}",
                             rank, size, duck.image_bytes()));
  std::memcpy(&h, base, sizeof h);
  uint64_t want = h.header_checksum;
  h.header_checksum = 0;
  if (h.magic != DUCK_IMAGE_MAGIC || !duck_image_format_known(h.format_version))
    return err(llvm::formatv("duck {0}: image header has a bad magic or "
                             "format version",
                             rank));
  if (XXH3_64bits(&h, sizeof h) != want)
    return err(llvm::formatv("duck {0}: image header checksum mismatch", rank));
  if (h.tp_rank != rank || h.tp_size != plan.tp() ||
      h.slot_count != duck.slots()->size())
    return err(llvm::formatv("duck {0}: image header (rank {1}, tp {2}, {3} "
                             "slots) disagrees with the plan",
                             rank, h.tp_rank, h.tp_size, h.slot_count));
  return llvm::Error::success();
}

/// A slot's table entry against the plan (place, size, checksum), its
/// bytes against the checksum, and its header's magic; the header into `sh`.
llvm::Error checkSlotEntry(unsigned rank, unsigned si, const pl::SlotDef &sd,
                           const duck_slot_entry &e, const uint8_t *base,
                           uint64_t size, duck_slot_header &sh) {
  if (e.offset != sd.offset() || e.bytes != sd.bytes() ||
      e.checksum != sd.checksum() || e.offset + e.bytes > size)
    return err(llvm::formatv("duck {0} slot {1}: slot table disagrees with "
                             "the plan",
                             rank, si));
  if (XXH3_64bits(base + e.offset, e.bytes) != e.checksum)
    return err(llvm::formatv("duck {0} slot {1} (layer {2}): checksum "
                             "mismatch",
                             rank, si, e.layer));
  std::memcpy(&sh, base + e.offset, sizeof sh);
  if (sh.magic != DUCK_SLOT_MAGIC)
    return err(llvm::formatv("duck {0} slot {1}: bad slot magic", rank, si));
  return llvm::Error::success();
}

/// Routed experts of this layer (the rest are shared ones), and the full
/// (unsliced) width of one expert: 1 and 0 for a dense layer.
void moeLayerShape(const pl::PlanDef &plan, uint32_t layer, int64_t &routed,
                   int64_t &width) {
  routed = 1;
  width = 0;
  for (const pl::OpDef *op : pl::AllOps(plan))
    if (const pl::MoeFfnOpDef *moe = op->params_as_MoeFfnOpDef();
        moe && op->layer() == (int)layer) {
      routed = moe->num_experts();
      width = moe->inter();
    }
}

/// One matrix of a slot: its descriptor and the checkpoint tensor it
/// holds (a down projection's slice runs over columns).
struct MatrixRole {
  const duck_matrix_ref *ref;
  const std::string *name;
  bool down;
  /// W_UK^T of an MLA head (--mla-absorb ducks): image row i, column k is
  /// the checkpoint's (row0 + k, col0 + i).
  bool transposed = false;
};

/// Which duck, slot, layer and expert a matrix is, for messages.
struct MatrixAt {
  unsigned rank, si;
  uint32_t layer;
  unsigned ex;
};

/// A matrix's rows in the image against the checkpoint from (row0, col0):
/// the same bits, or (not from FP8) within half an fp9 step or flushed.
llvm::Error compareMatrix(const Checkpoint &ckpt, const MatrixRole &r,
                          const uint8_t *slot, int64_t row0, int64_t col0,
                          const MatrixAt &at, PlanCheck &check,
                          std::vector<float> &row,
                          std::vector<float> &refRow) {
  auto src = CheckpointMatrix::open(ckpt, *r.name);
  if (!src)
    return src.takeError();
  const duck_fp9_desc &desc = r.ref->desc;
  ++check.matrices;
  bool exact = true;
  row.resize(desc.k);
  refRow.resize(desc.k);
  for (uint32_t i = 0; i < desc.rows; ++i) {
    duck_fp9_unpack_row(&desc, slot + r.ref->offset, i, row.data());
    float rowMax = 0;
    for (uint32_t k = 0; k < desc.k; ++k) {
      refRow[k] = r.transposed ? src->at(row0 + k, col0 + i)
                               : src->at(row0 + i, col0 + k);
      rowMax = std::max(rowMax, std::fabs(refRow[k]));
    }
    for (uint32_t k = 0; k < desc.k; ++k) {
      float ref = refRow[k];
      ++check.elements;
      uint32_t a, b;
      std::memcpy(&a, &row[k], 4);
      std::memcpy(&b, &ref, 4);
      if (a == b)
        continue;
      exact = false;
      double rel = ref != 0 ? std::fabs(row[k] - ref) / std::fabs(ref)
                            : std::fabs(row[k]);
      check.worstRelError = std::max(check.worstRelError, rel);
      bool fp8 = src->isFp8();
      // Half a step of a 3-bit mantissa (plus fp32 rounding); only
      // values 2^-28 below the row's largest may flush to zero (the
      // fp9 range under a block scale is 2^-30 of the block's max).
      bool flushed =
          row[k] == 0.0f && std::fabs(ref) <= std::ldexp(rowMax, -28);
      if (fp8 || (rel > 0x1p-4 * (1 + 1e-5) && !flushed))
        return err(llvm::formatv(
            "duck {0} slot {1} (layer {2}) expert {3}: '{4}'[{5}, {6}] "
            "is {7} in the image but {8} in the checkpoint{9}",
            at.rank, at.si, at.layer, at.ex, *r.name,
            r.transposed ? row0 + k : row0 + i,
            r.transposed ? col0 + i : col0 + k, row[k], ref,
            fp8 ? " (FP8 must convert exactly)" : ""));
    }
  }
  if (exact)
    ++check.exactMatrices;
  return llvm::Error::success();
}

/// The tensor of `group` a head piece's first row (`headAt`) falls in, and
/// the row there as `start` (the rows of the tensors before it).
llvm::Expected<std::string>
headPieceTensor(llvm::ArrayRef<const pl::TensorDef *> group, uint64_t headAt,
                const MatrixAt &at, int64_t &start) {
  start = 0;
  for (const pl::TensorDef *t : group) {
    const int64_t n = t->shape() && t->shape()->size() == 2
                          ? (int64_t)t->shape()->Get(0)
                          : 0;
    if ((int64_t)headAt < start + n) {
      std::string name = t->name() ? t->name()->str() : "";
      if (!name.empty())
        return name;
      break;
    }
    start += n;
  }
  return err(llvm::formatv("duck {0} slot {1}: head piece {2} at "
                           "row {3} is past its tensors' rows",
                           at.rank, at.si, at.ex, headAt));
}

/// One piece of an absorbed MLA slot (--mla-absorb ducks), as the plan
/// says it must be, written apart from the compiler's layout.
struct AbsorbedPiece {
  std::string name;
  int64_t row0 = 0, col0 = 0, rows = 0, k = 0;
  bool transposed = false;
  uint32_t input = 0;
};

/// Duck `rank`'s query slot of an absorbed MLA (its heads' q rows, its
/// wq_b rows, W_UK^T of each head) or output slot (W_UV of each head, its
/// heads' o_proj columns), with the header's ob_begin in `obBegin`.
std::vector<AbsorbedPiece> absorbedPieces(const pl::MlaAttentionOpDef &m,
                                          const pl::IndexerOpDef *ix,
                                          bool query, unsigned rank,
                                          uint32_t &obBegin) {
  auto name = [](const pl::TensorDef *t) {
    return t && t->name() ? t->name()->str() : std::string();
  };
  const int64_t h0 = m.absorb_heads()->Get(rank),
                h1 = m.absorb_heads()->Get(rank + 1);
  const int64_t nope = m.qk_nope_head_dim(), qk = nope + m.qk_rope_head_dim(),
                v = m.v_head_dim(), L = m.kv_lora_rank();
  const std::string kvb = name(m.kv_b_proj());
  std::vector<AbsorbedPiece> out;
  obBegin = 0;
  if (query) {
    const pl::TensorDef *q = m.q_b_proj() ? m.q_b_proj() : m.q_proj();
    out.push_back({name(q), h0 * qk, 0, (h1 - h0) * qk, 0, false, 0});
    if (ix && ix->absorb_index_rows() && ix->absorb_index_rows()->size()) {
      const int64_t i0 = ix->absorb_index_rows()->Get(rank),
                    i1 = ix->absorb_index_rows()->Get(rank + 1);
      if (i1 > i0)
        out.push_back({name(ix->wq_b()), i0, 0, i1 - i0, 0, false, 0});
    }
    for (int64_t h = h0; h < h1; ++h)
      out.push_back({kvb, h * (nope + v), 0, L, nope, true,
                     DUCK_HEAD_INPUT_RESULTS | uint32_t((h - h0) * qk)});
    return out;
  }
  for (int64_t h = h0; h < h1; ++h)
    out.push_back({kvb, h * (nope + v) + nope, 0, v, L, false,
                   DUCK_HEAD_INPUT_X | uint32_t((h - h0) * L)});
  const pl::TensorDef *o = m.o_proj();
  const int64_t hidden = o && o->shape() ? (int64_t)o->shape()->Get(0) : 0;
  out.push_back({name(o), 0, h0 * v, hidden, (h1 - h0) * v, false,
                 DUCK_HEAD_INPUT_RESULTS});
  obBegin = uint32_t((h1 - h0) * v);
  return out;
}

/// The absorbed MLA whose query or output slot is `si` (and its layer's
/// indexer when that runs the query slot), or null.
const pl::MlaAttentionOpDef *absorbedOf(const pl::PlanDef &plan, uint32_t si,
                                        bool &query,
                                        const pl::IndexerOpDef *&ix) {
  ix = nullptr;
  if (!plan.ops())
    return nullptr;
  // The indexers that run their layer's query step, by layer.
  std::map<int32_t, const pl::IndexerOpDef *> indexers;
  for (const pl::OpDef *o : pl::AllOps(plan))
    if (const auto *x = o->params_as_IndexerOpDef(); x && x->on_ducks())
      indexers[o->layer()] = x;
  for (const pl::OpDef *op : pl::AllOps(plan)) {
    const auto *m = op->params_as_MlaAttentionOpDef();
    if (!m || !m->absorb_heads() || m->absorb_heads()->size() < 2)
      continue;
    auto found = indexers.find(op->layer());
    ix = found == indexers.end() ? nullptr : found->second;
    const uint32_t qSlot = ix ? ix->q_proj_slot() : m->q_proj_slot();
    if ((m->o_proj_on_ducks() && m->o_proj_slot() == si) ||
        ((m->q_proj_on_ducks() || ix) && qSlot == si)) {
      query = !(m->o_proj_on_ducks() && m->o_proj_slot() == si);
      return m;
    }
    ix = nullptr;
  }
  return nullptr;
}

/// A GQA's o_proj by heads (--o-proj heads) whose slot is `si`: duck
/// `rank`'s one piece, its heads' columns of every o_proj row; empty when
/// no such op runs `si`.
std::vector<AbsorbedPiece> gqaHeadPieces(const pl::PlanDef &plan, uint32_t si,
                                         unsigned rank) {
  if (!plan.ops())
    return {};
  for (const pl::OpDef *op : pl::AllOps(plan)) {
    const auto *g = op->params_as_GqaAttentionOpDef();
    if (!g || !g->o_proj_on_ducks() || g->o_proj_slot() != si ||
        !g->o_heads() || rank + 1 >= g->o_heads()->size() || !g->o_proj() ||
        !g->o_proj()->name() || !g->o_proj()->shape())
      continue;
    const int64_t h0 = g->o_heads()->Get(rank),
                  h1 = g->o_heads()->Get(rank + 1), dim = g->head_dim();
    return {{g->o_proj()->name()->str(), 0, h0 * dim,
             (int64_t)g->o_proj()->shape()->Get(0), (h1 - h0) * dim, false,
             DUCK_HEAD_INPUT_X}};
  }
  return {};
}

/// A slot of pieces the plan defines by heads: its header's ob_begin, each
/// piece's shape and input, and its values against the checkpoint.
llvm::Error verifyPieces(const Checkpoint &ckpt,
                         const std::vector<AbsorbedPiece> &want,
                         uint32_t obBegin, bool query,
                         const duck_slot_header &sh, const uint8_t *slot,
                         const MatrixAt &at0, PlanCheck &check,
                         std::vector<float> &row, std::vector<float> &refRow);

/// An absorbed MLA slot, as verifyPieces.
llvm::Error verifyAbsorbedSlot(const Checkpoint &ckpt,
                               const pl::MlaAttentionOpDef &m,
                               const pl::IndexerOpDef *ix, bool query,
                               const duck_slot_header &sh, const uint8_t *slot,
                               const MatrixAt &at0, PlanCheck &check,
                               std::vector<float> &row,
                               std::vector<float> &refRow) {
  uint32_t obBegin = 0;
  if (at0.rank + 1 >= m.absorb_heads()->size())
    return err(llvm::formatv("duck {0} slot {1}: no heads for this duck in "
                             "absorb_heads",
                             at0.rank, at0.si));
  std::vector<AbsorbedPiece> want =
      absorbedPieces(m, ix, query, at0.rank, obBegin);
  return verifyPieces(ckpt, want, obBegin, query, sh, slot, at0, check, row,
                      refRow);
}

llvm::Error verifyPieces(const Checkpoint &ckpt,
                         const std::vector<AbsorbedPiece> &want,
                         uint32_t obBegin, bool query,
                         const duck_slot_header &sh, const uint8_t *slot,
                         const MatrixAt &at0, PlanCheck &check,
                         std::vector<float> &row, std::vector<float> &refRow) {
  const auto *descs = reinterpret_cast<const duck_ffn_desc *>(slot + sizeof sh);
  if (sh.n_experts != want.size() || sh.ob_begin != obBegin)
    return err(llvm::formatv("duck {0} slot {1}: an absorbed {2} slot of {3} "
                             "pieces (ob_begin {4}), the plan says {5} ({6})",
                             at0.rank, at0.si, query ? "query" : "output",
                             sh.n_experts, sh.ob_begin, want.size(), obBegin));
  for (unsigned ex = 0; ex < want.size(); ++ex) {
    const duck_ffn_desc &d = descs[ex];
    const AbsorbedPiece &p = want[ex];
    if (d.gate.desc.rows != p.rows || (p.k && d.gate.desc.k != p.k) ||
        d.input != p.input)
      return err(llvm::formatv("duck {0} slot {1} piece {2}: {3} rows of K "
                               "{4} reading {5:x}, the plan says {6} of {7} "
                               "reading {8:x}",
                               at0.rank, at0.si, ex, d.gate.desc.rows,
                               d.gate.desc.k, d.input, p.rows, p.k, p.input));
    MatrixAt at = at0;
    at.ex = ex;
    const MatrixRole r{&d.gate, &p.name, false, p.transposed};
    if (llvm::Error x = compareMatrix(ckpt, r, slot, p.row0, p.col0, at, check,
                                      row, refRow))
      return x;
  }
  return llvm::Error::success();
}

/// One slot of a duck's image: its entry and header, then every present
/// expert's (or head piece's) matrices against the checkpoint.
llvm::Error verifySlot(const Checkpoint &ckpt, const pl::PlanDef &plan,
                       const pl::DuckDef &duck, unsigned si,
                       const uint8_t *base, uint64_t size,
                       const duck_image_header &h, PlanCheck &check,
                       std::vector<float> &row, std::vector<float> &refRow) {
  const unsigned rank = duck.rank();
  const pl::SlotDef *sd = duck.slots()->Get(si);
  const auto *table =
      reinterpret_cast<const duck_slot_entry *>(base + h.slot_table_offset);
  const duck_slot_entry &e = table[si];
  ++check.slots;
  duck_slot_header sh;
  if (llvm::Error x = checkSlotEntry(rank, si, *sd, e, base, size, sh))
    return x;
  const uint8_t *slot = base + e.offset;
  const auto *descs = reinterpret_cast<const duck_ffn_desc *>(slot + sizeof sh);
  int64_t routed, width;
  moeLayerShape(plan, sh.layer, routed, width);
  // A head slot: rows [inter_begin, inter_end) of the tensors of the op
  // that runs it (the LM head, an attention's o_proj, query or input
  // projections: rows concatenated in order), a descriptor a piece.
  std::vector<const pl::TensorDef *> group;
  if (sh.kind == DUCK_SLOT_HEAD) {
    if (!sd->head())
      return err(llvm::formatv("duck {0} slot {1}: a head slot the plan "
                               "does not call one",
                               rank, si));
    bool query = false;
    const pl::IndexerOpDef *ix = nullptr;
    if (std::vector<AbsorbedPiece> g = gqaHeadPieces(plan, si, rank);
        !g.empty())
      return verifyPieces(ckpt, g, 0, false, sh, slot,
                          MatrixAt{rank, si, sh.layer, 0}, check, row, refRow);
    if (const pl::MlaAttentionOpDef *m = absorbedOf(plan, si, query, ix))
      return verifyAbsorbedSlot(ckpt, *m, ix, query, sh, slot,
                                MatrixAt{rank, si, sh.layer, 0}, check, row,
                                refRow);
    group = headSlotTensors(plan, si);
    if (group.empty())
      return err(llvm::formatv("duck {0} slot {1}: a head slot that no "
                               "op of the plan runs on the ducks",
                               rank, si));
  }
  uint64_t headAt = sd->inter_begin(); // the next piece's first row
  for (unsigned ex = 0; ex < sh.n_experts; ++ex) {
    const duck_ffn_desc &d = descs[ex];
    if (!d.present)
      continue;
    ExpertTensorNames names = expertTensorNames(
        sh.layer, sh.kind == DUCK_SLOT_MOE, ex, routed, width);
    std::vector<MatrixRole> roles = {{&d.gate, &names.gate, false},
                                     {&d.up, &names.up, false},
                                     {&d.down, &names.down, true}};
    std::string headName;
    const MatrixAt at{rank, si, sh.layer, ex};
    if (sh.kind == DUCK_SLOT_HEAD) {
      int64_t start = 0;
      llvm::Expected<std::string> name =
          headPieceTensor(group, headAt, at, start);
      if (!name)
        return name.takeError();
      headName = std::move(*name);
      roles = {{&d.gate, &headName, false}};
      // row0 below is inter_begin + base: this piece's row in its tensor.
      names.base = (int64_t)headAt - start - (int64_t)sd->inter_begin();
      headAt += d.gate.desc.rows;
    }
    for (const MatrixRole &r : roles) {
      int64_t row0 = r.down ? 0 : sd->inter_begin() + names.base;
      int64_t col0 = r.down ? sd->inter_begin() + names.base : 0;
      if (llvm::Error x = compareMatrix(ckpt, r, slot, row0, col0, at, check,
                                        row, refRow))
        return x;
    }
  }
  return llvm::Error::success();
}

/// One duck's image: read, its header checked, every slot verified.
llvm::Error verifyImage(llvm::StringRef planDir, const Checkpoint &ckpt,
                        const pl::PlanDef &plan, const pl::DuckDef &duck,
                        PlanCheck &check, std::vector<float> &row,
                        std::vector<float> &refRow) {
  ++check.ducks;
  llvm::SmallString<256> imgPath(planDir);
  llvm::sys::path::append(imgPath, duck.image()->str());
  auto img = llvm::MemoryBuffer::getFile(imgPath, /*IsText=*/false,
                                         /*RequiresNullTerminator=*/false);
  if (!img)
    return err("cannot read '" + imgPath + "': " + img.getError().message());
  const uint8_t *base =
      reinterpret_cast<const uint8_t *>((*img)->getBufferStart());
  uint64_t size = (*img)->getBufferSize();
  duck_image_header h;
  if (llvm::Error x = checkImageHeader(plan, duck, base, size, h))
    return x;
  for (unsigned si = 0; si < duck.slots()->size(); ++si)
    if (llvm::Error x = verifySlot(ckpt, plan, duck, si, base, size, h, check,
                                   row, refRow))
      return x;
  return llvm::Error::success();
}
} // namespace

llvm::Expected<PlanCheck>
mlir::duck::verifyPlanImages(llvm::StringRef planDir, const Checkpoint &ckpt) {
  std::unique_ptr<llvm::MemoryBuffer> planBuf;
  llvm::Expected<const pl::PlanDef *> plan = readPlan(planDir, planBuf);
  if (!plan)
    return plan.takeError();
  PlanCheck check;
  std::vector<float> row, refRow;
  for (const pl::DuckDef *duck : *(*plan)->ducks())
    if (llvm::Error e =
            verifyImage(planDir, ckpt, **plan, *duck, check, row, refRow))
      return e;
  return check;
}
