//===- Driver.cpp - duck-bench subcommand dispatch ------------------------===//

#include "BenchSubcommands.h"
#include "Subcommands.h"

#include <cstdio>
#include <cstring>

namespace duck::bench {

namespace {

const Subcommand kSubcommands[] = {
    {"kernels", "fp9 GEMV/MoE/prefill kernels and read bandwidth on 1..N cores",
     runKernels},
    {"judge", "step dispatch overhead over local ducks vs raw TCP round trips",
     duckBenchJudge},
    {"cache", "start-up with a warm weight cache vs a full prepare",
     duckBenchCache},
};

void printUsage(FILE *out) {
  std::fprintf(out, "usage: duck-bench <subcommand> [options]\n\n"
                    "Benchmarks of the duck runtime; every subcommand takes "
                    "--help.\n\nsubcommands:\n");
  for (const Subcommand &s : kSubcommands)
    std::fprintf(out, "  %-10s %s\n", s.name, s.summary);
}

} // namespace

int benchMain(int argc, char **argv) {
  if (argc < 2) {
    printUsage(stderr);
    return 2;
  }
  if (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    printUsage(stdout);
    return 0;
  }
  for (const Subcommand &s : kSubcommands)
    if (!std::strcmp(argv[1], s.name))
      return s.run(argc - 1, argv + 1);
  std::fprintf(stderr, "duck-bench: unknown subcommand '%s'\n\n", argv[1]);
  printUsage(stderr);
  return 2;
}

} // namespace duck::bench
