//===- BenchCluster.cpp - duck-bench cluster: TPOT over simulated links ---===//
//
// N local duckd's behind the link simulator (cluster/LinkSim), a
// DeepSeek-V3.2-shaped checkpoint with the real hidden size (7168, so a
// step's activations on the wire are the real model's) and tiny everything
// else; duckrun decodes a fixed number of tokens twice, through the
// simulator with unlimited links (the baseline) and with the given links,
// and the cost model (duckc compile --dry-run --emit=stats) predicts the
// same cluster file. The measured network part is the shaped run's TPOT
// less the baseline's (the same plan, ducks and simulator, only the links'
// rates and latency differ).
//
//===----------------------------------------------------------------------===//
#include "BenchArgs.h"
#include "BenchSubcommands.h"
#include "Common.h"

#include "duck/runtime/cluster/LinkSim.h"
#include "duck/runtime/cluster/LocalCluster.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <arpa/inet.h>
#include <chrono>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using duck::bench::ArgValue;
using duck::bench::parseReal;
using duck::bench::parseWhole;
using duck::bench::ShellQuote;
using duck::runtime::LinkSim;
using duck::runtime::LinkSimOptions;

struct ClusterBenchOptions {
  uint32_t ducks = 4;
  double host_gbps = 25, duck_gbps = 2.5, latency_us = 50, scale = 1;
  uint32_t layers = 61, tokens = 16, repeat = 1;
  /// Where the attention's projections run: "host", "ducks" (query and
  /// output projections), "absorbed" (those and kv_b_proj by heads) or
  /// "all" (absorbed, and the input projections on the ducks too: the
  /// issue-32 plan's places).
  std::string attention = "host";
  /// The wire's activations and answers: "f32", "bf16" or "q8" (duckc's
  /// --wire-activations and --wire-results both).
  std::string wire = "f32";
  /// "unicast" or "multicast" (duckc --fanout): with multicast the ducks
  /// get cast sockets and the simulator relays the host's datagrams.
  std::string fanout = "unicast";
  /// duckc --stage-shared: the MoE steps' shared expert sent before the
  /// host routes (on) or each step whole (off).
  std::string stage_shared = "off";
  /// Routed experts (0: as many as ducks): 256 gives the host
  /// DeepSeek-V3.2's router (256 x 7168 bf16, 3.67 MB a layer).
  uint32_t experts = 0;
  /// Measure the ducks first (duck-measure-cluster through the unlimited
  /// simulator) and give the cost model their step overhead and the host's
  /// cost a frame, so that its dispatch term can be checked.
  bool measure_dispatch = false;
  bool json = false;
  std::string work_dir; // default: a temporary directory, removed after
  bool keep = false;
};

void PrintUsage(FILE *out) {
  std::fprintf(
      out,
      "usage: duck-bench cluster [--ducks N (4)] [--host-link-gbps X (25)]\n"
      "  [--duck-link-gbps Y (2.5)] [--latency-us Z (50, one way)]\n"
      "  [--scale S (1: both rates divided by S, in the simulator and the\n"
      "  cost model alike)] [--layers L (61)] [--tokens T (16)]\n"
      "  [--repeat R (1: runs of each kind, alternating; the median TPOT's\n"
      "  run is reported)] [--json]\n"
      "  [--attention host|ducks|absorbed|all (host)] [--wire f32|bf16|q8 "
      "(f32:\n"
      "  duckc's --wire-activations and --wire-results)] [--work-dir D "
      "(kept)]\n"
      "  [--stage-shared on|off (off: duckc's --stage-shared)]\n"
      "  [--experts E (N: routed experts; 256: DeepSeek-V3.2's router)]\n"
      "  [--fanout unicast|multicast (unicast: duckc's --fanout; multicast:\n"
      "  every duck a cast socket, the simulator's cast relay a switch's\n"
      "  multicast)] [--measure-dispatch]\n\n"
      "A DeepSeek-V3.2-shaped checkpoint (hidden 7168, L layers, one dense;\n"
      "4 heads, q/kv LoRA 64, N routed experts of intermediate 32, top 2,\n"
      "a shared one, vocabulary 512), compiled for N ducks (whole experts a\n"
      "duck; --attention ducks: the query and output projections on the\n"
      "ducks too, absorbed: with kv_b_proj by heads, duckc --mla-absorb\n"
      "ducks, all: the input projections too, with q/kv LoRA 1536 / 512;\n"
      "then max(4, N) heads),\n"
      "decoded by duckrun on N local duckd's\n"
      "behind duck-linksim:\n"
      "once with unlimited links (baseline), once with the given ones.\n"
      "A run's TPOT is the median of its tokens' times (the mean beside\n"
      "it as *_tpot_mean_ms).\n"
      "measured_network_ms = shaped TPOT - baseline TPOT; the prediction\n"
      "is duckc's for the same cluster file (its network term counts the\n"
      "one-way latency twice a step). A 64-byte ping through the simulator,\n"
      "shaped less unlimited, measures the latency it really adds (its\n"
      "timed wake-ups included): the prediction at that latency is printed\n"
      "beside the one at the setting.\n"
      "--measure-dispatch: before compiling, duck-measure-cluster measures\n"
      "the ducks through the simulator with unlimited links (a step's\n"
      "overhead at one duck, the host's CPU for each more duck's frame);\n"
      "the cost model's dispatch term then uses them, and is printed beside\n"
      "the baseline's dispatch gap (the host's wait beyond the ducks'\n"
      "kernels with unlimited links). Local ducks share this machine's\n"
      "cores: with more ducks than cores they queue for them, which the\n"
      "term (ducks on boxes of their own) does not count.\n\n%s",
      duck::runtime::LinkSimModelText());
}

/// The options' values each in their range; a bad one is named on stderr.
bool CheckOptions(const ClusterBenchOptions &o) {
  const char *bad = nullptr;
  if (o.attention != "host" && o.attention != "ducks" &&
      o.attention != "absorbed" && o.attention != "all")
    bad = "--attention must be host, ducks, absorbed or all";
  else if (o.wire != "f32" && o.wire != "bf16" && o.wire != "q8")
    bad = "--wire must be f32, bf16 or q8";
  else if (o.fanout != "unicast" && o.fanout != "multicast")
    bad = "--fanout must be unicast or multicast";
  else if (o.stage_shared != "on" && o.stage_shared != "off")
    bad = "--stage-shared must be on or off";
  else if (o.experts > 1024)
    bad = "--experts must be at most 1024";
  else if (o.ducks < 1 || o.ducks > 64)
    bad = "--ducks must be 1 to 64";
  else if (o.layers < 2 || o.tokens < 2)
    bad = "--layers and --tokens must be at least 2";
  else if (o.repeat < 1 || o.repeat > 20)
    bad = "--repeat must be 1 to 20";
  else if (!(o.scale > 0 && o.host_gbps > 0 && o.duck_gbps > 0))
    bad = "--scale, --host-link-gbps and --duck-link-gbps must be above 0";
  else if (!(o.latency_us >= 0))
    bad = "--latency-us must not be negative";
  if (bad)
    std::fprintf(stderr, "duck-bench cluster: %s\n", bad);
  return bad == nullptr;
}

bool Parse(int argc, char **argv, ClusterBenchOptions *o) {
  bool badNumber = false; // said on stderr by parseWhole / parseReal
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char *v = nullptr;
    if (a == "--json")
      o->json = true;
    else if (a == "--measure-dispatch")
      o->measure_dispatch = true;
    else if ((v = ArgValue(argc, argv, &i, "--ducks")))
      o->ducks = uint32_t(parseWhole("--ducks", v, &badNumber));
    else if ((v = ArgValue(argc, argv, &i, "--host-link-gbps")))
      o->host_gbps = parseReal("--host-link-gbps", v, &badNumber);
    else if ((v = ArgValue(argc, argv, &i, "--duck-link-gbps")))
      o->duck_gbps = parseReal("--duck-link-gbps", v, &badNumber);
    else if ((v = ArgValue(argc, argv, &i, "--latency-us")))
      o->latency_us = parseReal("--latency-us", v, &badNumber);
    else if ((v = ArgValue(argc, argv, &i, "--scale")))
      o->scale = parseReal("--scale", v, &badNumber);
    else if ((v = ArgValue(argc, argv, &i, "--layers")))
      o->layers = uint32_t(parseWhole("--layers", v, &badNumber));
    else if ((v = ArgValue(argc, argv, &i, "--tokens")))
      o->tokens = uint32_t(parseWhole("--tokens", v, &badNumber));
    else if ((v = ArgValue(argc, argv, &i, "--repeat")))
      o->repeat = uint32_t(parseWhole("--repeat", v, &badNumber));
    else if ((v = ArgValue(argc, argv, &i, "--attention")))
      o->attention = v;
    else if ((v = ArgValue(argc, argv, &i, "--wire")))
      o->wire = v;
    else if ((v = ArgValue(argc, argv, &i, "--fanout")))
      o->fanout = v;
    else if ((v = ArgValue(argc, argv, &i, "--stage-shared")))
      o->stage_shared = v;
    else if ((v = ArgValue(argc, argv, &i, "--experts")))
      o->experts = uint32_t(parseWhole("--experts", v, &badNumber));
    else if ((v = ArgValue(argc, argv, &i, "--work-dir"))) {
      o->work_dir = v;
      o->keep = true;
    } else {
      std::fprintf(stderr,
                   "duck-bench cluster: unknown or incomplete argument '%s'\n",
                   argv[i]);
      return false;
    }
  }
  if (badNumber)
    return false;
  return CheckOptions(*o);
}


/// Runs a command line; false (after saying which) when it fails.
bool Shell(const std::string &cmd) {
  const int rc = std::system(cmd.c_str());
  if (rc != 0)
    std::fprintf(stderr, "duck-bench cluster: failed (%d): %s\n", rc,
                 cmd.c_str());
  return rc == 0;
}

/// duckc's flags for the plan (--tp, the strategy, the attention's).
std::string CompileFlags(const ClusterBenchOptions &o) {
  std::string f = " --tp " + std::to_string(o.ducks) + " --strategy experts";
  if (o.attention != "host")
    f += " --q-proj ducks --o-proj ducks";
  if (o.attention == "all")
    f += " --in-proj ducks";
  if (o.attention == "absorbed" || o.attention == "all")
    f += " --mla-absorb ducks";
  if (o.wire != "f32")
    f += " --wire-activations " + o.wire + " --wire-results " + o.wire;
  if (o.fanout != "unicast")
    f += " --fanout " + o.fanout;
  f += " --stage-shared " + o.stage_shared;
  return f;
}

bool MakeAndCompile(const ClusterBenchOptions &o, const std::string &bin,
                    const std::string &dir) {
  const uint32_t inter = std::max<uint32_t>(256, 32 * o.ducks);
  // A kept --work-dir is made again from scratch (neither tool overwrites).
  if (!Shell("rm -rf " + ShellQuote(dir + "/model") + " " +
             ShellQuote(dir + "/plan")))
    return false;
  std::ostringstream mk;
  mk << ShellQuote(bin + "/duck-mkmodel") << " -q --preset tiny-deepseek"
     << " --family deepseek_v32 --hidden 7168 --layers " << o.layers
     << " --dense-layers 1 --heads "
     << (o.attention == "host" ? 4u : std::max<uint32_t>(4, o.ducks))
     << " --intermediate " << inter << " --moe-intermediate 32 --experts "
     << std::max<uint32_t>(2, o.experts ? o.experts : o.ducks)
     << " --top-k 2 --shared-experts 1 --n-group 1 --topk-group 1"
     // --attention all: DeepSeek-V3.2's own LoRA ranks, so that the input
     // projections' rows (q_a and kv_a) split over the ducks.
     << (o.attention == "all" ? " --q-lora 1536 --kv-lora 512"
                              : " --q-lora 64 --kv-lora 64")
     << " --qk-nope 32 --qk-rope 16 --v-head 32"
     << " --index-heads 2 --index-head-dim 32 --index-topk 64 --vocab 512"
     << " -o " << ShellQuote(dir + "/model");
  if (!Shell(mk.str()))
    return false;
  std::ostringstream cc;
  cc << ShellQuote(bin + "/duckc") << " compile " << ShellQuote(dir + "/model")
     << " --cluster " << ShellQuote(dir + "/shaped.json") << CompileFlags(o);
  const std::string log = ShellQuote(dir + "/duckc.log");
  return Shell(cc.str() + " -o " + ShellQuote(dir + "/plan") +
               " > /dev/null 2> " + log + " || { cat " + log +
               " >&2; false; }") &&
         Shell(cc.str() + " --dry-run --emit=stats > " +
               ShellQuote(dir + "/stats.json"));
}

/// The cluster file of both duckc (link rates, already scaled) and duckrun
/// (the simulator's ports; none yet when `ports` is empty).
bool WriteClusterFile(const std::string &path, uint32_t ducks,
                      const std::vector<uint16_t> &ports, double host_gbps,
                      double duck_gbps, double latency_us,
                      uint16_t cast_port = 0,
                      const nlohmann::json &measured = {}) {
  nlohmann::json j = measured.is_object() ? measured : nlohmann::json::object();
  j["ducks"] = nlohmann::json::array();
  for (uint32_t i = 0; i < ducks; ++i)
    j["ducks"].push_back({{"host", "127.0.0.1"},
                          {"port", i < ports.size() ? ports[i] : 7000 + i},
                          {"cores", 1},
                          {"memory_gib", 1}});
  if (host_gbps > 0)
    j["host_link_gbps"] = host_gbps;
  if (duck_gbps > 0)
    j["duck_link_gbps"] = duck_gbps;
  if (latency_us > 0)
    j["latency_us"] = latency_us;
  if (cast_port)
    j["cast"] = "127.0.0.1:" + std::to_string(cast_port);
  std::ofstream f(path);
  f << j.dump(1) << "\n";
  return bool(f);
}

nlohmann::json ReadJson(const std::string &path) {
  std::ifstream f(path);
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  return j.is_discarded() ? nlohmann::json::object() : j;
}

} // namespace

namespace {

/// A loopback echo server for one connection: every byte read is written
/// back.
struct EchoServer {
  int listen_fd = -1;
  uint16_t port = 0;
  std::thread thread;

  bool Start() {
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (listen_fd < 0 || bind(listen_fd, (sockaddr *)&a, sizeof a) != 0 ||
        listen(listen_fd, 4) != 0 ||
        getsockname(listen_fd, (sockaddr *)&a, &len) != 0)
      return false;
    port = ntohs(a.sin_port);
    thread = std::thread([fd = listen_fd] {
      const int c = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0)
        return;
      int one = 1;
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      char buf[4096];
      for (ssize_t n; (n = read(c, buf, sizeof buf)) > 0;)
        if (write(c, buf, size_t(n)) != n)
          break;
      close(c);
    });
    return true;
  }
  ~EchoServer() {
    if (listen_fd >= 0)
      shutdown(listen_fd, SHUT_RDWR);
    if (thread.joinable())
      thread.join();
    if (listen_fd >= 0)
      close(listen_fd);
  }
};

/// The median round trip (us) of a 64-byte ping through a fresh simulator
/// with the given links in front of an echo server; < 0 on failure.
double PingRttUs(double host_gbps, double duck_gbps, double latency_us) {
  EchoServer echo;
  if (!echo.Start())
    return -1;
  LinkSimOptions lo;
  lo.backends = {duck::runtime::DuckEndpoint{"127.0.0.1", echo.port}};
  lo.host_link_gbps = host_gbps;
  lo.duck_link_gbps = duck_gbps;
  lo.latency_us = latency_us;
  auto sim = LinkSim::Start(lo);
  if (!sim.ok())
    return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((*sim)->ports()[0]);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<double> rtt;
  char msg[64] = {};
  if (fd >= 0 && connect(fd, (sockaddr *)&a, sizeof a) == 0)
    for (int i = 0; i < 520; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      size_t got = 0;
      if (write(fd, msg, sizeof msg) != ssize_t(sizeof msg))
        break;
      for (ssize_t n; got < sizeof msg &&
                      (n = read(fd, msg + got, sizeof msg - got)) > 0;)
        got += size_t(n);
      if (got != sizeof msg)
        break;
      if (i >= 20) // the first ones warm the path up
        rtt.push_back(std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - t0)
                          .count());
    }
  if (fd >= 0)
    close(fd);
  (*sim)->Stop();
  if (rtt.size() < 500)
    return -1;
  std::nth_element(rtt.begin(), rtt.begin() + rtt.size() / 2, rtt.end());
  return rtt[rtt.size() / 2];
}

/// The one-way latency the simulator adds (us), measured apart from the
/// runs: a 64-byte ping's round trip shaped less unlimited, halved, less
/// its bytes' time on the links.
nlohmann::json ProbeLatency(double host_gbps, double duck_gbps,
                            double latency_us) {
  const double base = PingRttUs(0, 0, 0);
  const double shaped = PingRttUs(host_gbps, duck_gbps, latency_us);
  const double bytesUs =
      64 * 8 / (std::min(host_gbps, duck_gbps) * 1e3); // each way
  nlohmann::json j;
  j["probe_rtt_unlimited_us"] = base;
  j["probe_rtt_shaped_us"] = shaped;
  j["measured_one_way_latency_us"] =
      base > 0 && shaped > 0 ? std::max(0.0, (shaped - base) / 2 - bytesUs)
                             : -1.0;
  return j;
}

struct Pass {
  nlohmann::json summary;
  uint64_t to_ducks = 0, from_ducks = 0;
  uint64_t cast_from_host = 0; // the cast datagrams, once each
};

/// One duckrun through a fresh simulator with the given links (rates
/// already scaled; 0: unlimited).
bool RunPass(const ClusterBenchOptions &o, const std::string &bin,
             const std::string &dir, const duck::runtime::LocalCluster &ducks,
             const char *name, double host_gbps, double duck_gbps,
             double latency_us, Pass *out) {
  LinkSimOptions lo;
  lo.backends = ducks.endpoints();
  lo.host_link_gbps = host_gbps;
  lo.duck_link_gbps = duck_gbps;
  lo.latency_us = latency_us;
  if (o.fanout == "multicast")
    lo.cast_ports = ducks.cast_ports();
  auto sim = LinkSim::Start(lo);
  if (!sim.ok()) {
    std::fprintf(stderr, "duck-bench cluster: %s\n",
                 std::string(sim.status().message()).c_str());
    return false;
  }
  const std::string file = dir + "/run-" + name + ".json";
  const std::string summary = dir + "/summary-" + name + ".json";
  if (!WriteClusterFile(file, o.ducks, (*sim)->ports(), host_gbps, duck_gbps,
                        latency_us, (*sim)->cast_relay_port()))
    return false;
  std::ostringstream cmd;
  cmd << ShellQuote(bin + "/duckrun") << " " << ShellQuote(dir + "/plan")
      << " --cluster " << ShellQuote(file)
      << " --prompt 'the ducks on one switch' --max-tokens " << o.tokens
      << " --ignore-eos --quiet --summary-json " << ShellQuote(summary)
      << " > /dev/null";
  const bool ok = Shell(cmd.str());
  (*sim)->Stop();
  for (const auto &s : (*sim)->stats()) {
    out->to_ducks += s.bytes_to_duck;
    out->from_ducks += s.bytes_from_duck;
  }
  out->cast_from_host = (*sim)->cast_bytes_from_host();
  out->summary = ReadJson(summary);
  return ok && out->summary.contains("tpot_p50_ms");
}

double Num(const nlohmann::json &j, const char *key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0;
}

/// A pass's TPOT: the median of its tokens' times. The mean (duckrun's
/// tpot_ms) is reported beside it; on a 2-vCPU box one stalled token of
/// 12 moved the mean by milliseconds, more than a cut link's growth.
double Tpot(const Pass &p) { return Num(p.summary, "tpot_p50_ms"); }

/// The pass of the median TPOT (the lower middle one of an even count).
const Pass &Median(std::vector<Pass> &passes) {
  std::sort(passes.begin(), passes.end(),
            [](const Pass &a, const Pass &b) { return Tpot(a) < Tpot(b); });
  return passes[(passes.size() - 1) / 2];
}

/// The cost model's figures for one cluster file's stats.
void Predicted(const nlohmann::json &stats, nlohmann::json &r) {
  const double tokS = Num(stats, "estimated_decode_tok_s");
  r["predicted_tpot_ms"] = tokS > 0 ? 1e3 / tokS : 0;
  r["predicted_network_ms"] = Num(stats, "network_ms_per_token");
  r["predicted_network_out_ms"] = Num(stats, "network_out_ms_per_token");
  r["predicted_network_back_ms"] = Num(stats, "network_back_ms_per_token");
  r["predicted_latency_ms"] = Num(stats, "network_latency_ms_per_token");
  r["predicted_stream_ms"] = Num(stats, "stream_ms_per_token");
  r["predicted_dispatch_ms"] = Num(stats, "dispatch_ms_per_token");
  r["predicted_host_ms"] = Num(stats, "host_ms_per_token");
  r["steps_per_token"] = Num(stats, "steps_per_token");
  r["predicted_host_tx_bytes_per_token"] = Num(stats, "host_tx_bytes_per_token");
  r["predicted_host_rx_bytes_per_token"] = Num(stats, "host_rx_bytes_per_token");
}

nlohmann::json Results(const ClusterBenchOptions &o, const Pass &base,
                       const Pass &shaped, const nlohmann::json &stats,
                       const nlohmann::json &probe,
                       const nlohmann::json &probeStats) {
  nlohmann::json r = probe;
  r["ducks"] = o.ducks;
  r["layers"] = o.layers;
  r["attention"] = o.attention;
  r["wire"] = o.wire;
  r["tokens"] = o.tokens;
  r["repeat"] = o.repeat;
  r["scale"] = o.scale;
  r["host_link_gbps"] = o.host_gbps;
  r["duck_link_gbps"] = o.duck_gbps;
  r["simulated_host_link_gbps"] = o.host_gbps / o.scale;
  r["simulated_duck_link_gbps"] = o.duck_gbps / o.scale;
  r["latency_us"] = o.latency_us;
  const double tpot = Tpot(shaped), baseTpot = Tpot(base);
  r["measured_tpot_ms"] = tpot;
  r["baseline_tpot_ms"] = baseTpot;
  r["measured_tpot_mean_ms"] = Num(shaped.summary, "tpot_ms");
  r["baseline_tpot_mean_ms"] = Num(base.summary, "tpot_ms");
  r["measured_network_ms"] = tpot - baseTpot;
  Predicted(stats, r);
  const double net = r["predicted_network_ms"].get<double>();
  // The TPOT the model's network term predicts on top of what the same
  // plan measured with unlimited links.
  r["predicted_tpot_on_baseline_ms"] = baseTpot + net;
  r["network_ratio"] = net > 0 ? (tpot - baseTpot) / net : 0;
  r["tpot_ratio"] = tpot / (baseTpot + net);
  const double atProbe = Num(probeStats, "network_ms_per_token");
  r["predicted_network_ms_at_measured_latency"] = atProbe;
  r["network_ratio_at_measured_latency"] =
      atProbe > 0 ? (tpot - baseTpot) / atProbe : 0;
  r["fanout"] = o.fanout;
  r["stage_shared"] = o.stage_shared;
  r["experts"] = o.experts ? o.experts : std::max<uint32_t>(2, o.ducks);
  r["predicted_staged_shared_ms"] = Num(stats, "staged_shared_ms_per_token");
  r["shaped_stages"] = Num(shaped.summary, "stages");
  r["shaped_stage_resent"] = Num(shaped.summary, "stage_resent");
  // With multicast: stages as cast batches alone (protocol 5), the ducks'
  // staged steps that found theirs already run, the host's CPU sending them.
  r["shaped_stages_cast"] = Num(shaped.summary, "stages_cast");
  r["shaped_stage_ducks_ahead"] = Num(shaped.summary, "stage_ducks_ahead");
  r["shaped_stage_host_cpu_ms"] =
      Num(shaped.summary, "stage_host_cpu_ms_total");
  r["shaped_run_bytes_to_ducks"] = shaped.to_ducks;
  r["shaped_run_cast_bytes_from_host"] = shaped.cast_from_host;
  r["shaped_cast_steps"] = Num(shaped.summary, "cast_steps");
  r["shaped_cast_resent"] = Num(shaped.summary, "cast_resent");
  r["shaped_run_bytes_from_ducks"] = shaped.from_ducks;
  r["shaped_decode_steps"] = Num(shaped.summary, "decode_steps");
  // Where the time went in each run (duckrun's decode breakdown): the
  // dispatch gap is what the host waits on the ducks beyond their kernel
  // time, so the wire's part of it, shaped less baseline, is the network
  // measured without the host's and ducks' own work (which can change
  // between the runs on a shared box).
  const auto breakdown = [](const Pass &p) {
    return p.summary.contains("decode_breakdown_ms")
               ? p.summary["decode_breakdown_ms"]
               : nlohmann::json::object();
  };
  r["baseline_breakdown_ms"] = breakdown(base);
  r["shaped_breakdown_ms"] = breakdown(shaped);
  r["baseline_dispatch_gap_ms"] = Num(breakdown(base), "dispatch_gap");
  r["shaped_dispatch_gap_ms"] = Num(breakdown(shaped), "dispatch_gap");
  const double gapNet =
      Num(breakdown(shaped), "dispatch_gap") - Num(breakdown(base), "dispatch_gap");
  r["measured_gap_network_ms"] = gapNet;
  r["gap_network_ratio"] = net > 0 ? gapNet / net : 0;
  return r;
}

/// --measure-dispatch's figures: the inputs, and the model's dispatch term
/// beside the baseline's dispatch gap (links unlimited: what is left of the
/// host's wait beyond the ducks' kernels is the steps' dispatch).
void DispatchResults(const nlohmann::json &measured, nlohmann::json &r) {
  r["measured_step_overhead_us"] = Num(measured, "step_overhead_us");
  r["measured_host_frame_us"] = Num(measured, "host_frame_us");
  r["measured_dispatch_ms"] = Num(r, "baseline_dispatch_gap_ms");
  const double pred = Num(r, "predicted_dispatch_ms");
  r["dispatch_ratio"] =
      pred > 0 ? Num(r, "baseline_dispatch_gap_ms") / pred : 0;
}

void PrintText(const nlohmann::json &r) {
  auto d = [&](const char *k) { return r[k].get<double>(); };
  std::printf("duck-bench cluster: %d ducks, %d layers, %d tokens; host link "
              "%g Gb/s, duck link %g Gb/s, latency %g us one way; scale %g "
              "(simulated and modelled at %g / %g Gb/s)\n",
              r["ducks"].get<int>(), r["layers"].get<int>(),
              r["tokens"].get<int>(), d("host_link_gbps"),
              d("duck_link_gbps"), d("latency_us"), d("scale"),
              d("simulated_host_link_gbps"), d("simulated_duck_link_gbps"));
  std::printf("measured:  TPOT %.3f ms, network %.3f ms (TPOT less the "
              "baseline's %.3f ms with unlimited links)\n",
              d("measured_tpot_ms"), d("measured_network_ms"),
              d("baseline_tpot_ms"));
  std::printf("predicted: TPOT %.3f ms (stream %.3f + dispatch %.3f + host "
              "%.3f + network %.3f), network %.3f ms (out %.3f + back %.3f + "
              "latency %.3f: %g steps a token x 2 x %g us)\n",
              d("predicted_tpot_ms"), d("predicted_stream_ms"),
              d("predicted_dispatch_ms"), d("predicted_host_ms"),
              d("predicted_network_ms"), d("predicted_network_ms"),
              d("predicted_network_out_ms"), d("predicted_network_back_ms"),
              d("predicted_latency_ms"), d("steps_per_token"),
              d("latency_us"));
  std::printf("ratios: network measured / predicted %.2f; TPOT measured / "
              "(baseline + predicted network %.3f ms) %.2f\n",
              d("network_ratio"), d("predicted_tpot_on_baseline_ms"),
              d("tpot_ratio"));
  std::printf("the host's wait on the ducks (dispatch gap) grew %.3f ms a "
              "token: measured / predicted network %.2f\n",
              d("measured_gap_network_ms"), d("gap_network_ratio"));
  if (r["stage_shared"] == "on")
    std::printf("staged MoE steps (%g routed experts): %g stages (%g as "
                "cast batches alone, %g ducks' stages run before their "
                "frame), %g ducks sent their whole step; the host's CPU "
                "sending them %.3f us a stage; the model hides %.3f ms a "
                "token of the routers' time\n",
                d("experts"), d("shaped_stages"), d("shaped_stages_cast"),
                d("shaped_stage_ducks_ahead"), d("shaped_stage_resent"),
                d("shaped_stages") > 0
                    ? 1e3 * d("shaped_stage_host_cpu_ms") / d("shaped_stages")
                    : 0.0,
                d("predicted_staged_shared_ms"));
  if (r.contains("dispatch_ratio"))
    std::printf("dispatch: the baseline's dispatch gap %.3f ms a token; "
                "predicted %.3f ms (%g steps a token, a step's overhead %.1f "
                "us and the host's %.1f us a frame, measured apart by "
                "duck-measure-cluster): measured / predicted %.2f\n",
                d("measured_dispatch_ms"), d("predicted_dispatch_ms"),
                d("steps_per_token"), d("measured_step_overhead_us"),
                d("measured_host_frame_us"), d("dispatch_ratio"));
  std::printf("the simulator's one-way latency, measured by a 64-byte ping "
              "(shaped less unlimited): %.1f us; network predicted at it "
              "%.3f ms (measured / predicted %.2f)\n",
              d("measured_one_way_latency_us"),
              d("predicted_network_ms_at_measured_latency"),
              d("network_ratio_at_measured_latency"));
}

/// duckc's stats for the plan's cluster file at another latency.
nlohmann::json StatsAtLatency(const ClusterBenchOptions &o,
                              const std::string &bin, const std::string &dir,
                              double latency_us,
                              const nlohmann::json &measured) {
  const std::string file = dir + "/shaped-probe.json";
  if (latency_us < 0 ||
      !WriteClusterFile(file, o.ducks, {}, o.host_gbps / o.scale,
                        o.duck_gbps / o.scale, latency_us, 0, measured))
    return nlohmann::json::object();
  std::ostringstream cc;
  cc << ShellQuote(bin + "/duckc") << " compile " << ShellQuote(dir + "/model")
     << " --cluster " << ShellQuote(file) << CompileFlags(o)
     << " --dry-run --emit=stats > " << ShellQuote(dir + "/stats-probe.json");
  if (!Shell(cc.str()))
    return nlohmann::json::object();
  return ReadJson(dir + "/stats-probe.json");
}

/// N local duckd's of one core each (with cast sockets for multicast).
absl::StatusOr<std::unique_ptr<duck::runtime::LocalCluster>>
StartDucks(const ClusterBenchOptions &o, const std::string &dir) {
  duck::runtime::LocalClusterOptions co;
  co.ducks = o.ducks;
  co.cores = 1;
  co.pin = false;
  co.cache_dir = dir + "/cache";
  co.log_dir = dir;
  co.weights_size = 512ull << 20;
  // No idle re-hashing of the weights: on a small box it would take the
  // CPU from the steps of the run it is idle in.
  co.extra_args = {"--scrub-mbps", "0"};
  // Each duck a cast port the simulator relays to, and a wait for a batch
  // as long as the scaled links need (7.6 KB at 2.5 / 40 Gb/s is 1 ms).
  if (o.fanout == "multicast")
    co.extra_args.insert(co.extra_args.end(),
                         {"--cast", "127.0.0.1:0", "--cast-wait-us", "20000"});
  return duck::runtime::LocalCluster::Start(co);
}

/// --measure-dispatch: the cost model's dispatch inputs, measured apart
/// from the runs by duck-measure-cluster through the simulator with
/// unlimited links (the runs' baseline path): a step's overhead at one duck
/// and the host's CPU for each more duck's frame. Null on failure (said).
nlohmann::json MeasureDispatch(const std::string &bin, const std::string &dir,
                               const duck::runtime::LocalCluster &ducks,
                               uint32_t n) {
  LinkSimOptions lo;
  lo.backends = ducks.endpoints();
  auto sim = LinkSim::Start(lo);
  const std::string file = dir + "/measured.json";
  if (!sim.ok() || !WriteClusterFile(file, n, (*sim)->ports(), 0, 0, 0))
    return nullptr;
  const std::string log = ShellQuote(dir + "/measure.log");
  const bool ok = Shell(ShellQuote(bin + "/duck-measure-cluster") + " " +
                        ShellQuote(file) + " --millis 60 --arena-mib 64 > " +
                        log + " 2>&1 || { cat " + log + " >&2; false; }");
  (*sim)->Stop();
  const nlohmann::json m = ReadJson(file);
  if (!ok || !m.contains("step_overhead_us"))
    return nullptr;
  nlohmann::json keep = nlohmann::json::object();
  for (const char *k :
       {"step_overhead_us", "step_overhead_ducks", "host_frame_us"})
    if (m.contains(k))
      keep[k] = m[k];
  return keep;
}

/// Starts the ducks, makes the plan (with the dispatch inputs measured on
/// them when asked), runs both passes.
int RunBench(const ClusterBenchOptions &o, const std::string &dir) {
  const std::string bin = duck::runtime::ExecutableDir();
  const double host = o.host_gbps / o.scale, duck = o.duck_gbps / o.scale;
  auto ducks = StartDucks(o, dir);
  if (!ducks.ok()) {
    std::fprintf(stderr, "duck-bench cluster: %s\n",
                 std::string(ducks.status().message()).c_str());
    return 1;
  }
  nlohmann::json measured = nlohmann::json::object();
  if (o.measure_dispatch &&
      (measured = MeasureDispatch(bin, dir, **ducks, o.ducks)).is_null()) {
    std::fprintf(stderr, "duck-bench cluster: duck-measure-cluster failed\n");
    return 1;
  }
  if (!WriteClusterFile(dir + "/shaped.json", o.ducks, {}, host, duck,
                        o.latency_us, 0, measured) ||
      !MakeAndCompile(o, bin, dir))
    return 1;
  const nlohmann::json probe = ProbeLatency(host, duck, o.latency_us);
  const nlohmann::json probeStats = StatsAtLatency(
      o, bin, dir, probe["measured_one_way_latency_us"].get<double>(),
      measured);
  // Baseline and shaped runs alternate; each keeps its median TPOT's run.
  std::vector<Pass> bases(o.repeat), shapeds(o.repeat);
  for (uint32_t i = 0; i < o.repeat; ++i)
    if (!RunPass(o, bin, dir, **ducks, "baseline", 0, 0, 0, &bases[i]) ||
        !RunPass(o, bin, dir, **ducks, "shaped", host, duck, o.latency_us,
                 &shapeds[i]))
      return 1;
  const Pass &base = Median(bases), &shaped = Median(shapeds);
  nlohmann::json r = Results(o, base, shaped, ReadJson(dir + "/stats.json"),
                             probe, probeStats);
  if (o.measure_dispatch)
    DispatchResults(measured, r);
  if (o.json)
    std::printf("%s\n", r.dump(1).c_str());
  else
    PrintText(r);
  return 0;
}

} // namespace

int duckBenchCluster(int argc, char **argv) {
  ClusterBenchOptions o;
  if (argc > 1 && (!std::strcmp(argv[1], "--help") ||
                   !std::strcmp(argv[1], "-h"))) {
    PrintUsage(stdout);
    return 0;
  }
  if (!Parse(argc, argv, &o)) {
    PrintUsage(stderr);
    return 2;
  }
  std::string dir = o.work_dir;
  if (dir.empty()) {
    char tmpl[] = "/tmp/duck-bench-cluster-XXXXXX";
    if (!mkdtemp(tmpl)) {
      std::perror("duck-bench cluster: mkdtemp");
      return 1;
    }
    dir = tmpl;
  } else if (!Shell("mkdir -p " + ShellQuote(dir))) {
    return 1;
  }
  const int rc = RunBench(o, dir);
  if (!o.keep)
    std::system(("rm -rf " + ShellQuote(dir)).c_str());
  return rc;
}
