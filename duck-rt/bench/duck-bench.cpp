//===- duck-bench.cpp - Benchmarks of the duck runtime --------------------===//
//
// The logic lives in the subcommands (Subcommands.h); the main is one call.
//
//===----------------------------------------------------------------------===//

#include "Subcommands.h"

int main(int argc, char **argv) { return duck::bench::benchMain(argc, argv); }
