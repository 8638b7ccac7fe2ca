// duckc's compile pipeline driven in-process: a model imported once
// (ImportedModel, what `duckc --tp auto` lays its candidates out from)
// compiles exactly as compileModel does, as many times as asked.
#include "duck/Pipelines/Compile.h"
#include "Cli.h" // duck-mkmodel, for a checkpoint with weights
#include "duck/Pipelines/ChoosePlan.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

using mlir::duck::CompileOptions;
using mlir::duck::ImportedModel;

namespace {

const std::string kModels = std::string(DUCK_SOURCE_DIR) + "/models/";

CompileOptions statsOptions(const std::string &model, int64_t tp,
                            const std::string &strategy) {
  CompileOptions o;
  o.modelDir = kModels + model;
  o.cluster.tp = tp;
  o.strategy = strategy;
  o.emit = CompileOptions::Emit::Stats;
  o.dryRun = true;
  return o;
}

std::string viaCompileModel(const CompileOptions &o) {
  std::string out, log;
  llvm::raw_string_ostream os(out), ls(log);
  if (llvm::Error e = mlir::duck::compileModel(o, os, ls))
    return "error: " + llvm::toString(std::move(e));
  return out;
}

std::string viaImport(ImportedModel &m, const CompileOptions &o) {
  std::string out, log;
  llvm::raw_string_ostream os(out), ls(log);
  if (llvm::Error e = m.compile(o, os, ls))
    return "error: " + llvm::toString(std::move(e));
  return out;
}

TEST(ImportedModel, CompilesAsCompileModelDoesEveryTime) {
  auto m = ImportedModel::import(kModels + "Qwen3-30B-A3B");
  ASSERT_TRUE(bool(m)) << llvm::toString(m.takeError());
  // Different candidates one after another from the one import: each
  // starts from the imported module, not from the last one's layout.
  for (auto [tp, strategy] : {std::pair<int64_t, const char *>{3, "experts"},
                              {4, "intermediate"},
                              {3, "experts"},
                              {2, "intermediate,experts:1-3"}}) {
    const CompileOptions o = statsOptions("Qwen3-30B-A3B", tp, strategy);
    const std::string want = viaCompileModel(o);
    ASSERT_EQ(want.rfind("error", 0), std::string::npos) << want;
    EXPECT_EQ(viaImport(**m, o), want) << "tp " << tp << " " << strategy;
  }
}

TEST(ImportedModel, VerifierOffGivesTheSameStats) {
  auto m = ImportedModel::import(kModels + "Qwen3-0.6B");
  ASSERT_TRUE(bool(m)) << llvm::toString(m.takeError());
  CompileOptions o = statsOptions("Qwen3-0.6B", 2, "intermediate");
  const std::string verified = viaImport(**m, o);
  o.verifyEachPass = false;
  EXPECT_EQ(viaImport(**m, o), verified);
}

TEST(ImportedModel, RefusesAnotherModelsOptions) {
  auto m = ImportedModel::import(kModels + "Qwen3-0.6B");
  ASSERT_TRUE(bool(m)) << llvm::toString(m.takeError());
  const std::string got =
      viaImport(**m, statsOptions("Qwen3-30B-A3B", 2, "intermediate"));
  EXPECT_NE(got.find("error: compile of '"), std::string::npos) << got;
  EXPECT_NE(got.find("given the import of '"), std::string::npos) << got;
}

TEST(ImportedModel, OptionErrorsAreCompileModels) {
  auto m = ImportedModel::import(kModels + "Qwen3-0.6B");
  ASSERT_TRUE(bool(m)) << llvm::toString(m.takeError());
  CompileOptions o = statsOptions("Qwen3-0.6B", 2, "intermediate");
  o.compileTo = "kernels"; // stops early: only with --emit=mlir
  const std::string want = viaCompileModel(o);
  EXPECT_NE(want.find("--compile-to stops early"), std::string::npos) << want;
  EXPECT_EQ(viaImport(**m, o), want);
  // A pass's error: whole experts asked of a dense layer.
  o = statsOptions("Qwen3-0.6B", 2, "intermediate,experts:0");
  const std::string dense = viaCompileModel(o);
  EXPECT_NE(dense.find("layer 0 is dense"), std::string::npos) << dense;
  EXPECT_EQ(viaImport(**m, o), dense);
}

TEST(ImportedModel, ImportErrorNamesTheDirectory) {
  auto m = ImportedModel::import(kModels + "no-such-model");
  ASSERT_FALSE(bool(m));
  const std::string e = llvm::toString(m.takeError());
  EXPECT_NE(e.find("no-such-model"), std::string::npos) << e;
}

/// duckc's Ctrl-C while a plan is written: the write stops, what was
/// written is removed, and an existing output directory is left as it was.
TEST(CompileModel, InterruptedWriteLeavesNothingBehind) {
  llvm::SmallString<128> dir;
  ASSERT_FALSE(llvm::sys::fs::createUniqueDirectory("duck-compile-test", dir));
  const std::string model = (dir + "/model").str(), out = (dir + "/plan").str();
  std::string mkOut, mkErr;
  llvm::raw_string_ostream mo(mkOut), me(mkErr);
  ASSERT_EQ(duck::mkmodel::runMkModel({"--preset", "tiny-qwen3", "-o", model},
                                      mo, me, /*err_is_tty=*/false),
            0)
      << mkErr;
  CompileOptions o;
  o.modelDir = model;
  o.outDir = out;
  o.cluster.tp = 2;
  std::atomic<bool> stop{true};
  o.cancel = &stop;
  std::string text, log;
  llvm::raw_string_ostream os(text), ls(log);
  llvm::Error e = mlir::duck::compileModel(o, os, ls);
  ASSERT_TRUE(bool(e));
  const std::string msg = llvm::toString(std::move(e));
  EXPECT_NE(msg.find("interrupted"), std::string::npos) << msg;
  auto entries = [&] {
    std::vector<std::string> names;
    std::error_code ec;
    for (llvm::sys::fs::directory_iterator it(dir, ec), end; it != end && !ec;
         it.increment(ec))
      names.push_back(llvm::sys::path::filename(it->path()).str());
    std::sort(names.begin(), names.end());
    return names;
  };
  EXPECT_EQ(entries(), std::vector<std::string>{"model"});
  // Without the flag the same options write the plan.
  stop.store(false);
  ASSERT_FALSE(bool(mlir::duck::compileModel(o, os, ls)));
  EXPECT_TRUE(llvm::sys::fs::exists(out + "/model.duckplan"));
  // An interrupted --force leaves the plan that was there.
  o.force = true;
  stop.store(true);
  e = mlir::duck::compileModel(o, os, ls);
  ASSERT_TRUE(bool(e));
  llvm::consumeError(std::move(e));
  EXPECT_EQ(entries(), (std::vector<std::string>{"model", "plan"}));
  EXPECT_TRUE(llvm::sys::fs::exists(out + "/model.duckplan"));
  llvm::sys::fs::remove_directories(dir);
}

} // namespace

// The search's coarsest wire (ChoosePlan.h): q8 for the block-FP8 releases
// with dynamic activations, bf16 for bf16 checkpoints, f32 for anything
// else (a float32 checkpoint; an FP8 one whose activations are static and
// whose dtype says nothing).
TEST(CheckpointWire, FollowsTheCheckpointsOwnRounding) {
  using Wire = mlir::duck::ClusterModel::Wire;
  auto load = [](const std::string &model) {
    llvm::Expected<mlir::duck::import::ModelDesc> m =
        mlir::duck::import::loadModelConfig(kModels + model + "/config.json");
    EXPECT_TRUE(bool(m)) << llvm::toString(m.takeError());
    return *m;
  };
  for (const char *fp8 : {"DeepSeek-V3.2", "DeepSeek-V3", "Qwen3-30B-A3B-FP8",
                          "Qwen3-235B-A22B-FP8"}) {
    const mlir::duck::WireAdmission a = mlir::duck::checkpointWire(load(fp8));
    EXPECT_EQ(a.wire, Wire::q8) << fp8;
    EXPECT_NE(a.why.find("activation_scheme dynamic"), std::string::npos);
  }
  mlir::duck::import::ModelDesc bf16 = load("Qwen3-235B-A22B");
  EXPECT_EQ(mlir::duck::checkpointWire(bf16).wire, Wire::bf16);
  mlir::duck::import::ModelDesc f32 = bf16;
  f32.torch_dtype = "float32";
  EXPECT_EQ(mlir::duck::checkpointWire(f32).wire, Wire::f32);
  mlir::duck::import::ModelDesc staticFp8 = load("DeepSeek-V3.2");
  staticFp8.quantization.activation_scheme = "static";
  staticFp8.torch_dtype.clear();
  EXPECT_EQ(mlir::duck::checkpointWire(staticFp8).wire, Wire::f32);
}
