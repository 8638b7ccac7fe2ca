//===- duck-mkmodel.cpp - Writes synthetic HF checkpoints for testing -----===//

#include "Cli.h"

#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  std::vector<std::string> args(argv + 1, argv + argc);
  return duck::mkmodel::runMkModel(
      args, llvm::outs(), llvm::errs(),
      llvm::sys::Process::StandardErrIsDisplayed());
}
