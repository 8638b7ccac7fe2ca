//===- duckc.cpp - The Duck compiler driver -------------------------------===//
//
// A thin dispatcher over the compiler libraries. Each subcommand is a
// cl::SubCommand, its cl::opt's (tied to it with cl::sub) and one run
// function listed in kSubcommands; adding a subcommand touches nothing else.
//
//===----------------------------------------------------------------------===//

#include "duck/Import/Checkpoint.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/raw_ostream.h"

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
// Dispatch
//===----------------------------------------------------------------------===//

struct Subcommand {
  cl::SubCommand *command;
  Error (*run)();
};

/// Every subcommand and the function that runs it.
const Subcommand kSubcommands[] = {
    {&describeCmd, runDescribe},
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

Exit status is 0 on success and 1 on any error, reported on stderr as
'duckc: error: <message>'.
)";

} // namespace

int main(int argc, char **argv) {
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
