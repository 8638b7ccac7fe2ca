//===- Layout.h - weight-buffer layout and cluster statistics ---*- C++ -*-===//
//
// Shared by duck-layout-weights, duck-stats, the plan emitter and the shard
// writer, so the byte layout is computed in exactly one place (and with the
// same duck_fp9_compute_layout the duck uses).
//===----------------------------------------------------------------------===//
#ifndef DUCK_DIALECT_DUCK_TRANSFORMS_LAYOUT_H
#define DUCK_DIALECT_DUCK_TRANSFORMS_LAYOUT_H

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
  int64_t rowsOf(int64_t rank) const { return rows[rank + 1] - rows[rank]; }
  /// A duck's rows as slices of the weights: rows [row0, row0 + rows) of
  /// `weight`, in slot order.
  struct Piece {
    WeightAttr weight;
    int64_t row0, rows;
  };
  SmallVector<Piece, 4> piecesOf(int64_t rank) const;
};
SmallVector<RowMatrix> rowMatricesOf(ModuleOp module);

/// The head slot of duck `rank`'s rows of `m` (duck_compute_head_slot_pieces:
/// one matrix a piece); DUCK_FP9_OK or the status of the first bad shape.
struct HeadSlotLayout {
  SmallVector<RowMatrix::Piece, 4> pieces;
  SmallVector<duck_fp9_desc, 4> descs;
  SmallVector<uint64_t, 4> offsets; // from the slot's start
  uint64_t totalBytes = 0;
};
duck_fp9_status headSlotLayout(const RowMatrix &m, int64_t rank,
                               int64_t scaleRows, HeadSlotLayout &out);

/// Cluster shape and cost model.
struct ClusterModel {
  double bandwidthGbs = 10.0;  // one duck's streaming read bandwidth
  double stepOverheadUs = 80.0; // dispatch per FFN step
  /// Measured fp9 kernel rate of one duck (duck-bench kernels, all its
  /// cores); when set, a duck's time is its weights / this rate rather
  /// than its bytes / bandwidth.
  double fp9GparamS = 0;
  /// Measured host time a decoded token (attention, norms, router, and the
  /// LM head unless hostReadGbs is given: duckrun's breakdown); the same
  /// for every partition.
  double hostMsPerToken = 0;
  /// The host's read bandwidth (cluster file `host_read_gbs`): when set, an
  /// LM head on the host costs its bytes at this rate, on top of
  /// hostMsPerToken, so the head's placement can be chosen; without a
  /// measured hostMsPerToken the host's other weights (attention, routers)
  /// are timed at this rate too.
  double hostReadGbs = 0;
  /// Bytes a weight of a host LM head (1.125 for --lm-head fp9/int8; 0:
  /// the checkpoint's dtype).
  double hostHeadBytesPerWeight = 0;
  /// Prefill: a duck's fp9 GEMM rate (MACs a second / 1e9, all its cores,
  /// at prompt-chunk sizes: `duck-bench kernels --filter prefill/`), the
  /// rows a prompt step carries, and the host's time a prompt token
  /// (duckrun's summary). Without gemmGmacS no prefill is predicted.
  double gemmGmacS = 0;
  int64_t prefillChunk = 64;
  double hostPrefillMsPerToken = 0;
  /// Host attention over the cache: the host's fp32 multiply-add rate on
  /// such work (MACs a second / 1e9, all its cores: `duckc measure-cluster
  /// --host`) and the context a decoded token attends over; with both, a
  /// token's attention MACs (scores and weighted sums over the cached
  /// positions, DeepSeek-V3.2's indexer scores, and its selection capped at
  /// index_topk) are added to the host's time, each op's no less than its
  /// fp32 cache reads at hostReadGbs when that is given. 0: not counted.
  double hostGmacS = 0;
  int64_t contextTokens = 0;
  /// Per duck (rank order), when the ducks differ: overrides fp9GparamS.
  std::vector<double> duckGparamS;
  /// Per duck (rank order), the measured rate of each kernel class, by
  /// duck_kernel_id (0: not measured; `duckc measure-cluster`'s
  /// fp9_gparam_s_by_kernel). When a duck has them, each of its matrices
  /// is timed at its own class's rate.
  std::vector<std::vector<double>> duckKernelGparamS;
  /// Per duck (rank order), what one GEMV call costs beyond its weights
  /// at the rate (microseconds; `duckc measure-cluster`'s gemv_call_us):
  /// added for every matrix the duck runs in a step (an expert's three,
  /// a row-split matrix's one). Empty: not counted.
  std::vector<double> duckGemvCallUs;
  /// The network: the host's link and each duck's (Gbit/s each way;
  /// cluster file `host_link_gbps`, `ducks[i].link_gbps`, else
  /// `duck_link_gbps`). A step sends every duck the same IB (x as fp32 for
  /// every row, and a MoE step's routing) and gets each duck's OB back (its
  /// partial sums, or its rows of a row-split matrix, fp32): the host's
  /// link carries all of them one after another, a duck's link its own.
  /// 0: not counted (loopback, or not known).
  double hostLinkGbps = 0;
  std::vector<double> duckLinkGbps; // rank order; empty: none known
  /// x crosses the wire as bf16 (duckc --wire-activations bf16): half the
  /// bytes of every IB's activations.
  bool wireBf16 = false;
  /// Cores a duck: its step reply carries a kernel time for each.
  int64_t coresPerDuck = 1;
};

struct DuckStats {
  int64_t rank = 0;
  uint64_t slots = 0, bytes = 0;
  double paramsPerToken = 0; // fp9 weights read per decoded token
  double bytesPerToken = 0;
};

struct ModuleStats {
  int64_t tp = 0, multipleOf = 0, tpMax = 0, ffnLayers = 0;
  std::string strategy;
  std::vector<DuckStats> ducks;
  uint64_t totalBytes = 0;
  /// The sum over FFN layers of each layer's slowest duck (expected, for
  /// expert placement: top_k experts fall unevenly over the ducks).
  double streamMsPerToken = 0, dispatchMsPerToken = 0, tokS = 0;
  double hostMsPerToken = 0;
  /// The LM head on the ducks (lm-head=ducks): its slowest duck a token,
  /// included in streamMsPerToken (and one more step in the dispatch).
  bool lmHeadOnDucks = false;
  double lmHeadMsPerToken = 0;
  /// Attention output projections on the ducks (o-proj=ducks): the sum
  /// over layers of each one's slowest duck, in streamMsPerToken (one more
  /// step a layer in the dispatch); the host then reads none of them.
  bool oProjOnDucks = false;
  double oProjMsPerToken = 0;
  /// The same for the query projections (q-proj=ducks).
  bool qProjOnDucks = false;
  double qProjMsPerToken = 0;
  /// The same for the input projections (in-proj=ducks).
  bool inProjOnDucks = false;
  double inProjMsPerToken = 0;
  int64_t attnProjSteps = 0; ///< duck steps of all three, a token
  /// The LM head on the host (ClusterModel::hostReadGbs set): its bytes at
  /// the host's bandwidth, included in hostMsPerToken.
  double hostLmHeadMsPerToken = 0;
  /// The host's own weights a token (attention, MLA, indexer, routers) as
  /// the runtime reads them, and, with hostReadGbs but no measured
  /// hostMsPerToken, their time at that bandwidth (in hostMsPerToken).
  double hostWeightBytesPerToken = 0, hostOpsMsPerToken = 0;
  /// Host attention over contextTokens of cache (ClusterModel::hostGmacS,
  /// and hostReadGbs for the cache's reads): MACs and cache bytes a token
  /// and their time (each op the slower of the two), included in
  /// hostMsPerToken.
  double hostAttnGmacPerToken = 0, hostAttnMsPerToken = 0;
  double hostAttnCacheBytesPerToken = 0;
  /// Prefill (ClusterModel::gemmGmacS set): each FFN layer's slowest duck
  /// over a prompt chunk (and each projection on the ducks), plus a step
  /// each, a prompt token; the token rate with the host's part added.
  double prefillDucksMsPerToken = 0, prefillTokS = 0;
  /// The wire a decoded token: bytes the host sends (every step's frame to
  /// every duck) and receives, and their time over the links
  /// (ClusterModel::hostLinkGbps / duckLinkGbps; 0 when neither is given),
  /// included in the token's time. Prefill's, a prompt token, is in
  /// prefillDucksMsPerToken.
  double hostTxBytesPerToken = 0, hostRxBytesPerToken = 0;
  double networkMsPerToken = 0, prefillNetworkMsPerToken = 0;
  /// Each FFN layer: its strategy, its part of streamMsPerToken (the
  /// expected slowest duck), and the bytes of it each duck holds (its
  /// slot). What --strategy auto weighs layer by layer.
  struct FfnLayer {
    int64_t layer = 0;
    bool moe = false;
    Strategy strategy = Strategy::intermediate;
    double ms = 0;
    std::vector<uint64_t> duckBytes;
  };
  std::vector<FfnLayer> ffn;
};

/// The links a cost model counts, in words ("the host's link 10.00 Gb/s,
/// 2.50 Gb/s a duck"); empty when none is given.
std::string linksText(const ClusterModel &c);

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
