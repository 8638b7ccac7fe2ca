//===- PlanWriter.cpp - plan and weight images from laid-out IR -----------===//
#include "duck/Target/Plan/PlanWriter.h"
#include "duck/Import/WeightSource.h"

#include "duck/Dialect/Duck/IR/DuckOps.h"
#include "duck/Dialect/Duck/Transforms/Layout.h"
#include "duck/plan/plan_generated.h"
#include "plan_trailer.h"
#include "duck_rt/abi.h"
#include "duck_rt/slot_layout.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <xxhash.h>

#include <future>

#include <algorithm>
#include <cstring>

using namespace mlir;
using namespace mlir::duck;
using namespace mlir::duck::import;
using llvm::Error;
using llvm::Expected;

namespace fb = flatbuffers;
namespace pl = ::duck::plan;

std::string mlir::duck::imageFileName(int64_t rank) {
  return llvm::formatv("duck-{0}.weights", rank).str();
}

namespace {

Error err(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

//===----------------------------------------------------------------------===//
// Weight sources
//===----------------------------------------------------------------------===//

/// Names of the tensors behind expert `e` of the FFN owning `shard`.
ExpertTensorNames namesOf(Fp9FfnOp shard, int64_t e) {
  FfnShape s = ffnShapeOf(shard);
  int64_t routed = 1;
  if (auto moe = dyn_cast<MoeOp>(shard->getParentOp()))
    routed = moe.getNumExperts();
  return expertTensorNames(s.layer, s.moe, e, routed, s.inter);
}

//===----------------------------------------------------------------------===//
// Image writer
//===----------------------------------------------------------------------===//

class ImageWriter {
public:
  ImageWriter(const Checkpoint &ckpt, int64_t scaleRows,
              const PlanWriteOptions &opts)
      : ckpt(ckpt), scaleRows(scaleRows), opts(opts) {}

  /// Writes the image of `rank`; fills checksums into `out_entries`.
  /// `rowMats` (o_projs, the LM head) put this duck's rows of each in one
  /// more slot after the FFNs; the head's slot-table layer is `numLayers`.
  Error write(ModuleOp module, int64_t rank, ArrayRef<Fp9FfnOp> shards,
              ArrayRef<RowMatrix> rowMats, int64_t numLayers, StringRef path,
              uint64_t totalBytes, StringRef layoutKey,
              std::vector<duck_slot_entry> &out_entries,
              std::string &out_key);

private:
  /// One matrix packed on a helper thread while the previous one is
  /// written and hashed (the image bytes stay in order).
  struct PackJob {
    std::vector<uint64_t> storage;
    uint64_t bytes = 0;
    duck_fp9_status status = DUCK_FP9_OK;
    duck_fp9_error_at at{};
    std::string name;
    int64_t layer = 0;
    const void *data() const {
      return reinterpret_cast<const void *>(
          (reinterpret_cast<uintptr_t>(storage.data()) + 63) / 64 * 64);
    }
  };
  /// Writes the matrix packed in the background, if any.
  Error flushPacked() {
    if (!inflight.valid())
      return Error::success();
    PackJob job = inflight.get();
    if (job.status != DUCK_FP9_OK)
      return err(llvm::formatv("tensor '{0}' (duck {1}, layer {2}): {3} at row "
                               "{4}, column {5}",
                               job.name, rank, job.layer,
                               duck_fp9_status_str(job.status), job.at.row,
                               job.at.col));
    return writeRaw(job.data(), job.bytes);
  }
  Error writeBytes(const void *p, uint64_t n) {
    if (Error e = flushPacked())
      return e;
    return writeRaw(p, n);
  }
  Error writeRaw(const void *p, uint64_t n) {
    if (opts.cancel && opts.cancel->load(std::memory_order_relaxed))
      return err("interrupted");
    os->write(static_cast<const char *>(p), n);
    XXH3_64bits_update(slotHash, p, n);
    pos += n;
    tick();
    return os->has_error() ? err("write failed: " + os->error().message())
                           : Error::success();
  }
  Error padTo(uint64_t target) {
    if (Error e = flushPacked()) // `pos` must count the packed matrix
      return e;
    static const char zeros[4096] = {};
    while (pos < target) {
      uint64_t n = std::min<uint64_t>(sizeof zeros, target - pos);
      if (Error e = writeBytes(zeros, n))
        return e;
    }
    return Error::success();
  }
  void tick() {
    if (opts.progress && pos - lastReport >= (16u << 20)) {
      lastReport = pos;
      opts.progress(rank, pos, total);
    }
  }
  /// Packs a matrix and writes it (in the background), zero-padded to
  /// `slotBytes` when its layout is shorter (an expert with fewer scale
  /// tiles than the slot is sized for).
  Error packMatrix(int64_t layer, const std::string &name, int64_t row0,
                   int64_t col0, const duck_fp9_desc &desc,
                   uint64_t slotBytes = 0);
  /// Packs W_UK^T of one MLA head (RowMatrix::Piece::head) and writes it
  /// (in the background).
  Error packTransposedHead(int64_t layer, const std::string &name, int64_t head,
                           int64_t perHead, const duck_fp9_desc &desc);
  Expected<WeightSource *> sourceOf(const std::string &name);
  Error writeRowSlot(const RowMatrix &m, int64_t numLayers,
                     std::vector<duck_slot_entry> &entries);
  /// Writes one FFN slot (header, descriptor table, every expert's packed
  /// matrices) and appends its slot-table entry.
  Error writeFfnSlot(Fp9FfnOp shard, std::vector<duck_slot_entry> &entries);
  /// Packs and writes each of the shard's experts' gate, up and down.
  Error packExperts(Fp9FfnOp shard, int64_t layer, const SlotLayout &lay);

  const Checkpoint &ckpt;
  int64_t scaleRows;
  const PlanWriteOptions &opts;
  llvm::raw_fd_ostream *os = nullptr;
  XXH3_state_t *slotHash = nullptr;
  uint64_t pos = 0, lastReport = 0, total = 0;
  int64_t rank = 0;
  llvm::StringMap<WeightSource> sources; // cache: one FFN's tensors
  // Declared after `sources`, so it is destroyed (waiting for a pack that
  // reads them) before they are, also when a write fails midway.
  std::future<PackJob> inflight;
};

Expected<WeightSource *> ImageWriter::sourceOf(const std::string &name) {
  auto it = sources.find(name);
  if (it == sources.end()) {
    Expected<WeightSource> s = openWeightSource(ckpt, name);
    if (!s)
      return s.takeError();
    it = sources.try_emplace(name, std::move(*s)).first;
  }
  return &it->second;
}

namespace {
/// Bytes of one element of a packing source.
uint64_t elementBytes(duck_fp9_src_type t) {
  return t == DUCK_FP9_SRC_E4M3 ? 1 : t == DUCK_FP9_SRC_F32 ? 4 : 2;
}
} // namespace

Error ImageWriter::packTransposedHead(int64_t layer, const std::string &name,
                                      int64_t head, int64_t perHead,
                                      const duck_fp9_desc &desc) {
  Expected<WeightSource *> s = sourceOf(name);
  if (!s)
    return s.takeError();
  const duck_fp9_source &S = (*s)->src;
  const uint64_t L = S.src_cols, nope = desc.k, r0 = uint64_t(head * perHead);
  const uint64_t es = elementBytes(S.type);
  if (desc.rows != L || r0 + nope > S.src_rows)
    return err("tensor '" + name + "': W_UK of head " + std::to_string(head) +
               " outside the tensor");
  std::vector<uint8_t> buf(L * nope * es);
  const auto *in = static_cast<const uint8_t *>(S.data);
  for (uint64_t r = 0; r < L; ++r)
    for (uint64_t j = 0; j < nope; ++j)
      std::memcpy(&buf[(r * nope + j) * es], in + ((r0 + j) * L + r) * es, es);
  std::vector<float> scales;
  if (S.type == DUCK_FP9_SRC_E4M3) {
    // The head's nope rows share one row of scale tiles; the transposed
    // matrix's row tiles are the source's column tiles.
    const uint64_t tr = S.tile_rows, tc = S.tile_cols;
    if (r0 / tr != (r0 + nope - 1) / tr || tc != desc.scale_rows)
      return err(llvm::formatv("tensor '{0}': W_UK of head {1} straddles "
                               "its FP8 scale tiles ({2} x {3}); use "
                               "--mla-absorb host",
                               name, head, tr, tc));
    const uint64_t gc = (S.src_cols + tc - 1) / tc;
    for (uint64_t i = 0; i < (L + tc - 1) / tc; ++i)
      scales.push_back(S.scale_inv[(r0 / tr) * gc + i]);
  }
  if (Error x = flushPacked())
    return x;
  inflight = std::async(std::launch::async, [S, desc, buf = std::move(buf),
                                             scales = std::move(scales), name,
                                             layer, L, nope] {
    duck_fp9_source t = S;
    t.data = buf.data();
    t.src_rows = L;
    t.src_cols = nope;
    t.row0 = t.col0 = 0;
    if (S.type == DUCK_FP9_SRC_E4M3) {
      t.scale_inv = scales.data();
      t.tile_rows = S.tile_cols;
      t.tile_cols = (uint32_t)nope;
    }
    duck_fp9_layout lay{};
    (void)duck_fp9_compute_layout(&desc, &lay);
    PackJob job;
    job.storage.assign(lay.total_bytes / 8 + 8, 0);
    job.bytes = lay.total_bytes;
    job.name = name;
    job.layer = layer;
    job.status =
        duck_fp9_pack(&t, &desc, const_cast<void *>(job.data()), &job.at);
    return job;
  });
  return Error::success();
}

Error ImageWriter::packMatrix(int64_t layer, const std::string &name,
                              int64_t row0, int64_t col0,
                              const duck_fp9_desc &desc, uint64_t slotBytes) {
  Expected<WeightSource *> sp = sourceOf(name);
  if (!sp)
    return sp.takeError();
  WeightSource &s = **sp;
  duck_fp9_source src = s.src;
  src.row0 = row0;
  src.col0 = col0;
  duck_fp9_layout lay;
  if (duck_fp9_compute_layout(&desc, &lay) != DUCK_FP9_OK)
    return err("tensor '" + name + "': invalid fp9 shape");
  if (desc.row_phase != row0 % desc.scale_rows)
    return err(llvm::formatv("tensor '{0}': slice starting at row {1} does not "
                             "line up with its {2}-row scale tiles",
                             name, row0, desc.scale_rows));
  // Pack this matrix on a helper thread and write the previous one
  // meanwhile. `src` points into `sources`, which lives until the slot
  // ends; the slot's last padTo writes this job before it is cleared.
  if (slotBytes && slotBytes < lay.total_bytes)
    return err("tensor '" + name + "': packed matrix exceeds its slot");
  std::future<PackJob> next = std::async(
      std::launch::async,
      [src, desc, bytes = std::max(lay.total_bytes, slotBytes), name, layer] {
        PackJob job;
        job.storage.assign(bytes / 8 + 8, 0);
        job.bytes = bytes;
        job.name = name;
        job.layer = layer;
        job.status = duck_fp9_pack(&src, &desc, const_cast<void *>(job.data()),
                                   &job.at);
        return job;
      });
  Error e = flushPacked();
  inflight = std::move(next);
  return e;
}

/// A head slot (abi.h): header, a descriptor a piece whose `gate` is its
/// [rows, K] matrix, then the pieces packed as the host's fp9 copy would
/// be: the LM head's vocabulary rows, an o_proj's output rows, or a group
/// of projections' rows (each piece a slice of one weight).
Error ImageWriter::writeRowSlot(const RowMatrix &m, int64_t numLayers,
                                std::vector<duck_slot_entry> &entries) {
  auto offsets = m.op->getAttrOfType<DenseI64ArrayAttr>(m.attr("duck_offsets"));
  if (!offsets || (int64_t)offsets.size() <= rank)
    return err("internal: a row-split matrix without its duck offsets");
  const uint64_t offset = offsets[rank];
  if (pos != offset)
    return err(llvm::formatv("internal: {0} slot of duck {1} expected at "
                             "offset {2}, writer at {3}",
                             m.role(), rank, offset, pos));
  XXH3_64bits_reset(slotHash);
  sources.clear();
  const int64_t headLayer = m.layer(numLayers);
  const uint32_t block = (uint32_t)m.block;
  HeadSlotLayout hl;
  if (headSlotLayout(m, rank, scaleRows, hl) != DUCK_FP9_OK)
    return err("invalid " + m.role() + " slot layout");
  duck_slot_header h{};
  h.magic = DUCK_SLOT_MAGIC;
  h.kind = DUCK_SLOT_HEAD;
  h.layer = (uint32_t)headLayer;
  h.hidden = (uint32_t)m.kOf(rank);
  h.inter = (uint32_t)m.rowsOf(rank);
  h.n_experts = (uint32_t)hl.pieces.size();
  h.block = block;
  h.ob_begin = (uint32_t)m.obBeginOf(rank);
  if (Error e = writeBytes(&h, sizeof h))
    return e;
  for (size_t i = 0; i < hl.pieces.size(); ++i) {
    duck_ffn_desc t{};
    t.present = 1;
    t.input = hl.pieces[i].input;
    t.gate = {hl.offsets[i], hl.descs[i],
              (uint32_t)duck_select_kernel(hl.descs[i].k, block), 0};
    if (Error e = writeBytes(&t, sizeof t))
      return e;
  }
  for (size_t i = 0; i < hl.pieces.size(); ++i) {
    const RowMatrix::Piece &p = hl.pieces[i];
    if (Error e = padTo(offset + hl.offsets[i]))
      return e;
    const std::string name = p.weight.getName().str();
    if (Error e =
            p.head >= 0
                ? packTransposedHead(headLayer, name, p.head,
                                     m.mla.nope + m.mla.v, hl.descs[i])
                : packMatrix(headLayer, name, p.row0, p.col0, hl.descs[i]))
      return e;
  }
  if (Error e = padTo(offset + hl.totalBytes))
    return e;
  duck_slot_entry entry{};
  entry.offset = offset;
  entry.bytes = hl.totalBytes;
  entry.checksum = XXH3_64bits_digest(slotHash);
  entry.layer = (uint32_t)headLayer;
  entry.kind = DUCK_SLOT_HEAD;
  entries.push_back(entry);
  return Error::success();
}

/// A slot's descriptor table: one entry an expert, those the shard holds
/// present, at their offsets in the slot.
std::vector<duck_ffn_desc> slotTable(Fp9FfnOp shard, const FfnShape &fs,
                                     const SlotLayout &lay, int64_t scaleRows) {
  std::vector<duck_ffn_desc> table(fs.experts);
  auto gk = (uint32_t)shard.getGateKernel()->getKind();
  auto dk = (uint32_t)shard.getDownKernel()->getKind();
  for (int64_t e = shard.getExpertBegin(); e < (int64_t)shard.getExpertEnd();
       ++e) {
    uint64_t base = lay.expertOffset(e - shard.getExpertBegin());
    duck_ffn_desc &t = table[e];
    // Each expert's own row phase (a shared expert's piece may start
    // inside a scale tile); the sizes are the slot's.
    const ShardDescs de = shardDescs(shard, scaleRows, e);
    t.present = 1;
    t.gate = {base + lay.gateOffset, de.gate, gk, 0};
    t.up = {base + lay.upOffset, de.up, gk, 0};
    t.down = {base + lay.downOffset, de.down, dk, 0};
  }
  return table;
}

Error ImageWriter::packExperts(Fp9FfnOp shard, int64_t layer,
                               const SlotLayout &lay) {
  for (int64_t e = shard.getExpertBegin(); e < (int64_t)shard.getExpertEnd();
       ++e) {
    ExpertTensorNames n = namesOf(shard, e);
    int64_t ib = shard.getInterBegin() + n.base;
    const ShardDescs de = shardDescs(shard, scaleRows, e);
    if (Error x = packMatrix(layer, n.gate, ib, 0, de.gate,
                             lay.upOffset - lay.gateOffset))
      return x;
    if (Error x = packMatrix(layer, n.up, ib, 0, de.up,
                             lay.downOffset - lay.upOffset))
      return x;
    if (Error x = packMatrix(layer, n.down, 0, ib, de.down,
                             lay.expertBytes - lay.downOffset))
      return x;
  }
  return Error::success();
}

Error ImageWriter::writeFfnSlot(Fp9FfnOp shard,
                                std::vector<duck_slot_entry> &entries) {
  uint64_t offset = *shard.getOffset();
  if (pos != offset)
    return err(llvm::formatv("internal: slot {0} of duck {1} expected at "
                             "offset {2}, writer at {3}",
                             *shard.getSlot(), rank, offset, pos));
  XXH3_64bits_reset(slotHash);
  sources.clear();
  FfnShape fs = ffnShapeOf(shard);
  auto lay = slotLayout(shard, scaleRows);
  if (failed(lay))
    return err("invalid slot layout");

  duck_slot_header h{};
  h.magic = DUCK_SLOT_MAGIC;
  h.kind = fs.moe ? DUCK_SLOT_MOE : DUCK_SLOT_DENSE;
  h.layer = (uint32_t)fs.layer;
  h.hidden = (uint32_t)fs.hidden;
  h.inter = (uint32_t)shard.getLocalInter();
  h.n_experts = (uint32_t)fs.experts;
  h.block = (uint32_t)shard.getBlock();
  std::vector<duck_ffn_desc> table = slotTable(shard, fs, *lay, scaleRows);
  if (Error e = writeBytes(&h, sizeof h))
    return e;
  if (Error e = writeBytes(table.data(), table.size() * sizeof(duck_ffn_desc)))
    return e;
  if (Error e = padTo(offset + lay->tableBytes))
    return e;
  if (Error e = packExperts(shard, fs.layer, *lay))
    return e;
  if (Error e = padTo(offset + lay->totalBytes))
    return e;
  duck_slot_entry entry{};
  entry.offset = offset;
  entry.bytes = lay->totalBytes;
  entry.checksum = XXH3_64bits_digest(slotHash);
  entry.layer = (uint32_t)fs.layer;
  entry.kind = h.kind;
  entries.push_back(entry);
  return Error::success();
}

/// The model key: the layout's key (everything that changes the layout)
/// combined with every slot's checksum, so a duck's cache can only hit on
/// an image with the very same bytes. Sets it in `ih` and as hex.
void setModelKey(duck_image_header &ih, StringRef layoutKey,
                 ArrayRef<duck_slot_entry> entries, std::string &keyHex) {
  XXH3_state_t *keyState = XXH3_createState();
  XXH3_128bits_reset(keyState);
  XXH3_128bits_update(keyState, layoutKey.data(), layoutKey.size());
  XXH3_128bits_update(keyState, entries.data(),
                      entries.size() * sizeof(duck_slot_entry));
  XXH128_hash_t key = XXH3_128bits_digest(keyState);
  XXH3_freeState(keyState);
  for (int i = 0; i < 8; ++i) {
    ih.model_key[i] = (uint8_t)(key.high64 >> (56 - 8 * i));
    ih.model_key[8 + i] = (uint8_t)(key.low64 >> (56 - 8 * i));
  }
  keyHex = llvm::formatv("{0:x-16}{1:x-16}", key.high64, key.low64).str();
}

/// The image's final prologue: the header (versions, rank, model key,
/// hidden size, its checksum) followed by the slot table.
std::vector<uint8_t> imagePrologue(ModuleOp module, int64_t r,
                                   uint64_t prologueBytes,
                                   uint64_t totalBytes, StringRef layoutKey,
                                   ArrayRef<Fp9FfnOp> shards,
                                   ArrayRef<RowMatrix> rowMats,
                                   ArrayRef<duck_slot_entry> entries,
                                   std::string &keyHex) {
  std::vector<uint8_t> pro(prologueBytes, 0);
  duck_image_header ih{};
  ih.magic = DUCK_IMAGE_MAGIC;
  ih.format_version = DUCK_IMAGE_FORMAT_VERSION;
  if (llvm::any_of(rowMats, [](const RowMatrix &m) { return m.absorbed(); }))
    ih.format_version = DUCK_IMAGE_FORMAT_VERSION_CHAINED;
  ih.abi_version = DUCK_ABI_VERSION;
  ih.fp9_version = DUCK_FP9_FORMAT_VERSION;
  ih.tp_size = (uint32_t)module->getAttrOfType<PartitionAttr>(kPartitionAttrName)
                    .getTp();
  ih.tp_rank = (uint32_t)r;
  ih.slot_count = (uint32_t)entries.size();
  setModelKey(ih, layoutKey, entries, keyHex);
  ih.slot_table_offset = DUCK_IMAGE_HEADER_BYTES;
  ih.total_bytes = totalBytes;
  // The model's hidden size: the FFNs' (the LM head's K; an o_proj's K is
  // its heads x v_head_dim, which its own slot header carries).
  ih.hidden = !shards.empty() ? (uint32_t)ffnShapeOf(shards[0]).hidden : 0;
  for (const RowMatrix &m : rowMats)
    if (!ih.hidden && m.head)
      ih.hidden = (uint32_t)m.k();
  ih.header_checksum = 0;
  ih.header_checksum = XXH3_64bits(&ih, sizeof ih);
  std::memcpy(pro.data(), &ih, sizeof ih);
  std::memcpy(pro.data() + DUCK_IMAGE_HEADER_BYTES, entries.data(),
              entries.size() * sizeof(duck_slot_entry));
  return pro;
}

Error ImageWriter::write(ModuleOp module, int64_t r, ArrayRef<Fp9FfnOp> shards,
                         ArrayRef<RowMatrix> rowMats, int64_t numLayers,
                         StringRef path,
                         uint64_t totalBytes, StringRef layoutKey,
                         std::vector<duck_slot_entry> &entries,
                         std::string &keyHex) {
  rank = r;
  total = totalBytes;
  pos = 0;
  lastReport = 0;
  std::error_code ec;
  llvm::raw_fd_ostream file(path, ec);
  if (ec)
    return err("cannot create '" + path + "': " + ec.message());
  os = &file;
  slotHash = XXH3_createState();
  auto freeHash = llvm::make_scope_exit([&] { XXH3_freeState(slotHash); });
  XXH3_64bits_reset(slotHash);

  // Prologue placeholder; rewritten once the checksums are known.
  uint64_t prologue = imagePrologueBytes(shards.size() + rowMats.size());
  if (Error e = padTo(prologue))
    return e;
  entries.clear();

  for (Fp9FfnOp shard : shards)
    if (Error e = writeFfnSlot(shard, entries))
      return e;
  for (const RowMatrix &m : rowMats)
    if (Error e = writeRowSlot(m, numLayers, entries))
      return e;
  if (pos != totalBytes)
    return err(llvm::formatv("internal: duck {0} image is {1} bytes, layout "
                             "said {2}",
                             r, pos, totalBytes));

  std::vector<uint8_t> pro =
      imagePrologue(module, r, prologue, totalBytes, layoutKey, shards,
                    rowMats, entries, keyHex);
  file.seek(0);
  file.write(reinterpret_cast<const char *>(pro.data()), pro.size());
  file.close();
  if (file.has_error())
    return err("write of '" + path + "' failed: " + file.error().message());
  if (opts.progress)
    opts.progress(r, totalBytes, totalBytes);
  return Error::success();
}

//===----------------------------------------------------------------------===//
// Plan builder
//===----------------------------------------------------------------------===//

class PlanBuilder {
public:
  PlanBuilder(const Checkpoint &ckpt) : ckpt(ckpt) {}
  Expected<fb::Offset<pl::TensorDef>> tensor(StringRef role, WeightAttr w);
  Expected<fb::Offset<pl::TensorDef>> rawTensor(StringRef role,
                                                StringRef name);
  Error buildOps(ModelOp model);
  std::vector<fb::Offset<pl::FileDef>> files();

  /// Model-wide values the per-kind tables repeat (attention norm eps and
  /// RoPE base), set before buildOps.
  double normEps = 0, ropeTheta = 0;
  DictionaryAttr cfg; ///< the model's config (duck.model's `config`)
  bool lmHeadFp9 = false, lmHeadInt8 = false;
  LmHeadOp head; ///< the LM head when it is on the ducks
  fb::FlatBufferBuilder fbb{1 << 16};
  std::vector<fb::Offset<pl::OpDef>> ops;
  uint32_t numValues = 0;
  /// The MTP module's program (the ops after the LM head), when the model
  /// returns its hidden state as a second result.
  std::vector<fb::Offset<pl::OpDef>> mtpOps;
  uint32_t mtpHidden = 0, mtpResult = 0;
  int64_t mtpLayer = -1;
  /// Where buildOps puts the next op: ops, then mtpOps.
  std::vector<fb::Offset<pl::OpDef>> *to = &ops;

private:
  Expected<fb::Offset<pl::TensorDef>> optionalTensor(StringRef role,
                                                     WeightAttr w);
  Expected<pl::DuckStepDef> duckStep(Operation *ffn, int64_t layer);
  Expected<fb::Offset<void>> attentionParams(AttentionOp a,
                                             pl::OpParams *type);
  Expected<fb::Offset<void>> mlaParams(AttentionOp a);
  fb::Offset<fb::Vector<uint32_t>>
  uintVector(std::optional<ArrayRef<int64_t>> a);
  Expected<uint32_t> indexerOp(AttentionOp a, uint32_t input);
  fb::Offset<pl::RopeScalingDef> ropeScaling();
  uint32_t cfgInt(StringRef k) const {
    auto v = cfg.getAs<IntegerAttr>(k);
    return v ? (uint32_t)v.getInt() : 0;
  }
  Expected<fb::Offset<void>> moeParams(MoeOp m);
  Expected<fb::Offset<void>> opParams(Operation &op, pl::OpParams *type);
  fb::Offset<pl::OpDef> makeOp(int32_t layer,
                               const std::vector<uint32_t> &inputs,
                               uint32_t result, pl::OpParams type,
                               fb::Offset<void> params);

  uint32_t fileIndex(const SafetensorsFile *f) {
    auto [it, inserted] = fileIdx.try_emplace(f, fileList.size());
    if (inserted)
      fileList.push_back(f);
    return it->second;
  }
  uint32_t valueId(Value v) {
    auto [it, inserted] = values.try_emplace(v, numValues);
    if (inserted)
      ++numValues;
    return it->second;
  }

  const Checkpoint &ckpt;
  llvm::DenseMap<const SafetensorsFile *, uint32_t> fileIdx;
  std::vector<const SafetensorsFile *> fileList;
  llvm::DenseMap<Value, uint32_t> values;
};

Expected<fb::Offset<pl::TensorDef>> PlanBuilder::rawTensor(StringRef role,
                                                           StringRef name) {
  TensorRef ref = ckpt.find(name);
  if (!ref)
    return err("host tensor '" + name + "' is missing from the checkpoint");
  const TensorInfo &t = *ref.info;
  pl::DType dt;
  switch (t.dtype) {
  case DType::F32:
    dt = pl::DType::F32;
    break;
  case DType::BF16:
    dt = pl::DType::BF16;
    break;
  case DType::F16:
    dt = pl::DType::F16;
    break;
  case DType::F8_E4M3:
    dt = pl::DType::F8_E4M3;
    break;
  default:
    return err("host tensor '" + name + "' has unsupported dtype " +
               dtypeName(t.dtype));
  }
  fb::Offset<pl::TensorDef> scale;
  uint32_t blockRows = 0, blockCols = 0;
  if (t.dtype == DType::F8_E4M3) {
    auto s = rawTensor("scale", name.str() + "_scale_inv");
    if (!s)
      return s.takeError();
    scale = *s;
    // The declared block, checked against the scale grid at import; the
    // runtime must not guess it from the grid (partial last tiles).
    const auto &bs = ckpt.model().quantization.weight_block_size;
    blockRows = bs.size() == 2 ? (uint32_t)bs[0] : 128;
    blockCols = bs.size() == 2 ? (uint32_t)bs[1] : 128;
  }
  uint64_t offset = 8 + ref.file->headerSize() + t.data_offset;
  std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
  return pl::CreateTensorDefDirect(fbb, role.str().c_str(), name.str().c_str(),
                                   fileIndex(ref.file), offset, t.byte_size, dt,
                                   &shape, scale, blockRows, blockCols);
}

Expected<fb::Offset<pl::TensorDef>> PlanBuilder::tensor(StringRef role,
                                                        WeightAttr w) {
  return rawTensor(role, w.getName());
}

std::vector<fb::Offset<pl::FileDef>> PlanBuilder::files() {
  std::vector<fb::Offset<pl::FileDef>> out;
  for (const SafetensorsFile *f : fileList) {
    uint64_t hash = 0;
    auto buf = llvm::MemoryBuffer::getFileSlice(f->path(), 8 + f->headerSize(),
                                                0);
    if (buf)
      hash = XXH3_64bits((*buf)->getBufferStart(), (*buf)->getBufferSize());
    std::string rel = llvm::sys::path::filename(f->path()).str();
    out.push_back(
        pl::CreateFileDefDirect(fbb, rel.c_str(), f->fileSize(), hash));
  }
  return out;
}

/// An op's parameter table: the union tag and the table's offset.
struct Params {
  pl::OpParams type = pl::OpParams::NONE;
  fb::Offset<void> table;
};

Expected<fb::Offset<pl::TensorDef>> PlanBuilder::optionalTensor(
    StringRef role, WeightAttr w) {
  if (!w)
    return fb::Offset<pl::TensorDef>();
  return tensor(role, w);
}

Expected<pl::DuckStepDef> PlanBuilder::duckStep(Operation *ffn,
                                                int64_t layer) {
  Region &r = ffn->getRegion(0);
  if (r.empty() || r.front().empty())
    return err("FFN of layer " + llvm::Twine(layer) + " is not partitioned");
  auto first = cast<Fp9FfnOp>(r.front().front());
  return pl::DuckStepDef(*first.getSlot(), *first.getDecodeMode(),
                         *first.getPrefillMode());
}

Expected<fb::Offset<void>> PlanBuilder::attentionParams(AttentionOp a,
                                                        pl::OpParams *type) {
  auto role = [&](StringRef r) -> Expected<fb::Offset<pl::TensorDef>> {
    auto w = a.getWeights().getAs<WeightAttr>(r);
    if (!w)
      return err("attention of layer " + llvm::Twine(a.getLayer()) +
                 " has no '" + r + "' weight");
    return tensor(r, w);
  };
  if (a.getKind() == "gqa") {
    fb::Offset<pl::TensorDef> t[6];
    const char *roles[6] = {"q_proj", "k_proj", "v_proj",
                            "o_proj", "q_norm", "k_norm"};
    for (int i = 0; i < 6; ++i) {
      auto x = role(roles[i]);
      if (!x)
        return x.takeError();
      t[i] = *x;
    }
    auto rope = ropeScaling();
    *type = pl::OpParams::GqaAttentionOpDef;
    return pl::CreateGqaAttentionOpDef(
               fbb, t[0], t[1], t[2], t[3], t[4], t[5], a.getNumHeads(),
               a.getNumKvHeads(), a.getHeadDim(), normEps, ropeTheta,
               a.getDuckSlot().has_value(), a.getDuckSlot().value_or(0),
               a.getQDuckSlot().has_value(), a.getQDuckSlot().value_or(0),
               a.getInDuckSlot().has_value(), a.getInDuckSlot().value_or(0),
               rope, uintVector(a.getAbsorbHeads()))
        .Union();
  }
  *type = pl::OpParams::MlaAttentionOpDef;
  return mlaParams(a);
}

/// A tp + 1 boundary array as the plan's [uint] (absent: an empty offset).
fb::Offset<fb::Vector<uint32_t>>
PlanBuilder::uintVector(std::optional<ArrayRef<int64_t>> a) {
  if (!a)
    return 0;
  std::vector<uint32_t> v(a->begin(), a->end());
  return fbb.CreateVector(v);
}

Expected<fb::Offset<void>> PlanBuilder::mlaParams(AttentionOp a) {
  auto opt = [&](StringRef r) {
    return optionalTensor(r, a.getWeights().getAs<WeightAttr>(r));
  };
  fb::Offset<pl::TensorDef> t[8];
  const char *roles[8] = {"q_a_proj",           "q_a_layernorm",
                          "q_b_proj",           "q_proj",
                          "kv_a_proj_with_mqa", "kv_a_layernorm",
                          "kv_b_proj",          "o_proj"};
  for (int i = 0; i < 8; ++i) {
    auto x = opt(roles[i]);
    if (!x)
      return x.takeError();
    t[i] = *x;
  }
  auto rope = ropeScaling();
  // With an indexer and the input projections on the ducks, the indexer
  // runs them and the query group, and hands this op their results.
  const bool fromIndexer = a.getIndexer() && a.getInDuckSlot();
  const bool q = a.getQDuckSlot() && !fromIndexer;
  const bool in = a.getInDuckSlot() && !fromIndexer;
  auto absorb = uintVector(a.getAbsorbHeads());
  return pl::CreateMlaAttentionOpDef(
             fbb, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7],
             a.getNumHeads(), cfgInt("q_lora_rank"), cfgInt("kv_lora_rank"),
             cfgInt("qk_nope_head_dim"), cfgInt("qk_rope_head_dim"),
             cfgInt("v_head_dim"), normEps, ropeTheta, rope,
             a.getDuckSlot().has_value(), a.getDuckSlot().value_or(0), q,
             q ? *a.getQDuckSlot() : 0, in, in ? *a.getInDuckSlot() : 0,
             fromIndexer, absorb)
      .Union();
}

/// DeepSeek-V3.2: the layer's indexer as its own op, reading the
/// attention's input and writing a fresh value (its selection), which
/// becomes the MLA op's second input.
Expected<uint32_t> PlanBuilder::indexerOp(AttentionOp a, uint32_t input) {
  DictionaryAttr idx = *a.getIndexer();
  auto need = [&](DictionaryAttr d, StringRef r,
                  StringRef role) -> Expected<fb::Offset<pl::TensorDef>> {
    auto w = d.getAs<WeightAttr>(r);
    if (!w)
      return err("indexer of layer " + llvm::Twine(a.getLayer()) +
                 " has no '" + r + "' weight");
    return tensor(role, w);
  };
  struct Role {
    DictionaryAttr dict;
    StringRef key, role;
  } roles[7] = {{a.getWeights(), "q_a_proj", "q_a_proj"},
                {a.getWeights(), "q_a_layernorm", "q_a_layernorm"},
                {idx, "wq_b", "indexer.wq_b"},
                {idx, "wk", "indexer.wk"},
                {idx, "k_norm", "indexer.k_norm"},
                {idx, "k_norm_bias", "indexer.k_norm_bias"},
                {idx, "weights_proj", "indexer.weights_proj"}};
  fb::Offset<pl::TensorDef> t[7];
  for (int i = 0; i < 7; ++i) {
    auto x = need(roles[i].dict, roles[i].key, roles[i].role);
    if (!x)
      return x.takeError();
    t[i] = *x;
  }
  auto geti = [&](StringRef k) -> uint32_t {
    auto v = idx.getAs<IntegerAttr>(k);
    return v ? (uint32_t)v.getInt() : 0;
  };
  auto rope = ropeScaling();
  const bool onDucks = a.getInDuckSlot() && a.getQDuckSlot();
  const bool absorbed = onDucks && a.getAbsorbHeads();
  auto heads = uintVector(absorbed ? a.getAbsorbHeads() : std::nullopt);
  auto index = uintVector(absorbed ? a.getAbsorbIndexRows() : std::nullopt);
  auto params = pl::CreateIndexerOpDef(
      fbb, t[0], t[1], t[2], t[3], t[4], t[5], t[6], geti("n_heads"),
      geti("head_dim"), geti("topk"), cfgInt("qk_rope_head_dim"), normEps,
      ropeTheta, rope, onDucks, onDucks ? *a.getInDuckSlot() : 0,
      onDucks ? *a.getQDuckSlot() : 0, (uint32_t)a.getNumHeads(),
      cfgInt("qk_nope_head_dim") + cfgInt("qk_rope_head_dim"),
      cfgInt("kv_lora_rank") + cfgInt("qk_rope_head_dim"), heads, index,
      absorbed ? cfgInt("kv_lora_rank") : 0);
  uint32_t result = numValues++;
  to->push_back(makeOp((int32_t)a.getLayer(), {input}, result,
                       pl::OpParams::IndexerOpDef, params.Union()));
  return result;
}

fb::Offset<pl::RopeScalingDef> PlanBuilder::ropeScaling() {
  auto type = cfg.getAs<StringAttr>("rope_scaling_type");
  // "default" is plain RoPE, which an absent table already means.
  if (!type || type.getValue() == "default")
    return {};
  auto f = [&](StringRef k, double dflt) {
    auto v = cfg.getAs<FloatAttr>(k);
    return v ? v.getValueAsDouble() : dflt;
  };
  return pl::CreateRopeScalingDefDirect(
      fbb, type.getValue().str().c_str(), f("rope_scaling_factor", 1.0),
      cfgInt("rope_original_max_position_embeddings"),
      f("rope_beta_fast", 32.0), f("rope_beta_slow", 1.0),
      f("rope_mscale", 1.0), f("rope_mscale_all_dim", 0.0),
      f("rope_attention_factor", 0.0));
}

Expected<fb::Offset<void>> PlanBuilder::moeParams(MoeOp m) {
  auto step = duckStep(m, m.getLayer());
  if (!step)
    return step.takeError();
  auto router = tensor("router", m.getRouterWeight());
  if (!router)
    return router.takeError();
  auto bias = optionalTensor("correction_bias",
                             m.getCorrectionBias().value_or(WeightAttr()));
  if (!bias)
    return bias.takeError();
  float scaling = m.getRoutedScalingFactor()
                      ? (float)m.getRoutedScalingFactor()->convertToDouble()
                      : 1.0f;
  return pl::CreateMoeFfnOpDef(
             fbb, &*step, m.getInter(), *router, *bias,
             m.getRouter() == RouterKind::sigmoid ? pl::Router::Sigmoid
                                                  : pl::Router::Softmax,
             m.getNumExperts(), m.getTopK(), m.getNormTopkProb(),
             m.getNGroup().value_or(0), m.getTopkGroup().value_or(0), scaling,
             m.getNumShared())
      .Union();
}

Expected<fb::Offset<void>> PlanBuilder::opParams(Operation &op,
                                                 pl::OpParams *type) {
  if (auto e = dyn_cast<EmbeddingOp>(op)) {
    auto w = tensor("weight", e.getWeight());
    if (!w)
      return w.takeError();
    *type = pl::OpParams::EmbeddingOpDef;
    return pl::CreateEmbeddingOpDef(fbb, *w).Union();
  }
  if (auto n = dyn_cast<RmsNormOp>(op)) {
    auto w = tensor("weight", n.getWeight());
    if (!w)
      return w.takeError();
    *type = pl::OpParams::RmsNormOpDef;
    return pl::CreateRmsNormOpDef(fbb, *w, n.getEps().convertToDouble())
        .Union();
  }
  if (auto a = dyn_cast<AttentionOp>(op))
    return attentionParams(a, type);
  if (isa<AddOp>(op)) {
    *type = pl::OpParams::AddOpDef;
    return pl::CreateAddOpDef(fbb).Union();
  }
  if (auto m = dyn_cast<MlpOp>(op)) {
    auto step = duckStep(m, m.getLayer());
    if (!step)
      return step.takeError();
    *type = pl::OpParams::DenseFfnOpDef;
    return pl::CreateDenseFfnOpDef(fbb, &*step, m.getInter()).Union();
  }
  if (auto m = dyn_cast<MoeOp>(op)) {
    *type = pl::OpParams::MoeFfnOpDef;
    return moeParams(m);
  }
  if (auto m = dyn_cast<MtpInputOp>(op)) {
    auto en = tensor("enorm", m.getEnorm());
    auto hn = tensor("hnorm", m.getHnorm());
    auto eh = tensor("eh_proj", m.getEhProj());
    if (!en || !hn || !eh)
      return joinErrors(joinErrors(en.takeError(), hn.takeError()),
                        eh.takeError());
    *type = pl::OpParams::MtpInputOpDef;
    return pl::CreateMtpInputOpDef(fbb, *en, *hn, *eh,
                                   m.getEps().convertToDouble())
        .Union();
  }
  if (auto h = dyn_cast<LmHeadOp>(op)) {
    auto w = tensor("weight", h.getWeight());
    if (!w)
      return w.takeError();
    *type = pl::OpParams::LmHeadOpDef;
    const bool onDucks = head && h == head;
    return pl::CreateLmHeadOpDef(fbb, *w, lmHeadFp9 && !onDucks,
                                 lmHeadInt8 && !onDucks, onDucks,
                                 onDucks ? (uint32_t)*h.getDuckSlot() : 0)
        .Union();
  }
  return err("op '" + op.getName().getStringRef() + "' has no plan form");
}

Error PlanBuilder::buildOps(ModelOp model) {
  // The ops after the LM head are the MTP module's (ImportModel): a
  // program of their own.
  to = &ops;
  for (Operation &op : model.getBody().front()) {
    if (auto ret = dyn_cast<ReturnOp>(op)) {
      if (ret.getNumOperands() > 1)
        mtpResult = valueId(ret.getOperand(1));
      continue;
    }
    if (auto h = dyn_cast<LmHeadOp>(op))
      mtpHidden = valueId(h.getInput());
    if (auto m = dyn_cast<MtpInputOp>(op))
      mtpLayer = m.getLayer();
    std::vector<uint32_t> inputs;
    for (Value v : op.getOperands())
      if (!isa<BlockArgument>(v))
        inputs.push_back(valueId(v));
    int32_t layer = -1;
    if (auto a = op.getAttrOfType<IntegerAttr>("layer"))
      layer = (int32_t)a.getInt();
    if (auto a = dyn_cast<AttentionOp>(op); a && a.getIndexer()) {
      auto sel = indexerOp(a, inputs.at(0));
      if (!sel)
        return sel.takeError();
      inputs.push_back(*sel);
    }
    pl::OpParams type = pl::OpParams::NONE;
    auto params = opParams(op, &type);
    if (!params)
      return params.takeError();
    uint32_t result = valueId(op.getResult(0));
    to->push_back(makeOp(layer, inputs, result, type, *params));
    if (isa<LmHeadOp>(op))
      to = &mtpOps;
  }
  if (!mtpOps.empty() && mtpLayer < 0)
    return err("internal: ops follow the LM head without an MTP input");
  return Error::success();
}

fb::Offset<pl::OpDef> PlanBuilder::makeOp(int32_t layer,
                                          const std::vector<uint32_t> &inputs,
                                          uint32_t result, pl::OpParams type,
                                          fb::Offset<void> params) {
  auto in = fbb.CreateVector(inputs);
  pl::OpDefBuilder b(fbb);
  b.add_layer(layer);
  b.add_inputs(in);
  b.add_result(result);
  b.add_params_type(type);
  b.add_params(params);
  return b.Finish();
}

pl::Family planFamily(StringRef f) {
  if (f == "qwen3_moe")
    return pl::Family::Qwen3Moe;
  if (f == "deepseek_v3")
    return pl::Family::DeepSeekV3;
  if (f == "deepseek_v32")
    return pl::Family::DeepSeekV32;
  return pl::Family::Qwen3;
}

/// What the layout and partition passes left on the module for the
/// writer: each duck's layout key and image size, the model, the cut.
struct LaidOutModule {
  ArrayAttr keys, images;
  ModelOp model;
  PartitionAttr part;
};

Expected<LaidOutModule> laidOutModule(ModuleOp module) {
  LaidOutModule m;
  m.keys = module->getAttrOfType<ArrayAttr>("duck.model_key");
  m.images = module->getAttrOfType<ArrayAttr>("duck.image_bytes");
  if (!m.keys || !m.images)
    return err("internal: module is not laid out (run duck-layout-weights)");
  module.walk([&](ModelOp op) { m.model = op; });
  if (!m.model)
    return err("internal: module has no duck.model");
  m.part = module->getAttrOfType<PartitionAttr>(kPartitionAttrName);
  if (!m.part)
    return err("internal: module is not partitioned (run duck-partition)");
  const int64_t tp = m.part.getTp();
  if ((int64_t)m.images.size() != tp || (int64_t)m.keys.size() != tp)
    return err(llvm::formatv("internal: {0} images laid out for tp = {1}",
                             m.images.size(), tp)
                   .str());
  return m;
}

/// The largest step any slot makes, per row (PlanDef.step_limits).
struct StepLimits {
  uint32_t maxInter = 0, maxExperts = 1, maxActive = 1, maxHeadRows = 0,
           maxK = 0;
};

/// An FFN slot's SlotDef: its entry, range, kernels and every expert's
/// three matrices at their image offsets.
fb::Offset<pl::SlotDef> ffnSlotDef(PlanBuilder &pb, Fp9FfnOp shard,
                                   const duck_slot_entry &en,
                                   int64_t scaleRows, StepLimits &lim) {
  std::vector<fb::Offset<pl::MatrixDef>> mats;
  auto lay = slotLayout(shard, scaleRows);
  ShardDescs d = shardDescs(shard, scaleRows);
  for (int64_t e = shard.getExpertBegin(); e < (int64_t)shard.getExpertEnd();
       ++e) {
    uint64_t base = en.offset + lay->expertOffset(e - shard.getExpertBegin());
    auto gk = (uint8_t)shard.getGateKernel()->getKind();
    auto dk = (uint8_t)shard.getDownKernel()->getKind();
    mats.push_back(pl::CreateMatrixDef(pb.fbb, e, 0, base + lay->gateOffset,
                                       d.gate.rows, d.gate.k, d.gate.block, gk));
    mats.push_back(pl::CreateMatrixDef(pb.fbb, e, 1, base + lay->upOffset,
                                       d.up.rows, d.up.k, d.up.block, gk));
    mats.push_back(pl::CreateMatrixDef(pb.fbb, e, 2, base + lay->downOffset,
                                       d.down.rows, d.down.k, d.down.block, dk));
  }
  lim.maxInter = std::max<uint32_t>(
      lim.maxInter, shard.getInterEnd() - shard.getInterBegin());
  return pl::CreateSlotDefDirect(
      pb.fbb, en.layer, en.kind == DUCK_SLOT_MOE, en.offset, en.bytes,
      en.checksum, shard.getInterBegin(), shard.getInterEnd(),
      shard.getExpertBegin(), shard.getExpertEnd(), shard.getBlock(),
      (uint8_t)shard.getGateKernel()->getKind(),
      (uint8_t)shard.getDownKernel()->getKind(), &mats);
}

/// A row matrix's SlotDef on duck `r`: its rows of the matrix, one
/// MatrixDef a piece.
fb::Offset<pl::SlotDef> rowSlotDef(PlanBuilder &pb, const RowMatrix &m,
                                   int64_t r, const duck_slot_entry &en,
                                   int64_t scaleRows, StepLimits &lim) {
  const uint32_t hidden = (uint32_t)m.kOf(r);
  const uint32_t block = (uint32_t)m.block;
  const auto k = (uint8_t)duck_select_kernel(hidden, block);
  HeadSlotLayout hl;
  (void)headSlotLayout(m, r, scaleRows, hl); // written with the image
  std::vector<fb::Offset<pl::MatrixDef>> mats;
  for (size_t x = 0; x < hl.descs.size(); ++x)
    mats.push_back(
        pl::CreateMatrixDef(pb.fbb, (uint32_t)x, 0, en.offset + hl.offsets[x],
                            hl.descs[x].rows, hl.descs[x].k, block,
                            (uint8_t)duck_select_kernel(hl.descs[x].k, block)));
  lim.maxHeadRows = std::max<uint32_t>(lim.maxHeadRows, m.rowsOf(r));
  lim.maxK = std::max(lim.maxK, hidden);
  // An absorbed slot's rows are its chain's: [ob_begin, rows) in its OB.
  const uint32_t begin =
      m.absorbed() ? (uint32_t)m.obBeginOf(r) : (uint32_t)m.rows[r];
  const uint32_t end =
      m.absorbed() ? (uint32_t)m.rowsOf(r) : (uint32_t)m.rows[r + 1];
  return pl::CreateSlotDefDirect(pb.fbb, en.layer, false, en.offset, en.bytes,
                                 en.checksum, begin, end, 0, 1, block, k, k,
                                 &mats,
                                 /*head=*/true);
}

int64_t cfgInt(DictionaryAttr cfg, StringRef k) {
  if (auto a = cfg.getAs<IntegerAttr>(k))
    return a.getInt();
  return 0;
}

double cfgFloat(DictionaryAttr cfg, StringRef k) {
  if (auto a = cfg.getAs<FloatAttr>(k))
    return a.getValueAsDouble();
  return 0;
}

/// The plan's ModelDef: the model's sizes, token ids and attention shape
/// from duck.model's config.
fb::Offset<pl::ModelDef> modelDef(PlanBuilder &pb, ModelOp model) {
  DictionaryAttr cfg = model.getConfig();
  auto geti = [&](StringRef k) { return cfgInt(cfg, k); };
  auto getf = [&](StringRef k) { return cfgFloat(cfg, k); };
  std::vector<int32_t> eos;
  if (auto a = cfg.getAs<ArrayAttr>("eos_token_ids"))
    for (Attribute x : a)
      eos.push_back(cast<IntegerAttr>(x).getInt());
  bool tie = false;
  if (auto a = cfg.getAs<BoolAttr>("tie_word_embeddings"))
    tie = a.getValue();
  // YaRN stretches the context the model was trained at by its factor:
  // Qwen3's model cards turn on 128k as 32768 x 4 and leave
  // max_position_embeddings at 40960. The positions the runtime allows
  // (--max-seq) take the larger, as vLLM's max_model_len does.
  double maxPosition = (double)geti("max_position_embeddings");
  if (auto t = cfg.getAs<StringAttr>("rope_scaling_type");
      t && t.getValue() == "yarn")
    maxPosition = std::max(
        maxPosition, getf("rope_scaling_factor") *
                         (double)geti("rope_original_max_position_embeddings"));
  return pl::CreateModelDefDirect(
      pb.fbb, model.getSymName().str().c_str(), planFamily(model.getFamily()),
      geti("hidden_size"), geti("num_layers"), geti("vocab_size"),
      geti("num_attention_heads"), geti("num_kv_heads"), geti("head_dim"),
      getf("rms_norm_eps"), getf("rope_theta"),
      (uint32_t)std::min(maxPosition, (double)UINT32_MAX), tie,
      cfg.get("bos_token_id") ? geti("bos_token_id") : -1, &eos,
      geti("q_lora_rank"), geti("kv_lora_rank"), geti("qk_nope_head_dim"),
      geti("qk_rope_head_dim"), geti("v_head_dim"));
}

/// Writes the finished FlatBuffer as the plan file, followed by its trailer.
Error writePlanFile(StringRef dir, const fb::FlatBufferBuilder &fbb) {
  llvm::SmallString<256> planPath(dir);
  llvm::sys::path::append(planPath, kPlanFileName);
  std::error_code ec;
  llvm::raw_fd_ostream out(planPath, ec);
  if (ec)
    return err("cannot create '" + planPath + "': " + ec.message());
  out.write(reinterpret_cast<const char *>(fbb.GetBufferPointer()),
            fbb.GetSize());
  uint8_t trailer[DUCK_PLAN_TRAILER_BYTES];
  duck_plan_trailer(fbb.GetBufferPointer(), fbb.GetSize(), trailer);
  out.write(reinterpret_cast<const char *>(trailer), sizeof trailer);
  out.close();
  if (out.has_error())
    return err("write of '" + planPath + "' failed");
  return Error::success();
}

/// Writes every duck's image and builds its DuckDef (the slots as
/// written), raising `lim` to the largest step any slot makes.
Expected<std::vector<fb::Offset<pl::DuckDef>>>
writeImages(ModuleOp module, const Checkpoint &ckpt, StringRef dir,
            const PlanWriteOptions &opts, const LaidOutModule &lo,
            PlanBuilder &pb, StepLimits &lim) {
  const int64_t tp = lo.part.getTp();
  int64_t scaleRows = scaleRowsOf(module);
  // Shards per rank in slot order.
  std::vector<std::vector<Fp9FfnOp>> perRank(tp);
  module.walk([&](Fp9FfnOp s) { perRank[s.getRank()].push_back(s); });
  for (auto &v : perRank)
    llvm::sort(v, [](Fp9FfnOp a, Fp9FfnOp b) {
      return *a.getSlot() < *b.getSlot();
    });
  ModelOp model = lo.model;
  const int64_t headLayer = cfgInt(model.getConfig(), "num_layers");
  const SmallVector<RowMatrix> rowMats = rowMatricesOf(module);

  ImageWriter iw(ckpt, scaleRows, opts);
  std::vector<fb::Offset<pl::DuckDef>> ducks;
  for (int64_t r = 0; r < tp; ++r) {
    std::string file = imageFileName(r);
    llvm::SmallString<256> path(dir);
    llvm::sys::path::append(path, file);
    std::vector<duck_slot_entry> entries;
    uint64_t total = cast<IntegerAttr>(lo.images[r]).getInt();
    StringRef layoutKey = cast<StringAttr>(lo.keys[r]).getValue();
    std::string key;
    if (Error e = iw.write(module, r, perRank[r], rowMats, headLayer, path,
                           total, layoutKey, entries, key))
      return e;
    std::vector<fb::Offset<pl::SlotDef>> slots;
    for (auto [i, shard] : llvm::enumerate(perRank[r]))
      slots.push_back(ffnSlotDef(pb, shard, entries[i], scaleRows, lim));
    for (auto [i, m] : llvm::enumerate(rowMats))
      slots.push_back(rowSlotDef(pb, m, r, entries[perRank[r].size() + i],
                                 scaleRows, lim));
    ducks.push_back(pl::CreateDuckDefDirect(pb.fbb, r, file.c_str(), total,
                                            key.c_str(), &slots));
  }
  return ducks;
}

} // namespace

Error mlir::duck::writePlan(ModuleOp module, const Checkpoint &ckpt,
                            StringRef dir, const PlanWriteOptions &opts) {
  Expected<LaidOutModule> lo = laidOutModule(module);
  if (!lo)
    return lo.takeError();
  ModelOp model = lo->model;
  PartitionAttr part = lo->part;

  LmHeadOp head;
  module.walk([&](LmHeadOp op) {
    if (op.getDuckRows() && op.getDuckSlot() && op.getDuckOffsets())
      head = op;
  });
  PlanBuilder pb(ckpt);
  pb.head = head;
  StepLimits lim;
  module.walk([&](MoeOp m) {
    lim.maxExperts = std::max<uint32_t>(lim.maxExperts, m.getTotalExperts());
    lim.maxActive =
        std::max<uint32_t>(lim.maxActive, m.getTopK() + m.getNumShared());
  });
  Expected<std::vector<fb::Offset<pl::DuckDef>>> ducks =
      writeImages(module, ckpt, dir, opts, *lo, pb, lim);
  if (!ducks)
    return ducks.takeError();

  DictionaryAttr cfg = model.getConfig();
  pb.cfg = cfg;
  pb.lmHeadFp9 = opts.lmHeadFp9;
  pb.lmHeadInt8 = opts.lmHeadInt8;
  pb.normEps = cfgFloat(cfg, "rms_norm_eps");
  pb.ropeTheta = cfgFloat(cfg, "rope_theta");
  if (Error e = pb.buildOps(model))
    return e;
  auto modelOffset = modelDef(pb, model);
  auto fileDefs = pb.files();
  const int64_t multipleOf = part.getMultipleOf();
  // The plan's byte is the enum's value: 0 intermediate, 1 experts, 2 mixed.
  static_assert((int)Strategy::intermediate == 0 &&
                    (int)Strategy::experts == 1 && (int)Strategy::mixed == 2,
                "plan.fbs numbers the strategies");
  const uint8_t strategy = (uint8_t)part.getStrategy();
  llvm::SmallString<256> absDir(ckpt.directory());
  llvm::sys::fs::make_absolute(absDir);
  std::string compiler = "duckc " DUCK_COMPILER_VERSION;
  auto limits = pl::CreateStepLimitsDef(pb.fbb, lim.maxInter, lim.maxExperts,
                                       lim.maxActive, lim.maxHeadRows,
                                       lim.maxK);
  fb::Offset<pl::MtpDef> mtp;
  if (!pb.mtpOps.empty())
    mtp = pl::CreateMtpDefDirect(pb.fbb, &pb.mtpOps, pb.mtpHidden, pb.mtpResult,
                                 (uint32_t)pb.mtpLayer);
  auto root = pl::CreatePlanDefDirect(
      pb.fbb, (uint32_t)pl::PlanFormat::Version, DUCK_ABI_VERSION,
      DUCK_FP9_FORMAT_VERSION, compiler.c_str(), absDir.c_str(), &fileDefs,
      modelOffset, part.getTp(), multipleOf, opts.coresPerDuck, strategy,
      &pb.ops, &*ducks, pb.numValues, limits, opts.wireBf16, opts.wireOutBf16,
      mtp, opts.wireQ8, opts.wireOutQ8, opts.multicast, opts.stageShared);
  pl::FinishPlanDefBuffer(pb.fbb, root);
  return writePlanFile(dir, pb.fbb);
}
