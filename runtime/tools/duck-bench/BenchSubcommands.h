//===- BenchSubcommands.h - duck-bench judge and cache entry points -*- C++
//-*-===//
//
// `duck-bench judge` (BenchJudge.cpp): dispatch overhead of a step over
// local ducks, persistent sessions vs one-shot runs, against a raw TCP
// ping-pong of the same sizes. `duck-bench cache` (BenchCache.cpp): start-up
// with a warm weight cache vs a full prepare. Both link duck_runtime_client
// and duck_synthetic_image and start duckd processes (LocalCluster).
// `duck-bench host` (BenchHost.cpp): the host's GEMV and attention kernels
// against the read bandwidth of the same run. `duck-bench cluster`
// (BenchCluster.cpp): TPOT over local ducks behind the link simulator
// beside the cost model's prediction. `duck-bench collective`
// (BenchCollective.cpp): the ducks' mesh running a token's collectives
// behind the link simulator beside the cost model's mesh term.
// `duck-bench prefetch` (BenchPrefetch.cpp): a router's product cold and
// right after its weights were read into the caches (duckrun
// --host-prefetch).
//
//===----------------------------------------------------------------------===//
#ifndef DUCK_BENCH_BENCHSUBCOMMANDS_H
#define DUCK_BENCH_BENCHSUBCOMMANDS_H

/// argv[0] is the subcommand name; returns the exit code.
int duckBenchJudge(int argc, char **argv);
int duckBenchCache(int argc, char **argv);
int duckBenchHost(int argc, char **argv);
int duckBenchCluster(int argc, char **argv);
int duckBenchCollective(int argc, char **argv);
int duckBenchPrefetch(int argc, char **argv);

namespace duck::bench {
/// The whole tool: dispatches argv[1] to a subcommand, prints the list on
/// --help or on an unknown name.
int benchMain(int argc, char **argv);
} // namespace duck::bench

#endif // DUCK_BENCH_BENCHSUBCOMMANDS_H
