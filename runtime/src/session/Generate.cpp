//===- Generate.cpp - duckrun: plan + cluster + tokenizer -> text ---------===//
#include "duck/runtime/session/Generate.h"
#include "duck/runtime/session/Speculative.h"

#include "duck/runtime/session/Breakdown.h"
#include "duck/runtime/session/Session.h"

#include "duck/runtime/engine/ClusterRunner.h"
#include "duck/runtime/cluster/LocalCluster.h"
#include "duck/runtime/text/Tokenizer.h"
#include "duck/runtime/StatusMacros.h"

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

double now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, (size_t)(p * (v.size() - 1) + 0.5));
  return v[i];
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

/// Ctrl-C (the caller's cancel flag) asks the run to stop between steps.
bool Interrupted(const GenerateOptions &o) {
  return o.cancel && o.cancel->load();
}

/// The prompt's token ids (given, or encoded, as chat with --chat), checked
/// against the vocabulary and --max-seq before any duck starts.
absl::StatusOr<std::vector<int32_t>> PromptIds(const GenerateOptions &o,
                                              Session &ses) {
  std::vector<int32_t> prompt = o.prompt_ids;
  if (prompt.empty()) {
    const ChatMessage user[] = {{"user", o.prompt}};
    auto ids = o.chat ? ses.EncodeChat(user) : ses.EncodePrompt(o.prompt);
    if (!ids.ok())
      return o.chat ? absl::Status(
                          ids.status().code(),
                          absl::StrCat("--chat: ", ids.status().message()))
                    : ids.status();
    prompt = std::move(*ids);
  }
  if (prompt.empty())
    return absl::InvalidArgumentError("the prompt is empty");
  const uint64_t vocab = ses.model().vocab();
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || (uint64_t)prompt[i] >= vocab)
      return absl::OutOfRangeError(
          absl::StrCat("--prompt-ids: token id ", prompt[i], " (position ", i,
                       ") is outside the vocabulary of ", vocab));
  const uint32_t maxSeq = ses.max_seq();
  if (prompt.size() + 1 > maxSeq)
    return absl::OutOfRangeError(absl::StrCat(
        "the prompt has ", prompt.size(), " tokens but --max-seq is ", maxSeq,
        "; shorten the prompt or raise --max-seq"));
  return prompt;
}

/// --logits-out: every prompt position's logits, then every generated
/// token's (vocab float32 each, in order); nothing without the option.
class LogitsOut {
public:
  explicit LogitsOut(std::string path) : path_(std::move(path)) {}
  absl::Status Open() {
    if (path_.empty())
      return absl::OkStatus();
    file_.open(path_, std::ios::binary | std::ios::trunc);
    if (!file_)
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write '", path_, "'"));
    return absl::OkStatus();
  }
  void Keep(absl::Span<const float> l) {
    if (file_.is_open())
      file_.write(reinterpret_cast<const char *>(l.data()), l.size() * 4);
  }
  absl::Status Flush() {
    if (file_.is_open() && !file_.flush())
      return absl::InternalError(absl::StrCat("cannot write '", path_, "'"));
    return absl::OkStatus();
  }

private:
  std::string path_;
  std::ofstream file_;
};

/// The last row of a step's logits: the next token's.
absl::Span<const float> LastRow(const std::vector<float> &l, uint32_t V) {
  return absl::MakeConstSpan(l).subspan(l.size() - V, V);
}

/// One generation's tokens and times: what the summary is made from.
struct Run {
  size_t prompt_tokens = 0;
  double prefill_s = 0;
  std::vector<int32_t> generated;
  std::vector<double> token_times; // each decode step's Forward
  SpeculativeStats spec;           // --speculative's steps and drafts
};

/// The prompt, chunk by chunk so that Ctrl-C is noticed between steps.
absl::Status Prefill(const GenerateOptions &o, Engine &engine,
                     const std::vector<int32_t> &prompt, uint32_t chunk,
                     LogitsOut &logitsOut, std::vector<float> *logits) {
  for (size_t i = 0; i < prompt.size(); i += chunk) {
    if (Interrupted(o))
      return absl::CancelledError("interrupted");
    auto part = absl::MakeConstSpan(prompt).subspan(
        i, std::min<size_t>(chunk, prompt.size() - i));
    // The LM head runs for the prompt's last token only (every token's
    // with --logits-out): a leading chunk's logits are nobody's.
    const bool last = i + part.size() == prompt.size();
    absl::Status st = o.decode_only ? engine.ForwardDecodeOnly(part, logits)
                                    : engine.Forward(part, logits, last);
    if (!st.ok())
      return st;
    logitsOut.Keep(*logits);
  }
  return absl::OkStatus();
}

/// The decode loop: samples and steps until --max-tokens, the end of the
/// text or of the context; the text (or ids) goes to `out` as it is made,
/// when streamed, or whole at the end. With --speculative, a step carries
/// the next token and its drafts (Speculative.h).
class DecodeLoop {
public:
  DecodeLoop(const GenerateOptions &o, Session &ses, LogitsOut &logitsOut,
             const std::vector<int32_t> &prompt, std::ostream &out, Run *run)
      : o_(o), ses_(ses), engine_(ses.engine()), logitsOut_(logitsOut),
        out_(out), run_(run), eos_(ses.StopTokens(o.chat)), sampler_(o.sampler),
        drafter_(o.speculative.corpus), budget_(o.speculative.k), text_(prompt),
        mtpOut_(o.mtp_logits_out) {
    tok_ = ses.tokenizer();
    textOut_ = tok_ && !o.print_ids;
    if (textOut_)
      stream_ = std::make_unique<StreamDecoder>(*tok_);
  }

  absl::Status Loop(std::vector<float> *logits) {
    const uint32_t V = engine_.vocab();
    DUCK_RETURN_IF_ERROR(mtpOut_.Open());
    int32_t next = sampler_.Sample(LastRow(*logits, V));
    mtpRows_ = engine_.has_mtp() ? engine_.mtp_step_rows() : 0;
    tail_ = next;
    while (Emit(next)) {
      if (Interrupted(o_))
        return absl::CancelledError("interrupted");
      if (engine_.position() + 1 > ses_.max_seq())
        break;
      const double t0 = now();
      std::vector<int32_t> drafts;
      DUCK_RETURN_IF_ERROR(Drafts(next, &drafts));
      uint32_t made = 1;
      absl::Status s = drafts.empty() ? StepOne(next, logits, &next)
                                      : StepVerify(next, drafts, logits,
                                                   &next, &made);
      if (!s.ok())
        return s;
      for (uint32_t i = 0; i < made; ++i)
        run_->token_times.push_back((now() - t0) / made);
      if (ended_)
        break;
    }
    // --mtp-logits-out: the module's rows up to the last token's position.
    if (mtpRows_ && !o_.mtp_logits_out.empty()) {
      std::vector<float> unused;
      DUCK_RETURN_IF_ERROR(
          engine_.MtpDraft(mtpRows_, tail_, Engine::MtpMode::kFlush, &unused));
    }
    mtpOut_.Keep(engine_.TakeMtpLogits());
    DUCK_RETURN_IF_ERROR(mtpOut_.Flush());
    return Finish();
  }
private:
  /// Hands `t` on; false when the generation ends with it.
  bool Emit(int32_t t) {
    std::vector<int32_t> &generated = run_->generated;
    if (generated.size() >= o_.max_tokens)
      return false;
    generated.push_back(t);
    text_.push_back(t);
    const bool end = o_.stop_at_eos &&
                     std::find(eos_.begin(), eos_.end(), t) != eos_.end();
    // Text or ids go out as they are made: an error later loses nothing
    // already produced. The token that ends the text is not text (ids
    // mode shows it).
    if (end && textOut_) {
      generated.pop_back();
      return false;
    }
    if (stream_ && o_.stream) {
      out_ << stream_->Push(t);
      out_.flush();
    } else if (!textOut_ && o_.stream) {
      out_ << (generated.size() > 1 ? " " : "") << t;
      out_.flush();
    }
    return !end && generated.size() < o_.max_tokens;
  }

  /// The drafts for the next step (`next` its first row): none without
  /// --speculative, and never past --max-tokens or the context. With an
  /// MTP module, it runs over the last step's accepted rows whatever the
  /// budget (its cache needs every position) and projects its last row
  /// only when a draft is wanted.
  absl::Status Drafts(int32_t next, std::vector<int32_t> *out) {
    out->clear();
    const SpeculativeOptions &spec = o_.speculative;
    uint32_t k = 0;
    if (spec.lookup || spec.wrong || spec.mtp) {
      // A step of k drafts yields up to k + 1 tokens: drafts that would
      // pass --max-tokens are not worth their rows.
      const uint64_t room =
          std::min<uint64_t>(o_.max_tokens - run_->generated.size() - 1,
                             ses_.max_seq() - engine_.position() - 1);
      k = (uint32_t)std::min<uint64_t>(budget_.Next(), room);
    }
    // A module none of whose first drafts was accepted (random weights,
    // another model's module) is stopped: its rows would cost every step.
    if (engine_.has_mtp() && spec.mtp && o_.mtp_logits_out.empty() &&
        run_->spec.accepted == 0 && run_->spec.proposed >= kMtpGiveUp) {
      engine_.MtpStop();
      return absl::OkStatus();
    }
    if (engine_.has_mtp() && mtpRows_)
      DUCK_RETURN_IF_ERROR(MtpDrafts(next, spec.mtp ? k : 0, out));
    if (spec.wrong)
      *out = wrong_.Propose(engine_.vocab(), k);
    else if (spec.lookup)
      *out = drafter_.Propose(text_, k);
    return absl::OkStatus();
  }

  /// The MTP module over the last step's kept rows (`next` after them);
  /// up to k drafts from it (0: its rows wait, run with the next draft's,
  /// one step for all), chained past the first (mtp:K).
  absl::Status MtpDrafts(int32_t next, uint32_t k, std::vector<int32_t> *out) {
    DUCK_RETURN_IF_ERROR(engine_.MtpDraft(
        mtpRows_, next, k ? Engine::MtpMode::kDraft : Engine::MtpMode::kDefer,
        &mtpLogits_));
    mtpRows_ = 0;
    mtpOut_.Keep(engine_.TakeMtpLogits());
    auto argmax = [&] {
      return (int32_t)(std::max_element(mtpLogits_.begin(), mtpLogits_.end()) -
                       mtpLogits_.begin());
    };
    if (k)
      out->push_back(argmax());
    while (k && out->size() < k) {
      DUCK_RETURN_IF_ERROR(engine_.MtpChain(out->back(), &mtpLogits_));
      out->push_back(argmax());
    }
    return absl::OkStatus();
  }

  absl::Status StepOne(int32_t in, std::vector<float> *logits,
                       int32_t *next) {
    DUCK_RETURN_IF_ERROR(engine_.Forward(absl::MakeConstSpan(&in, 1), logits));
    logitsOut_.Keep(*logits);
    *next = sampler_.Sample(LastRow(*logits, engine_.vocab()));
    mtpRows_ = engine_.has_mtp() ? 1 : 0;
    tail_ = *next;
    return absl::OkStatus();
  }

  /// One step of `in` and its drafts; row after row, a sampled token that
  /// is the row's draft is accepted (and emitted) and the next row read.
  absl::Status StepVerify(int32_t in, const std::vector<int32_t> &drafts,
                          std::vector<float> *logits, int32_t *next,
                          uint32_t *made) {
    const uint32_t V = engine_.vocab(), pos = engine_.position();
    std::vector<int32_t> rows{in};
    rows.insert(rows.end(), drafts.begin(), drafts.end());
    DUCK_RETURN_IF_ERROR(engine_.Verify(rows, logits));
    uint32_t i = 0;
    for (;; ++i) {
      const auto row = absl::MakeConstSpan(*logits).subspan((uint64_t)i * V, V);
      logitsOut_.Keep(row);
      const int32_t t = sampler_.Sample(row);
      tail_ = t; // the token after the rows kept
      if (i == drafts.size() || t != drafts[i]) {
        *next = t;
        break;
      }
      if (!Emit(t)) { // the text ends on an accepted draft
        ended_ = true;
        break;
      }
    }
    mtpRows_ = engine_.has_mtp() ? i + 1 : 0;
    engine_.Rewind(pos + 1 + i);
    // A draft that ends the text was accepted too (and is the last token).
    const uint32_t accepted = ended_ ? i + 1 : i;
    ++run_->spec.verify_steps;
    run_->spec.proposed += drafts.size();
    run_->spec.accepted += accepted;
    budget_.Record((uint32_t)drafts.size(), accepted);
    *made = i + 1;
    return absl::OkStatus();
  }

  absl::Status Finish() {
    DUCK_RETURN_IF_ERROR(logitsOut_.Flush());
    const std::vector<int32_t> &generated = run_->generated;
    if (stream_ && o_.stream)
      out_ << stream_->Flush();
    if (textOut_ && !o_.stream)
      out_ << tok_->Decode(generated);
    if (!textOut_ && !o_.stream)
      out_ << absl::StrJoin(generated, " ");
    out_ << "\n";
    out_.flush();
    return absl::OkStatus();
  }

  const GenerateOptions &o_;
  Session &ses_;
  Engine &engine_;
  LogitsOut &logitsOut_;
  std::ostream &out_;
  struct Run *run_;
  const std::vector<int32_t> eos_;
  Sampler sampler_;
  LookupDrafter drafter_;
  WrongDrafter wrong_;
  DraftBudget budget_;
  std::vector<int32_t> text_; // the prompt and the tokens so far
  // With an MTP module: the last step's rows it has not run yet, the
  // token after them, its draft's logits, --mtp-logits-out.
  uint32_t mtpRows_ = 0;
  /// MTP drafts all rejected before the module stops (a trained module,
  /// right 85 % of the time, is stopped once in 2,500 generations).
  static constexpr uint64_t kMtpGiveUp = 4;
  int32_t tail_ = 0;
  std::vector<float> mtpLogits_;
  LogitsOut mtpOut_;
  const Tokenizer *tok_ = nullptr;
  bool textOut_ = false, ended_ = false;
  std::unique_ptr<StreamDecoder> stream_;
};

/// The run's measures: the summary JSON and what the lines on stderr need.
struct Summary {
  nlohmann::json j;
  std::vector<double> gaps, ratios, gparam_s;
  double decode_tok_s = 0, tpot_ms = 0;
  double tpot_p50_ms = 0; // the median token's time: one stall cannot move it
  // The slow tokens: a stall (a page fault, a wake-up) shows here.
  double tpot_p99_ms = 0, tpot_max_ms = 0;
  DecodeBreakdown bd;
  std::vector<std::string> by_op, by_op_prefill;
};

/// Where a decoded token's time goes, by op kind (FFN kinds: routing on
/// the host plus the wait for the ducks).
DecodeBreakdown Breakdown(Session &ses, const Run &run, double tpotMs,
                          double readBwGbs) {
  const double hostReadGbs = run.token_times.empty() ? 0
                             : readBwGbs > 0
                                 ? readBwGbs
                                 : HostReadBandwidthGbs(ses.threads());
  // Decode step i (after the prompt) attends over prompt + i + 1
  // positions; the tokens timed are the generated ones after the first.
  const double meanContext =
      run.generated.size() > 1
          ? (double)run.prompt_tokens + (double)run.generated.size() / 2.0
          : (double)run.prompt_tokens;
  return ComputeDecodeBreakdown(
      ses.plan(), ses.engine(), ses.runner().stats(), tpotMs, meanContext,
      hostReadGbs, ses.duck_read_gbs() > 0 ? ses.duck_read_gbs() : hostReadGbs,
      ses.local());
}

/// How the steps went to the ducks, into the summary's JSON: cast steps
/// (a multicast plan with a cast address: the steps whose input went out
/// once, and the ducks sent one again plainly) and staged steps (a plan
/// with stage_shared: the stages sent, the steps sent as their routed
/// slots, and the ducks sent their whole step when they found no stage).
void FillStepFormsJson(Session &ses, nlohmann::json &sj) {
  const CastStats cs = ses.client().cast_stats();
  sj["cast_steps"] = cs.steps;
  sj["cast_resent"] = cs.resent;
  sj["cast_datagram_bytes"] = cs.datagram_bytes;
  sj["cast_ducks_off"] = cs.ducks_off;
  const RunnerStats &rs = ses.runner().stats();
  sj["stages"] = rs.stages;
  sj["staged_steps"] = rs.staged_steps;
  sj["stage_resent"] = ses.client().stage_stats().resent;
  sj["stages_cast"] = ses.client().stage_stats().cast; // no frame a duck
  // Ducks' staged steps whose cast stage was done before their frame came.
  sj["stage_ducks_ahead"] = ses.client().stage_stats().ahead;
  sj["stage_ahead_ms_total"] = ses.client().stage_stats().ahead_us / 1e3;
  // The host's CPU sending the stages (frames or batches), all of them.
  sj["stage_host_cpu_ms_total"] = ses.client().stage_stats().host_cpu_us / 1e3;
  // The stages' time on the ducks, all of the run's (each stage's slowest
  // duck; not in the steps' duck kernel times).
  sj["stage_kernel_ms_total"] = ses.client().stage_stats().kernel_us / 1e3;
}

/// The summary's JSON (--summary-json) from the run and its measures.
void FillSummaryJson(Session &ses, const Run &run, Summary *s) {
  const RunnerStats &rs = ses.runner().stats();
  const Engine &engine = ses.engine();
  const DecodeBreakdown &bd = s->bd;
  nlohmann::json &sj = s->j;
  sj["prompt_tokens"] = run.prompt_tokens;
  sj["generated_tokens"] = run.generated.size();
  sj["generated_ids"] = run.generated;
  sj["prefill_s"] = run.prefill_s;
  sj["prefill_tok_s"] =
      run.prefill_s > 0 ? run.prompt_tokens / run.prefill_s : 0;
  sj["decode_tok_s"] = s->decode_tok_s;
  sj["tpot_ms"] = s->tpot_ms;
  sj["tpot_p50_ms"] = s->tpot_p50_ms;
  sj["tpot_p99_ms"] = s->tpot_p99_ms;
  sj["tpot_max_ms"] = s->tpot_max_ms;
  sj["judge_gap_us_p50"] = percentile(s->gaps, 0.5);
  sj["judge_gap_us_p99"] = percentile(s->gaps, 0.99);
  sj["judge_ratio_p50"] = percentile(s->ratios, 0.5);
  sj["judge_ratio_p99"] = percentile(s->ratios, 0.99);
  sj["kv_bytes_per_token"] = engine.kv_bytes_per_token();
  if (engine.has_mtp())
    sj["mtp_kv_bytes_per_token"] = engine.mtp_kv_bytes_per_token();
  sj["decode_breakdown_ms"] = {
      {"host_attention", bd.host_attention_ms},
      {"host_norms_router", bd.host_norms_router_ms},
      {"lm_head", bd.lm_head_ms},
      {"duck_kernel", bd.duck_kernel_ms},
      {"dispatch_gap", bd.dispatch_gap_ms},
      {"other", bd.other_ms}};
  sj["host_bytes_per_token"] = bd.host_bytes;
  sj["host_cache_bytes_per_token"] = bd.host_cache_bytes;
  sj["host_prefetched_bytes_per_token"] =
      engine.decode_times().tokens
          ? engine.host_prefetched_bytes() / engine.decode_times().tokens
          : 0;
  sj["mean_context"] = bd.mean_context;
  sj["duck_bytes_per_token"] = bd.duck_bytes_total;
  sj["duck_bytes_per_token_max"] = bd.duck_bytes_max;
  sj["host_read_gb_s"] = bd.host_read_gbs;
  sj["duck_read_gb_s"] = bd.duck_read_gbs;
  sj["decode_bound_ms"] = bd.bound_ms;
  sj["decode_bound_fraction"] = bd.decode_bound_fraction;
  sj["decode_ms_per_token_by_op"] =
      OpBreakdown(engine.decode_times(), &s->by_op);
  sj["prefill_ms_per_token_by_op"] =
      OpBreakdown(engine.prefill_times(), &s->by_op_prefill);
  sj["decode_steps"] = rs.decode_steps.size();
  sj["prefill_steps"] = rs.prefill_steps.size();
  {
    // Where the prompt's duck steps went (ms a prompt token): the slowest
    // duck's kernel, and the rest of the host's wait (wire, wake-ups).
    double kernelUs = 0, waitUs = 0;
    for (const StepMetrics &m : rs.prefill_steps)
      kernelUs += m.duck_max_us, waitUs += m.judge_wait_us;
    const double tokens = std::max<double>(1, engine.prefill_times().tokens);
    sj["prefill_duck_kernel_ms"] = kernelUs / 1e3 / tokens;
    sj["prefill_dispatch_gap_ms"] = (waitUs - kernelUs) / 1e3 / tokens;
  }
  sj["ducks"] = ses.ducks();
  sj["persistent"] = ses.persistent();
  sj["recoveries"] = ses.runner().recoveries();
  FillStepFormsJson(ses, sj);
  sj["duck_kernel_gparam_s"] = s->gparam_s;
  if (run.spec.verify_steps)
    sj["speculative"] = {
        {"verify_steps", run.spec.verify_steps},
        {"drafts_proposed", run.spec.proposed},
        {"drafts_accepted", run.spec.accepted},
        {"acceptance", (double)run.spec.accepted / run.spec.proposed},
        {"tokens_per_verify_step",
         (double)(run.spec.accepted + run.spec.verify_steps) /
             run.spec.verify_steps}};
}

/// Measures the run: rates, the judge's gaps and ratios, the breakdown.
Summary Summarize(Session &ses, const Run &run, double readBwGbs) {
  Summary s;
  const RunnerStats &rs = ses.runner().stats();
  for (const StepMetrics &m : rs.decode_steps) {
    s.gaps.push_back(m.judge_gap_us);
    s.ratios.push_back(m.judge_ratio);
  }
  const std::vector<double> &times = run.token_times;
  s.decode_tok_s =
      times.empty() ? 0
                    : times.size() / std::max(1e-9, std::accumulate(
                                                        times.begin(),
                                                        times.end(), 0.0));
  s.tpot_ms = times.empty() ? 0 : 1e3 / s.decode_tok_s;
  s.tpot_p50_ms = 1e3 * percentile(times, 0.5);
  s.tpot_p99_ms = 1e3 * percentile(times, 0.99);
  s.tpot_max_ms =
      times.empty() ? 0 : 1e3 * *std::max_element(times.begin(), times.end());
  s.bd = Breakdown(ses, run, s.tpot_ms, readBwGbs);
  for (size_t r = 0; r < rs.params.size(); ++r)
    s.gparam_s.push_back(rs.kernel_ns[r] > 0 ? rs.params[r] / rs.kernel_ns[r]
                                             : 0);
  FillSummaryJson(ses, run, &s);
  return s;
}

/// The summary's lines on stderr.
void PrintSummary(std::ostream &err, Session &ses, const Run &run,
                  const Summary &s) {
  err << absl::StrFormat(
      "duckrun: prompt %zu tokens, prefill %.1f tok/s; generated %zu tokens, "
      "decode %.2f tok/s, TPOT %.2f ms\n",
      run.prompt_tokens, (double)s.j["prefill_tok_s"], run.generated.size(),
      s.decode_tok_s, s.tpot_ms);
  err << absl::StrFormat(
      "duckrun: judge_gap p50 %.1f us, p99 %.1f us; judge_ratio p50 %.3f, "
      "p99 %.3f (%zu decode steps, %s)\n",
      percentile(s.gaps, 0.5), percentile(s.gaps, 0.99),
      percentile(s.ratios, 0.5), percentile(s.ratios, 0.99),
      ses.runner().stats().decode_steps.size(),
      ses.persistent() ? "persistent" : "per-step run");
  std::vector<std::string> per;
  for (size_t r = 0; r < s.gparam_s.size(); ++r)
    per.push_back(absl::StrFormat("duck %zu %.2f", r, s.gparam_s[r]));
  err << "duckrun: kernel Gparam/s: " << absl::StrJoin(per, ", ") << "\n";
  err << absl::StrFormat("duckrun: KV cache %.1f KiB a token (host)\n",
                         ses.engine().kv_bytes_per_token() / 1024.0);
  if (const SpeculativeStats &sp = run.spec; sp.verify_steps)
    err << absl::StrFormat(
        "duckrun: speculative: %llu verify steps, %llu of %llu drafts "
        "accepted (%.1f %%), %.2f tokens a verify step\n",
        (unsigned long long)sp.verify_steps, (unsigned long long)sp.accepted,
        (unsigned long long)sp.proposed,
        sp.proposed ? 100.0 * sp.accepted / sp.proposed : 0.0,
        (double)(sp.accepted + sp.verify_steps) / sp.verify_steps);
  if (!run.token_times.empty())
    err << FormatDecodeBreakdown(s.bd);
  if (!s.by_op.empty())
    err << "duckrun: decode ms a token by op: " << absl::StrJoin(s.by_op, ", ")
        << "\n";
  if (!s.by_op_prefill.empty())
    err << "duckrun: prefill ms a token by op: "
        << absl::StrJoin(s.by_op_prefill, ", ") << "\n";
}

} // namespace

absl::Status Generate(const GenerateOptions &o, std::ostream &out,
                      std::ostream &err) {
  const double tStart = now();
  SessionOptions so = o.session;
  so.need_tokenizer = o.prompt_ids.empty();
  so.all_logits = !o.logits_out.empty();
  so.mtp = o.speculative.mtp || !o.mtp_logits_out.empty();
  so.mtp_all_logits = !o.mtp_logits_out.empty();
  so.cancel = o.cancel;

  // The prompt is checked before any duck starts: the plan and tokenizer
  // are loaded first, on their own.
  auto session = Session::Load(so);
  if (!session.ok())
    return session.status();
  Session &ses = **session;
  if (so.mtp && !ses.plan().def().mtp())
    return absl::FailedPreconditionError(absl::StrCat(
        o.speculative.mtp ? "--speculative mtp" : "--mtp-logits-out",
        ": the plan has no MTP module (only DeepSeek checkpoints with "
        "num_nextn_predict_layers carry one; duckc compile --mtp on says "
        "what is missing)"));
  if (o.chat && !ses.chat_template_note().empty())
    err << "duckrun: warning: " << ses.chat_template_note() << "\n";
  auto prompt = PromptIds(o, ses);
  if (!prompt.ok())
    return prompt.status();
  if (absl::Status s = ses.Start(err); !s.ok())
    return s;
  LogitsOut logitsOut(o.logits_out);
  if (absl::Status s = logitsOut.Open(); !s.ok())
    return s;

  Run run;
  run.prompt_tokens = prompt->size();
  std::vector<float> logits;
  const double tPrefill = now();
  if (absl::Status s = Prefill(o, ses.engine(), *prompt,
                               std::max(1u, so.prefill_chunk), logitsOut,
                               &logits);
      !s.ok())
    return s;
  run.prefill_s = now() - tPrefill;
  DecodeLoop decode(o, ses, logitsOut, *prompt, out, &run);
  if (absl::Status s = decode.Loop(&logits); !s.ok())
    return s;

  if (absl::Status fault = ses.CheckTestFault(); !fault.ok())
    return fault;
  if (so.quiet && o.summary_json.empty()) { // nobody reads the summary
    ses.Close();
    return absl::OkStatus();
  }
  Summary sum = Summarize(ses, run, o.read_bw_gbs);
  sum.j["total_s"] = now() - tStart;
  if (!o.summary_json.empty()) {
    std::ofstream f(o.summary_json);
    f << sum.j.dump(2) << "\n";
    if (!f)
      return absl::InternalError(
          absl::StrCat("cannot write '", o.summary_json, "'"));
  }
  if (!so.quiet)
    PrintSummary(err, ses, run, sum);
  ses.Close();
  return absl::OkStatus();
}

} // namespace duck::runtime
