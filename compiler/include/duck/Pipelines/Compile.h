//===- Compile.h - the duckc compile pipeline -------------------*- C++ -*-===//
//
// import -> duck-partition -> duck-select-kernels -> duck-assign-modes ->
// duck-layout-weights -> plan + weight images. Used by `duckc compile`;
// duck-opt registers the same pass list as `duck-compile-pipeline`.
//===----------------------------------------------------------------------===//
#ifndef DUCK_PIPELINES_COMPILE_H
#define DUCK_PIPELINES_COMPILE_H

#include "duck/Dialect/Duck/Transforms/Layout.h"

#include "mlir/Pass/PassManager.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>

namespace mlir::duck {

/// The cluster a plan is compiled for (flags or a --cluster JSON file).
struct ClusterDesc {
  int64_t tp = 1;
  int64_t coresPerDuck = 1;
  /// Bytes of weight buffer each duck offers (rank order); empty = unknown.
  std::vector<uint64_t> memoryBytes;
  ClusterModel cost;
};

/// Reads a cluster file:
///   {"ducks": [{"host": "10.0.0.2", "port": 7000, "cores": 4,
///               "memory_gib": 28}, ...],
///    "bandwidth_gbs": 12.0, "step_overhead_us": 80}
/// or the short form {"tp": 4, "cores_per_duck": 2, "memory_gib": 16}.
llvm::Expected<ClusterDesc> loadClusterFile(llvm::StringRef path);

struct CompileOptions {
  std::string modelDir;
  std::string outDir;
  ClusterDesc cluster;
  std::string multipleOf = "auto";
  std::string strategy = "intermediate";
  enum class Emit { Plan, Mlir, Stats } emit = Emit::Plan;
  /// Stop after this phase for --emit=mlir: import, partition, kernels,
  /// modes, layout (default: layout).
  std::string compileTo = "layout";
  bool dryRun = false;
  bool force = false;
  bool progress = false;
  /// The LM head on the host: "int8" (default: an IEEE-half scale per 32
  /// weights, 1.0625 bytes a weight, logits move by ~0.5%), "checkpoint"
  /// (its own dtype: exact) or "fp9" (1.125 bytes, logits move by a few
  /// percent); or "ducks".
  std::string lmHead = "int8";
  /// Every attention's output projection: "host" (default) or "ducks"
  /// (its rows split over the ducks in fp9, one more duck step a layer).
  std::string oProj = "host";
  /// Every attention's query projection (MLA's q_b_proj, or q_proj):
  /// "host" (default) or "ducks", as oProj.
  std::string qProj = "host";
  /// Every attention's input projections (AttentionOp::getInProjs), one
  /// group of rows: "host" (default) or "ducks", as oProj.
  std::string inProj = "host";
  /// DeepSeek MLA's kv_b_proj (W_UK, W_UV): "host" (default), or "ducks"
  /// where an attention's query and output projections are on the ducks
  /// (whole heads a duck, chained into those steps).
  std::string mlaAbsorb = "host";
  /// DeepSeek's MTP module (docs/mtp.md): "auto" (default: compiled when
  /// the checkpoint has it), "on" (an error without it) or "off".
  std::string mtp = "auto";
  /// Verify the module after every pass (MLIR's default). The --tp auto
  /// search turns it off for its dry-run candidates (a third of their
  /// time); the plan it then compiles is verified as any other.
  bool verifyEachPass = true;
  /// Set by the caller (duckc's Ctrl-C / SIGTERM) to stop writing a plan:
  /// compileModel then removes what it wrote and fails with "interrupted".
  const std::atomic<bool> *cancel = nullptr;
};

/// Adds the partition..layout passes for `opts` to `pm`.
void buildCompilePipeline(OpPassManager &pm, const CompileOptions &opts,
                          llvm::StringRef modelId,
                          llvm::StringRef stopAfter = "layout");

/// Runs `duckc compile`. Text output (MLIR, stats, the dry-run table) goes
/// to `out`; progress and notes to `log`.
/// Registers the compile pipeline with the pass registry as `duck-compile`
/// (duck-opt --duck-compile="tp=2 multiple-of=64 ..."): the very passes and
/// options `duckc compile` runs, from an imported module to a laid-out one.
void registerDuckCompilePipeline();

llvm::Error compileModel(const CompileOptions &opts, llvm::raw_ostream &out,
                         llvm::raw_ostream &log);

/// A checkpoint opened and imported once, to be compiled many times with
/// different options (duckc --tp auto lays out every candidate from one
/// import a thread: the import is most of a dry run's time). Not shared
/// between threads: it owns its MLIR context.
class ImportedModel {
public:
  static llvm::Expected<std::unique_ptr<ImportedModel>>
  import(llvm::StringRef modelDir, llvm::StringRef mtp = "auto");
  ~ImportedModel();

  /// compileModel(opts, ...) on a copy of the imported module;
  /// opts.modelDir must name the directory it was imported from.
  llvm::Error compile(const CompileOptions &opts, llvm::raw_ostream &out,
                      llvm::raw_ostream &log);

private:
  ImportedModel();
  struct Impl;
  std::unique_ptr<Impl> impl;
};

/// Every duck must hold its weight image: `need[r]` bytes against
/// `have[r]` (ducks past the end of `have` are not limited). The error
/// names the first duck that cannot.
llvm::Error checkDuckMemory(llvm::ArrayRef<uint64_t> need,
                            llvm::ArrayRef<uint64_t> have);

} // namespace mlir::duck

#endif
