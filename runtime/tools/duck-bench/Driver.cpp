//===- Driver.cpp - duck-bench subcommand dispatch ------------------------===//

#include "BenchSubcommands.h"
#include "Subcommands.h"
#include "duck/runtime/cluster/LocalCluster.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

namespace duck::bench {

namespace {

/// `duck-bench e2e`: the end-to-end benchmark is a pipeline of tools
/// (duck-mkmodel, duckc, duckrun, optionally llama.cpp's llama-bench),
/// driven by utils/bench-e2e.py; run it against the build this duck-bench
/// belongs to. Debian's python3 is preferred: the project's bootstrap puts
/// numpy and matplotlib there.
int runE2e(int argc, char **argv) {
  std::string bin = runtime::ExecutableDir();
  std::string build = bin.substr(0, bin.rfind('/'));
  setenv("DUCK_BUILD_DIR", build.c_str(), 1);
  std::string script = DUCK_SOURCE_DIR "/utils/bench-e2e.py";
  std::string python =
      access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  std::vector<char *> args;
  args.push_back(python.data());
  args.push_back(script.data());
  for (int i = 1; i < argc; ++i)
    args.push_back(argv[i]);
  args.push_back(nullptr);
  execvp(python.c_str(), args.data());
  std::perror("duck-bench e2e: cannot run utils/bench-e2e.py");
  return 1;
}

const Subcommand kSubcommands[] = {
    {"kernels", "fp9 GEMV/MoE/prefill kernels and read bandwidth on 1..N cores",
     runKernels},
    {"judge", "step dispatch overhead over local ducks vs raw TCP round trips",
     duckBenchJudge},
    {"cache", "start-up with a warm weight cache vs a full prepare",
     duckBenchCache},
    {"host", "the host's fp9 GEMV and attention vs read bandwidth, cold",
     duckBenchHost},
    {"e2e", "decode/prefill end to end vs read bandwidth (and llama.cpp)",
     runE2e},
    {"cluster", "TPOT over ducks behind simulated links vs the cost model",
     duckBenchCluster},
    {"collective",
     "the ducks' collectives over simulated links vs the cost model",
     duckBenchCollective},
    {"prefetch", "a router's product cold vs its weights read in beforehand",
     duckBenchPrefetch},
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
