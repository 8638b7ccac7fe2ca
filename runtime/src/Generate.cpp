//===- Generate.cpp - duckrun: plan + cluster + tokenizer -> text ---------===//
#include "duck/runtime/Generate.h"

#include "duck/runtime/Breakdown.h"

#include "duck/runtime/ClusterRunner.h"
#include "duck/runtime/LocalCluster.h"
#include "duck/runtime/Tokenizer.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <iostream>
#include <sstream>
#include <thread>
#include <sys/stat.h>
#include <unistd.h>

namespace duck::runtime {
namespace pl = ::duck::plan;

namespace {

std::atomic<bool> gInterrupted{false};

void onSignal(int) { gInterrupted.store(true); }

double now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::StatusOr<std::vector<uint8_t>> readFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
}

/// The cluster file duckrun reads (the same file duckc compile reads).
struct ClusterFile {
  std::vector<DuckEndpoint> ducks;
  std::string token;
  double bandwidth_gbs = 0; // the ducks' read bandwidth, if given
};

absl::StatusOr<ClusterFile> loadCluster(const std::string &path) {
  auto bytes = readFile(path);
  if (!bytes.ok())
    return bytes.status();
  nlohmann::json j = nlohmann::json::parse(bytes->begin(), bytes->end(),
                                           nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return absl::InvalidArgumentError(
        absl::StrCat("cluster file '", path, "' is not valid JSON"));
  if (!j.is_object())
    return absl::InvalidArgumentError(
        absl::StrCat("cluster file '", path, "' is not a JSON object"));
  ClusterFile c;
  if (j.contains("token") && j["token"].is_string())
    c.token = j["token"].get<std::string>();
  if (j.contains("bandwidth_gbs") && j["bandwidth_gbs"].is_number())
    c.bandwidth_gbs = j["bandwidth_gbs"].get<double>();
  if (!j.contains("ducks") || !j["ducks"].is_array() || j["ducks"].empty())
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster file '", path, "' needs a non-empty \"ducks\" array of "
        "{\"host\": ..., \"port\": ...}"));
  for (size_t i = 0; i < j["ducks"].size(); ++i) {
    const nlohmann::json &d = j["ducks"][i];
    if (!d.is_object() || !d.contains("host") || !d["host"].is_string() ||
        !d.contains("port") || !d["port"].is_number_integer())
      return absl::InvalidArgumentError(absl::StrCat(
          "cluster file '", path, "': ducks[", i,
          "] needs \"host\" (string) and \"port\" (integer)"));
    auto ep = ParseDuckEndpoint(absl::StrCat(d["host"].get<std::string>(), ":",
                                             d["port"].get<int>()));
    if (!ep.ok())
      return absl::InvalidArgumentError(absl::StrCat(
          "cluster file '", path, "': ducks[", i, "]: ", ep.status().message()));
    c.ducks.push_back(*ep);
  }
  return c;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, (size_t)(p * (v.size() - 1) + 0.5));
  return v[i];
}

std::string CacheBase() {
  const char *cache = std::getenv("XDG_CACHE_HOME");
  const char *home = std::getenv("HOME");
  return absl::StrCat(
      cache ? cache : absl::StrCat(home ? home : "/tmp", "/.cache"), "/duck");
}

/// This machine's read bandwidth with `threads` threads: measured once
/// (~0.2 s) and kept in the cache directory.
double HostReadBandwidthGbs(unsigned threads) {
  const std::string path =
      absl::StrCat(CacheBase(), "/host-read-bw-", threads, "threads");
  {
    std::ifstream in(path);
    double gbs = 0;
    if (in >> gbs && gbs > 0)
      return gbs;
  }
  ThreadPool pool(threads);
  const double gbs = MeasureReadBandwidthGbs(pool);
  std::error_code ec;
  std::filesystem::create_directories(CacheBase(), ec);
  std::ofstream out(path + ".tmp");
  out << gbs << "\n";
  if (out.good()) {
    out.close();
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
  return gbs;
}

/// After a failed step: restarts the local ducks that died (all of them
/// when none did: one is hung), then connects, prepares through the weight
/// cache and opens the ELF again, retrying with backoff until `budget`
/// has passed.
absl::StatusOr<std::unique_ptr<DuckClient>>
RecoverDucks(const absl::Status &why, DuckClientOptions &co,
             LocalCluster *local, const std::vector<std::string> &images,
             const std::vector<uint8_t> &elf, absl::Duration budget, bool quiet,
             std::ostream &err) {
  if (!quiet)
    err << "\nduckrun: " << why.message() << "; bringing the ducks back\n";
  const absl::Time start = absl::Now(), deadline = start + budget;
  absl::Duration wait = absl::Milliseconds(100);
  absl::Status last = why;
  for (int attempt = 1;; ++attempt) {
    if (local) {
      std::vector<size_t> dead;
      for (size_t i = 0; i < local->endpoints().size(); ++i)
        if (local->Exited(i))
          dead.push_back(i);
      if (dead.empty()) // a hung duck: restart them all
        for (size_t i = 0; i < local->endpoints().size(); ++i)
          dead.push_back(i);
      for (size_t i : dead)
        if (absl::Status s = local->Restart(i); !s.ok())
          last = s;
      co.ducks = local->endpoints();
    }
    auto client = DuckClient::Create(co);
    absl::StatusOr<PrepareReport> prep =
        client.ok() ? (*client)->Prepare(images) : client.status();
    absl::Status open = prep.ok() ? (*client)->Open(elf) : prep.status();
    if (open.ok()) {
      uint64_t uploaded = 0;
      for (uint64_t b : prep->bytes_uploaded)
        uploaded += b;
      if (!quiet)
        err << absl::StrFormat(
            "duckrun: ducks back after %.2f s (attempt %d, %llu bytes "
            "uploaded); resending the step\n",
            absl::ToDoubleSeconds(absl::Now() - start), attempt,
            (unsigned long long)uploaded);
      return std::move(*client);
    }
    last = open;
    if (absl::Now() + wait > deadline)
      return absl::UnavailableError(absl::StrCat(
          "gave up after ", absl::ToDoubleSeconds(absl::Now() - start),
          " s of trying to bring the ducks back (", attempt,
          " attempts): ", last.message()));
    absl::SleepFor(wait);
    wait = std::min(wait * 2, absl::Seconds(2));
  }
}

/// DUCK_TEST_KILL_DUCK="STEP:DUCK": SIGKILL local duck DUCK before duck
/// step STEP (fault injection for the tests).
std::function<void(uint64_t)> KillDuckAt(const char *spec,
                                         LocalCluster *local) {
  uint64_t step = 0, duck = 0;
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &step) ||
      !absl::SimpleAtoi(parts[1], &duck))
    return nullptr;
  return [=](uint64_t index) {
    if (index == step)
      (void)local->Kill(duck, SIGKILL);
  };
}

/// Milliseconds a token by op kind (as JSON, and "Kind ms" strings).
nlohmann::json OpBreakdown(const Engine::OpTimes &t,
                           std::vector<std::string> *out_text) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t k = 1; k < t.seconds.size() && t.tokens; ++k) {
    if (t.seconds[k] == 0)
      continue;
    std::string name = pl::EnumNameOpParams((pl::OpParams)k);
    name = name.substr(0, name.size() - 5); // drop "OpDef"
    const double ms = 1e3 * t.seconds[k] / t.tokens;
    j[name] = ms;
    out_text->push_back(absl::StrFormat("%s %.3f", name, ms));
  }
  return j;
}

} // namespace

void InstallInterruptHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

absl::Status Generate(const GenerateOptions &o, std::ostream &out,
                      std::ostream &err) {
  const double tStart = now();
  PlanLoadOptions lo;
  lo.verify_weight_checksums = o.verify_weights;
  auto plan = LoadedPlan::Load(o.plan_dir, lo);
  if (!plan.ok())
    return plan.status();
  const pl::PlanDef &def = (*plan)->def();
  const pl::ModelDef &model = *def.model();

  // Tokenizer (not needed when ids are given).
  std::unique_ptr<Tokenizer> tok;
  std::string tokPath =
      o.tokenizer_path.empty() ? (*plan)->TokenizerPath() : o.tokenizer_path;
  if (!tokPath.empty()) {
    auto t = Tokenizer::Create(tokPath);
    if (!t.ok())
      return t.status();
    tok = std::move(*t);
  } else if (o.prompt_ids.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no tokenizer.json next to the checkpoint (",
        def.checkpoint_dir() ? def.checkpoint_dir()->str() : "?",
        "); pass --tokenizer FILE or --prompt-ids"));
  }
  std::vector<int32_t> prompt = o.prompt_ids;
  if (prompt.empty()) {
    std::string text = o.prompt;
    if (o.chat)
      text = absl::StrCat("<|im_start|>user\n", o.prompt,
                          "<|im_end|>\n<|im_start|>assistant\n");
    prompt = tok->Encode(text, /*allow_special=*/o.chat);
  }
  if (prompt.empty())
    return absl::InvalidArgumentError("the prompt is empty");
  uint32_t maxSeq = o.max_seq ? o.max_seq
                              : std::min<uint32_t>(model.max_position()
                                                       ? model.max_position()
                                                       : 4096,
                                                   4096);
  if (prompt.size() + 1 > maxSeq)
    return absl::OutOfRangeError(absl::StrCat(
        "the prompt has ", prompt.size(), " tokens but --max-seq is ", maxSeq,
        "; shorten the prompt or raise --max-seq"));

  // Ducks: a cluster file, or a local embedded cluster of tp ducks.
  const uint32_t tp = def.tp();
  double duckReadGbs = 0; // the cluster file's; 0: the host's (one box)
  std::unique_ptr<LocalCluster> local;
  DuckClientOptions co;
  co.persistent = o.persistent;
  if (!o.cluster_file.empty()) {
    auto c = loadCluster(o.cluster_file);
    if (!c.ok())
      return c.status();
    if (c->ducks.size() != tp)
      return absl::InvalidArgumentError(absl::StrCat(
          "the plan was compiled for ", tp, " ducks but cluster file '",
          o.cluster_file, "' lists ", c->ducks.size()));
    co.ducks = c->ducks;
    co.token = c->token;
    duckReadGbs = c->bandwidth_gbs;
  } else {
    LocalClusterOptions lc;
    lc.ducks = tp;
    unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    if (o.cores_per_duck > hw)
      return absl::InvalidArgumentError(absl::StrCat(
          "--cores-per-duck ", o.cores_per_duck, " is more than this "
          "machine's ", hw, " cores (a local duck runs one worker a core)"));
    lc.cores = o.cores_per_duck ? o.cores_per_duck : std::max(1u, hw / tp);
    lc.pin = (uint64_t)lc.cores * tp <= hw;
    uint64_t maxImage = 0;
    for (const pl::DuckDef *d : *def.ducks())
      maxImage = std::max<uint64_t>(maxImage, d->image_bytes());
    lc.weights_size = (maxImage + (1ull << 24)) / 4096 * 4096 + 4096;
    lc.cache_dir = absl::StrCat(CacheBase(), "/duckrun");
    lc.name_prefix = "duck";
    // The daemons' logs go to files, so they do not mix with the output.
    lc.log_dir = lc.cache_dir + "/logs";
    std::error_code ec;
    std::filesystem::create_directories(lc.log_dir, ec);
    if (ec)
      return absl::InternalError(absl::StrCat(
          "cannot create the duck cache directory '", lc.log_dir,
          "': ", ec.message()));
    lc.duckd_path = o.duckd_path;
    if (!o.quiet)
      err << absl::StrFormat("duckrun: starting %u local ducks x %u cores\n",
                             tp, lc.cores);
    auto started = LocalCluster::Start(lc);
    if (!started.ok())
      return started.status();
    local = std::move(*started);
    co.ducks = local->endpoints();
    co.cores = lc.cores;
  }

  // Scratch and buffer sizes for the largest step of this plan.
  uint64_t maxInter = 0, maxExperts = 1, maxK = 0;
  for (const pl::DuckDef *d : *def.ducks())
    for (const pl::SlotDef *s : *d->slots()) {
      maxInter = std::max<uint64_t>(maxInter, s->inter_end() - s->inter_begin());
      maxExperts = std::max<uint64_t>(maxExperts, s->expert_end());
    }
  for (const pl::OpDef *op : *def.ops())
    if (const pl::MoeFfnOpDef *moe = op->params_as_MoeFfnOpDef()) {
      maxK = std::max<uint64_t>(maxK, moe->top_k() + moe->num_shared());
      maxExperts = std::max<uint64_t>(maxExperts,
                                      moe->num_experts() + moe->num_shared());
    }
  const uint32_t chunk = std::max(1u, o.prefill_chunk);
  uint32_t cores = co.cores ? co.cores : 64;
  co.scratch_bytes = duck_step_scratch_bytes(model.hidden(), maxInter, chunk,
                                             maxK, maxExperts, cores);
  co.ib_limit = 4096 + (uint64_t)chunk * (maxK * 8 + model.hidden() * 4 + 64);
  co.ob_limit = co.ib_limit;
  // Spinning for a step's replies saves the host's wake-up (duck-bench
  // judge, one duck, loopback: gap p50 63 -> 11 us) but holds a core; on
  // one box it gained nothing end to end (docs/perf.md), so it is opt-in.
  co.reply_spin = absl::Microseconds(std::max(0, o.reply_spin_us));
  auto created = DuckClient::Create(co);
  if (!created.ok())
    return created.status();
  std::unique_ptr<DuckClient> client = std::move(*created);

  // Weights through the cache.
  std::vector<std::string> images;
  for (uint32_t r = 0; r < tp; ++r)
    images.push_back((*plan)->ImagePath(r));
  PrepareOptions po;
  po.invalidate = o.invalidate_cache;
  if (!o.quiet)
    po.progress = [&](const PrepareProgress &p) {
      if (p.bytes_total == 0)
        return; // every duck is a cache hit: nothing to upload
      err << absl::StrFormat(
          "\rduckrun: prepare %.1f / %.1f MiB, %.0f MB/s, ETA %.0f s   ",
          p.bytes_done / 1048576.0, p.bytes_total / 1048576.0,
          p.bytes_per_second / 1e6, p.eta_seconds);
      err.flush();
    };
  auto prep = client->Prepare(images, po);
  if (!prep.ok())
    return prep.status();
  if (gInterrupted.load())
    return absl::CancelledError("interrupted");
  if (!o.quiet) {
    std::vector<std::string> what;
    for (size_t r = 0; r < prep->result.size(); ++r)
      what.push_back(absl::StrCat(
          "duck ", r, " ",
          prep->result[r] == DUCKD_CACHE_HIT ? "hit"
          : prep->result[r] == DUCKD_CACHE_MISS ? "miss"
                                                : "partial",
          prep->bytes_uploaded[r] ? absl::StrCat(" (", prep->bytes_uploaded[r],
                                                 " bytes)")
                                  : ""));
    err << absl::StrFormat("\rduckrun: weight cache: %s (%.2f s)\n",
                           absl::StrJoin(what, ", "), prep->seconds);
  }
  const std::string elfPath = DefaultElfPath();
  auto elf = readFile(elfPath);
  if (!elf.ok())
    return absl::NotFoundError(absl::StrCat(
        "cannot read the duck ELF '", elfPath, "' (set DUCK_ELF)"));
  if (absl::Status s = client->Open(*elf); !s.ok())
    return s;

  ClusterFfnRunner runner(**plan, client.get());
  // A duck that dies, hangs or drops its connection mid-generation is
  // brought back (a local duck is restarted; its weight cache file makes
  // the new prepare a hit) and the step is sent again.
  if (o.recover_seconds > 0)
    runner.SetRecover([&](const absl::Status &why)
                          -> absl::StatusOr<DuckClient *> {
    client.reset(); // close the old connections first: no duck stays busy
    auto fresh = RecoverDucks(why, co, local.get(), images, *elf,
                              absl::Seconds(o.recover_seconds), o.quiet, err);
    if (!fresh.ok())
      return fresh.status();
    client = std::move(*fresh);
    return client.get();
  });
  if (local)
    if (const char *k = std::getenv("DUCK_TEST_KILL_DUCK"))
      runner.SetBeforeStep(KillDuckAt(k, local.get()));
  EngineOptions eo;
  eo.max_seq = maxSeq;
  eo.threads = o.threads ? o.threads
                         : std::max(1u, std::thread::hardware_concurrency());
  eo.prefill_chunk = chunk;
  eo.all_logits = !o.logits_out.empty();
  auto engine = Engine::Create(**plan, &runner, eo);
  if (!engine.ok())
    return engine.status();

  // --logits-out: every prompt position's logits, then every generated
  // token's (vocab float32 each, in order).
  std::ofstream logitsFile;
  if (!o.logits_out.empty()) {
    logitsFile.open(o.logits_out, std::ios::binary | std::ios::trunc);
    if (!logitsFile)
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write '", o.logits_out, "'"));
  }
  const uint32_t V = (*engine)->vocab();
  auto keepLogits = [&](const std::vector<float> &l) {
    if (logitsFile.is_open())
      logitsFile.write(reinterpret_cast<const char *>(l.data()),
                       l.size() * 4);
  };
  auto lastRow = [&](const std::vector<float> &l) {
    return absl::MakeConstSpan(l).subspan(l.size() - V, V);
  };

  // Prefill.
  std::vector<float> logits;
  const double tPrefill = now();
  // The prompt goes in chunk by chunk so Ctrl-C is noticed between steps.
  for (size_t i = 0; i < prompt.size(); i += chunk) {
    if (gInterrupted.load())
      return absl::CancelledError("interrupted");
    auto part = absl::MakeConstSpan(prompt).subspan(
        i, std::min<size_t>(chunk, prompt.size() - i));
    absl::Status st = o.decode_only
                          ? (*engine)->ForwardDecodeOnly(part, &logits)
                          : (*engine)->Forward(part, &logits);
    if (!st.ok())
      return st;
    keepLogits(logits);
  }
  const double prefillS = now() - tPrefill;

  // Decode.
  std::vector<int32_t> eos;
  if (model.eos_tokens())
    eos.assign(model.eos_tokens()->begin(), model.eos_tokens()->end());
  if (tok && o.chat)
    if (int32_t id = tok->TokenId("<|im_end|>"); id >= 0)
      eos.push_back(id);
  Sampler sampler(o.sampler);
  std::vector<int32_t> generated;
  std::unique_ptr<StreamDecoder> stream;
  const bool text = tok && !o.print_ids;
  if (text)
    stream = std::make_unique<StreamDecoder>(*tok);
  std::vector<double> tokenTimes;
  int32_t next = sampler.Sample(lastRow(logits));
  while (generated.size() < o.max_tokens) {
    if (gInterrupted.load())
      return absl::CancelledError("interrupted");
    generated.push_back(next);
    // Text or ids go out as they are made: an error later loses nothing
    // already produced.
    if (stream && o.stream) {
      out << stream->Push(next);
      out.flush();
    } else if (!text && o.stream) {
      out << (generated.size() > 1 ? " " : "") << next;
      out.flush();
    }
    if (o.stop_at_eos && std::find(eos.begin(), eos.end(), next) != eos.end())
      break;
    if (generated.size() >= o.max_tokens ||
        (*engine)->position() + 1 > maxSeq)
      break;
    double t0 = now();
    int32_t in = next;
    if (absl::Status s = (*engine)->Forward(absl::MakeConstSpan(&in, 1), &logits);
        !s.ok())
      return s;
    tokenTimes.push_back(now() - t0);
    keepLogits(logits);
    next = sampler.Sample(lastRow(logits));
  }
  if (logitsFile.is_open() && !logitsFile.flush())
    return absl::InternalError(
        absl::StrCat("cannot write '", o.logits_out, "'"));
  if (stream && o.stream)
    out << stream->Flush();
  if (text && !o.stream)
    out << tok->Decode(generated);
  if (!text && !o.stream)
    out << absl::StrJoin(generated, " ");
  out << "\n";
  out.flush();

  // Summary.
  const RunnerStats &rs = runner.stats();
  std::vector<double> gaps, ratios;
  for (const StepMetrics &m : rs.decode_steps) {
    gaps.push_back(m.judge_gap_us);
    ratios.push_back(m.judge_ratio);
  }
  double decodeTokS = tokenTimes.empty() ? 0 : tokenTimes.size() /
                         std::max(1e-9, std::accumulate(tokenTimes.begin(),
                                                        tokenTimes.end(), 0.0));
  double tpotMs = tokenTimes.empty() ? 0 : 1e3 / decodeTokS;
  nlohmann::json sj;
  sj["prompt_tokens"] = prompt.size();
  sj["generated_tokens"] = generated.size();
  sj["generated_ids"] = generated;
  sj["prefill_s"] = prefillS;
  sj["prefill_tok_s"] = prefillS > 0 ? prompt.size() / prefillS : 0;
  sj["decode_tok_s"] = decodeTokS;
  sj["tpot_ms"] = tpotMs;
  sj["judge_gap_us_p50"] = percentile(gaps, 0.5);
  sj["judge_gap_us_p99"] = percentile(gaps, 0.99);
  sj["judge_ratio_p50"] = percentile(ratios, 0.5);
  sj["judge_ratio_p99"] = percentile(ratios, 0.99);
  sj["kv_bytes_per_token"] = (*engine)->kv_bytes_per_token();
  // Where a decoded token's time goes, by op kind (FFN kinds: routing on
  // the host plus the wait for the ducks).
  const double hostReadGbs = tokenTimes.empty() ? 0 : HostReadBandwidthGbs(eo.threads);
  const DecodeBreakdown bd = ComputeDecodeBreakdown(
      **plan, **engine, rs, tpotMs, hostReadGbs,
      duckReadGbs > 0 ? duckReadGbs : hostReadGbs, local != nullptr);
  sj["decode_breakdown_ms"] = {
      {"host_attention", bd.host_attention_ms},
      {"host_norms_router", bd.host_norms_router_ms},
      {"lm_head", bd.lm_head_ms},
      {"duck_kernel", bd.duck_kernel_ms},
      {"dispatch_gap", bd.dispatch_gap_ms},
      {"other", bd.other_ms}};
  sj["host_bytes_per_token"] = bd.host_bytes;
  sj["duck_bytes_per_token"] = bd.duck_bytes_total;
  sj["duck_bytes_per_token_max"] = bd.duck_bytes_max;
  sj["host_read_gb_s"] = bd.host_read_gbs;
  sj["duck_read_gb_s"] = bd.duck_read_gbs;
  sj["decode_bound_ms"] = bd.bound_ms;
  sj["decode_bound_fraction"] = bd.decode_bound_fraction;
  std::vector<std::string> byOp, byOpPrefill;
  sj["decode_ms_per_token_by_op"] =
      OpBreakdown((*engine)->decode_times(), &byOp);
  sj["prefill_ms_per_token_by_op"] =
      OpBreakdown((*engine)->prefill_times(), &byOpPrefill);
  sj["decode_steps"] = rs.decode_steps.size();
  sj["prefill_steps"] = rs.prefill_steps.size();
  sj["ducks"] = tp;
  sj["persistent"] = client->persistent();
  sj["recoveries"] = runner.recoveries();
  std::vector<double> gps;
  for (size_t r = 0; r < rs.params.size(); ++r)
    gps.push_back(rs.kernel_ns[r] > 0 ? rs.params[r] / rs.kernel_ns[r] : 0);
  sj["duck_kernel_gparam_s"] = gps;
  sj["total_s"] = now() - tStart;
  if (!o.summary_json.empty()) {
    std::ofstream f(o.summary_json);
    f << sj.dump(2) << "\n";
    if (!f)
      return absl::InternalError(
          absl::StrCat("cannot write '", o.summary_json, "'"));
  }
  if (!o.quiet) {
    err << absl::StrFormat(
        "duckrun: prompt %zu tokens, prefill %.1f tok/s; generated %zu tokens, "
        "decode %.2f tok/s, TPOT %.2f ms\n",
        prompt.size(), (double)sj["prefill_tok_s"], generated.size(),
        decodeTokS, tpotMs);
    err << absl::StrFormat(
        "duckrun: judge_gap p50 %.1f us, p99 %.1f us; judge_ratio p50 %.3f, "
        "p99 %.3f (%zu decode steps, %s)\n",
        percentile(gaps, 0.5), percentile(gaps, 0.99), percentile(ratios, 0.5),
        percentile(ratios, 0.99), rs.decode_steps.size(),
        client->persistent() ? "persistent" : "per-step run");
    std::vector<std::string> per;
    for (size_t r = 0; r < gps.size(); ++r)
      per.push_back(absl::StrFormat("duck %zu %.2f", r, gps[r]));
    err << "duckrun: kernel Gparam/s: " << absl::StrJoin(per, ", ") << "\n";
    err << absl::StrFormat("duckrun: KV cache %.1f KiB a token (host)\n",
                           (*engine)->kv_bytes_per_token() / 1024.0);
    if (!tokenTimes.empty())
      err << FormatDecodeBreakdown(bd);
    if (!byOp.empty())
      err << "duckrun: decode ms a token by op: " << absl::StrJoin(byOp, ", ")
          << "\n";
    if (!byOpPrefill.empty())
      err << "duckrun: prefill ms a token by op: "
          << absl::StrJoin(byOpPrefill, ", ") << "\n";
  }
  (void)client->Close();
  if (local)
    (void)local->Stop();
  return absl::OkStatus();
}

} // namespace duck::runtime
