//===- Session.cpp - a plan, its ducks and an engine, ready to run --------===//
#include "duck/runtime/session/Session.h"
#include "duck/runtime/cluster/ClusterFile.h"
#include "duck/runtime/cluster/Recovery.h"
#include "duck/runtime/StatusMacros.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <netinet/in.h>
#include <ostream>
#include <sstream>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace duck::runtime {
namespace pl = ::duck::plan;

/// DUCK_TEST_KILL_DUCK, fault injection for the tests: "STEP:DUCK[:STOP]"
/// SIGKILLs local duck DUCK before duck step STEP (with STOP it freezes
/// it instead: SIGSTOP, a hung duck; with EVERY it kills it again before
/// every resend of that step: a step that always fails); "STEP:pid=PID"
/// SIGKILLs process PID
/// (a cluster file's duckd that the test started itself). A test that
/// asks for a fault must get it: a bad spec fails the start, and a kill
/// that did not happen (the step never reached, the signal refused) fails
/// the run (Session::CheckTestFault).
struct Session::TestFault {
  std::string spec;
  uint64_t step = 0;
  size_t duck = 0;
  pid_t pid = 0; // > 0: kill this process, not a local duck
  bool stop = false;
  bool every = false; // before each attempt of the step, not only the first
  bool fired = false;
  absl::Status error;
};

absl::Status Session::ArmTestFault(const char *spec) {
  auto f = std::make_shared<TestFault>();
  f->spec = spec;
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DUCK_TEST_KILL_DUCK='", spec, "': ", why,
        " (expected STEP:DUCK, STEP:DUCK:STOP, STEP:DUCK:EVERY or "
        "STEP:pid=PID)"));
  };
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  if (parts.size() < 2 || parts.size() > 3 ||
      !absl::SimpleAtoi(parts[0], &f->step))
    return bad("not a step and a target");
  if (absl::StartsWith(parts[1], "pid=")) {
    int pid = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[1].substr(4), &pid) ||
        pid <= 0)
      return bad("bad pid");
    f->pid = pid;
  } else {
    if (!absl::SimpleAtoi(parts[1], &f->duck))
      return bad("bad duck index");
    if (parts.size() == 3 && parts[2] != "STOP" && parts[2] != "EVERY")
      return bad(absl::StrCat("unknown action '", parts[2], "'"));
    f->stop = parts.size() == 3 && parts[2] == "STOP";
    f->every = parts.size() == 3 && parts[2] == "EVERY";
    if (!local_)
      return bad("a duck index needs local ducks (a cluster file's duck is "
                 "killed by pid)");
    if (f->duck >= local_->endpoints().size())
      return bad(absl::StrCat("there are ", local_->endpoints().size(),
                              " local ducks"));
  }
  LocalCluster *local = local_.get();
  runner_->SetBeforeStep([f, local](uint64_t index) {
    if (index != f->step || (f->fired && !f->every))
      return;
    f->fired = true;
    if (f->pid > 0) {
      if (::kill(f->pid, SIGKILL) != 0)
        f->error = absl::ErrnoToStatus(errno, absl::StrCat("kill ", f->pid));
    } else if (f->stop) {
      local->Signal(f->duck, SIGSTOP);
    } else {
      f->error = local->Kill(f->duck, SIGKILL);
    }
  });
  fault_ = std::move(f);
  return absl::OkStatus();
}

absl::Status Session::CheckTestFault() const {
  if (!fault_)
    return absl::OkStatus();
  if (!fault_->fired)
    return absl::FailedPreconditionError(absl::StrCat(
        "DUCK_TEST_KILL_DUCK='", fault_->spec, "': step ", fault_->step,
        " was never reached (the run sent ", runner_->steps(),
        " duck steps); nothing was killed"));
  if (!fault_->error.ok())
    return absl::InternalError(absl::StrCat("DUCK_TEST_KILL_DUCK='",
                                            fault_->spec, "': the kill failed: ",
                                            fault_->error.message()));
  return absl::OkStatus();
}

namespace {
} // namespace

std::string CacheBase() {
  const char *cache = std::getenv("XDG_CACHE_HOME");
  const char *home = std::getenv("HOME");
  return absl::StrCat(
      cache ? cache : absl::StrCat(home ? home : "/tmp", "/.cache"), "/duck");
}

/// This machine's read bandwidth with `threads` threads: measured once
/// (~0.5 s) and kept in the cache directory. The name says the set: files
/// of the 256 MiB measure (before 2026-12-07) are not read.
double HostReadBandwidthGbs(unsigned threads) {
  const std::string path =
      absl::StrCat(CacheBase(), "/host-read-bw-1gib-", threads, "threads");
  {
    std::ifstream in(path);
    double gbs = 0;
    if (in >> gbs && gbs > 0)
      return gbs;
  }
  ThreadPool pool(threads);
  // A quarter of the memory available now at most (256 MiB at least), so
  // the measure never pushes a loaded host into swap.
  const uint64_t available = MemAvailableBytes();
  const double gbs = MeasureReadBandwidthGbs(
      pool, available ? std::max<uint64_t>(256ull << 20, available / 4)
                      : ~uint64_t(0));
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

absl::StatusOr<std::unique_ptr<Session>>
Session::Create(const SessionOptions &o, std::ostream &log) {
  auto s = Load(o);
  if (!s.ok())
    return s.status();
  if (absl::Status st = (*s)->Start(log); !st.ok())
    return st; // the destructor stops what was started
  return s;
}

absl::StatusOr<std::unique_ptr<Session>>
Session::Load(const SessionOptions &o) {
  std::unique_ptr<Session> s(new Session());
  s->opts_ = o;
  PlanLoadOptions lo;
  lo.verify_weight_checksums = o.verify_weights;
  DUCK_ASSIGN_OR_RETURN(s->plan_,
                        LoadedPlan::Load(o.plan_dir, HostOpKinds(), lo));
  const pl::PlanDef &def = s->plan_->def();
  const std::filesystem::path dir =
      std::filesystem::path(o.plan_dir).lexically_normal();
  s->name_ = dir.filename().string();
  if (s->name_.empty()) // "plan/"
    s->name_ = dir.parent_path().filename().string();
  std::string tokPath =
      o.tokenizer_path.empty() ? s->plan_->TokenizerPath() : o.tokenizer_path;
  if (!tokPath.empty()) {
    DUCK_ASSIGN_OR_RETURN(s->tok_, Tokenizer::Create(tokPath));
    s->chat_format_ = ChooseChatFormat(*s->tok_, s->model().family() ==
                                                     pl::Family::DeepSeekV32);
    // tokenizer_config.json beside it says whether a prompt starts with
    // the BOS (DeepSeek's does; Qwen3's does not).
    const std::filesystem::path cfg =
        std::filesystem::path(tokPath).parent_path() / "tokenizer_config.json";
    std::string cfgText;
    if (std::ifstream in(cfg); in) {
      std::ostringstream buf;
      buf << in.rdbuf();
      cfgText = buf.str();
    }
    DUCK_ASSIGN_OR_RETURN(s->prompt_prefix_,
                          PromptPrefixIds(cfgText, cfg.string(), *s->tok_));
    // Its chat_template, when Duck can parse it; else the built-in format.
    if (auto t = CheckpointTemplate::FromConfig(cfgText, cfg.string()); t.ok())
      s->chat_template_ = std::move(*t);
    else
      s->template_note_ = absl::StrCat(
          t.status().message(), "; chats use the built-in ",
          std::string(ChatFormatName(s->chat_format_)), " format instead");
  } else if (o.need_tokenizer) {
    return absl::FailedPreconditionError(
        absl::StrCat("no tokenizer.json next to the checkpoint (",
                     def.checkpoint_dir() ? def.checkpoint_dir()->str() : "?",
                     "); pass --tokenizer FILE or --prompt-ids"));
  }
  const pl::ModelDef &model = *def.model();
  if (o.max_seq && model.max_position() && o.max_seq > model.max_position())
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-seq ", o.max_seq, " is beyond the ", model.max_position(),
        " positions the model was made for (config.json's "
        "max_position_embeddings)"));
  s->max_seq_ =
      o.max_seq ? o.max_seq
                : std::min<uint32_t>(
                      model.max_position() ? model.max_position() : 4096, 4096);
  return s;
}

Session::~Session() { Close(); }

void Session::Close() {
  engine_.reset();
  runner_.reset();
  if (client_)
    (void)client_->Close();
  client_.reset();
  if (local_)
    (void)local_->Stop();
  local_.reset();
}

uint32_t Session::ducks() const { return plan_->def().tp(); }

absl::StatusOr<std::vector<int32_t>>
Session::EncodePrompt(const std::string &text) const {
  if (!tok_)
    return absl::FailedPreconditionError(
        "this plan has no tokenizer (pass --tokenizer FILE)");
  std::vector<int32_t> ids = prompt_prefix_;
  const std::vector<int32_t> body = tok_->Encode(text, /*allow_special=*/false);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

std::vector<int32_t> Session::StopTokens(bool chat) const {
  std::vector<int32_t> eos;
  if (model().eos_tokens())
    eos.assign(model().eos_tokens()->begin(), model().eos_tokens()->end());
  if (tok_ && chat && chat_format_ != ChatFormat::kNone)
    if (int32_t id = tok_->TokenId(ChatEndToken(chat_format_));
        id >= 0 && std::find(eos.begin(), eos.end(), id) == eos.end())
      eos.push_back(id);
  return eos;
}

absl::StatusOr<std::vector<int32_t>>
Session::EncodeChat(absl::Span<const ChatMessage> messages) const {
  if (!tok_)
    return absl::FailedPreconditionError(
        "this plan has no tokenizer (pass --tokenizer FILE)");
  if (chat_template_) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const ChatMessage &m : messages)
      list.push_back({{"role", m.role}, {"content", m.content}});
    return EncodeChatTemplate(list, ChatTemplateArgs());
  }
  DUCK_ASSIGN_OR_RETURN(std::string text, RenderChat(chat_format_, messages));
  return tok_->Encode(text, /*allow_special=*/true);
}

absl::StatusOr<std::vector<int32_t>>
Session::EncodeChatTemplate(const nlohmann::ordered_json &messages,
                            const ChatTemplateArgs &args) const {
  if (!tok_ || !chat_template_)
    return absl::FailedPreconditionError(
        "this model has no chat template of its own");
  DUCK_ASSIGN_OR_RETURN(std::string text,
                        chat_template_->Render(messages, args));
  return tok_->Encode(text, /*allow_special=*/true);
}

absl::Status CheckKvFits(uint64_t kv_bytes_per_token, uint32_t max_seq,
                         uint32_t seqs, uint64_t available) {
  const double gib = double(1ull << 30);
  const uint64_t perSeq = (uint64_t)max_seq * kv_bytes_per_token;
  const uint64_t worst = perSeq * seqs;
  if (available == 0 || worst <= available)
    return absl::OkStatus();
  const uint64_t fit = perSeq ? available / perSeq : 0;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the KV cache needs up to %.2f GiB (%u sequence(s) x %u tokens x %.1f "
      "KiB a token) but this machine has %.2f GiB available; lower "
      "--max-seq or --parallel (%s), or pass --kv-overcommit to start "
      "anyway (memory then grows with the positions sequences reach)",
      double(worst) / gib, seqs, max_seq, double(kv_bytes_per_token) / 1024.0,
      double(available) / gib,
      fit ? absl::StrFormat("%llu sequence(s) of %u tokens fit",
                            (unsigned long long)fit, max_seq)
          : absl::StrFormat("one sequence fits %llu tokens",
                            (unsigned long long)(available /
                                                 kv_bytes_per_token))));
}

uint64_t MemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:")
      return kib * 1024;
  }
  return 0;
}

namespace {
/// The multicast group of local clusters (organisation-local scope).
constexpr const char *kLocalCastGroup = "239.77.0.1";

/// The cluster file's ducks (as many as the plan's tp), spares, token and
/// link bandwidth, and with a multicast plan its cast address, into the
/// client options and the session's fields.
absl::Status UseClusterFile(const std::string &file, uint32_t tp,
                            bool multicast, std::ostream &log,
                            DuckClientOptions &co,
                            std::vector<DuckEndpoint> &spares,
                            double &readGbs) {
  auto c = LoadClusterFile(file);
  if (!c.ok())
    return c.status();
  if (c->ducks.size() != tp)
    return absl::InvalidArgumentError(
        absl::StrCat("the plan was compiled for ", tp,
                     " ducks but cluster file '", file, "' lists ",
                     c->ducks.size()));
  co.ducks = c->ducks;
  spares = c->spares;
  co.token = c->token;
  readGbs = c->bandwidth_gbs;
  if (multicast && c->cast_address.empty())
    log << "duckrun: warning: the plan casts its steps (duckc --fanout "
           "multicast) but cluster file '"
        << file << "' has no \"cast\" address: every step goes to each duck\n";
  if (multicast && !c->cast_address.empty()) {
    co.cast_address = c->cast_address;
    co.cast_port = c->cast_port;
    co.cast_interface = c->cast_interface;
  }
  return absl::OkStatus();
}

/// The port a local cluster's multicast group uses: one no UDP socket of
/// this machine holds now (0 when none could be found).
uint16_t FreeUdpPort() {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

/// A local embedded cluster of tp ducks, sized to this machine's cores and
/// the plan's largest image, its logs in the cache; sets co's ducks and
/// cores.
absl::StatusOr<std::unique_ptr<LocalCluster>>
StartLocalDucks(const SessionOptions &o, const pl::PlanDef &def,
                std::ostream &log, DuckClientOptions &co) {
  const uint32_t tp = def.tp();
  LocalClusterOptions lc;
  lc.ducks = tp;
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  if (o.cores_per_duck > hw)
    return absl::InvalidArgumentError(
        absl::StrCat("--cores-per-duck ", o.cores_per_duck,
                     " is more than this "
                     "machine's ",
                     hw, " cores (a local duck runs one worker a core)"));
  lc.cores = o.cores_per_duck ? o.cores_per_duck : std::max(1u, hw / tp);
  lc.pin = (uint64_t)lc.cores * tp <= hw;
  uint64_t maxImage = 0;
  for (const pl::DuckDef *d : *def.ducks())
    maxImage = std::max<uint64_t>(maxImage, d->image_bytes());
  lc.weights_size = (maxImage + (1ull << 24)) / 4096 * 4096 + 4096;
  lc.cache_dir = absl::StrCat(CacheBase(), "/duckrun");
  lc.name_prefix = "duck";
  lc.claim_slot = true; // a server and the CLI, or two models, side by side
  // The daemons' logs go to files, so they do not mix with the output.
  lc.log_dir = lc.cache_dir + "/logs";
  std::error_code ec;
  std::filesystem::create_directories(lc.log_dir, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot create the duck cache directory '", lc.log_dir,
                     "': ", ec.message()));
  lc.duckd_path = o.duckd_path;
  // A multicast plan: the local ducks join a group on loopback, on a port
  // of this cluster's own.
  const uint16_t castPort = def.fanout_multicast() ? FreeUdpPort() : 0;
  if (castPort) {
    lc.extra_args = {"--cast", absl::StrCat(kLocalCastGroup, ":", castPort)};
    co.cast_address = kLocalCastGroup;
    co.cast_port = castPort;
    co.cast_interface = "127.0.0.1";
    // Loopback's MTU is 64 KiB: one datagram a decode step, not six.
    co.cast_datagram_bytes = DUCKD_CAST_MAX_DATAGRAM;
  }
  if (!o.quiet)
    log << absl::StrFormat("duckrun: starting %u local ducks x %u cores%s\n",
                           tp, lc.cores,
                           castPort ? ", steps cast to a multicast group" : "");
  DUCK_ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> local,
                        LocalCluster::Start(lc));
  if (!o.quiet && local->slot() > 0)
    log << "duckrun: another local cluster uses this cache; these ducks "
           "take slot "
        << local->slot() << " (weight files of their own)\n";
  co.ducks = local->endpoints();
  co.cores = lc.cores;
  return local;
}

/// duckc --mla-absorb ducks: the widest input of an absorbed MLA's output
/// step (a duck's heads' latent outputs, kv_lora_rank floats a head); 0
/// when no MLA is absorbed.
uint64_t AbsorbedInputWidth(const pl::PlanDef &d) {
  uint64_t w = 0;
  for (const pl::OpDef *op : pl::AllOps(d))
    if (const pl::MlaAttentionOpDef *m = op->params_as_MlaAttentionOpDef())
      for (uint32_t r = 0;
           m->absorb_heads() && r + 1 < m->absorb_heads()->size(); ++r)
        w = std::max<uint64_t>(w, (uint64_t)(m->absorb_heads()->Get(r + 1) -
                                             m->absorb_heads()->Get(r)) *
                                      m->kv_lora_rank());
  return w;
}

/// Scratch and buffer sizes for the largest step of `rows` rows, from the
/// plan's step limits (checked against its slots when it was loaded).
void SizeStepBuffers(const pl::PlanDef &def, uint32_t rows,
                     DuckClientOptions &co) {
  const pl::StepLimitsDef &lim = *def.step_limits();
  const uint64_t absorbed = AbsorbedInputWidth(def);
  // Chained head slots (an absorbed MLA's) keep their rows in scratch.
  const uint64_t maxInter = absorbed
                                ? std::max(lim.max_inter(), lim.max_head_rows())
                                : lim.max_inter(),
                 maxExperts = lim.max_experts(), maxK = lim.max_active(),
                 maxHeadRows = lim.max_head_rows();
  // A head slot's input can be wider than hidden (an o_proj's, an absorbed
  // output step's).
  const uint32_t width = (uint32_t)std::max<uint64_t>(
      std::max(def.model()->hidden(), lim.max_k()), absorbed);
  uint32_t cores = co.cores ? co.cores : 64;
  co.scratch_bytes = duck_step_scratch_bytes(width, maxInter, rows, maxK,
                                             maxExperts, cores);
  co.ib_limit = 4096 + (uint64_t)rows * (maxK * 8 + width * 4 + 64);
  // A head slot answers with logits: rows x its vocabulary rows.
  co.ob_limit = std::max<uint64_t>(co.ib_limit,
                                   4096 + (uint64_t)rows * maxHeadRows * 4);
}

/// Weights through the cache, with a progress line while bytes upload and
/// a line saying what each duck's cache did (unless quiet).
absl::Status PrepareWeights(DuckClient &client,
                            const std::vector<std::string> &images,
                            const SessionOptions &o, std::ostream &log,
                            PrepareReport *report) {
  PrepareOptions po;
  po.invalidate = o.invalidate_cache;
  po.cancel = o.cancel;
  bool shownProgress = false; // a redrawn line is open
  absl::Time lastLine = absl::Now();
  if (!o.quiet)
    po.progress = [&](const PrepareProgress &p) {
      if (p.bytes_total == 0)
        return; // every duck is a cache hit: nothing to upload
      const std::string line = absl::StrFormat(
          "duckrun: prepare %.1f / %.1f MiB, %.0f MB/s, ETA %.0f s",
          p.bytes_done / 1048576.0, p.bytes_total / 1048576.0,
          p.bytes_per_second / 1e6, p.eta_seconds);
      if (o.log_is_terminal) {
        shownProgress = true;
        log << "\r" << line << "   ";
      } else if (absl::Now() - lastLine >= absl::Seconds(10)) {
        lastLine = absl::Now();
        log << line << "\n";
      }
      log.flush();
    };
  auto prep = client.Prepare(images, po);
  if (!prep.ok()) {
    if (shownProgress)
      log << "\n"; // end the progress line before the error
    return prep.status();
  }
  if (o.cancel && o.cancel->load())
    return absl::CancelledError("interrupted");
  *report = *prep;
  if (!o.quiet) {
    std::vector<std::string> what;
    for (size_t r = 0; r < prep->result.size(); ++r)
      what.push_back(absl::StrCat(
          "duck ", r, " ",
          prep->result[r] == DUCKD_CACHE_HIT    ? "hit"
          : prep->result[r] == DUCKD_CACHE_MISS ? "miss"
                                                : "partial",
          prep->bytes_uploaded[r]
              ? absl::StrCat(" (", prep->bytes_uploaded[r], " bytes)")
              : ""));
    log << absl::StrFormat("%sduckrun: weight cache: %s (%.2f s)\n",
                           shownProgress ? "\r" : "", absl::StrJoin(what, ", "),
                           prep->seconds);
  }
  return absl::OkStatus();
}
/// The engine's options: the session's sequences and threads, and the
/// rows of the largest step (the ones the ducks' buffers were sized for).
EngineOptions EngineOptionsFor(const SessionOptions &o, uint32_t maxSeq,
                               uint32_t threads, uint32_t chunk,
                               uint32_t seqs, uint32_t rows) {
  EngineOptions eo;
  eo.max_seq = maxSeq;
  eo.threads = threads;
  eo.prefill_chunk = chunk;
  eo.all_logits = o.all_logits;
  eo.mtp = o.mtp;
  eo.mtp_all_logits = o.mtp_all_logits;
  eo.max_seqs = seqs;
  // Every sequence's first cache chunk at load, as a prompt would pay for
  // it (one with --kv-overcommit: its memory grows only as asked).
  eo.populate_seqs = o.kv_overcommit ? 1 : seqs;
  eo.kv_f16 = o.kv_f16;
  eo.max_rows = rows;
  const uint64_t llc = LastLevelCacheBytes();
  eo.host_prefetch_bytes = !o.host_prefetch ? 0 : llc ? llc / 2 : 8ull << 20;
  return eo;
}
/// The runner's recovery: a duck that dies, hangs or drops its connection
/// mid-generation is brought back (a local duck is restarted; its weight
/// cache file makes the new prepare a hit) and the step is sent again. It
/// holds the session's fields by reference and reads them when it runs.
ClusterFfnRunner::Recover
RecoverWith(std::unique_ptr<DuckClient> &client, DuckClientOptions &co,
            const std::unique_ptr<LocalCluster> &local,
            std::vector<DuckEndpoint> &spares,
            const std::vector<std::string> &images,
            const std::vector<uint8_t> &elf, const SessionOptions &o,
            std::ostream &log) {
  const absl::Duration budget = absl::Seconds(o.recover_seconds);
  const bool quiet = o.quiet;
  return [&client, &co, &local, &spares, &images, &elf, budget, quiet,
          cancel = o.cancel, &log](const absl::Status &why)
             -> absl::StatusOr<DuckClient *> {
    client.reset(); // close the old connections first: no duck stays busy
    auto fresh = RecoverDucks(why, co, local.get(), &spares, images, elf,
                              budget, quiet, cancel, log);
    if (!fresh.ok())
      return fresh.status();
    client = std::move(*fresh);
    return client.get();
  };
}
/// The cast path's switches from the environment: the loss tests' cast
/// datagrams left unsent (the ducks miss batches and are sent those steps
/// plainly) and cast stages whose staged steps name another digest; A/B
/// runs' stages in frames where a cast could carry them.
void ReadCastEnv(DuckClientOptions *co) {
  if (const char *d = std::getenv("DUCK_TEST_CAST_DROP_EVERY"))
    co->cast_drop_every = uint32_t(std::max(0, std::atoi(d)));
  if (const char *d = std::getenv("DUCK_TEST_STAGE_DIGEST_FLIP_EVERY"))
    co->stage_digest_flip_every = uint32_t(std::max(0, std::atoi(d)));
  if (const char *d = std::getenv("DUCK_CAST_STAGES"))
    co->cast_stages = std::atoi(d) != 0;
}

} // namespace

absl::Status Session::Start(std::ostream &log) {
  const SessionOptions &o = opts_;
  const pl::PlanDef &def = plan_->def();
  // The host's weights are mapped in while the ducks start and prepare
  // (page faults the first prompt would otherwise take, one a page).
  std::thread mapper([this] { plan_->MapHostTensors(); });
  struct Join {
    std::thread &t;
    ~Join() {
      if (t.joinable())
        t.join();
    }
  } joinMapper{mapper};

  // Ducks: a cluster file, or a local embedded cluster of tp ducks.
  const uint32_t tp = def.tp();
  co_.persistent = o.persistent;
  if (!o.cluster_file.empty()) {
    DUCK_RETURN_IF_ERROR(UseClusterFile(o.cluster_file, tp,
                                        def.fanout_multicast(), log, co_,
                                        spares_, duck_read_gbs_));
  } else {
    DUCK_ASSIGN_OR_RETURN(local_, StartLocalDucks(o, def, log, co_));
  }

  // Scratch and buffer sizes for the largest step: a prompt chunk plus,
  // when several sequences decode together, a row for each of them.
  const uint32_t chunk = std::max(1u, o.prefill_chunk);
  const uint32_t seqs = std::max(1u, o.max_seqs);
  const uint32_t rows = seqs > 1 ? chunk + seqs : chunk;
  SizeStepBuffers(def, rows, co_);
  // Spinning for a step's replies saves the host's wake-up (duck-bench
  // judge, one duck, loopback: gap p50 63 -> 11 us) but holds a core; on
  // one box it gained nothing end to end (docs/perf.md), so it is opt-in.
  co_.reply_spin = absl::Microseconds(std::max(0, o.reply_spin_us));
  co_.step_timeout = absl::Milliseconds(std::max(1u, o.step_timeout_ms));
  ReadCastEnv(&co_);
  DUCK_ASSIGN_OR_RETURN(client_, DuckClient::Create(co_));

  for (uint32_t r = 0; r < tp; ++r)
    images_.push_back(plan_->ImagePath(r));
  DUCK_RETURN_IF_ERROR(PrepareWeights(*client_, images_, o, log, &prepare_));
  DUCK_ASSIGN_OR_RETURN(elf_, ReadDuckElf());
  if (absl::Status st = client_->Open(elf_); !st.ok())
    return st;

  runner_ = std::make_unique<ClusterFfnRunner>(*plan_, client_.get());
  runner_->KeepSteps(o.keep_steps);
  runner_->Reserve(co_.ib_limit, co_.ob_limit);
  if (const char *d = std::getenv("DUCK_TEST_STAGE_SKIP_EVERY"))
    runner_->SetStageSkipEvery(uint32_t(std::max(0, std::atoi(d))));
  if (o.recover_seconds > 0)
    runner_->SetRecover(RecoverWith(client_, co_, local_, spares_, images_,
                                    elf_, o, log));
  if (const char *k = std::getenv("DUCK_TEST_KILL_DUCK"))
    DUCK_RETURN_IF_ERROR(ArmTestFault(k));
  threads_ =
      o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  const EngineOptions eo =
      EngineOptionsFor(o, max_seq_, threads_, chunk, seqs, rows);
  mapper.join();
  DUCK_ASSIGN_OR_RETURN(engine_, Engine::Create(*plan_, runner_.get(), eo));
  // The host threads sleep while the ducks work (ThreadPool::Park).
  runner_->SetAfterSend([pool = engine_->pool()] { pool->Park(); });
  // Every sequence's cache is reserved at full length and filled as its
  // positions grow: refuse up front what the machine could never hold,
  // rather than meet the OOM killer when sequences grow long.
  if (!o.kv_overcommit)
    DUCK_RETURN_IF_ERROR(CheckKvFits(engine_->kv_bytes_per_token() +
                                         engine_->mtp_kv_bytes_per_token(),
                                     max_seq_, seqs, MemAvailableBytes()));
  return absl::OkStatus();
}

} // namespace duck::runtime
