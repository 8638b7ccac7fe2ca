//===- Candidates.cpp - the partitions --tp auto weighs -------------------===//
#include "duck/CostModel/Candidates.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Threading.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iterator>
#include <memory>
#include <thread>

using namespace mlir::duck;
using namespace mlir::duck::cost;
using llvm::formatv;

std::string Candidate::attn() const {
  std::string s;
  for (auto [on, name] : {std::pair{inOn, "in"}, std::pair{qOn, "q"},
                          std::pair{oOn, byHeads ? "o/h" : "o"}})
    if (on)
      s += (s.empty() ? "" : "+") + std::string(name);
  return s.empty() ? "host" : s;
}

std::string Candidate::attnWords() const {
  if (!inOn && !qOn && !oOn)
    return ", attention projections on the host";
  if (!inOn && !qOn)
    return ", o_proj on the ducks";
  std::vector<std::string> w;
  for (auto [on, name] : {std::pair{inOn, "input"}, std::pair{qOn, "query"},
                          std::pair{oOn, "output"}})
    if (on)
      w.push_back(name);
  std::string s = ", " + w[0];
  for (size_t i = 1; i < w.size(); ++i)
    s += (i + 1 == w.size() ? " and " : ", ") + w[i];
  return s + " projections on the ducks" +
         (!byHeads               ? ""
          : mlaAbsorb == "ducks" ? " by heads, kv_b_proj with them"
                                 : ", the output by heads");
}

void cost::readStats(const llvm::json::Object &j, Candidate &c) {
  c.costed = true;
  c.tokS = j.getNumber("estimated_decode_tok_s").value_or(0);
  c.streamMs = j.getNumber("stream_ms_per_token").value_or(0);
  c.dispatchMs = j.getNumber("dispatch_ms_per_token").value_or(0);
  c.hostMs = j.getNumber("host_ms_per_token").value_or(0);
  c.networkMs = j.getNumber("network_ms_per_token").value_or(0);
  c.netOutMs = j.getNumber("network_out_ms_per_token").value_or(0);
  c.netBackMs = j.getNumber("network_back_ms_per_token").value_or(0);
  c.netLatencyMs = j.getNumber("network_latency_ms_per_token").value_or(0);
  c.meshMs = j.getNumber("mesh_ms_per_token").value_or(0);
  c.prefillTokS = j.getNumber("estimated_prefill_tok_s").value_or(0);
  c.stageShared = j.getBoolean("stage_shared").value_or(false);
  c.inOn = j.getBoolean("in_proj_on_ducks").value_or(false);
  c.qOn = j.getBoolean("q_proj_on_ducks").value_or(false);
  c.oOn = j.getBoolean("o_proj_on_ducks").value_or(false);
  if (const llvm::json::Array *a = j.getArray("per_duck_bytes"))
    for (const llvm::json::Value &b : *a) {
      c.duckBytes.push_back(b.getAsInteger().value_or(0));
      c.maxShardBytes = std::max<uint64_t>(c.maxShardBytes, c.duckBytes.back());
    }
  if (const llvm::json::Array *a = j.getArray("ffn_layer_costs"))
    for (const llvm::json::Value &v : *a) {
      const llvm::json::Object *l = v.getAsObject();
      if (!l)
        continue;
      Candidate::Layer rec{l->getInteger("layer").value_or(0),
                           l->getBoolean("moe").value_or(false),
                           l->getNumber("ms_per_token").value_or(0),
                           {}};
      if (const llvm::json::Array *b = l->getArray("duck_bytes"))
        for (const llvm::json::Value &x : *b)
          rec.duckBytes.push_back(x.getAsInteger().value_or(0));
      c.layers.push_back(std::move(rec));
    }
}

std::vector<Candidate> cost::enumerateCandidates(const SearchRequest &r) {
  std::vector<int64_t> tps;
  for (int64_t t = r.tpOpen ? 1 : r.ducks; t <= r.ducks; ++t)
    tps.push_back(t);
  const std::vector<std::string> mos =
      r.multipleOfOpen ? std::vector<std::string>{"128", "64", "32"}
                       : std::vector<std::string>{r.multipleOf};
  const std::vector<std::string> strategies =
      r.strategyOpen ? std::vector<std::string>{"intermediate", "experts"}
                     : std::vector<std::string>{r.strategy};
  // The LM head: the checkpoint's on the host or fp9 on the ducks. The
  // attention projections: all on the host, the o_projs on the ducks, the
  // query and output projections, or all of them with the input ones too.
  const std::vector<std::string> heads =
      r.lmHeadOpen ? std::vector<std::string>{r.lmHead, "ducks"}
                   : std::vector<std::string>{r.lmHead};
  struct Places {
    const char *in, *q, *o; // `r`'s strings outlive the enumeration
  };
  static const Places kOpen[] = {{"host", "host", "host"},
                                 {"host", "host", "ducks"},
                                 {"host", "ducks", "ducks"},
                                 {"ducks", "ducks", "ducks"}};
  std::vector<Places> projs;
  if (r.projOpen)
    projs.assign(std::begin(kOpen), std::end(kOpen));
  else
    projs.push_back({r.inProj.c_str(), r.qProj.c_str(), r.oProj.c_str()});
  // The same with the output projection by heads, where it can go so.
  std::vector<bool> byHeads(projs.size(), false);
  for (size_t i = 0, n = projs.size(); r.projOpen && r.byHeadsOpen && i < n;
       ++i)
    if (std::string(projs[i].o) == "ducks" &&
        (!r.mla || std::string(projs[i].q) == "ducks")) {
      projs.push_back(projs[i]);
      byHeads.push_back(true);
    }
  std::vector<Candidate> out;
  for (int64_t t : tps)
    for (const std::string &mo : mos)
      for (const std::string &st : strategies)
        for (const std::string &h : heads)
          for (size_t i = 0; i < projs.size(); ++i) {
            const Places &p = projs[i];
            Candidate c;
            c.byHeads = byHeads[i];
            c.tp = t;
            c.multipleOf = mo;
            c.strategy = st;
            c.lmHead = h;
            c.inProj = p.in;
            c.qProj = p.q;
            c.oProj = p.o;
            // By heads: a GQA's o_proj by its columns; an MLA's with its
            // kv_b_proj (--mla-absorb ducks).
            if (c.byHeads && r.mla)
              c.mlaAbsorb = "ducks";
            else if (c.byHeads)
              c.oProj = "heads";
            out.push_back(std::move(c));
          }
  return out;
}

namespace {

/// A candidate's layout grows with its ducks (measured on DeepSeek-V3.2,
/// the model imported once: about 24 ducks' worth of fixed work, then one
/// per duck): the ETA counts work in those units.
uint64_t workOf(const Candidate &c) { return (uint64_t)c.tp + 24; }

/// Shows the search's progress until every candidate is costed.
void showProgress(const std::atomic<size_t> &finished,
                  const std::atomic<uint64_t> &worked, size_t total,
                  uint64_t work, bool progress, bool tty,
                  const std::function<double()> &elapsed) {
  double lastShown = -1;
  while (finished.load() < total) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const double secs = elapsed();
    const size_t done = finished.load();
    if (progress && done > 0 && done < total && secs - lastShown >= 0.5) {
      lastShown = secs;
      const double w = double(worked.load());
      llvm::errs() << formatv("{0}duckc: costing candidates: {1}/{2}, ETA "
                              "{3:F0} s{4}",
                              tty ? "\r" : "", done, total,
                              secs / w * (double(work) - w), tty ? "   " : "\n");
      llvm::errs().flush();
    }
  }
}

} // namespace

void cost::costCandidates(std::vector<Candidate> &all,
                          const std::function<Evaluator()> &makeEvaluator,
                          bool progress, bool tty) {
  const std::vector<Candidate> jobs = all;
  const size_t total = jobs.size();
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  };
  uint64_t work = 0;
  for (const Candidate &j : jobs)
    work += workOf(j);
  std::atomic<size_t> next{0}, finished{0};
  std::atomic<uint64_t> worked{0};
  auto worker = [&] {
    const Evaluator evaluate = makeEvaluator();
    for (size_t i; (i = next++) < total;) {
      all[i] = evaluate(jobs[i]);
      worked += workOf(jobs[i]);
      ++finished;
    }
  };
  const unsigned threads = (unsigned)std::min<size_t>(
      std::max(1u, llvm::hardware_concurrency().compute_thread_count()),
      total);
  // With more than one, every core costs candidates and this thread only
  // reports.
  std::vector<std::thread> pool;
  for (unsigned i = 0; threads > 1 && i < threads; ++i)
    pool.emplace_back(worker);
  if (threads <= 1)
    worker();
  else
    showProgress(finished, worked, total, work, progress, tty, elapsed);
  for (std::thread &t : pool)
    t.join();
  if (progress && elapsed() >= 0.5)
    llvm::errs() << formatv("{0}duckc: costed {1} candidates in {2:F1} s on "
                            "{3} thread(s){4}\n",
                            tty ? "\r" : "", total, elapsed(), threads,
                            tty ? std::string(30, ' ') : std::string());
}

std::vector<std::pair<int64_t, bool>>
cost::mixLayers(const Candidate &split, const Candidate &whole,
                const std::vector<uint64_t> &memory) {
  if (!split.costed || !whole.costed ||
      split.layers.size() != whole.layers.size() ||
      split.duckBytes.size() != whole.duckBytes.size())
    return {};
  const size_t n = split.layers.size(), tp = split.duckBytes.size();
  std::vector<bool> byExperts(n, false);
  for (size_t i = 0; i < n; ++i)
    byExperts[i] = split.layers[i].moe &&
                   whole.layers[i].ms < split.layers[i].ms * (1 - 0.01);
  // Each duck's bytes: everything but the MoE layers (the split's), plus
  // each MoE layer as cut.
  auto bytesOf = [&](const std::vector<bool> &x) {
    std::vector<uint64_t> b = split.duckBytes;
    for (size_t i = 0; i < n; ++i)
      if (x[i])
        for (size_t r = 0; r < tp && r < split.layers[i].duckBytes.size() &&
                           r < whole.layers[i].duckBytes.size();
             ++r)
          b[r] += whole.layers[i].duckBytes[r] - split.layers[i].duckBytes[r];
    return b;
  };
  // The excess over each duck's memory with layer `flip` switched (none
  // when flip == n), from the bytes b of the current mix: the bytes with one
  // layer switched are b plus or minus that layer's difference, so each try
  // costs one pass over the ducks (the search mixes every candidate's).
  auto excess = [&](const std::vector<uint64_t> &b, size_t flip, bool on) {
    double e = 0;
    for (size_t r = 0; r < tp && r < memory.size(); ++r) {
      uint64_t v = b[r];
      if (flip < n && r < split.layers[flip].duckBytes.size() &&
          r < whole.layers[flip].duckBytes.size()) {
        const uint64_t d =
            whole.layers[flip].duckBytes[r] - split.layers[flip].duckBytes[r];
        v = on ? v + d : v - d;
      }
      e += v > memory[r] ? double(v - memory[r]) : 0.0;
    }
    return e;
  };
  std::vector<uint64_t> bytes = bytesOf(byExperts);
  for (double over = excess(bytes, n, false); over > 0;) {
    size_t pick = n;
    double pickGain = 0, pickCost = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!split.layers[i].moe)
        continue;
      const bool on = !byExperts[i];
      const double gain = over - excess(bytes, i, on);
      if (gain <= 0)
        continue;
      const double cost =
          std::max(0.0, (on ? whole.layers[i].ms : split.layers[i].ms) -
                            (on ? split.layers[i].ms : whole.layers[i].ms));
      // The most bytes freed a millisecond lost (free switches first).
      if (pick == n || cost * pickGain < pickCost * gain) {
        pick = i;
        pickGain = gain;
        pickCost = cost;
      }
    }
    if (pick == n)
      return {}; // no mix fits either
    byExperts[pick] = !byExperts[pick];
    bytes = bytesOf(byExperts);
    over = excess(bytes, n, false);
  }
  std::vector<std::pair<int64_t, bool>> moe;
  size_t experts = 0;
  for (size_t i = 0; i < n; ++i)
    if (split.layers[i].moe) {
      moe.push_back({split.layers[i].layer, byExperts[i]});
      experts += byExperts[i];
    }
  if (experts == 0 || experts == moe.size())
    return {};
  return moe;
}

const Candidate *cost::pickBest(const std::vector<Candidate> &all) {
  double fastest = 0;
  for (const Candidate &c : all)
    if (c.ok)
      fastest = std::max(fastest, c.tokS);
  auto better = [&](const Candidate &a, const Candidate &b) {
    if (a.tp != b.tp)
      return a.tp < b.tp;
    if (a.multipleOf != b.multipleOf)
      return std::stoi(a.multipleOf) > std::stoi(b.multipleOf);
    if (a.mixed() != b.mixed())
      return !a.mixed(); // one strategy for every layer
    if (a.steps() != b.steps())
      return a.steps() < b.steps(); // fewer steps
    if (a.lmHead != b.lmHead)
      return b.lmHead == "ducks"; // the host's head
    return a.tokS > b.tokS * (1 + 1e-9);
  };
  const Candidate *best = nullptr;
  for (const Candidate &c : all) {
    if (!c.ok || c.tokS < fastest * (1 - kTieFraction))
      continue;
    if (!best || better(c, *best))
      best = &c;
  }
  return best;
}

namespace {

/// The ducks' rate as --explain's first line gives it.
std::string ratesText(const ClusterModel &cm) {
  if (!cm.duckGparamS.empty()) {
    std::string r;
    for (double v : cm.duckGparamS)
      r += (r.empty() ? "" : "/") + formatv("{0:F1}", v).str();
    return "fp9 Gparam/s by duck (measured) " + r + " (slices in proportion" +
           (cm.duckKernelGparamS.empty()
                ? std::string(")")
                : std::string("; each kernel class timed at its own "
                              "measured rate)"));
  }
  if (cm.fp9GparamS > 0)
    return formatv("{0:F2} Gparam/s a duck (measured)", cm.fp9GparamS).str();
  return formatv("{0:F1} GB/s a duck", cm.bandwidthGbs).str();
}

/// The host's part as --explain's first line gives it.
std::string hostText(const ClusterModel &cm) {
  if (cm.hostMsPerToken > 0)
    return formatv("host {0:F3} ms a token (measured)", cm.hostMsPerToken)
               .str() +
           (cm.hostReadGbs > 0
                ? formatv(" + an LM head on the host at {0:F1} GB/s",
                          cm.hostReadGbs)
                      .str()
                : std::string());
  if (cm.hostReadGbs > 0)
    return formatv("host weights (attention, routers, an LM head on the "
                   "host) at {0:F1} GB/s{1}",
                   cm.hostReadGbs,
                   cm.hostFp8BytesPerWeight > 1.0
                       ? ", an FP8 checkpoint's converted to fp9"
                       : "")
        .str();
  return "host work not counted";
}

/// --explain's first line: what the prediction is made of.
void explainModel(const ClusterModel &cm, const std::vector<uint64_t> &memory,
                  llvm::raw_ostream &out) {
  const uint64_t mem =
      memory.empty() ? 0 : *std::min_element(memory.begin(), memory.end());
  const std::string calls =
      cm.duckGemvCallUs.empty()
          ? std::string()
          : formatv(", {0:F1} us more a GEMV call (the slowest duck's)",
                    *std::max_element(cm.duckGemvCallUs.begin(),
                                      cm.duckGemvCallUs.end()))
                .str();
  std::string links = linksText(cm);
  if (!links.empty())
    links = "; " + links;
  out << formatv("cost model: {0}{4}, {1:F0} us a step; {2}{3}{5}\n",
                 ratesText(cm), cm.stepOverheadUs, hostText(cm),
                 mem >= (1ull << 30)
                     ? formatv("; {0:F1} GiB a duck", mem / 1073741824.0).str()
                 : mem
                     ? formatv("; {0:F1} MiB a duck", mem / 1048576.0).str()
                     : std::string(),
                 calls, links);
}

} // namespace

void cost::explainCandidates(const std::vector<Candidate> &all,
                             const Candidate *best, const SearchRequest &r,
                             const ClusterModel &cm,
                             const std::vector<uint64_t> &memory,
                             llvm::raw_ostream &out) {
  explainModel(cm, memory, out);
  // With the head's or projections' place open, a column says where they
  // go and the host's time (the host head's share included) is shown; with
  // a link speed given, each candidate's time on the wire.
  const bool hostCol = r.lmHeadOpen || r.projOpen;
  const bool netCol = cm.linksGiven() || cm.latencyUs > 0;
  out << "  tp  multiple_of  strategy    " << (r.lmHeadOpen ? "  LM head  " : "")
      << (r.projOpen ? "  attn proj" : "") << (hostCol ? "    host ms" : "")
      << "  TPOT ms  stream ms  dispatch ms" << (netCol ? "  network ms" : "")
      << "  tok/s    largest shard\n";
  for (const Candidate &c : all) {
    const std::string head =
        (r.lmHeadOpen
             ? formatv("  {0,-9}", c.lmHead == "ducks" ? "ducks" : "host").str()
             : std::string()) +
        (r.projOpen ? formatv("  {0,-9}", c.attn()).str() : std::string());
    if (!c.ok) {
      llvm::StringRef why = llvm::StringRef(c.why).split('\n').first;
      out << formatv("{0,4}  {1,11}  {2,-12}{3}  not legal: {4}\n", c.tp,
                     c.multipleOf, c.strategyName(), head, why);
    } else {
      const std::string host =
          hostCol ? formatv("  {0,9:F3}", c.hostMs).str() : std::string();
      const std::string net =
          netCol ? formatv("  {0,10:F3}", c.networkMs).str() : std::string();
      out << formatv("{0,4}  {1,11}  {2,-12}{3}{4}  {5,7:F3}  {6,9:F3}  "
                     "{7,11:F3}{11}  {8,7:F2}  {9,10:F3} GiB{10}\n",
                     c.tp, c.multipleOf, c.strategyName(), head, host,
                     1e3 / c.tokS, c.streamMs, c.dispatchMs, c.tokS,
                     c.maxShardBytes / 1073741824.0,
                     &c == best ? "  <- chosen" : "", net);
    }
    if (c.mixed())
      out << "        mixed: " << c.strategy << "\n";
  }
}

void cost::explainChoice(const std::vector<Candidate> &all,
                         const Candidate &best, const SearchRequest &r,
                         llvm::raw_ostream &out) {
  int better = 0;
  for (const Candidate &c : all)
    better += c.ok && &c != &best;
  out << formatv(
      "chosen: tp {0}, multiple_of {1}, strategy {2}{10}: predicted {3:F2} "
      "tok/s (TPOT {4:F3} ms: fp9 stream {5:F3} + dispatch {6:F3}{9}){11}; "
      "the fastest of {7} legal candidates{8}\n",
      best.tp, best.multipleOf,
      best.mixed() ? "mixed (" + best.strategy + ")" : best.strategy, best.tokS,
      1e3 / best.tokS, best.streamMs, best.dispatchMs, better + 1,
      ", predictions within 3 % of the fastest counting as ties (fewer "
      "ducks, then the larger K-block, win)",
      (best.hostMs > 0 ? formatv(" + host {0:F3}", best.hostMs).str()
                       : std::string()) +
          (best.networkMs > 0
               ? formatv(" + network {0:F3} (out {1:F3} + back {2:F3} + "
                         "latency {3:F3}{4})",
                         best.networkMs, best.netOutMs, best.netBackMs,
                         best.netLatencyMs,
                         best.meshMs > 0
                             ? formatv(" + the ducks' collectives {0:F3}",
                                       best.meshMs)
                                   .str()
                             : std::string())
                     .str()
               : std::string()),
      std::string(r.lmHeadOpen
                      ? (best.lmHead == "ducks" ? ", LM head on the ducks"
                                                : ", LM head on the host")
                      : "") +
          (r.projOpen ? best.attnWords() : ""),
      best.prefillTokS > 0
          ? formatv(", prefill {0:F1} tok/s", best.prefillTokS).str()
          : std::string());
  const double tpot = 1e3 / best.tokS;
  using Wire = ClusterModel::Wire;
  const bool f32Left = r.wireX == Wire::f32 || r.wireOut == Wire::f32;
  if ((r.wireX != Wire::q8 || r.wireOut != Wire::q8) &&
      best.networkMs > 0.15 * tpot)
    out << formatv("the network is {0:F0} % of the token: "
                   "--wire-activations and --wire-results {1}q8 (1.0625 "
                   "bytes a value) send less than {2} (the logits move by "
                   "what docs/perf.md gives; 'auto', the default, takes the "
                   "coarsest the checkpoint's own inference admits where "
                   "link speeds are given)\n",
                   100 * best.networkMs / tpot,
                   f32Left ? "bf16 (2 bytes a value) or " : "",
                   f32Left ? "fp32's 4" : "bf16's 2");
}

std::string cost::noCandidateMessage(const std::vector<Candidate> &all) {
  return "no candidate partition is legal for this model and cluster" +
         (all.empty() ? std::string()
                      : ": e.g. tp " + std::to_string(all.back().tp) +
                            ", multiple_of " + all.back().multipleOf + ": " +
                            all.back().why);
}
