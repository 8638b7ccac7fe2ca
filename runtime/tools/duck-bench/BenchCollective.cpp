//===- BenchCollective.cpp - duck-bench collective: the ducks' mesh
//--------===//
//
// The collectives a token takes with the residual stream on the ducks
// (duckc --residual ducks, modelled only), run as the cost model lists
// them (its stats' mesh_schedule) by N ducks' meshes (duck_rt/peer_mesh.h,
// one thread a duck) behind the link simulator, which routes every
// duck-to-duck byte over both ducks' links. Three kinds of run alternate:
// straight over loopback (what the mesh's own calls cost on this box),
// through the simulator with unlimited links (the baseline) and with the
// given links (shaped). measured_mesh_ms = shaped - baseline, beside the
// cost model's mesh_ms_per_token (wire and latency) for the same links.
//
//===----------------------------------------------------------------------===//
#include "BenchArgs.h"
#include "BenchSubcommands.h"
#include "Common.h"

#include "duck/runtime/cluster/LinkSim.h"
#include "duck/runtime/cluster/LocalCluster.h"
#include "duck_rt/peer_mesh.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <arpa/inet.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <netinet/in.h>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

using duck::bench::ArgValue;
using duck::bench::parseReal;
using duck::bench::parseWhole;
using duck::bench::ShellQuote;
using duck::duckd::PeerMesh;
using duck::duckd::PeerTransport;
using duck::duckd::PeerWire;
using duck::runtime::LinkSim;
using duck::runtime::LinkSimOptions;

struct CollectiveBenchOptions {
  uint32_t ducks = 4;
  double duck_gbps = 2.5, latency_us = 50, scale = 1;
  uint32_t tokens = 6, repeat = 3, groups = 1;
  std::string wire = "bf16"; // duckc's --wire-activations / --wire-results
  std::string transport = "tcp";
  double spin_us = 0;
  std::string model = DUCK_SOURCE_DIR "/models/DeepSeek-V3.2";
  bool json = false;
};

void PrintUsage(FILE *out) {
  std::fprintf(
      out,
      "usage: duck-bench collective [--ducks N (4)] [--duck-link-gbps Y "
      "(2.5)]\n"
      "  [--latency-us Z (50, one way)] [--scale S (1: the rate divided by "
      "S,\n"
      "  in the simulator and the cost model alike)] [--tokens T (6)]\n"
      "  [--repeat R (3: runs of each kind, alternating; medians)]\n"
      "  [--groups G (1: one direct exchange a collective; G dividing N:\n"
      "  two, within groups of N/G ducks, then among G)]\n"
      "  [--wire f32|bf16|q8 (bf16)] [--transport tcp|udp (tcp)] [--spin-us "
      "S]\n"
      "  [--model DIR (models/DeepSeek-V3.2: only its config.json is read)]\n"
      "  [--json]\n\n"
      "The collectives of a token with the residual stream on the ducks\n"
      "(duckc compile --residual ducks --dry-run, MODELLED ONLY: no duck runs\n"
      "a layer's norms and router yet), in the cost model's order and sizes\n"
      "(reduce-scatters of the attention's and the FFN's sums, all-gathers\n"
      "of the residual, the router's logits and q_a), run by N ducks' meshes\n"
      "(one thread a duck, one TCP connection a pair) over loopback, then\n"
      "behind duck-linksim with unlimited links (baseline) and with the\n"
      "given ones (shaped), alternating. measured_mesh_ms = shaped -\n"
      "baseline a token; predicted_mesh_ms is the cost model's (the\n"
      "busiest link direction's bytes and the one-way latency, each\n"
      "collective). mesh_call_us is the loopback run's time a collective:\n"
      "what the mesh's calls cost on this box (the cluster file's\n"
      "mesh_call_us), and mesh_cpu_us_per_collective the CPU time a duck's\n"
      "thread took for one (a bound from the machine's contention: runs at\n"
      "several duck counts give the cost of each message,\n"
      "mesh_message_us).\n\n"
      "--transport udp: the collectives as UDP datagrams (one sendmmsg to\n"
      "every peer, recvmmsg by the batch; duck_rt/peer_mesh.h): over\n"
      "loopback beside tcp (what a collective's calls cost each way: udp_*\n"
      "and tcp_* keys, and their ratio), then behind the simulator's\n"
      "datagram relays unlimited and shaped, all alternating; the model\n"
      "counts the datagrams' headers (mesh_transport udp). --spin-us S: a\n"
      "udp collective looks for its datagrams S us before it sleeps (what a\n"
      "duck with a core to itself would do; meaningful here only with no\n"
      "more ducks than cores).\n\n%s",
      duck::runtime::LinkSimModelText());
}

bool Parse(int argc, char **argv, CollectiveBenchOptions *o) {
  bool badNumber = false; // said on stderr by parseWhole / parseReal
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char *v = nullptr;
    if (a == "--json")
      o->json = true;
    else if ((v = ArgValue(argc, argv, &i, "--ducks")))
      o->ducks = uint32_t(parseWhole("--ducks", v, &badNumber));
    else if ((v = ArgValue(argc, argv, &i, "--duck-link-gbps")))
      o->duck_gbps = parseReal("--duck-link-gbps", v, &badNumber);
    else if ((v = ArgValue(argc, argv, &i, "--latency-us")))
      o->latency_us = parseReal("--latency-us", v, &badNumber);
    else if ((v = ArgValue(argc, argv, &i, "--scale")))
      o->scale = parseReal("--scale", v, &badNumber);
    else if ((v = ArgValue(argc, argv, &i, "--tokens")))
      o->tokens = uint32_t(parseWhole("--tokens", v, &badNumber));
    else if ((v = ArgValue(argc, argv, &i, "--repeat")))
      o->repeat = uint32_t(parseWhole("--repeat", v, &badNumber));
    else if ((v = ArgValue(argc, argv, &i, "--groups")))
      o->groups = uint32_t(parseWhole("--groups", v, &badNumber));
    else if ((v = ArgValue(argc, argv, &i, "--wire")))
      o->wire = v;
    else if ((v = ArgValue(argc, argv, &i, "--transport")))
      o->transport = v;
    else if ((v = ArgValue(argc, argv, &i, "--spin-us")))
      o->spin_us = parseReal("--spin-us", v, &badNumber);
    else if ((v = ArgValue(argc, argv, &i, "--model")))
      o->model = v;
    else {
      std::fprintf(stderr,
                   "duck-bench collective: unknown or incomplete "
                   "argument '%s'\n",
                   argv[i]);
      return false;
    }
  }
  if (badNumber)
    return false;
  if (o->wire != "f32" && o->wire != "bf16" && o->wire != "q8") {
    std::fprintf(stderr,
                 "duck-bench collective: --wire must be f32, bf16 or q8\n");
    return false;
  }
  if (o->transport != "tcp" && o->transport != "udp") {
    std::fprintf(stderr,
                 "duck-bench collective: --transport must be tcp or udp\n");
    return false;
  }
  if (o->ducks < 2 || o->ducks > 32 || o->tokens < 2 || o->repeat < 1 ||
      o->repeat > 20 || !(o->scale > 0) || !(o->duck_gbps > 0) ||
      o->latency_us < 0 || o->groups < 1 || o->ducks % o->groups != 0) {
    std::fprintf(stderr, "duck-bench collective: --ducks must be 2 to 32, "
                         "--tokens at least 2, --repeat 1 to 20, --scale and "
                         "--duck-link-gbps positive, --latency-us not "
                         "negative, --groups a divisor of --ducks\n");
    return false;
  }
  return true;
}

/// One collective of the cost model's schedule.
struct Step {
  bool reduce_scatter = false;
  size_t values = 0;
  PeerWire wire = PeerWire::f32;
};

/// duckc's stats for the model at N ducks with the residual on the ducks,
/// over links of `gbps` and `latency_us`; empty on failure (said).
nlohmann::json CostModelStats(const CollectiveBenchOptions &o,
                              const std::string &dir, double gbps) {
  nlohmann::json c;
  c["ducks"] = nlohmann::json::array();
  for (uint32_t i = 0; i < o.ducks; ++i)
    c["ducks"].push_back({{"host", "127.0.0.1"},
                          {"port", 7000 + i},
                          {"cores", 4},
                          {"memory_gib", 65536}});
  c["duck_link_gbps"] = gbps;
  c["latency_us"] = o.latency_us;
  c["mesh_groups"] = o.groups;
  c["mesh_transport"] = o.transport;
  const std::string file = dir + "/cluster.json", out = dir + "/stats.json";
  std::ofstream(file) << c.dump(1) << "\n";
  std::ostringstream cc;
  cc << ShellQuote(duck::runtime::ExecutableDir() + "/duckc") << " compile "
     << ShellQuote(o.model) << " --cluster " << ShellQuote(file) << " --tp "
     << o.ducks << " --dry-run --emit=stats --residual ducks --in-proj ducks"
     << " --q-proj ducks --o-proj ducks --mla-absorb ducks"
     << (o.wire != "f32"
             ? " --wire-activations " + o.wire + " --wire-results " + o.wire
             : std::string())
     << " > " << ShellQuote(out);
  if (std::system(cc.str().c_str()) != 0) {
    std::fprintf(stderr, "duck-bench collective: duckc failed: %s\n",
                 cc.str().c_str());
    return nullptr;
  }
  std::ifstream f(out);
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.contains("mesh_schedule")) {
    std::fprintf(stderr, "duck-bench collective: no mesh_schedule in %s\n",
                 out.c_str());
    return nullptr;
  }
  return j;
}

std::vector<Step> ScheduleOf(const nlohmann::json &stats) {
  std::vector<Step> s;
  for (const nlohmann::json &m : stats["mesh_schedule"])
    s.push_back({m["kind"] == "reduce_scatter", m["values"].get<size_t>(),
                 m["bytes_per_value"].get<double>() == 2 ? PeerWire::bf16
                 : m["bytes_per_value"].get<double>() == 1.0625
                     ? PeerWire::q8
                     : PeerWire::f32});
  return s;
}

/// A socket of `type` bound on loopback at a free port (a stream one
/// listening); -1 on failure.
int BindLoopback(int type, uint16_t *port) {
  int fd = socket(AF_INET, type | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (sockaddr *)&a, sizeof a) != 0 ||
      (type == SOCK_STREAM && listen(fd, 64) != 0) ||
      getsockname(fd, (sockaddr *)&a, &len) != 0) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

/// One token's collectives on one duck's mesh.
absl::Status RunToken(PeerMesh &m, const std::vector<Step> &schedule,
                      std::vector<float> &a, std::vector<float> &b) {
  const uint32_t n = m.ducks(), r = m.OwnedSlice();
  for (const Step &s : schedule) {
    const size_t lo = duck::duckd::PeerSliceBegin(s.values, n, r);
    const size_t len = duck::duckd::PeerSliceBegin(s.values, n, r + 1) - lo;
    absl::Status st =
        s.reduce_scatter
            ? m.ReduceScatter(absl::MakeConstSpan(a.data(), s.values), s.wire,
                              absl::MakeSpan(b.data(), len))
            : m.AllGather(absl::MakeConstSpan(b.data(), len), s.wire,
                          absl::MakeSpan(a.data(), s.values));
    if (!st.ok())
      return st;
  }
  return absl::OkStatus();
}

/// This thread's CPU time (user and system), microseconds.
double ThreadCpuUs() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return 1e6 * double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

/// A run: the ducks' per-token times (rank 0's, ms), what rank 0 sent, and
/// the CPU time the ducks' threads took a token after the first (us, the
/// mean over ducks).
struct Run {
  std::vector<double> token_ms;
  uint64_t bytes_sent = 0, datagrams_resent = 0;
  double cpu_us_per_token = 0;
  std::string error;
  double Median() const {
    std::vector<double> t(token_ms.begin() + 1, token_ms.end()); // warm-up
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    return t[t.size() / 2];
  }
};

/// N ducks' meshes running the schedule `tokens` times: straight over
/// loopback (`sim` null) or through the simulator.
Run RunMeshes(const CollectiveBenchOptions &o, const std::vector<Step> &sched,
              const LinkSimOptions *sim_options,
              PeerTransport transport = PeerTransport::tcp) {
  Run run;
  std::vector<int> listeners(o.ducks, -1);
  std::vector<duck::runtime::DuckEndpoint> endpoints(o.ducks);
  for (uint32_t i = 0; i < o.ducks; ++i) {
    listeners[i] = BindLoopback(SOCK_STREAM, &endpoints[i].port);
    endpoints[i].host = "127.0.0.1";
  }
  // Over udp behind the simulator: each duck's datagram socket bound
  // first, so that the simulator's relays know where to deliver.
  const bool relay = sim_options && transport == PeerTransport::udp;
  std::vector<int> udp(o.ducks, -1);
  std::vector<uint16_t> udp_ports(o.ducks, 0);
  for (uint32_t i = 0; relay && i < o.ducks; ++i)
    udp[i] = BindLoopback(SOCK_DGRAM, &udp_ports[i]); // the mesh owns it
  std::unique_ptr<LinkSim> sim;
  if (sim_options) {
    LinkSimOptions lo = *sim_options;
    lo.backends = endpoints; // no host traffic in this bench
    lo.peer_backends = endpoints;
    if (relay)
      lo.peer_datagram_ports = udp_ports;
    auto s = LinkSim::Start(lo);
    if (!s.ok()) {
      run.error = std::string(s.status().message());
      return run;
    }
    sim = std::move(*s);
  }
  std::vector<std::string> errors(o.ducks);
  std::vector<double> cpu(o.ducks, 0);
  std::vector<std::thread> threads;
  std::mutex resent_mu;
  const size_t widest = 8192 * 2;
  for (uint32_t r = 0; r < o.ducks; ++r)
    threads.emplace_back([&, r] {
      duck::duckd::PeerMeshOptions mo;
      mo.rank = r;
      mo.ducks = o.ducks;
      mo.session = 1;
      mo.groups = o.groups;
      mo.listen_fd = listeners[r];
      mo.transport = transport;
      mo.spin = absl::Microseconds(o.spin_us);
      if (relay) {
        mo.udp_fd = udp[r];
        mo.datagram_peers.resize(o.ducks);
        for (uint32_t j = 0; j < o.ducks; ++j)
          mo.datagram_peers[j].port = sim->peer_datagram_relays()[r][j];
      }
      mo.peers.resize(o.ducks);
      for (uint32_t j = r + 1; j < o.ducks; ++j)
        mo.peers[j].port = sim ? sim->peer_ports()[r][j] : endpoints[j].port;
      auto m = PeerMesh::Connect(mo);
      if (!m.ok()) {
        errors[r] = std::string(m.status().message());
        return;
      }
      std::vector<float> a(widest, 0.25f + float(r)), b(widest, 0.5f);
      double cpu0 = 0;
      for (uint32_t t = 0; t < o.tokens; ++t) {
        if (t == 1) // after the warm-up token
          cpu0 = ThreadCpuUs();
        const auto t0 = std::chrono::steady_clock::now();
        if (absl::Status s = RunToken(**m, sched, a, b); !s.ok()) {
          errors[r] = std::string(s.message());
          return;
        }
        if (r == 0)
          run.token_ms.push_back(std::chrono::duration<double, std::milli>(
                                     std::chrono::steady_clock::now() - t0)
                                     .count());
      }
      cpu[r] = (ThreadCpuUs() - cpu0) / double(o.tokens - 1);
      if (r == 0)
        run.bytes_sent = (*m)->bytes_sent() / o.tokens;
      std::lock_guard<std::mutex> lock(resent_mu);
      run.datagrams_resent += (*m)->datagrams_resent();
    });
  for (std::thread &t : threads)
    t.join();
  if (sim)
    sim->Stop();
  for (int fd : listeners)
    if (fd >= 0)
      close(fd);
  for (const std::string &e : errors)
    if (!e.empty() && run.error.empty())
      run.error = e;
  for (double c : cpu)
    run.cpu_us_per_token += c / double(o.ducks);
  return run;
}

double MedianOf(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

nlohmann::json Results(const CollectiveBenchOptions &o,
                       const nlohmann::json &stats,
                       const std::vector<double> &direct,
                       const std::vector<double> &base,
                       const std::vector<double> &shaped, uint64_t bytes,
                       double direct_cpu_us) {
  const double n = stats["collectives_per_token"].get<double>();
  nlohmann::json r;
  r["ducks"] = o.ducks;
  r["duck_link_gbps"] = o.duck_gbps;
  r["scale"] = o.scale;
  r["simulated_duck_link_gbps"] = o.duck_gbps / o.scale;
  r["latency_us"] = o.latency_us;
  r["wire"] = o.wire;
  r["groups"] = o.groups;
  r["collectives_per_token"] = n;
  r["measured_direct_ms"] = MedianOf(direct);
  r["measured_baseline_ms"] = MedianOf(base);
  r["measured_shaped_ms"] = MedianOf(shaped);
  r["measured_mesh_ms"] = MedianOf(shaped) - MedianOf(base);
  r["mesh_call_us"] = 1e3 * MedianOf(direct) / n;
  r["mesh_cpu_us_per_collective"] = direct_cpu_us / n;
  r["predicted_mesh_ms"] = stats["mesh_ms_per_token"];
  r["predicted_mesh_latency_ms"] = stats["mesh_latency_ms_per_token"];
  r["mesh_ratio"] = r["measured_mesh_ms"].get<double>() /
                    stats["mesh_ms_per_token"].get<double>();
  r["measured_bytes_per_duck"] = bytes;
  r["predicted_bytes_per_duck"] = stats["mesh_bytes_per_duck_per_token"];
  return r;
}

void PrintText(const nlohmann::json &r) {
  auto d = [&](const char *k) { return r[k].get<double>(); };
  std::printf("duck-bench collective: %d ducks, %.3g Gb/s a duck (scaled /%g: "
              "%.3g), %g us one way, %s; %.0f collectives a token%s\n",
              r["ducks"].get<int>(), d("duck_link_gbps"), d("scale"),
              d("simulated_duck_link_gbps"), d("latency_us"),
              r["wire"].get<std::string>().c_str(), d("collectives_per_token"),
              r["groups"].get<int>() > 1
                  ? (", two levels over " +
                     std::to_string(r["groups"].get<int>()) + " groups")
                        .c_str()
                  : "");
  std::printf("measured: loopback %.3f ms a token (%.1f us a collective, "
              "%.1f us of a duck's CPU); simulator unlimited %.3f ms, shaped "
              "%.3f ms: mesh %.3f ms\n",
              d("measured_direct_ms"), d("mesh_call_us"),
              d("mesh_cpu_us_per_collective"), d("measured_baseline_ms"),
              d("measured_shaped_ms"), d("measured_mesh_ms"));
  std::printf("predicted: mesh %.3f ms a token (latency %.3f); measured / "
              "predicted %.2f\n",
              d("predicted_mesh_ms"), d("predicted_mesh_latency_ms"),
              d("mesh_ratio"));
  std::printf("bytes a token: duck 0 sent %.0f, the model's busiest duck "
              "%.0f\n",
              d("measured_bytes_per_duck"), d("predicted_bytes_per_duck"));
}

/// --transport udp's samples: per repeat, tcp and udp over loopback, then
/// udp behind the simulator unlimited and shaped.
struct UdpSamples {
  std::vector<double> ms[2], cpu[2]; // loopback: tcp, udp
  std::vector<double> base, shaped;  // udp behind the simulator
  uint64_t bytes = 0, resent = 0;
};

bool RunUdpRounds(const CollectiveBenchOptions &o,
                  const std::vector<Step> &sched, UdpSamples *s) {
  LinkSimOptions unlimited, shaped;
  shaped.duck_link_gbps = o.duck_gbps / o.scale;
  shaped.latency_us = o.latency_us;
  for (uint32_t i = 0; i < o.repeat; ++i)
    for (int k = 0; k < 4; ++k) {
      const LinkSimOptions *sim =
          k == 2 ? &unlimited : (k == 3 ? &shaped : nullptr);
      const Run run =
          RunMeshes(o, sched, sim, k ? PeerTransport::udp : PeerTransport::tcp);
      if (!run.error.empty()) {
        std::fprintf(stderr, "duck-bench collective: %s\n", run.error.c_str());
        return false;
      }
      if (k < 2) {
        s->ms[k].push_back(run.Median());
        s->cpu[k].push_back(run.cpu_us_per_token);
      } else {
        (k == 2 ? s->base : s->shaped).push_back(run.Median());
      }
      if (k > 0) {
        s->bytes = run.bytes_sent;
        s->resent += run.datagrams_resent;
      }
    }
  return true;
}

nlohmann::json UdpResults(const CollectiveBenchOptions &o,
                          const nlohmann::json &stats, const UdpSamples &s) {
  const double n = stats["collectives_per_token"].get<double>();
  nlohmann::json r;
  r["ducks"] = o.ducks;
  r["duck_link_gbps"] = o.duck_gbps;
  r["scale"] = o.scale;
  r["latency_us"] = o.latency_us;
  r["wire"] = o.wire;
  r["groups"] = o.groups;
  r["transport"] = "udp";
  r["spin_us"] = o.spin_us;
  r["collectives_per_token"] = n;
  for (int u = 0; u < 2; ++u) {
    const std::string k = u ? "udp_" : "tcp_";
    r[k + "direct_ms"] = MedianOf(s.ms[u]);
    r[k + "mesh_call_us"] = 1e3 * MedianOf(s.ms[u]) / n;
    r[k + "cpu_us_per_collective"] = MedianOf(s.cpu[u]) / n;
  }
  r["udp_to_tcp_cpu"] = MedianOf(s.cpu[1]) / MedianOf(s.cpu[0]);
  r["measured_baseline_ms"] = MedianOf(s.base);
  r["measured_shaped_ms"] = MedianOf(s.shaped);
  r["measured_mesh_ms"] = MedianOf(s.shaped) - MedianOf(s.base);
  r["predicted_mesh_ms"] = stats["mesh_ms_per_token"];
  r["mesh_ratio"] = r["measured_mesh_ms"].get<double>() /
                    stats["mesh_ms_per_token"].get<double>();
  r["measured_bytes_per_duck"] = s.bytes;
  r["predicted_bytes_per_duck"] = stats["mesh_bytes_per_duck_per_token"];
  r["datagrams_resent"] = s.resent;
  return r;
}

void PrintUdp(const CollectiveBenchOptions &o, const nlohmann::json &r) {
  auto d = [&](const std::string &k) { return r[k].get<double>(); };
  std::printf("duck-bench collective: %u ducks, udp beside tcp, %s; %.0f "
              "collectives a token%s\n",
              o.ducks, o.wire.c_str(), d("collectives_per_token"),
              o.groups > 1 ? (", two levels over " + std::to_string(o.groups) +
                              " groups")
                                 .c_str()
                           : "");
  for (const char *t : {"udp", "tcp"})
    std::printf("loopback %s: %.3f ms a token (%.1f us a collective, %.1f us "
                "of a duck's CPU)\n",
                t, d(std::string(t) + "_direct_ms"),
                d(std::string(t) + "_mesh_call_us"),
                d(std::string(t) + "_cpu_us_per_collective"));
  std::printf("udp behind the simulator (%.3g Gb/s a duck scaled /%g, %g us "
              "one way): unlimited %.3f ms, shaped %.3f ms: mesh %.3f ms; "
              "predicted %.3f ms; measured / predicted %.2f\n",
              o.duck_gbps, o.scale, o.latency_us, d("measured_baseline_ms"),
              d("measured_shaped_ms"), d("measured_mesh_ms"),
              d("predicted_mesh_ms"), d("mesh_ratio"));
  std::printf("udp / tcp CPU a collective: %.2f; bytes a token: duck 0 sent "
              "%.0f (datagrams, headers included), the model's busiest duck "
              "%.0f; datagrams resent %.0f\n",
              d("udp_to_tcp_cpu"), d("measured_bytes_per_duck"),
              d("predicted_bytes_per_duck"), d("datagrams_resent"));
}

/// --transport udp: tcp and udp over loopback (what a collective's calls
/// cost each way) and udp behind the simulator (its wire term).
int RunTransports(const CollectiveBenchOptions &o, const nlohmann::json &stats,
                  const std::vector<Step> &sched) {
  UdpSamples s;
  if (!RunUdpRounds(o, sched, &s))
    return 1;
  const nlohmann::json r = UdpResults(o, stats, s);
  if (o.json)
    std::printf("%s\n", r.dump(1).c_str());
  else
    PrintUdp(o, r);
  return 0;
}

int RunBench(const CollectiveBenchOptions &o, const std::string &dir) {
  const nlohmann::json stats = CostModelStats(o, dir, o.duck_gbps / o.scale);
  if (stats.is_null())
    return 1;
  const std::vector<Step> sched = ScheduleOf(stats);
  if (o.transport == "udp")
    return RunTransports(o, stats, sched);
  LinkSimOptions unlimited, shaped;
  shaped.duck_link_gbps = o.duck_gbps / o.scale;
  shaped.latency_us = o.latency_us;
  std::vector<double> direct, base, shape, direct_cpu;
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < o.repeat; ++i) {
    for (auto [opts, out] :
         {std::pair<const LinkSimOptions *, std::vector<double> *>{nullptr,
                                                                   &direct},
          {&unlimited, &base},
          {&shaped, &shape}}) {
      const Run run = RunMeshes(o, sched, opts);
      if (!run.error.empty()) {
        std::fprintf(stderr, "duck-bench collective: %s\n", run.error.c_str());
        return 1;
      }
      out->push_back(run.Median());
      if (!opts)
        direct_cpu.push_back(run.cpu_us_per_token);
      bytes = run.bytes_sent;
    }
  }
  const nlohmann::json r =
      Results(o, stats, direct, base, shape, bytes, MedianOf(direct_cpu));
  if (o.json)
    std::printf("%s\n", r.dump(1).c_str());
  else
    PrintText(r);
  return 0;
}

} // namespace

int duckBenchCollective(int argc, char **argv) {
  CollectiveBenchOptions o;
  if (argc > 1 &&
      (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
    PrintUsage(stdout);
    return 0;
  }
  if (!Parse(argc, argv, &o)) {
    PrintUsage(stderr);
    return 2;
  }
  char tmpl[] = "/tmp/duck-bench-collective-XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("duck-bench collective: mkdtemp");
    return 1;
  }
  const int rc = RunBench(o, tmpl);
  std::system(("rm -rf " + ShellQuote(tmpl)).c_str());
  return rc;
}
