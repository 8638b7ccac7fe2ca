//===- CostModel.h - predicted token time of a partition -------*- C++ -*-===//
//
// The cost model duck-stats and `duckc compile --tp auto` predict with: plain
// functions over plain data (a cluster's measured figures, each layer's
// shapes as the layout gave them), so it is tested without a module.
//
//===----------------------------------------------------------------------===//
#ifndef DUCK_COSTMODEL_COSTMODEL_H
#define DUCK_COSTMODEL_COSTMODEL_H

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace mlir::duck {

/// Cluster shape and cost model.
struct ClusterModel {
  double bandwidthGbs = 10.0;  // one duck's streaming read bandwidth
  /// Rows a decode step carries: 1, or a speculative verify step's next
  /// token and its drafts (its wire carries them all; an MoE layer's
  /// experts are the union the rows choose).
  int64_t decodeRows = 1;
  /// Speculative decoding to project (duckc --speculative-drafts,
  /// --speculative-acceptance): drafts a verify step and the chance each
  /// is accepted given the ones before it were. 0 drafts: none.
  int64_t speculateDrafts = 0;
  double speculateAcceptance = 0;
  double stepOverheadUs = 80.0; // dispatch per FFN step
  /// How many ducks stepOverheadUs was measured with at once (cluster file
  /// `step_overhead_ducks`; duck-measure-cluster writes 1: a duck's own
  /// ping). 0: the figure is the whole cluster's step (the seed's 78 us
  /// at tp 32). With a count below a plan's tp, each step also costs the
  /// host two frames (one out, one back) for every further duck at
  /// hostFrameUs (stepOverheadMs).
  int64_t stepOverheadDucks = 0;
  /// Measured fp9 kernel rate of one duck (duck-bench kernels, all its
  /// cores); when set, a duck's time is its weights / this rate rather
  /// than its bytes / bandwidth.
  double fp9GparamS = 0;
  /// Measured host time a decoded token (attention, norms, router, and the
  /// LM head unless hostReadGbs is given: duckrun's breakdown); the same
  /// for every partition.
  double hostMsPerToken = 0;
  /// The host's read bandwidth (cluster file `host_read_gbs`): when set, an
  /// LM head on the host costs its bytes at this rate, on top of
  /// hostMsPerToken, so the head's placement can be chosen; without a
  /// measured hostMsPerToken the host's other weights (attention, routers)
  /// are timed at this rate too.
  double hostReadGbs = 0;
  /// Bytes a weight of the host's own matrices from an FP8 checkpoint, as
  /// the host reads them: the checkpoint's e4m3, 1 (duckrun's default on
  /// every host), or fp9's 1.125 (cluster file `"host_fp8": "fp9"`, which
  /// `measure-cluster --host` writes on a host run with DUCK_HOST_FP8=fp9).
  double hostFp8BytesPerWeight = 1.0;
  /// Bytes a weight of a host LM head (1.125 for --lm-head fp9/int8; 0:
  /// the checkpoint's dtype).
  double hostHeadBytesPerWeight = 0;
  /// Prefill: a duck's fp9 GEMM rate (MACs a second / 1e9, all its cores,
  /// at prompt-chunk sizes: `duck-bench kernels --filter prefill/`), the
  /// rows a prompt step carries, and the host's time a prompt token
  /// (duckrun's summary). Without gemmGmacS no prefill is predicted.
  double gemmGmacS = 0;
  int64_t prefillChunk = 64;
  double hostPrefillMsPerToken = 0;
  /// Host attention over the cache: the host's fp32 multiply-add rate on
  /// such work (MACs a second / 1e9, all its cores: `duckc measure-cluster
  /// --host`) and the context a decoded token attends over; with both, a
  /// token's attention MACs (scores and weighted sums over the cached
  /// positions, DeepSeek-V3.2's indexer scores, and its selection capped at
  /// index_topk) are added to the host's time, each op's no less than its
  /// fp32 cache reads at hostReadGbs when that is given. 0: not counted.
  double hostGmacS = 0;
  int64_t contextTokens = 0;
  /// Per duck (rank order), when the ducks differ: overrides fp9GparamS.
  std::vector<double> duckGparamS;
  /// Per duck (rank order), the measured rate of each kernel class, by
  /// duck_kernel_id (0: not measured; `duckc measure-cluster`'s
  /// fp9_gparam_s_by_kernel). When a duck has them, each of its matrices
  /// is timed at its own class's rate.
  std::vector<std::vector<double>> duckKernelGparamS;
  /// Per duck (rank order), what one GEMV call costs beyond its weights
  /// at the rate (microseconds; `duckc measure-cluster`'s gemv_call_us):
  /// added for every matrix the duck runs in a step (an expert's three,
  /// a row-split matrix's one). Empty: not counted.
  std::vector<double> duckGemvCallUs;
  /// The network: the host's link and each duck's (Gbit/s each way, full
  /// duplex; cluster file `host_link_gbps`, `ducks[i].link_gbps`, else
  /// `duck_link_gbps`) and the one-way latency between the host and a
  /// duck (`latency_us`). A step sends every duck the same IB (x as fp32
  /// for every row, and a MoE step's routing) and gets each duck's OB back
  /// (its partial sums, or its rows of a row-split matrix, fp32); see
  /// cost::stepWire for how they share the links. 0: not counted
  /// (loopback, or not known).
  double hostLinkGbps = 0;
  std::vector<double> duckLinkGbps; // rank order; empty: none known
  double latencyUs = 0;
  /// How a step reaches the ducks: `unicast` (the host sends each duck its
  /// own copy), `multicast` (built: cast steps, below) or `relay`,
  /// MODELLED ONLY (the
  /// runtime does not relay; duckc refuses to write a plan with it): the
  /// host sends relayHostFanout copies (1: one send a step) to the first
  /// ducks, each duck forwards the whole frame to relayFanout children over
  /// its own link, and the replies come back up the same tree, partial sums
  /// reduced at each duck (in a fixed order: its own, then its children's
  /// in order), row-split outputs gathered. See cost::relayWire.
  /// `multicast`: the host sends a step's IB once as datagrams and the
  /// switch gives every duck its own (IP multicast on one switch: the
  /// host's port carries it once, each duck's link at its rate, cut
  /// through), each duck its small step_cast frame (duck_rt/cast.h; the
  /// plan's fanout_multicast); a step whose ducks get different inputs
  /// (an output step by heads) is sent as unicast. The replies come back
  /// as unicast's, or with `reduceTree` (MODELLED ONLY) up the relay tree
  /// (relayHostFanout, relayFanout, relayChunkBytes), partial sums reduced
  /// on the way (rows to gather still straight to the host).
  enum class Fanout { unicast, relay, multicast };
  Fanout fanout = Fanout::unicast;
  bool reduceTree = false;
  /// Fanout::multicast: a cast datagram's UDP payload, its header
  /// included (the runtime's DuckClientOptions::cast_datagram_bytes).
  double castDatagramBytes = 1432;
  /// Fanout::multicast: the largest IB the runtime casts (its
  /// DuckClientOptions::cast_max_ib_bytes); a larger one goes to each duck
  /// as unicast's.
  double castMaxIbBytes = 64 << 10;
  /// The cluster file names a cast address ("cast"): with no --fanout,
  /// --tp auto / --explain weigh unicast and multicast.
  bool castAvailable = false;
  int64_t relayFanout = 2, relayHostFanout = 1;
  /// The relay's forwarding unit: 0, whole frames (store and forward: a
  /// duck forwards once it holds the frame); else pieces of this many
  /// bytes, each forwarded (and each piece of partial sums reduced and
  /// sent up) as soon as it is there. Each piece a duck sends up the tree
  /// costs it meshMessageUs of CPU (its pieces leave one after another).
  int64_t relayChunkBytes = 0;
  /// How values cross the wire: fp32; bf16 (half the bytes); q8, blocks
  /// of 32 int8 values and a bf16 scale (1.0625 bytes a value; the ABI's
  /// DUCK_IB_X_Q8).
  enum class Wire { f32, bf16, q8 };
  /// x to the ducks (duckc --wire-activations): every IB's activations.
  Wire wireX = Wire::f32;
  /// The ducks' answers (duckc --wire-results): every OB's values
  /// (partial sums, rows).
  Wire wireOut = Wire::f32;
  /// The FFN step's activations go out ahead (duckc --stage-x), MODELLED
  /// ONLY: as soon as a MoE layer's input is normalised the host sends
  /// every duck its x, computes the router while x is on the wire, then
  /// sends the routing slots alone; x's time out hides behind the
  /// router's reads, up to the router's time. The runtime sends a step
  /// whole (a frame's checksum precedes its payload), so duckc writes no
  /// plan with it.
  bool stageX = false;
  /// Staged MoE steps (duckc --stage-shared; the plan's stage_shared;
  /// abi.h DUCK_IB_STAGE): a MoE decode step's shared experts leave with x
  /// as soon as the layer's input is normalised, the ducks run them (one
  /// slot split over a duck's cores) while the host computes the router,
  /// and the routed slots follow alone, plainly (a few bytes a duck). A
  /// layer with a host router and a shared expert saves min(x's time out
  /// + the shared expert's time on its slowest duck - the routed slots'
  /// time out, the router's time + the step's time out - the stage's),
  /// at most the router's time, less the host's CPU for the one more
  /// frame a duck (hostFrameUs): the stage is quiet, nothing comes back.
  /// With multicast fanout the stage is a cast batch and no frame at all
  /// (protocol 5, step_staged): no frame is added.
  /// `stageSharedOpen`: each candidate takes it where it is faster (--tp
  /// auto with a cluster file and no --stage-shared).
  bool stageShared = false, stageSharedOpen = false;
  /// The host's CPU for one more frame to or from a duck (cluster file
  /// `host_frame_us`; 0: not counted): a staged layer costs the host one
  /// a duck beyond the whole step's (the routed slots' request after the
  /// router; the stage is quiet, its frame out takes the whole step's
  /// place), on the way to the step's answers; none with multicast (the
  /// stage goes as a cast batch alone).
  double hostFrameUs = 0;
  /// The IB flags (duck_ib_flags) that ask for wireX and wireOut.
  uint32_t ibFlags() const;
  /// duckc's name of a wire form: "f32", "bf16", "q8".
  static const char *wireName(Wire w);
  /// The cluster file gives a link speed (the host's or a duck's): the
  /// wire is counted.
  bool linksGiven() const { return hostLinkGbps > 0 || !duckLinkGbps.empty(); }

  /// Cores a duck: its step reply carries a kernel time for each.
  int64_t coresPerDuck = 1;

  /// The ducks keep the residual stream (duckc --residual ducks), MODELLED
  /// ONLY: duckd opens no mesh yet and the ELF has no norm or router, so
  /// duckc writes no plan with it. The host keeps each layer's attention
  /// over its cache and exchanges with the ducks once a layer (each duck
  /// its heads' attention output in, its heads' queries and its slice of
  /// the layer's kv and indexer rows back); the rest of the layer's
  /// reductions and broadcasts run among the ducks as collectives over
  /// their own links (duck_rt/peer_mesh.h; see cost::meshWire), and the
  /// host's weights (routers, indexer) are read by the ducks in slices.
  /// Needs every attention projection on the ducks (in+q+o; an MLA
  /// absorbed).
  bool residualOnDucks = false;
  /// What a collective costs beyond its bytes and latency (cluster file
  /// `mesh_call_us`, and `mesh_message_us` for each message a duck sends
  /// in it: `duck-bench collective` measures both on unlimited links).
  double meshCallUs = 0, meshMessageUs = 0;
  /// Two-level collectives over this many groups of ducks (cluster file
  /// `mesh_groups`; 1: one direct exchange): a duck sends M - 1 + G - 1
  /// messages instead of N - 1, for a second latency and call. 0 (the
  /// default): the fastest for the token's collectives at each tp.
  int64_t meshGroups = 0;
  /// The mesh's messages as UDP datagrams (cluster file `mesh_transport`
  /// "udp", as `measure-cluster --mesh udp` writes): a 24-byte header a
  /// datagram of at most 1432 bytes, instead of 8 bytes a message.
  bool meshDatagrams = false;
};

/// The links a cost model counts, in words ("the host's link 10.00 Gb/s,
/// 2.50 Gb/s a duck, 50 us one way"); empty when none is given.
std::string linksText(const ClusterModel &c);

namespace cost {

//===----------------------------------------------------------------------===//
// What the model reads: a partitioned, laid-out model as plain data.
//===----------------------------------------------------------------------===//

/// One packed fp9 matrix: rows x k in K-blocks of `block`.
struct Matrix {
  uint32_t rows = 0, k = 0, block = 0;
};

/// One duck's part of an FFN layer: the experts it holds ([begin, end) of
/// the layer's ids, routed ones below the layer's numExperts, shared ones
/// after; a dense layer's slice is [0, 1)), their intermediate rows, the
/// three matrices of one of them and its slot's bytes.
struct FfnShard {
  int64_t rank = 0;
  int64_t expertBegin = 0, expertEnd = 1;
  int64_t localInter = 0;
  Matrix gate, up, down;
  uint64_t expertBytes = 0; // gate + up + down of one expert
  uint64_t slotBytes = 0;   // the whole slot, aligned
};

/// One FFN layer (dense or MoE) and its shards, in the order the layout
/// holds them.
struct FfnLayer {
  bool moe = false;
  int64_t hidden = 0;
  int64_t topK = 1, numExperts = 1, numShared = 0; // routed experts
  /// A MoE layer's router weights as the host reads them (bytes).
  double routerHostBytes = 0;
  std::vector<FfnShard> shards;
};

/// A matrix whose rows are split over the ducks (an attention projection
/// or the LM head on the ducks): one more step, each duck its rows.
struct RowSplit {
  enum class Role { head, oProj, qProj, inProj };
  Role role = Role::oProj;
  int64_t k = 0, block = 0;
  std::vector<int64_t> rows;   // a duck's rows, rank order
  std::vector<uint64_t> bytes; // a duck's slot bytes; empty: not laid out
  /// Per duck, when set: weights beyond rows x k (a chained slot's pieces:
  /// duckc --mla-absorb ducks), the floats of its IB (else k) and of its
  /// OB (else its rows), and whether the replies are partial sums of one
  /// vector (an absorbed output step's).
  std::vector<double> extraParams;
  std::vector<int64_t> inWidth, outWidth;
  bool partialSums = false;
};

/// One attention's work over the cache, a decoded token.
struct Attention {
  bool gqa = true;
  double heads = 0;
  double headDim = 0, kvHeads = 0; // GQA
  double kvLora = 0, rope = 0;     // MLA (absorbed)
  double qLora = 0;                // MLA's q_a rows (0: none)
  /// DeepSeek-V3.2's indexer (MLA only): its heads and their width, and
  /// the positions it keeps (0: all).
  bool indexer = false;
  double indexHeads = 0, indexDim = 0, indexTopK = 0;
};

/// Everything the model predicts a partition from.
struct ModelFacts {
  int64_t tp = 1;
  std::vector<FfnLayer> ffn;
  std::vector<RowSplit> rowSplits; // program order, the head last
  std::vector<Attention> attention;
  /// The host's own weights a token as the runtime reads them (attention,
  /// MLA and its indexer, routers: FP8 as fp9, the rest as stored), and
  /// those of them that went to the ducks (what a measured host time no
  /// longer spends).
  double hostWeightBytes = 0, onDucksHostBytes = 0;
  /// Of onDucksHostBytes, the kv_b_proj bytes of MLAs absorbed on the
  /// ducks (duckc --mla-absorb ducks).
  double absorbedHostBytes = 0;
  /// Of hostWeightBytes, what the host reads while a step is on the ducks,
  /// one entry a step: DeepSeek-V3.2's indexer weights_proj, which needs
  /// only the layer's input, during the input projections' step (the
  /// runtime's FfnRunner::Meanwhile). Each hides up to a step's overhead.
  std::vector<double> overlappedHostBytes;
  /// The LM head: its weights and bytes a weight in the checkpoint's dtype
  /// as the host reads it (FP8 as fp9). Unset: the model has none.
  struct LmHead {
    double params = 0, bytesPerWeight = 0;
  };
  std::optional<LmHead> lmHead;
  /// DeepSeek's MTP module (duckc compile --mtp): its FFN layer, its
  /// attention and its projections on the ducks, its host weights, and the
  /// LM head again. Not in a token's cost; a speculative projection with
  /// it runs it once a verify step, over the accepted rows. Null: none.
  std::shared_ptr<const ModelFacts> mtp;
};

//===----------------------------------------------------------------------===//
// What it predicts.
//===----------------------------------------------------------------------===//

/// One FFN layer: its expected slowest duck a token (ms), and each duck's
/// bytes of it (its slot).
struct LayerCost {
  double ms = 0;
  std::vector<uint64_t> duckBytes;
};

/// A partition's prediction, a decoded token (and a prompt token).
struct PlanCost {
  /// Per duck (rank order): fp9 weights and bytes read a decoded token.
  std::vector<double> duckParamsPerToken, duckBytesPerToken;
  std::vector<LayerCost> layers; // as ModelFacts::ffn
  /// The sum over FFN layers of each layer's slowest duck (expected, for
  /// expert placement: top_k experts fall unevenly over the ducks).
  double streamMsPerToken = 0, dispatchMsPerToken = 0, tokS = 0;
  double hostMsPerToken = 0;
  /// The LM head on the ducks (lm-head=ducks): its slowest duck a token,
  /// included in streamMsPerToken (and one more step in the dispatch).
  bool lmHeadOnDucks = false;
  double lmHeadMsPerToken = 0;
  /// Attention output projections on the ducks (o-proj=ducks): the sum
  /// over layers of each one's slowest duck, in streamMsPerToken (one more
  /// step a layer in the dispatch); the host then reads none of them.
  bool oProjOnDucks = false;
  double oProjMsPerToken = 0;
  /// ... split by heads (its columns; partial sums back), not by rows.
  bool oProjByHeads = false;
  /// The same for the query projections (q-proj=ducks).
  bool qProjOnDucks = false;
  double qProjMsPerToken = 0;
  /// The same for the input projections (in-proj=ducks).
  bool inProjOnDucks = false;
  double inProjMsPerToken = 0;
  int64_t attnProjSteps = 0; ///< duck steps of all three, a token
  /// The LM head on the host (ClusterModel::hostReadGbs set): its bytes at
  /// the host's bandwidth, included in hostMsPerToken.
  double hostLmHeadMsPerToken = 0;
  /// The host's own weights a token (attention, MLA, indexer, routers) as
  /// the runtime reads them, and, with hostReadGbs but no measured
  /// hostMsPerToken, their time at that bandwidth (in hostMsPerToken).
  double hostWeightBytesPerToken = 0, hostOpsMsPerToken = 0;
  /// Of hostOpsMsPerToken's reads, the time hidden behind duck steps
  /// (ModelFacts::overlappedHostBytes; already taken off hostMsPerToken).
  double hostOverlappedMsPerToken = 0;
  /// ClusterModel::stageX: the FFN steps' x time out hidden behind the
  /// routers' reads, a token (already taken off networkMsPerToken).
  double stagedXMsPerToken = 0;
  /// ClusterModel::stageShared: the routers' time hidden behind the
  /// staged shared experts a token (taken off hostMsPerToken when
  /// stagedShared), and whether the plan stages (stageSharedOpen: where
  /// it is faster).
  double stagedSharedMsPerToken = 0;
  bool stagedShared = false;
  /// The frames a token staging costs the host beyond whole steps (one a
  /// duck a staged layer): stagedSharedMsPerToken falls by this many
  /// times each us of hostFrameUs, so staging pays while a frame costs
  /// the host less than hostFrameUs + 1e3 * stagedSharedMsPerToken / it.
  double stagedFramesPerToken = 0;
  /// duckc --mla-absorb ducks: the kv_b_proj bytes a token the ducks
  /// took off the host's reads (0: none absorbed).
  double mlaAbsorbedBytesPerToken = 0;
  /// Host attention over contextTokens of cache (ClusterModel::hostGmacS,
  /// and hostReadGbs for the cache's reads): MACs and cache bytes a token
  /// and their time (each op the slower of the two), included in
  /// hostMsPerToken.
  double hostAttnGmacPerToken = 0, hostAttnMsPerToken = 0;
  double hostAttnCacheBytesPerToken = 0;
  /// Prefill (ClusterModel::gemmGmacS set): each FFN layer's slowest duck
  /// over a prompt chunk (and each projection on the ducks), plus a step
  /// each, a prompt token; the token rate with the host's part added.
  double prefillDucksMsPerToken = 0, prefillTokS = 0;
  /// The wire a decoded token: bytes the host sends (every step's frame to
  /// every duck) and receives, and their time over the links
  /// (ClusterModel::hostLinkGbps / duckLinkGbps; 0 when neither is given),
  /// included in the token's time. Prefill's, a prompt token, is in
  /// prefillDucksMsPerToken.
  double hostTxBytesPerToken = 0, hostRxBytesPerToken = 0;
  double networkMsPerToken = 0, prefillNetworkMsPerToken = 0;
  /// networkMsPerToken's parts (StepWire's, summed over a token's steps)
  /// and the steps a decoded token sends.
  double networkOutMsPerToken = 0, networkBackMsPerToken = 0,
         networkLatencyMsPerToken = 0;
  int64_t stepsPerToken = 0;
  /// The speculative projection (ClusterModel::speculateDrafts): a verify
  /// step of `rows` rows, the tokens it yields on average (1 + a + a^2 +
  /// ... over the drafts, a the acceptance), its time (the step with its
  /// rows on the wire, the union of their experts, and each extra row's
  /// host attention), the tokens a second and that against no drafts.
  struct Speculative {
    int64_t rows = 0; // 0: not projected
    double acceptance = 0, tokensPerStep = 0, stepMs = 0, tokS = 0,
           speedup = 0;
    /// With an MTP module (ModelFacts::mtp): what running it costs a
    /// verify step (over the expected accepted rows, rounded up), in stepMs.
    bool mtp = false;
    double mtpMs = 0;
  } speculative;
  /// ClusterModel::residualOnDucks (modelled only): the collectives among
  /// the ducks a token, their time in networkMsPerToken (wire and latency)
  /// and dispatchMsPerToken (meshCall/MessageUs), and the host's weights
  /// the ducks read instead, their time in streamMsPerToken.
  bool residualOnDucks = false;
  int64_t collectivesPerToken = 0;
  double meshMsPerToken = 0, meshLatencyMsPerToken = 0,
         meshOverheadMsPerToken = 0, meshBytesPerDuckPerToken = 0;
  double meshHostWeightsMsPerToken = 0;
  int64_t meshGroups = 1; ///< the groups the collectives were costed with
  /// The token's collectives in order (what duck-bench collective runs).
  struct MeshStep {
    bool reduceScatter = false; // else all-gather
    int64_t values = 0;
    double bytesPerValue = 4;
  };
  std::vector<MeshStep> meshSchedule;
};

/// Expected distinct experts `rows` tokens choose, each top_k of
/// `experts` at random: experts * (1 - (1 - top_k / experts)^rows).
double unionExperts(int64_t experts, int64_t topK, int64_t rows);

/// Predicts a partition: each FFN layer's expected slowest duck, the
/// row-split matrices, the dispatch of every step, the host's time and
/// the wire, a decoded token; and a prompt token with gemmGmacS.
PlanCost costPlan(const ModelFacts &m, const ClusterModel &c);

//===----------------------------------------------------------------------===//
// Its parts, each testable on its own.
//===----------------------------------------------------------------------===//

/// The experts one shard holds on its duck ([begin, end) of the layer's
/// ids; routed ones below num_experts, shared ones after) and the time
/// one of them takes there.
struct HeldExperts {
  size_t rank;
  int64_t begin, end;
  double seconds;
};

/// The expected time of a layer's step: its slowest duck's. A dense layer
/// or a MoE layer whose ducks each hold a slice of every expert is
/// deterministic; with whole experts placed on ducks (strategy experts) a
/// token's top_k experts fall unevenly, and the expectation of the maximum
/// is taken over every combination of top_k experts when there are at most
/// 20000, else over 4096 uniform draws (a fixed seed: the same plan always
/// gets the same prediction). Routing is taken as uniform; a real model's
/// skew makes expert placement slower still.
double expectedSlowest(const std::vector<HeldExperts> &held, bool moe,
                       int64_t topK, int64_t numExperts);

/// expectedSlowest, computed once for each distinct holding: the
/// expectation depends on what each duck holds, not on which duck or which
/// ids (routing is taken as uniform), so layers whose ducks hold the same,
/// the extra experts rotated, share one estimate (DeepSeek-V3.2's 58 MoE
/// layers are 58 estimates of 4096 draws otherwise).
class SlowestMemo {
public:
  double operator()(const std::vector<HeldExperts> &held, bool moe,
                    int64_t topK, int64_t numExperts, int64_t tp);

private:
  // Per duck (sorted, ducks sorted): routed and shared experts held, one
  // expert's seconds; with the layer's kind, top_k and expert count.
  using Holding =
      std::vector<std::vector<std::tuple<int64_t, int64_t, double>>>;
  std::map<std::tuple<bool, int64_t, int64_t, Holding>, double> memo;
};

/// One expert's (or a dense slice's) decode time on its duck: each matrix
/// at its kernel class's measured rate, else the duck's rate, else the
/// expert's bytes at the streaming bandwidth; plus each matrix's call cost.
double expertSeconds(const FfnShard &s, const ClusterModel &c);

/// A duck step's fixed cost on a plan of `tp` ducks (ms): stepOverheadUs,
/// plus, where that was measured with fewer ducks (stepOverheadDucks),
/// 2 x hostFrameUs for each further duck.
double stepOverheadMs(const ClusterModel &c, int64_t tp);

/// The experts of a shard a token runs, on average: routed ones with
/// probability top_k / E, shared ones always; a dense slice 1.
double activeExperts(const FfnShard &s, const FfnLayer &l);

/// A shard's time for one prompt chunk (prefillChunk rows): each weight
/// some row needs decoded once (at the duck's GEMV rate, else its bytes at
/// the bandwidth), then every row's FMAs with it at the GEMM rate.
double prefillShardSeconds(const FfnShard &s, const FfnLayer &l,
                           const ClusterModel &c);

/// One step on the wire: bytes the host sends and receives, and its time
/// over the links (seconds; 0 without a link speed or latency), in three
/// parts: `out` until the last duck has its input, `back` from then until
/// the last reply is in (what of the replies does not overlap the
/// sending), `latency` the one-way latency twice. seconds = their sum.
struct StepWire {
  double txBytes = 0, rxBytes = 0, seconds = 0;
  double outSeconds = 0, backSeconds = 0, latencySeconds = 0;
};
/// A step of `rows` tokens: the same IB to every duck (frame header, step
/// request, IB: `slots` routing slots and `k` floats a token), then each
/// duck's reply (frame header, step reply, a kernel time a core, OB: its
/// header and outWidth[r] floats a token), over unicastWire's links, or
/// relayWire's with Fanout::relay (`partialSums`: the replies are partial
/// sums of one vector, reduced on the way back; else rows, gathered).
StepWire stepWire(const ClusterModel &c, uint32_t rows, uint32_t slots,
                  uint64_t k, const std::vector<int64_t> &outWidth,
                  bool partialSums = false);

/// The relay tree (MODELLED ONLY: the runtime does not relay). Ducks in
/// breadth-first order: the host's children are ducks 0..K-1 (K =
/// relayHostFanout), duck i's are K + F i .. K + F i + F - 1 (F =
/// relayFanout). Every link direction is a FIFO server (as duck-linksim's);
/// a piece crosses the sender's outbound and the receiver's inbound link
/// at once (cut-through) and arrives the latency later. Whole frames
/// (relayChunkBytes 0): a duck forwards once it holds the frame, one copy
/// a child in order (child j of a sender with its frame at t: t +
/// max((j+1) in / sender's rate, in / child's rate) + latency; the host's
/// rate for the host); in pieces, each piece to every child in turn as it
/// comes (the host too: piece k goes to its K children before piece k+1).
/// On the way back a duck sends up once it has its own input and every
/// child's reply (its compute is the stream term, a shift common to all;
/// in pieces with `sums`: piece k once every child's piece k is in); its
/// children's replies share its inbound link. A reply is `headerBytes`
/// plus, with `sums`, `payloadBytes[i]` (partial sums of one vector: every
/// duck's the same size), else the payloads of its whole subtree (rows
/// gathered). The latency part is the tree's time
/// less its time at zero latency; out and back split the rest where the
/// last duck has its input. The host sends K copies, receives K replies.
StepWire relayWire(const ClusterModel &c, double in, double headerBytes,
                   const std::vector<double> &payloadBytes, bool sums);

/// An IB of `ib` bytes as cast datagrams of `datagramBytes` of UDP
/// payload each (duck_rt/cast.h): the IB and a 24-byte header a datagram.
double castBytes(double ib, double datagramBytes);

/// Fanout::multicast, what the runtime's cast steps do (duck_rt/cast.h):
/// the host's port carries the IB of `in` (a step frame's bytes) once as
/// datagrams (castBytes) and then every duck's 96-byte step_cast frame in
/// rank order; every duck's link carries the datagrams and its frame at
/// the same time (cut-through): duck r has its input at
/// max((C + 96 (r + 1)) / H, (C + 96) / D_r). The replies (`header` plus
/// payloadBytes[r]) as unicastWire's, or with reduceTree (MODELLED ONLY)
/// up the relay tree as relayWire's.
StepWire multicastWire(const ClusterModel &c, double in, double headerBytes,
                       const std::vector<double> &payloadBytes, bool sums);

/// Unicast, what the runtime does: the host writes every duck's frame (`in`
/// bytes) at once, in rank order. Each link is full duplex (a FIFO server
/// each way, as duck-linksim models it). The host's port carries the N
/// copies one after another while each duck's link carries its own at the
/// same time (cut-through): duck r has its input at a_r = max((r+1) in /
/// H, in / D_r). It answers at once (the ducks' compute is the stream
/// term, a shift common to every duck): its `out[r]` bytes over its link
/// and the host's inbound port, a FIFO in the order the replies leave:
/// h_r = max(h_prev, a_r) + out[r] / H, done_r = max(h_r, a_r + out[r] /
/// D_r). The step's wire time is max_r done_r plus twice the one-way
/// latency. A rate of 0 is unlimited.
StepWire unicastWire(const ClusterModel &c, double in,
                     const std::vector<double> &out);
/// The same with each duck's own IB (`in[r]` bytes: a step that scatters).
StepWire unicastWire(const ClusterModel &c, const std::vector<double> &in,
                     const std::vector<double> &out);

/// A step whose ducks each get their own IB (`k[r]` floats a token): as
/// stepWire, over unicastWire's links (a relay forwards the largest).
StepWire stepWireEach(const ClusterModel &c, uint32_t rows,
                      const std::vector<int64_t> &k,
                      const std::vector<int64_t> &outWidth, bool partialSums);


/// One collective among the ducks (ClusterModel::residualOnDucks), a
/// direct exchange over a non-blocking switch: each duck sends each other
/// duck its piece at once (8 bytes of header each), every piece crossing
/// the sender's link out and the receiver's in (as duck-linksim routes
/// them). Reduce-scatter of n values: duck r sends slice j to duck j;
/// all-gather: its own slice to every duck (`values`: the whole vector's
/// length, slices as PeerSliceBegin's). Its time: the busiest link
/// direction's bytes at its rate, the one-way latency once, and
/// meshCallUs + meshMessageUs for each message a duck sends. With
/// meshGroups G dividing the ducks, two such exchanges: among each group's
/// M ducks over the whole vector, then among G ducks over a part of it.
struct MeshWire {
  double seconds = 0, wireSeconds = 0, latencySeconds = 0,
         overheadSeconds = 0;
  double bytesPerDuck = 0; // the most a duck sends
};
enum class Collective { reduceScatter, allGather };
MeshWire meshWire(const ClusterModel &c, Collective kind, int64_t values,
                  int64_t ducks, double bytesPerValue);

/// ClusterModel::residualOnDucks (MODELLED ONLY) on a plan costed as built
/// (its stream, its host attention): the wire becomes one host exchange a
/// layer and one for the head (the ducks hold the final hidden: the head's
/// rows, or the hidden's slices to a host head), plus each layer's
/// collectives (q_a gathered for an MLA, the attention's sums
/// reduce-scattered and the residual gathered, the router's logits
/// gathered for a MoE layer, the FFN's sums reduce-scattered and the
/// residual gathered) and the embedded token gathered once; the dispatch
/// one step overhead a host exchange and each collective's calls; the
/// host's weights read by the ducks in slices at their bandwidth.
void applyResidualOnDucks(const ModelFacts &m, const ClusterModel &c,
                          PlanCost &p);

/// A row-split matrix's slowest duck a token (seconds): each duck's rows
/// at its kernel class's rate, else its rate, else its bytes (or 1.125 a
/// weight) at the bandwidth; plus a call.
double rowSplitSeconds(const RowSplit &m, const ClusterModel &c);

/// A row-split matrix's slowest duck over one prompt chunk (seconds).
double rowSplitPrefillSeconds(const RowSplit &m, const ClusterModel &c);

/// Host attention over contextTokens of cache, a decoded token.
struct AttentionCost {
  double macs = 0, cacheBytes = 0, ms = 0;
};
AttentionCost hostAttention(const std::vector<Attention> &ops,
                            const ClusterModel &c);

} // namespace cost
} // namespace mlir::duck

#endif // DUCK_COSTMODEL_COSTMODEL_H
