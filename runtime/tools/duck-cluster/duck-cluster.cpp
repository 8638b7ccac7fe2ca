// duck-cluster: starts N duckd daemons on 127.0.0.1 (LocalCluster), prints
// their endpoints and keeps them until SIGINT/SIGTERM, then stops them.
#include "duck/runtime/cluster/LocalCluster.h"
#include "duck_rt/tool_flags.h"

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"

#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

ABSL_FLAG(int, ducks, 2, "number of duckd daemons");
ABSL_FLAG(int, cores, 1, "cores of each duck");
ABSL_FLAG(std::string, duckd, "", "duckd binary (default: next to this tool)");
ABSL_FLAG(std::string, cache_dir, "",
          "weight cache directory (default: a temporary one, removed at exit)");
ABSL_FLAG(int64_t, weights_size, 64 << 20, "weight buffer bytes per duck");
ABSL_FLAG(bool, pin, true, "pin each duck's cores to its own CPUs");
ABSL_FLAG(std::string, log_dir, "", "write each duckd's log here");

int main(int argc, char **argv) {
  absl::SetProgramUsageMessage(
      "duck-cluster: run N local duckd daemons until interrupted.");
  duck::ToolFlags flags(argc, argv);

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigprocmask(SIG_BLOCK, &mask, nullptr);

  duck::runtime::LocalClusterOptions o;
  o.ducks = uint32_t(absl::GetFlag(FLAGS_ducks));
  o.cores = uint32_t(absl::GetFlag(FLAGS_cores));
  o.duckd_path = absl::GetFlag(FLAGS_duckd);
  o.cache_dir = absl::GetFlag(FLAGS_cache_dir);
  o.weights_size = uint64_t(absl::GetFlag(FLAGS_weights_size));
  o.pin = absl::GetFlag(FLAGS_pin);
  o.log_dir = absl::GetFlag(FLAGS_log_dir);
  auto cluster = duck::runtime::LocalCluster::Start(o);
  if (!cluster.ok()) {
    std::fprintf(stderr, "duck-cluster: %s\n",
                 std::string(cluster.status().message()).c_str());
    return 1;
  }
  for (size_t i = 0; i < (*cluster)->endpoints().size(); ++i)
    std::printf("duck %zu: %s\n", i,
                (*cluster)->endpoints()[i].ToString().c_str());
  std::printf("ready (Ctrl-C stops the ducks)\n");
  std::fflush(stdout);
  int sig = 0;
  sigwait(&mask, &sig);
  absl::Status s = (*cluster)->Stop();
  std::printf("stopped%s\n", s.ok() ? "" : " (some needed SIGKILL)");
  return 0;
}
