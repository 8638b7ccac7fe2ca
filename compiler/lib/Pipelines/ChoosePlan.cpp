//===- ChoosePlan.cpp - duckc compile --tp auto / --explain ---------------===//
#include "duck/Pipelines/ChoosePlan.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"

using namespace mlir::duck;
using cost::Candidate;

namespace {

/// Whether the model's attention is DeepSeek's MLA (config.json has a
/// kv_lora_rank).
bool modelIsMla(llvm::StringRef modelDir) {
  llvm::SmallString<256> path(modelDir);
  llvm::sys::path::append(path, "config.json");
  auto buf = llvm::MemoryBuffer::getFile(path);
  if (!buf)
    return false;
  llvm::Expected<llvm::json::Value> v = llvm::json::parse((*buf)->getBuffer());
  if (!v) {
    llvm::consumeError(v.takeError());
    return false;
  }
  const llvm::json::Object *o = v->getAsObject();
  return o && o->getInteger("kv_lora_rank").value_or(0) > 0;
}

/// Lays out one candidate (dry run, stats only) and reads the prediction;
/// from `imported` when given (the model imported once for the search).
Candidate evaluate(ImportedModel *imported, CompileOptions o,
                   const Candidate &spec) {
  Candidate c;
  c.tp = spec.tp;
  c.multipleOf = spec.multipleOf;
  c.strategy = spec.strategy;
  c.lmHead = spec.lmHead;
  c.oProj = spec.oProj;
  c.qProj = spec.qProj;
  c.inProj = spec.inProj;
  o.lmHead = spec.lmHead;
  o.oProj = spec.oProj;
  o.qProj = spec.qProj;
  o.inProj = spec.inProj;
  c.byHeads = spec.byHeads;
  if (spec.byHeads)
    o.mlaAbsorb = spec.mlaAbsorb;
  c.mlaAbsorb = o.mlaAbsorb;
  o.cluster.tp = spec.tp;
  // Memory is checked here, after the cost model has costed the candidate.
  std::vector<uint64_t> memory = std::move(o.cluster.memoryBytes);
  o.cluster.memoryBytes.clear();
  if (!memory.empty())
    memory.resize(spec.tp, memory.back());
  o.multipleOf = spec.multipleOf;
  o.strategy = spec.strategy;
  o.emit = CompileOptions::Emit::Stats;
  o.dryRun = true;
  o.progress = false;
  o.verifyEachPass = false;
  std::string text, log;
  llvm::raw_string_ostream os(text), ls(log);
  if (llvm::Error e = imported ? imported->compile(o, os, ls)
                               : compileModel(o, os, ls)) {
    c.why = llvm::toString(std::move(e));
    return c;
  }
  llvm::Expected<llvm::json::Value> v = llvm::json::parse(os.str());
  const llvm::json::Object *j = v ? v->getAsObject() : nullptr;
  if (!j) {
    if (!v)
      llvm::consumeError(v.takeError());
    c.why = "no stats";
    return c;
  }
  cost::readStats(*j, c);
  if (llvm::Error e = checkDuckMemory(c.duckBytes, memory)) {
    c.why = llvm::toString(std::move(e));
    return c;
  }
  c.ok = true;
  return c;
}

/// After each intermediate / experts pair, the mix of the two the cost
/// model prefers (when it is neither), laid out as a list by layer.
std::vector<Candidate> withMixes(const std::vector<Candidate> &all,
                                 const CompileOptions &base) {
  std::vector<Candidate> out;
  for (const Candidate &c : all) {
    out.push_back(c);
    if (c.strategy != "experts")
      continue;
    auto twin = llvm::find_if(all, [&](const Candidate &o) {
      return o.strategy == "intermediate" && o.samePlaces(c);
    });
    if (twin == all.end())
      continue;
    std::vector<uint64_t> memory = base.cluster.memoryBytes;
    if (!memory.empty())
      memory.resize(c.tp, memory.back());
    std::vector<std::pair<int64_t, Strategy>> layers;
    for (auto [layer, experts] : cost::mixLayers(*twin, c, memory))
      layers.push_back(
          {layer, experts ? Strategy::experts : Strategy::intermediate});
    if (layers.empty())
      continue;
    Candidate mix = c;
    mix.strategy = strategySpecOf(layers);
    out.push_back(evaluate(nullptr, base, mix));
  }
  return out;
}

} // namespace

namespace {
/// One search over what `open` leaves, with base's fanout; its --explain
/// text into `out`.
llvm::Expected<Candidate> searchPlans(const CompileOptions &base,
                                      const PlanChoice &open,
                                      llvm::raw_ostream &out) {

  const bool hostCosted = base.cluster.cost.hostReadGbs > 0;
  cost::SearchRequest r;
  r.ducks = base.cluster.tp;
  r.tpOpen = open.tpOpen;
  r.multipleOfOpen = open.multipleOfOpen;
  r.strategyOpen = open.strategyOpen;
  r.lmHeadOpen = open.lmHeadFree && hostCosted;
  r.projOpen = open.projFree && hostCosted;
  r.multipleOf = base.multipleOf;
  r.strategy = base.strategy;
  r.lmHead = base.lmHead;
  r.inProj = base.inProj;
  r.qProj = base.qProj;
  r.oProj = base.oProj;
  // By heads: an MLA's always (kv_b_proj leaves the host); a GQA's only
  // changes the wire, so only where the cluster file gives link speeds.
  r.mla = modelIsMla(base.modelDir);
  r.wireX = base.cluster.cost.wireX;
  r.wireOut = base.cluster.cost.wireOut;
  const bool links = base.cluster.cost.linksGiven();
  // (--mla-absorb fixes an MLA's choice; a GQA model has nothing to absorb,
  // so the flag leaves its by-heads candidates open.)
  r.byHeadsOpen = r.projOpen && (base.mlaAbsorb == "host" || !r.mla) &&
                  base.oProj != "heads" && (r.mla || links);
  std::vector<Candidate> all = cost::enumerateCandidates(r);
  // Each candidate is a dry-run layout of its own (DeepSeek-V3.2 with --tp
  // auto over 32 ducks: 1536 of them, 7.7 s of CPU). Each thread imports
  // the model once and lays its candidates out from copies (the import
  // was most of a candidate's time); if the import fails, every candidate
  // reports the error compileModel gives.
  auto makeEvaluator = [&]() -> cost::Evaluator {
    std::shared_ptr<ImportedModel> imported;
    if (auto m = ImportedModel::import(base.modelDir, base.mtp))
      imported = std::move(*m);
    else
      llvm::consumeError(m.takeError());
    return [&base, imported](const Candidate &spec) {
      return evaluate(imported.get(), base, spec);
    };
  };
  const bool tty = llvm::sys::Process::StandardErrIsDisplayed();
  cost::costCandidates(all, makeEvaluator, tty || base.progress, tty);
  if (open.strategyOpen)
    all = withMixes(all, base);
  const Candidate *best = cost::pickBest(all);
  if (open.explain)
    cost::explainCandidates(all, best, r, base.cluster.cost,
                            base.cluster.memoryBytes, out);
  if (!best)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   cost::noCandidateMessage(all));
  if (open.explain)
    cost::explainChoice(all, *best, r, out);
  Candidate chosen = *best;
  chosen.multicast =
      base.cluster.cost.fanout == ClusterModel::Fanout::multicast;
  return chosen;
}
} // namespace

namespace {
/// A search run with each of two option sets (`second` differing in one
/// open choice), both --explain texts kept apart; `secondWins` when the
/// second's prediction beats the first's by more than `margin` (a
/// fraction).
struct TwoSearches {
  Candidate first, second;
  std::string firstText, secondText;
  bool secondWins = false;
};

template <typename Search>
llvm::Expected<TwoSearches> searchBoth(Search search,
                                       const CompileOptions &first,
                                       const CompileOptions &second,
                                       const PlanChoice &open, double margin) {
  TwoSearches t;
  llvm::raw_string_ostream firstOut(t.firstText), secondOut(t.secondText);
  llvm::Expected<Candidate> a = search(first, open, firstOut);
  if (!a)
    return a.takeError();
  llvm::Expected<Candidate> b = search(second, open, secondOut);
  if (!b)
    return b.takeError();
  t.first = std::move(*a);
  t.second = std::move(*b);
  t.secondWins = t.second.tokS > t.first.tokS * (1 + margin);
  return t;
}

/// searchPlans, once with each fanout where `open` leaves it (the cluster
/// file names a cast address and --fanout was not given): the faster, its
/// --explain text shown.
llvm::Expected<Candidate> searchFanouts(const CompileOptions &base,
                                        const PlanChoice &open,
                                        llvm::raw_ostream &out) {
  if (!open.fanoutOpen)
    return searchPlans(base, open, out);
  CompileOptions uni = base, cast = base;
  uni.cluster.cost.fanout = ClusterModel::Fanout::unicast;
  cast.cluster.cost.fanout = ClusterModel::Fanout::multicast;
  llvm::Expected<TwoSearches> t = searchBoth(searchPlans, uni, cast, open, 0);
  if (!t)
    return t.takeError();
  const bool castWins = t->secondWins;
  out << (castWins ? t->secondText : t->firstText);
  if (open.explain)
    out << llvm::formatv("fanout: {0} ({1:F2} tok/s) over {2} ({3:F2} "
                         "tok/s): the cluster file names a cast address\n",
                         castWins ? "multicast" : "unicast",
                         castWins ? t->second.tokS : t->first.tokS,
                         castWins ? "unicast" : "multicast",
                         castWins ? t->first.tokS : t->second.tokS);
  return castWins ? std::move(t->second) : std::move(t->first);
}

/// The wire's formats both ways, for the `wire:` line.
std::string wireWords(const ClusterModel &w) {
  return w.wireX == w.wireOut
             ? std::string(ClusterModel::wireName(w.wireX)) + " both ways"
             : std::string(ClusterModel::wireName(w.wireX)) + " activations, " +
                   ClusterModel::wireName(w.wireOut) + " answers";
}
} // namespace

WireAdmission mlir::duck::checkpointWire(const import::ModelDesc &model) {
  using Wire = ClusterModel::Wire;
  const import::QuantizationConfig &q = model.quantization;
  if (q.isFp8() && q.activation_scheme == "dynamic")
    return {Wire::q8, "the checkpoint's own inference rounds each token's "
                      "inputs to its FP8 matrices to e4m3 in blocks of 128 "
                      "(quantization_config: activation_scheme dynamic), "
                      "which moves the logits more than q8 both ways does "
                      "(test/e2e/wire-auto.test)"};
  if (model.torch_dtype == "bfloat16")
    return {Wire::bf16, "the checkpoint's own inference multiplies bf16 "
                        "values (torch_dtype bfloat16)"};
  return {Wire::f32, "the checkpoint names no coarser format for its "
                     "activations"};
}

llvm::Expected<Candidate> mlir::duck::choosePlan(const CompileOptions &base,
                                                 const PlanChoice &open,
                                                 llvm::raw_ostream &out) {
  using Wire = ClusterModel::Wire;
  const bool links = base.cluster.cost.linksGiven();
  WireAdmission admit;
  if (links && (open.wireXOpen || open.wireOutOpen)) {
    llvm::SmallString<256> path(base.modelDir);
    llvm::sys::path::append(path, "config.json");
    if (llvm::Expected<import::ModelDesc> m = import::loadModelConfig(path))
      admit = checkpointWire(*m);
    else
      llvm::consumeError(m.takeError()); // the search reports it
  }
  auto withWires = [&](const CompileOptions &o, Candidate c) {
    c.wireX = o.cluster.cost.wireX;
    c.wireOut = o.cluster.cost.wireOut;
    return c;
  };
  if (admit.wire == Wire::f32) {
    llvm::Expected<Candidate> only = searchFanouts(base, open, out);
    if (!only)
      return only.takeError();
    if (links && (open.wireXOpen || open.wireOutOpen) && open.explain)
      out << "wire: " << wireWords(base.cluster.cost) << ": " << admit.why
          << " (--wire-activations and --wire-results bf16 or q8 by hand)\n";
    return withWires(base, std::move(*only));
  }
  // The exact wire and the coarsest the checkpoint admits on every open
  // way: the coarse one must beat the exact by more than a tie.
  CompileOptions exact = base, coarse = base;
  if (open.wireXOpen)
    coarse.cluster.cost.wireX = admit.wire;
  if (open.wireOutOpen)
    coarse.cluster.cost.wireOut = admit.wire;
  llvm::Expected<TwoSearches> t =
      searchBoth(searchFanouts, exact, coarse, open, cost::kTieFraction);
  if (!t)
    return t.takeError();
  const bool coarseWins = t->secondWins;
  const Candidate &won = coarseWins ? t->second : t->first;
  const Candidate &lost = coarseWins ? t->first : t->second;
  out << (coarseWins ? t->secondText : t->firstText);
  // Said even without --explain when the logits move (then on stderr,
  // with progress: stdout may be --emit=stats's JSON).
  if (open.explain || coarseWins)
    (open.explain ? out : llvm::errs() << "duckc: ") << llvm::formatv(
        "wire: {0} ({1:F2} tok/s) over {2} ({3:F2} tok/s){4}; {5} is "
        "admitted because {6}; --wire-activations f32 --wire-results f32 "
        "keep the exact wire\n",
        wireWords(coarseWins ? coarse.cluster.cost : exact.cluster.cost),
        won.tokS,
        wireWords(coarseWins ? exact.cluster.cost : coarse.cluster.cost),
        lost.tokS,
        coarseWins ? ""
                   : ": not faster by more than a tie, the exact wire kept",
        ClusterModel::wireName(admit.wire), admit.why);
  return coarseWins ? withWires(coarse, std::move(t->second))
                    : withWires(exact, std::move(t->first));
}
