// duck-linksim: listens on one loopback port per duck and forwards every
// connection to that duck's duckd through simulated links (LinkSim): each
// duck's link and the host's shared port at a rate, plus a one-way latency.
// Prints "linksim duck <i> port <p> backend <host:port>" a duck, then
// "linksim ready"; on SIGINT/SIGTERM stops and prints each duck's bytes.
#include "duck/runtime/cluster/LinkSim.h"
#include "duck_rt/tool_flags.h"

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"

#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

ABSL_FLAG(std::string, backends, "",
          "the duckd's, host:port comma-separated (duck i is the i-th)");
ABSL_FLAG(double, host_link_gbps, 0,
          "the host's port, Gbit/s each way, shared by all ducks (0: unlimited)");
ABSL_FLAG(double, duck_link_gbps, 0,
          "each duck's link, Gbit/s each way (0: unlimited)");
ABSL_FLAG(double, latency_us, 0, "one-way latency added to every byte");
ABSL_FLAG(double, scale, 1,
          "divide both rates by this (a slower stand-in for a real cluster)");
ABSL_FLAG(int, port_base, 0, "duck i listens on port_base + i (0: any free)");
ABSL_FLAG(int64_t, queue_bytes, 4 << 20, "most bytes held each direction");

namespace {

std::string Usage() {
  return std::string(
             "N duckd's behind simulated links, like N boxes "
             "on one switch.\n\n"
             "  duck-linksim --backends 127.0.0.1:7001,127.0.0.1:7002 "
             "--host-link-gbps 25 --duck-link-gbps 2.5 --latency-us 50\n\n") +
         duck::runtime::LinkSimModelText();
}

int Run(const duck::runtime::LinkSimOptions &o, const sigset_t &mask) {
  auto sim = duck::runtime::LinkSim::Start(o);
  if (!sim.ok()) {
    std::fprintf(stderr, "duck-linksim: %s\n",
                 std::string(sim.status().message()).c_str());
    return 1;
  }
  for (size_t i = 0; i < o.backends.size(); ++i)
    std::printf("linksim duck %zu port %u backend %s\n", i,
                unsigned((*sim)->ports()[i]),
                o.backends[i].ToString().c_str());
  std::printf("linksim ready host_link_gbps %g duck_link_gbps %g "
              "latency_us %g\n",
              o.host_link_gbps, o.duck_link_gbps, o.latency_us);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&mask, &sig);
  (*sim)->Stop();
  auto st = (*sim)->stats();
  for (size_t i = 0; i < st.size(); ++i)
    std::printf("linksim stats duck %zu connections %llu to_duck_bytes %llu "
                "from_duck_bytes %llu\n",
                i, (unsigned long long)st[i].connections,
                (unsigned long long)st[i].bytes_to_duck,
                (unsigned long long)st[i].bytes_from_duck);
  std::printf("linksim stopped\n");
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  absl::SetProgramUsageMessage(Usage());
  duck::ToolFlags flags(argc, argv);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigprocmask(SIG_BLOCK, &mask, nullptr); // every thread inherits it

  duck::runtime::LinkSimOptions o;
  for (absl::string_view b :
       absl::StrSplit(absl::GetFlag(FLAGS_backends), ',', absl::SkipEmpty())) {
    auto e = duck::runtime::ParseDuckEndpoint(b);
    if (!e.ok()) {
      std::fprintf(stderr, "duck-linksim: --backends: %s\n",
                   std::string(e.status().message()).c_str());
      return 2;
    }
    o.backends.push_back(*e);
  }
  const double scale = absl::GetFlag(FLAGS_scale);
  if (o.backends.empty() || !(scale > 0)) {
    std::fprintf(stderr, "duck-linksim: needs --backends and --scale > 0 "
                         "(--help)\n");
    return 2;
  }
  o.host_link_gbps = absl::GetFlag(FLAGS_host_link_gbps) / scale;
  o.duck_link_gbps = absl::GetFlag(FLAGS_duck_link_gbps) / scale;
  o.latency_us = absl::GetFlag(FLAGS_latency_us);
  o.port_base = uint16_t(absl::GetFlag(FLAGS_port_base));
  o.queue_bytes = size_t(absl::GetFlag(FLAGS_queue_bytes));
  return Run(o, mask);
}
