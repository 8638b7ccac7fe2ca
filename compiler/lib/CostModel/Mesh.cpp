//===- Mesh.cpp - collectives among the ducks, the residual on the ducks --===//
//
// MODELLED ONLY (ClusterModel::residualOnDucks): the runtime has the mesh
// (duck_rt/peer_mesh.h, measured by duck-bench collective) but no duck runs
// a layer's norms and router yet.
//
//===----------------------------------------------------------------------===//
#include "duck/CostModel/CostModel.h"
#include "duck_rt/abi.h"

#include <algorithm>
#include <cmath>

using namespace mlir::duck;
using namespace mlir::duck::cost;

namespace {

/// Part r of n split over `parts` (the first n % parts one longer), as
/// PeerSliceBegin and the heads' split.
double partOf(double n, int64_t parts, int64_t r) {
  const int64_t whole = int64_t(n);
  return double(whole / parts + (r < whole % parts ? 1 : 0));
}

/// Duck r's link in bytes a second (0: unlimited).
double linkBytesPerSecond(const ClusterModel &c, int64_t r) {
  return size_t(r) < c.duckLinkGbps.size() ? c.duckLinkGbps[r] * 1e9 / 8 : 0.0;
}

constexpr double kMeshHeaderBytes = 8; // a message's sequence and length
// Over datagrams (duck-rt/wire/PeerDatagrams.h): a header a datagram.
constexpr double kDatagramHeaderBytes = 24, kDatagramBytes = 1432;

/// A message of `payload` bytes with its headers, as the transport sends it.
double messageBytes(const ClusterModel &c, double payload) {
  if (!c.meshDatagrams)
    return kMeshHeaderBytes + payload;
  const double chunk = kDatagramBytes - kDatagramHeaderBytes;
  const double datagrams = std::max(1.0, std::ceil(payload / chunk));
  return datagrams * kDatagramHeaderBytes + payload;
}

/// One direct exchange among `ducks` ducks (see meshWire).
MeshWire directWire(const ClusterModel &c, Collective kind, int64_t values,
                    int64_t ducks, double bytesPerValue) {
  MeshWire w;
  if (ducks <= 1)
    return w;
  auto piece = [&](int64_t j) {
    return messageBytes(c, partOf(double(values), ducks, j) * bytesPerValue);
  };
  double all = 0;
  for (int64_t j = 0; j < ducks; ++j)
    all += piece(j);
  for (int64_t r = 0; r < ducks; ++r) {
    // Reduce-scatter: every other duck's slice out, own slice in from all;
    // all-gather the reverse.
    const double others = all - piece(r), own = double(ducks - 1) * piece(r);
    const double out = kind == Collective::reduceScatter ? others : own;
    const double in = kind == Collective::reduceScatter ? own : others;
    w.bytesPerDuck = std::max(w.bytesPerDuck, out);
    const double rate = linkBytesPerSecond(c, r);
    if (rate > 0)
      w.wireSeconds = std::max(w.wireSeconds, std::max(out, in) / rate);
  }
  w.latencySeconds = c.latencyUs * 1e-6;
  w.overheadSeconds =
      (c.meshCallUs + c.meshMessageUs * double(ducks - 1)) * 1e-6;
  w.seconds = w.wireSeconds + w.latencySeconds + w.overheadSeconds;
  return w;
}
} // namespace

MeshWire cost::meshWire(const ClusterModel &c, Collective kind,
                        int64_t values, int64_t ducks, double bytesPerValue) {
  const int64_t g = c.meshGroups;
  if (g <= 1 || g >= ducks || ducks % g != 0)
    return directWire(c, kind, values, ducks, bytesPerValue);
  // Two levels: within each group of M = ducks / g over the whole vector,
  // then among the g ducks of one member index over its part.
  const int64_t members = ducks / g;
  const MeshWire a = directWire(c, kind, values, members, bytesPerValue);
  const MeshWire b = directWire(c, kind, (values + members - 1) / members, g,
                                bytesPerValue);
  MeshWire w;
  w.wireSeconds = a.wireSeconds + b.wireSeconds;
  w.latencySeconds = a.latencySeconds + b.latencySeconds;
  w.overheadSeconds = a.overheadSeconds + b.overheadSeconds;
  w.seconds = a.seconds + b.seconds;
  w.bytesPerDuck = a.bytesPerDuck + b.bytesPerDuck;
  return w;
}

namespace {

/// Adds one collective to the token's figures.
void addCollective(const ClusterModel &c, Collective kind, double values,
                   int64_t tp, double bytesPerValue, PlanCost &p) {
  const int64_t n = int64_t(values * double(c.decodeRows));
  const MeshWire w = meshWire(c, kind, n, tp, bytesPerValue);
  p.meshSchedule.push_back(
      {kind == Collective::reduceScatter, n, bytesPerValue});
  p.meshMsPerToken += 1e3 * (w.wireSeconds + w.latencySeconds);
  p.meshLatencyMsPerToken += 1e3 * w.latencySeconds;
  p.meshOverheadMsPerToken += 1e3 * w.overheadSeconds;
  p.meshBytesPerDuckPerToken += w.bytesPerDuck;
  ++p.collectivesPerToken;
}

/// Duck r's floats in and out of a layer's one host exchange: in, its
/// heads' attention outputs (latent for an MLA), and on the first layer its
/// slice of the embedded token; out, its heads' queries (absorbed for an
/// MLA), its slice of the layer's kv rows and of the indexer's queries,
/// weights and key.
void exchangeWidths(const Attention *a, int64_t tp, double firstSlice,
                    std::vector<int64_t> &in, std::vector<int64_t> &out) {
  in.assign(tp, 0);
  out.assign(tp, 0);
  for (int64_t r = 0; r < tp; ++r) {
    double i = partOf(firstSlice, tp, r), o = 0;
    if (a) {
      const double heads = partOf(a->heads, tp, r);
      const double kvRows =
          a->gqa ? 2 * a->kvHeads * a->headDim : a->kvLora + a->rope;
      i += heads * (a->gqa ? a->headDim : a->kvLora);
      o += heads * (a->gqa ? a->headDim : a->kvLora + a->rope) +
           partOf(kvRows, tp, r);
      if (a->indexer)
        o += partOf(a->indexHeads, tp, r) * (a->indexDim + 1) +
             partOf(a->indexDim, tp, r);
    }
    in[r] = int64_t(i);
    out[r] = int64_t(o);
  }
}

/// Adds one host exchange (a step) to the token's wire.
void addExchange(const ClusterModel &c, const std::vector<int64_t> &in,
                 const std::vector<int64_t> &out, PlanCost &p) {
  const StepWire w =
      stepWireEach(c, (uint32_t)c.decodeRows, in, out, /*partialSums=*/false);
  p.hostTxBytesPerToken += w.txBytes;
  p.hostRxBytesPerToken += w.rxBytes;
  p.networkOutMsPerToken += 1e3 * w.outSeconds;
  p.networkBackMsPerToken += 1e3 * w.backSeconds;
  p.networkLatencyMsPerToken += 1e3 * w.latencySeconds;
  p.networkMsPerToken += 1e3 * w.seconds;
  ++p.stepsPerToken;
}

/// Bytes a value of a collective's message in a wire form: the ABI's row
/// of one whole q8 block (a bf16 scale a block of 32), bf16's or fp32's.
double wireValueBytes(ClusterModel::Wire w) {
  const uint32_t flag =
      w == ClusterModel::Wire::q8     ? uint32_t(DUCK_IB_X_Q8)
      : w == ClusterModel::Wire::bf16 ? uint32_t(DUCK_IB_X_BF16)
                                      : 0u;
  return double(duck_x_row_bytes(DUCK_Q8_BLOCK, flag)) / DUCK_Q8_BLOCK;
}

/// The collectives of one layer: q_a's rows gathered (an MLA's), the
/// attention's partial sums reduce-scattered and the new residual
/// gathered, the router's logits gathered (MoE), the FFN's partial sums
/// reduce-scattered and the residual gathered.
void addLayerCollectives(const ClusterModel &c, const FfnLayer &l,
                         const Attention *a, int64_t tp, PlanCost &p) {
  const double act = wireValueBytes(c.wireX), sums = wireValueBytes(c.wireOut);
  if (a && a->qLora > 0)
    addCollective(c, Collective::allGather, a->qLora, tp, act, p);
  addCollective(c, Collective::reduceScatter, double(l.hidden), tp, sums, p);
  addCollective(c, Collective::allGather, double(l.hidden), tp, act, p);
  if (l.moe) // fp32 logits: every duck picks the same top_k
    addCollective(c, Collective::allGather, double(l.numExperts), tp, 4, p);
  addCollective(c, Collective::reduceScatter, double(l.hidden), tp, sums, p);
  addCollective(c, Collective::allGather, double(l.hidden), tp, act, p);
}

} // namespace

namespace {
/// The token's collectives in order: the embedded token gathered, then
/// each layer's.
void addTokenCollectives(const ModelFacts &m, const ClusterModel &c,
                         PlanCost &p) {
  if (m.ffn.empty())
    return;
  addCollective(c, Collective::allGather, double(m.ffn.front().hidden), m.tp,
                wireValueBytes(c.wireX), p);
  for (size_t i = 0; i < m.ffn.size(); ++i)
    addLayerCollectives(c, m.ffn[i],
                        i < m.attention.size() ? &m.attention[i] : nullptr,
                        m.tp, p);
}

/// meshGroups 0 (auto): the groups that give the token's collectives the
/// least time, among 1 and every divisor of tp below it (ties: fewer).
int64_t fastestGroups(const ModelFacts &m, ClusterModel c) {
  int64_t best = 1;
  double bestMs = 0;
  for (int64_t g = 1; g < std::max<int64_t>(2, m.tp); ++g) {
    if (m.tp % g != 0)
      continue;
    c.meshGroups = g;
    PlanCost t;
    addTokenCollectives(m, c, t);
    const double ms = t.meshMsPerToken + t.meshOverheadMsPerToken;
    if (g == 1 || ms < bestMs * (1 - 1e-9)) {
      best = g;
      bestMs = ms;
    }
  }
  return best;
}
} // namespace

void cost::applyResidualOnDucks(const ModelFacts &m, const ClusterModel &given,
                                PlanCost &p) {
  const int64_t tp = m.tp;
  ClusterModel c = given;
  if (c.meshGroups == 0)
    c.meshGroups = fastestGroups(m, c);
  p.meshGroups = c.meshGroups;
  p.residualOnDucks = true;
  p.hostTxBytesPerToken = p.hostRxBytesPerToken = 0;
  p.networkOutMsPerToken = p.networkBackMsPerToken = 0;
  p.networkLatencyMsPerToken = p.networkMsPerToken = 0;
  p.stepsPerToken = 0;
  const double hidden = m.ffn.empty() ? 0 : double(m.ffn.front().hidden);
  for (size_t i = 0; i < m.ffn.size(); ++i) {
    std::vector<int64_t> in, out;
    exchangeWidths(i < m.attention.size() ? &m.attention[i] : nullptr, tp,
                   i == 0 ? hidden : 0, in, out);
    addExchange(c, in, out, p);
  }
  addTokenCollectives(m, c, p);
  // The head: the ducks hold the final hidden; each sends its vocabulary
  // rows' logits (the head on the ducks) or its slice of the hidden.
  std::vector<int64_t> none(tp, 0), last(tp, 0);
  for (const RowSplit &r : m.rowSplits)
    if (r.role == RowSplit::Role::head)
      last = r.rows;
  if (!p.lmHeadOnDucks)
    for (int64_t r = 0; r < tp; ++r)
      last[r] = int64_t(partOf(hidden, tp, r));
  addExchange(c, none, last, p);
  p.networkMsPerToken += p.meshMsPerToken;
  // One host step a layer and the head's, and every collective's calls.
  p.dispatchMsPerToken = double(p.stepsPerToken) * stepOverheadMs(c, tp) +
                         p.meshOverheadMsPerToken;
  // The host's weights (routers, the indexer's) read by the ducks in
  // slices; the host keeps the attention over its cache.
  p.meshHostWeightsMsPerToken =
      1e3 * m.hostWeightBytes / double(tp) / (c.bandwidthGbs * 1e9);
  p.streamMsPerToken += p.meshHostWeightsMsPerToken;
  const double measured =
      c.hostMsPerToken > 0 && c.hostReadGbs > 0
          ? std::max(0.0, c.hostMsPerToken -
                              1e3 * (m.hostWeightBytes + m.onDucksHostBytes) /
                                  (c.hostReadGbs * 1e9))
          : c.hostMsPerToken;
  p.hostOpsMsPerToken = p.hostOverlappedMsPerToken = 0;
  p.hostMsPerToken = measured + p.hostAttnMsPerToken + p.hostLmHeadMsPerToken;
}
