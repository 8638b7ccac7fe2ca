//===- Candidates.h - the partitions --tp auto weighs ----------*- C++ -*-===//
//
// The search `duckc compile --tp auto` / `--explain` runs: which candidates
// the flags leave open, each costed by a caller-given evaluator (a dry-run
// layout and its stats), the per-layer mix of two cuts, the ranking and
// the --explain table. Plain data: no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef DUCK_COSTMODEL_CANDIDATES_H
#define DUCK_COSTMODEL_CANDIDATES_H

#include "duck/CostModel/CostModel.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mlir::duck::cost {

/// One candidate partition and what the cost model predicts for it.
struct Candidate {
  int64_t tp = 1;
  std::string multipleOf, strategy, lmHead, oProj = "host", qProj = "host",
                                            inProj = "host";
  /// The output projection by heads (a GQA's o_proj by its heads'
  /// columns, --o-proj heads; an MLA's kv_b_proj with it, --mla-absorb
  /// ducks): asked of the candidate, and what the compile then set.
  bool byHeads = false;
  std::string mlaAbsorb = "host";
  /// Its steps cast once to every duck (duckc --fanout multicast): what
  /// the search ran it with.
  bool multicast = false;
  /// The wire's formats both ways (duckc --wire-activations and
  /// --wire-results): what the search ran it with.
  ClusterModel::Wire wireX = ClusterModel::Wire::f32,
                     wireOut = ClusterModel::Wire::f32;
  /// Its MoE steps staged (duckc --stage-shared): what its stats chose
  /// (ClusterModel::stageSharedOpen) or were told.
  bool stageShared = false;
  /// Where the attention projections went (the stats say: a GQA query
  /// projection is one of its input projections, so in+q is in there).
  bool inOn = false, qOn = false, oOn = false;
  /// For --explain: "host", or those on the ducks ("in+q+o").
  std::string attn() const;
  /// The same in words, for the chosen line.
  std::string attnWords() const;
  int steps() const { return inOn + qOn + oOn; }
  bool ok = false;
  std::string why; // the compiler's refusal when not ok
  double tokS = 0, streamMs = 0, dispatchMs = 0, hostMs = 0, prefillTokS = 0;
  double networkMs = 0; // 0: no link speed in the cluster file
  double netOutMs = 0, netBackMs = 0, netLatencyMs = 0; // networkMs's parts
  double meshMs = 0; // and the ducks' collectives (--residual ducks)
  uint64_t maxShardBytes = 0;
  /// The cost model's figures, even when the shards do not fit (`ok`
  /// false, `why` says which duck): what a per-layer mix is made from.
  bool costed = false;
  std::vector<uint64_t> duckBytes;
  struct Layer {
    int64_t layer;
    bool moe;
    double ms;
    std::vector<uint64_t> duckBytes;
  };
  std::vector<Layer> layers;
  /// A list by layer (given, or a mix the search made): `strategy` is its
  /// spec, shown as "mixed".
  bool mixed() const {
    return strategy != "intermediate" && strategy != "experts";
  }
  std::string strategyName() const { return mixed() ? "mixed" : strategy; }
  /// The same partition and places (another strategy aside).
  bool samePlaces(const Candidate &o) const {
    return tp == o.tp && multipleOf == o.multipleOf && lmHead == o.lmHead &&
           oProj == o.oProj && qProj == o.qProj && inProj == o.inProj;
  }
};

/// Reads a candidate's prediction from duck-stats' JSON (statsToJson):
/// its times, where the projections went, each duck's bytes and each FFN
/// layer's cost. Sets `costed`; `ok` is the caller's (memory).
void readStats(const llvm::json::Object &stats, Candidate &c);

/// What the flags leave open, and what they fix.
struct SearchRequest {
  int64_t ducks = 1; // the cluster's; the tp when it is not open
  bool tpOpen = false, multipleOfOpen = false, strategyOpen = false;
  /// The LM head's and the attention projections' places: open when no
  /// flag gives them and the cluster file gives the host's bandwidth (the
  /// cost of keeping them on the host).
  bool lmHeadOpen = false, projOpen = false;
  /// With projOpen: also each choice with the output projection on the
  /// ducks by heads (for an MLA, `mla`, only with its query projection
  /// there too: kv_b_proj goes with them).
  bool byHeadsOpen = false, mla = false;
  /// The wire's formats (duckc --wire-activations and --wire-results, or
  /// the search's): the hint to shrink them names only smaller ones.
  ClusterModel::Wire wireX = ClusterModel::Wire::f32,
                     wireOut = ClusterModel::Wire::f32;
  std::string multipleOf, strategy, lmHead, inProj, qProj, oProj;
};

/// Every candidate `r` leaves open, in the search's order (tp, multiple_of,
/// strategy, LM head, projections), uncosted.
std::vector<Candidate> enumerateCandidates(const SearchRequest &r);

/// Costs every candidate on every core, each thread taking the next; the
/// results keep the order. `makeEvaluator` is called once a thread (what
/// it sets up, an imported model, is that thread's). Progress on stderr
/// when `progress` (rewriting one line when `tty`).
using Evaluator = std::function<Candidate(const Candidate &)>;
void costCandidates(std::vector<Candidate> &all,
                    const std::function<Evaluator()> &makeEvaluator,
                    bool progress, bool tty);

/// --strategy auto, layer by layer: from a candidate's intermediate split
/// and its whole-expert placement (same tp, block and projections), each
/// MoE layer cut the way the cost model predicts faster (by more than
/// 1 %; nearer is noise of the expected-maximum estimate); then, while
/// some duck cannot hold its shard (`memory`, a duck's bytes; empty: no
/// limit), the layer whose switch frees the most of the excess for the
/// least time switches. Returns each MoE layer and whether it takes whole
/// experts; empty when the mix is one of the two uniform cuts, when no
/// mix fits, or when either cut was not costed.
std::vector<std::pair<int64_t, bool>>
mixLayers(const Candidate &split, const Candidate &whole,
          const std::vector<uint64_t> &memory);

/// Predictions within this fraction of the fastest count as ties (the
/// noise of the measured rates).
constexpr double kTieFraction = 0.03;

/// The winner among the legal candidates: the fastest, predictions within
/// 3 % of it counting as ties (the noise of the measured rates), which go
/// to fewer ducks, then the larger K-block, then one strategy for every
/// layer, then fewer duck steps, then the host's LM head, then the faster
/// prediction. Null when none is legal.
const Candidate *pickBest(const std::vector<Candidate> &all);

/// --explain: the cost model's figures, every candidate (with an LM head
/// or projections column when their places were open), the winner marked.
/// `memory`: each duck's bytes (empty: not given).
void explainCandidates(const std::vector<Candidate> &all,
                       const Candidate *best, const SearchRequest &r,
                       const ClusterModel &c,
                       const std::vector<uint64_t> &memory,
                       llvm::raw_ostream &out);

/// --explain's last line: the winner and why.
void explainChoice(const std::vector<Candidate> &all, const Candidate &best,
                   const SearchRequest &r, llvm::raw_ostream &out);

/// Why there is no winner, with the last candidate's refusal.
std::string noCandidateMessage(const std::vector<Candidate> &all);

} // namespace mlir::duck::cost

#endif // DUCK_COSTMODEL_CANDIDATES_H
