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
  r.wireAtQ8 = base.cluster.cost.wireX == ClusterModel::Wire::q8 &&
               base.cluster.cost.wireOut == ClusterModel::Wire::q8;
  const bool links = base.cluster.cost.hostLinkGbps > 0 ||
                     !base.cluster.cost.duckLinkGbps.empty();
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

llvm::Expected<Candidate> mlir::duck::choosePlan(const CompileOptions &base,
                                                 const PlanChoice &open,
                                                 llvm::raw_ostream &out) {
  if (!open.fanoutOpen)
    return searchPlans(base, open, out);
  // The cluster file names a cast address and --fanout was not given:
  // the faster of the two searches, its --explain text shown.
  CompileOptions uni = base, cast = base;
  uni.cluster.cost.fanout = ClusterModel::Fanout::unicast;
  cast.cluster.cost.fanout = ClusterModel::Fanout::multicast;
  std::string uniText, castText;
  llvm::raw_string_ostream uniOut(uniText), castOut(castText);
  llvm::Expected<Candidate> a = searchPlans(uni, open, uniOut);
  if (!a)
    return a.takeError();
  llvm::Expected<Candidate> b = searchPlans(cast, open, castOut);
  if (!b)
    return b.takeError();
  const bool castWins = b->tokS > a->tokS;
  out << (castWins ? castOut.str() : uniOut.str());
  if (open.explain)
    out << llvm::formatv(
        "fanout: {0} ({1:F2} tok/s) over {2} ({3:F2} "
        "tok/s): the cluster file names a cast address\n",
        castWins ? "multicast" : "unicast", castWins ? b->tokS : a->tokS,
        castWins ? "unicast" : "multicast", castWins ? a->tokS : b->tokS);
  return castWins ? std::move(*b) : std::move(*a);
}
