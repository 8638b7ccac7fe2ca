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

    // Shards per rank, in layer (program) order: one image a duck, tp of
    // them, whatever shards a duck holds.
    SmallVector<SmallVector<Fp9FfnOp>> perRank(tp);
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
      return signalPassFailure();

    // The LM head on the ducks: one more slot on each, after the FFNs.
    LmHeadOp head;
    module.walk([&](LmHeadOp op) {
      if (op.getDuckRows())
        head = op;
    });
    if (head) {
      if ((int64_t)head.getDuckRows()->size() != tp + 1) {
        head.emitOpError() << "duck_rows has " << head.getDuckRows()->size()
                           << " boundaries for " << tp << " ducks";
        return signalPassFailure();
      }
      for (auto &v : perRank)
        if (v.size() != perRank.front().size()) {
          head.emitOpError("the ducks hold different slot counts, so the "
                           "head slot would have no one index");
          return signalPassFailure();
        }
    }
    const int64_t headSlot = perRank.empty() ? 0 : perRank.front().size();
    SmallVector<int64_t> headOffsets, headBytes;

    SmallVector<Attribute> images, slots, keys;
    for (size_t r = 0; r < perRank.size(); ++r) {
      uint64_t offset =
          imagePrologueBytes(perRank[r].size() + (head ? 1 : 0));
      std::string canon;
      llvm::raw_string_ostream cs(canon);
      cs << "duck-image-v" << DUCK_IMAGE_FORMAT_VERSION << "|fp9-v"
         << DUCK_FP9_FORMAT_VERSION << "|abi-v" << DUCK_ABI_VERSION
         << "|model=" << modelId << "|tp=" << tp << "|rank=" << r
         << "|scale_rows=" << scaleRows;
      for (auto [i, shard] : llvm::enumerate(perRank[r])) {
        auto lay = slotLayout(shard, scaleRows);
        if (failed(lay))
          return signalPassFailure();
        FfnShape s = ffnShapeOf(shard);
        shard.setSlotAttr(b.getI64IntegerAttr(i));
        shard.setOffsetAttr(b.getI64IntegerAttr(offset));
        shard.setBytesAttr(b.getI64IntegerAttr(lay->totalBytes));
        cs << "|slot" << i << ":layer=" << s.layer << ",moe=" << s.moe
           << ",hidden=" << s.hidden << ",inter=" << shard.getInterBegin()
           << "-" << shard.getInterEnd() << ",experts="
           << shard.getExpertBegin() << "-" << shard.getExpertEnd() << "/"
           << s.experts << ",block=" << shard.getBlock()
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
      if (head) {
        ArrayRef<int64_t> rows = *head.getDuckRows();
        ArrayRef<int64_t> shape = head.getWeight().getShape();
        duck_head_slot_layout hl;
        if (duck_compute_head_slot_layout(
                (uint32_t)(rows[r + 1] - rows[r]), (uint32_t)shape[1],
                (uint32_t)*head.getDuckBlock(), (uint32_t)scaleRows, 0,
                &hl) != DUCK_FP9_OK) {
          head.emitOpError() << "duck " << r << ": the head rows have no fp9 "
                                "layout";
          return signalPassFailure();
        }
        headOffsets.push_back(offset);
        headBytes.push_back(hl.total_bytes);
        cs << "|slot" << headSlot << ":head,rows=" << rows[r] << "-"
           << rows[r + 1] << "/" << shape[0] << ",hidden=" << shape[1]
           << ",block=" << *head.getDuckBlock()
           << ",dtype=" << head.getWeight().getDtype();
        offset += hl.total_bytes;
      }
      images.push_back(b.getI64IntegerAttr(offset));
      slots.push_back(
          b.getI64IntegerAttr(perRank[r].size() + (head ? 1 : 0)));
      keys.push_back(b.getStringAttr(keyHex(canon)));
    }
    if (head) {
      head.setDuckSlotAttr(b.getI64IntegerAttr(headSlot));
      head.setDuckOffsetsAttr(b.getDenseI64ArrayAttr(headOffsets));
      head.setDuckBytesAttr(b.getDenseI64ArrayAttr(headBytes));
    }
    module->setAttr("duck.image_bytes", b.getArrayAttr(images));
    module->setAttr("duck.slot_count", b.getArrayAttr(slots));
    module->setAttr("duck.model_key", b.getArrayAttr(keys));
  }
};

} // namespace
