//===- Compile.cpp - the duckc compile pipeline ---------------------------===//
#include "duck/Pipelines/Compile.h"
#include "duck_rt/kernel_select.h"

#include "duck/Dialect/Duck/Transforms/Passes.h"
#include "duck/Import/ImportModel.h"
#include "duck/Target/Plan/PlanWriter.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"

#include <chrono>
#include <cstdio>
#include <unistd.h>

using namespace mlir;
using namespace mlir::duck;
using llvm::Error;
using llvm::Expected;

namespace {

Error err(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

/// "30.38 GiB", or "81.13 MiB" below a GiB (where two decimals of a GiB
/// would say 0.08 for both sides of a 2 % shortfall).
std::string gib(uint64_t bytes) {
  if (bytes < (1ull << 30))
    return llvm::formatv("{0:F2} MiB", bytes / double(1ull << 20)).str();
  return llvm::formatv("{0:F2} GiB", bytes / double(1ull << 30)).str();
}

/// "config.json:1:1" for a file location; a NameLoc (the layer) adds
/// " (model.layers.3)".
std::string formatLoc(Location loc) {
  std::string out;
  llvm::raw_string_ostream os(out);
  if (auto n = dyn_cast<NameLoc>(loc)) {
    os << formatLoc(n.getChildLoc()) << " (" << n.getName().getValue() << ")";
  } else if (auto f = dyn_cast<FileLineColLoc>(loc)) {
    os << f.getFilename().getValue() << ":" << f.getLine() << ":"
       << f.getColumn();
  } else if (auto fused = dyn_cast<FusedLoc>(loc)) {
    if (!fused.getLocations().empty())
      os << formatLoc(fused.getLocations().front());
  } else {
    loc.print(os);
  }
  return out;
}

/// Collects diagnostics as "location: message" lines (the caller prefixes
/// "duckc: error:"), notes as "location: note: message".
class DiagnosticCollector {
public:
  explicit DiagnosticCollector(MLIRContext &ctx)
      : handler(&ctx, [this](Diagnostic &d) {
          llvm::raw_string_ostream os(text);
          if (!text.empty())
            os << "\n";
          os << formatLoc(d.getLocation()) << ": "
             << (d.getSeverity() == DiagnosticSeverity::Warning ? "warning: "
                 : d.getSeverity() == DiagnosticSeverity::Note  ? "note: "
                                                                : "")
             << d;
          for (Diagnostic &n : d.getNotes())
            os << "\n" << formatLoc(n.getLocation()) << ": note: " << n;
          return success();
        }) {
    // The op dump MLIR appends to pass failures is noise for duckc users.
    ctx.printOpOnDiagnostic(false);
  }
  Error takeError(StringRef fallback) {
    return err(text.empty() ? fallback.str() : text);
  }

private:
  std::string text;
  ScopedDiagnosticHandler handler;
};

/// A number under `key` of `obj` into `out`, if there is one; anything else
/// there is refused.
Error readNumber(const llvm::json::Object &obj, StringRef key, double &out,
                 StringRef path) {
  if (const llvm::json::Value *v = obj.get(key)) {
    if (auto d = v->getAsNumber())
      out = *d;
    else
      return err("cluster file '" + path + "': '" + key +
                 "' must be a number");
  }
  return Error::success();
}

/// The cluster file's named choices: the format the host reads an FP8
/// checkpoint's matrices in and the ducks' mesh transport.
Error readClusterFormats(const llvm::json::Object &o, StringRef path,
                         ClusterModel &cost) {
  if (const llvm::json::Value *t = o.get("host_fp8")) {
    const std::optional<StringRef> s = t->getAsString();
    if (!s || (*s != "e4m3" && *s != "fp9"))
      return err("cluster file '" + path +
                 "': host_fp8 must be \"e4m3\" (the host reads an FP8 "
                 "checkpoint's own bytes, duckrun's default) or \"fp9\" "
                 "(DUCK_HOST_FP8=fp9)");
    cost.hostFp8BytesPerWeight = *s == "e4m3" ? 1.0 : 1.125;
  }
  if (const llvm::json::Value *t = o.get("mesh_transport")) {
    const std::optional<StringRef> s = t->getAsString();
    if (!s || (*s != "tcp" && *s != "udp"))
      return err("cluster file '" + path +
                 "': mesh_transport must be \"tcp\" or \"udp\"");
    cost.meshDatagrams = *s == "udp";
  }
  if (const llvm::json::Value *t = o.get("cast")) {
    const std::optional<StringRef> s = t->getAsString();
    if (!s || !s->contains(':'))
      return err("cluster file '" + path +
                 "': cast must be \"ADDR:PORT\" (the ducks' multicast group "
                 "and port, e.g. \"239.77.0.1:7420\")");
    cost.castAvailable = true;
  }
  return Error::success();
}

/// The cluster-wide figures of the cost model (rates, overheads, the host),
/// checked for sign; `duckLink` is the default link rate of each duck.
Error readClusterCost(const llvm::json::Object &o, StringRef path,
                      ClusterModel &cost, double &duckLink) {
  double bw = cost.bandwidthGbs, ov = cost.stepOverheadUs;
  double gps = 0, hostMs = 0, hostGbs = 0, gemm = 0, hostPrefill = 0,
         chunk = 64, hostGmac = 0, context = 0, hostLink = 0, latency = 0,
         meshCall = 0, meshMessage = 0, meshGroups = 0, hostFrame = 0,
         overheadDucks = 0;
  for (auto [key, v] : {std::pair<const char *, double *>{"bandwidth_gbs", &bw},
                        {"step_overhead_us", &ov},
                        {"fp9_gparam_s", &gps},
                        {"host_ms_per_token", &hostMs},
                        {"host_read_gbs", &hostGbs},
                        {"fp9_gemm_gmac_s", &gemm},
                        {"host_prefill_ms_per_token", &hostPrefill},
                        {"prefill_chunk", &chunk},
                        {"host_gmac_s", &hostGmac},
                        {"context_tokens", &context},
                        {"host_link_gbps", &hostLink},
                        {"duck_link_gbps", &duckLink},
                        {"latency_us", &latency},
                        {"mesh_call_us", &meshCall},
                        {"mesh_message_us", &meshMessage},
                        {"mesh_groups", &meshGroups},
                        {"host_frame_us", &hostFrame},
                        {"step_overhead_ducks", &overheadDucks}})
    if (Error e = readNumber(o, key, *v, path))
      return e;
  if (bw <= 0)
    return err("cluster file '" + path + "': bandwidth_gbs must be positive");
  if (chunk < 1)
    return err("cluster file '" + path + "': prefill_chunk must be at least 1");
  if (meshGroups < 0 || meshGroups != double(int64_t(meshGroups)))
    return err("cluster file '" + path +
               "': mesh_groups must be a whole number (0: the fastest)");
  if (overheadDucks < 0 || overheadDucks != double(int64_t(overheadDucks)))
    return err("cluster file '" + path +
               "': step_overhead_ducks must be a whole number (0: the whole "
               "cluster's step)");
  if (Error e = readClusterFormats(o, path, cost))
    return e;
  for (auto [key, v] : {std::pair{"step_overhead_us", ov},
                        {"fp9_gparam_s", gps},
                        {"host_ms_per_token", hostMs},
                        {"host_read_gbs", hostGbs},
                        {"fp9_gemm_gmac_s", gemm},
                        {"host_prefill_ms_per_token", hostPrefill},
                        {"host_gmac_s", hostGmac},
                        {"context_tokens", context},
                        {"host_link_gbps", hostLink},
                        {"duck_link_gbps", duckLink},
                        {"latency_us", latency},
                        {"mesh_call_us", meshCall},
                        {"mesh_message_us", meshMessage},
                        {"host_frame_us", hostFrame}})
    if (v < 0) {
      char got[32];
      std::snprintf(got, sizeof got, "%g", v);
      return err(llvm::formatv("cluster file '{0}': {1} must not be negative "
                               "(got {2})",
                               path, key, got));
    }
  cost.bandwidthGbs = bw;
  cost.stepOverheadUs = ov;
  cost.fp9GparamS = gps;
  cost.hostMsPerToken = hostMs;
  cost.hostReadGbs = hostGbs;
  cost.gemmGmacS = gemm;
  cost.hostPrefillMsPerToken = hostPrefill;
  cost.prefillChunk = (int64_t)chunk;
  cost.hostGmacS = hostGmac;
  cost.contextTokens = (int64_t)context;
  cost.hostLinkGbps = hostLink;
  cost.latencyUs = latency;
  cost.meshCallUs = meshCall;
  cost.meshMessageUs = meshMessage;
  cost.meshGroups = int64_t(meshGroups);
  cost.hostFrameUs = hostFrame;
  cost.stepOverheadDucks = int64_t(overheadDucks);
  return Error::success();
}

/// ducks[i].fp9_gparam_s_by_kernel: {"general128": 10.6, ...}
/// (measure-cluster), a rate for each kernel class named.
Error readKernelRates(const llvm::json::Object &d, size_t i, StringRef path,
                      std::vector<double> &byClass) {
  const llvm::json::Value *v = d.get("fp9_gparam_s_by_kernel");
  if (!v)
    return Error::success();
  const llvm::json::Object *k = v->getAsObject();
  if (!k)
    return err(llvm::formatv("cluster file '{0}': ducks[{1}]."
                             "fp9_gparam_s_by_kernel must be an object "
                             "of kernel class: Gparam/s",
                             path, i));
  for (const auto &kv : *k) {
    int id = -1;
    for (int c2 = 0; c2 < DUCK_KERNEL_COUNT; ++c2)
      if (kv.first == duck_kernel_name(duck_kernel_id(c2)))
        id = c2;
    std::optional<double> g = kv.second.getAsNumber();
    if (id < 0 || !g || *g < 0)
      return err(llvm::formatv(
          "cluster file '{0}': ducks[{1}].fp9_gparam_s_by_kernel: "
          "'{2}' must be a kernel class (general128, general64, "
          "general32, exact128, exact64, exact32) with a rate >= 0",
          path, i, kv.first.str()));
    byClass[id] = *g;
  }
  return Error::success();
}

/// One entry of 'ducks': its cores (the fewest so far into `minCores`),
/// memory, and the per-duck rates appended to `c`.
Error readDuck(const llvm::json::Value &entry, size_t i, StringRef path,
               double duckLink, ClusterDesc &c, int64_t &minCores) {
  const llvm::json::Object *d = entry.getAsObject();
  if (!d)
    return err(llvm::formatv("cluster file '{0}': ducks[{1}] must be an "
                             "object",
                             path, i));
  double cores = 1, mem = 0;
  if (Error e = readNumber(*d, "cores", cores, path))
    return e;
  if (Error e = readNumber(*d, "memory_gib", mem, path))
    return e;
  if (cores < 1)
    return err(llvm::formatv("cluster file '{0}': ducks[{1}].cores must "
                             "be at least 1",
                             path, i));
  minCores = minCores ? std::min<int64_t>(minCores, cores) : cores;
  c.memoryBytes.push_back((uint64_t)(mem * (1ull << 30)));
  // A per-duck figure that may be absent (0) but not negative.
  auto duckNum = [&](StringRef key, double &out) -> Error {
    if (Error e = readNumber(*d, key, out, path))
      return e;
    if (out < 0)
      return err(llvm::formatv("cluster file '{0}': ducks[{1}].{2} must "
                               "not be negative",
                               path, i, key));
    return Error::success();
  };
  double rate = 0;
  if (Error e = duckNum("fp9_gparam_s", rate))
    return e;
  c.cost.duckGparamS.push_back(rate);
  std::vector<double> byClass(DUCK_KERNEL_COUNT, 0.0);
  if (Error e = readKernelRates(*d, i, path, byClass))
    return e;
  c.cost.duckKernelGparamS.push_back(std::move(byClass));
  double callUs = 0;
  if (Error e = duckNum("gemv_call_us", callUs))
    return e;
  c.cost.duckGemvCallUs.push_back(callUs);
  double link = duckLink;
  if (Error e = duckNum("link_gbps", link))
    return e;
  c.cost.duckLinkGbps.push_back(link);
  return Error::success();
}

/// The long form, a 'ducks' array: each duck read, then the per-duck
/// figures that none gave dropped (per-duck rates: all or none).
Error readDucks(const llvm::json::Array &ducks, StringRef path,
                double duckLink, ClusterDesc &c) {
  if (ducks.empty())
    return err("cluster file '" + path + "': 'ducks' is empty");
  c.tp = ducks.size();
  int64_t minCores = 0;
  for (size_t i = 0; i < ducks.size(); ++i)
    if (Error e = readDuck(ducks[i], i, path, duckLink, c, minCores))
      return e;
  if (llvm::all_of(c.cost.duckLinkGbps, [](double v) { return v == 0; }))
    c.cost.duckLinkGbps.clear();
  if (llvm::all_of(c.cost.duckGemvCallUs, [](double v) { return v == 0; }))
    c.cost.duckGemvCallUs.clear();
  if (llvm::all_of(c.cost.duckKernelGparamS, [](const auto &v) {
        return llvm::all_of(v, [](double g) { return g == 0; });
      }))
    c.cost.duckKernelGparamS.clear();
  c.coresPerDuck = minCores;
  // Per-duck rates: all or none.
  const auto &rates = c.cost.duckGparamS;
  const size_t given = llvm::count_if(rates, [](double v) { return v > 0; });
  if (given == 0)
    c.cost.duckGparamS.clear();
  else if (given != rates.size())
    return err("cluster file '" + path + "': give fp9_gparam_s for every "
               "duck or for none");
  if (llvm::all_of(c.memoryBytes, [](uint64_t m) { return m == 0; }))
    c.memoryBytes.clear();
  return Error::success();
}

/// The short form: tp ducks alike, each with cores_per_duck and memory_gib.
Error readUniformCluster(const llvm::json::Object &o, StringRef path,
                         double duckLink, ClusterDesc &c) {
  double tp = 1, cores = 1, mem = 0;
  if (Error e = readNumber(o, "tp", tp, path))
    return e;
  if (Error e = readNumber(o, "cores_per_duck", cores, path))
    return e;
  if (Error e = readNumber(o, "memory_gib", mem, path))
    return e;
  if (tp < 1 || cores < 1)
    return err("cluster file '" + path +
               "': 'tp' and 'cores_per_duck' must be at least 1");
  c.tp = tp;
  c.coresPerDuck = cores;
  if (mem > 0)
    c.memoryBytes.assign(c.tp, (uint64_t)(mem * (1ull << 30)));
  if (duckLink > 0)
    c.cost.duckLinkGbps.assign(c.tp, duckLink);
  return Error::success();
}

} // namespace

Expected<ClusterDesc> mlir::duck::loadClusterFile(StringRef path) {
  auto buf = llvm::MemoryBuffer::getFile(path);
  if (!buf)
    return err("cannot read cluster file '" + path +
               "': " + buf.getError().message());
  auto json = llvm::json::parse((*buf)->getBuffer());
  if (!json)
    return err("cluster file '" + path +
               "' is not valid JSON: " + llvm::toString(json.takeError()));
  const llvm::json::Object *o = json->getAsObject();
  if (!o)
    return err("cluster file '" + path + "' must hold a JSON object");
  ClusterDesc c;
  double duckLink = 0;
  if (Error e = readClusterCost(*o, path, c.cost, duckLink))
    return e;
  if (const llvm::json::Array *ducks = o->getArray("ducks")) {
    if (Error e = readDucks(*ducks, path, duckLink, c))
      return e;
    return c;
  }
  if (Error e = readUniformCluster(*o, path, duckLink, c))
    return e;
  return c;
}

void mlir::duck::buildCompilePipeline(OpPassManager &pm,
                                      const CompileOptions &opts,
                                      StringRef modelId, StringRef stopAfter) {
  if (stopAfter == "import")
    return;
  DuckPartitionOptions p;
  p.tp = opts.cluster.tp;
  p.multipleOf = opts.multipleOf;
  p.strategy = opts.strategy;
  p.lmHead = opts.lmHead == "ducks" ? "ducks" : "host";
  p.oProj = opts.oProj;
  p.qProj = opts.qProj;
  p.inProj = opts.inProj;
  p.mlaAbsorb = opts.mlaAbsorb;
  // Unequal ducks: slices in proportion to their measured rates.
  // (p.shares is an ArrayRef: `mine` must outlive createDuckPartition.)
  const std::vector<double> &rates = opts.cluster.cost.duckGparamS;
  std::vector<double> mine;
  if ((int64_t)rates.size() >= opts.cluster.tp && opts.cluster.tp > 0) {
    mine.assign(rates.begin(), rates.begin() + opts.cluster.tp);
    if (llvm::any_of(mine, [&](double v) { return v != mine.front(); }))
      p.shares = mine;
  }
  pm.addPass(createDuckPartition(p));
  if (stopAfter == "partition")
    return;
  pm.addPass(createDuckSelectKernels());
  if (stopAfter == "kernels")
    return;
  DuckAssignModesOptions m;
  m.coresPerDuck = opts.cluster.coresPerDuck;
  pm.addPass(createDuckAssignModes(m));
  if (stopAfter == "modes")
    return;
  DuckLayoutWeightsOptions l;
  l.modelId = modelId.str();
  pm.addPass(createDuckLayoutWeights(l));
}

namespace {
/// duck-compile's options: duckc compile's partition, cluster and layout
/// flags.
struct CompilePipelineOptions
    : public PassPipelineOptions<CompilePipelineOptions> {
  Option<int64_t> tp{*this, "tp", llvm::cl::desc("ducks"), llvm::cl::init(1)};
  Option<std::string> multipleOf{
      *this, "multiple-of",
      llvm::cl::desc("neurons a block: 128, 64, 32 or auto"),
      llvm::cl::init("auto")};
  Option<std::string> strategy{
      *this, "strategy",
      llvm::cl::desc("MoE layers: intermediate (split every expert), "
                     "experts (whole experts a duck), or a list by layer "
                     "(intermediate,experts:3-30)"),
      llvm::cl::init("intermediate")};
  Option<int64_t> coresPerDuck{*this, "cores-per-duck",
                               llvm::cl::desc("cores of each duck"),
                               llvm::cl::init(1)};
  ListOption<double> rates{
      *this, "duck-gparam-s",
      llvm::cl::desc("each duck's measured fp9 rate (unequal ducks get "
                     "proportional slices), as in a cluster file")};
  Option<std::string> modelId{*this, "model-id",
                              llvm::cl::desc("the model's id in image keys"),
                              llvm::cl::init("")};
  Option<std::string> lmHead{
      *this, "lm-head",
      llvm::cl::desc("host (default) or ducks: the LM head's rows over the "
                     "ducks"),
      llvm::cl::init("host")};
  Option<std::string> oProj{
      *this, "o-proj",
      llvm::cl::desc("host (default) or ducks: every attention's o_proj "
                     "rows over the ducks"),
      llvm::cl::init("host")};
  Option<std::string> qProj{
      *this, "q-proj",
      llvm::cl::desc("host (default) or ducks: every attention's query "
                     "projection rows over the ducks"),
      llvm::cl::init("host")};
  Option<std::string> inProj{
      *this, "in-proj",
      llvm::cl::desc("host (default) or ducks: every attention's input "
                     "projections' rows over the ducks"),
      llvm::cl::init("host")};
  Option<std::string> mlaAbsorb{
      *this, "mla-absorb",
      llvm::cl::desc("host (default) or ducks: MLA's kv_b_proj on the ducks "
                     "by heads (with its query and output projections)"),
      llvm::cl::init("host")};
  Option<std::string> stopAfter{
      *this, "stop-after",
      llvm::cl::desc("partition, kernels, modes or layout (default)"),
      llvm::cl::init("layout")};
};
} // namespace

void mlir::duck::registerDuckCompilePipeline() {
  PassPipelineRegistration<CompilePipelineOptions>(
      "duck-compile",
      "duckc compile's pipeline: partition, kernels, modes, layout",
      [](OpPassManager &pm, const CompilePipelineOptions &p) {
        CompileOptions o;
        o.cluster.tp = p.tp;
        o.cluster.coresPerDuck = p.coresPerDuck;
        o.cluster.cost.duckGparamS.assign(p.rates.begin(), p.rates.end());
        o.multipleOf = p.multipleOf;
        o.strategy = p.strategy;
        o.lmHead = p.lmHead;
        o.oProj = p.oProj;
        o.qProj = p.qProj;
        o.inProj = p.inProj;
        o.mlaAbsorb = p.mlaAbsorb;
        buildCompilePipeline(pm, o, p.modelId, p.stopAfter);
      });
}

static llvm::json::Array kernelTable(ModuleOp module) {
  llvm::json::Array rows;
  module.walk([&](Operation *op) {
    if (!isa<MlpOp, MoeOp>(op))
      return;
    Region &r = op->getRegion(0);
    if (r.empty() || r.front().empty())
      return;
    auto first = cast<Fp9FfnOp>(r.front().front());
    FfnShape s = ffnShapeOf(first);
    auto name = [](std::optional<KernelAttr> k) {
      return k ? stringifyKernelKind(k->getKind()).str() : std::string("none");
    };
    rows.push_back(llvm::json::Object{
        {"layer", s.layer},
        {"kind", s.moe ? "moe" : "dense"},
        {"inter", s.inter},
        {"local_inter", (int64_t)first.getLocalInter()},
        {"experts", s.experts},
        {"gate", llvm::json::Object{{"kernel", name(first.getGateKernel())}}},
        {"up", llvm::json::Object{{"kernel", name(first.getUpKernel())}}},
        {"down", llvm::json::Object{{"kernel", name(first.getDownKernel())}}},
    });
  });
  return rows;
}

Error mlir::duck::checkDuckMemory(ArrayRef<uint64_t> need,
                                  ArrayRef<uint64_t> have) {
  for (size_t r = 0; r < need.size() && r < have.size(); ++r)
    if (need[r] > have[r])
      return err(llvm::formatv(
          "duck {0} needs {1} ({2} bytes) for its weight image but has only "
          "{3} ({4} bytes); use more ducks or ducks with more memory",
          r, gib(need[r]), need[r], gib(have[r]), have[r]));
  return Error::success();
}

namespace {
/// What compileModel checks of its options before importing anything.
Error checkCompileOptions(const CompileOptions &opts,
                          const import::Checkpoint &ckpt) {
  static const char *phases[] = {"import", "partition", "kernels", "modes",
                                 "layout"};
  if (!llvm::is_contained(phases, opts.compileTo))
    return err("--compile-to must be one of import, partition, kernels, "
               "modes, layout; got '" +
               opts.compileTo + "'");
  if (opts.emit != CompileOptions::Emit::Mlir && opts.compileTo != "layout")
    return err("--compile-to stops early and only makes sense with "
               "--emit=mlir");
  bool writes = opts.emit == CompileOptions::Emit::Plan && !opts.dryRun;
  if (writes && !ckpt.hasWeights())
    return err("'" + opts.modelDir +
               "' has a config.json but no safetensors weights; compiling a "
               "plan packs the weights (use --dry-run for layout and stats "
               "from the config alone)");
  if (writes && opts.cluster.cost.fanout == ClusterModel::Fanout::relay)
    return err("--fanout relay is modelled only: no duck forwards a step, "
               "so no plan is written with it (use --dry-run)");
  if (writes && opts.cluster.cost.reduceTree)
    return err("--reduce tree is modelled only: the ducks' replies come "
               "straight to the host, so no plan is written with it (use "
               "--dry-run)");
  if (writes && opts.cluster.cost.stageX)
    return err("--stage-x is modelled only: the runtime sends a step whole, "
               "its routing slots with its activations, so no plan is "
               "written with it (use --dry-run)");
  if (opts.cluster.cost.residualOnDucks) {
    if (writes)
      return err("--residual ducks is modelled only: no duck runs a layer's "
                 "norms and router yet, so no plan is written with it (use "
                 "--dry-run)");
    if (opts.inProj != "ducks" || opts.qProj != "ducks" ||
        opts.oProj != "ducks" ||
        (ckpt.model().usesMla() && opts.mlaAbsorb != "ducks"))
      return err("--residual ducks keeps only the attention over the cache "
                 "on the host: it needs --in-proj, --q-proj and --o-proj "
                 "ducks" +
                 std::string(ckpt.model().usesMla()
                                 ? " and --mla-absorb ducks"
                                 : "") +
                 " (or --tp auto, which chooses among those)");
  }
  if (writes && opts.outDir.empty())
    return err("no output directory: pass -o <out-dir> (or --dry-run)");
  return Error::success();
}

/// compileModel after the import: the pipeline on `module`, then what
/// `opts` asks for (MLIR, stats, the dry-run table, or the plan).
Error compileImported(const CompileOptions &opts,
                      const import::Checkpoint &ckpt, MLIRContext &ctx,
                      OwningOpRef<ModuleOp> module, DiagnosticCollector &diags,
                      llvm::raw_ostream &out, llvm::raw_ostream &log);
} // namespace

Error mlir::duck::compileModel(const CompileOptions &opts,
                               llvm::raw_ostream &out, llvm::raw_ostream &log) {
  auto ckptOr = import::Checkpoint::open(opts.modelDir);
  if (!ckptOr)
    return ckptOr.takeError();
  const import::Checkpoint &ckpt = **ckptOr;
  if (Error e = checkCompileOptions(opts, ckpt))
    return e;
  MLIRContext ctx;
  ctx.getOrLoadDialect<DuckDialect>();
  DiagnosticCollector diags(ctx);
  std::string mtpNote;
  auto mtp = import::wantMtp(ckpt, opts.mtp, &mtpNote);
  if (!mtp)
    return mtp.takeError();
  if (!mtpNote.empty())
    log << "duckc: note: " << mtpNote << "\n";
  OwningOpRef<ModuleOp> module = import::importModel(ctx, ckpt, *mtp);
  if (!module)
    return diags.takeError("import of '" + opts.modelDir + "' failed");
  return compileImported(opts, ckpt, ctx, std::move(module), diags, out, log);
}

struct ImportedModel::Impl {
  std::unique_ptr<import::Checkpoint> ckpt;
  MLIRContext ctx;
  OwningOpRef<ModuleOp> module;
  std::string modelDir;
};

ImportedModel::ImportedModel() : impl(std::make_unique<Impl>()) {}
ImportedModel::~ImportedModel() = default;

Expected<std::unique_ptr<ImportedModel>>
ImportedModel::import(llvm::StringRef modelDir, llvm::StringRef mtpMode) {
  auto ckptOr = import::Checkpoint::open(modelDir.str());
  if (!ckptOr)
    return ckptOr.takeError();
  std::unique_ptr<ImportedModel> m(new ImportedModel());
  Impl &i = *m->impl;
  i.ckpt = std::move(*ckptOr);
  i.modelDir = modelDir.str();
  i.ctx.getOrLoadDialect<DuckDialect>();
  DiagnosticCollector diags(i.ctx);
  auto mtp = import::wantMtp(*i.ckpt, mtpMode);
  if (!mtp)
    return mtp.takeError();
  i.module = import::importModel(i.ctx, *i.ckpt, *mtp);
  if (!i.module)
    return diags.takeError("import of '" + i.modelDir + "' failed");
  return m;
}

Error ImportedModel::compile(const CompileOptions &opts, llvm::raw_ostream &out,
                             llvm::raw_ostream &log) {
  Impl &i = *impl;
  if (opts.modelDir != i.modelDir)
    return err("compile of '" + opts.modelDir + "' given the import of '" +
               i.modelDir + "'");
  if (Error e = checkCompileOptions(opts, *i.ckpt))
    return e;
  DiagnosticCollector diags(i.ctx);
  OwningOpRef<ModuleOp> copy(cast<ModuleOp>(i.module->getOperation()->clone()));
  return compileImported(opts, *i.ckpt, i.ctx, std::move(copy), diags, out,
                         log);
}

namespace {
/// --dry-run: the stats as text and each layer's FFN kernels, no plan.
void printDryRun(const CompileOptions &opts, const ModuleStats &stats,
                 const ClusterModel &cost, ModuleOp module,
                 llvm::raw_ostream &out) {
  out << "model: " << opts.modelDir << "\n";
  printStatsText(stats, cost, out);
  out << "layer  kind   inter  local  experts  gate        up          down\n";
  for (const llvm::json::Value &row : kernelTable(module)) {
    const llvm::json::Object &o = *row.getAsObject();
    out << llvm::format("%-6lld %-6s %-6lld %-6lld %-8lld %-11s %-11s %s\n",
                        (long long)*o.getInteger("layer"),
                        o.getString("kind")->str().c_str(),
                        (long long)*o.getInteger("inter"),
                        (long long)*o.getInteger("local_inter"),
                        (long long)*o.getInteger("experts"),
                        o.getObject("gate")->getString("kernel")->str().c_str(),
                        o.getObject("up")->getString("kernel")->str().c_str(),
                        o.getObject("down")->getString("kernel")->str().c_str());
  }
}

/// An existing output path must be a directory, and empty unless --force;
/// `exists` says whether it is there (to be replaced).
Error checkOutDir(const CompileOptions &opts, bool &exists) {
  namespace fs = llvm::sys::fs;
  exists = fs::exists(opts.outDir);
  if (exists) {
    std::error_code ec;
    fs::directory_iterator it(opts.outDir, ec);
    bool empty = !ec && it == fs::directory_iterator();
    if (!fs::is_directory(opts.outDir))
      return err("output path '" + opts.outDir + "' exists and is not a "
                 "directory");
    if (!empty && !opts.force)
      return err("output directory '" + opts.outDir +
                 "' exists and is not empty; use --force to replace it");
  }
  return Error::success();
}

/// Writes the plan into a temporary directory next to the target, then
/// renames it, so a failure never leaves a half-written plan behind; each
/// duck's progress goes to `log` (a terminal's line redrawn).
Error writePlanDir(const CompileOptions &opts, const import::Checkpoint &ckpt,
                   ModuleOp module, const ModuleStats &stats, bool exists,
                   PlanWriteOptions &wo, llvm::raw_ostream &log) {
  namespace fs = llvm::sys::fs;
  std::string tmp =
      llvm::formatv("{0}.tmp-{1}", opts.outDir, (int64_t)::getpid()).str();
  fs::remove_directories(tmp);
  if (std::error_code ec = fs::create_directories(tmp))
    return err("cannot create '" + tmp + "': " + ec.message());
  auto cleanup = [&] { fs::remove_directories(tmp); };

  bool tty = llvm::sys::Process::StandardErrIsDisplayed();
  auto start = std::chrono::steady_clock::now();
  uint64_t doneBefore = 0, grand = stats.totalBytes;
  int64_t lastRank = -1;
  wo.progress = [&](int64_t rank, uint64_t done, uint64_t total) {
    if (rank != lastRank && lastRank >= 0)
      doneBefore += stats.ducks[lastRank].bytes;
    lastRank = rank;
    if (!tty && !opts.progress && done != total)
      return;
    double secs = std::chrono::duration<double>(
                      std::chrono::steady_clock::now() - start)
                      .count();
    uint64_t all = doneBefore + done;
    double rate = secs > 0 ? all / secs : 0;
    double eta = rate > 0 ? (grand - all) / rate : 0;
    log << llvm::format("%sduckc: duck %lld/%lld: %.1f / %.1f MiB, %.0f MB/s, "
                        "ETA %.0f s%s",
                        tty ? "\r" : "", (long long)rank + 1,
                        (long long)stats.tp, done / 1048576.0,
                        total / 1048576.0, rate / 1e6, eta,
                        tty && done != total ? "   " : "\n");
    log.flush();
  };
  if (Error e = writePlan(module, ckpt, tmp, wo)) {
    cleanup();
    if (opts.cancel && opts.cancel->load()) {
      consumeError(std::move(e));
      return err("interrupted: what was written is removed, and '" +
                 opts.outDir + "' is as it was");
    }
    return e;
  }
  if (exists)
    fs::remove_directories(opts.outDir);
  if (std::error_code ec = fs::rename(tmp, opts.outDir)) {
    cleanup();
    return err("cannot move the plan into '" + opts.outDir +
               "': " + ec.message());
  }
  return Error::success();
}

/// The "wrote ..." line: the plan's ducks, bytes and where each part runs.
void printWrote(const CompileOptions &opts, const ModuleStats &stats,
                const PlanWriteOptions &wo, llvm::raw_ostream &out) {
  out << llvm::formatv(
      "wrote {0}/{1}: {2} duck(s), {3} weight bytes ({4}), "
      "tp {5}, multiple_of {6}{9}, LM head {7}{8}\n",
      opts.outDir, kPlanFileName, stats.tp, stats.totalBytes,
      gib(stats.totalBytes), stats.tp, stats.multipleOf,
      stats.lmHeadOnDucks ? "fp9 on the ducks (vocab split)"
      : wo.lmHeadFp9      ? "fp9 on the host"
      : wo.lmHeadInt8     ? "int8 on the host"
                          : "as in the checkpoint, on the host",
      std::string(stats.inProjOnDucks ? ", attention input projections in "
                                        "fp9 on the ducks"
                                      : "") +
          (stats.qProjOnDucks ? ", attention query projection in "
                                "fp9 on the ducks"
                              : "") +
          (stats.oProjOnDucks ? ", attention o_proj in fp9 on the ducks" : "") +
          (stats.mlaAbsorbedBytesPerToken > 0
               ? ", MLA kv_b_proj (W_UK, W_UV) in fp9 on the ducks by heads"
               : "") +
          (wo.wireBf16 ? ", activations to the ducks in bf16" : "") +
          (wo.wireQ8 ? ", activations to the ducks in q8" : "") +
          (wo.wireOutBf16 ? ", the ducks' answers in bf16" : "") +
          (wo.wireOutQ8 ? ", the ducks' answers in q8" : "") +
          (wo.multicast ? ", steps cast once to every duck (multicast)" : "") +
          (wo.stageShared ? ", shared experts staged before the routing" : ""),
      stats.strategy == "intermediate" ? std::string()
      : stats.strategy == "mixed"
          ? ", MoE layers by strategy " + strategySpecOf(stats)
          : ", whole experts a duck");
}

Error compileImported(const CompileOptions &opts,
                      const import::Checkpoint &ckpt, MLIRContext &ctx,
                      OwningOpRef<ModuleOp> module, DiagnosticCollector &diags,
                      llvm::raw_ostream &out, llvm::raw_ostream &log) {
  PassManager pm(&ctx);
  pm.enableVerifier(opts.verifyEachPass);
  buildCompilePipeline(pm, opts, import::checkpointIdentity(ckpt),
                       opts.compileTo);
  if (failed(pm.run(*module)))
    return diags.takeError("compilation failed");

  if (opts.emit == CompileOptions::Emit::Mlir) {
    module->print(out);
    out << "\n";
    return Error::success();
  }
  ClusterModel cost = opts.cluster.cost;
  cost.coresPerDuck = opts.cluster.coresPerDuck;
  // A host head quantised at load: fp9 reads 1.125 bytes a weight, int8
  // (an IEEE-half scale per 32 weights) 1.0625.
  cost.hostHeadBytesPerWeight = opts.lmHead == "fp9"    ? 1.125
                                : opts.lmHead == "int8" ? 1.0625
                                                        : 0;
  auto stats = computeStats(*module, cost);
  if (failed(stats))
    return diags.takeError("statistics failed");

  // Every duck must hold its shard.
  {
    std::vector<uint64_t> need;
    for (const DuckStats &d : stats->ducks)
      need.push_back(d.bytes);
    if (Error e = checkDuckMemory(need, opts.cluster.memoryBytes)) {
      if (!stats->mtpFfnLayers)
        return e;
      return err(llvm::toString(std::move(e)) +
                 " (or leave DeepSeek's MTP module out: --mtp off)");
    }
  }

  if (opts.emit == CompileOptions::Emit::Stats) {
    llvm::json::Object o = statsToJson(*stats, cost);
    o["ffn"] = kernelTable(*module);
    o["cores_per_duck"] = opts.cluster.coresPerDuck;
    out << llvm::formatv("{0:2}", llvm::json::Value(std::move(o))) << "\n";
    return Error::success();
  }
  if (opts.dryRun) {
    printDryRun(opts, *stats, cost, *module, out);
    return Error::success();
  }

  bool exists = false;
  if (Error e = checkOutDir(opts, exists))
    return e;
  PlanWriteOptions wo;
  wo.coresPerDuck = opts.cluster.coresPerDuck;
  wo.lmHeadFp9 = opts.lmHead == "fp9";
  wo.lmHeadInt8 = opts.lmHead == "int8";
  using Wire = ClusterModel::Wire;
  wo.wireBf16 = opts.cluster.cost.wireX == Wire::bf16;
  wo.wireOutBf16 = opts.cluster.cost.wireOut == Wire::bf16;
  wo.wireQ8 = opts.cluster.cost.wireX == Wire::q8;
  wo.wireOutQ8 = opts.cluster.cost.wireOut == Wire::q8;
  wo.multicast = opts.cluster.cost.fanout == ClusterModel::Fanout::multicast;
  wo.stageShared = stats->stagedShared;
  wo.cancel = opts.cancel;
  if (Error e = writePlanDir(opts, ckpt, *module, *stats, exists, wo, log))
    return e;
  printWrote(opts, *stats, wo, out);
  return Error::success();
}
} // namespace
