//===- Generate.cpp - duckrun: plan + cluster + tokenizer -> text ---------===//
#include "duck/runtime/session/Generate.h"

#include "duck/runtime/session/Breakdown.h"
#include "duck/runtime/session/Session.h"

#include "duck/runtime/engine/ClusterRunner.h"
#include "duck/runtime/cluster/LocalCluster.h"
#include "duck/runtime/text/Tokenizer.h"

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

} // namespace

absl::Status Generate(const GenerateOptions &o, std::ostream &out,
                      std::ostream &err) {
  const double tStart = now();
  auto interrupted = [&] { return o.cancel && o.cancel->load(); };
  SessionOptions so = o.session;
  so.need_tokenizer = o.prompt_ids.empty();
  so.all_logits = !o.logits_out.empty();
  so.cancel = o.cancel;

  // The prompt is checked before any duck starts: the plan and tokenizer
  // are loaded first, on their own.
  auto session = Session::Load(so);
  if (!session.ok())
    return session.status();
  Session &ses = **session;
  const uint32_t maxSeq = ses.max_seq();
  const Tokenizer *tok = ses.tokenizer();
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
  if (prompt.size() + 1 > maxSeq)
    return absl::OutOfRangeError(absl::StrCat(
        "the prompt has ", prompt.size(), " tokens but --max-seq is ", maxSeq,
        "; shorten the prompt or raise --max-seq"));
  const uint32_t chunk = std::max(1u, so.prefill_chunk);
  if (absl::Status s = ses.Start(err); !s.ok())
    return s;
  Engine &engine = ses.engine();

  // --logits-out: every prompt position's logits, then every generated
  // token's (vocab float32 each, in order).
  std::ofstream logitsFile;
  if (!o.logits_out.empty()) {
    logitsFile.open(o.logits_out, std::ios::binary | std::ios::trunc);
    if (!logitsFile)
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write '", o.logits_out, "'"));
  }
  const uint32_t V = engine.vocab();
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
    if (interrupted())
      return absl::CancelledError("interrupted");
    auto part = absl::MakeConstSpan(prompt).subspan(
        i, std::min<size_t>(chunk, prompt.size() - i));
    // The LM head runs for the prompt's last token only (every token's
    // with --logits-out): a leading chunk's logits are nobody's.
    const bool last = i + part.size() == prompt.size();
    absl::Status st = o.decode_only
                          ? engine.ForwardDecodeOnly(part, &logits)
                          : engine.Forward(part, &logits, last);
    if (!st.ok())
      return st;
    keepLogits(logits);
  }
  const double prefillS = now() - tPrefill;

  // Decode.
  const std::vector<int32_t> eos = ses.StopTokens(o.chat);
  Sampler sampler(o.sampler);
  std::vector<int32_t> generated;
  std::unique_ptr<StreamDecoder> stream;
  const bool text = tok && !o.print_ids;
  if (text)
    stream = std::make_unique<StreamDecoder>(*tok);
  std::vector<double> tokenTimes;
  int32_t next = sampler.Sample(lastRow(logits));
  while (generated.size() < o.max_tokens) {
    if (interrupted())
      return absl::CancelledError("interrupted");
    generated.push_back(next);
    const bool end =
        o.stop_at_eos && std::find(eos.begin(), eos.end(), next) != eos.end();
    // Text or ids go out as they are made: an error later loses nothing
    // already produced. The token that ends the text is not text (ids
    // mode shows it).
    if (end && text) {
      generated.pop_back();
      break;
    }
    if (stream && o.stream) {
      out << stream->Push(next);
      out.flush();
    } else if (!text && o.stream) {
      out << (generated.size() > 1 ? " " : "") << next;
      out.flush();
    }
    if (end)
      break;
    if (generated.size() >= o.max_tokens ||
        engine.position() + 1 > maxSeq)
      break;
    double t0 = now();
    int32_t in = next;
    if (absl::Status s = engine.Forward(absl::MakeConstSpan(&in, 1), &logits);
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
  const RunnerStats &rs = ses.runner().stats();
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
  sj["kv_bytes_per_token"] = engine.kv_bytes_per_token();
  // Where a decoded token's time goes, by op kind (FFN kinds: routing on
  // the host plus the wait for the ducks).
  const double hostReadGbs =
      tokenTimes.empty() ? 0 : HostReadBandwidthGbs(ses.threads());
  // Decode step i (after the prompt) attends over prompt + i + 1
  // positions; the tokens timed are the generated ones after the first.
  const double meanContext =
      generated.size() > 1
          ? (double)prompt.size() + (double)generated.size() / 2.0
          : (double)prompt.size();
  const DecodeBreakdown bd = ComputeDecodeBreakdown(
      ses.plan(), engine, rs, tpotMs, meanContext, hostReadGbs,
      ses.duck_read_gbs() > 0 ? ses.duck_read_gbs() : hostReadGbs,
      ses.local());
  sj["decode_breakdown_ms"] = {
      {"host_attention", bd.host_attention_ms},
      {"host_norms_router", bd.host_norms_router_ms},
      {"lm_head", bd.lm_head_ms},
      {"duck_kernel", bd.duck_kernel_ms},
      {"dispatch_gap", bd.dispatch_gap_ms},
      {"other", bd.other_ms}};
  sj["host_bytes_per_token"] = bd.host_bytes;
  sj["host_cache_bytes_per_token"] = bd.host_cache_bytes;
  sj["mean_context"] = bd.mean_context;
  sj["duck_bytes_per_token"] = bd.duck_bytes_total;
  sj["duck_bytes_per_token_max"] = bd.duck_bytes_max;
  sj["host_read_gb_s"] = bd.host_read_gbs;
  sj["duck_read_gb_s"] = bd.duck_read_gbs;
  sj["decode_bound_ms"] = bd.bound_ms;
  sj["decode_bound_fraction"] = bd.decode_bound_fraction;
  std::vector<std::string> byOp, byOpPrefill;
  sj["decode_ms_per_token_by_op"] =
      OpBreakdown(engine.decode_times(), &byOp);
  sj["prefill_ms_per_token_by_op"] =
      OpBreakdown(engine.prefill_times(), &byOpPrefill);
  sj["decode_steps"] = rs.decode_steps.size();
  sj["prefill_steps"] = rs.prefill_steps.size();
  sj["ducks"] = ses.ducks();
  sj["persistent"] = ses.persistent();
  sj["recoveries"] = ses.runner().recoveries();
  std::vector<double> gps;
  for (size_t r = 0; r < rs.params.size(); ++r)
    gps.push_back(rs.kernel_ns[r] > 0 ? rs.params[r] / rs.kernel_ns[r] : 0);
  sj["duck_kernel_gparam_s"] = gps;
  sj["total_s"] = now() - tStart;
  if (absl::Status fault = ses.CheckTestFault(); !fault.ok())
    return fault;
  if (!o.summary_json.empty()) {
    std::ofstream f(o.summary_json);
    f << sj.dump(2) << "\n";
    if (!f)
      return absl::InternalError(
          absl::StrCat("cannot write '", o.summary_json, "'"));
  }
  if (!so.quiet) {
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
        ses.persistent() ? "persistent" : "per-step run");
    std::vector<std::string> per;
    for (size_t r = 0; r < gps.size(); ++r)
      per.push_back(absl::StrFormat("duck %zu %.2f", r, gps[r]));
    err << "duckrun: kernel Gparam/s: " << absl::StrJoin(per, ", ") << "\n";
    err << absl::StrFormat("duckrun: KV cache %.1f KiB a token (host)\n",
                           engine.kv_bytes_per_token() / 1024.0);
    if (!tokenTimes.empty())
      err << FormatDecodeBreakdown(bd);
    if (!byOp.empty())
      err << "duckrun: decode ms a token by op: " << absl::StrJoin(byOp, ", ")
          << "\n";
    if (!byOpPrefill.empty())
      err << "duckrun: prefill ms a token by op: "
          << absl::StrJoin(byOpPrefill, ", ") << "\n";
  }
  ses.Close();
  return absl::OkStatus();
}

} // namespace duck::runtime
