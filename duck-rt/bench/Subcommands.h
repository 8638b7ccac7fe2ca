//===- Subcommands.h - The duck-bench subcommand table ----------*- C++ -*-===//
//
// duck-bench is one executable with subcommands (`duck-bench kernels ...`).
// A subcommand is a function taking the arguments after the tool name
// (argv[0] is the subcommand's own name) and returning the exit code. To add
// one, declare its entry point here (or, for one that needs the host
// runtime, in runtime/tools/duck-bench/BenchSubcommands.h) and append it to
// kSubcommands in runtime/tools/duck-bench/Driver.cpp.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_BENCH_SUBCOMMANDS_H
#define DUCK_BENCH_SUBCOMMANDS_H

namespace duck::bench {

struct Subcommand {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
};

/// `duck-bench kernels`: the kernel harness (KernelsBench.cpp).
int runKernels(int argc, char **argv);

} // namespace duck::bench

#endif // DUCK_BENCH_SUBCOMMANDS_H
