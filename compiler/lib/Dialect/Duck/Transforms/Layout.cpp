//===- Layout.cpp - weight-buffer layout and cluster statistics -----------===//
#include "duck/Dialect/Duck/Transforms/Layout.h"

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

ShardDescs mlir::duck::shardDescs(Fp9FfnOp shard, int64_t scaleRows) {
  FfnShape s = ffnShapeOf(shard);
  uint32_t local = (uint32_t)shard.getLocalInter();
  uint32_t block = (uint32_t)shard.getBlock();
  uint32_t sr = (uint32_t)scaleRows;
  duck_fp9_desc gate{local, (uint32_t)s.hidden, block, sr,
                     (uint32_t)(shard.getInterBegin() % scaleRows)};
  duck_fp9_desc down{(uint32_t)s.hidden, local, block, sr, 0};
  return {gate, gate, down};
}

FailureOr<SlotLayout> mlir::duck::slotLayout(Fp9FfnOp shard,
                                             int64_t scaleRows) {
  FfnShape s = ffnShapeOf(shard);
  ShardDescs d = shardDescs(shard, scaleRows);
  duck_fp9_layout g, u, dn;
  if (duck_fp9_compute_layout(&d.gate, &g) != DUCK_FP9_OK ||
      duck_fp9_compute_layout(&d.up, &u) != DUCK_FP9_OK ||
      duck_fp9_compute_layout(&d.down, &dn) != DUCK_FP9_OK) {
    shard.emitOpError("has no valid fp9 layout (block/shape mismatch)");
    return failure();
  }
  SlotLayout l;
  l.tableBytes = llvm::alignTo(sizeof(duck_slot_header) +
                                   (uint64_t)s.experts * sizeof(duck_ffn_desc),
                               DUCK_FP9_PLANE_ALIGN);
  l.gateOffset = 0;
  l.upOffset = g.total_bytes;
  l.downOffset = g.total_bytes + u.total_bytes;
  l.expertBytes = g.total_bytes + u.total_bytes + dn.total_bytes;
  l.totalBytes = llvm::alignTo(
      l.tableBytes + (uint64_t)shard.getLocalExperts() * l.expertBytes,
      DUCK_IMAGE_ALIGN);
  return l;
}

uint64_t mlir::duck::imagePrologueBytes(uint64_t slotCount) {
  return llvm::alignTo(DUCK_IMAGE_HEADER_BYTES +
                           slotCount * sizeof(duck_slot_entry),
                       DUCK_IMAGE_ALIGN);
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
  st.tp = bytesAttr.size();
  st.ducks.resize(st.tp);
  for (int64_t r = 0; r < st.tp; ++r) {
    st.ducks[r].rank = r;
    st.ducks[r].bytes = cast<IntegerAttr>(bytesAttr[r]).getInt();
    st.ducks[r].slots = cast<IntegerAttr>(slotsAttr[r]).getInt();
    st.totalBytes += st.ducks[r].bytes;
  }
  int64_t scaleRows = scaleRowsOf(module);
  module.walk([&](Operation *op) {
    if (!isa<MlpOp, MoeOp>(op))
      return;
    ++st.ffnLayers;
    auto mo = op->getAttrOfType<IntegerAttr>("multiple_of");
    auto tpMax = op->getAttrOfType<IntegerAttr>("tp_max");
    if (mo)
      st.multipleOf = mo.getInt();
    if (tpMax && (st.tpMax == 0 || tpMax.getInt() < st.tpMax))
      st.tpMax = tpMax.getInt();
    if (auto s = op->getAttrOfType<StrategyAttr>("strategy"))
      st.strategy = stringifyStrategy(s.getValue()).str();
    // Experts a token activates on a duck, on average.
    double activeRouted = 1, totalRouted = 1, shared = 0;
    if (auto moe = dyn_cast<MoeOp>(op)) {
      activeRouted = moe.getTopK();
      totalRouted = moe.getNumExperts();
      shared = moe.getNumShared();
    }
    for (Operation &child : op->getRegion(0).getOps()) {
      auto shard = cast<Fp9FfnOp>(child);
      FfnShape s = ffnShapeOf(shard);
      auto lay = slotLayout(shard, scaleRows);
      if (failed(lay))
        continue;
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
      d.paramsPerToken += active * 3.0 * s.hidden * shard.getLocalInter();
      d.bytesPerToken += active * lay->expertBytes;
    }
  });
  // The slowest duck sets the pace: its weights at the measured kernel
  // rate when known, else its bytes at the streaming bandwidth.
  double slowestMs = 0;
  for (size_t r = 0; r < st.ducks.size(); ++r) {
    const DuckStats &d = st.ducks[r];
    const double rate =
        r < c.duckGparamS.size() ? c.duckGparamS[r] : c.fp9GparamS;
    slowestMs = std::max(slowestMs,
                         rate > 0 ? d.paramsPerToken / (rate * 1e9) * 1e3
                                  : d.bytesPerToken /
                                        (c.bandwidthGbs * 1e9) * 1e3);
  }
  st.streamMsPerToken = slowestMs;
  st.dispatchMsPerToken = st.ffnLayers * c.stepOverheadUs / 1e3;
  st.hostMsPerToken = c.hostMsPerToken;
  double ms = st.streamMsPerToken + st.dispatchMsPerToken + st.hostMsPerToken;
  st.tokS = ms > 0 ? 1e3 / ms : 0;
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

void mlir::duck::printStatsText(const ModuleStats &s, const ClusterModel &c,
                                llvm::raw_ostream &os) {
  os << "tp: " << s.tp << "\n";
  os << "multiple_of: " << s.multipleOf << "\n";
  os << "tp_max: " << s.tpMax << "\n";
  os << "strategy: " << s.strategy << "\n";
  os << "ffn layers: " << s.ffnLayers << "\n";
  os << "duck    slots            bytes         size     params/token\n";
  for (const DuckStats &d : s.ducks)
    os << llvm::format("%-6lld %6llu %16llu %12s %16.0f\n", (long long)d.rank,
                       (unsigned long long)d.slots,
                       (unsigned long long)d.bytes, human(d.bytes).c_str(),
                       d.paramsPerToken);
  os << "total prepare traffic: " << s.totalBytes << " bytes ("
     << human(s.totalBytes) << ")\n";
  if (c.hostMsPerToken > 0 || c.fp9GparamS > 0) {
    const std::string rate =
        c.fp9GparamS > 0
            ? llvm::formatv("{0:F2} Gparam/s per duck", c.fp9GparamS).str()
            : llvm::formatv("{0:F1} GB/s per duck", c.bandwidthGbs).str();
    os << llvm::format("estimated decode: %.2f tok/s (ducks %.3f ms + "
                       "dispatch %.3f ms + host %.3f ms per token; %s, "
                       "%.0f us per step)\n",
                       s.tokS, s.streamMsPerToken, s.dispatchMsPerToken,
                       s.hostMsPerToken, rate.c_str(), c.stepOverheadUs);
  }
  else
    os << llvm::format("estimated decode: %.2f tok/s (fp9 stream %.3f ms + "
                       "dispatch %.3f ms per token at %.1f GB/s per duck, "
                       "%.0f us per step; host work not counted)\n",
                       s.tokS, s.streamMsPerToken, s.dispatchMsPerToken,
                       c.bandwidthGbs, c.stepOverheadUs);
}

llvm::json::Object mlir::duck::statsToJson(const ModuleStats &s,
                                           const ClusterModel &c) {
  llvm::json::Array perDuck, perDuckParams;
  for (const DuckStats &d : s.ducks) {
    perDuck.push_back((int64_t)d.bytes);
    perDuckParams.push_back(d.paramsPerToken);
  }
  return llvm::json::Object{
      {"tp", s.tp},
      {"multiple_of", s.multipleOf},
      {"tp_max", s.tpMax},
      {"strategy", s.strategy},
      {"ffn_layers", s.ffnLayers},
      {"per_duck_bytes", std::move(perDuck)},
      {"per_duck_params_per_token", std::move(perDuckParams)},
      {"total_bytes", (int64_t)s.totalBytes},
      {"estimated_decode_tok_s", s.tokS},
      {"stream_ms_per_token", s.streamMsPerToken},
      {"dispatch_ms_per_token", s.dispatchMsPerToken},
      {"host_ms_per_token", s.hostMsPerToken},
      {"fp9_gparam_s", c.fp9GparamS},
      {"bandwidth_gbs", c.bandwidthGbs},
      {"step_overhead_us", c.stepOverheadUs},
  };
}
