//===- duck-bench.cpp - Benchmarks of the duck runtime --------------------===//
//
// The logic lives in the subcommands (Driver.cpp); the main is one call.
//
//===----------------------------------------------------------------------===//

#include "BenchSubcommands.h"

int main(int argc, char **argv) { return duck::bench::benchMain(argc, argv); }
