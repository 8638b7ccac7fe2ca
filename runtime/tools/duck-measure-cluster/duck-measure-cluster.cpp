// duck-measure-cluster: asks every duck of a cluster file for its read
// bandwidth and fp9 GEMV rates (duckd's `measure`, its weight cache
// untouched), times the dispatch gap, with --host also this machine's read
// bandwidth and attention rate, and writes the figures into the file for
// the compiler's cost model (`duckc compile --cluster`). `duckc
// measure-cluster ARGS...` runs this tool with ARGS (the compiler links
// nothing of the runtime); it passes "duckc measure-cluster" as argv[0],
// which names the tool in its messages and in the file's "measured" block.
#include "duck/runtime/cluster/ClusterFile.h"
#include "duck/runtime/cluster/DuckClient.h"
#include "duck/runtime/cluster/LocalCluster.h"
#include "duck/runtime/engine/HostKernels.h"
#include "duck_rt/tool_flags.h"

#include "Measure.h" // duck-rt/measure: the duck's own rates, here the host's

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

ABSL_FLAG(std::string, o, "",
          "Write the measured cluster file here (default: update the input "
          "in place; written to a temporary file and renamed)");
ABSL_FLAG(uint32_t, cores, 0,
          "Cores each duck measures on (default: all of its)");
ABSL_FLAG(uint32_t, millis, 150, "Budget of each measurement on a duck, ms");
ABSL_FLAG(uint32_t, arena_mib, 1024,
          "Memory a duck cycles cold weight copies through (well beyond its "
          "last-level cache: on a 2-vCPU Zen 5 VM 256 MiB still read 1.3x "
          "faster than 1 GiB, part of it from cache), MiB");
ABSL_FLAG(bool, all_at_once, false,
          "Measure every duck at the same time (ducks on machines of their "
          "own); default one after another, as ducks sharing a machine must");
ABSL_FLAG(uint32_t, busy_us, 500,
          "Each ping keeps the duck busy this long before it answers, as a "
          "step's compute would (the host's wake-up after a long wait "
          "belongs to the dispatch gap); the time is subtracted");
ABSL_FLAG(double, same_within, 0.10,
          "Ducks whose general128 rates lie within this fraction of their "
          "mean get the mean (measurement noise must not split equal ducks "
          "unequally); 0 keeps every duck's own");
ABSL_FLAG(std::string, mesh, "",
          "tcp or udp: also time the ducks' collectives over their mesh "
          "(every duckd started with --mesh-port, its port the duck's "
          "\"mesh_port\" in the file) and write mesh_call_us and "
          "mesh_message_us");
ABSL_FLAG(bool, links, false,
          "Also time the links: probes carrying --link-mib each way to every "
          "duck alone and to all at once (duckd answers at once), and write "
          "each duck's link_gbps and, with two ducks or more, "
          "host_link_gbps");
ABSL_FLAG(uint32_t, link_mib, 8,
          "Bytes a link probe carries one way, MiB (1 to 64; more for faster "
          "links: the probe must take well over a round trip)");
ABSL_FLAG(uint32_t, link_trips, 5, "Round trips timed a link probe (median)");
ABSL_FLAG(bool, host, false,
          "Also measure this machine's read bandwidth, all its cores, as the "
          "host's (host_read_gbs: the cost of an LM head on the host, so the "
          "compiler can choose where it goes); run it on the host for this");

namespace {

namespace rt = duck::runtime;
using nlohmann::json;

constexpr const char *kUsage =
    R"(measure a cluster's ducks for the compiler's cost model.

  duck-measure-cluster <cluster.json> [-o FILE] [--cores N] [--millis MS]
                       [--arena-mib MIB] [--all-at-once] [--same-within F]
                       [--busy-us US] [--host] [--mesh tcp|udp]
                       [--links [--link-mib MIB] [--link-trips N]]
  (also run as 'duckc measure-cluster ...', with the same arguments)

Asks every duck of the cluster file (its duckd must be running; the file's
"token" authenticates) for its read bandwidth and cold fp9 GEMV rate of
every kernel class, measured with the duck's kernels on memory of its own
(its weight cache is untouched), and times 200 round trips to it: pings,
and empty steps through a session of the duck ELF (its dispatch path).
Writes each duck's "cores", "read_gbs", "fp9_gparam_s" (general128),
"fp9_gparam_s_by_kernel", "fp9_gemm_gmac_s" (a 64-row prompt chunk's dense
prefill), "gemv_call_us" (what a small matrix's GEMV costs beyond its
weights at the general128 rate: the cost model adds it to every matrix a
duck runs in a step), "rtt_us", "empty_step_us" (and "memory_gib" from its
weight buffer if absent), and the cluster's "bandwidth_gbs" and
"fp9_gemm_gmac_s" (slowest duck) and "step_overhead_us" (the largest gap: a
ping that kept the duck busy --busy-us (500) as a step would, less that
time, or an empty step; "step_overhead_ducks" 1: a duck's own ping, so
that compile adds the host's frames to the others of a step at
host_frame_us) and, with two ducks or more, "host_frame_us" (the
host's CPU for one more frame to and from a duck: what each duck beyond
the first adds to the host thread's CPU time for a ping sent to every duck
at once, halved) and "host_frame_wall_us" (the same by the wall clock:
ducks on the host's machine add their CPU and wake-ups to it) into the
file, for 'duckc compile --cluster'. Ducks
measure one after another unless --all-at-once. --host (run it on the host)
also writes this machine's read bandwidth as "host_read_gbs": with it,
'compile --tp auto' without --lm-head also chooses where the LM head goes
(and without --q-proj / --o-proj / --in-proj, the attention projections);
its rate on attention over a cache as "host_gmac_s": with
"context_tokens" (yours to set) in the file, compile adds a token's
attention over that much context to the host's time; and "host_fp8":
"e4m3" where the host reads an FP8 checkpoint's own matrices as their
bytes (duckrun's default), "fp9" under DUCK_HOST_FP8=fp9 (the cost
model's host bytes a weight for them: 1 or 1.125). The file keeps its
other keys; it is written to a temporary file and renamed.

--links times each duck's link and the host's: a probe of --link-mib MiB
(8) to the duck and back, each way and neither, --link-trips (5) round
trips each (medians); its rate is the bytes over the time they added. Each
duck alone gives its link's rates to and from it, "link_gbps" the slower
(rather than the cluster's "duck_link_gbps"); every duck at once gives
the host's port's, "host_link_gbps" the slower way (or what the ducks'
links carry together where their sum is the slower: the figure is what
the host sees). A rate the probe could not time (its bytes added no time
over a round trip without them) is not written, and said so; a larger
--link-mib times it. Over loopback it measures the kernel's copies (25-32
Gbit/s on a 2-vCPU VM). 'duckc compile' then counts the wire (and with --tp
auto weighs the wire's formats: README, the wire's formats).

--mesh tcp|udp (every duck's duckd started with --mesh-port, that port the
duck's "mesh_port" in the file) then joins the ducks into their mesh over
that transport and has every duck run, all at once, 400 rounds of a
reduce-scatter and an all-gather of 7168 bf16 values (DeepSeek-V3's hidden
size): in one exchange (N-1 messages a duck a collective) and, where N has
a divisor G between 1 and N, in G groups (two calls, N/G-1+G-1 messages).
The mean CPU time a duck's server took a collective at the two message
counts gives what a call and a message cost: "mesh_call_us" and
"mesh_message_us", the inputs of 'duckc compile --residual ducks' (with N
prime or below 4, the whole of one exchange is the call). Each duck
measures on its own cores: ducks sharing a machine's cores measure their
contention too.

Exit status is 0 on success and 1 on any error, reported on stderr as
'<tool>: error: <message>'.)";

/// How the tool was started: "duck-measure-cluster", or "duckc
/// measure-cluster" through duckc. `prog` heads its messages.
struct Names {
  std::string by;   // the "measured" block's "by"
  std::string prog; // "duckc" or "duck-measure-cluster"
};

Names NamesFrom(const char *argv0) {
  std::string name = argv0 && *argv0 ? argv0 : "duck-measure-cluster";
  name = name.substr(name.find_last_of('/') + 1);
  return Names{name, name.substr(0, name.find(' '))};
}

/// LLVM's fixed-point formatting (formatv's "f<prec>"), which duckc's
/// output used: "nan", "INF" and "-INF" for those values.
std::string Fixed(double v, int prec) {
  if (std::isnan(v))
    return "nan";
  if (std::isinf(v))
    return std::signbit(v) ? "-INF" : "INF";
  return absl::StrFormat("%.*f", prec, v);
}

/// Writes `j` the way LLVM's JSON writer does with an indent of 2 (duckc's
/// format, kept): keys sorted, doubles with 17 significant digits.
void WriteJson(const json &j, int depth, std::string &out) {
  auto newline = [&](int d) { out += "\n" + std::string(2 * d, ' '); };
  switch (j.type()) {
  case json::value_t::object:
  case json::value_t::array: {
    const bool object = j.is_object();
    out += object ? '{' : '[';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first)
        out += ',';
      first = false;
      newline(depth + 1);
      if (object) {
        WriteJson(json(it.key()), depth + 1, out);
        out += ": ";
      }
      WriteJson(*it, depth + 1, out);
    }
    if (!first)
      newline(depth);
    out += object ? '}' : ']';
    return;
  }
  case json::value_t::string:
    out += '"';
    for (unsigned char c : j.get_ref<const std::string &>()) {
      if (c == '"' || c == '\\')
        out += '\\';
      if (c >= 0x20) {
        out += char(c);
        continue;
      }
      out += c == '\t' ? "\\t"
             : c == '\n' ? "\\n"
             : c == '\r' ? "\\r"
                         : absl::StrFormat("\\u%04x", c);
    }
    out += '"';
    return;
  case json::value_t::number_float:
    out += absl::StrFormat("%.17g", j.get<double>());
    return;
  default: // null, booleans, integers
    out += j.dump();
    return;
  }
}

/// The cluster file: its endpoints and token (the runtime's reader, as
/// duckrun reads it) and the whole document, to be written back.
struct Cluster {
  rt::ClusterFile file;
  json doc;
};

absl::StatusOr<Cluster> ReadCluster(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    return absl::NotFoundError(absl::StrCat(
        "cannot read cluster file '", path, "': ", std::strerror(errno)));
  const std::string text((std::istreambuf_iterator<char>(f)),
                         std::istreambuf_iterator<char>());
  Cluster c;
  auto file = rt::ParseClusterFile(text, path);
  if (!file.ok())
    return file.status();
  c.file = std::move(*file);
  c.doc = json::parse(text); // valid: ParseClusterFile read it
  return c;
}

/// The measured figures of every duck, and the client that asked them.
struct Measured {
  std::unique_ptr<rt::DuckClient> client;
  rt::MeasureOptions options;
  std::vector<rt::DuckRates> rates;
};

absl::StatusOr<Measured> MeasureDucks(const Cluster &c, const Names &names) {
  rt::DuckClientOptions co;
  co.read_environment = false;
  co.call_timeout = absl::Seconds(120);
  co.token = c.file.token;
  co.ducks = c.file.ducks;
  Measured m;
  auto client = rt::DuckClient::Create(co);
  if (!client.ok())
    return client.status();
  m.client = std::move(*client);
  rt::MeasureOptions &mo = m.options;
  mo.cores = absl::GetFlag(FLAGS_cores);
  mo.millis = absl::GetFlag(FLAGS_millis);
  mo.arena_bytes = uint64_t(absl::GetFlag(FLAGS_arena_mib)) << 20;
  mo.one_at_a_time = !absl::GetFlag(FLAGS_all_at_once);
  mo.busy_us = absl::GetFlag(FLAGS_busy_us);
  // With the duck ELF at hand, empty steps time the real dispatch path.
  if (auto elf = rt::ReadDuckElf(); elf.ok())
    mo.elf = std::move(*elf);
  else
    std::fprintf(stderr,
                 "%s: %s: step_overhead_us is the round trip of a ping, "
                 "without the hand-off to the duck's worker\n",
                 names.prog.c_str(),
                 std::string(elf.status().message()).c_str());
  std::fprintf(stderr, "%s: measuring %zu duck(s)%s\n", names.prog.c_str(),
               co.ducks.size(),
               mo.one_at_a_time ? ", one after another" : ", all at once");
  auto rates = m.client->Measure(mo);
  if (!rates.ok())
    return rates.status();
  m.rates = std::move(*rates);
  return m;
}

/// The cluster-wide figures the duck rows add up to.
struct Summary {
  double mean = 0;   // of the ducks' general128 rates
  bool same = false; // every duck within --same-within of the mean
  double minRead = 0, maxRtt = 0, maxLoad = 0, minGemm = 0;
};

/// Whether the ducks' general128 rates are equal up to --same-within
/// (noise, not a reason for unequal slices), and their mean.
void EqualDucks(const std::vector<rt::DuckRates> &rates, Summary &s) {
  std::vector<double> g128;
  for (const auto &r : rates)
    g128.push_back(r.gparam_s[DUCK_KERNEL_GENERAL128]);
  for (double v : g128)
    s.mean += v / g128.size();
  const double within = absl::GetFlag(FLAGS_same_within);
  s.same = within > 0 && std::all_of(g128.begin(), g128.end(), [&](double v) {
             return std::fabs(v - s.mean) <= within * s.mean;
           });
}

/// Writes each duck's figures into its entry of the file and prints its
/// row of the table.
void RecordDuck(const Measured &m, size_t i, json &d, Summary &s) {
  const rt::DuckRates &r = m.rates[i];
  const rt::DuckHello &h = m.client->hello(i);
  d["cores"] = int64_t(r.cores);
  if (!d.contains("memory_gib"))
    d["memory_gib"] = double(h.weights_capacity) / double(1ull << 30);
  d["read_gbs"] = r.read_gbs;
  d["fp9_gparam_s"] = s.same ? s.mean : r.gparam_s[DUCK_KERNEL_GENERAL128];
  json byKernel = json::object();
  for (uint32_t k = 0; k < DUCK_KERNEL_COUNT; ++k)
    if (r.gparam_s[k] > 0)
      byKernel[duck_kernel_name(duck_kernel_id(k))] = r.gparam_s[k];
  d["fp9_gparam_s_by_kernel"] = std::move(byKernel);
  if (r.gemm_gmac_s > 0)
    d["fp9_gemm_gmac_s"] = r.gemm_gmac_s;
  if (r.gemv_call_us > 0)
    d["gemv_call_us"] = r.gemv_call_us;
  s.minGemm = i ? std::min(s.minGemm, r.gemm_gmac_s) : r.gemm_gmac_s;
  d["rtt_us"] = r.rtt_us_p50;
  if (r.step_us_p50 > 0)
    d["empty_step_us"] = r.step_us_p50;
  s.minRead = i ? std::min(s.minRead, r.read_gbs) : r.read_gbs;
  s.maxRtt = std::max({s.maxRtt, r.step_us_p50, r.rtt_us_p50});
  if (!std::isnan(r.other_load))
    s.maxLoad = std::max(s.maxLoad, r.other_load);
  std::printf("%4zu  %-21s  %5u  %9s", i,
              m.client->endpoint(i).ToString().c_str(), r.cores,
              Fixed(r.read_gbs, 1).c_str());
  for (uint32_t k = 0; k < DUCK_KERNEL_COUNT; ++k)
    std::printf("  %10s", Fixed(r.gparam_s[k], 2).c_str());
  std::printf("  %11s  %7s  %7s/%-7s  %7s/%-7s  %6s cores\n",
              Fixed(r.gemm_gmac_s, 1).c_str(), Fixed(r.gemv_call_us, 1).c_str(),
              Fixed(r.rtt_us_p50, 0).c_str(), Fixed(r.rtt_us_p90, 0).c_str(),
              Fixed(r.step_us_p50, 0).c_str(), Fixed(r.step_us_p90, 0).c_str(),
              Fixed(r.other_load, 2).c_str());
}

/// --host: this machine's read bandwidth (the duck's own bench), the
/// runtime's MLA attention kernel, as it runs in duckrun: 128 heads over
/// 2048 cached latents, the heads split over every core, and the format
/// the host reads an FP8 checkpoint's matrices in.
void MeasureHost(json &root) {
  const uint32_t millis = absl::GetFlag(FLAGS_millis);
  duck::bench::DuckMeasureOptions ho;
  ho.cores = std::max(1u, std::thread::hardware_concurrency());
  ho.seconds = millis / 1e3;
  const double gbs = duck::bench::measureDuck(ho).read_gbs;
  rt::ThreadPool pool(ho.cores);
  const rt::MlaTiming mla = rt::TimeMlaAttend(
      pool, 2048, 32ull << 20, std::max(1u, (unsigned)millis / 30));
  const double gmac = mla.macs / mla.seconds * 1e-9;
  root["host_read_gbs"] = gbs;
  root["host_gmac_s"] = gmac;
  // How duckrun here reads an FP8 checkpoint's own matrices (the cost
  // model's host bytes a weight for them).
  const bool e4m3 = rt::HostReadsE4m3();
  root["host_fp8"] = e4m3 ? "e4m3" : "fp9";
  std::printf("host (this machine, %u cores): read %s GB/s, attention %s "
              "GMAC/s, FP8 matrices as %s\n",
              ho.cores, Fixed(gbs, 1).c_str(), Fixed(gmac, 1).c_str(),
              e4m3 ? "e4m3 (1 byte a weight)" : "fp9 (1.125 bytes)");
}

/// The "measured" block and the summary line.
void RecordSummary(const Measured &m, const Summary &s, const Names &names,
                   json &root) {
  const double within = absl::GetFlag(FLAGS_same_within);
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  root["measured"] = json{
      {"by", names.by},
      {"date", date},
      {"millis", int64_t(m.options.millis)},
      {"one_at_a_time", m.options.one_at_a_time},
      {"busy_elsewhere_cores_max", s.maxLoad},
      {"fp9_gparam_s",
       s.same ? "the mean of equal ducks" : "each duck's own"}};
  const std::string rates =
      s.same ? absl::StrFormat("%s for every duck (rates within %s%% of "
                               "their mean)",
                               Fixed(s.mean, 2), Fixed(within * 100, 0))
             : std::string("each duck's own");
  std::printf("fp9_gparam_s: %s; bandwidth_gbs %s (slowest duck), "
              "step_overhead_us %s (the slowest duck's gap: ping after %u us "
              "busy%s), fp9_gemm_gmac_s %s (slowest duck, 64-row prompt "
              "chunks)\n",
              rates.c_str(), Fixed(s.minRead, 1).c_str(),
              Fixed(s.maxRtt, 0).c_str(), m.options.busy_us,
              m.options.elf.empty() ? "" : ", or empty step",
              Fixed(s.minGemm, 1).c_str());
}

/// The host's time for one more frame to and from a duck (compile's cost
/// model counts one a duck for a staged MoE layer): what each duck beyond
/// the first adds to a ping sent to every duck at once, over one duck's
/// own ping (neither keeping a duck busy), halved. `host_frame_us` counts
/// the host thread's own CPU time (its syscalls, checks and seals);
/// `host_frame_wall_us` the wall time, which on a box whose ducks share
/// the host's cores also carries their CPU and wake-ups (an upper bound).
void RecordHostFrame(const Measured &m, json &root) {
  const size_t n = m.rates.size();
  if (n < 2 || m.rates[0].fan_rtt_us_p50 <= 0)
    return;
  const auto &r = m.rates[0];
  const double per = 1.0 / (2.0 * double(n - 1));
  const double wall =
      std::max(0.0, (r.fan_rtt_us_p50 - r.rtt_idle_us_p50) * per);
  const double cpu =
      std::max(0.0, (r.fan_cpu_us_p50 - r.cpu_idle_us_p50) * per);
  root["host_frame_us"] = cpu;
  root["host_frame_wall_us"] = wall;
  std::printf("host_frame_us %s (the host thread's CPU for a ping to all %zu "
              "ducks at once %s us against one duck's %s us; by the wall "
              "clock %s us a frame: %s against %s us)\n",
              Fixed(cpu, 2).c_str(), n, Fixed(r.fan_cpu_us_p50, 1).c_str(),
              Fixed(r.cpu_idle_us_p50, 1).c_str(), Fixed(wall, 2).c_str(),
              Fixed(r.fan_rtt_us_p50, 0).c_str(),
              Fixed(r.rtt_idle_us_p50, 0).c_str());
}

/// Writes `root` to `out` through a temporary file renamed over it.
absl::Status WriteAtomically(const json &root, const std::string &out) {
  const std::string tmp = absl::StrCat(out, ".tmp-", int64_t(::getpid()));
  std::string text;
  WriteJson(root, 0, text);
  text += "\n";
  std::FILE *f = std::fopen(tmp.c_str(), "w");
  if (!f)
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot write '", tmp, "': ", std::strerror(errno)));
  const bool written = std::fwrite(text.data(), 1, text.size(), f) ==
                       text.size();
  const bool closed = std::fclose(f) == 0;
  if (!closed || !written) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write '", tmp, "'"));
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot replace '", out, "': ",
                                            std::strerror(err)));
  }
  return absl::OkStatus();
}

/// --links: each duck's link alone and the host's port with every duck,
/// the slower way of each written where it could be timed.
absl::Status MeasureLinks(rt::DuckClient &client, json &root) {
  const uint32_t mib = absl::GetFlag(FLAGS_link_mib);
  rt::LinkProbeOptions o;
  o.bytes = uint64_t(mib) << 20;
  o.trips = std::max(1u, absl::GetFlag(FLAGS_link_trips));
  auto r = client.MeasureLinks(o);
  if (!r.ok())
    return absl::Status(
        r.status().code(),
        absl::StrCat("--links: ", r.status().message(),
                     absl::StrContains(r.status().message(), "wrong size")
                         ? " (a duckd from before the link probe answers "
                           "so: update it, or measure without --links)"
                         : ""));
  auto slower = [](double a, double b) {
    return a > 0 && b > 0 ? std::min(a, b) : 0.0;
  };
  json &ducks = root["ducks"];
  for (size_t i = 0; i < r->out_gbps.size(); ++i) {
    const double g = slower(r->out_gbps[i], r->in_gbps[i]);
    std::printf("link duck %zu: %.3f Gbit/s to it, %.3f from it (%u MiB, "
                "round trip without it %.0f us)%s\n",
                i, r->out_gbps[i], r->in_gbps[i], mib, r->empty_us,
                g > 0 ? "" : ": not timed, not written");
    if (g > 0)
      ducks[i]["link_gbps"] = g;
  }
  if (r->out_gbps.size() >= 2) {
    const double g = slower(r->all_out_gbps, r->all_in_gbps);
    std::printf("link host (every duck at once): %.3f Gbit/s out, %.3f "
                "in%s\n",
                r->all_out_gbps, r->all_in_gbps,
                g > 0 ? "" : ": not timed, not written");
    if (g > 0)
      root["host_link_gbps"] = g;
  }
  return absl::OkStatus();
}

/// The divisor of n between 1 and n closest to its square root (0: none).
uint32_t GroupsFor(uint32_t n) {
  uint32_t best = 0;
  for (uint32_t g = 2; g < n; ++g)
    if (n % g == 0 && (best == 0 || std::abs(double(g) - std::sqrt(n)) <
                                        std::abs(double(best) - std::sqrt(n))))
      best = g;
  return best;
}

/// One probe: the mean over ducks of a collective's CPU and wall time, us.
absl::StatusOr<std::pair<double, double>> Probe(rt::DuckClient &client,
                                                uint32_t groups) {
  duckd_mesh_probe_request r{};
  r.rounds = 400;
  r.values = 7168;
  r.groups = groups;
  r.wire = 1;
  auto rep = client.ProbeMesh(r);
  if (!rep.ok())
    return rep.status();
  double cpu = 0, wall = 0;
  for (const duckd_mesh_probe_reply &d : *rep) {
    cpu += 1e-3 * double(d.cpu_ns) / double(d.collectives);
    wall += 1e-3 * double(d.wall_ns) / double(d.collectives);
  }
  return std::make_pair(cpu / double(rep->size()), wall / double(rep->size()));
}

/// --mesh's transport and every duck's mesh listener, checked before
/// anything is measured.
absl::StatusOr<std::vector<rt::DuckEndpoint>> MeshEndpoints(const Cluster &c) {
  const std::string t = absl::GetFlag(FLAGS_mesh);
  if (t != "tcp" && t != "udp")
    return absl::InvalidArgumentError("--mesh must be tcp or udp");
  const size_t n = c.file.ducks.size();
  if (n < 2)
    return absl::InvalidArgumentError("--mesh needs at least 2 ducks");
  std::vector<rt::DuckEndpoint> mesh(n);
  for (size_t i = 0; i < n; ++i) {
    const json &d = c.doc["ducks"][i];
    if (!d.contains("mesh_port") || !d["mesh_port"].is_number_unsigned() ||
        d["mesh_port"].get<uint64_t>() == 0 ||
        d["mesh_port"].get<uint64_t>() > 65535)
      return absl::InvalidArgumentError(
          absl::StrCat("ducks[", i,
                       "] needs \"mesh_port\" (its duckd's --mesh-port) "
                       "for --mesh"));
    mesh[i] = {c.file.ducks[i].host, uint16_t(d["mesh_port"].get<uint64_t>())};
  }
  return mesh;
}

/// --mesh: the ducks join their mesh and time collectives in one exchange
/// and in groups; a line through the two message counts gives a call's
/// and a message's cost.
absl::Status MeasureMesh(const std::vector<rt::DuckEndpoint> &mesh,
                         rt::DuckClient &client, json &root) {
  const std::string t = absl::GetFlag(FLAGS_mesh);
  const uint32_t n = uint32_t(mesh.size());
  auto joined = client.JoinMesh(mesh, std::vector<float>(n, 1.0f),
                                uint64_t(absl::ToUnixNanos(absl::Now())), 1,
                                t == "udp" ? DUCKD_MESH_UDP : DUCKD_MESH_TCP);
  if (!joined.ok())
    return joined.status();
  auto one = Probe(client, 1);
  if (!one.ok())
    return one.status();
  const uint32_t g = GroupsFor(n);
  double call = one->first, message = 0;
  std::printf("mesh (%s, %u ducks): a collective of 7168 bf16 values in one "
              "exchange %.1f us of a duck's CPU (%.1f wall)",
              t.c_str(), n, one->first, one->second);
  if (g > 0) {
    auto two = Probe(client, g);
    if (!two.ok())
      return two.status();
    // c1 = C + (n-1) M; c2 = 2 C + (n/g - 1 + g - 1) M.
    const double k = double(n / g - 1 + g - 1);
    message =
        std::max(0.0, (2 * one->first - two->first) / (2.0 * (n - 1) - k));
    call = std::max(0.0, one->first - double(n - 1) * message);
    std::printf(", in %u groups %.1f (%.1f wall)", g, two->first, two->second);
  }
  std::printf(": mesh_call_us %.1f, mesh_message_us %.2f\n", call, message);
  root["mesh_call_us"] = call;
  root["mesh_message_us"] = message;
  root["mesh_transport"] = t;
  return absl::OkStatus();
}

absl::Status Run(const std::string &path, const Names &names) {
  auto cluster = ReadCluster(path);
  if (!cluster.ok())
    return cluster.status();
  json &root = cluster->doc;
  if (const uint32_t mib = absl::GetFlag(FLAGS_link_mib); mib < 1 || mib > 64)
    return absl::InvalidArgumentError(
        absl::StrCat("--link-mib must be 1 to 64, got ", mib));
  std::vector<rt::DuckEndpoint> mesh;
  if (!absl::GetFlag(FLAGS_mesh).empty()) {
    auto eps = MeshEndpoints(*cluster);
    if (!eps.ok())
      return eps.status();
    mesh = std::move(*eps);
  }
  auto measured = MeasureDucks(*cluster, names);
  if (!measured.ok())
    return measured.status();
  const Measured &m = *measured;

  Summary s;
  EqualDucks(m.rates, s);
  std::printf("duck  endpoint               cores  read GB/s");
  for (uint32_t k = 0; k < DUCK_KERNEL_COUNT; ++k)
    std::printf("  %10s", duck_kernel_name(duck_kernel_id(k)));
  std::printf("  GEMM GMAC/s  call us  ping p50/p90 us  step p50/p90 us  "
              "busy elsewhere\n");
  json &ducks = root["ducks"];
  for (size_t i = 0; i < m.rates.size(); ++i)
    RecordDuck(m, i, ducks[i], s);
  root["bandwidth_gbs"] = s.minRead;
  // The prompt rate's input (compile's cost model): the slowest duck's.
  if (s.minGemm > 0)
    root["fp9_gemm_gmac_s"] = s.minGemm;
  root["step_overhead_us"] = s.maxRtt;
  // Each duck's gap is its own ping's: the host's frames to the other
  // ducks of a step are host_frame_us's (compile adds them).
  root["step_overhead_ducks"] = 1;
  RecordHostFrame(m, root);
  if (absl::GetFlag(FLAGS_host))
    MeasureHost(root);
  if (absl::GetFlag(FLAGS_links))
    if (absl::Status st = MeasureLinks(*m.client, root); !st.ok())
      return st;
  if (!absl::GetFlag(FLAGS_mesh).empty())
    if (absl::Status st = MeasureMesh(mesh, *m.client, root); !st.ok())
      return st;
  RecordSummary(m, s, names, root);

  const std::string flagOut = absl::GetFlag(FLAGS_o);
  const std::string out = flagOut.empty() ? path : flagOut;
  if (absl::Status st = WriteAtomically(root, out); !st.ok())
    return st;
  std::printf("wrote %s\n", out.c_str());
  return absl::OkStatus();
}

/// duckc's options also came as -arena-mib (one dash): absl's parser takes
/// one-dash flags, duck::ToolFlags turns "-" into "_" only after "--".
std::vector<char *> TwoDashes(int argc, char **argv,
                              std::vector<std::string> &storage) {
  storage.assign(argv, argv + argc);
  std::vector<char *> out;
  bool flags = true;
  for (size_t i = 0; i < storage.size(); ++i) {
    std::string &a = storage[i];
    if (a == "--")
      flags = false;
    if (i > 0 && flags && a.size() > 2 && a[0] == '-' && a[1] != '-' &&
        std::isalpha((unsigned char)a[1]))
      a.insert(0, "-");
    out.push_back(a.data());
  }
  return out;
}

} // namespace

int main(int argc, char **argv) {
  const Names names = NamesFrom(argc > 0 ? argv[0] : nullptr);
  absl::SetProgramUsageMessage(kUsage);
  std::vector<std::string> storage;
  std::vector<char *> args = TwoDashes(argc, argv, storage);
  duck::ToolFlags flags((int)args.size(), args.data());
  const std::vector<char *> &pos = flags.positional();
  if (pos.size() != 2) {
    std::fprintf(stderr,
                 "%s: error: %s one <cluster.json> (see --help)\n",
                 names.prog.c_str(),
                 pos.size() < 2 ? "needs" : "takes only");
    return 1;
  }
  if (absl::Status st = Run(pos[1], names); !st.ok()) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", names.prog.c_str(),
                 std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
