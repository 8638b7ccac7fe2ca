//===- Layout.cpp - weight-buffer layout and cluster statistics -----------===//
#include "duck/Dialect/Duck/Transforms/Layout.h"
#include "duck_rt/duckd_protocol.h"
#include "duck_rt/kernel_select.h"
#include "duck_rt/slot_layout.h"

#include <cmath>
#include <map>
#include <tuple>

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
  uint32_t phase = expertRowPhase(shard, shard.getExpertBegin(), scaleRows);
  for (int64_t e = (int64_t)shard.getExpertBegin() + 1;
       e < (int64_t)shard.getExpertEnd(); ++e) {
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

SmallVector<RowMatrix::Piece, 4>
mlir::duck::RowMatrix::piecesOf(int64_t rank) const {
  SmallVector<Piece, 4> out;
  const int64_t b = rows[rank], e = rows[rank + 1];
  int64_t at = 0; // the weight's first row in the concatenation
  for (WeightAttr w : weights) {
    const int64_t n = w.getShape()[0];
    const int64_t lo = std::max(b, at), hi = std::min(e, at + n);
    if (lo < hi)
      out.push_back({w, lo - at, hi - lo});
    at += n;
  }
  return out;
}

duck_fp9_status mlir::duck::headSlotLayout(const RowMatrix &m, int64_t rank,
                                           int64_t scaleRows,
                                           HeadSlotLayout &out) {
  out.pieces = m.piecesOf(rank);
  SmallVector<uint32_t, 4> rows, phase;
  for (const RowMatrix::Piece &p : out.pieces) {
    rows.push_back((uint32_t)p.rows);
    phase.push_back((uint32_t)(p.row0 % scaleRows));
  }
  out.descs.resize(rows.size());
  out.offsets.resize(rows.size());
  return duck_compute_head_slot_pieces(
      (uint32_t)rows.size(), rows.data(), phase.data(), (uint32_t)m.k(),
      (uint32_t)m.block, (uint32_t)scaleRows, out.descs.data(),
      out.offsets.data(), &out.totalBytes);
}

SmallVector<RowMatrix> mlir::duck::rowMatricesOf(ModuleOp module) {
  SmallVector<RowMatrix> out;
  module.walk([&](AttentionOp a) {
    if (a.getInDuckRows() && a.getInDuckBlock())
      out.push_back({a, a.getInProjs(), *a.getInDuckRows(),
                     (int64_t)*a.getInDuckBlock(), /*head=*/false, "in_"});
    if (a.getQDuckRows() && a.getQDuckBlock())
      out.push_back({a, a.getQProjs(), *a.getQDuckRows(),
                     (int64_t)*a.getQDuckBlock(), /*head=*/false, "q_"});
    if (a.getDuckRows() && a.getDuckBlock())
      out.push_back({a, {a.getOProj()}, *a.getDuckRows(),
                     (int64_t)*a.getDuckBlock(), /*head=*/false, ""});
  });
  module.walk([&](LmHeadOp h) {
    if (h.getDuckRows() && h.getDuckBlock())
      out.push_back({h, {h.getWeight()}, *h.getDuckRows(),
                     (int64_t)*h.getDuckBlock(), /*head=*/true, ""});
  });
  return out;
}

namespace {

/// The experts one shard holds on its duck ([begin, end) of the layer's
/// ids; routed ones below num_experts, shared ones after) and the time
/// one of them takes there.
struct HeldExperts {
  size_t rank;
  int64_t begin, end;
  double seconds;
};

/// The expected time of a layer's step: its slowest duck's. A dense layer
/// or a MoE layer whose ducks each hold a slice of every expert is
/// deterministic; with whole experts placed on ducks (strategy experts) a
/// token's top_k experts fall unevenly, and the expectation of the maximum
/// is taken over every combination of top_k experts when there are at most
/// 20000, else over 4096 uniform draws (a fixed seed: the same plan always
/// gets the same prediction). Routing is taken as uniform; a real model's
/// skew makes expert placement slower still.
double expectedSlowest(const std::vector<HeldExperts> &held, bool moe,
                       int64_t topK, int64_t numExperts) {
  size_t ducks = 0;
  bool sliced = true;
  for (const HeldExperts &h : held) {
    ducks = std::max(ducks, h.rank + 1);
    if (moe && (h.begin > 0 || h.end < numExperts))
      sliced = false;
  }
  std::vector<double> t(ducks, 0.0);
  auto sharedHeld = [&](const HeldExperts &h) {
    return std::max<int64_t>(0, h.end - std::max(h.begin, numExperts));
  };
  if (!moe || sliced) {
    for (const HeldExperts &h : held)
      t[h.rank] += h.seconds * double(moe ? topK + sharedHeld(h) : 1);
    return ducks ? *std::max_element(t.begin(), t.end()) : 0.0;
  }
  // One draw of the token's routed experts: the slowest duck's time.
  auto slowest = [&](const std::vector<int64_t> &chosen) {
    std::fill(t.begin(), t.end(), 0.0);
    for (const HeldExperts &h : held) {
      int64_t n = sharedHeld(h);
      for (int64_t e : chosen)
        n += e >= h.begin && e < h.end;
      t[h.rank] += h.seconds * double(n);
    }
    return *std::max_element(t.begin(), t.end());
  };
  const int64_t k = std::min(topK, numExperts);
  std::vector<int64_t> chosen;
  // Few combinations (C(E, k) <= 20000): every one, exactly.
  double combos = 1;
  for (int64_t i = 0; i < k; ++i)
    combos = combos * double(numExperts - i) / double(i + 1);
  if (combos <= 20000) {
    for (int64_t i = 0; i < k; ++i)
      chosen.push_back(i);
    double sum = 0;
    for (;;) {
      sum += slowest(chosen);
      int64_t i = k - 1;
      while (i >= 0 && chosen[i] == numExperts - k + i)
        --i;
      if (i < 0)
        break;
      ++chosen[i];
      for (int64_t j = i + 1; j < k; ++j)
        chosen[j] = chosen[j - 1] + 1;
    }
    return sum / combos;
  }
  constexpr int kDraws = 4096;
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&]() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  double sum = 0;
  for (int d = 0; d < kDraws; ++d) {
    chosen.clear();
    while ((int64_t)chosen.size() < k) {
      const int64_t e = int64_t(next() % uint64_t(numExperts));
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end())
        chosen.push_back(e);
    }
    sum += slowest(chosen);
  }
  return sum / kDraws;
}

} // namespace

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

FailureOr<ModuleStats> mlir::duck::computeStats(ModuleOp module,
                                                const ClusterModel &c) {
  ModuleStats st;
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
  int64_t scaleRows = scaleRowsOf(module);
  // What a GEMV call costs a duck beyond its weights (0: not measured).
  auto callSeconds = [&](size_t r) {
    return r < c.duckGemvCallUs.size() ? c.duckGemvCallUs[r] * 1e-6 : 0.0;
  };
  // One expert's (or a dense slice's) time on its duck: each matrix at its
  // kernel class's measured rate, else the duck's rate, else its bytes at
  // the streaming bandwidth; plus each matrix's call cost.
  auto expertSeconds = [&](Fp9FfnOp shard, const SlotLayout &lay) {
    const size_t r = shard.getRank();
    const double duckRate =
        r < c.duckGparamS.size() ? c.duckGparamS[r] : c.fp9GparamS;
    const std::vector<double> *byClass =
        r < c.duckKernelGparamS.size() ? &c.duckKernelGparamS[r] : nullptr;
    ShardDescs ds = shardDescs(shard, scaleRows);
    double seconds = 0;
    for (const duck_fp9_desc &m : {ds.gate, ds.up, ds.down}) {
      const duck_kernel_id id = duck_select_kernel(m.k, m.block);
      const double rate = byClass && (size_t)id < byClass->size() &&
                                  (*byClass)[id] > 0
                              ? (*byClass)[id]
                              : duckRate;
      if (rate <= 0)
        return double(lay.expertBytes) / (c.bandwidthGbs * 1e9) +
               3 * callSeconds(r);
      seconds += double(m.rows) * m.k / (rate * 1e9) + callSeconds(r);
    }
    return seconds;
  };
  double layerMsSum = 0, prefillMsPerChunk = 0;
  // One step of `rows` tokens on the wire: the same IB to every duck
  // (frame header, step request, IB: `slots` routing slots and `k` floats
  // a token), then each duck's reply (frame header, step reply, a kernel
  // time a core, OB: its header and obWidth(r) floats a token). The host's
  // link carries every duck's frame in turn, a duck's link its own; the
  // replies come once the ducks are done. Returns seconds; a decode
  // step's bytes are added to the token's.
  auto netSeconds = [&](bool decode, uint32_t rows, uint32_t slots, uint64_t k,
                        auto obWidth) {
    const double in =
        double(sizeof(duckd_frame_header) + sizeof(duckd_step_request) +
               duck_ib_bytes_flags(rows, slots, (uint32_t)k,
                                   c.wireBf16 ? DUCK_IB_X_BF16 : 0));
    double hostIn = 0, hostOut = 0, duckIn = 0, duckOut = 0;
    for (int64_t r = 0; r < st.tp; ++r) {
      const double out =
          double(sizeof(duckd_frame_header) + sizeof(duckd_step_reply) +
                 8 * std::max<int64_t>(1, c.coresPerDuck) +
                 sizeof(duck_ob_header)) +
          4.0 * rows * double(obWidth(r));
      hostIn += in;
      hostOut += out;
      const double link =
          (size_t)r < c.duckLinkGbps.size() ? c.duckLinkGbps[r] : 0;
      if (link > 0) {
        duckIn = std::max(duckIn, in * 8 / (link * 1e9));
        duckOut = std::max(duckOut, out * 8 / (link * 1e9));
      }
    }
    if (decode) {
      st.hostTxBytesPerToken += hostIn;
      st.hostRxBytesPerToken += hostOut;
    }
    const double host = c.hostLinkGbps * 1e9 / 8;
    return std::max(host > 0 ? hostIn / host : 0.0, duckIn) +
           std::max(host > 0 ? hostOut / host : 0.0, duckOut);
  };
  double netMs = 0, prefillNetMs = 0;
  // Per duck (sorted, ducks sorted): routed and shared experts held, one
  // expert's seconds; with the layer's kind, top_k and expert count.
  using Holding =
      std::vector<std::vector<std::tuple<int64_t, int64_t, double>>>;
  std::map<std::tuple<bool, int64_t, int64_t, Holding>, double> slowestMemo;
  module.walk([&](Operation *op) {
    if (!isa<MlpOp, MoeOp>(op))
      return;
    ++st.ffnLayers;
    // Experts a token activates on a duck, on average.
    double activeRouted = 1, totalRouted = 1, shared = 0;
    const bool s0moe = isa<MoeOp>(op);
    int64_t topK = 1, numExperts = 1;
    if (auto moe = dyn_cast<MoeOp>(op)) {
      activeRouted = topK = moe.getTopK();
      totalRouted = numExperts = moe.getNumExperts();
      shared = moe.getNumShared();
    }
    std::vector<HeldExperts> held;
    double prefillSlowest = 0;
    ModuleStats::FfnLayer rec;
    rec.layer = cast<IntegerAttr>(op->getAttr("layer")).getInt();
    rec.moe = s0moe;
    if (auto sa = op->getAttrOfType<StrategyAttr>("strategy"))
      rec.strategy = sa.getValue();
    rec.duckBytes.assign(st.tp, 0);
    for (Operation &child : op->getRegion(0).getOps()) {
      auto shard = cast<Fp9FfnOp>(child);
      FfnShape s = ffnShapeOf(shard);
      auto lay = slotLayout(shard, scaleRows);
      if (failed(lay))
        continue;
      if (c.gemmGmacS > 0) {
        // A prompt chunk of C rows. The GEMM reads and decodes each weight
        // some row needs once (at the duck's GEMV rate, else its bytes at
        // the bandwidth), then does every row's FMAs with it (at the GEMM
        // rate): so an expert that only a few rows of the chunk chose
        // (MoE: C x top_k / E on average) pays its decode for few FMAs.
        const double C = (double)c.prefillChunk;
        const size_t r = shard.getRank();
        const double gemv =
            r < c.duckGparamS.size() ? c.duckGparamS[r] : c.fp9GparamS;
        const double perParam = gemv > 0 ? 1.0 / (gemv * 1e9)
                                         : 1.125 / (c.bandwidthGbs * 1e9);
        const double perMac = 1.0 / (c.gemmGmacS * 1e9);
        const double perExpert = 3.0 * s.hidden * shard.getLocalInter();
        double sec = 0;
        for (int64_t e = (int64_t)shard.getExpertBegin();
             e < (int64_t)shard.getExpertEnd(); ++e) {
          const bool routed = s.moe && e < (int64_t)totalRouted;
          const double p = routed ? activeRouted / totalRouted : 1.0;
          sec += perExpert *
                 ((1.0 - std::pow(1.0 - p, C)) * perParam + C * p * perMac);
        }
        prefillSlowest = std::max(prefillSlowest, sec);
      }
      double active;
      if (!s.moe) {
        active = 1;
      } else {
        // Routed experts held here are chosen with probability top_k/E;
        // shared experts (ids >= E) always run.
        int64_t lo = shard.getExpertBegin(), hi = shard.getExpertEnd();
        double routedHeld = std::max<int64_t>(
            0, std::min<int64_t>(hi, (int64_t)totalRouted) - lo);
        double sharedHeld =
            std::max<int64_t>(0, hi - std::max<int64_t>(lo, (int64_t)totalRouted));
        active = routedHeld * activeRouted / totalRouted + std::min(sharedHeld, shared);
      }
      DuckStats &d = st.ducks[shard.getRank()];
      rec.duckBytes[shard.getRank()] += lay->totalBytes;
      d.paramsPerToken += active * 3.0 * s.hidden * shard.getLocalInter();
      d.bytesPerToken += active * lay->expertBytes;
      held.push_back({(size_t)shard.getRank(),
                      s.moe ? (int64_t)shard.getExpertBegin() : 0,
                      s.moe ? (int64_t)shard.getExpertEnd() : 1,
                      expertSeconds(shard, *lay)});
    }
    // The expectation depends on what each duck holds, not on which duck
    // or which ids (routing is taken as uniform): layers whose ducks hold
    // the same, the extra experts rotated, share one computation (and one
    // estimate). DeepSeek-V3.2's 58 MoE layers are 58 expert-placement
    // estimates of 4096 draws otherwise.
    Holding byRank(st.tp);
    for (const HeldExperts &h : held)
      if (h.rank < byRank.size())
        byRank[h.rank].emplace_back(
            std::max<int64_t>(0,
                              std::min<int64_t>(h.end, numExperts) - h.begin),
            std::max<int64_t>(0,
                              h.end - std::max<int64_t>(h.begin, numExperts)),
            h.seconds);
    for (auto &r : byRank)
      std::sort(r.begin(), r.end());
    std::sort(byRank.begin(), byRank.end());
    auto [it, fresh] = slowestMemo.try_emplace(
        std::make_tuple(s0moe, topK, numExperts, std::move(byRank)), 0.0);
    if (fresh)
      it->second = expectedSlowest(held, s0moe, topK, numExperts);
    rec.ms = 1e3 * it->second;
    layerMsSum += rec.ms;
    st.ffn.push_back(std::move(rec));
    // Every duck returns the whole hidden vector (its partial sums).
    int64_t hidden = 0, slotsPerRow = 0;
    if (auto moe = dyn_cast<MoeOp>(op)) {
      hidden = moe.getHidden();
      slotsPerRow = moe.getTopK() + moe.getNumShared();
    } else {
      hidden = cast<MlpOp>(op).getHidden();
    }
    auto whole = [&](int64_t) { return hidden; };
    netMs += 1e3 * netSeconds(true, 1, slotsPerRow, hidden, whole);
    double prefillNet = 0;
    if (c.gemmGmacS > 0) {
      prefillNet = 1e3 * netSeconds(false, (uint32_t)c.prefillChunk,
                                    slotsPerRow, hidden, whole);
      prefillNetMs += prefillNet;
    }
    prefillMsPerChunk +=
        1e3 * prefillSlowest + c.stepOverheadUs / 1e3 + prefillNet;
  });
  // Row-split matrices on the ducks (o_projs, the LM head): one more step
  // each, its slowest duck.
  for (const RowMatrix &m : rowMatricesOf(module)) {
    if ((int64_t)m.rows.size() != st.tp + 1)
      continue;
    const int64_t hidden = m.k();
    const duck_kernel_id id =
        duck_select_kernel((uint32_t)hidden, (uint32_t)m.block);
    std::optional<ArrayRef<int64_t>> bytes;
    if (auto a = m.op->getAttrOfType<DenseI64ArrayAttr>(m.attr("duck_bytes")))
      bytes = a.asArrayRef();
    double slowest = 0;
    auto ownRows = [&](int64_t r) { return m.rowsOf(r); };
    netMs += 1e3 * netSeconds(true, 1, 0, hidden, ownRows);
    for (int64_t r = 0; r < st.tp; ++r) {
      const double params = double(m.rowsOf(r)) * hidden;
      st.ducks[r].paramsPerToken += params;
      double rate = (size_t)r < c.duckGparamS.size() ? c.duckGparamS[r]
                                                     : c.fp9GparamS;
      if ((size_t)r < c.duckKernelGparamS.size() &&
          (size_t)id < c.duckKernelGparamS[r].size() &&
          c.duckKernelGparamS[r][id] > 0)
        rate = c.duckKernelGparamS[r][id];
      const double sec = (rate > 0 ? params / (rate * 1e9)
                          : bytes ? double((*bytes)[r]) / (c.bandwidthGbs * 1e9)
                                  : params * 1.125 / (c.bandwidthGbs * 1e9)) +
                         callSeconds((size_t)r);
      slowest = std::max(slowest, sec);
    }
    if (!m.head && c.gemmGmacS > 0) {
      // In a prompt chunk every row goes through the projection: its
      // slowest duck's FMAs at the GEMM rate, or its bytes once.
      double worst = 0;
      for (int64_t r = 0; r < st.tp; ++r) {
        const double params = double(m.rowsOf(r)) * hidden;
        const double gemv = (size_t)r < c.duckGparamS.size()
                                ? c.duckGparamS[r]
                                : c.fp9GparamS;
        worst = std::max(
            worst, params * (gemv > 0 ? 1.0 / (gemv * 1e9)
                                      : 1.125 / (c.bandwidthGbs * 1e9)) +
                       params * c.prefillChunk / (c.gemmGmacS * 1e9));
      }
      const double prefillNet =
          1e3 * netSeconds(false, (uint32_t)c.prefillChunk, 0, hidden, ownRows);
      prefillNetMs += prefillNet;
      prefillMsPerChunk += 1e3 * worst + c.stepOverheadUs / 1e3 + prefillNet;
    }
    if (m.head) {
      st.lmHeadOnDucks = true;
      st.lmHeadMsPerToken = 1e3 * slowest;
    } else if (m.prefix.empty()) {
      st.oProjOnDucks = true;
      st.oProjMsPerToken += 1e3 * slowest;
      ++st.attnProjSteps;
    } else if (m.prefix == "in_") {
      st.inProjOnDucks = true;
      st.inProjMsPerToken += 1e3 * slowest;
      ++st.attnProjSteps;
    } else {
      st.qProjOnDucks = true;
      st.qProjMsPerToken += 1e3 * slowest;
      ++st.attnProjSteps;
    }
  }
  // The host's own weights a token (attention, MLA and its indexer, the
  // MoE routers) as the runtime reads them: FP8 as fp9, the rest as stored.
  auto hostBytesOf = [](WeightAttr w) {
    double params = 1;
    for (int64_t d : w.getShape())
      params *= double(d);
    Type t = w.getDtype();
    return params * (w.getScale()          ? 1.125
                     : t.isIntOrFloat() ? t.getIntOrFloatBitWidth() / 8.0
                                          : 2.0);
  };
  double hostWeightBytes = 0, onDucksHostBytes = 0;
  auto addDict = [&](DictionaryAttr d) {
    if (d)
      for (NamedAttribute nv : d)
        if (auto w = dyn_cast<WeightAttr>(nv.getValue()))
          hostWeightBytes += hostBytesOf(w);
  };
  module.walk([&](Operation *op) {
    if (auto a = dyn_cast<AttentionOp>(op)) {
      addDict(a.getWeights());
      addDict(a.getIndexerAttr());
      if (a.getDuckRows()) { // its o_proj is on the ducks
        hostWeightBytes -= hostBytesOf(a.getOProj());
        onDucksHostBytes += hostBytesOf(a.getOProj());
      }
      SmallVector<WeightAttr, 8> moved;
      if (a.getQDuckRows()) // its query projection is on the ducks
        llvm::append_range(moved, a.getQProjs());
      if (a.getInDuckRows()) // and its input projections
        llvm::append_range(moved, a.getInProjs());
      else if (a.getIndexerAttr()) // the indexer reads q_a_proj again
        if (auto qa = a.getWeights().getAs<WeightAttr>("q_a_proj"))
          hostWeightBytes += hostBytesOf(qa);
      for (WeightAttr w : moved) {
        hostWeightBytes -= hostBytesOf(w);
        onDucksHostBytes += hostBytesOf(w);
      }
    } else if (auto m = dyn_cast<MoeOp>(op)) {
      hostWeightBytes += hostBytesOf(m.getRouterWeight());
    }
  });
  st.hostWeightBytesPerToken = hostWeightBytes;
  // Attention over the cache at contextTokens, a decoded token: GQA scores
  // and weighted sums (2 x heads x head_dim a position); MLA in the
  // absorbed form (heads x (2 kv_lora + rope) a position), over at most
  // index_topk positions with an indexer, whose own scores cost index_heads
  // x index_dim a position. An op takes the longer of its multiply-adds at
  // host_gmac_s and, with host_read_gbs, its cache bytes at that bandwidth
  // (the fp32 cache read once a token: GQA's k and v, every head's shared
  // latent, the indexer's keys); GQA is bound by its reads, MLA by its
  // multiply-adds.
  if (c.hostGmacS > 0 && c.contextTokens > 0) {
    const double L = double(c.contextTokens);
    double macs = 0, bytes = 0, ms = 0;
    auto add = [&](double m, double b) {
      macs += m;
      bytes += b;
      double t = 1e3 * m / (c.hostGmacS * 1e9);
      if (c.hostReadGbs > 0)
        t = std::max(t, 1e3 * b / (c.hostReadGbs * 1e9));
      ms += t;
    };
    module.walk([&](AttentionOp a) {
      const double heads = double(a.getNumHeads());
      if (a.getKind() == "gqa") {
        add(2 * heads * double(a.getHeadDim()) * L,
            2 * double(a.getNumKvHeads()) * double(a.getHeadDim()) * 4 * L);
        return;
      }
      auto kvb = a.getWeights().getAs<WeightAttr>("kv_b_proj");
      auto kva = a.getWeights().getAs<WeightAttr>("kv_a_proj_with_mqa");
      if (!kvb || !kva)
        return;
      const double kvLora = double(kvb.getShape()[1]);
      const double rope = double(kva.getShape()[0]) - kvLora;
      double attended = L;
      if (DictionaryAttr idx = a.getIndexerAttr()) {
        auto geti = [&](StringRef k) {
          auto v = idx.getAs<IntegerAttr>(k);
          return v ? double(v.getInt()) : 0.0;
        };
        add(geti("n_heads") * geti("head_dim") * L,
            geti("head_dim") * 4 * L);
        if (geti("topk") > 0)
          attended = std::min(L, geti("topk"));
      }
      add(heads * (2 * kvLora + rope) * attended,
          (kvLora + rope) * 4 * attended);
    });
    st.hostAttnGmacPerToken = macs / 1e9;
    st.hostAttnCacheBytesPerToken = bytes;
    st.hostAttnMsPerToken = ms;
  }
  if (c.hostReadGbs > 0 && c.hostMsPerToken <= 0)
    st.hostOpsMsPerToken = 1e3 * hostWeightBytes / (c.hostReadGbs * 1e9);

  // The LM head on the host: its bytes at the host's bandwidth.
  if (!st.lmHeadOnDucks && c.hostReadGbs > 0)
    module.walk([&](LmHeadOp head) {
      ArrayRef<int64_t> shape = head.getWeight().getShape();
      const double params = double(shape[0]) * shape[1];
      double perWeight = c.hostHeadBytesPerWeight;
      if (perWeight <= 0) {
        // As the host reads it: FP8 (with block scales) becomes fp9.
        Type t = head.getWeight().getDtype();
        perWeight = head.getWeight().getScale() ? 1.125
                    : t.isIntOrFloat()          ? t.getIntOrFloatBitWidth() / 8.0
                                                : 2.0;
      }
      st.hostLmHeadMsPerToken =
          1e3 * params * perWeight / (c.hostReadGbs * 1e9);
    });
  st.streamMsPerToken = layerMsSum + st.lmHeadMsPerToken +
                        st.oProjMsPerToken + st.qProjMsPerToken +
                        st.inProjMsPerToken;
  st.dispatchMsPerToken = (st.ffnLayers + st.attnProjSteps +
                           (st.lmHeadOnDucks ? 1 : 0)) *
                          c.stepOverheadUs / 1e3;
  // The host's time: measured (host_ms_per_token), else its weights at
  // its bandwidth; plus a host LM head's bytes when the bandwidth is known.
  // A measured host time includes the attention projections; those on the
  // ducks come off it, their bytes at the host's bandwidth (when known).
  const double measuredHost =
      c.hostMsPerToken > 0 && c.hostReadGbs > 0
          ? std::max(0.0, c.hostMsPerToken -
                              1e3 * onDucksHostBytes / (c.hostReadGbs * 1e9))
          : c.hostMsPerToken;
  st.hostMsPerToken = (c.hostMsPerToken > 0 ? measuredHost
                                            : st.hostOpsMsPerToken) +
                      st.hostAttnMsPerToken +
                      st.hostLmHeadMsPerToken;
  st.networkMsPerToken = netMs; // 0 without a link speed
  double ms = st.streamMsPerToken + st.dispatchMsPerToken + st.hostMsPerToken +
              st.networkMsPerToken;
  st.tokS = ms > 0 ? 1e3 / ms : 0;
  if (c.gemmGmacS > 0) {
    st.prefillNetworkMsPerToken = prefillNetMs / c.prefillChunk;
    st.prefillDucksMsPerToken = prefillMsPerChunk / c.prefillChunk;
    const double pms = st.prefillDucksMsPerToken + c.hostPrefillMsPerToken;
    st.prefillTokS = pms > 0 ? 1e3 / pms : 0;
  }
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

std::string mlir::duck::linksText(const ClusterModel &c) {
  std::string links;
  if (c.hostLinkGbps > 0)
    links = llvm::formatv("the host's link {0} Gb/s", c.hostLinkGbps).str();
  if (!c.duckLinkGbps.empty()) {
    auto [lo, hi] =
        std::minmax_element(c.duckLinkGbps.begin(), c.duckLinkGbps.end());
    links +=
        (links.empty() ? "" : ", ") +
        (*lo == *hi ? llvm::formatv("{0} Gb/s a duck", *lo).str()
                    : llvm::formatv("{0}-{1} Gb/s a duck", *lo, *hi).str());
  }
  return links;
}

std::string mlir::duck::strategySpecOf(const ModuleStats &s) {
  std::vector<std::pair<int64_t, Strategy>> moe;
  for (const ModuleStats::FfnLayer &l : s.ffn)
    if (l.moe)
      moe.push_back({l.layer, l.strategy});
  return moe.empty() ? s.strategy : strategySpecOf(moe);
}

void mlir::duck::printStatsText(const ModuleStats &s, const ClusterModel &c,
                                llvm::raw_ostream &os) {
  os << "tp: " << s.tp << "\n";
  os << "multiple_of: " << s.multipleOf << "\n";
  os << "tp_max: " << s.tpMax << "\n";
  os << "strategy: " << s.strategy;
  if (s.strategy == "mixed")
    os << " (" << strategySpecOf(s) << ")";
  os << "\n";
  os << "ffn layers: " << s.ffnLayers << "\n";
  os << "duck    slots            bytes         size     params/token\n";
  for (const DuckStats &d : s.ducks)
    os << llvm::format("%-6lld %6llu %16llu %12s %16.0f\n", (long long)d.rank,
                       (unsigned long long)d.slots,
                       (unsigned long long)d.bytes, human(d.bytes).c_str(),
                       d.paramsPerToken);
  os << "total prepare traffic: " << s.totalBytes << " bytes ("
     << human(s.totalBytes) << ")\n";
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
    os << llvm::format("attention o_proj: on the ducks (rows split), %.3f ms "
                       "a token on the slowest ducks (in the ducks' time "
                       "below)\n",
                       s.oProjMsPerToken);
  if (s.qProjOnDucks)
    os << llvm::format("attention query projection: on the ducks (rows "
                       "split), %.3f ms a token on the slowest ducks (in the "
                       "ducks' time below)\n",
                       s.qProjMsPerToken);
  if (s.inProjOnDucks)
    os << llvm::format("attention input projections: on the ducks (rows "
                       "split), %.3f ms a token on the slowest ducks (in the "
                       "ducks' time below)\n",
                       s.inProjMsPerToken);
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
  if (c.hostReadGbs > 0 && c.hostMsPerToken <= 0)
    os << llvm::format("host weights (attention, routers): %.1f MB a token, "
                       "%.3f ms at %.1f GB/s (in the host's time below)\n",
                       s.hostWeightBytesPerToken / 1e6, s.hostOpsMsPerToken,
                       c.hostReadGbs);
  if (s.networkMsPerToken > 0) {
    const std::string links = linksText(c);
    os << llvm::format("network: %.2f MB out and %.2f MB in at the host a "
                       "token, %.3f ms over %s (in the token's time below)\n",
                       s.hostTxBytesPerToken / 1e6, s.hostRxBytesPerToken / 1e6,
                       s.networkMsPerToken, links.c_str());
  }
  if (c.gemmGmacS > 0)
    os << llvm::format("estimated prefill: %.1f tok/s (ducks %.3f ms + host "
                       "%.3f ms a prompt token, %lld-token chunks; fp9 GEMM "
                       "%.1f GMAC/s per duck)\n",
                       s.prefillTokS, s.prefillDucksMsPerToken,
                       c.hostPrefillMsPerToken, (long long)c.prefillChunk,
                       c.gemmGmacS);
  // The host's part is counted when measured or timed from its bandwidth.
  if (c.hostMsPerToken > 0 || c.fp9GparamS > 0 || s.hostMsPerToken > 0) {
    const std::string rate =
        c.fp9GparamS > 0
            ? llvm::formatv("{0:F2} Gparam/s per duck", c.fp9GparamS).str()
            : llvm::formatv("{0:F1} GB/s per duck", c.bandwidthGbs).str();
    os << llvm::format(
        "estimated decode: %.2f tok/s (ducks %.3f ms + "
        "dispatch %.3f ms + host %.3f ms%s per token; %s, "
        "%.0f us per step)\n",
        s.tokS, s.streamMsPerToken, s.dispatchMsPerToken, s.hostMsPerToken,
        s.networkMsPerToken > 0
            ? llvm::formatv(" + network {0:F3} ms", s.networkMsPerToken)
                  .str()
                  .c_str()
            : "",
        rate.c_str(), c.stepOverheadUs);
  } else
    os << llvm::format(
        "estimated decode: %.2f tok/s (fp9 stream %.3f ms + "
        "dispatch %.3f ms%s per token at %.1f GB/s per duck, "
        "%.0f us per step; host work not counted)\n",
        s.tokS, s.streamMsPerToken, s.dispatchMsPerToken,
        s.networkMsPerToken > 0
            ? llvm::formatv(" + network {0:F3} ms", s.networkMsPerToken)
                  .str()
                  .c_str()
            : "",
        c.bandwidthGbs, c.stepOverheadUs);
}

llvm::json::Object mlir::duck::statsToJson(const ModuleStats &s,
                                           const ClusterModel &c) {
  llvm::json::Array perDuck, perDuckParams, layers;
  for (const DuckStats &d : s.ducks) {
    perDuck.push_back((int64_t)d.bytes);
    perDuckParams.push_back(d.paramsPerToken);
  }
  for (const ModuleStats::FfnLayer &l : s.ffn) {
    llvm::json::Array bytes;
    for (uint64_t b : l.duckBytes)
      bytes.push_back((int64_t)b);
    layers.push_back(
        llvm::json::Object{{"layer", l.layer},
                           {"moe", l.moe},
                           {"strategy", stringifyStrategy(l.strategy)},
                           {"ms_per_token", l.ms},
                           {"duck_bytes", std::move(bytes)}});
  }
  return llvm::json::Object{
      {"tp", s.tp},
      {"multiple_of", s.multipleOf},
      {"tp_max", s.tpMax},
      {"strategy", s.strategy},
      {"strategy_by_layer", strategySpecOf(s)},
      {"ffn_layers", s.ffnLayers},
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
      {"prefill_network_ms_per_token", s.prefillNetworkMsPerToken},
      {"host_tx_bytes_per_token", s.hostTxBytesPerToken},
      {"host_rx_bytes_per_token", s.hostRxBytesPerToken},
      {"wire_activations", c.wireBf16 ? "bf16" : "f32"},
      {"fp9_gparam_s", c.fp9GparamS},
      {"bandwidth_gbs", c.bandwidthGbs},
      {"step_overhead_us", c.stepOverheadUs},
  };
}
