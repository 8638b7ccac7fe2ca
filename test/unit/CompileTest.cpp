// duckc's compile pipeline driven in-process: a model imported once
// (ImportedModel, what `duckc --tp auto` lays its candidates out from)
// compiles exactly as compileModel does, as many times as asked.
#include "duck/Pipelines/Compile.h"

#include "gtest/gtest.h"

#include <string>

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

} // namespace
