// duck-cluster: starts N duckd daemons on 127.0.0.1 (LocalCluster), prints
// their endpoints (and writes them as a cluster file with --cluster_file)
// and keeps them until SIGINT/SIGTERM, then stops them.
#include "duck/runtime/cluster/LocalCluster.h"
#include "duck_rt/tool_flags.h"

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"

#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
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
ABSL_FLAG(bool, mesh, false,
          "start every duckd with a mesh listener (--mesh-port 0), for "
          "the ducks' collectives (duckc measure-cluster --mesh)");
ABSL_FLAG(std::string, cast, "",
          "GROUP:PORT: every duckd joins this multicast group on loopback "
          "(duckd --cast) and the cluster file names it (\"cast\"), for "
          "plans compiled with duckc --fanout multicast");
ABSL_FLAG(std::string, cluster_file, "",
          "write the ducks as a cluster file here (host, port, cores and, "
          "with --mesh, mesh_port), for duckrun --cluster and duckc "
          "measure-cluster");

namespace {
/// The ducks as a cluster file; false (said) if it cannot be written.
bool WriteClusterFile(const duck::runtime::LocalCluster &c, uint32_t cores,
                      const std::string &cast, const std::string &path) {
  nlohmann::json f;
  if (!cast.empty()) {
    f["cast"] = cast;
    f["cast_interface"] = "127.0.0.1";
  }
  f["ducks"] = nlohmann::json::array();
  for (size_t i = 0; i < c.endpoints().size(); ++i) {
    nlohmann::json d = {{"host", c.endpoints()[i].host},
                        {"port", c.endpoints()[i].port},
                        {"cores", cores}};
    if (c.mesh_endpoints()[i].port != 0)
      d["mesh_port"] = c.mesh_endpoints()[i].port;
    f["ducks"].push_back(d);
  }
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp);
  out << f.dump(1) << "\n";
  out.close();
  if (!out || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "duck-cluster: cannot write '%s'\n", path.c_str());
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}
} // namespace

int main(int argc, char **argv) {
  absl::SetProgramUsageMessage("run N local duckd daemons until interrupted.");
  duck::ToolFlags flags(argc, argv);

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigprocmask(SIG_BLOCK, &mask, nullptr);

  const char *bad =
      absl::GetFlag(FLAGS_ducks) < 1 || absl::GetFlag(FLAGS_ducks) > 1024
          ? "--ducks must be 1 to 1024"
      : absl::GetFlag(FLAGS_cores) < 1 ? "--cores must be at least 1"
      : absl::GetFlag(FLAGS_weights_size) <= 0
          ? "--weights-size must be above 0"
          : nullptr;
  if (bad) {
    std::fprintf(stderr, "duck-cluster: %s\n", bad);
    return 2;
  }
  duck::runtime::LocalClusterOptions o;
  o.ducks = uint32_t(absl::GetFlag(FLAGS_ducks));
  o.cores = uint32_t(absl::GetFlag(FLAGS_cores));
  o.duckd_path = absl::GetFlag(FLAGS_duckd);
  o.cache_dir = absl::GetFlag(FLAGS_cache_dir);
  o.weights_size = uint64_t(absl::GetFlag(FLAGS_weights_size));
  o.pin = absl::GetFlag(FLAGS_pin);
  o.log_dir = absl::GetFlag(FLAGS_log_dir);
  if (absl::GetFlag(FLAGS_mesh))
    o.extra_args.push_back("--mesh-port=0");
  const std::string cast = absl::GetFlag(FLAGS_cast);
  if (!cast.empty())
    o.extra_args.insert(o.extra_args.end(), {"--cast", cast});
  auto cluster = duck::runtime::LocalCluster::Start(o);
  if (!cluster.ok()) {
    std::fprintf(stderr, "duck-cluster: %s\n",
                 std::string(cluster.status().message()).c_str());
    return 1;
  }
  for (size_t i = 0; i < (*cluster)->endpoints().size(); ++i) {
    const uint16_t mesh = (*cluster)->mesh_endpoints()[i].port;
    std::printf("duck %zu: %s", i,
                (*cluster)->endpoints()[i].ToString().c_str());
    if (mesh != 0)
      std::printf(" (mesh port %u)", unsigned(mesh));
    if ((*cluster)->cast_ports()[i] != 0)
      std::printf(" (cast %s)", cast.c_str());
    std::printf("\n");
  }
  const std::string file = absl::GetFlag(FLAGS_cluster_file);
  if (!file.empty()) {
    if (!WriteClusterFile(**cluster, o.cores, cast, file)) {
      (void)(*cluster)->Stop();
      return 1;
    }
    std::printf("cluster file: %s\n", file.c_str());
  }
  std::printf("ready (Ctrl-C stops the ducks)\n");
  std::fflush(stdout);
  int sig = 0;
  sigwait(&mask, &sig);
  absl::Status s = (*cluster)->Stop();
  std::printf("stopped%s\n", s.ok() ? "" : " (some needed SIGKILL)");
  return 0;
}
