//===- LayoutWeights.cpp - duck-layout-weights ----------------------------===//
#include "duck/Dialect/Duck/Transforms/Layout.h"
#include "duck/Dialect/Duck/Transforms/Passes.h"
#include "duck_rt/slot_layout.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <xxhash.h>

namespace mlir::duck {
#define GEN_PASS_DEF_DUCKLAYOUTWEIGHTS
#include "duck/Dialect/Duck/Transforms/Passes.h.inc"
} // namespace mlir::duck

using namespace mlir;
using namespace mlir::duck;

namespace {

std::string keyHex(const std::string &canonical) {
  XXH128_hash_t h = XXH3_128bits(canonical.data(), canonical.size());
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format_hex_no_prefix(h.high64, 16)
     << llvm::format_hex_no_prefix(h.low64, 16);
  return s;
}

using ShardsByRank = SmallVector<SmallVector<Fp9FfnOp>>;

/// Shards per rank, in layer (program) order: one image a duck, tp of
/// them, whatever shards a duck holds. Fails (after errors on the shards)
/// on a shard without kernels and modes, or of a rank outside tp.
FailureOr<ShardsByRank> shardsByRank(ModuleOp module, int64_t tp) {
  ShardsByRank perRank(tp);
  bool ok = true;
  module.walk([&](Fp9FfnOp shard) {
    if (!shard.getGateKernel() || !shard.getDownKernel() ||
        !shard.getDecodeMode()) {
      shard.emitOpError("needs kernels and modes before layout: run "
                        "duck-select-kernels and duck-assign-modes first");
      ok = false;
      return;
    }
    int64_t r = shard.getRank();
    if (r < 0 || r >= tp) {
      shard.emitOpError() << "rank " << r << " is outside the partition's "
                          << tp << " ducks";
      ok = false;
      return;
    }
    perRank[r].push_back(shard);
  });
  if (!ok)
    return failure();
  return perRank;
}

/// Row-split matrices (o_projs, the LM head) take one more slot each on
/// every duck, after the FFNs, at the same index on all of them: each has
/// tp + 1 row boundaries, and every duck the same number of FFN slots.
LogicalResult checkRowMatrices(ArrayRef<RowMatrix> rowMats,
                               const ShardsByRank &perRank, int64_t tp) {
  for (const RowMatrix &m : rowMats) {
    if ((int64_t)m.rows.size() != tp + 1) {
      m.op->emitOpError() << "duck_rows has " << m.rows.size()
                          << " boundaries for " << tp << " ducks";
      return failure();
    }
    for (auto &v : perRank)
      if (v.size() != perRank.front().size()) {
        m.op->emitOpError("the ducks hold different slot counts, so a "
                          "row-split matrix's slot would have no one index");
        return failure();
      }
  }
  return success();
}

/// Places a duck's FFN slots from `offset` (slot, offset and bytes on each
/// shard) and describes each in the layout key; returns the end offset.
FailureOr<uint64_t> layoutFfnSlots(ArrayRef<Fp9FfnOp> shards, uint64_t offset,
                                   int64_t scaleRows, Builder &b,
                                   llvm::raw_ostream &cs) {
  for (size_t i = 0; i < shards.size(); ++i) {
    Fp9FfnOp shard = shards[i];
    auto lay = slotLayout(shard, scaleRows);
    if (failed(lay))
      return failure();
    FfnShape s = ffnShapeOf(shard);
    shard.setSlotAttr(b.getI64IntegerAttr(i));
    shard.setOffsetAttr(b.getI64IntegerAttr(offset));
    shard.setBytesAttr(b.getI64IntegerAttr(lay->totalBytes));
    cs << "|slot" << i << ":layer=" << s.layer << ",moe=" << s.moe
       << ",hidden=" << s.hidden << ",inter=" << shard.getInterBegin() << "-"
       << shard.getInterEnd() << ",experts=" << shard.getExpertBegin() << "-"
       << shard.getExpertEnd() << "/" << s.experts
       << ",block=" << shard.getBlock()
       << ",kernels=" << (int)shard.getGateKernel()->getKind() << "/"
       << (int)shard.getDownKernel()->getKind() << ",dtype=";
    // Source dtypes change the bytes (FP8 is lossless, bf16 quantised).
    Operation *p = shard->getParentOp();
    if (auto mlp = dyn_cast<MlpOp>(p))
      cs << mlp.getGate().getDtype();
    else
      cs << cast<MoeOp>(p).getGate().getDtype();
    offset += lay->totalBytes;
  }
  return offset;
}

/// Places duck `r`'s row-matrix slots from `offset` (appending each one's
/// offset and bytes) and describes each in the layout key; returns the
/// end offset.
FailureOr<uint64_t> layoutRowSlots(ArrayRef<RowMatrix> rowMats, size_t r,
                                   uint64_t offset, int64_t firstRowSlot,
                                   int64_t scaleRows,
                                   SmallVector<SmallVector<int64_t>> &rowOffsets,
                                   SmallVector<SmallVector<int64_t>> &rowBytes,
                                   llvm::raw_ostream &cs) {
  for (auto [i, m] : llvm::enumerate(rowMats)) {
    HeadSlotLayout hl;
    if (headSlotLayout(m, (int64_t)r, scaleRows, hl) != DUCK_FP9_OK) {
      m.op->emitOpError() << "duck " << r << ": the " << m.role()
                          << " rows have no fp9 layout";
      return failure();
    }
    rowOffsets[i].push_back(offset);
    rowBytes[i].push_back(hl.totalBytes);
    cs << "|slot" << firstRowSlot + (int64_t)i << ":" << m.role()
       << ",rows=" << m.rows[r] << "-" << m.rows[r + 1] << "/"
       << m.totalRows() << ",k=" << m.k() << ",block=" << m.block;
    for (WeightAttr w : m.weights)
      cs << ",dtype=" << w.getDtype() << "x" << w.getShape()[0];
    if (!m.head)
      cs << ",layer=" << cast<AttentionOp>(m.op).getLayer();
    if (m.absorbed())
      cs << ",absorb=" << m.absorbHeads[r] << "-" << m.absorbHeads[r + 1];
    offset += hl.totalBytes;
  }
  return offset;
}

struct DuckLayoutWeightsPass
    : public mlir::duck::impl::DuckLayoutWeightsBase<DuckLayoutWeightsPass> {
  using Base::Base;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    Builder b(&getContext());
    int64_t scaleRows = scaleRowsOf(module);
    FailureOr<PartitionAttr> part = partitionOf(module, "duck-layout-weights");
    if (failed(part))
      return signalPassFailure();
    const int64_t tp = part->getTp();
    FailureOr<ShardsByRank> perRank = shardsByRank(module, tp);
    if (failed(perRank))
      return signalPassFailure();
    SmallVector<RowMatrix> rowMats = rowMatricesOf(module);
    if (failed(checkRowMatrices(rowMats, *perRank, tp)))
      return signalPassFailure();
    const int64_t firstRowSlot =
        perRank->empty() ? 0 : perRank->front().size();
    SmallVector<SmallVector<int64_t>> rowOffsets(rowMats.size()),
        rowBytes(rowMats.size());

    SmallVector<Attribute> images, slots, keys;
    for (size_t r = 0; r < perRank->size(); ++r) {
      ArrayRef<Fp9FfnOp> shards = (*perRank)[r];
      uint64_t offset = imagePrologueBytes(shards.size() + rowMats.size());
      std::string canon;
      llvm::raw_string_ostream cs(canon);
      cs << "duck-image-v" << DUCK_IMAGE_FORMAT_VERSION << "|fp9-v"
         << DUCK_FP9_FORMAT_VERSION << "|abi-v" << DUCK_ABI_VERSION
         << "|model=" << modelId << "|tp=" << tp << "|rank=" << r
         << "|scale_rows=" << scaleRows;
      FailureOr<uint64_t> end =
          layoutFfnSlots(shards, offset, scaleRows, b, cs);
      if (succeeded(end))
        end = layoutRowSlots(rowMats, r, *end, firstRowSlot, scaleRows,
                             rowOffsets, rowBytes, cs);
      if (failed(end))
        return signalPassFailure();
      images.push_back(b.getI64IntegerAttr(*end));
      slots.push_back(b.getI64IntegerAttr(shards.size() + rowMats.size()));
      keys.push_back(b.getStringAttr(keyHex(canon)));
    }
    for (auto [i, m] : llvm::enumerate(rowMats)) {
      m.op->setAttr(m.attr("duck_slot"),
                    b.getI64IntegerAttr(firstRowSlot + (int64_t)i));
      m.op->setAttr(m.attr("duck_offsets"),
                    b.getDenseI64ArrayAttr(rowOffsets[i]));
      m.op->setAttr(m.attr("duck_bytes"), b.getDenseI64ArrayAttr(rowBytes[i]));
    }
    module->setAttr("duck.image_bytes", b.getArrayAttr(images));
    module->setAttr("duck.slot_count", b.getArrayAttr(slots));
    module->setAttr("duck.model_key", b.getArrayAttr(keys));
  }
};

} // namespace
