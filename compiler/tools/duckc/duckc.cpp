//===- duckc.cpp - The Duck compiler driver -------------------------------===//
//
// A thin dispatcher over the compiler libraries. Each subcommand is a
// cl::SubCommand, its cl::opt's (tied to it with cl::sub) and one run
// function listed in kSubcommands; adding a subcommand touches nothing else.
// measure-cluster is the exception: it execs the runtime's
// duck-measure-cluster (the compiler links nothing of the runtime).
//
//===----------------------------------------------------------------------===//

#include "duck/Dialect/Duck/Transforms/Layout.h"
#include "duck/Import/Checkpoint.h"
#include "duck/Import/Fp9Report.h"
#include "duck/Pipelines/Compile.h"
#include "duck/Target/Plan/PlanVerifier.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/Signals.h"
#include "llvm/Support/Threading.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#ifndef DUCK_VERSION
#define DUCK_VERSION "unknown"
#endif

using namespace llvm;
namespace imp = mlir::duck::import;

namespace {

cl::OptionCategory duckcCategory("duckc options");

//===----------------------------------------------------------------------===//
// duckc describe
//===----------------------------------------------------------------------===//

cl::SubCommand
    describeCmd("describe",
                "Describe a model directory (config.json and, if present, "
                "its safetensors weights) and check the weights");
cl::opt<std::string> describeDir(cl::Positional, cl::Required,
                                 cl::desc("<model-dir>"), cl::sub(describeCmd),
                                 cl::cat(duckcCategory));
cl::opt<bool> describeJson("json",
                           cl::desc("Print the description as one JSON "
                                    "object of sections instead of "
                                    "'key: value' lines"),
                           cl::sub(describeCmd), cl::cat(duckcCategory));

Error runDescribe() {
  Expected<std::unique_ptr<imp::Checkpoint>> ckpt =
      imp::Checkpoint::open(describeDir);
  if (!ckpt)
    return ckpt.takeError();
  Expected<imp::DescribeReport> report = imp::describeCheckpoint(**ckpt);
  if (!report)
    return report.takeError();
  if (describeJson)
    outs() << formatv("{0:2}", report->toJson()) << "\n";
  else
    report->printText(outs());
  return Error::success();
}


//===----------------------------------------------------------------------===//
// duckc compile
//===----------------------------------------------------------------------===//

cl::SubCommand compileCmd("compile",
                          "Compile a model directory into a plan plus one fp9 "
                          "weight image per duck");
cl::opt<std::string> compileDir(cl::Positional, cl::Required,
                                cl::desc("<model-dir>"), cl::sub(compileCmd),
                                cl::cat(duckcCategory));
cl::opt<std::string> compileOut("o", cl::desc("Output plan directory"),
                                cl::value_desc("out-dir"), cl::sub(compileCmd),
                                cl::cat(duckcCategory));
cl::opt<std::string> compileCluster(
    "cluster",
    cl::desc("Cluster description (JSON): the ducks' cores and memory, and "
             "the cost model; --tp/--cores-per-duck override it"),
    cl::value_desc("file"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileTp(
    "tp",
    cl::desc("Number of ducks (tensor parallel size), or auto: try every "
             "legal tp up to the cluster file's ducks, multiple_of and "
             "strategy with the cost model and keep the fastest that fits "
             "(--explain shows the table); default 1"),
    cl::value_desc("N|auto"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<bool> compileExplain(
    "explain",
    cl::desc("Print the candidates the cost model compared (predicted TPOT, "
             "its parts, the largest shard against a duck's memory) and why "
             "the winner won"),
    cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileMultipleOf(
    "multiple-of",
    cl::desc("down_proj K-block: 128, 64, 32, or auto (largest that fits tp)"),
    cl::init("auto"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileStrategy(
    "strategy",
    cl::desc("intermediate (split every FFN over all ducks), experts "
             "(whole experts per duck), a list by MoE layer "
             "(intermediate,experts:3-30: later items override earlier "
             "ones), or auto (the cost model's choice, layer by layer; what "
             "--tp auto does when --strategy is not given)"),
    cl::init("intermediate"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<int64_t> compileCores("cores-per-duck",
                              cl::desc("Cores of each duck (> 1 selects the "
                                       "SMP MoE mode); default 1"),
                              cl::init(0), cl::sub(compileCmd),
                              cl::cat(duckcCategory));
cl::opt<double> compileMemory("duck-memory-gib",
                              cl::desc("Weight memory of each duck; the "
                                       "compile fails if a shard needs more"),
                              cl::init(0), cl::sub(compileCmd),
                              cl::cat(duckcCategory));
cl::opt<double> compileBw("bandwidth-gbs",
                          cl::desc("Cost model: a duck's streaming bandwidth "
                                   "(default 10, or the cluster file's)"),
                          cl::init(0), cl::sub(compileCmd),
                          cl::cat(duckcCategory));
cl::opt<double> compileOverhead("step-overhead-us",
                                cl::desc("Cost model: dispatch cost of one FFN "
                                         "step (default 80 us)"),
                                cl::init(-1), cl::sub(compileCmd),
                                cl::cat(duckcCategory));
cl::opt<std::string> compileEmit(
    "emit",
    cl::desc("What to produce: plan (default: plan + weight images in -o), "
             "mlir (the duck IR), stats (JSON: sizes, traffic, kernels)"),
    cl::init("plan"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileTo(
    "compile-to",
    cl::desc("With --emit=mlir, stop after a phase: import, partition, "
             "kernels, modes, layout"),
    cl::init("layout"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<bool> compileDryRun("dry-run",
                            cl::desc("Lay out and report without reading or "
                                     "writing weights (config.json suffices)"),
                            cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<bool> compileForce("force",
                           cl::desc("Replace a non-empty output directory"),
                           cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileOProj(
    "o-proj",
    cl::desc("Where every attention's output projection runs: 'host' "
             "(default), or 'ducks': its rows split over the ducks in whole "
             "128-row tiles (in proportion to their measured rates; FP8 "
             "tiles in halves or quarters when they are fewer than the "
             "ducks), in fp9 (exact for FP8 checkpoints); one more duck step "
             "a layer, and "
             "the host reads none of it (DeepSeek-V3.2: 7 GB a token)"),
    cl::init("host"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileQProj(
    "q-proj",
    cl::desc("Where every attention's query projection runs (DeepSeek's "
             "q_b_proj after the query LoRA, else q_proj): 'host' "
             "(default), or 'ducks', as --o-proj: one more duck step a "
             "layer, the host reads none of it (DeepSeek-V3.2: 2.6 GB a "
             "token)"),
    cl::init("host"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileInProj(
    "in-proj",
    cl::desc("Where every attention's input projections run: q_proj, "
             "k_proj and v_proj (Qwen3); q_a_proj (or q_proj), "
             "kv_a_proj_with_mqa and DeepSeek-V3.2's indexer wk (MLA). "
             "'host' (default), or 'ducks': their rows as one group split "
             "over the ducks as --o-proj does, one more duck step a layer. "
             "With an indexer it needs --q-proj ducks too, which then also "
             "carries the indexer's wq_b (DeepSeek-V3.2: 2.7 GB a token off "
             "the host)"),
    cl::init("host"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileLmHead(
    "lm-head",
    cl::desc("Where the LM head runs and in what format. On the host: "
             "'checkpoint' keeps the checkpoint's dtype (bf16: exact); "
             "'int8' quantises it at load (a scale per 32 weights of a "
             "row): 1.125 bytes a weight instead of 2, logits move by about "
             "0.5%; 'fp9' (a scale per 128 x 128 tile): the same bytes, "
             "logits move by a few percent. 'ducks': fp9 as 'fp9', its "
             "vocabulary rows split over the ducks in whole 128-row tiles "
             "(in proportion to their measured rates); each duck returns "
             "the logits of its rows, bit for bit what 'fp9' gives, and the "
             "host reads none of the head"),
    cl::init("checkpoint"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileWire(
    "wire-activations",
    cl::desc("How a step's activations (x) travel to the ducks: 'f32' "
             "(default: the host's values, bit for bit) or 'bf16': half the "
             "bytes on the host's link (rounded to nearest even; every "
             "duck then multiplies those rounded values: the logits moved "
             "by 0.17-0.34% relative L2 on Qwen3 test models and by 15% on "
             "a random DeepSeek-V3 one). The cost model's network time "
             "follows"),
    cl::init("f32"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<bool> compileProgress("progress",
                              cl::desc("Show progress even when stderr is "
                                       "not a terminal"),
                              cl::sub(compileCmd), cl::cat(duckcCategory));

/// One candidate partition and what the cost model predicts for it.
struct Candidate {
  int64_t tp = 1;
  std::string multipleOf, strategy, lmHead, oProj = "host", qProj = "host",
                                            inProj = "host";
  /// Where the attention projections went (the stats say: a GQA query
  /// projection is one of its input projections, so in+q is in there).
  bool inOn = false, qOn = false, oOn = false;
  /// For --explain: "host", or those on the ducks ("in+q+o").
  std::string attn() const {
    std::string s;
    for (auto [on, name] : {std::pair{inOn, "in"}, std::pair{qOn, "q"},
                            std::pair{oOn, "o"}})
      if (on)
        s += (s.empty() ? "" : "+") + std::string(name);
    return s.empty() ? "host" : s;
  }
  /// The same in words, for the chosen line.
  std::string attnWords() const {
    if (!inOn && !qOn && !oOn)
      return ", attention projections on the host";
    if (!inOn && !qOn)
      return ", o_proj on the ducks";
    std::vector<std::string> w;
    for (auto [on, name] : {std::pair{inOn, "input"}, std::pair{qOn, "query"},
                            std::pair{oOn, "output"}})
      if (on)
        w.push_back(name);
    std::string s = ", " + w[0];
    for (size_t i = 1; i < w.size(); ++i)
      s += (i + 1 == w.size() ? " and " : ", ") + w[i];
    return s + " projections on the ducks";
  }
  int steps() const { return inOn + qOn + oOn; }
  bool ok = false;
  std::string why; // the compiler's refusal when not ok
  double tokS = 0, streamMs = 0, dispatchMs = 0, hostMs = 0, prefillTokS = 0;
  double networkMs = 0; // 0: no link speed in the cluster file
  uint64_t maxShardBytes = 0;
  /// The cost model's figures, even when the shards do not fit (`ok`
  /// false, `why` says which duck): what a per-layer mix is made from.
  bool costed = false;
  std::vector<uint64_t> duckBytes;
  struct Layer {
    int64_t layer;
    bool moe;
    mlir::duck::Strategy strategy;
    double ms;
    std::vector<uint64_t> duckBytes;
  };
  std::vector<Layer> layers;
  /// A list by layer (given, or a mix the search made): `strategy` is its
  /// spec, shown as "mixed".
  bool mixed() const {
    return strategy != "intermediate" && strategy != "experts";
  }
  std::string strategyName() const { return mixed() ? "mixed" : strategy; }
};

/// Lays out one candidate (dry run, stats only) and reads the prediction;
/// from `imported` when given (the model imported once for the search).
Candidate evaluate(mlir::duck::ImportedModel *imported,
                   mlir::duck::CompileOptions o, int64_t tp,
                   const std::string &mo, const std::string &strategy,
                   const std::string &lmHead, const std::string &oProj,
                   const std::string &qProj, const std::string &inProj) {
  Candidate c;
  c.tp = tp;
  c.multipleOf = mo;
  c.strategy = strategy;
  c.lmHead = lmHead;
  c.oProj = oProj;
  c.qProj = qProj;
  c.inProj = inProj;
  o.lmHead = lmHead;
  o.oProj = oProj;
  o.qProj = qProj;
  o.inProj = inProj;
  o.cluster.tp = tp;
  // Memory is checked here, after the cost model has costed the candidate.
  std::vector<uint64_t> memory = std::move(o.cluster.memoryBytes);
  o.cluster.memoryBytes.clear();
  if (!memory.empty())
    memory.resize(tp, memory.back());
  o.multipleOf = mo;
  o.strategy = strategy;
  o.emit = mlir::duck::CompileOptions::Emit::Stats;
  o.dryRun = true;
  o.progress = false;
  o.verifyEachPass = false;
  std::string text, log;
  raw_string_ostream os(text), ls(log);
  if (Error e = imported ? imported->compile(o, os, ls)
                         : mlir::duck::compileModel(o, os, ls)) {
    c.why = toString(std::move(e));
    return c;
  }
  Expected<json::Value> v = json::parse(os.str());
  const json::Object *j = v ? v->getAsObject() : nullptr;
  if (!j) {
    if (!v)
      consumeError(v.takeError());
    c.why = "no stats";
    return c;
  }
  c.costed = true;
  c.tokS = j->getNumber("estimated_decode_tok_s").value_or(0);
  c.streamMs = j->getNumber("stream_ms_per_token").value_or(0);
  c.dispatchMs = j->getNumber("dispatch_ms_per_token").value_or(0);
  c.hostMs = j->getNumber("host_ms_per_token").value_or(0);
  c.networkMs = j->getNumber("network_ms_per_token").value_or(0);
  c.prefillTokS = j->getNumber("estimated_prefill_tok_s").value_or(0);
  c.inOn = j->getBoolean("in_proj_on_ducks").value_or(false);
  c.qOn = j->getBoolean("q_proj_on_ducks").value_or(false);
  c.oOn = j->getBoolean("o_proj_on_ducks").value_or(false);
  if (const json::Array *a = j->getArray("per_duck_bytes"))
    for (const json::Value &b : *a) {
      c.duckBytes.push_back(b.getAsInteger().value_or(0));
      c.maxShardBytes = std::max<uint64_t>(c.maxShardBytes, c.duckBytes.back());
    }
  if (const json::Array *a = j->getArray("ffn_layer_costs"))
    for (const json::Value &v : *a) {
      const json::Object *l = v.getAsObject();
      if (!l)
        continue;
      Candidate::Layer rec{
          l->getInteger("layer").value_or(0),
          l->getBoolean("moe").value_or(false),
          mlir::duck::symbolizeStrategy(l->getString("strategy").value_or(""))
              .value_or(mlir::duck::Strategy::intermediate),
          l->getNumber("ms_per_token").value_or(0),
          {}};
      if (const json::Array *b = l->getArray("duck_bytes"))
        for (const json::Value &x : *b)
          rec.duckBytes.push_back(x.getAsInteger().value_or(0));
      c.layers.push_back(std::move(rec));
    }
  if (Error e = mlir::duck::checkDuckMemory(c.duckBytes, memory)) {
    c.why = toString(std::move(e));
    return c;
  }
  c.ok = true;
  return c;
}

/// --strategy auto, layer by layer: from a candidate's intermediate split
/// and its whole-expert placement (same tp, block and projections), each
/// MoE layer cut the way the cost model predicts faster (by more than
/// 1 %; nearer is noise of the expected-maximum estimate); then, while
/// some duck cannot hold its shard, the layer whose switch frees the most
/// of the excess for the least time switches. Returns the spec of that
/// mix, or "" when it is one of the two uniform cuts, when no mix fits,
/// or when either cut was not costed.
std::string mixStrategies(const Candidate &split, const Candidate &whole,
                          const std::vector<uint64_t> &memory) {
  using mlir::duck::Strategy;
  if (!split.costed || !whole.costed ||
      split.layers.size() != whole.layers.size() ||
      split.duckBytes.size() != whole.duckBytes.size())
    return "";
  const size_t n = split.layers.size(), tp = split.duckBytes.size();
  std::vector<bool> byExperts(n, false);
  for (size_t i = 0; i < n; ++i)
    byExperts[i] = split.layers[i].moe &&
                   whole.layers[i].ms < split.layers[i].ms * (1 - 0.01);
  // Each duck's bytes: everything but the MoE layers (the split's), plus
  // each MoE layer as cut.
  auto bytesOf = [&](const std::vector<bool> &x) {
    std::vector<uint64_t> b = split.duckBytes;
    for (size_t i = 0; i < n; ++i)
      if (x[i])
        for (size_t r = 0; r < tp && r < split.layers[i].duckBytes.size() &&
                           r < whole.layers[i].duckBytes.size();
             ++r)
          b[r] += whole.layers[i].duckBytes[r] - split.layers[i].duckBytes[r];
    return b;
  };
  auto excess = [&](const std::vector<uint64_t> &b) {
    double e = 0;
    for (size_t r = 0; r < tp && r < memory.size(); ++r)
      e += b[r] > memory[r] ? double(b[r] - memory[r]) : 0.0;
    return e;
  };
  for (double over = excess(bytesOf(byExperts)); over > 0;) {
    size_t pick = n;
    double pickGain = 0, pickCost = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!split.layers[i].moe)
        continue;
      std::vector<bool> x = byExperts;
      x[i] = !x[i];
      const double gain = over - excess(bytesOf(x));
      if (gain <= 0)
        continue;
      const double cost =
          std::max(0.0, (x[i] ? whole.layers[i].ms : split.layers[i].ms) -
                            (x[i] ? split.layers[i].ms : whole.layers[i].ms));
      // The most bytes freed a millisecond lost (free switches first).
      if (pick == n || cost * pickGain < pickCost * gain) {
        pick = i;
        pickGain = gain;
        pickCost = cost;
      }
    }
    if (pick == n)
      return ""; // no mix fits either
    byExperts[pick] = !byExperts[pick];
    over = excess(bytesOf(byExperts));
  }
  std::vector<std::pair<int64_t, Strategy>> moe;
  size_t experts = 0;
  for (size_t i = 0; i < n; ++i)
    if (split.layers[i].moe) {
      moe.push_back({split.layers[i].layer, byExperts[i]
                                                ? Strategy::experts
                                                : Strategy::intermediate});
      experts += byExperts[i];
    }
  if (experts == 0 || experts == moe.size())
    return "";
  return mlir::duck::strategySpecOf(moe);
}

/// --tp auto / --explain: every legal (tp, multiple_of, strategy) the flags
/// leave open, predicted with the cost model (fp9 bytes a token per duck
/// over its bandwidth, plus the dispatch cost of every FFN step; host work
/// not counted, unless the cluster file times it); the fastest that fits
/// wins, predictions within 3 % of it counting as ties, which go to fewer
/// ducks and then the larger K-block.
Expected<Candidate> choosePlan(const mlir::duck::CompileOptions &base,
                               bool autoTp, bool autoMo, bool autoStrategy,
                               raw_ostream &out) {
  std::vector<int64_t> tps;
  if (autoTp)
    for (int64_t t = 1; t <= base.cluster.tp; ++t)
      tps.push_back(t);
  else
    tps.push_back(base.cluster.tp);
  std::vector<std::string> mos =
      autoMo ? std::vector<std::string>{"128", "64", "32"}
             : std::vector<std::string>{base.multipleOf};
  std::vector<std::string> strategies =
      autoStrategy ? std::vector<std::string>{"intermediate", "experts"}
                   : std::vector<std::string>{base.strategy};
  // The LM head's place: when the flag leaves it open and the cluster file
  // gives the host's bandwidth (the host head's cost), the checkpoint's
  // head on the host or fp9 on the ducks.
  const bool autoHead = compileLmHead.getNumOccurrences() == 0 &&
                        base.cluster.cost.hostReadGbs > 0;
  std::vector<std::string> heads =
      autoHead ? std::vector<std::string>{base.lmHead, "ducks"}
               : std::vector<std::string>{base.lmHead};
  // The attention projections' place likewise (their bytes at the host's
  // bandwidth, or one more duck step a layer each): all on the host, the
  // o_projs on the ducks, the query and output projections, or all of
  // them with the input projections too.
  const bool autoOProj = compileOProj.getNumOccurrences() == 0 &&
                         compileQProj.getNumOccurrences() == 0 &&
                         compileInProj.getNumOccurrences() == 0 &&
                         base.cluster.cost.hostReadGbs > 0;
  struct QO {
    const char *in, *q, *o; // `base`'s strings outlive the search
  };
  std::vector<QO> oProjs;
  if (autoOProj) {
    static const QO kAuto[] = {{"host", "host", "host"},
                               {"host", "host", "ducks"},
                               {"host", "ducks", "ducks"},
                               {"ducks", "ducks", "ducks"}};
    for (const QO &qo : kAuto)
      oProjs.push_back(qo);
  } else
    oProjs.push_back(
        {base.inProj.c_str(), base.qProj.c_str(), base.oProj.c_str()});
  // Each candidate is a dry-run layout of its own (DeepSeek-V3.2 with --tp
  // auto over 32 ducks: 1536 of them, 7.7 s of CPU), so they are laid out
  // on every core, each thread taking the next; the results keep the
  // search's order. Progress on a terminal or with --progress.
  struct Job {
    int64_t tp;
    const std::string *mo, *strategy, *head;
    QO qo;
  };
  std::vector<Job> jobs;
  for (int64_t t : tps)
    for (const std::string &mo : mos)
      for (const std::string &st : strategies)
        for (const std::string &h : heads)
          for (const QO &qo : oProjs)
            jobs.push_back({t, &mo, &st, &h, qo});
  std::vector<Candidate> all(jobs.size());
  const bool tty = llvm::sys::Process::StandardErrIsDisplayed();
  const bool showProgress = tty || compileProgress;
  const size_t total = jobs.size();
  const auto searchStart = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         searchStart)
        .count();
  };
  // A candidate's layout grows with its ducks (measured on DeepSeek-V3.2,
  // the model imported once: about 24 ducks' worth of fixed work, then
  // one per duck): the ETA counts work in those units.
  uint64_t work = 0;
  for (const Job &j : jobs)
    work += (uint64_t)j.tp + 24;
  std::atomic<size_t> next{0}, finished{0};
  std::atomic<uint64_t> worked{0};
  // Each thread imports the model once and lays its candidates out from
  // copies (the import was most of a candidate's time); if the import
  // fails, every candidate reports the error compileModel gives.
  auto worker = [&] {
    std::unique_ptr<mlir::duck::ImportedModel> imported;
    if (auto m = mlir::duck::ImportedModel::import(base.modelDir))
      imported = std::move(*m);
    else
      consumeError(m.takeError());
    for (size_t i; (i = next++) < jobs.size();) {
      const Job &j = jobs[i];
      all[i] = evaluate(imported.get(), base, j.tp, *j.mo, *j.strategy, *j.head,
                        j.qo.o, j.qo.q, j.qo.in);
      worked += (uint64_t)j.tp + 24;
      ++finished;
    }
  };
  const unsigned threads = (unsigned)std::min<size_t>(
      std::max(1u, llvm::hardware_concurrency().compute_thread_count()),
      jobs.size());
  // With more than one, every core lays out candidates and this thread
  // only reports.
  std::vector<std::thread> pool;
  for (unsigned i = 0; threads > 1 && i < threads; ++i)
    pool.emplace_back(worker);
  if (threads <= 1) {
    worker();
  } else {
    double lastShown = -1;
    while (finished.load() < jobs.size()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const double secs = elapsed();
      const size_t done = finished.load();
      if (showProgress && done > 0 && done < total && secs - lastShown >= 0.5) {
        lastShown = secs;
        const double w = double(worked.load());
        errs() << formatv("{0}duckc: costing candidates: {1}/{2}, ETA {3:F0} "
                          "s{4}",
                          tty ? "\r" : "", done, total,
                          secs / w * (double(work) - w), tty ? "   " : "\n");
        errs().flush();
      }
    }
  }
  for (std::thread &t : pool)
    t.join();
  const bool shownDone = showProgress && elapsed() >= 0.5;
  if (shownDone)
    errs() << formatv("{0}duckc: costed {1} candidates in {2:F1} s on {3} "
                      "thread(s){4}\n",
                      tty ? "\r" : "", total, elapsed(), threads,
                      tty ? std::string(30, ' ') : std::string());
  // With the strategy open, each MoE layer its own way: after each
  // intermediate / experts pair, the mix the cost model prefers (when it
  // is neither).
  if (autoStrategy) {
    std::vector<Candidate> withMixes;
    for (const Candidate &c : all) {
      withMixes.push_back(c);
      if (c.strategy != "experts")
        continue;
      auto twin = llvm::find_if(all, [&](const Candidate &o) {
        return o.strategy == "intermediate" && o.tp == c.tp &&
               o.multipleOf == c.multipleOf && o.lmHead == c.lmHead &&
               o.oProj == c.oProj && o.qProj == c.qProj && o.inProj == c.inProj;
      });
      if (twin == all.end())
        continue;
      const Candidate &split = *twin;
      std::vector<uint64_t> memory = base.cluster.memoryBytes;
      if (!memory.empty())
        memory.resize(c.tp, memory.back());
      const std::string spec = mixStrategies(split, c, memory);
      if (spec.empty())
        continue;
      withMixes.push_back(evaluate(nullptr, base, c.tp, c.multipleOf, spec,
                                   c.lmHead, c.oProj, c.qProj, c.inProj));
    }
    all = std::move(withMixes);
  }
  // Predictions closer than kTie to the fastest are within the noise of
  // the measured rates they come from (equal ducks measure 2-3 % apart,
  // and a kernel class's rate is measured on one shape): they tie, and
  // the tie goes to fewer ducks, then the larger K-block, then fewer duck
  // steps, then the host's LM head, then the faster prediction.
  constexpr double kTie = 0.03;
  double fastest = 0;
  for (const Candidate &c : all)
    if (c.ok)
      fastest = std::max(fastest, c.tokS);
  const Candidate *best = nullptr;
  for (const Candidate &c : all) {
    if (!c.ok || c.tokS < fastest * (1 - kTie))
      continue;
    auto better = [&](const Candidate &a, const Candidate &b) {
      if (a.tp != b.tp)
        return a.tp < b.tp;
      if (a.multipleOf != b.multipleOf)
        return std::stoi(a.multipleOf) > std::stoi(b.multipleOf);
      if (a.mixed() != b.mixed())
        return !a.mixed(); // one strategy for every layer
      if (a.steps() != b.steps())
        return a.steps() < b.steps(); // fewer steps
      if (a.lmHead != b.lmHead)
        return b.lmHead == "ducks"; // the host's head
      return a.tokS > b.tokS * (1 + 1e-9);
    };
    if (!best || better(c, *best))
      best = &c;
  }
  if (compileExplain) {
    const uint64_t mem = base.cluster.memoryBytes.empty()
                             ? 0
                             : *std::min_element(base.cluster.memoryBytes.begin(),
                                                 base.cluster.memoryBytes.end());
    const mlir::duck::ClusterModel &cm = base.cluster.cost;
    const std::string calls =
        cm.duckGemvCallUs.empty()
            ? std::string()
            : formatv(", {0:F1} us more a GEMV call (the slowest duck's)",
                      *std::max_element(cm.duckGemvCallUs.begin(),
                                        cm.duckGemvCallUs.end()))
                  .str();
    std::string links = mlir::duck::linksText(cm);
    if (!links.empty())
      links = "; " + links;
    out << formatv(
        "cost model: {0}{4}, {1:F0} us a step; {2}{3}{5}\n",
        !cm.duckGparamS.empty()
            ? "fp9 Gparam/s by duck (measured) " +
                  [&] {
                    std::string r;
                    for (double v : cm.duckGparamS)
                      r += (r.empty() ? "" : "/") + formatv("{0:F1}", v).str();
                    return r;
                  }() +
                  " (slices in proportion" +
                  (cm.duckKernelGparamS.empty()
                       ? std::string(")")
                       : std::string("; each kernel class timed at its own "
                                     "measured rate)"))
        : cm.fp9GparamS > 0
            ? formatv("{0:F2} Gparam/s a duck (measured)", cm.fp9GparamS).str()
            : formatv("{0:F1} GB/s a duck", cm.bandwidthGbs).str(),
        cm.stepOverheadUs,
        cm.hostMsPerToken > 0
            ? formatv("host {0:F3} ms a token (measured)", cm.hostMsPerToken)
                      .str() +
                  (cm.hostReadGbs > 0
                       ? formatv(" + an LM head on the host at {0:F1} GB/s",
                                 cm.hostReadGbs)
                             .str()
                       : std::string())
        : cm.hostReadGbs > 0
            ? formatv("host weights (attention, routers, an LM head on the "
                      "host) at {0:F1} GB/s",
                      cm.hostReadGbs)
                  .str()
            : std::string("host work not counted"),
        mem >= (1ull << 30)
            ? formatv("; {0:F1} GiB a duck", mem / 1073741824.0).str()
        : mem ? formatv("; {0:F1} MiB a duck", mem / 1048576.0).str()
              : std::string(),
        calls, links);
    // With the head's place open, a column says where it goes and the
    // host's time (the host head's share included) is shown.
    const bool hostCol = autoHead || autoOProj;
    // With a link speed given, each candidate's time on the wire.
    const bool netCol = cm.hostLinkGbps > 0 || !cm.duckLinkGbps.empty();
    out << "  tp  multiple_of  strategy    " << (autoHead ? "  LM head  " : "")
        << (autoOProj ? "  attn proj" : "") << (hostCol ? "    host ms" : "")
        << "  TPOT ms  stream ms  dispatch ms" << (netCol ? "  network ms" : "")
        << "  tok/s    largest shard\n";
    for (const Candidate &c : all) {
      const std::string head =
          (autoHead ? formatv("  {0,-9}", c.lmHead == "ducks" ? "ducks"
                                                               : "host").str()
                    : std::string()) +
          (autoOProj ? formatv("  {0,-9}", c.attn()).str() : std::string());
      if (!c.ok) {
        StringRef why = StringRef(c.why).split('\n').first;
        out << formatv("{0,4}  {1,11}  {2,-12}{3}  not legal: {4}\n", c.tp,
                       c.multipleOf, c.strategyName(), head, why);
        if (c.mixed())
          out << "        mixed: " << c.strategy << "\n";
        continue;
      }
      const std::string host =
          hostCol ? formatv("  {0,9:F3}", c.hostMs).str() : std::string();
      const std::string net =
          netCol ? formatv("  {0,10:F3}", c.networkMs).str() : std::string();
      out << formatv("{0,4}  {1,11}  {2,-12}{3}{4}  {5,7:F3}  {6,9:F3}  "
                     "{7,11:F3}{11}  {8,7:F2}  {9,10:F3} GiB{10}\n",
                     c.tp, c.multipleOf, c.strategyName(), head, host,
                     1e3 / c.tokS, c.streamMs, c.dispatchMs, c.tokS,
                     c.maxShardBytes / 1073741824.0,
                     &c == best ? "  <- chosen" : "", net);
      if (c.mixed())
        out << "        mixed: " << c.strategy << "\n";
    }
  }
  if (!best)
    return createStringError(
        inconvertibleErrorCode(),
        "no candidate partition is legal for this model and cluster" +
            (all.empty() ? std::string()
                         : ": e.g. tp " + std::to_string(all.back().tp) +
                               ", multiple_of " + all.back().multipleOf +
                               ": " + all.back().why));
  if (compileExplain) {
    int better = 0;
    for (const Candidate &c : all)
      better += c.ok && &c != best;
    out << formatv(
        "chosen: tp {0}, multiple_of {1}, strategy {2}{10}: "
        "predicted "
        "{3:F2} tok/s (TPOT {4:F3} ms: fp9 stream {5:F3} + "
        "dispatch {6:F3}{9}){11}; the fastest of {7} legal "
        "candidates{8}\n",
        best->tp, best->multipleOf,
        best->mixed() ? "mixed (" + best->strategy + ")" : best->strategy,
        best->tokS, 1e3 / best->tokS, best->streamMs, best->dispatchMs,
        better + 1,
        ", predictions within 3 % of the fastest counting as "
        "ties (fewer ducks, then the larger K-block, win)",
        (best->hostMs > 0 ? formatv(" + host {0:F3}", best->hostMs).str()
                          : std::string()) +
            (best->networkMs > 0
                 ? formatv(" + network {0:F3}", best->networkMs).str()
                 : std::string()),
        std::string(autoHead
                        ? (best->lmHead == "ducks" ? ", LM head on the ducks"
                                                   : ", LM head on the host")
                        : "") +
            (autoOProj ? best->attnWords() : ""),
        best->prefillTokS > 0
            ? formatv(", prefill {0:F1} tok/s", best->prefillTokS).str()
            : std::string());
  }
  return *best;
}

Error runCompile() {
  mlir::duck::CompileOptions o;
  o.modelDir = compileDir;
  o.outDir = compileOut;
  if (!compileCluster.empty()) {
    auto c = mlir::duck::loadClusterFile(compileCluster);
    if (!c)
      return c.takeError();
    o.cluster = *c;
  }
  const bool autoTp = compileTp == "auto";
  if (compileTp.getNumOccurrences() && !autoTp) {
    int64_t tp = 0;
    if (StringRef(compileTp).getAsInteger(10, tp) || tp < 1)
      return createStringError(inconvertibleErrorCode(),
                               "--tp must be a number of ducks (at least 1) "
                               "or auto, got '" +
                                   compileTp + "'");
    o.cluster.tp = tp;
    if (!o.cluster.memoryBytes.empty())
      o.cluster.memoryBytes.resize(tp, o.cluster.memoryBytes.back());
  }
  if (autoTp && compileCluster.empty())
    return createStringError(inconvertibleErrorCode(),
                             "--tp auto chooses among the ducks of a cluster "
                             "file: pass --cluster FILE");
  if (compileCores.getNumOccurrences()) {
    if (compileCores < 1)
      return createStringError(inconvertibleErrorCode(),
                               "--cores-per-duck must be at least 1");
    o.cluster.coresPerDuck = compileCores;
  }
  if (compileMemory > 0)
    o.cluster.memoryBytes.assign(o.cluster.tp,
                                 (uint64_t)(compileMemory * (1ull << 30)));
  if (compileBw > 0)
    o.cluster.cost.bandwidthGbs = compileBw;
  if (compileOverhead >= 0)
    o.cluster.cost.stepOverheadUs = compileOverhead;
  o.multipleOf = compileMultipleOf;
  o.strategy = compileStrategy;
  if (compileEmit == "plan")
    o.emit = mlir::duck::CompileOptions::Emit::Plan;
  else if (compileEmit == "mlir")
    o.emit = mlir::duck::CompileOptions::Emit::Mlir;
  else if (compileEmit == "stats")
    o.emit = mlir::duck::CompileOptions::Emit::Stats;
  else
    return createStringError(inconvertibleErrorCode(),
                             "--emit must be plan, mlir or stats, got '" +
                                 compileEmit + "'");
  o.compileTo = compileTo;
  o.dryRun = compileDryRun;
  o.force = compileForce;
  o.progress = compileProgress;
  if (compileLmHead != "checkpoint" && compileLmHead != "fp9" &&
      compileLmHead != "int8" && compileLmHead != "ducks")
    return createStringError(inconvertibleErrorCode(),
                             "--lm-head must be checkpoint, int8, fp9 or "
                             "ducks, got '" +
                                 compileLmHead + "'");
  o.lmHead = compileLmHead;
  if (compileWire != "f32" && compileWire != "bf16")
    return createStringError(inconvertibleErrorCode(),
                             "--wire-activations must be f32 or bf16, got '" +
                                 compileWire + "'");
  o.cluster.cost.wireBf16 = compileWire == "bf16";
  for (auto [flag, out] : {std::pair{&compileOProj, &o.oProj},
                           std::pair{&compileQProj, &o.qProj},
                           std::pair{&compileInProj, &o.inProj}}) {
    if (*flag != "host" && *flag != "ducks")
      return createStringError(inconvertibleErrorCode(),
                               "--" + flag->ArgStr.str() +
                                   " must be host or ducks, got '" + *flag +
                                   "'");
    *out = *flag;
  }
  if (compileStrategy != "auto")
    if (Expected<mlir::duck::StrategySpec> spec =
            mlir::duck::parseStrategySpec(compileStrategy);
        !spec)
      return createStringError(
          inconvertibleErrorCode(),
          "--" + toString(spec.takeError()) +
              " (expected intermediate, experts, auto, or a list by MoE "
              "layer such as intermediate,experts:3-30)");
  const bool autoStrategy = compileStrategy == "auto";
  if (autoTp || compileExplain || autoStrategy) {
    Expected<Candidate> winner =
        choosePlan(o, autoTp, compileMultipleOf.getNumOccurrences() == 0 ||
                                  compileMultipleOf == "auto",
                   compileStrategy.getNumOccurrences() == 0 || autoStrategy,
                   outs());
    if (!winner)
      return winner.takeError();
    o.cluster.tp = winner->tp;
    if (!o.cluster.memoryBytes.empty())
      o.cluster.memoryBytes.resize(winner->tp, o.cluster.memoryBytes.back());
    o.multipleOf = winner->multipleOf;
    o.strategy = winner->strategy;
    o.lmHead = winner->lmHead;
    o.oProj = winner->oProj;
    o.qProj = winner->qProj;
    o.inProj = winner->inProj;
  }
  // Ctrl-C or SIGTERM while the plan is written: the writer stops at its
  // next chunk and compileModel removes what it wrote. (LLVM's handler
  // calls this once and restores the defaults: a second Ctrl-C kills.)
  static std::atomic<bool> interrupted{false};
  llvm::sys::SetInterruptFunction([] { interrupted.store(true); });
  o.cancel = &interrupted;
  return mlir::duck::compileModel(o, outs(), errs());
}

//===----------------------------------------------------------------------===//
// duckc fp9-report
//===----------------------------------------------------------------------===//

cl::SubCommand fp9ReportCmd("fp9-report",
                            "Convert a checkpoint's FFN weights to fp9 and "
                            "report bytes and errors");
cl::opt<std::string> fp9Dir(cl::Positional, cl::Required,
                            cl::desc("<model-dir>"), cl::sub(fp9ReportCmd),
                            cl::cat(duckcCategory));
cl::opt<unsigned> fp9Block("block", cl::desc("K-block: 128, 64 or 32"),
                           cl::init(128), cl::sub(fp9ReportCmd),
                           cl::cat(duckcCategory));
cl::opt<bool> fp9Json("json", cl::desc("Print JSON"), cl::sub(fp9ReportCmd),
                      cl::cat(duckcCategory));
cl::opt<bool> fp9Verbose("per-tensor", cl::desc("One line per tensor"),
                         cl::sub(fp9ReportCmd), cl::cat(duckcCategory));
cl::opt<unsigned> fp9Max("max-tensors",
                         cl::desc("Convert at most this many tensors (0 = "
                                  "all)"),
                         cl::init(0), cl::sub(fp9ReportCmd),
                         cl::cat(duckcCategory));

Error runFp9Report() {
  auto ckpt = imp::Checkpoint::open(fp9Dir);
  if (!ckpt)
    return ckpt.takeError();
  auto rep = imp::buildFp9Report(**ckpt, fp9Block, fp9Max);
  if (!rep)
    return rep.takeError();
  if (fp9Json)
    outs() << formatv("{0:2}", imp::fp9ReportToJson(*rep)) << "\n";
  else
    imp::printFp9Report(*rep, fp9Verbose, outs());
  if (rep->fp8Exact != rep->fp8Tensors)
    return createStringError(inconvertibleErrorCode(),
                             "fp9 conversion of FP8 weights was not exact");
  return Error::success();
}

//===----------------------------------------------------------------------===//
// duckc verify-plan
//===----------------------------------------------------------------------===//

cl::SubCommand verifyPlanCmd("verify-plan",
                             "Check a compiled plan's weight images against "
                             "the checkpoint it was compiled from");
cl::opt<std::string> verifyPlanDir(cl::Positional, cl::Required,
                                   cl::desc("<plan-dir>"),
                                   cl::sub(verifyPlanCmd),
                                   cl::cat(duckcCategory));
cl::opt<std::string> verifyModelDir(cl::Positional, cl::Required,
                                    cl::desc("<model-dir>"),
                                    cl::sub(verifyPlanCmd),
                                    cl::cat(duckcCategory));

Error runVerifyPlan() {
  auto ckpt = imp::Checkpoint::open(verifyModelDir);
  if (!ckpt)
    return ckpt.takeError();
  auto check = mlir::duck::verifyPlanImages(verifyPlanDir, **ckpt);
  if (!check)
    return check.takeError();
  outs() << "ducks: " << check->ducks << "\n";
  outs() << "slots: " << check->slots << " (checksums ok)\n";
  outs() << "matrices: " << check->matrices << "\n";
  outs() << "elements: " << check->elements << "\n";
  outs() << "bit-exact matrices: " << check->exactMatrices << "\n";
  outs() << formatv("worst relative error: {0:e}\n", check->worstRelError);
  return Error::success();
}

//===----------------------------------------------------------------------===//
// duckc measure-cluster
//===----------------------------------------------------------------------===//

// duck-measure-cluster, the runtime's tool, does the work: it talks to the
// ducks through the runtime's duck client, which the compiler does not
// link. This subcommand is here for 'duckc --help'; main() hands
// 'duckc measure-cluster ARGS...' to the tool before parsing.
cl::SubCommand measureCmd(
    "measure-cluster",
    "Ask every duck of a cluster file for its read bandwidth and fp9 GEMV "
    "rates, time the round trips, and write the figures into the file for "
    "the cost model (runs duck-measure-cluster)");

constexpr const char *kMeasureTool = "duck-measure-cluster";

/// Replaces duckc with duck-measure-cluster, beside this executable or else
/// on PATH, with the arguments after "measure-cluster"; its argv[0],
/// "duckc measure-cluster", names it in its messages. Returns only when
/// the tool cannot be run.
int forwardMeasureCluster(int argc, char **argv) {
  std::vector<char *> args;
  std::string argv0 = "duckc measure-cluster";
  args.push_back(argv0.data());
  args.insert(args.end(), argv + 2, argv + argc);
  args.push_back(nullptr);
  std::string dir = ".";
  char self[4096];
  if (ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1); n > 0)
    dir = sys::path::parent_path(StringRef(self, size_t(n))).str();
  const std::string beside = dir + "/" + kMeasureTool;
  if (::access(beside.c_str(), X_OK) == 0) {
    ::execv(beside.c_str(), args.data());
    const int err = errno;
    WithColor::error(errs(), "duckc")
        << "cannot run '" << beside << "': " << std::strerror(err) << "\n";
    return 1;
  }
  ::execvp(kMeasureTool, args.data());
  const int err = errno;
  if (err == ENOENT)
    WithColor::error(errs(), "duckc")
        << "measure-cluster runs " << kMeasureTool
        << ", the runtime's tool, which is neither beside duckc (" << dir
        << ") nor on PATH (build it: ninja " << kMeasureTool << ")\n";
  else
    WithColor::error(errs(), "duckc") << "cannot run " << kMeasureTool << ": "
                                      << std::strerror(err) << "\n";
  return 1;
}

//===----------------------------------------------------------------------===//
// Dispatch
//===----------------------------------------------------------------------===//

struct Subcommand {
  cl::SubCommand *command;
  Error (*run)();
};

/// Every subcommand and the function that runs it.
const Subcommand kSubcommands[] = {
    {&describeCmd, runDescribe},
    {&compileCmd, runCompile},
    {&fp9ReportCmd, runFp9Report},
    {&verifyPlanCmd, runVerifyPlan},
};

constexpr const char *kOverview = R"(Duck compiler driver

Compiles Qwen3 / Qwen3-MoE / DeepSeek-V3(.2) HF checkpoints into plans for a
host plus a cluster of AVX2 "ducks". Run 'duckc <subcommand> --help' for the
options of one subcommand.

  describe <model-dir> [--json]
      Reads config.json (model_type qwen3, qwen3_moe, deepseek_v3 or
      deepseek_v32) and prints the model: family, sizes, dense and MoE
      layers, experts and router, attention kind (GQA or MLA, DSA indexer),
      quantization, parameter counts (total, FFN, activated per token). If
      the directory holds weights (model.safetensors, a sharded
      model.safetensors.index.json, or loose *.safetensors files) every file
      is validated, bytes per dtype are reported and the tensors are checked
      against the names and shapes the config implies (FP8 weights need a
      '<name>_scale_inv' of the right shape).

  compile <model-dir> -o <out-dir> [--tp N|auto] [--explain]
          [--multiple-of 128|64|32|auto] [--cores-per-duck C]
          [--strategy intermediate|experts|LIST|auto] [--cluster FILE]
          [--lm-head checkpoint|int8|fp9|ducks] [--q-proj host|ducks]
          [--o-proj host|ducks] [--in-proj host|ducks]
          [--wire-activations f32|bf16] [--emit=plan|mlir|stats]
          [--dry-run] [--progress]
      Lowers the model through the duck dialect (partition over the ducks,
      kernel selection, modes, weight layout) and writes model.duckplan plus
      duck-<rank>.weights (fp9, exactly each duck's weight buffer), into
      a temporary directory renamed at the end: an error or Ctrl-C leaves
      <out-dir> as it was. With
      --dry-run only config.json is needed: prints the per-duck table, the
      per-layer kernels and a decode estimate. --emit=stats prints JSON.
      --tp auto (with --cluster) tries every legal tp, multiple_of and
      strategy with the cost model and keeps the fastest that fits;
      --explain prints the candidates. --strategy takes one strategy for
      every MoE layer or a list by layer (intermediate,experts:3-30: every
      MoE layer split, but 3 to 30 whole experts a duck); with auto the
      cost model weighs each MoE layer and, when a duck cannot hold its
      shard, moves layers to the cut that fits for the least time (a
      'mixed' candidate). Ducks rated differently in the
      cluster file (fp9_gparam_s each) get slices in proportion. The LM
      head (--lm-head ducks) and every attention's query, output and
      input projections (--q-proj / --o-proj / --in-proj ducks) can have
      their rows split over the ducks too, so the host reads none of them;
      with the cluster file's host_read_gbs and no such flag, --tp auto
      chooses.

  fp9-report <model-dir> [--block N] [--per-tensor] [--json]
      Converts every FFN weight to fp9 and reports bytes and errors (FP8
      weights must convert exactly).

  verify-plan <plan-dir> <model-dir>
      Re-reads every weight image: headers, slot checksums, and every packed
      slice against the checkpoint (bit-exact for FP8 checkpoints).

  measure-cluster <cluster.json> [-o FILE] [--cores N] [--millis MS]
                  [--arena-mib MIB] [--all-at-once] [--same-within F]
                  [--busy-us US] [--host]
      Runs duck-measure-cluster, the runtime's tool (beside duckc, else on
      PATH), with these arguments: it asks every duck of the cluster file
      (its duckd must be running) for its read bandwidth and cold fp9 GEMV
      rate of every kernel class (its weight cache untouched), times the
      dispatch gap, with --host (run it on the host) also measures this
      machine's read bandwidth and attention rate, and writes the figures
      into the file for 'compile --cluster'. 'duckc measure-cluster --help'
      lists its options and every figure it writes.

Exit status is 0 on success and 1 on any error, reported on stderr as
'duckc: error: <message>'.
)";

} // namespace

int main(int argc, char **argv) {
  // measure-cluster is the runtime's tool: exec'd before LLVM sets up.
  if (argc >= 2 && StringRef(argv[1]) == "measure-cluster")
    return forwardMeasureCluster(argc, argv);
  InitLLVM initLLVM(argc, argv);
  cl::HideUnrelatedOptions(duckcCategory);
  for (const Subcommand &sub : kSubcommands)
    cl::HideUnrelatedOptions(duckcCategory, *sub.command);
  cl::SetVersionPrinter(
      [](raw_ostream &os) { os << "duckc (Duck) " << DUCK_VERSION << "\n"; });
  // Parse errors are reported in the same "duckc: error:" form as the rest.
  std::string parseErrors;
  raw_string_ostream parseErrorStream(parseErrors);
  if (!cl::ParseCommandLineOptions(argc, argv, kOverview, &parseErrorStream)) {
    StringRef msg = StringRef(parseErrors).trim();
    std::string prefix = (sys::path::filename(argv[0]) + ": ").str();
    msg.consume_front(prefix);
    WithColor::error(errs(), "duckc") << msg << "\n";
    return 1;
  }

  for (const Subcommand &sub : kSubcommands) {
    if (!*sub.command)
      continue;
    if (Error err = sub.run()) {
      WithColor::error(errs(), "duckc") << toString(std::move(err)) << "\n";
      return 1;
    }
    return 0;
  }
  WithColor::error(errs(), "duckc")
      << "no subcommand given (see 'duckc --help')\n";
  return 1;
}
