//===- Layout.h - weight-buffer layout and cluster statistics ---*- C++ -*-===//
//
// Shared by duck-layout-weights, duck-stats, the plan emitter and the shard
// writer, so the byte layout is computed in exactly one place (and with the
// same duck_fp9_compute_layout the duck uses).
//===----------------------------------------------------------------------===//
#ifndef DUCK_DIALECT_DUCK_TRANSFORMS_LAYOUT_H
#define DUCK_DIALECT_DUCK_TRANSFORMS_LAYOUT_H

#include "duck/CostModel/CostModel.h"
#include "duck/Dialect/Duck/IR/DuckOps.h"
#include "duck_rt/abi.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/JSON.h"

#include <optional>
#include <vector>

namespace mlir::duck {

/// Rows of the source sharing one block scale (FP8 tile rows, else 128).
int64_t scaleRowsOf(ModuleOp module);

/// The module attribute duck-partition sets (#duck.partition).
inline constexpr llvm::StringLiteral kPartitionAttrName = "duck.partition";

/// The module's partition; an error naming `who` when duck-partition has
/// not run.
FailureOr<PartitionAttr> partitionOf(ModuleOp module, llvm::StringRef who);

/// How each MoE layer is split, from a strategy spec: `intermediate`,
/// `experts`, or a comma-separated list of `STRATEGY` (every MoE layer) and
/// `STRATEGY:FIRST-LAST` / `STRATEGY:LAYER` items (those layers), later
/// items overriding earlier ones: "intermediate,experts:3-30". Dense layers
/// are always split by intermediate; a range naming one with experts is an
/// error of duck-partition's, which knows the layers.
struct StrategySpec {
  struct Range {
    int64_t first, last;
    Strategy strategy;
  };
  Strategy every = Strategy::intermediate;
  std::vector<Range> ranges;
  Strategy of(int64_t layer) const {
    Strategy s = every;
    for (const Range &r : ranges)
      if (layer >= r.first && layer <= r.last)
        s = r.strategy;
    return s;
  }
};

/// Parses a strategy spec; the error names the item that is wrong.
llvm::Expected<StrategySpec> parseStrategySpec(llvm::StringRef spec);

/// The spec of per-layer choices, shortest first: the strategy most layers
/// take, then runs of the others ("experts,intermediate:0-11").
std::string
strategySpecOf(const std::vector<std::pair<int64_t, Strategy>> &layers);

/// The hidden size, total experts and FFN kind of the op owning `shard`.
struct FfnShape {
  int64_t layer, hidden, inter, experts;
  bool moe;
};
FfnShape ffnShapeOf(Fp9FfnOp shard);

/// Where expert `e`'s gate/up rows start in their scale tiles: the
/// shard's first intermediate row, plus for a shared expert (id >= the
/// routed experts) its piece's start in the shared FFN, (id - routed) x
/// inter, modulo scaleRows.
uint32_t expertRowPhase(Fp9FfnOp shard, int64_t e, int64_t scaleRows);

/// Packed-matrix descriptors of one shard's gate/up/down for one expert:
/// `expert`'s own row phase when given, else the phase the slot's layout
/// is sized for (the same byte sizes).
struct ShardDescs {
  duck_fp9_desc gate, up, down;
};
ShardDescs shardDescs(Fp9FfnOp shard, int64_t scaleRows,
                      std::optional<int64_t> expert = std::nullopt);

/// Byte layout of one slot: header + descriptor table, then each present
/// expert's gate, up, down matrices at 64-byte aligned offsets.
struct SlotLayout {
  uint64_t tableBytes = 0;  // slot header + duck_ffn_desc[experts]
  uint64_t expertBytes = 0; // gate + up + down of one expert
  uint64_t gateOffset = 0, upOffset = 0, downOffset = 0; // within an expert
  uint64_t totalBytes = 0;  // aligned to DUCK_IMAGE_ALIGN
  /// Offset of expert `e`'s first matrix within the slot (present experts
  /// are stored in id order).
  uint64_t expertOffset(int64_t localIndex) const {
    return tableBytes + (uint64_t)localIndex * expertBytes;
  }
};
FailureOr<SlotLayout> slotLayout(Fp9FfnOp shard, int64_t scaleRows);

/// Bytes of the image header plus the slot table, aligned.
uint64_t imagePrologueBytes(uint64_t slotCount);

/// Matrices whose rows duck-partition split over the ducks (abi.h head
/// slot: a duck's rows of one or more [rows_i, K] matrices, concatenated):
/// an attention's input projections (in-proj=ducks), its query projection
/// (q-proj=ducks), its o_proj (o-proj=ducks) or the LM head
/// (lm-head=ducks). Its slot follows the FFN slots, at the same index on
/// every duck: each attention's input, query, then output projections in
/// program order, then the head.
struct RowMatrix {
  Operation *op;
  SmallVector<WeightAttr, 4> weights; // [rows_i, K] each, rows concatenated
  ArrayRef<int64_t> rows;   // tp + 1 boundaries in the concatenated rows
  int64_t block;            // K-block (duck_block)
  bool head;                // the LM head (else an attention projection)
  /// Its attributes' prefix on `op`: "" (o_proj, the head), "q_" (an
  /// attention's query projection) or "in_" (its input projections).
  llvm::StringRef prefix;
  std::string attr(llvm::StringRef name) const {
    return (prefix + name).str();
  }
  llvm::StringRef role() const {
    return head ? "head"
           : prefix.empty() ? "o_proj"
           : prefix == "q_" ? "q_proj"
                            : "in_proj";
  }
  /// Slot-table layer: the attention's layer, or `numLayers` for the head.
  int64_t layer(int64_t numLayers) const;
  int64_t k() const { return weights.front().getShape()[1]; }
  int64_t totalRows() const;
  /// mla-absorb=ducks (AttentionOp absorb_heads): the slot is a chain of
  /// pieces by whole heads (piecesOf); empty: a plain row split.
  ArrayRef<int64_t> absorbHeads, absorbIndexRows;
  AttentionOp::MlaDims mla;
  bool absorbed() const { return !absorbHeads.empty(); }
  /// A duck's rows of the slot (its pieces' rows), its K (x's width in its
  /// IB) and the first of its rows its OB carries.
  int64_t rowsOf(int64_t rank) const;
  int64_t kOf(int64_t rank) const;
  int64_t obBeginOf(int64_t rank) const;
  /// A duck's rows as slices of the weights, in slot order: rows [row0,
  /// row0 + rows) and columns [col0, col0 + k) of `weight` (k 0: all its
  /// columns), or, with `head` >= 0, W_UK^T of that head (kv_b_proj's
  /// head rows [head * (nope + v), + nope) transposed: kv_lora rows of K
  /// nope); each reading `input` (duck_head_input | offset).
  struct Piece {
    WeightAttr weight;
    int64_t row0, rows;
    int64_t col0 = 0, k = 0, head = -1;
    uint32_t input = 0;
  };
  SmallVector<Piece, 4> piecesOf(int64_t rank) const;
};
SmallVector<RowMatrix> rowMatricesOf(ModuleOp module);

/// The head slot of duck `rank`'s rows of `m` (duck_compute_head_slot_pieces_k:
/// one matrix a piece); DUCK_FP9_OK or the status of the first bad shape.
struct HeadSlotLayout {
  SmallVector<RowMatrix::Piece, 4> pieces;
  SmallVector<duck_fp9_desc, 4> descs;
  SmallVector<uint64_t, 4> offsets; // from the slot's start
  uint64_t totalBytes = 0;
};
duck_fp9_status headSlotLayout(const RowMatrix &m, int64_t rank,
                               int64_t scaleRows, HeadSlotLayout &out);

/// What a laid-out module holds and what the cost model
/// (duck/CostModel/CostModel.h) predicts for it.
struct DuckStats {
  int64_t rank = 0;
  uint64_t slots = 0, bytes = 0;
};

struct ModuleStats : cost::PlanCost {
  int64_t tp = 0, multipleOf = 0, tpMax = 0, ffnLayers = 0;
  /// FFN layers of DeepSeek's MTP module (in the images, not in ffnLayers
  /// or a token's cost).
  int64_t mtpFfnLayers = 0;
  std::string strategy;
  std::vector<DuckStats> ducks;
  uint64_t totalBytes = 0;
  /// Each FFN layer and its strategy; its cost (part of streamMsPerToken,
  /// each duck's bytes of it) is `layers` at the same index. What
  /// --strategy auto weighs layer by layer.
  struct FfnLayer {
    int64_t layer = 0;
    bool moe = false;
    Strategy strategy = Strategy::intermediate;
  };
  std::vector<FfnLayer> ffn;
};

/// The strategy spec that cuts the MoE layers as `s` says they are
/// ("intermediate,experts:3-30"; the module's strategy when it has none).
std::string strategySpecOf(const ModuleStats &s);

/// Requires a laid-out module (duck-layout-weights ran).
FailureOr<ModuleStats> computeStats(ModuleOp module, const ClusterModel &c);
void printStatsText(const ModuleStats &s, const ClusterModel &c,
                    llvm::raw_ostream &os);
llvm::json::Object statsToJson(const ModuleStats &s, const ClusterModel &c);

} // namespace mlir::duck

#endif
