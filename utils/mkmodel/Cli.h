//===- Cli.h - duck-mkmodel command line ------------------------*- C++ -*-===//
//
// Parses the duck-mkmodel command line into a validated ModelSpec plus write
// options, prints --help, and runs the whole tool (the main is one call).
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_MKMODEL_CLI_H
#define DUCK_MKMODEL_CLI_H

#include "ModelSpec.h"
#include "ModelWriter.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

#include <string>

namespace llvm {
class raw_ostream;
} // namespace llvm

namespace duck::mkmodel {

struct CliRequest {
  bool help = false;
  ModelSpec spec;
  WriteOptions write;
};

/// Parses the arguments after argv[0]. Unless help was asked for, the spec
/// is validated and -o is present. Errors name the option.
llvm::Expected<CliRequest> parseCommandLine(llvm::ArrayRef<std::string> args);

void printHelp(llvm::raw_ostream &os);

/// The one-line summary printed after a successful write.
std::string formatSummary(const ModelSpec &spec, const WriteSummary &summary);

/// The whole tool: parse, write, summarise. Returns the exit code (0, or 1
/// after printing "duck-mkmodel: error: ..." to `err`).
int runMkModel(llvm::ArrayRef<std::string> args, llvm::raw_ostream &out,
               llvm::raw_ostream &err, bool err_is_tty);

} // namespace duck::mkmodel

#endif // DUCK_MKMODEL_CLI_H
