//===- Layout.cpp - weight-buffer layout and cluster statistics -----------===//
#include "duck/Dialect/Duck/Transforms/Layout.h"
#include "duck_rt/slot_layout.h"

#include <algorithm>

#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace mlir::duck;

int64_t mlir::duck::scaleRowsOf(ModuleOp module) {
  if (auto a = module->getAttrOfType<IntegerAttr>("duck.scale_rows"))
    return a.getInt();
  return 128;
}

FfnShape mlir::duck::ffnShapeOf(Fp9FfnOp shard) {
  Operation *parent = shard->getParentOp();
  if (auto mlp = dyn_cast<MlpOp>(parent))
    return {(int64_t)mlp.getLayer(), (int64_t)mlp.getHidden(),
            (int64_t)mlp.getInter(), 1, false};
  auto moe = cast<MoeOp>(parent);
  return {(int64_t)moe.getLayer(), (int64_t)moe.getHidden(),
          (int64_t)moe.getInter(), moe.getTotalExperts(), true};
}

uint32_t mlir::duck::expertRowPhase(Fp9FfnOp shard, int64_t e,
                                    int64_t scaleRows) {
  int64_t row0 = (int64_t)shard.getInterBegin();
  if (auto moe = dyn_cast<MoeOp>(shard->getParentOp()))
    if (e >= (int64_t)moe.getNumExperts())
      row0 += (e - (int64_t)moe.getNumExperts()) * (int64_t)moe.getInter();
  return (uint32_t)(row0 % scaleRows);
}

/// The shard's slot in duck-rt's terms (duck_rt/slot_layout.h). Every
/// expert of a slot gets the same bytes, so the slot is laid out with the
/// row phase of its held experts whose rows span the most scale tiles (the
/// shared experts' pieces may start inside a tile when the expert
/// intermediate is not a multiple of the tile); each expert's descriptor
/// then carries its own phase (shardDescs with the expert).
static duck_slot_shape slotShapeOf(Fp9FfnOp shard, int64_t scaleRows) {
  FfnShape s = ffnShapeOf(shard);
  const int64_t inter = (int64_t)shard.getLocalInter();
  auto tiles = [&](uint32_t phase) {
    return (phase + inter + scaleRows - 1) / scaleRows;
  };
  // The routed experts (below the MoE's count) all start at the shard's own
  // row, so they share one phase: only the shared experts' are looked at
  // one by one (the search lays out every candidate's shards: 257 experts a
  // DeepSeek shard made this loop an eighth of its time).
  const int64_t begin = (int64_t)shard.getExpertBegin(),
                end = (int64_t)shard.getExpertEnd();
  int64_t routedEnd = end;
  if (auto moe = dyn_cast<MoeOp>(shard->getParentOp()))
    routedEnd = std::min(end, (int64_t)moe.getNumExperts());
  uint32_t phase = expertRowPhase(shard, begin, scaleRows);
  for (int64_t e = std::max(begin + 1, routedEnd); e < end; ++e) {
    const uint32_t p = expertRowPhase(shard, e, scaleRows);
    if (tiles(p) > tiles(phase))
      phase = p;
  }
  return duck_slot_shape{(uint32_t)s.hidden,
                         (uint32_t)inter,
                         (uint32_t)shard.getBlock(),
                         (uint32_t)scaleRows,
                         phase,
                         (uint32_t)s.experts,
                         (uint32_t)shard.getLocalExperts()};
}

ShardDescs mlir::duck::shardDescs(Fp9FfnOp shard, int64_t scaleRows,
                                  std::optional<int64_t> expert) {
  const duck_slot_shape sh = slotShapeOf(shard, scaleRows);
  duck_fp9_desc gate{sh.local_inter, sh.hidden, sh.block, sh.scale_rows,
                     expert ? expertRowPhase(shard, *expert, scaleRows)
                            : sh.row_phase};
  duck_fp9_desc down{sh.hidden, sh.local_inter, sh.block, sh.scale_rows, 0};
  return {gate, gate, down};
}

FailureOr<SlotLayout> mlir::duck::slotLayout(Fp9FfnOp shard,
                                             int64_t scaleRows) {
  const duck_slot_shape sh = slotShapeOf(shard, scaleRows);
  duck_slot_layout sl;
  if (duck_compute_slot_layout(&sh, &sl) != DUCK_FP9_OK) {
    shard.emitOpError("has no valid fp9 layout (block/shape mismatch)");
    return failure();
  }
  SlotLayout l;
  l.tableBytes = sl.table_bytes;
  l.gateOffset = 0;
  l.upOffset = sl.up_offset;
  l.downOffset = sl.down_offset;
  l.expertBytes = sl.expert_bytes;
  l.totalBytes = sl.total_bytes;
  return l;
}

uint64_t mlir::duck::imagePrologueBytes(uint64_t slotCount) {
  return llvm::alignTo(DUCK_IMAGE_HEADER_BYTES +
                           slotCount * sizeof(duck_slot_entry),
                       DUCK_IMAGE_ALIGN);
}

int64_t mlir::duck::RowMatrix::layer(int64_t numLayers) const {
  if (auto a = dyn_cast<AttentionOp>(op))
    return (int64_t)a.getLayer();
  return numLayers;
}

int64_t mlir::duck::RowMatrix::totalRows() const {
  int64_t n = 0;
  for (WeightAttr w : weights)
    n += w.getShape()[0];
  return n;
}

namespace {
/// An absorbed query slot (RowMatrix::absorbHeads): its heads' q_b_proj rows,
/// its share of the indexer's wq_b rows, then W_UK^T of each head, chained
/// on that head's q_nope rows.
SmallVector<RowMatrix::Piece, 4> absorbedQuery(const RowMatrix &m,
                                               int64_t rank) {
  SmallVector<RowMatrix::Piece, 4> out;
  const int64_t h0 = m.absorbHeads[rank], h1 = m.absorbHeads[rank + 1];
  const int64_t qk = m.mla.qk();
  out.push_back({m.weights[0], h0 * qk, (h1 - h0) * qk, 0, 0, -1, 0});
  if (!m.absorbIndexRows.empty() && m.weights.size() > 1) {
    const int64_t i0 = m.absorbIndexRows[rank],
                  i1 = m.absorbIndexRows[rank + 1];
    if (i1 > i0)
      out.push_back({m.weights[1], i0, i1 - i0, 0, 0, -1, 0});
  }
  auto kvb =
      cast<AttentionOp>(m.op).getWeights().getAs<WeightAttr>("kv_b_proj");
  for (int64_t h = h0; h < h1; ++h)
    out.push_back({kvb, 0, m.mla.kvLora, 0, m.mla.nope, h,
                   DUCK_HEAD_INPUT_RESULTS | uint32_t((h - h0) * qk)});
  return out;
}

/// An absorbed output slot: W_UV of each head (kv_b_proj's v rows of the
/// head, on its latent output in x), then its heads' o_proj columns on
/// their results; the OB carries those (partial sums of the hidden). A
/// GQA's by heads (o-proj=heads): its heads' o_proj columns on x.
SmallVector<RowMatrix::Piece, 4> absorbedOutput(const RowMatrix &m,
                                                int64_t rank) {
  SmallVector<RowMatrix::Piece, 4> out;
  const int64_t h0 = m.absorbHeads[rank], h1 = m.absorbHeads[rank + 1];
  const AttentionOp::MlaDims &d = m.mla;
  if (d.heads == 0) {
    const WeightAttr o = m.weights[0];
    const int64_t dim = cast<AttentionOp>(m.op).getHeadDim();
    out.push_back({o, 0, o.getShape()[0], h0 * dim, (h1 - h0) * dim, -1,
                   DUCK_HEAD_INPUT_X | 0u});
    return out;
  }
  auto kvb =
      cast<AttentionOp>(m.op).getWeights().getAs<WeightAttr>("kv_b_proj");
  for (int64_t h = h0; h < h1; ++h)
    out.push_back({kvb, h * (d.nope + d.v) + d.nope, d.v, 0, d.kvLora, -1,
                   DUCK_HEAD_INPUT_X | uint32_t((h - h0) * d.kvLora)});
  const WeightAttr o = m.weights[0];
  out.push_back({o, 0, o.getShape()[0], h0 * d.v, (h1 - h0) * d.v, -1,
                 DUCK_HEAD_INPUT_RESULTS | 0u});
  return out;
}
} // namespace

int64_t mlir::duck::RowMatrix::rowsOf(int64_t rank) const {
  if (!absorbed())
    return rows[rank + 1] - rows[rank];
  int64_t n = 0;
  for (const Piece &p : piecesOf(rank))
    n += p.rows;
  return n;
}

int64_t mlir::duck::RowMatrix::kOf(int64_t rank) const {
  if (absorbed() && prefix.empty())
    return (absorbHeads[rank + 1] - absorbHeads[rank]) *
           (mla.heads ? mla.kvLora : cast<AttentionOp>(op).getHeadDim());
  return k();
}

int64_t mlir::duck::RowMatrix::obBeginOf(int64_t rank) const {
  if (absorbed() && prefix.empty())
    return (absorbHeads[rank + 1] - absorbHeads[rank]) * mla.v;
  return 0;
}

SmallVector<RowMatrix::Piece, 4>
mlir::duck::RowMatrix::piecesOf(int64_t rank) const {
  if (absorbed())
    return prefix.empty() ? absorbedOutput(*this, rank)
                          : absorbedQuery(*this, rank);
  SmallVector<Piece, 4> out;
  const int64_t b = rows[rank], e = rows[rank + 1];
  int64_t at = 0; // the weight's first row in the concatenation
  for (WeightAttr w : weights) {
    const int64_t n = w.getShape()[0];
    const int64_t lo = std::max(b, at), hi = std::min(e, at + n);
    if (lo < hi)
      out.push_back({w, lo - at, hi - lo, 0, 0, -1, 0});
    at += n;
  }
  return out;
}

duck_fp9_status mlir::duck::headSlotLayout(const RowMatrix &m, int64_t rank,
                                           int64_t scaleRows,
                                           HeadSlotLayout &out) {
  out.pieces = m.piecesOf(rank);
  SmallVector<uint32_t, 4> rows, ks, phase;
  for (const RowMatrix::Piece &p : out.pieces) {
    rows.push_back((uint32_t)p.rows);
    ks.push_back((uint32_t)(p.k ? p.k : m.k()));
    // W_UK^T's rows are kv_b_proj's columns: their tiles start at 0.
    phase.push_back(p.head >= 0 ? 0u : (uint32_t)(p.row0 % scaleRows));
  }
  out.descs.resize(rows.size());
  out.offsets.resize(rows.size());
  return duck_compute_head_slot_pieces_k(
      (uint32_t)rows.size(), rows.data(), ks.data(), phase.data(),
      (uint32_t)m.k(), (uint32_t)m.block, (uint32_t)scaleRows, out.descs.data(),
      out.offsets.data(), &out.totalBytes);
}

SmallVector<RowMatrix> mlir::duck::rowMatricesOf(ModuleOp module) {
  SmallVector<RowMatrix> out;
  module.walk([&](AttentionOp a) {
    if (a.getInDuckRows() && a.getInDuckBlock())
      out.push_back({a,
                     a.getInProjs(),
                     *a.getInDuckRows(),
                     (int64_t)*a.getInDuckBlock(),
                     /*head=*/false,
                     "in_",
                     {},
                     {},
                     {}});
    auto absorb = [&](RowMatrix &m) {
      // A GQA's heads split only its o_proj (o-proj=heads).
      if (!a.getAbsorbHeads() ||
          (!m.prefix.empty() && a.getMlaDims().heads == 0))
        return;
      m.absorbHeads = *a.getAbsorbHeads();
      if (a.getAbsorbIndexRows())
        m.absorbIndexRows = *a.getAbsorbIndexRows();
      m.mla = a.getMlaDims();
    };
    if (a.getQDuckRows() && a.getQDuckBlock()) {
      out.push_back({a,
                     a.getQProjs(),
                     *a.getQDuckRows(),
                     (int64_t)*a.getQDuckBlock(),
                     /*head=*/false,
                     "q_",
                     {},
                     {},
                     {}});
      absorb(out.back());
    }
    if (a.getDuckRows() && a.getDuckBlock()) {
      out.push_back({a,
                     {a.getOProj()},
                     *a.getDuckRows(),
                     (int64_t)*a.getDuckBlock(),
                     /*head=*/false,
                     "",
                     {},
                     {},
                     {}});
      absorb(out.back());
    }
  });
  module.walk([&](LmHeadOp h) {
    if (h.getDuckRows() && h.getDuckBlock())
      out.push_back({h,
                     {h.getWeight()},
                     *h.getDuckRows(),
                     (int64_t)*h.getDuckBlock(),
                     /*head=*/true,
                     "",
                     {},
                     {},
                     {}});
  });
  return out;
}

FailureOr<PartitionAttr> mlir::duck::partitionOf(ModuleOp module,
                                                  llvm::StringRef who) {
  if (auto p = module->getAttrOfType<PartitionAttr>(kPartitionAttrName))
    return p;
  module.emitError() << who << " needs a partitioned module (a "
                     << kPartitionAttrName
                     << " = #duck.partition<...> attribute): run "
                        "duck-partition first";
  return failure();
}

namespace {

/// The partition and each duck's image, as duck-layout-weights left them.
LogicalResult readLayout(ModuleOp module, ModuleStats &st) {
  auto bytesAttr = module->getAttrOfType<ArrayAttr>("duck.image_bytes");
  auto slotsAttr = module->getAttrOfType<ArrayAttr>("duck.slot_count");
  if (!bytesAttr || !slotsAttr) {
    module.emitError("duck-stats needs a laid-out module: run "
                     "duck-layout-weights first");
    return failure();
  }
  FailureOr<PartitionAttr> part = partitionOf(module, "duck-stats");
  if (failed(part))
    return failure();
  st.tp = part->getTp();
  st.multipleOf = part->getMultipleOf();
  st.tpMax = part->getTpMax();
  st.strategy = stringifyStrategy(part->getStrategy()).str();
  if ((int64_t)bytesAttr.size() != st.tp || (int64_t)slotsAttr.size() != st.tp) {
    module.emitError() << "duck-stats: the layout has " << bytesAttr.size()
                       << " images for a partition of tp = " << st.tp;
    return failure();
  }
  st.ducks.resize(st.tp);
  for (int64_t r = 0; r < st.tp; ++r) {
    st.ducks[r].rank = r;
    st.ducks[r].bytes = cast<IntegerAttr>(bytesAttr[r]).getInt();
    st.ducks[r].slots = cast<IntegerAttr>(slotsAttr[r]).getInt();
    st.totalBytes += st.ducks[r].bytes;
  }
  return success();
}

cost::Matrix matrixOf(const duck_fp9_desc &d) {
  return {d.rows, d.k, d.block};
}

double hostBytesPerWeight(WeightAttr w, double fp8);

/// An FFN layer's shapes and its shards as laid out (a shard without a
/// valid layout, already reported, is left out); a MoE layer's router at
/// the host's bytes a weight (`fp8` for FP8).
cost::FfnLayer ffnFactsOf(Operation *op, int64_t scaleRows, double fp8) {
  cost::FfnLayer l;
  if (auto moe = dyn_cast<MoeOp>(op)) {
    l.moe = true;
    WeightAttr router = moe.getRouterWeight();
    l.routerHostBytes = hostBytesPerWeight(router, fp8);
    for (int64_t d : router.getShape())
      l.routerHostBytes *= double(d);
    l.hidden = moe.getHidden();
    l.topK = moe.getTopK();
    l.numExperts = moe.getNumExperts();
    l.numShared = moe.getNumShared();
  } else {
    l.hidden = cast<MlpOp>(op).getHidden();
  }
  for (Operation &child : op->getRegion(0).getOps()) {
    auto shard = cast<Fp9FfnOp>(child);
    auto lay = slotLayout(shard, scaleRows);
    if (failed(lay))
      continue;
    ShardDescs ds = shardDescs(shard, scaleRows);
    cost::FfnShard s;
    s.rank = shard.getRank();
    s.expertBegin = shard.getExpertBegin();
    s.expertEnd = shard.getExpertEnd();
    s.localInter = shard.getLocalInter();
    s.gate = matrixOf(ds.gate);
    s.up = matrixOf(ds.up);
    s.down = matrixOf(ds.down);
    s.expertBytes = lay->expertBytes;
    s.slotBytes = lay->totalBytes;
    l.shards.push_back(s);
  }
  return l;
}

/// An absorbed (chained) slot's cost facts: its pieces' weights beyond
/// rows x k; the output step's IB (its heads' latent outputs) and OB (the
/// rows from ob_begin: partial sums of the hidden vector).
void addChain(const RowMatrix &m, cost::RowSplit &r) {
  const int64_t tp = (int64_t)r.rows.size();
  r.extraParams.assign(tp, 0);
  for (int64_t rank = 0; rank < tp; ++rank) {
    double params = 0;
    for (const RowMatrix::Piece &p : m.piecesOf(rank))
      params += double(p.rows) * double(p.k ? p.k : m.k());
    r.extraParams[rank] = params - double(r.rows[rank]) * double(r.k);
  }
  if (!m.prefix.empty())
    return;
  r.partialSums = true;
  for (int64_t rank = 0; rank < tp; ++rank) {
    r.inWidth.push_back(m.kOf(rank));
    r.outWidth.push_back(m.rowsOf(rank) - m.obBeginOf(rank));
  }
}

/// The row-split matrices on the ducks, in slot order.
/// Which ops a ModelFacts takes: the main program's, or the MTP module's
/// (the LM head is in both: it projects the module's rows too).
using OpFilter = llvm::function_ref<bool(Operation *)>;

std::vector<cost::RowSplit> rowSplitsOf(ModuleOp module, int64_t tp,
                                        OpFilter keep) {
  std::vector<cost::RowSplit> out;
  for (const RowMatrix &m : rowMatricesOf(module)) {
    if ((int64_t)m.rows.size() != tp + 1 || (!m.head && !keep(m.op)))
      continue;
    cost::RowSplit r;
    r.role = m.head             ? cost::RowSplit::Role::head
             : m.prefix.empty() ? cost::RowSplit::Role::oProj
             : m.prefix == "in_" ? cost::RowSplit::Role::inProj
                                 : cost::RowSplit::Role::qProj;
    r.k = m.k();
    r.block = m.block;
    for (int64_t rank = 0; rank < tp; ++rank)
      r.rows.push_back(m.rowsOf(rank));
    if (auto a = m.op->getAttrOfType<DenseI64ArrayAttr>(m.attr("duck_bytes")))
      for (int64_t b : a.asArrayRef())
        r.bytes.push_back((uint64_t)b);
    if (m.absorbed())
      addChain(m, r);
    out.push_back(std::move(r));
  }
  return out;
}

/// A weight's bytes as the host runtime reads it: FP8 (with block scales)
/// at `fp8` bytes a weight (ClusterModel::hostFp8BytesPerWeight: e4m3's
/// 1, duckrun's default, or fp9's 1.125), the rest as stored.
double hostBytesPerWeight(WeightAttr w, double fp8) {
  Type t = w.getDtype();
  return w.getScale()       ? fp8
         : t.isIntOrFloat() ? t.getIntOrFloatBitWidth() / 8.0
                            : 2.0;
}

/// The host's own weights a token (attention, MLA and its indexer, the
/// MoE routers) and those of them that went to the ducks.
void addHostWeights(ModuleOp module, cost::ModelFacts &f, OpFilter keep,
                    double fp8) {
  auto hostBytesOf = [fp8](WeightAttr w) {
    double params = 1;
    for (int64_t d : w.getShape())
      params *= double(d);
    return params * hostBytesPerWeight(w, fp8);
  };
  auto addDict = [&](DictionaryAttr d) {
    if (d)
      for (NamedAttribute nv : d)
        if (auto w = dyn_cast<WeightAttr>(nv.getValue()))
          f.hostWeightBytes += hostBytesOf(w);
  };
  module.walk([&](Operation *op) {
    if (!keep(op))
      return;
    if (auto in = dyn_cast<MtpInputOp>(op)) {
      for (WeightAttr w : {in.getEnorm(), in.getHnorm(), in.getEhProj()})
        f.hostWeightBytes += hostBytesOf(w);
    } else if (auto a = dyn_cast<AttentionOp>(op)) {
      addDict(a.getWeights());
      addDict(a.getIndexerAttr());
      if (a.getAbsorbHeads() && a.getMlaDims().heads > 0) { // kv_b_proj too
        const double kvb =
            hostBytesOf(a.getWeights().getAs<WeightAttr>("kv_b_proj"));
        f.hostWeightBytes -= kvb;
        f.onDucksHostBytes += kvb;
        f.absorbedHostBytes += kvb;
      }
      if (a.getDuckRows()) { // its o_proj is on the ducks
        f.hostWeightBytes -= hostBytesOf(a.getOProj());
        f.onDucksHostBytes += hostBytesOf(a.getOProj());
      }
      SmallVector<WeightAttr, 8> moved;
      if (a.getQDuckRows()) // its query projection is on the ducks
        llvm::append_range(moved, a.getQProjs());
      if (a.getInDuckRows()) { // and its input projections
        llvm::append_range(moved, a.getInProjs());
        // The indexer's weights_proj runs while they are on the ducks.
        if (DictionaryAttr ix = a.getIndexerAttr())
          if (auto wp = ix.getAs<WeightAttr>("weights_proj"))
            f.overlappedHostBytes.push_back(hostBytesOf(wp));
      }
      else if (a.getIndexerAttr()) // the indexer reads q_a_proj again
        if (auto qa = a.getWeights().getAs<WeightAttr>("q_a_proj"))
          f.hostWeightBytes += hostBytesOf(qa);
      for (WeightAttr w : moved) {
        f.hostWeightBytes -= hostBytesOf(w);
        f.onDucksHostBytes += hostBytesOf(w);
      }
    } else if (auto m = dyn_cast<MoeOp>(op)) {
      f.hostWeightBytes += hostBytesOf(m.getRouterWeight());
    }
  });
}

/// Each attention's shape over the cache (an MLA without its kv
/// projections is left out).
std::vector<cost::Attention> attentionFactsOf(ModuleOp module, OpFilter keep) {
  std::vector<cost::Attention> out;
  module.walk([&](AttentionOp a) {
    if (!keep(a))
      return;
    cost::Attention f;
    f.heads = double(a.getNumHeads());
    if (a.getKind() == "gqa") {
      f.headDim = double(a.getHeadDim());
      f.kvHeads = double(a.getNumKvHeads());
      out.push_back(f);
      return;
    }
    auto kvb = a.getWeights().getAs<WeightAttr>("kv_b_proj");
    auto kva = a.getWeights().getAs<WeightAttr>("kv_a_proj_with_mqa");
    if (!kvb || !kva)
      return;
    f.gqa = false;
    f.kvLora = double(kvb.getShape()[1]);
    f.rope = double(kva.getShape()[0]) - f.kvLora;
    if (auto qa = a.getWeights().getAs<WeightAttr>("q_a_proj"))
      f.qLora = double(qa.getShape()[0]);
    if (DictionaryAttr idx = a.getIndexerAttr()) {
      auto geti = [&](StringRef k) {
        auto v = idx.getAs<IntegerAttr>(k);
        return v ? double(v.getInt()) : 0.0;
      };
      f.indexer = true;
      f.indexHeads = geti("n_heads");
      f.indexDim = geti("head_dim");
      f.indexTopK = geti("topk");
    }
    out.push_back(f);
  });
  return out;
}

/// The facts of the ops `keep` takes (the host's FP8 matrices at `fp8`
/// bytes a weight); their FFN layers' ids and strategies into `st` when
/// given.
cost::ModelFacts factsOf(ModuleOp module, int64_t tp, OpFilter keep, double fp8,
                         ModuleStats *st) {
  cost::ModelFacts f;
  f.tp = tp;
  const int64_t scaleRows = scaleRowsOf(module);
  module.walk([&](Operation *op) {
    if (!isa<MlpOp, MoeOp>(op) || !keep(op))
      return;
    if (st) {
      ModuleStats::FfnLayer rec;
      rec.layer = cast<IntegerAttr>(op->getAttr("layer")).getInt();
      rec.moe = isa<MoeOp>(op);
      if (auto sa = op->getAttrOfType<StrategyAttr>("strategy"))
        rec.strategy = sa.getValue();
      st->ffn.push_back(rec);
    }
    f.ffn.push_back(ffnFactsOf(op, scaleRows, fp8));
  });
  f.rowSplits = rowSplitsOf(module, tp, keep);
  f.attention = attentionFactsOf(module, keep);
  addHostWeights(module, f, keep, fp8);
  module.walk([&](LmHeadOp head) {
    ArrayRef<int64_t> shape = head.getWeight().getShape();
    f.lmHead = cost::ModelFacts::LmHead{
        double(shape[0]) * shape[1], hostBytesPerWeight(head.getWeight(), fp8)};
  });
  return f;
}

/// Everything the cost model reads of a laid-out module; the FFN layers'
/// ids and strategies into `st`. DeepSeek's MTP module (the ops of layers
/// past the model's last) goes apart, into ModelFacts::mtp: a plan's
/// token does not run it, a speculative step does.
cost::ModelFacts costFactsOf(ModuleOp module, ModuleStats &st, double fp8) {
  int64_t numLayers = INT64_MAX;
  module.walk([&](ModelOp m) {
    if (auto n = m.getConfig().getAs<IntegerAttr>("num_layers"))
      numLayers = n.getInt();
  });
  auto mtp = [&](Operation *op) {
    if (isa<MtpInputOp>(op))
      return true;
    auto l = op->getAttrOfType<IntegerAttr>("layer");
    return l && l.getInt() >= numLayers;
  };
  cost::ModelFacts f = factsOf(
      module, st.tp, [&](Operation *op) { return !mtp(op); }, fp8, &st);
  cost::ModelFacts m = factsOf(module, st.tp, mtp, fp8, nullptr);
  if (!m.ffn.empty())
    f.mtp = std::make_shared<const cost::ModelFacts>(std::move(m));
  return f;
}

} // namespace

FailureOr<ModuleStats> mlir::duck::computeStats(ModuleOp module,
                                                const ClusterModel &c) {
  ModuleStats st;
  if (failed(readLayout(module, st)))
    return failure();
  const cost::ModelFacts facts =
      costFactsOf(module, st, c.hostFp8BytesPerWeight);
  st.ffnLayers = (int64_t)st.ffn.size();
  st.mtpFfnLayers = facts.mtp ? (int64_t)facts.mtp->ffn.size() : 0;
  static_cast<cost::PlanCost &>(st) = cost::costPlan(facts, c);
  return st;
}

static std::string human(uint64_t bytes) {
  std::string s;
  llvm::raw_string_ostream os(s);
  if (bytes >= (1ull << 30))
    os << llvm::format("%.2f GiB", bytes / double(1ull << 30));
  else if (bytes >= (1ull << 20))
    os << llvm::format("%.2f MiB", bytes / double(1ull << 20));
  else
    os << llvm::format("%.1f KiB", bytes / 1024.0);
  return s;
}

std::string mlir::duck::strategySpecOf(const ModuleStats &s) {
  std::vector<std::pair<int64_t, Strategy>> moe;
  for (const ModuleStats::FfnLayer &l : s.ffn)
    if (l.moe)
      moe.push_back({l.layer, l.strategy});
  return moe.empty() ? s.strategy : strategySpecOf(moe);
}

namespace {

/// The partition and each duck's image.
void printDucks(const ModuleStats &s, llvm::raw_ostream &os) {
  os << "tp: " << s.tp << "\n";
  os << "multiple_of: " << s.multipleOf << "\n";
  os << "tp_max: " << s.tpMax << "\n";
  os << "strategy: " << s.strategy;
  if (s.strategy == "mixed")
    os << " (" << strategySpecOf(s) << ")";
  os << "\n";
  os << "ffn layers: " << s.ffnLayers;
  if (s.mtpFfnLayers)
    os << " (and " << s.mtpFfnLayers << " of the MTP module)";
  os << "\n";
  os << "duck    slots            bytes         size     params/token\n";
  for (const DuckStats &d : s.ducks)
    os << llvm::format("%-6lld %6llu %16llu %12s %16.0f\n", (long long)d.rank,
                       (unsigned long long)d.slots,
                       (unsigned long long)d.bytes, human(d.bytes).c_str(),
                       s.duckParamsPerToken[d.rank]);
  os << "total prepare traffic: " << s.totalBytes << " bytes ("
     << human(s.totalBytes) << ")\n";
}

/// Where the LM head and the attention projections run.
void printPlacements(const ModuleStats &s, const ClusterModel &c,
                     llvm::raw_ostream &os) {
  if (s.lmHeadOnDucks)
    os << llvm::format("LM head: on the ducks (vocabulary rows split), "
                       "%.3f ms a token on the slowest duck (in the ducks' "
                       "time below)\n",
                       s.lmHeadMsPerToken);
  else if (c.hostReadGbs > 0)
    os << llvm::format("LM head: on the host, %.3f ms a token at %.1f GB/s "
                       "(in the host's time below)\n",
                       s.hostLmHeadMsPerToken, c.hostReadGbs);
  if (s.oProjOnDucks)
    os << llvm::format("attention o_proj: on the ducks (%s), %.3f ms "
                       "a token on the slowest ducks (in the ducks' time "
                       "below)\n",
                       !s.oProjByHeads ? "rows split"
                       : s.mlaAbsorbedBytesPerToken > 0
                           ? "by heads, after W_UV: partial sums"
                           : "by heads: partial sums",
                       s.oProjMsPerToken);
  if (s.qProjOnDucks)
    os << llvm::format("attention query projection: on the ducks (%s), %.3f "
                       "ms a token on the slowest ducks (in the ducks' time "
                       "below)\n",
                       s.mlaAbsorbedBytesPerToken > 0 ? "by heads, then W_UK"
                                                      : "rows split",
                       s.qProjMsPerToken);
  if (s.inProjOnDucks)
    os << llvm::format("attention input projections: on the ducks (rows "
                       "split), %.3f ms a token on the slowest ducks (in the "
                       "ducks' time below)\n",
                       s.inProjMsPerToken);
}

/// The host's attention and weights, the wire, prefill.
/// ClusterModel::stageShared: what staging hid (or, left to the model,
/// why it was not taken).
void printStagedShared(const ModuleStats &s, const ClusterModel &c,
                       llvm::raw_ostream &os) {
  if (!s.stagedShared && !c.stageSharedOpen)
    return;
  os << llvm::format("stage shared: %s: each MoE step's shared experts "
                     "sent with x before the host routes, the routed slots "
                     "after: %.3f ms a token of the routers' time hidden",
                     s.stagedShared ? "on" : "off", s.stagedSharedMsPerToken);
  if (c.fanout == ClusterModel::Fanout::multicast)
    os << "; the stage goes as one cast batch and no frame (the ducks run "
          "it as it comes; the routed slots' frame names it)";
  else if (c.hostFrameUs > 0)
    os << llvm::format(", net of one more frame a duck at %.2f us",
                       c.hostFrameUs);
  if (s.stagedFramesPerToken > 0) // the saving falls linearly with it
    os << llvm::format(
        "; it pays while a frame costs the host under %.2f us (%.0f frames "
        "a token)",
        c.hostFrameUs + 1e3 * s.stagedSharedMsPerToken / s.stagedFramesPerToken,
        s.stagedFramesPerToken);
  os << (s.stagedShared ? " (taken off the host's time below)\n"
                        : " (less than it costs: not staged)\n");
}

void printHostAndWire(const ModuleStats &s, const ClusterModel &c,
                      llvm::raw_ostream &os) {
  if (s.hostAttnMsPerToken > 0)
    os << llvm::format("host attention over %lld tokens of context: %.2f "
                       "GMAC and %.1f MB of cache a token, %.3f ms (each "
                       "op the slower of %.1f GMAC/s and %s; in the host's "
                       "time below)\n",
                       (long long)c.contextTokens, s.hostAttnGmacPerToken,
                       s.hostAttnCacheBytesPerToken / 1e6,
                       s.hostAttnMsPerToken, c.hostGmacS,
                       c.hostReadGbs > 0
                           ? llvm::formatv("{0:f1} GB/s", c.hostReadGbs)
                                 .str()
                                 .c_str()
                           : "no read bandwidth given");
  if (c.hostReadGbs > 0 && c.hostMsPerToken <= 0 && !s.residualOnDucks) {
    os << llvm::format("host weights (attention, routers): %.1f MB a token, "
                       "%.3f ms at %.1f GB/s (in the host's time below)",
                       s.hostWeightBytesPerToken / 1e6, s.hostOpsMsPerToken,
                       c.hostReadGbs);
    if (s.hostOverlappedMsPerToken > 0)
      os << llvm::format(", less %.3f ms read while the input projections "
                         "are on the ducks (the indexer's weights_proj)",
                         s.hostOverlappedMsPerToken);
    os << "\n";
  }
  if (c.stageX)
    os << llvm::format("stage x (MODELLED ONLY): each MoE step's activations "
                       "out while the host reads its router: %.3f ms a token "
                       "of the network hidden (taken off it below)\n",
                       s.stagedXMsPerToken);
  printStagedShared(s, c, os);
  if (s.mlaAbsorbedBytesPerToken > 0)
    os << llvm::format("mla absorb: kv_b_proj on the ducks by heads: %.1f MB "
                       "a token off the host's reads, each query step also "
                       "through W_UK, each output step scattered by heads "
                       "through W_UV (partial sums back)\n",
                       s.mlaAbsorbedBytesPerToken / 1e6);
  if (s.networkMsPerToken > 0) {
    const std::string links = linksText(c);
    os << llvm::format("network: %.2f MB out and %.2f MB in at the host a "
                       "token, %.3f ms over %s (in the token's time below): "
                       "%lld steps, out %.3f + back %.3f + latency %.3f ms\n",
                       s.hostTxBytesPerToken / 1e6, s.hostRxBytesPerToken / 1e6,
                       s.networkMsPerToken, links.c_str(),
                       (long long)s.stepsPerToken, s.networkOutMsPerToken,
                       s.networkBackMsPerToken, s.networkLatencyMsPerToken);
  }
  if (s.residualOnDucks)
    os << llvm::format(
        "residual on the ducks (MODELLED ONLY, not built): %lld host "
        "exchanges and %lld collectives among the ducks a token; the "
        "collectives %.3f ms on the ducks' links (latency %.3f; in the "
        "network above) + %.3f ms of their calls (%.0f us + %.1f us a "
        "message; in the dispatch below), %s, %.2f MB sent by each duck to "
        "its peers%s; the host's weights (routers, indexer) read by the "
        "ducks in slices, %.3f ms (in the ducks' time below)\n",
        (long long)s.stepsPerToken, (long long)s.collectivesPerToken,
        s.meshMsPerToken, s.meshLatencyMsPerToken, s.meshOverheadMsPerToken,
        c.meshCallUs, c.meshMessageUs,
        s.meshGroups > 1
            ? llvm::formatv("two levels over {0} groups", s.meshGroups)
                  .str()
                  .c_str()
            : "one direct exchange each",
        s.meshBytesPerDuckPerToken / 1e6,
        c.meshDatagrams ? " as UDP datagrams" : "",
        s.meshHostWeightsMsPerToken);
  if (c.gemmGmacS > 0)
    os << llvm::format("estimated prefill: %.1f tok/s (ducks %.3f ms + host "
                       "%.3f ms a prompt token, %lld-token chunks; fp9 GEMM "
                       "%.1f GMAC/s per duck)\n",
                       s.prefillTokS, s.prefillDucksMsPerToken,
                       c.hostPrefillMsPerToken, (long long)c.prefillChunk,
                       c.gemmGmacS);
}

/// A step's fixed cost as the token's line gives it: the cluster file's,
/// and the host's frames to the ducks it was not measured with.
std::string stepText(const ModuleStats &s, const ClusterModel &c) {
  const double us = 1e3 * cost::stepOverheadMs(c, s.tp);
  if (us <= c.stepOverheadUs)
    return llvm::formatv("{0:F0} us per step", us).str();
  return llvm::formatv("{0:F0} us per step: {1:F0} measured with {2} duck(s) "
                       "+ 2 x {3} frames at {4:F2} us",
                       us, c.stepOverheadUs, c.stepOverheadDucks,
                       s.tp - c.stepOverheadDucks, c.hostFrameUs)
      .str();
}

/// The decoded token's time.
void printDecode(const ModuleStats &s, const ClusterModel &c,
                 llvm::raw_ostream &os) {
  // The host's part is counted when measured or timed from its bandwidth.
  if (c.hostMsPerToken > 0 || c.fp9GparamS > 0 || s.hostMsPerToken > 0) {
    const std::string rate =
        c.fp9GparamS > 0
            ? llvm::formatv("{0:F2} Gparam/s per duck", c.fp9GparamS).str()
            : llvm::formatv("{0:F1} GB/s per duck", c.bandwidthGbs).str();
    os << llvm::format(
        "estimated decode: %.2f tok/s (ducks %.3f ms + "
        "dispatch %.3f ms + host %.3f ms%s per token; %s, "
        "%s)\n",
        s.tokS, s.streamMsPerToken, s.dispatchMsPerToken, s.hostMsPerToken,
        s.networkMsPerToken > 0
            ? llvm::formatv(" + network {0:F3} ms", s.networkMsPerToken)
                  .str()
                  .c_str()
            : "",
        rate.c_str(), stepText(s, c).c_str());
  } else
    os << llvm::format(
        "estimated decode: %.2f tok/s (fp9 stream %.3f ms + "
        "dispatch %.3f ms%s per token at %.1f GB/s per duck, "
        "%s; host work not counted)\n",
        s.tokS, s.streamMsPerToken, s.dispatchMsPerToken,
        s.networkMsPerToken > 0
            ? llvm::formatv(" + network {0:F3} ms", s.networkMsPerToken)
                  .str()
                  .c_str()
            : "",
        c.bandwidthGbs, stepText(s, c).c_str());
  if (const cost::PlanCost::Speculative &v = s.speculative; v.rows > 0)
    os << llvm::format(
        "speculative (projected, not measured): %lld drafts a step at "
        "acceptance %.2f: %.2f tokens a verify step of %lld rows (%.3f ms: "
        "its rows on the wire, the union of their experts, each extra row's "
        "host attention%s): %.2f tok/s, %.2fx\n",
        (long long)(v.rows - 1), v.acceptance, v.tokensPerStep,
        (long long)v.rows, v.stepMs,
        v.mtp
            ? llvm::formatv(", and the MTP module drafting: {0:f3} ms", v.mtpMs)
                  .str()
                  .c_str()
            : "",
        v.tokS, v.speedup);
}

} // namespace

void mlir::duck::printStatsText(const ModuleStats &s, const ClusterModel &c,
                                llvm::raw_ostream &os) {
  printDucks(s, os);
  printPlacements(s, c, os);
  printHostAndWire(s, c, os);
  printDecode(s, c, os);
}

namespace {
/// How a step reaches the ducks (the relay and the reduction tree are
/// modelled only) and the links' latency.
void addFanoutJson(const ClusterModel &c, llvm::json::Object &o) {
  o["latency_us"] = c.latencyUs;
  o["fanout"] = c.fanout == ClusterModel::Fanout::relay
                    ? "relay (modelled only)"
                : c.fanout == ClusterModel::Fanout::multicast
                    ? (c.reduceTree ? "multicast, reduced up a tree "
                                      "(modelled only)"
                                    : "multicast")
                    : "unicast";
  o["relay_fanout"] = c.relayFanout;
  o["relay_host_fanout"] = c.relayHostFanout;
  o["relay_chunk_bytes"] = c.relayChunkBytes;
}

/// The residual on the ducks' keys (modelled only), when it was asked for:
/// its parts and the token's collectives in order.
void addMeshJson(const ModuleStats &s, const ClusterModel &c,
                 llvm::json::Object &o) {
  o["residual_on_ducks"] = s.residualOnDucks;
  if (!s.residualOnDucks)
    return;
  llvm::json::Array mesh;
  for (const cost::PlanCost::MeshStep &m : s.meshSchedule)
    mesh.push_back(llvm::json::Object{
        {"kind", m.reduceScatter ? "reduce_scatter" : "all_gather"},
        {"values", m.values},
        {"bytes_per_value", m.bytesPerValue}});
  o["collectives_per_token"] = s.collectivesPerToken;
  o["mesh_ms_per_token"] = s.meshMsPerToken;
  o["mesh_latency_ms_per_token"] = s.meshLatencyMsPerToken;
  o["mesh_overhead_ms_per_token"] = s.meshOverheadMsPerToken;
  o["mesh_bytes_per_duck_per_token"] = s.meshBytesPerDuckPerToken;
  o["mesh_host_weights_ms_per_token"] = s.meshHostWeightsMsPerToken;
  o["mesh_call_us"] = c.meshCallUs;
  o["mesh_message_us"] = c.meshMessageUs;
  o["host_frame_us"] = c.hostFrameUs;
  o["mesh_groups"] = s.meshGroups;
  o["mesh_transport"] = c.meshDatagrams ? "udp" : "tcp";
  o["mesh_schedule"] = std::move(mesh);
}

/// The speculative projection's keys, when one was asked for.
void addSpeculativeJson(const ModuleStats &s, llvm::json::Object &o) {
  if (s.speculative.rows == 0)
    return;
  const cost::PlanCost::Speculative &v = s.speculative;
  o["speculative_projection"] =
      llvm::json::Object{{"drafts", v.rows - 1},
                         {"acceptance", v.acceptance},
                         {"tokens_per_step", v.tokensPerStep},
                         {"step_ms", v.stepMs},
                         {"tok_s", v.tokS},
                         {"speedup", v.speedup},
                         {"mtp", v.mtp},
                         {"mtp_ms", v.mtpMs}};
}
} // namespace

llvm::json::Object mlir::duck::statsToJson(const ModuleStats &s,
                                           const ClusterModel &c) {
  llvm::json::Array perDuck, perDuckParams, layers;
  for (const DuckStats &d : s.ducks) {
    perDuck.push_back((int64_t)d.bytes);
    perDuckParams.push_back(s.duckParamsPerToken[d.rank]);
  }
  for (size_t i = 0; i < s.ffn.size(); ++i) {
    const ModuleStats::FfnLayer &l = s.ffn[i];
    llvm::json::Array bytes;
    for (uint64_t b : s.layers[i].duckBytes)
      bytes.push_back((int64_t)b);
    layers.push_back(
        llvm::json::Object{{"layer", l.layer},
                           {"moe", l.moe},
                           {"strategy", stringifyStrategy(l.strategy)},
                           {"ms_per_token", s.layers[i].ms},
                           {"duck_bytes", std::move(bytes)}});
  }
  llvm::json::Object o{
      {"tp", s.tp},
      {"multiple_of", s.multipleOf},
      {"tp_max", s.tpMax},
      {"strategy", s.strategy},
      {"strategy_by_layer", strategySpecOf(s)},
      {"ffn_layers", s.ffnLayers},
      {"mtp_ffn_layers", s.mtpFfnLayers},
      {"lm_head_on_ducks", s.lmHeadOnDucks},
      {"lm_head_ms_per_token", s.lmHeadMsPerToken},
      {"host_lm_head_ms_per_token", s.hostLmHeadMsPerToken},
      {"o_proj_on_ducks", s.oProjOnDucks},
      {"o_proj_ms_per_token", s.oProjMsPerToken},
      {"prefill_ducks_ms_per_token", s.prefillDucksMsPerToken},
      {"estimated_prefill_tok_s", s.prefillTokS},
      {"q_proj_on_ducks", s.qProjOnDucks},
      {"q_proj_ms_per_token", s.qProjMsPerToken},
      {"in_proj_on_ducks", s.inProjOnDucks},
      {"in_proj_ms_per_token", s.inProjMsPerToken},
      {"host_weight_bytes_per_token", s.hostWeightBytesPerToken},
      {"host_ops_ms_per_token", s.hostOpsMsPerToken},
      {"host_overlapped_ms_per_token", s.hostOverlappedMsPerToken},
      {"staged_x_ms_per_token", s.stagedXMsPerToken},
      {"stage_shared", s.stagedShared},
      {"staged_shared_ms_per_token", s.stagedSharedMsPerToken},
      {"host_attention_gmac_per_token", s.hostAttnGmacPerToken},
      {"host_attention_ms_per_token", s.hostAttnMsPerToken},
      {"per_duck_bytes", std::move(perDuck)},
      {"ffn_layer_costs", std::move(layers)},
      {"per_duck_params_per_token", std::move(perDuckParams)},
      {"total_bytes", (int64_t)s.totalBytes},
      {"estimated_decode_tok_s", s.tokS},
      {"stream_ms_per_token", s.streamMsPerToken},
      {"dispatch_ms_per_token", s.dispatchMsPerToken},
      {"host_ms_per_token", s.hostMsPerToken},
      {"network_ms_per_token", s.networkMsPerToken},
      {"network_out_ms_per_token", s.networkOutMsPerToken},
      {"network_back_ms_per_token", s.networkBackMsPerToken},
      {"network_latency_ms_per_token", s.networkLatencyMsPerToken},
      {"steps_per_token", s.stepsPerToken},
      {"mla_absorbed_bytes_per_token", s.mlaAbsorbedBytesPerToken},
      {"prefill_network_ms_per_token", s.prefillNetworkMsPerToken},
      {"host_tx_bytes_per_token", s.hostTxBytesPerToken},
      {"host_rx_bytes_per_token", s.hostRxBytesPerToken},
      {"wire_activations", ClusterModel::wireName(c.wireX)},
      {"wire_results", ClusterModel::wireName(c.wireOut)},
      {"fp9_gparam_s", c.fp9GparamS},
      {"bandwidth_gbs", c.bandwidthGbs},
      {"step_overhead_us", c.stepOverheadUs},
      {"step_overhead_ducks", c.stepOverheadDucks},
      {"step_ms", cost::stepOverheadMs(c, s.tp)},
  };
  addSpeculativeJson(s, o);
  addMeshJson(s, c, o);
  addFanoutJson(c, o);
  return o;
}


