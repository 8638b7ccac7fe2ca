//===- Subcommands.h - The duck-bench subcommand table ----------*- C++ -*-===//
//
// duck-bench is one executable with subcommands (`duck-bench kernels ...`).
// A subcommand is a function taking the arguments after the tool name
// (argv[0] is the subcommand's own name) and returning the exit code. To add
// one, declare its entry point here and append it to kSubcommands in
// Driver.cpp.
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

/// The whole tool: dispatches argv[1] to a subcommand, prints the list on
/// --help or on an unknown name.
int benchMain(int argc, char **argv);

} // namespace duck::bench

#endif // DUCK_BENCH_SUBCOMMANDS_H
