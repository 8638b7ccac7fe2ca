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
#include "duck/Pipelines/ChoosePlan.h"
#include "duck/Pipelines/Compile.h"
#include "duck/Target/Plan/PlanVerifier.h"
#include "duck_rt/wrap_text.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Signals.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/raw_ostream.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
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

cl::SubCommand describeCmd("describe",
                           "Describe a model directory and check its weights");
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
                          "Compile a model into a plan and fp9 weight images");
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
             "the host reads none of it (DeepSeek-V3.2: 7 GB a token); or "
             "'heads' (grouped-query attention): by its heads' columns, "
             "each duck getting only its heads' outputs and answering "
             "partial sums (less to send, more to receive)"),
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
             "'int8' (default) quantises it at load, a scale (an IEEE "
             "half) per 32 weights of a row: 1.0625 bytes a weight, as "
             "llama.cpp's Q8_0, instead of bf16's 2, multiplied by the "
             "input rounded to int16; the rows that could be the largest "
             "are recomputed exactly (greedy ids are the exact head's), the "
             "others move by about 0.6% relative L2 (README: the LM head's "
             "formats); "
             "'checkpoint' keeps the checkpoint's dtype (bf16: exact, what "
             "the float64-reference tests pin); 'fp9' (a scale per 128 x "
             "128 tile): 1.125 bytes, logits move by a few percent. "
             "'ducks': fp9 as 'fp9', its "
             "vocabulary rows split over the ducks in whole 128-row tiles "
             "(in proportion to their measured rates); each duck returns "
             "the logits of its rows, bit for bit what 'fp9' gives, and the "
             "host reads none of the head"),
    cl::init("int8"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileWire(
    "wire-activations",
    cl::desc("How a step's activations (x) travel to the ducks: 'auto' "
             "(default): where --tp auto, --explain or --strategy auto "
             "search a cluster file with link speeds, the coarsest format "
             "the checkpoint's own inference admits (q8 for block-FP8 "
             "checkpoints with dynamic activations, bf16 for bf16 ones) if "
             "the cost model finds it faster than f32 by more than a tie "
             "(a 'wire:' line in --explain), else f32; 'f32': the host's "
             "values, bit for bit; 'bf16': half the "
             "bytes on the host's link (rounded to nearest even; every "
             "duck then multiplies those rounded values: the logits moved "
             "by 0.17-0.34% relative L2 on Qwen3 test models and by 15% on "
             "a random DeepSeek-V3 one) or 'q8': 1.0625 bytes a value, "
             "blocks of 32 int8 values with a bf16 scale each (a value "
             "moves by at most half of 1/127 of its block's largest; "
             "docs/perf.md gives the measured logit drift). The cost "
             "model's network time follows"),
    cl::init("auto"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileWireOut(
    "wire-results",
    cl::desc("How the ducks' answers (partial sums of an FFN or an absorbed "
             "output projection, rows of a split matrix) travel back: 'auto' "
             "(default: as --wire-activations auto), 'f32': bit for bit, "
             "'bf16': half the bytes on the host's "
             "inbound link, each value rounded to nearest even before the "
             "host adds them, or 'q8': blocks of 32 int8 values with a bf16 "
             "scale, 1.0625 bytes a value (docs/perf.md gives the measured "
             "logit drift of both). The cost model's network time follows"),
    cl::init("auto"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileFanout(
    "fanout",
    cl::desc("How a step reaches the ducks: 'unicast' (default: the host "
             "sends each duck its own copy), 'multicast' (recorded in the "
             "plan: the host sends a step's input once, as UDP datagrams to "
             "the cluster file's \"cast\" address, an IP multicast group "
             "the ducks joined with duckd --cast, and each duck a small "
             "frame; a step whose ducks get different inputs goes as "
             "unicast; the replies as --reduce says; without --fanout, "
             "--tp auto and --explain weigh both when the cluster file "
             "names \"cast\") or 'relay': MODELLED "
             "ONLY, NOT BUILT IN THE RUNTIME, only with --dry-run: the host "
             "sends --relay-host-fanout copies, each duck forwards the frame "
             "to --relay-fanout children over its own link, partial sums are "
             "reduced on the way back"),
    cl::init("unicast"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileReduce(
    "reduce",
    cl::desc("With --fanout multicast: how the replies come back: 'star' "
             "(default: each duck to the host) or 'tree' (MODELLED ONLY, "
             "only with --dry-run): up the relay tree of --relay-host-fanout, "
             "--relay-fanout and "
             "--relay-chunk-kib, partial sums reduced at each duck on the "
             "way"),
    cl::init("star"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<bool> compileStageX(
    "stage-x",
    cl::desc("MODELLED ONLY, NOT BUILT IN THE RUNTIME; only with --dry-run: "
             "a MoE step's activations leave the host as soon as the "
             "layer's input is normalised, the router is computed while "
             "they are on the wire, and the routing slots follow alone; the "
             "cost model hides x's time out behind the router's reads (up "
             "to the router's time)"),
    cl::init(false), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileStageShared(
    "stage-shared",
    cl::desc("Staged MoE steps, recorded in the plan: 'on' sends a MoE "
             "decode step's shared experts to the ducks with x as soon as "
             "the layer's input is normalised, so that they run while the "
             "host computes the router, and the routed slots after them "
             "(the ducks' sums have the same bits); 'off' (default) sends "
             "each step whole. Without it, --tp auto and --explain with a "
             "cluster file stage where the cost model says it is faster. "
             "Pays where the host routes on its CPU and the ducks are other "
             "machines; on one box they share the cores"),
    cl::init("off"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileResidual(
    "residual",
    cl::desc("Where the cost model keeps the residual stream: 'host' "
             "(default: what the runtime does) or 'ducks': MODELLED ONLY, "
             "NOT BUILT IN THE RUNTIME; only with --dry-run. The host keeps "
             "each layer's attention over its cache and exchanges with the "
             "ducks once a layer; the layer's reductions and broadcasts run "
             "among the ducks as collectives over their own links (the "
             "ducks' mesh that duck-bench collective measures; cluster file "
             "mesh_call_us, mesh_message_us and mesh_groups), the routers and "
             "the "
             "indexer's weights are read by the ducks. Needs every attention "
             "projection on the ducks"),
    cl::init("host"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileMlaAbsorb(
    "mla-absorb",
    cl::desc("Where DeepSeek's MLA takes its queries into the latent space "
             "and its latent outputs back (kv_b_proj's W_UK and W_UV): "
             "'host' (default) or 'ducks': where an attention's query and "
             "output projections are both on the ducks (--q-proj ducks "
             "--o-proj ducks, or --tp auto's choice), each duck takes whole "
             "heads, its query step also runs W_UK and its output step gets "
             "only its heads' latent outputs, runs W_UV and its o_proj "
             "columns and returns partial sums; the host reads no "
             "kv_b_proj"),
    cl::init("host"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<std::string> compileMtp(
    "mtp",
    cl::desc("DeepSeek's MTP module (docs/mtp.md: the layer after the last, "
             "which drafts the token after next for duckrun --speculative "
             "mtp): 'auto' (default: compiled when the checkpoint has it), "
             "'on' (an error naming what is missing without it) or 'off'. "
             "It is one more MoE layer on the ducks and one more attention "
             "on the host, run only with --speculative mtp"),
    cl::init("auto"), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<int> compileSpecDrafts(
    "speculative-drafts",
    cl::desc("Project speculative decoding (printed, not written into the "
             "plan): drafts a verify step (duckrun --speculative "
             "lookup:K's K; 0, the default: none). A verify step carries "
             "them all on the wire and an MoE layer reads the union of the "
             "experts its rows choose"),
    cl::init(0), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<double> compileSpecAcceptance(
    "speculative-acceptance",
    cl::desc("With --speculative-drafts: the chance a draft is accepted "
             "when the ones before it were (DeepSeek reports 0.85-0.9 for "
             "its MTP layer's); default 0.8"),
    cl::init(0.8), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<int> compileRelayFanout(
    "relay-fanout",
    cl::desc(
        "--fanout relay, --reduce tree (modelled only): the children each duck "
        "forwards to (default 2)"),
    cl::init(2), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<int> compileRelayHostFanout(
    "relay-host-fanout",
    cl::desc("--fanout relay, --reduce tree (modelled only): the copies the "
             "host sends, to "
             "the first ducks of the tree (default 1: one send a step)"),
    cl::init(1), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<double> compileRelayChunk(
    "relay-chunk-kib",
    cl::desc("--fanout relay, --reduce tree (modelled only): the unit a duck "
             "forwards, "
             "KiB; 0 (default): whole frames, store and forward; else each "
             "piece forwarded, and each piece of partial sums reduced and "
             "sent up, as soon as it is there"),
    cl::init(0), cl::sub(compileCmd), cl::cat(duckcCategory));
cl::opt<bool> compileProgress("progress",
                              cl::desc("Show progress even when stderr is "
                                       "not a terminal"),
                              cl::sub(compileCmd), cl::cat(duckcCategory));

/// The cluster from --cluster and the flags that override it.
Error clusterFromFlags(mlir::duck::CompileOptions &o) {
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
  return Error::success();
}

/// An error unless `value` is one of `choices`: "<flag> must be a, b or c,
/// got '<value>'".
Error checkChoice(StringRef flag, StringRef value,
                  ArrayRef<StringRef> choices) {
  if (llvm::is_contained(choices, value))
    return Error::success();
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i)
    list += (i == 0                    ? ""
             : i + 1 == choices.size() ? " or "
                                       : ", ") +
            choices[i].str();
  return createStringError(
      inconvertibleErrorCode(),
      (flag + " must be " + list + ", got '" + value + "'").str());
}

/// --fanout and the relay tree's shape (relay and the tree modelled only:
/// --dry-run alone),
/// and the speculative projection's drafts and acceptance.
Error fanoutFromFlags(mlir::duck::CompileOptions &o) {
  using Fanout = mlir::duck::ClusterModel::Fanout;
  if (Error e = checkChoice("--fanout", compileFanout,
                            {"unicast", "relay", "multicast"}))
    return e;
  if ((compileReduce != "star" && compileReduce != "tree") ||
      (compileReduce == "tree" && compileFanout != "multicast"))
    return createStringError(inconvertibleErrorCode(),
                             "--reduce must be star or tree, and tree goes "
                             "with --fanout multicast (relay always reduces "
                             "up its tree), got '" +
                                 compileReduce + "'");
  if (compileRelayFanout < 1 || compileRelayHostFanout < 1 ||
      compileRelayChunk < 0)
    return createStringError(inconvertibleErrorCode(),
                             "--relay-fanout and --relay-host-fanout must be "
                             "at least 1, --relay-chunk-kib not negative");
  o.cluster.cost.relayChunkBytes = int64_t(compileRelayChunk * 1024);
  o.cluster.cost.fanout = compileFanout == "relay"       ? Fanout::relay
                          : compileFanout == "multicast" ? Fanout::multicast
                                                         : Fanout::unicast;
  o.cluster.cost.reduceTree = compileReduce == "tree";
  if (Error e = checkChoice("--residual", compileResidual, {"host", "ducks"}))
    return e;
  o.cluster.cost.residualOnDucks = compileResidual == "ducks";
  o.cluster.cost.stageX = compileStageX;
  if (Error e =
          checkChoice("--stage-shared", compileStageShared, {"on", "off"}))
    return e;
  o.cluster.cost.stageShared = compileStageShared == "on";
  o.cluster.cost.relayFanout = compileRelayFanout;
  o.cluster.cost.relayHostFanout = compileRelayHostFanout;
  if (compileSpecDrafts < 0 || compileSpecDrafts > 16 ||
      compileSpecAcceptance < 0 || compileSpecAcceptance > 1)
    return createStringError(inconvertibleErrorCode(),
                             "--speculative-drafts must be 0 to 16 and "
                             "--speculative-acceptance 0 to 1");
  o.cluster.cost.speculateDrafts = compileSpecDrafts;
  o.cluster.cost.speculateAcceptance = compileSpecAcceptance;
  if (o.cluster.cost.fanout == Fanout::relay && !compileDryRun)
    return createStringError(
        inconvertibleErrorCode(),
        "--fanout relay is modelled only: no duck forwards a step, so no "
        "plan is written with it; use it with --dry-run");
  if (o.cluster.cost.reduceTree && !compileDryRun)
    return createStringError(
        inconvertibleErrorCode(),
        "--reduce tree is modelled only: the ducks answer the host "
        "directly, so no plan is written with it; use it with --dry-run");
  if (o.cluster.cost.residualOnDucks && !compileDryRun)
    return createStringError(
        inconvertibleErrorCode(),
        "--residual ducks is modelled only: no duck runs a layer's norms and "
        "router yet, so no plan is written with it; use it with --dry-run");
  if (o.cluster.cost.stageX && !compileDryRun)
    return createStringError(
        inconvertibleErrorCode(),
        "--stage-x is modelled only: the runtime sends a step whole, its "
        "routing slots with its activations, so no plan is written with it; "
        "use it with --dry-run");
  if (Error e =
          checkChoice("--mla-absorb", compileMlaAbsorb, {"host", "ducks"}))
    return e;
  o.mlaAbsorb = compileMlaAbsorb;
  return Error::success();
}

/// What to write and how to cut the model, from the flags.
Error planFromFlags(mlir::duck::CompileOptions &o) {
  if (Error e = checkChoice("--multiple-of", compileMultipleOf,
                            {"128", "64", "32", "auto"}))
    return e;
  o.multipleOf = compileMultipleOf;
  o.strategy = compileStrategy;
  if (Error e = checkChoice("--emit", compileEmit, {"plan", "mlir", "stats"}))
    return e;
  using Emit = mlir::duck::CompileOptions::Emit;
  o.emit = compileEmit == "plan"   ? Emit::Plan
           : compileEmit == "mlir" ? Emit::Mlir
                                   : Emit::Stats;
  o.compileTo = compileTo;
  o.dryRun = compileDryRun;
  o.force = compileForce;
  o.progress = compileProgress;
  if (Error e = checkChoice("--lm-head", compileLmHead,
                            {"checkpoint", "int8", "fp9", "ducks"}))
    return e;
  o.lmHead = compileLmHead;
  if (Error e = checkChoice("--mtp", compileMtp, {"auto", "on", "off"}))
    return e;
  o.mtp = compileMtp;
  for (auto [flag, name, out] :
       {std::tuple{&compileWire, "--wire-activations", &o.cluster.cost.wireX},
        std::tuple{&compileWireOut, "--wire-results",
                   &o.cluster.cost.wireOut}}) {
    using Wire = mlir::duck::ClusterModel::Wire;
    if (Error e = checkChoice(name, *flag, {"auto", "f32", "bf16", "q8"}))
      return e;
    // auto: f32 unless the search (choosePlanFromFlags) finds better.
    *out = *flag == "q8" ? Wire::q8 : *flag == "bf16" ? Wire::bf16 : Wire::f32;
  }
  if (Error e = fanoutFromFlags(o))
    return e;
  for (auto [flag, out] : {std::pair{&compileOProj, &o.oProj},
                           std::pair{&compileQProj, &o.qProj},
                           std::pair{&compileInProj, &o.inProj}}) {
    const bool heads = flag == &compileOProj && *flag == "heads";
    if (*flag != "host" && *flag != "ducks" && !heads)
      return createStringError(
          inconvertibleErrorCode(),
          "--" + flag->ArgStr.str() + " must be host or ducks" +
              (flag == &compileOProj ? std::string(" or heads") : "") +
              ", got '" + *flag + "'");
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
  return Error::success();
}

/// --tp auto, --explain, --strategy auto: what the flags leave open goes
/// to the cost model, and `o` takes its winner.
Error choosePlanFromFlags(mlir::duck::CompileOptions &o) {
  const bool autoTp = compileTp == "auto";
  const bool autoStrategy = compileStrategy == "auto";
  if (autoTp || compileExplain || autoStrategy) {
    mlir::duck::PlanChoice open;
    open.tpOpen = autoTp;
    open.multipleOfOpen = compileMultipleOf.getNumOccurrences() == 0 ||
                          compileMultipleOf == "auto";
    open.strategyOpen =
        compileStrategy.getNumOccurrences() == 0 || autoStrategy;
    open.lmHeadFree = compileLmHead.getNumOccurrences() == 0;
    open.projFree = compileOProj.getNumOccurrences() == 0 &&
                    compileQProj.getNumOccurrences() == 0 &&
                    compileInProj.getNumOccurrences() == 0;
    open.explain = compileExplain;
    open.fanoutOpen =
        compileFanout.getNumOccurrences() == 0 && o.cluster.cost.castAvailable;
    open.wireXOpen = compileWire == "auto";
    open.wireOutOpen = compileWireOut == "auto";
    // Staging weighed candidate by candidate where the ducks are other
    // machines (a cluster file with the host's read bandwidth).
    o.cluster.cost.stageSharedOpen =
        compileStageShared.getNumOccurrences() == 0 &&
        !compileCluster.empty() && o.cluster.cost.hostReadGbs > 0;
    Expected<mlir::duck::cost::Candidate> winner =
        mlir::duck::choosePlan(o, open, outs());
    if (!winner)
      return winner.takeError();
    o.cluster.tp = winner->tp;
    if (!o.cluster.memoryBytes.empty())
      o.cluster.memoryBytes.resize(winner->tp, o.cluster.memoryBytes.back());
    o.multipleOf = winner->multipleOf;
    o.strategy = winner->strategy;
    o.lmHead = winner->lmHead;
    o.oProj = winner->oProj;
    o.mlaAbsorb = winner->mlaAbsorb;
    o.qProj = winner->qProj;
    o.inProj = winner->inProj;
    if (o.cluster.cost.stageSharedOpen) {
      o.cluster.cost.stageSharedOpen = false;
      o.cluster.cost.stageShared = winner->stageShared;
    }
    o.cluster.cost.wireX = winner->wireX;
    o.cluster.cost.wireOut = winner->wireOut;
    if (open.fanoutOpen)
      o.cluster.cost.fanout = winner->multicast
                                  ? mlir::duck::ClusterModel::Fanout::multicast
                                  : mlir::duck::ClusterModel::Fanout::unicast;
  }
  return Error::success();
}

Error runCompile() {
  mlir::duck::CompileOptions o;
  o.modelDir = compileDir;
  o.outDir = compileOut;
  if (Error e = clusterFromFlags(o))
    return e;
  if (Error e = planFromFlags(o))
    return e;
  if (Error e = choosePlanFromFlags(o))
    return e;
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

cl::SubCommand
    fp9ReportCmd("fp9-report",
                 "Report the fp9 bytes and errors of the FFN weights");
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
                             "Check a plan's weight images against the model");
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
cl::SubCommand
    measureCmd("measure-cluster",
               "Measure a cluster file's ducks and links for the cost model");

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

/// A subcommand's --help prints an option's text, and the lines after its
/// first, from the column of its widest option's width (LLVM's: two more
/// than that option's name and value take): duckc's own options' texts are
/// wrapped there to 79 columns, not left as lines of up to 900 characters.
/// (LLVM's generic ones are shared by every subcommand: left alone.)
void wrapOptionHelp(cl::SubCommand &sub) {
  static std::vector<std::unique_ptr<std::string>> texts; // cl keeps refs
  size_t widest = 0;
  for (const auto &entry : cl::getRegisteredOptions(sub))
    if (entry.second->getOptionHiddenFlag() == cl::NotHidden)
      widest = std::max(widest, entry.second->getOptionWidth());
  const size_t width = 79 - std::min<size_t>(widest, 49);
  for (const auto &entry : cl::getRegisteredOptions(sub)) {
    cl::Option *o = entry.second;
    if (o->getOptionHiddenFlag() != cl::NotHidden ||
        !llvm::is_contained(o->Categories, &duckcCategory) ||
        o->HelpStr.size() <= width || o->HelpStr.contains('\n'))
      continue;
    texts.push_back(std::make_unique<std::string>(
        duck::WrapWords(o->HelpStr, width, 0, 0)));
    o->setDescription(*texts.back());
  }
}

/// The overview --help prints: its head, a paragraph a subcommand (the
/// one asked about alone, `duckc <subcommand> --help`), its tail.
constexpr const char *kOverviewHead = R"(Duck compiler driver

Compiles Qwen3 / Qwen3-MoE / DeepSeek-V3(.2) HF checkpoints into plans for a
host plus a cluster of AVX2 "ducks". Run 'duckc <subcommand> --help' for the
options of one subcommand.

)";

constexpr const char *kDescribeText = R"(  describe <model-dir> [--json]
      Reads config.json (model_type qwen3, qwen3_moe, deepseek_v3 or
      deepseek_v32) and prints the model: family, sizes, dense and MoE
      layers, experts and router, attention kind (GQA or MLA, DSA indexer),
      quantization, parameter counts (total, FFN, activated per token). If
      the directory holds weights (model.safetensors, a sharded
      model.safetensors.index.json, or loose *.safetensors files) every file
      is validated, bytes per dtype are reported and the tensors are checked
      against the names and shapes the config implies (FP8 weights need a
      '<name>_scale_inv' of the right shape).
)";

constexpr const char *kCompileText =
    R"(  compile <model-dir> -o <out-dir> [--tp N|auto] [--explain]
          [--multiple-of 128|64|32|auto] [--cores-per-duck C]
          [--strategy intermediate|experts|LIST|auto] [--cluster FILE]
          [--lm-head checkpoint|int8|fp9|ducks] [--q-proj host|ducks]
          [--o-proj host|ducks] [--in-proj host|ducks]
          [--wire-activations auto|f32|bf16|q8]
          [--wire-results auto|f32|bf16|q8] [--emit=plan|mlir|stats]
          [--dry-run] [--progress]
          [--fanout unicast|relay|multicast --reduce star|tree
           --relay-fanout F --relay-host-fanout K --relay-chunk-kib C]
          [--residual host|ducks]
          [--speculative-drafts K --speculative-acceptance A]
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
      chooses. --fanout relay and multicast (with --reduce tree) are
      MODELLED ONLY (the runtime sends every duck its own copy): with
      --dry-run they show what a relay tree among the ducks, or one copy a
      step from the host with the replies reduced up a tree, would do to
      the network term; no plan is written with them. --residual ducks
      is MODELLED ONLY too: the ducks keep the residual stream and reduce
      and share it among themselves (duck-bench collective measures the
      collectives on the link simulator), the host exchanges once a layer.
)";

constexpr const char *kFp9ReportText =
    R"(  fp9-report <model-dir> [--block N] [--per-tensor] [--json]
      Converts every FFN weight to fp9 and reports bytes and errors (FP8
      weights must convert exactly).
)";

constexpr const char *kVerifyPlanText = R"(  verify-plan <plan-dir> <model-dir>
      Re-reads every weight image: headers, slot checksums, and every packed
      slice against the checkpoint (bit-exact for FP8 checkpoints).
)";

constexpr const char *kMeasureClusterText =
    R"(  measure-cluster <cluster.json> [-o FILE] [--cores N] [--millis MS]
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
)";

constexpr const char *kOverviewTail =
    R"(Exit status is 0 on success and 1 on any error, reported on stderr as
'duckc: error: <message>'.
)";

/// The overview --help prints: every subcommand's paragraph, or only the
/// one of `duckc <subcommand> --help`.
std::string overviewFor(int argc, char **argv) {
  const std::pair<StringRef, const char *> texts[] = {
      {"describe", kDescribeText},
      {"compile", kCompileText},
      {"fp9-report", kFp9ReportText},
      {"verify-plan", kVerifyPlanText},
      {"measure-cluster", kMeasureClusterText}};
  const bool one = argc >= 2 && llvm::any_of(texts, [&](const auto &t) {
                     return t.first == argv[1];
                   });
  std::string out = kOverviewHead;
  for (const auto &[name, text] : texts)
    if (!one || name == argv[1])
      out += std::string(text) + "\n";
  return out + kOverviewTail;
}

} // namespace

int main(int argc, char **argv) {
  // measure-cluster is the runtime's tool: exec'd before LLVM sets up.
  if (argc >= 2 && StringRef(argv[1]) == "measure-cluster")
    return forwardMeasureCluster(argc, argv);
  InitLLVM initLLVM(argc, argv);
  cl::HideUnrelatedOptions(duckcCategory);
  for (const Subcommand &sub : kSubcommands) {
    cl::HideUnrelatedOptions(duckcCategory, *sub.command);
    wrapOptionHelp(*sub.command);
  }
  cl::SetVersionPrinter(
      [](raw_ostream &os) { os << "duckc (Duck) " << DUCK_VERSION << "\n"; });
  // Parse errors are reported in the same "duckc: error:" form as the rest.
  std::string parseErrors;
  raw_string_ostream parseErrorStream(parseErrors);
  const std::string overview = overviewFor(argc, argv);
  if (!cl::ParseCommandLineOptions(argc, argv, overview, &parseErrorStream)) {
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
