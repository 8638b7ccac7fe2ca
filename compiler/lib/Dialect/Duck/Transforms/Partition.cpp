//===- Partition.cpp - duck-partition -------------------------------------===//
#include "duck/Dialect/Duck/Transforms/Layout.h"
#include "duck/Dialect/Duck/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::duck {
#define GEN_PASS_DEF_DUCKPARTITION
#include "duck/Dialect/Duck/Transforms/Passes.h.inc"
} // namespace mlir::duck

using namespace mlir;
using namespace mlir::duck;

llvm::Expected<StrategySpec>
mlir::duck::parseStrategySpec(llvm::StringRef spec) {
  auto fail = [&](const llvm::Twine &why) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "strategy '" + spec + "': " + why);
  };
  StrategySpec out;
  if (spec.trim().empty())
    return fail("empty (expected intermediate, experts or a per-layer list "
                "such as intermediate,experts:3-30)");
  llvm::SmallVector<llvm::StringRef> items;
  spec.split(items, ',');
  for (llvm::StringRef item : items) {
    item = item.trim();
    auto [name, layers] = item.split(':');
    std::optional<Strategy> st = symbolizeStrategy(name.trim());
    if (!st || *st == Strategy::mixed)
      return fail("'" + name.trim() + "' is not a strategy");
    if (!item.contains(':')) {
      out.every = *st;
      out.ranges.clear(); // a later bare item sets every layer again
      continue;
    }
    auto [a, b] = layers.split('-');
    int64_t first = 0, last = 0;
    if (a.trim().getAsInteger(10, first) || first < 0 ||
        (layers.contains('-') ? b.trim().getAsInteger(10, last)
                              : (last = first, false)) ||
        last < first)
      return fail(
          (items.size() > 1 ? "'" + item.str() + "': " : std::string()) +
          "layers are N or FIRST-LAST (0-based, FIRST <= LAST)");
    out.ranges.push_back({first, last, *st});
  }
  return out;
}

std::string mlir::duck::strategySpecOf(
    const std::vector<std::pair<int64_t, Strategy>> &layers) {
  int64_t experts = 0;
  for (const auto &l : layers)
    experts += l.second == Strategy::experts;
  const Strategy every = 2 * experts > (int64_t)layers.size()
                             ? Strategy::experts
                             : Strategy::intermediate;
  std::string s = stringifyStrategy(every).str();
  for (size_t i = 0; i < layers.size();) {
    if (layers[i].second == every) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1].second == layers[i].second &&
           layers[j + 1].first == layers[j].first + 1)
      ++j;
    s += "," + stringifyStrategy(layers[i].second).str() + ":" +
         std::to_string(layers[i].first);
    if (j > i)
      s += "-" + std::to_string(layers[j].first);
    i = j + 1;
  }
  return s;
}

namespace {

struct FfnInfo {
  Operation *op;
  int64_t layer, inter, experts;
  bool moe;
  int64_t shared = 0; // of `experts`, the always-active ones (ids last)
};

FfnInfo infoOf(Operation *op) {
  if (auto mlp = dyn_cast<MlpOp>(op))
    return {op, (int64_t)mlp.getLayer(), (int64_t)mlp.getInter(), 1, false};
  auto moe = cast<MoeOp>(op);
  return {op,
          (int64_t)moe.getLayer(),
          (int64_t)moe.getInter(),
          (int64_t)moe.getTotalExperts(),
          true,
          (int64_t)moe.getNumShared()};
}

/// The largest fp9 K-block (128, 64 or 32) dividing every width and, for
/// FP8 (tileCols > 0), the scale tiles' columns; 0 when none does.
int64_t fp9BlockFor(std::initializer_list<int64_t> widths, int64_t tileCols) {
  for (int64_t b : {128, 64, 32})
    if ((tileCols <= 0 || tileCols % b == 0) &&
        llvm::all_of(widths, [&](int64_t w) { return w % b == 0; }))
      return b;
  return 0;
}

/// The columns of an FP8 checkpoint's scale tiles
/// (quantization_config.weight_block_size[1]); 0 without FP8. An fp9
/// K-block takes its tile's scale, so it must lie inside one tile: the
/// block has to divide this width.
int64_t fp8TileCols(ModuleOp module) {
  int64_t cols = 0;
  module.walk([&](ModelOp m) {
    if (auto bs = m.getConfig().getAs<ArrayAttr>("fp8_block"))
      if (bs.size() == 2)
        if (auto c = dyn_cast<IntegerAttr>(bs[1]))
          cols = c.getInt();
  });
  return cols;
}

/// "64 allows tp <= 12, 32 allows tp <= 24" for the blocks smaller than mo.
std::string smallerBlockHint(int64_t inter, int64_t mo) {
  std::string s;
  for (int64_t b : {64, 32})
    if (b < mo && inter % b == 0)
      s += (s.empty() ? "" : ", ") + std::to_string(b) + " allows tp <= " +
           std::to_string(inter / b);
  return s;
}

struct DuckPartitionPass
    : public mlir::duck::impl::DuckPartitionBase<DuckPartitionPass> {
  using Base::Base;

  /// Whole blocks a duck: equal (the first blocks % tp one more), or in
  /// proportion to the shares: each duck the whole part of its ideal
  /// count (at least one), then the blocks left over to the largest
  /// remainders (blocks taken back, when the minimum of one overshoots,
  /// from the most over-served).
  SmallVector<int64_t> blockCounts(int64_t blocks) const {
    SmallVector<int64_t> counts(tp, 0);
    if (shares.empty()) {
      for (int64_t r = 0; r < tp; ++r)
        counts[r] = blocks / tp + (r < blocks % tp ? 1 : 0);
      return counts;
    }
    double total = 0;
    for (double v : shares)
      total += v;
    SmallVector<double> ideal(tp);
    int64_t sum = 0;
    for (int64_t r = 0; r < tp; ++r) {
      ideal[r] = blocks * shares[r] / total;
      counts[r] = std::max<int64_t>(1, (int64_t)ideal[r]);
      sum += counts[r];
    }
    auto pick = [&](bool add) {
      int64_t best = -1;
      for (int64_t r = 0; r < tp; ++r) {
        if (!add && counts[r] <= 1)
          continue;
        const double gap = ideal[r] - counts[r];
        if (best < 0 || (add ? gap > ideal[best] - counts[best]
                             : gap < ideal[best] - counts[best]))
          best = r;
      }
      return best;
    };
    for (; sum < blocks; ++sum)
      ++counts[pick(/*add=*/true)];
    for (; sum > blocks; --sum)
      --counts[pick(/*add=*/false)];
    return counts;
  }

  /// A matrix's rows over the ducks in whole scale tiles (so each duck
  /// packs exactly the tiles the host's fp9 copy would, and the results
  /// keep their bits), in proportion to the shares: sets `duck_rows` and
  /// `duck_block` on `op`. `what` and `hostFlag` name it in errors.
  static void dropRows(Operation *op, StringRef prefix) {
    for (StringRef a : {"duck_rows", "duck_block", "duck_slot",
                        "duck_offsets", "duck_bytes"})
      op->removeAttr((prefix + a).str());
  }

  /// o-proj=heads (GQA): whole heads a duck (absorb_heads), o_proj's rows
  /// all of them, its columns the duck's heads' (one fp9 K-block dividing
  /// head_dim and the FP8 tiles' columns).
  LogicalResult oByHeads(ModuleOp module, AttentionOp op) {
    const int64_t heads = op.getNumHeads(), dim = op.getHeadDim();
    if (heads < tp)
      return op.emitOpError()
             << heads << " heads cannot go whole to " << (int64_t)tp
             << " ducks (use --o-proj ducks or host)";
    const int64_t tileCols = fp8TileCols(module);
    const int64_t block = fp9BlockFor({dim}, tileCols);
    if (!block)
      return op.emitOpError() << "o_proj by heads: no fp9 block (128, 64 or "
                                 "32) divides the head dim "
                              << dim << " (use --o-proj ducks)";
    Builder b(op.getContext());
    SmallVector<int64_t> bounds, rows;
    const int64_t hidden = op.getOProj().getShape()[0];
    for (int64_t r = 0; r <= tp; ++r) {
      bounds.push_back(heads * r / tp);
      rows.push_back(hidden * r / tp);
    }
    op->setAttr("absorb_heads", b.getDenseI64ArrayAttr(bounds));
    op->setAttr("duck_rows", b.getDenseI64ArrayAttr(rows));
    op->setAttr("duck_block", b.getI64IntegerAttr(block));
    return success();
  }

  /// mla-absorb=ducks: whole heads a duck (and the indexer's wq_b rows of
  /// the query group evenly), in one fp9 K-block for every piece of the
  /// two slots (q_lora, nope, kv_lora and v, and FP8 tiles' columns).
  LogicalResult absorbHeads(ModuleOp module, AttentionOp op) {
    const AttentionOp::MlaDims d = op.getMlaDims();
    if (d.heads < tp)
      return op.emitOpError()
             << d.heads << " heads cannot go whole to " << (int64_t)tp
             << " ducks (use --mla-absorb host)";
    auto qb = op.getWeights().getAs<WeightAttr>("q_b_proj");
    const int64_t qIn = qb ? qb.getShape()[1] : op.getQProj().getShape()[1];
    const int64_t tileCols = fp8TileCols(module);
    const int64_t block = fp9BlockFor({qIn, d.nope, d.kvLora, d.v}, tileCols);
    if (!block)
      return op.emitOpError()
             << "kv_b_proj cannot go to the ducks: no fp9 block (128, 64 or "
                "32) divides the query LoRA "
             << qIn << ", nope " << d.nope << ", kv_lora " << d.kvLora
             << " and v " << d.v << " (use --mla-absorb host)";
    Builder b(op.getContext());
    SmallVector<int64_t> heads, index;
    SmallVector<WeightAttr, 4> group = op.getQProjs();
    const int64_t idxRows = group.size() > 1 ? group[1].getShape()[0] : 0;
    for (int64_t r = 0; r <= tp; ++r) {
      heads.push_back(d.heads * r / tp);
      index.push_back(idxRows * r / tp);
    }
    op->setAttr("absorb_heads", b.getDenseI64ArrayAttr(heads));
    if (idxRows)
      op->setAttr("absorb_index_rows", b.getDenseI64ArrayAttr(index));
    // The plain row boundaries say the projections are on the ducks; the
    // slots' rows are the heads' chains (RowMatrix::piecesOf).
    auto even = [&](int64_t n) {
      SmallVector<int64_t> v;
      for (int64_t r = 0; r <= tp; ++r)
        v.push_back(n * r / tp);
      return b.getDenseI64ArrayAttr(v);
    };
    int64_t qRows = 0;
    for (WeightAttr w : group)
      qRows += w.getShape()[0];
    op->setAttr("q_duck_rows", even(qRows));
    op->setAttr("duck_rows", even(op.getOProj().getShape()[0]));
    op->setAttr("q_duck_block", b.getI64IntegerAttr(block));
    op->setAttr("duck_block", b.getI64IntegerAttr(block));
    return success();
  }

  LogicalResult placeRows(ModuleOp module, Operation *op,
                          ArrayRef<WeightAttr> ws, StringRef what,
                          StringRef hostFlag, StringRef prefix = "") {
    dropRows(op, prefix);
    // The units a duck gets whole: each matrix's scale tiles (a group's
    // matrices, rows concatenated, keep their own tiles, so every duck
    // packs exactly the tiles the host's fp9 copy would).
    const int64_t scaleTile = scaleRowsOf(module);
    const int64_t k = ws.front().getShape()[1];
    SmallVector<int64_t> ends; // each unit's end in the concatenated rows
    int64_t n = 0;
    auto unitsOf = [&](int64_t tile) {
      ends.clear();
      n = 0;
      for (WeightAttr w : ws) {
        const int64_t rows = w.getShape()[0];
        for (int64_t t = tile; t < rows + tile; t += tile)
          ends.push_back(n + std::min(t, rows));
        n += rows;
      }
    };
    int64_t tile = scaleTile;
    unitsOf(tile);
    // FP8 weights keep their values and their tile's scale however their
    // rows are sliced (fp9 takes the checkpoint's scale; a slice may start
    // inside a tile), so a group with fewer tiles than ducks may be cut in
    // halves or quarters of tiles (not below 32 rows); other dtypes' scales
    // come from the slice's own rows, so their tiles stay whole.
    const bool fp8 = llvm::all_of(ws, [](WeightAttr w) {
      return (bool)w.getScale();
    });
    while (fp8 && (int64_t)ends.size() < tp && tile > 32)
      unitsOf(tile /= 2);
    const int64_t tiles = (int64_t)ends.size();
    if (tiles < tp)
      return op->emitOpError()
             << "the " << what << "'s " << n << " rows "
             << (tiles == 1 ? "are 1 tile" : "are " + std::to_string(tiles) +
                                                 " tiles")
             << " of " << tile << ": too few for " << (int64_t)tp
             << " ducks (use " << hostFlag << ")";
    // The fp9 K-block: divides the width and, in FP8, the scale tiles'.
    const int64_t tileCols = fp8 ? fp8TileCols(module) : 0;
    const int64_t block = fp9BlockFor({k}, tileCols);
    if (!block)
      return op->emitOpError()
             << "the " << what << "'s width " << k
             << (tileCols > 0 ? " with FP8 scale tiles " +
                                    std::to_string(tileCols) + " columns wide"
                              : std::string())
             << " has no fp9 block (128, 64 or 32 dividing "
             << (tileCols > 0 ? "both" : "it") << ") on the ducks";
    SmallVector<int64_t> rows = {0};
    int64_t first = 0;
    for (int64_t c : blockCounts(tiles)) {
      first += c;
      rows.push_back(ends[first - 1]);
    }
    Builder b(module.getContext());
    op->setAttr((prefix + "duck_rows").str(), b.getDenseI64ArrayAttr(rows));
    op->setAttr((prefix + "duck_block").str(), b.getI64IntegerAttr(block));
    return success();
  }

  /// lm-head=ducks: the head's vocabulary rows; o-proj=ducks: every
  /// attention's output projection rows (hidden of them).
  LogicalResult placeRowMatrices(ModuleOp module) {
    LogicalResult result = success();
    module.walk([&](LmHeadOp op) {
      dropRows(op, "");
      if (lmHead == "ducks" &&
          failed(placeRows(module, op, {op.getWeight()}, "LM head",
                           "--lm-head on the host")))
        result = failure();
    });
    // Every layer's projections have the same shapes: the first error is
    // enough.
    module.walk([&](AttentionOp op) {
      dropRows(op, "");
      dropRows(op, "q_");
      dropRows(op, "in_");
      op->removeAttr("absorb_heads");
      op->removeAttr("absorb_index_rows");
      const bool in = inProj == "ducks";
      // Absorbed (kv_b_proj on the ducks too), the query and output slots
      // go by whole heads, not by the row tiles placeRows cuts.
      const bool absorb = mlaAbsorb == "ducks" && oProj != "host" &&
                          qProj == "ducks" && op.getMlaDims().heads > 0 &&
                          op.getWeights().get("q_b_proj");
      // o-proj=heads: grouped-query attention's o_proj by its heads'
      // columns (each duck its heads' outputs in, partial sums back).
      const bool oHeads = oProj == "heads" && op.getKind() == "gqa";
      if (oProj == "heads" && !oHeads && !absorb) {
        op.emitOpError("o-proj=heads is grouped-query attention's; DeepSeek's "
                       "MLA goes to the ducks by heads with --mla-absorb "
                       "ducks (and --q-proj ducks)");
        result = failure();
        return WalkResult::interrupt();
      }
      if (oHeads && failed(oByHeads(module, op))) {
        result = failure();
        return WalkResult::interrupt();
      }
      if (oProj == "ducks" && !absorb &&
          failed(placeRows(module, op, {op.getOProj()}, "o_proj",
                           "--o-proj host"))) {
        result = failure();
        return WalkResult::interrupt();
      }
      // The input projections first: with an indexer the query group then
      // takes its wq_b too. GQA's q_proj (MLA's without a query LoRA) is
      // an input projection, so q-proj adds nothing there.
      if (in && op.getIndexerAttr() && qProj != "ducks") {
        op.emitOpError("the input projections go to the ducks with an "
                       "indexer only together with the query projections: "
                       "the indexer hands the attention its queries (add "
                       "--q-proj ducks)");
        result = failure();
        return WalkResult::interrupt();
      }
      if (in && failed(placeRows(module, op, op.getInProjs(),
                                 "input projections", "--in-proj host",
                                 "in_"))) {
        result = failure();
        return WalkResult::interrupt();
      }
      const bool qSeparate = !in || op.getWeights().get("q_b_proj");
      if (qProj == "ducks" && qSeparate && !absorb &&
          failed(placeRows(module, op, op.getQProjs(), "query projection",
                           "--q-proj host", "q_"))) {
        result = failure();
        return WalkResult::interrupt();
      }
      if (absorb && failed(absorbHeads(module, op))) {
        result = failure();
        return WalkResult::interrupt();
      }
      return WalkResult::advance();
    });
    return result;
  }

  /// The pass options, checked before anything is read from the module:
  /// the strategy spec parsed, or failure after an error on `module`.
  FailureOr<StrategySpec> checkOptions(ModuleOp module) {
    for (auto [name, value] :
         {std::pair{"q-proj", &qProj}, std::pair{"in-proj", &inProj},
          std::pair{"o-proj", &oProj}, std::pair{"mla-absorb", &mlaAbsorb},
          std::pair{"lm-head", &lmHead}})
      if (*value != "host" && *value != "ducks" &&
          !(value == &oProj && *value == "heads")) {
        module.emitError() << "duck-partition: " << name
                           << " must be host or ducks, got '"
                           << std::string(*value) << "'";
        return failure();
      }
    // Diagnostics take pass options by value: cast them, or an
    // Option<int64_t> converts to `char` and prints as a control byte.
    if (tp < 1) {
      module.emitError() << "duck-partition: tp must be at least 1, got "
                         << (int64_t)tp;
      return failure();
    }
    llvm::Expected<StrategySpec> spec = parseStrategySpec(strategy);
    if (!spec) {
      module.emitError() << "duck-partition: "
                         << llvm::toString(spec.takeError())
                         << " (expected intermediate, experts, or a list by "
                            "MoE layer such as intermediate,experts:3-30)";
      return failure();
    }
    if (!shares.empty() &&
        ((int64_t)shares.size() != tp ||
         llvm::any_of(shares, [](double v) { return !(v > 0); }))) {
      module.emitError() << "duck-partition: shares needs " << (int64_t)tp
                         << " positive values (one a duck), got "
                         << shares.size();
      return failure();
    }
    return std::move(*spec);
  }

  /// A range naming a dense layer as experts, or no layer at all, is a
  /// mistake in the spec.
  LogicalResult checkRanges(ModuleOp module, const StrategySpec &spec,
                            ArrayRef<FfnInfo> ffns) {
    for (const StrategySpec::Range &r : spec.ranges) {
      bool any = false;
      for (const FfnInfo &f : ffns) {
        if (f.layer < r.first || f.layer > r.last)
          continue;
        any = true;
        if (!f.moe && r.strategy == Strategy::experts) {
          f.op->emitOpError()
              << "layer " << f.layer
              << " is dense: only MoE layers can place whole experts "
                 "(strategy '"
              << strategy << "')";
          return failure();
        }
      }
      if (!any) {
        module.emitError() << "duck-partition: strategy '" << strategy
                           << "' names layers " << r.first << "-" << r.last
                           << ", but the model's FFN layers are "
                           << (ffns.empty() ? 0 : ffns.front().layer) << "-"
                           << (ffns.empty() ? -1 : ffns.back().layer);
        return failure();
      }
    }
    return success();
  }

  /// Layers placed by whole experts keep their full intermediate size on a
  /// duck, so tp does not bound their block.
  static bool splitsInter(const StrategySpec &spec, const FfnInfo &f) {
    return !(f.moe && spec.of(f.layer) == Strategy::experts);
  }

  /// multiple_of (the block, and the fp9 K-block of every FFN matrix): the
  /// option's value, or with auto the largest of 128, 64, 32 every layer
  /// admits; in an FP8 checkpoint it must divide the scale tiles' columns.
  FailureOr<int64_t> chooseMultipleOf(ModuleOp module,
                                      const StrategySpec &spec,
                                      ArrayRef<FfnInfo> ffns) {
    const int64_t tileCols = fp8TileCols(module);
    auto fitsTiles = [&](int64_t cand) {
      return tileCols <= 0 || tileCols % cand == 0;
    };
    if (tileCols > 0 && tileCols % 32 != 0) {
      module.emitError() << "duck-partition: the FP8 scale tiles are "
                         << tileCols
                         << " columns wide (quantization_config."
                            "weight_block_size), which no fp9 block (128, 64 "
                            "or 32) divides";
      return failure();
    }
    if (multipleOf == "auto") {
      auto admits = [&](const FfnInfo &f, int64_t cand) {
        return f.inter % cand == 0 && fitsTiles(cand) &&
               (!splitsInter(spec, f) || f.inter / cand >= tp);
      };
      for (int64_t cand : {128, 64, 32})
        if (llvm::all_of(ffns,
                         [&](const FfnInfo &f) { return admits(f, cand); }))
          return cand;
      // Report against the smallest block: the layer that blocks it.
      for (const FfnInfo &f : ffns)
        if (!admits(f, 32)) {
          f.op->emitOpError()
              << "layer " << f.layer << ": no multiple_of in {128, 64, 32} "
              << "splits intermediate size " << f.inter
              << " over tp = " << (int64_t)tp
              << " ducks; the largest tp that would work is "
              << (f.inter % 32 == 0 ? f.inter / 32 : 0)
              << " (multiple_of = 32)";
          return failure();
        }
      return (int64_t)0; // unreachable: a layer failed every candidate
    }
    if (multipleOf != "128" && multipleOf != "64" && multipleOf != "32") {
      module.emitError() << "duck-partition: multiple-of must be 128, 64, 32 "
                            "or auto, got '"
                         << multipleOf << "'";
      return failure();
    }
    const int64_t mo = std::stoll(multipleOf);
    if (!fitsTiles(mo)) {
      module.emitError() << "duck-partition: multiple_of = " << mo
                         << " does not divide the FP8 scale tiles' "
                         << tileCols
                         << " columns (quantization_config."
                            "weight_block_size): an fp9 block must lie in "
                            "one tile (use multiple_of = "
                         << (tileCols % 64 == 0 ? 64 : 32) << ")";
      return failure();
    }
    return mo;
  }

  /// Whether layer `f` can be cut at tp: its intermediate size in whole
  /// mo-blocks, tp of them at most, or tp experts at least by experts.
  LogicalResult checkLayerFits(const FfnInfo &f, int64_t mo, bool byExperts) {
    if (f.inter % mo != 0) {
      std::string hint = smallerBlockHint(f.inter, mo);
      auto diag = f.op->emitOpError()
                  << "layer " << f.layer << ": intermediate size " << f.inter
                  << " is not a multiple of multiple_of = " << mo
                  << ", so it cannot be cut into " << mo << "-neuron blocks";
      if (!hint.empty())
        diag << " (smaller blocks: " << hint << ")";
      return failure();
    }
    const int64_t blocks = f.inter / mo;
    if (!byExperts && tp > blocks) {
      std::string hint = smallerBlockHint(f.inter, mo);
      auto diag = f.op->emitOpError()
                  << "layer " << f.layer
                  << ": cannot split intermediate size " << f.inter
                  << " over tp = " << (int64_t)tp
                  << " ducks with multiple_of = " << mo
                  << ": each duck needs a whole number of " << mo
                  << "-neuron blocks, so tp_max = " << blocks
                  << "; the largest tp that would work is " << blocks;
      if (!hint.empty())
        diag << " (smaller blocks: " << hint << ")";
      return failure();
    }
    if (byExperts && f.experts < tp) {
      f.op->emitOpError()
          << "layer " << f.layer << ": " << f.experts
          << " experts (shared ones included) cannot be placed whole on tp = "
          << (int64_t)tp
          << " ducks: each duck needs at least one; use "
             "strategy=intermediate or tp <= "
          << f.experts;
      return failure();
    }
    return success();
  }

  /// Each duck's count of a layer's units (blocks, or whole experts).
  /// Whole experts are apportioned like blocks: equal shares give
  /// units % tp ducks one more, never the last when it holds the
  /// always-active shared experts (ids after the routed ones). Which
  /// ducks take the extra ones rotates from layer to layer, so no duck
  /// holds an extra block or expert in every layer (DeepSeek-V3.2 at tp
  /// 32: duck 0 held 9 experts a layer to the others' 8, 12 % more
  /// memory; Qwen3-30B-A3B at tp 4, multiple_of 128: ducks 0 and 1 held
  /// 2 of every expert's 6 blocks, 10.1 GiB to the others' 5.1). A
  /// layer's slowest duck is the same either way.
  SmallVector<int64_t> unitCounts(const FfnInfo &f, bool byExperts,
                                  int64_t units) const {
    SmallVector<int64_t> counts = blockCounts(units);
    const int64_t extra = units % tp;
    const int64_t takers = byExperts && f.shared > 0 ? tp - 1 : tp;
    if (shares.empty() && extra > 0 && extra < takers) {
      for (int64_t r = 0; r < tp; ++r)
        counts[r] = units / tp;
      for (int64_t k = 0; k < extra; ++k)
        ++counts[(f.layer * extra + k) % takers];
    }
    return counts;
  }

  /// Records layer `f`'s cut on its op and replaces its body with one
  /// duck.fp9_ffn a duck (its block or expert range).
  void cutLayer(const FfnInfo &f, int64_t mo, bool byExperts,
                int64_t tpMax) {
    MLIRContext *ctx = f.op->getContext();
    OpBuilder b(ctx);
    f.op->setAttr("tp", b.getI64IntegerAttr(tp));
    f.op->setAttr("multiple_of", b.getI64IntegerAttr(mo));
    f.op->setAttr("tp_max", b.getI64IntegerAttr(tpMax));
    f.op->setAttr("strategy", StrategyAttr::get(ctx, byExperts
                                                         ? Strategy::experts
                                                         : Strategy::intermediate));
    Region &region = f.op->getRegion(0);
    region.getBlocks().clear();
    Block *body = new Block();
    region.push_back(body);
    b.setInsertionPointToEnd(body);
    const int64_t units = byExperts ? f.experts : f.inter / mo;
    SmallVector<int64_t> counts = unitCounts(f, byExperts, units);
    int64_t first = 0;
    for (int64_t r = 0; r < tp; ++r) {
      int64_t ib = 0, ie = f.inter, eb = 0, ee = f.experts;
      if (byExperts) {
        eb = first;
        ee = first + counts[r];
      } else {
        ib = first * mo;
        ie = (first + counts[r]) * mo;
      }
      first += counts[r];
      b.create<Fp9FfnOp>(f.op->getLoc(), b.getI64IntegerAttr(r),
                         b.getI64IntegerAttr(ib), b.getI64IntegerAttr(ie),
                         b.getI64IntegerAttr(eb), b.getI64IntegerAttr(ee),
                         b.getI64IntegerAttr(mo), nullptr, nullptr, nullptr,
                         nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    }
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<StrategySpec> spec = checkOptions(module);
    if (failed(spec))
      return signalPassFailure();
    SmallVector<FfnInfo> ffns;
    module.walk([&](Operation *op) {
      if (isa<MlpOp, MoeOp>(op))
        ffns.push_back(infoOf(op));
    });
    if (failed(checkRanges(module, *spec, ffns)))
      return signalPassFailure();
    FailureOr<int64_t> chosen = chooseMultipleOf(module, *spec, ffns);
    if (failed(chosen))
      return signalPassFailure();
    const int64_t mo = *chosen;

    MLIRContext *ctx = module.getContext();
    int64_t tpMaxAll = 0;
    bool anyByExperts = false, anySplitMoe = false;
    for (const FfnInfo &f : ffns) {
      const bool byExperts = !splitsInter(*spec, f);
      if (failed(checkLayerFits(f, mo, byExperts)))
        return signalPassFailure();
      const int64_t tpMax = byExperts ? f.experts : f.inter / mo;
      tpMaxAll = tpMaxAll == 0 ? tpMax : std::min(tpMaxAll, tpMax);
      anyByExperts |= byExperts;
      anySplitMoe |= f.moe && !byExperts;
      cutLayer(f, mo, byExperts, tpMax);
    }
    if (failed(placeRowMatrices(module)))
      return signalPassFailure();
    // The partition, once, for every later pass and the plan writer.
    module->setAttr(
        kPartitionAttrName,
        PartitionAttr::get(
            ctx, tp, mo,
            !anyByExperts ? Strategy::intermediate
            : anySplitMoe ? Strategy::mixed
                          : Strategy::experts,
            tpMaxAll,
            shares.empty()
                ? DenseF64ArrayAttr()
                : DenseF64ArrayAttr::get(
                      ctx, SmallVector<double>(shares.begin(), shares.end()))));
  }
};

} // namespace
