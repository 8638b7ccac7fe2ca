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
#include "BenchSubcommands.h"

#include "duck/runtime/cluster/LinkSim.h"
#include "duck/runtime/cluster/LocalCluster.h"

#include <nlohmann/json.hpp>

#include <algorithm>
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

using duck::runtime::LinkSim;
using duck::runtime::LinkSimOptions;

struct ClusterBenchOptions {
  uint32_t ducks = 4;
  double host_gbps = 25, duck_gbps = 2.5, latency_us = 50, scale = 1;
  uint32_t layers = 61, tokens = 16, repeat = 1;
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
      "  [--work-dir D (kept)]\n\n"
      "A DeepSeek-V3.2-shaped checkpoint (hidden 7168, L layers, one dense;\n"
      "4 heads, q/kv LoRA 64, N routed experts of intermediate 32, top 2,\n"
      "a shared one, vocabulary 512), compiled for N ducks (whole experts a\n"
      "duck), decoded by duckrun on N local duckd's behind duck-linksim:\n"
      "once with unlimited links (baseline), once with the given ones.\n"
      "measured_network_ms = shaped TPOT - baseline TPOT; the prediction\n"
      "is duckc's for the same cluster file (its network term has no\n"
      "latency: latency_ms_not_in_model is steps x 2 x latency).\n\n%s",
      duck::runtime::LinkSimModelText());
}

/// "--key value" or "--key=value"; advances *i past a separate value.
const char *Value(int argc, char **argv, int *i, const char *key) {
  const size_t n = std::strlen(key);
  if (std::strncmp(argv[*i], key, n) != 0)
    return nullptr;
  if (argv[*i][n] == '=')
    return argv[*i] + n + 1;
  if (argv[*i][n] == 0 && *i + 1 < argc)
    return argv[++*i];
  return nullptr;
}

bool Parse(int argc, char **argv, ClusterBenchOptions *o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char *v = nullptr;
    if (a == "--json")
      o->json = true;
    else if ((v = Value(argc, argv, &i, "--ducks")))
      o->ducks = uint32_t(std::atoi(v));
    else if ((v = Value(argc, argv, &i, "--host-link-gbps")))
      o->host_gbps = std::atof(v);
    else if ((v = Value(argc, argv, &i, "--duck-link-gbps")))
      o->duck_gbps = std::atof(v);
    else if ((v = Value(argc, argv, &i, "--latency-us")))
      o->latency_us = std::atof(v);
    else if ((v = Value(argc, argv, &i, "--scale")))
      o->scale = std::atof(v);
    else if ((v = Value(argc, argv, &i, "--layers")))
      o->layers = uint32_t(std::atoi(v));
    else if ((v = Value(argc, argv, &i, "--tokens")))
      o->tokens = uint32_t(std::atoi(v));
    else if ((v = Value(argc, argv, &i, "--repeat")))
      o->repeat = uint32_t(std::atoi(v));
    else if ((v = Value(argc, argv, &i, "--work-dir"))) {
      o->work_dir = v;
      o->keep = true;
    } else
      return false;
  }
  return o->ducks >= 1 && o->ducks <= 64 && o->layers >= 2 &&
         o->tokens >= 2 && o->repeat >= 1 && o->repeat <= 20 && o->scale > 0 && o->host_gbps > 0 &&
         o->duck_gbps > 0 && o->latency_us >= 0;
}

std::string Quote(const std::string &s) {
  std::string q = "'";
  for (char c : s)
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// Runs a command line; false (after saying which) when it fails.
bool Shell(const std::string &cmd) {
  const int rc = std::system(cmd.c_str());
  if (rc != 0)
    std::fprintf(stderr, "duck-bench cluster: failed (%d): %s\n", rc,
                 cmd.c_str());
  return rc == 0;
}

bool MakeAndCompile(const ClusterBenchOptions &o, const std::string &bin,
                    const std::string &dir) {
  const uint32_t inter = std::max<uint32_t>(256, 32 * o.ducks);
  // A kept --work-dir is made again from scratch (neither tool overwrites).
  if (!Shell("rm -rf " + Quote(dir + "/model") + " " + Quote(dir + "/plan")))
    return false;
  std::ostringstream mk;
  mk << Quote(bin + "/duck-mkmodel") << " -q --preset tiny-deepseek"
     << " --family deepseek_v32 --hidden 7168 --layers " << o.layers
     << " --dense-layers 1 --heads 4 --intermediate " << inter
     << " --moe-intermediate 32 --experts " << std::max<uint32_t>(2, o.ducks)
     << " --top-k 2 --shared-experts 1 --n-group 1 --topk-group 1"
     << " --q-lora 64 --kv-lora 64 --qk-nope 32 --qk-rope 16 --v-head 32"
     << " --index-heads 2 --index-head-dim 32 --index-topk 64 --vocab 512"
     << " -o " << Quote(dir + "/model");
  if (!Shell(mk.str()))
    return false;
  std::ostringstream cc;
  cc << Quote(bin + "/duckc") << " compile " << Quote(dir + "/model")
     << " --cluster " << Quote(dir + "/shaped.json") << " --tp " << o.ducks
     << " --strategy experts";
  const std::string log = Quote(dir + "/duckc.log");
  return Shell(cc.str() + " -o " + Quote(dir + "/plan") + " > /dev/null 2> " +
               log + " || { cat " + log + " >&2; false; }") &&
         Shell(cc.str() + " --dry-run --emit=stats > " +
               Quote(dir + "/stats.json"));
}

/// The cluster file of both duckc (link rates, already scaled) and duckrun
/// (the simulator's ports; none yet when `ports` is empty).
bool WriteClusterFile(const std::string &path, uint32_t ducks,
                      const std::vector<uint16_t> &ports, double host_gbps,
                      double duck_gbps) {
  nlohmann::json j;
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

struct Pass {
  nlohmann::json summary;
  uint64_t to_ducks = 0, from_ducks = 0;
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
  auto sim = LinkSim::Start(lo);
  if (!sim.ok()) {
    std::fprintf(stderr, "duck-bench cluster: %s\n",
                 std::string(sim.status().message()).c_str());
    return false;
  }
  const std::string file = dir + "/run-" + name + ".json";
  const std::string summary = dir + "/summary-" + name + ".json";
  if (!WriteClusterFile(file, o.ducks, (*sim)->ports(), host_gbps, duck_gbps))
    return false;
  std::ostringstream cmd;
  cmd << Quote(bin + "/duckrun") << " " << Quote(dir + "/plan")
      << " --cluster " << Quote(file)
      << " --prompt 'the ducks on one switch' --max-tokens " << o.tokens
      << " --ignore-eos --quiet --summary-json " << Quote(summary)
      << " > /dev/null";
  const bool ok = Shell(cmd.str());
  (*sim)->Stop();
  for (const auto &s : (*sim)->stats()) {
    out->to_ducks += s.bytes_to_duck;
    out->from_ducks += s.bytes_from_duck;
  }
  out->summary = ReadJson(summary);
  return ok && out->summary.contains("tpot_ms");
}

double Num(const nlohmann::json &j, const char *key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0;
}

/// The pass of the median TPOT (the lower middle one of an even count).
const Pass &Median(std::vector<Pass> &passes) {
  std::sort(passes.begin(), passes.end(), [](const Pass &a, const Pass &b) {
    return Num(a.summary, "tpot_ms") < Num(b.summary, "tpot_ms");
  });
  return passes[(passes.size() - 1) / 2];
}

nlohmann::json Results(const ClusterBenchOptions &o, const Pass &base,
                       const Pass &shaped, const nlohmann::json &stats) {
  nlohmann::json r;
  r["ducks"] = o.ducks;
  r["layers"] = o.layers;
  r["tokens"] = o.tokens;
  r["repeat"] = o.repeat;
  r["scale"] = o.scale;
  r["host_link_gbps"] = o.host_gbps;
  r["duck_link_gbps"] = o.duck_gbps;
  r["simulated_host_link_gbps"] = o.host_gbps / o.scale;
  r["simulated_duck_link_gbps"] = o.duck_gbps / o.scale;
  r["latency_us"] = o.latency_us;
  const double tpot = Num(shaped.summary, "tpot_ms");
  const double baseTpot = Num(base.summary, "tpot_ms");
  r["measured_tpot_ms"] = tpot;
  r["baseline_tpot_ms"] = baseTpot;
  r["measured_network_ms"] = tpot - baseTpot;
  const double tokS = Num(stats, "estimated_decode_tok_s");
  r["predicted_tpot_ms"] = tokS > 0 ? 1e3 / tokS : 0;
  r["predicted_network_ms"] = Num(stats, "network_ms_per_token");
  r["predicted_stream_ms"] = Num(stats, "stream_ms_per_token");
  r["predicted_dispatch_ms"] = Num(stats, "dispatch_ms_per_token");
  r["predicted_host_ms"] = Num(stats, "host_ms_per_token");
  const double stepUs = Num(stats, "step_overhead_us");
  const double steps =
      stepUs > 0 ? std::round(Num(stats, "dispatch_ms_per_token") * 1e3 /
                              stepUs)
                 : 0;
  r["steps_per_token"] = steps;
  r["latency_ms_not_in_model"] = steps * 2 * o.latency_us / 1e3;
  r["predicted_network_plus_latency_ms"] =
      Num(stats, "network_ms_per_token") + steps * 2 * o.latency_us / 1e3;
  r["predicted_host_tx_bytes_per_token"] = Num(stats, "host_tx_bytes_per_token");
  r["predicted_host_rx_bytes_per_token"] = Num(stats, "host_rx_bytes_per_token");
  r["shaped_run_bytes_to_ducks"] = shaped.to_ducks;
  r["shaped_run_bytes_from_ducks"] = shaped.from_ducks;
  r["shaped_decode_steps"] = Num(shaped.summary, "decode_steps");
  r["baseline_dispatch_gap_ms"] =
      base.summary.contains("decode_breakdown_ms")
          ? Num(base.summary["decode_breakdown_ms"], "dispatch_gap")
          : 0;
  r["shaped_dispatch_gap_ms"] =
      shaped.summary.contains("decode_breakdown_ms")
          ? Num(shaped.summary["decode_breakdown_ms"], "dispatch_gap")
          : 0;
  return r;
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
              "%.3f + network %.3f), network %.3f ms\n",
              d("predicted_tpot_ms"), d("predicted_stream_ms"),
              d("predicted_dispatch_ms"), d("predicted_host_ms"),
              d("predicted_network_ms"), d("predicted_network_ms"));
  std::printf("latency not in the model: %g steps a token x 2 x %g us = "
              "%.3f ms (network + latency %.3f ms)\n",
              d("steps_per_token"), d("latency_us"),
              d("latency_ms_not_in_model"),
              d("predicted_network_plus_latency_ms"));
}

/// Makes the plan, starts the ducks, runs both passes.
int RunBench(const ClusterBenchOptions &o, const std::string &dir) {
  const std::string bin = duck::runtime::ExecutableDir();
  const double host = o.host_gbps / o.scale, duck = o.duck_gbps / o.scale;
  if (!WriteClusterFile(dir + "/shaped.json", o.ducks, {}, host, duck) ||
      !MakeAndCompile(o, bin, dir))
    return 1;
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
  auto ducks = duck::runtime::LocalCluster::Start(co);
  if (!ducks.ok()) {
    std::fprintf(stderr, "duck-bench cluster: %s\n",
                 std::string(ducks.status().message()).c_str());
    return 1;
  }
  // Baseline and shaped runs alternate; each keeps its median TPOT's run.
  std::vector<Pass> bases(o.repeat), shapeds(o.repeat);
  for (uint32_t i = 0; i < o.repeat; ++i)
    if (!RunPass(o, bin, dir, **ducks, "baseline", 0, 0, 0, &bases[i]) ||
        !RunPass(o, bin, dir, **ducks, "shaped", host, duck, o.latency_us,
                 &shapeds[i]))
      return 1;
  const Pass &base = Median(bases), &shaped = Median(shapeds);
  const nlohmann::json r =
      Results(o, base, shaped, ReadJson(dir + "/stats.json"));
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
  } else if (!Shell("mkdir -p " + Quote(dir))) {
    return 1;
  }
  const int rc = RunBench(o, dir);
  if (!o.keep)
    std::system(("rm -rf " + Quote(dir)).c_str());
  return rc;
}
