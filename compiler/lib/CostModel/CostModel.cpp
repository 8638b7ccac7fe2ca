//===- CostModel.cpp - predicted token time of a partition ----------------===//
#include "duck/CostModel/CostModel.h"
#include "duck_rt/abi.h"
#include "duck_rt/duckd_protocol.h"
#include "duck_rt/kernel_select.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>

using namespace mlir::duck;
using namespace mlir::duck::cost;

uint32_t ClusterModel::ibFlags() const {
  return (wireX == Wire::bf16 ? uint32_t(DUCK_IB_X_BF16) : 0u) |
         (wireX == Wire::q8 ? uint32_t(DUCK_IB_X_Q8) : 0u) |
         (wireOut == Wire::bf16 ? uint32_t(DUCK_IB_OUT_BF16) : 0u) |
         (wireOut == Wire::q8 ? uint32_t(DUCK_IB_OUT_Q8) : 0u);
}

const char *ClusterModel::wireName(Wire w) {
  return w == Wire::q8 ? "q8" : w == Wire::bf16 ? "bf16" : "f32";
}

namespace {
/// A relay tree's forwarding unit, in words (" in 1 KiB pieces").
std::string relayUnitText(const ClusterModel &c) {
  return c.relayChunkBytes > 0
             ? llvm::formatv(" in {0} KiB pieces", c.relayChunkBytes / 1024.0)
                   .str()
             : std::string(" whole frames");
}
} // namespace

std::string mlir::duck::linksText(const ClusterModel &c) {
  std::string links;
  if (c.hostLinkGbps > 0)
    links = llvm::formatv("the host's link {0} Gb/s", c.hostLinkGbps).str();
  if (!c.duckLinkGbps.empty()) {
    auto [lo, hi] =
        std::minmax_element(c.duckLinkGbps.begin(), c.duckLinkGbps.end());
    links +=
        (links.empty() ? "" : ", ") +
        (*lo == *hi ? llvm::formatv("{0} Gb/s a duck", *lo).str()
                    : llvm::formatv("{0}-{1} Gb/s a duck", *lo, *hi).str());
  }
  if (c.latencyUs > 0)
    links += (links.empty() ? "" : ", ") +
             llvm::formatv("{0} us one way", c.latencyUs).str();
  if (c.fanout == ClusterModel::Fanout::relay)
    links += llvm::formatv(", a relay tree (the host sends {0}, each duck "
                           "forwards to {1}{2}) MODELLED ONLY: the runtime "
                           "sends every duck its own copy",
                           c.relayHostFanout, c.relayFanout, relayUnitText(c))
                 .str();
  if (c.fanout == ClusterModel::Fanout::multicast)
    links += llvm::formatv(
                 ", multicast (one copy of a step from the host, as "
                 "datagrams){0}",
                 c.reduceTree
                     ? llvm::formatv(", replies reduced up a tree (the host "
                                     "takes {0}, each duck {1}{2}) MODELLED "
                                     "ONLY: the ducks answer the host",
                                     c.relayHostFanout, c.relayFanout,
                                     relayUnitText(c))
                           .str()
                     : std::string())
                 .str();
  return links;
}

namespace {

/// What a GEMV call costs duck `r` beyond its weights (0: not measured).
double callSeconds(const ClusterModel &c, size_t r) {
  return r < c.duckGemvCallUs.size() ? c.duckGemvCallUs[r] * 1e-6 : 0.0;
}

/// Duck `r`'s fp9 GEMV rate (Gparam/s; 0: not measured).
double duckRate(const ClusterModel &c, size_t r) {
  return r < c.duckGparamS.size() ? c.duckGparamS[r] : c.fp9GparamS;
}

/// Seconds a weight costs duck `r` to read and decode once: at its GEMV
/// rate, else as fp9 (1.125 bytes) at the bandwidth.
double secondsPerParam(const ClusterModel &c, size_t r) {
  const double gemv = duckRate(c, r);
  return gemv > 0 ? 1.0 / (gemv * 1e9) : 1.125 / (c.bandwidthGbs * 1e9);
}

/// One draw of a token's routed experts: the slowest duck's time (`t`
/// one entry a duck, overwritten).
double slowestOf(const std::vector<HeldExperts> &held,
                 const std::vector<int64_t> &chosen, int64_t numExperts,
                 std::vector<double> &t) {
  std::fill(t.begin(), t.end(), 0.0);
  for (const HeldExperts &h : held) {
    int64_t n = std::max<int64_t>(0, h.end - std::max(h.begin, numExperts));
    for (int64_t e : chosen)
      n += e >= h.begin && e < h.end;
    t[h.rank] += h.seconds * double(n);
  }
  return *std::max_element(t.begin(), t.end());
}

/// The mean over every combination of k of the routed experts, exactly.
double meanOverCombinations(const std::vector<HeldExperts> &held, int64_t k,
                            int64_t numExperts, double combos,
                            std::vector<double> &t) {
  std::vector<int64_t> chosen;
  for (int64_t i = 0; i < k; ++i)
    chosen.push_back(i);
  double sum = 0;
  for (;;) {
    sum += slowestOf(held, chosen, numExperts, t);
    int64_t i = k - 1;
    while (i >= 0 && chosen[i] == numExperts - k + i)
      --i;
    if (i < 0)
      break;
    ++chosen[i];
    for (int64_t j = i + 1; j < k; ++j)
      chosen[j] = chosen[j - 1] + 1;
  }
  return sum / combos;
}

/// The mean over 4096 uniform draws of k distinct routed experts (a fixed
/// seed: the same plan always gets the same prediction).
double meanOverDraws(const std::vector<HeldExperts> &held, int64_t k,
                     int64_t numExperts, std::vector<double> &t) {
  constexpr int kDraws = 4096;
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&]() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  std::vector<int64_t> chosen;
  double sum = 0;
  for (int d = 0; d < kDraws; ++d) {
    chosen.clear();
    while ((int64_t)chosen.size() < k) {
      const int64_t e = int64_t(next() % uint64_t(numExperts));
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end())
        chosen.push_back(e);
    }
    sum += slowestOf(held, chosen, numExperts, t);
  }
  return sum / kDraws;
}

} // namespace

double cost::expectedSlowest(const std::vector<HeldExperts> &held, bool moe,
                             int64_t topK, int64_t numExperts) {
  size_t ducks = 0;
  bool sliced = true;
  for (const HeldExperts &h : held) {
    ducks = std::max(ducks, h.rank + 1);
    if (moe && (h.begin > 0 || h.end < numExperts))
      sliced = false;
  }
  std::vector<double> t(ducks, 0.0);
  if (!moe || sliced) {
    for (const HeldExperts &h : held) {
      const int64_t shared =
          std::max<int64_t>(0, h.end - std::max(h.begin, numExperts));
      t[h.rank] += h.seconds * double(moe ? topK + shared : 1);
    }
    return ducks ? *std::max_element(t.begin(), t.end()) : 0.0;
  }
  const int64_t k = std::min(topK, numExperts);
  // Few combinations (C(E, k) <= 20000): every one, exactly.
  double combos = 1;
  for (int64_t i = 0; i < k; ++i)
    combos = combos * double(numExperts - i) / double(i + 1);
  if (combos <= 20000)
    return meanOverCombinations(held, k, numExperts, combos, t);
  return meanOverDraws(held, k, numExperts, t);
}

double SlowestMemo::operator()(const std::vector<HeldExperts> &held, bool moe,
                               int64_t topK, int64_t numExperts, int64_t tp) {
  Holding byRank(tp);
  for (const HeldExperts &h : held)
    if (h.rank < byRank.size())
      byRank[h.rank].emplace_back(
          std::max<int64_t>(0, std::min<int64_t>(h.end, numExperts) - h.begin),
          std::max<int64_t>(0, h.end - std::max<int64_t>(h.begin, numExperts)),
          h.seconds);
  for (auto &r : byRank)
    std::sort(r.begin(), r.end());
  std::sort(byRank.begin(), byRank.end());
  auto [it, fresh] = memo.try_emplace(
      std::make_tuple(moe, topK, numExperts, std::move(byRank)), 0.0);
  if (fresh)
    it->second = expectedSlowest(held, moe, topK, numExperts);
  return it->second;
}

double cost::stepOverheadMs(const ClusterModel &c, int64_t tp) {
  double us = c.stepOverheadUs;
  if (c.stepOverheadDucks > 0 && tp > c.stepOverheadDucks)
    us += 2.0 * double(tp - c.stepOverheadDucks) * c.hostFrameUs;
  return us / 1e3;
}

double cost::expertSeconds(const FfnShard &s, const ClusterModel &c) {
  const size_t r = (size_t)s.rank;
  const double rate = duckRate(c, r);
  const std::vector<double> *byClass =
      r < c.duckKernelGparamS.size() ? &c.duckKernelGparamS[r] : nullptr;
  double seconds = 0;
  for (const Matrix &m : {s.gate, s.up, s.down}) {
    const duck_kernel_id id = duck_select_kernel(m.k, m.block);
    const double classRate =
        byClass && (size_t)id < byClass->size() && (*byClass)[id] > 0
            ? (*byClass)[id]
            : rate;
    if (classRate <= 0)
      return double(s.expertBytes) / (c.bandwidthGbs * 1e9) +
             3 * callSeconds(c, r);
    seconds += double(m.rows) * m.k / (classRate * 1e9) + callSeconds(c, r);
  }
  return seconds;
}

double cost::activeExperts(const FfnShard &s, const FfnLayer &l) {
  if (!l.moe)
    return 1;
  const double routed = double(l.topK), total = double(l.numExperts);
  double routedHeld = std::max<int64_t>(
      0, std::min<int64_t>(s.expertEnd, l.numExperts) - s.expertBegin);
  double sharedHeld = std::max<int64_t>(
      0, s.expertEnd - std::max<int64_t>(s.expertBegin, l.numExperts));
  return routedHeld * routed / total +
         std::min(sharedHeld, double(l.numShared));
}

double cost::prefillShardSeconds(const FfnShard &s, const FfnLayer &l,
                                 const ClusterModel &c) {
  // A prompt chunk of C rows: an expert that only a few rows of the chunk
  // chose (MoE: C x top_k / E on average) pays its decode for few FMAs.
  const double C = (double)c.prefillChunk;
  const double perParam = secondsPerParam(c, (size_t)s.rank);
  const double perMac = 1.0 / (c.gemmGmacS * 1e9);
  const double perExpert = 3.0 * l.hidden * s.localInter;
  const double active = l.moe ? double(l.topK) : 1,
               total = l.moe ? double(l.numExperts) : 1;
  double sec = 0;
  for (int64_t e = s.expertBegin; e < s.expertEnd; ++e) {
    const bool routed = l.moe && e < (int64_t)total;
    const double p = routed ? active / total : 1.0;
    sec +=
        perExpert * ((1.0 - std::pow(1.0 - p, C)) * perParam + C * p * perMac);
  }
  return sec;
}

namespace {

/// Seconds `bytes` take at `gbps` (0: unlimited).
double wireSeconds(double bytes, double gbps) {
  return gbps > 0 ? bytes * 8 / (gbps * 1e9) : 0.0;
}

/// Duck `r`'s link rate (0: unlimited, or not known).
double duckLink(const ClusterModel &c, size_t r) {
  return r < c.duckLinkGbps.size() ? c.duckLinkGbps[r] : 0.0;
}

/// A star's replies: duck r sends its out[r] bytes over its link once it
/// has its input (at arrive[r]); the host's inbound port takes them in the
/// order they leave. When the last one is in.
double starBack(const ClusterModel &c, const std::vector<double> &arrive,
                const std::vector<double> &out) {
  std::vector<size_t> order(out.size());
  for (size_t r = 0; r < out.size(); ++r)
    order[r] = r;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return arrive[a] < arrive[b]; });
  double hostIn = 0, end = 0;
  for (size_t r : order) {
    const double sent = wireSeconds(out[r], c.hostLinkGbps);
    hostIn = std::max(hostIn, arrive[r]) + sent;
    end = std::max(
        end, std::max(hostIn, arrive[r] + wireSeconds(out[r], duckLink(c, r))));
  }
  return end;
}

} // namespace

StepWire cost::unicastWire(const ClusterModel &c, double in,
                           const std::vector<double> &out) {
  return unicastWire(c, std::vector<double>(out.size(), in), out);
}

StepWire cost::unicastWire(const ClusterModel &c,
                           const std::vector<double> &in,
                           const std::vector<double> &out) {
  const size_t n = out.size();
  const double H = c.hostLinkGbps;
  std::vector<double> arrive(n);
  double hostOut = 0, lastIn = 0;
  for (size_t r = 0; r < n; ++r) {
    hostOut += wireSeconds(in[r], H);
    arrive[r] = std::max(hostOut, wireSeconds(in[r], duckLink(c, r)));
    lastIn = std::max(lastIn, arrive[r]);
  }
  const double end = std::max(lastIn, starBack(c, arrive, out));
  StepWire w;
  for (double i : in)
    w.txBytes += i;
  for (double o : out)
    w.rxBytes += o;
  w.outSeconds = lastIn;
  w.backSeconds = end - lastIn;
  w.latencySeconds = n ? 2 * c.latencyUs * 1e-6 : 0.0;
  w.seconds = w.outSeconds + w.backSeconds + w.latencySeconds;
  return w;
}

namespace {

/// A relay tree's shape: the host's children are ducks 0..K-1, duck i's
/// K + F i .. K + F i + F - 1 (those below n).
struct RelayTree {
  size_t n, K, F;
  std::vector<size_t> children(size_t i) const {
    std::vector<size_t> out;
    for (size_t j = 0; j < F && K + F * i + j < n; ++j)
      out.push_back(K + F * i + j);
    return out;
  }
};

/// One direction of a link: a FIFO server (as duck-linksim's).
struct FifoLink {
  double gbps = 0, free = 0;
  double reserve(double now, double bytes) {
    free = std::max(free, now) + wireSeconds(bytes, gbps);
    return free;
  }
};

/// `bytes` cut into pieces of `chunk` (0: one piece).
std::vector<double> piecesOf(double bytes, double chunk) {
  std::vector<double> out;
  while (chunk > 0 && bytes > chunk) {
    out.push_back(chunk);
    bytes -= chunk;
  }
  out.push_back(bytes);
  return out;
}

/// Down the tree: when each duck has each piece of its frame. The host
/// and every duck send piece by piece, each piece to each of their
/// children in turn, as soon as they have it (whole frames: one piece); a piece crosses the sender's outbound
/// and the receiver's inbound link (cut-through), then the latency.
std::vector<std::vector<double>> relayDown(const ClusterModel &c,
                                           const RelayTree &t, double in,
                                           double chunk, double lat) {
  const std::vector<double> pieces = piecesOf(in, chunk);
  std::vector<std::vector<double>> have(t.n,
                                        std::vector<double>(pieces.size()));
  std::vector<FifoLink> out(t.n), inLink(t.n);
  for (size_t i = 0; i < t.n; ++i)
    out[i].gbps = inLink[i].gbps = duckLink(c, i);
  FifoLink host{c.hostLinkGbps};
  for (size_t k = 0; k < pieces.size(); ++k)
    for (size_t j = 0; j < std::min(t.K, t.n); ++j)
      have[j][k] = std::max(host.reserve(0, pieces[k]),
                            inLink[j].reserve(0, pieces[k])) +
                   lat;
  for (size_t i = 0; i < t.n; ++i) // a parent comes before its children
    for (size_t k = 0; k < pieces.size(); ++k)
      for (size_t ch : t.children(i))
        have[ch][k] = std::max(out[i].reserve(have[i][k], pieces[k]),
                               inLink[ch].reserve(have[i][k], pieces[k])) +
                      lat;
  return have;
}

/// Up the tree: when the last reply is in at the host. A duck's reply
/// (`up[i]` bytes) leaves in pieces: with `sums` piece k once the duck
/// has its whole input and piece k of every child's partial sums (the
/// pieces line up: every reply is one vector's size); else (rows
/// gathered) once it has everything. The pieces a receiver gets share its
/// inbound link, a FIFO in the order they leave.
double relayUp(const ClusterModel &c, const RelayTree &t,
               const std::vector<double> &inputDone,
               const std::vector<double> &up, bool sums, double chunk,
               double lat) {
  std::vector<std::vector<double>> leave(t.n), pieces(t.n);
  std::vector<FifoLink> out(t.n);
  for (size_t i = 0; i < t.n; ++i) {
    out[i].gbps = duckLink(c, i);
    pieces[i] = piecesOf(up[i], chunk);
  }
  // The pieces `kids` send to a receiver with inbound link `in`: each
  // one's arrival, by sender.
  auto receive = [&](const std::vector<size_t> &kids, FifoLink in) {
    std::vector<std::tuple<double, size_t, size_t>> sent; // time, kid, k
    for (size_t ch : kids)
      for (size_t k = 0; k < leave[ch].size(); ++k)
        sent.emplace_back(leave[ch][k], ch, k);
    std::stable_sort(sent.begin(), sent.end());
    std::map<size_t, std::vector<double>> arrive;
    for (auto [when, ch, k] : sent) {
      const double bytes = pieces[ch][k];
      arrive[ch].resize(leave[ch].size());
      arrive[ch][k] =
          std::max(in.reserve(when, bytes), out[ch].reserve(when, bytes)) +
          lat;
    }
    return arrive;
  };
  // A piece a duck sends up costs it meshMessageUs of CPU (its receive
  // and sum within): a duck's pieces leave one after another.
  const double perPiece = c.meshMessageUs * 1e-6;
  for (size_t i = t.n; i-- > 0;) { // children before their parent
    const auto arrive = receive(t.children(i), FifoLink{duckLink(c, i)});
    double all = inputDone[i];
    for (const auto &[ch, a] : arrive)
      all = std::max(all, *std::max_element(a.begin(), a.end()));
    leave[i].assign(pieces[i].size(), all);
    double cpu = 0;
    for (size_t k = 0; k < pieces[i].size(); ++k) {
      if (sums) {
        leave[i][k] = inputDone[i];
        for (const auto &[ch, a] : arrive)
          leave[i][k] = std::max(leave[i][k], a[std::min(k, a.size() - 1)]);
      }
      leave[i][k] = std::max(leave[i][k], cpu) + perPiece;
      cpu = leave[i][k];
    }
  }
  std::vector<size_t> first;
  for (size_t j = 0; j < std::min(t.K, t.n); ++j)
    first.push_back(j);
  double end = 0;
  for (const auto &[ch, a] : receive(first, FifoLink{c.hostLinkGbps}))
    end = std::max(end, *std::max_element(a.begin(), a.end()));
  return end;
}

/// The relay tree at one-way latency `lat`: when the last duck has its
/// input and when the last reply is in at the host (seconds).
std::pair<double, double> relayTimes(const ClusterModel &c,
                                     const RelayTree &t, double in,
                                     const std::vector<double> &up,
                                     bool sums, double lat) {
  const double chunk = double(c.relayChunkBytes);
  const std::vector<std::vector<double>> have =
      relayDown(c, t, in, chunk, lat);
  std::vector<double> inputDone(t.n);
  double lastIn = 0;
  for (size_t i = 0; i < t.n; ++i) {
    inputDone[i] = have[i].back();
    lastIn = std::max(lastIn, inputDone[i]);
  }
  return {lastIn, relayUp(c, t, inputDone, up, sums, chunk, lat)};
}

} // namespace

StepWire cost::relayWire(const ClusterModel &c, double in, double headerBytes,
                         const std::vector<double> &payloadBytes, bool sums) {
  const RelayTree t{payloadBytes.size(),
                    (size_t)std::max<int64_t>(1, c.relayHostFanout),
                    (size_t)std::max<int64_t>(1, c.relayFanout)};
  // What each duck sends up: one vector of partial sums, or its subtree's
  // rows.
  std::vector<double> up(t.n);
  for (size_t i = t.n; i-- > 0;) {
    up[i] = headerBytes + payloadBytes[i];
    if (!sums)
      for (size_t k : t.children(i))
        up[i] += up[k] - headerBytes;
  }
  const auto [lastIn0, end0] = relayTimes(c, t, in, up, sums, 0);
  const double end =
      relayTimes(c, t, in, up, sums, c.latencyUs * 1e-6).second;
  StepWire w;
  for (size_t j = 0; j < std::min(t.K, t.n); ++j) {
    w.txBytes += in;
    w.rxBytes += up[j];
  }
  w.outSeconds = lastIn0;
  w.backSeconds = end0 - lastIn0;
  w.latencySeconds = end - end0;
  w.seconds = end;
  return w;
}

namespace {
/// The replies once duck r has its input at arrive[r] (the step's out
/// part ends at the last): as a star's (unicast) or, partial sums with
/// reduceTree, up the relay tree (rows to gather go straight to the host:
/// up a tree they would cross the ducks' slower links again). Fills w's
/// rx bytes, back, latency and seconds.
void backWire(const ClusterModel &c, const std::vector<double> &arrive,
              double headerBytes, const std::vector<double> &payloadBytes,
              bool sums, StepWire &w) {
  const size_t n = payloadBytes.size();
  const double lat = c.latencyUs * 1e-6;
  const double lastIn =
      n ? *std::max_element(arrive.begin(), arrive.end()) : 0.0;
  w.outSeconds = lastIn;
  if (!c.reduceTree || !sums) {
    std::vector<double> out(n);
    for (size_t r = 0; r < n; ++r)
      w.rxBytes += out[r] = headerBytes + payloadBytes[r];
    w.backSeconds = std::max(lastIn, starBack(c, arrive, out)) - lastIn;
    w.latencySeconds = n ? 2 * lat : 0.0;
  } else {
    const RelayTree t{n, (size_t)std::max<int64_t>(1, c.relayHostFanout),
                      (size_t)std::max<int64_t>(1, c.relayFanout)};
    std::vector<double> up(n), late(n);
    for (size_t i = 0; i < n; ++i) {
      up[i] = headerBytes + payloadBytes[i];
      late[i] = arrive[i] + lat;
    }
    for (size_t j = 0; j < std::min(t.K, n); ++j)
      w.rxBytes += up[j];
    const double chunk = double(c.relayChunkBytes);
    const double end0 = relayUp(c, t, arrive, up, sums, chunk, 0);
    w.backSeconds = end0 - lastIn;
    w.latencySeconds = relayUp(c, t, late, up, sums, chunk, lat) - end0;
  }
  w.seconds = w.outSeconds + w.backSeconds + w.latencySeconds;
}
} // namespace

double cost::castBytes(double ib, double datagramBytes) {
  const double header = double(sizeof(duckd_cast_datagram));
  const double per = std::max(1.0, datagramBytes - header);
  return ib + header * std::ceil(ib / per);
}

StepWire cost::multicastWire(const ClusterModel &c, double in,
                             double headerBytes,
                             const std::vector<double> &payloadBytes,
                             bool sums) {
  // What the runtime sends (duck_rt/cast.h): the IB once as datagrams,
  // then every duck its step_cast frame, in rank order behind them.
  const double ib =
      in - double(sizeof(duckd_frame_header) + sizeof(duckd_step_request));
  const double cast = castBytes(ib, c.castDatagramBytes);
  const double frame =
      double(sizeof(duckd_frame_header) + sizeof(duckd_step_cast_request));
  std::vector<double> arrive(payloadBytes.size());
  for (size_t r = 0; r < arrive.size(); ++r)
    arrive[r] =
        std::max(wireSeconds(cast + frame * double(r + 1), c.hostLinkGbps),
                 wireSeconds(cast + frame, duckLink(c, r)));
  StepWire w;
  w.txBytes = cast + frame * double(arrive.size());
  backWire(c, arrive, headerBytes, payloadBytes, sums, w);
  return w;
}

namespace {
/// A step's frame to one duck: frame header, step request, its IB of
/// `rows` tokens of `k` floats (bf16 as the model says) and `slots`
/// routing slots a token.
double stepInBytes(const ClusterModel &c, uint32_t rows, uint32_t slots,
                   uint64_t k) {
  return double(sizeof(duckd_frame_header) + sizeof(duckd_step_request) +
                duck_ib_bytes_flags(rows, slots, (uint32_t)k, c.ibFlags()));
}

/// A reply's fixed bytes (frame header, step reply, a kernel time a core,
/// OB header) and each duck's answer of outWidth[r] values a token.
struct Replies {
  double header = 0;
  std::vector<double> payload, bytes; // bytes = header + payload
};
Replies repliesOf(const ClusterModel &c, uint32_t rows,
                  const std::vector<int64_t> &outWidth) {
  Replies r;
  r.header =
      double(sizeof(duckd_frame_header) + sizeof(duckd_step_reply) +
             8 * std::max<int64_t>(1, c.coresPerDuck) + sizeof(duck_ob_header));
  for (int64_t width : outWidth) {
    r.payload.push_back(double(rows) *
                        double(duck_out_row_bytes(width, c.ibFlags())));
    r.bytes.push_back(r.header + r.payload.back());
  }
  return r;
}
} // namespace

StepWire cost::stepWire(const ClusterModel &c, uint32_t rows, uint32_t slots,
                        uint64_t k, const std::vector<int64_t> &outWidth,
                        bool partialSums) {
  const double in = stepInBytes(c, rows, slots, k);
  const Replies out = repliesOf(c, rows, outWidth);
  if (c.fanout == ClusterModel::Fanout::relay)
    return relayWire(c, in, out.header, out.payload, partialSums);
  // The runtime casts an IB of at most castMaxIbBytes; a larger one (a
  // prompt chunk's, several verify rows in fp32) goes to each duck.
  const double ib =
      in - double(sizeof(duckd_frame_header) + sizeof(duckd_step_request));
  if (c.fanout == ClusterModel::Fanout::multicast && ib <= c.castMaxIbBytes)
    return multicastWire(c, in, out.header, out.payload, partialSums);
  return unicastWire(c, in, out.bytes);
}

StepWire cost::stepWireEach(const ClusterModel &c, uint32_t rows,
                            const std::vector<int64_t> &k,
                            const std::vector<int64_t> &outWidth,
                            bool partialSums) {
  if (c.fanout == ClusterModel::Fanout::relay) {
    const int64_t widest = *std::max_element(k.begin(), k.end());
    return stepWire(c, rows, 0, (uint64_t)widest, outWidth, partialSums);
  }
  std::vector<double> in;
  for (int64_t w : k)
    in.push_back(stepInBytes(c, rows, 0, (uint64_t)w));
  const Replies out = repliesOf(c, rows, outWidth);
  if (c.fanout != ClusterModel::Fanout::multicast || !c.reduceTree)
    return unicastWire(c, in, out.bytes);
  // Different inputs go one by one (as unicast's); the partial sums come
  // back up the tree.
  std::vector<double> arrive(in.size());
  double hostOut = 0;
  StepWire w;
  for (size_t r = 0; r < in.size(); ++r) {
    hostOut += wireSeconds(in[r], c.hostLinkGbps);
    arrive[r] = std::max(hostOut, wireSeconds(in[r], duckLink(c, r)));
    w.txBytes += in[r];
  }
  backWire(c, arrive, out.header, out.payload, partialSums, w);
  return w;
}

double cost::rowSplitSeconds(const RowSplit &m, const ClusterModel &c) {
  const duck_kernel_id id =
      duck_select_kernel((uint32_t)m.k, (uint32_t)m.block);
  double slowest = 0;
  for (size_t r = 0; r < m.rows.size(); ++r) {
    const double params =
        double(m.rows[r]) * m.k +
        (r < m.extraParams.size() ? m.extraParams[r] : 0.0);
    double rate = duckRate(c, r);
    if (r < c.duckKernelGparamS.size() &&
        (size_t)id < c.duckKernelGparamS[r].size() &&
        c.duckKernelGparamS[r][id] > 0)
      rate = c.duckKernelGparamS[r][id];
    const double sec =
        (rate > 0              ? params / (rate * 1e9)
         : !m.bytes.empty() ? double(m.bytes[r]) / (c.bandwidthGbs * 1e9)
                            : params * 1.125 / (c.bandwidthGbs * 1e9)) +
        callSeconds(c, r);
    slowest = std::max(slowest, sec);
  }
  return slowest;
}

double cost::rowSplitPrefillSeconds(const RowSplit &m, const ClusterModel &c) {
  // In a prompt chunk every row goes through the projection: its slowest
  // duck's FMAs at the GEMM rate, or its bytes once.
  double worst = 0;
  for (size_t r = 0; r < m.rows.size(); ++r) {
    const double params = double(m.rows[r]) * m.k;
    worst = std::max(worst, params * secondsPerParam(c, r) +
                                params * c.prefillChunk / (c.gemmGmacS * 1e9));
  }
  return worst;
}

AttentionCost cost::hostAttention(const std::vector<Attention> &ops,
                                  const ClusterModel &c) {
  // GQA scores and weighted sums (2 x heads x head_dim a position); MLA in
  // the absorbed form (heads x (2 kv_lora + rope) a position), over at most
  // index_topk positions with an indexer, whose own scores cost index_heads
  // x index_dim a position. An op takes the longer of its multiply-adds at
  // host_gmac_s and, with host_read_gbs, its cache bytes at that bandwidth
  // (the fp32 cache read once a token: GQA's k and v, every head's shared
  // latent, the indexer's keys); GQA is bound by its reads, MLA by its
  // multiply-adds.
  const double L = double(c.contextTokens);
  AttentionCost a;
  auto add = [&](double m, double b) {
    a.macs += m;
    a.cacheBytes += b;
    double t = 1e3 * m / (c.hostGmacS * 1e9);
    if (c.hostReadGbs > 0)
      t = std::max(t, 1e3 * b / (c.hostReadGbs * 1e9));
    a.ms += t;
  };
  for (const Attention &op : ops) {
    if (op.gqa) {
      add(2 * op.heads * op.headDim * L, 2 * op.kvHeads * op.headDim * 4 * L);
      continue;
    }
    double attended = L;
    if (op.indexer) {
      add(op.indexHeads * op.indexDim * L, op.indexDim * 4 * L);
      if (op.indexTopK > 0)
        attended = std::min(L, op.indexTopK);
    }
    add(op.heads * (2 * op.kvLora + op.rope) * attended,
        (op.kvLora + op.rope) * 4 * attended);
  }
  return a;
}

namespace {

/// Sums over the steps of a token (ms), and of a prompt chunk.
struct StepSums {
  double layerMs = 0, netMs = 0, prefillNetMs = 0, prefillMsPerChunk = 0;
};

/// Adds a step's wire: a decode step's bytes and time to the token's, a
/// prompt chunk's time to prefill's (ms). `inWidth`, when given, is each
/// duck's own IB (floats a token; else k for all).
double addWire(const ClusterModel &c, bool decode, uint32_t slots, uint64_t k,
               const std::vector<int64_t> &outWidth, PlanCost &p,
               StepSums &sums, bool partialSums,
               const std::vector<int64_t> &inWidth = {}) {
  const uint32_t rows =
      decode ? (uint32_t)c.decodeRows : (uint32_t)c.prefillChunk;
  const StepWire w =
      inWidth.empty()
          ? stepWire(c, rows, slots, k, outWidth, partialSums)
          : stepWireEach(c, rows, inWidth, outWidth, partialSums);
  if (decode) {
    p.hostTxBytesPerToken += w.txBytes;
    p.hostRxBytesPerToken += w.rxBytes;
    p.networkOutMsPerToken += 1e3 * w.outSeconds;
    p.networkBackMsPerToken += 1e3 * w.backSeconds;
    p.networkLatencyMsPerToken += 1e3 * w.latencySeconds;
    ++p.stepsPerToken;
    sums.netMs += 1e3 * w.seconds;
    return 1e3 * w.seconds;
  }
  sums.prefillNetMs += 1e3 * w.seconds;
  return 1e3 * w.seconds;
}

/// ClusterModel::stageX: of a MoE step's time out, x's part (the step's
/// less one with the same slots and no x), hidden behind the router's
/// reads up to the router's time.
double stagedXSeconds(const FfnLayer &l, const ClusterModel &c, uint32_t slots,
                      const std::vector<int64_t> &whole) {
  const uint32_t rows = (uint32_t)c.decodeRows;
  const double xOut = stepWire(c, rows, slots, l.hidden, whole, true).outSeconds -
                      stepWire(c, rows, slots, 0, whole, true).outSeconds;
  return std::min(xOut, l.routerHostBytes / (c.hostReadGbs * 1e9));
}

/// Whether a layer has what a staged step hides: a MoE layer with a
/// shared expert and a router the host reads.
bool stagesShared(const FfnLayer &l, const ClusterModel &c) {
  return l.moe && l.numShared > 0 && l.routerHostBytes > 0 && c.hostReadGbs > 0;
}

/// The host's frames a staged layer adds to a whole step's (tp ducks):
/// none when the stage goes as a cast batch alone (multicast; protocol 5:
/// the routed slots' step_staged takes the whole step's place), one a
/// duck otherwise (the stage's quiet frame; nothing comes back for it).
double stagedFrames(const ClusterModel &c, size_t tp) {
  return c.fanout == ClusterModel::Fanout::multicast ? 0.0 : double(tp);
}

/// ClusterModel::stageShared: what a MoE layer's staged step saves (s;
/// negative where the stage costs more than it hides): see the field.
double stagedSharedSeconds(const FfnLayer &l, const ClusterModel &c,
                           uint32_t slots, const std::vector<int64_t> &whole) {
  if (!stagesShared(l, c))
    return 0;
  double shared = 0; // the slowest duck's shared experts, at its full rate
  for (const FfnShard &s : l.shards) {
    const double held = std::max<int64_t>(
        0, s.expertEnd - std::max<int64_t>(s.expertBegin, l.numExperts));
    shared = std::max(shared, std::min(held, double(l.numShared)) *
                                  expertSeconds(s, c));
  }
  const uint32_t rows = (uint32_t)c.decodeRows;
  ClusterModel plain = c; // the routed slots alone go plainly
  if (plain.fanout == ClusterModel::Fanout::multicast)
    plain.fanout = ClusterModel::Fanout::unicast;
  const std::vector<int64_t> none(whole.size(), 0);
  const double router = l.routerHostBytes / (c.hostReadGbs * 1e9);
  const double o = stepWire(c, rows, slots, l.hidden, whole, true).outSeconds;
  const StepWire stage =
      stepWire(c, rows, (uint32_t)l.numShared, l.hidden, none, false);
  const double o2 =
      stepWire(plain, rows, (uint32_t)l.topK, 0, whole, true).outSeconds;
  const double hidden =
      std::min({o + shared - o2, router + o - stage.outSeconds, router});
  return hidden - stagedFrames(c, whole.size()) * c.hostFrameUs * 1e-6;
}

/// One FFN layer: its expected slowest duck, each duck's weights and bytes
/// a token, its step on the wire and (`prompt`) its prompt chunk.
void addFfnLayer(const FfnLayer &l, const ClusterModel &c, int64_t tp,
                 SlowestMemo &memo, PlanCost &p, StepSums &sums, bool prompt) {
  std::vector<HeldExperts> held;
  double prefillSlowest = 0;
  LayerCost rec;
  rec.duckBytes.assign(tp, 0);
  for (const FfnShard &s : l.shards) {
    if (prompt && c.gemmGmacS > 0)
      prefillSlowest = std::max(prefillSlowest, prefillShardSeconds(s, l, c));
    const double active = activeExperts(s, l);
    rec.duckBytes[s.rank] += s.slotBytes;
    p.duckParamsPerToken[s.rank] += active * 3.0 * l.hidden * s.localInter;
    p.duckBytesPerToken[s.rank] += active * s.expertBytes;
    held.push_back({(size_t)s.rank, l.moe ? s.expertBegin : 0,
                    l.moe ? s.expertEnd : 1, expertSeconds(s, c)});
  }
  const int64_t topK = l.moe ? l.topK : 1, experts = l.moe ? l.numExperts : 1;
  rec.ms = 1e3 * memo(held, l.moe, topK, experts, tp);
  sums.layerMs += rec.ms;
  p.layers.push_back(std::move(rec));
  // Every duck returns the whole hidden vector (its partial sums).
  const uint32_t slots = l.moe ? uint32_t(l.topK + l.numShared) : 0;
  const std::vector<int64_t> whole(tp, l.hidden);
  addWire(c, true, slots, l.hidden, whole, p, sums, true);
  if (c.stageX && l.moe && l.routerHostBytes > 0 && c.hostReadGbs > 0)
    p.stagedXMsPerToken += 1e3 * stagedXSeconds(l, c, slots, whole);
  if ((c.stageShared || c.stageSharedOpen) && stagesShared(l, c)) {
    p.stagedSharedMsPerToken += 1e3 * stagedSharedSeconds(l, c, slots, whole);
    p.stagedFramesPerToken += stagedFrames(c, whole.size());
  }
  if (!prompt || c.gemmGmacS <= 0)
    return;
  const double prefillNet =
      addWire(c, false, slots, l.hidden, whole, p, sums, true);
  sums.prefillMsPerChunk +=
      1e3 * prefillSlowest + stepOverheadMs(c, tp) + prefillNet;
}

/// A row-split matrix on the ducks: one more step, its slowest duck.
void addRowSplit(const RowSplit &m, const ClusterModel &c, PlanCost &p,
                 StepSums &sums) {
  const std::vector<int64_t> &out = m.outWidth.empty() ? m.rows : m.outWidth;
  addWire(c, true, 0, m.k, out, p, sums, m.partialSums, m.inWidth);
  for (size_t r = 0; r < m.rows.size(); ++r)
    p.duckParamsPerToken[r] +=
        double(m.rows[r]) * m.k +
        (r < m.extraParams.size() ? m.extraParams[r] : 0.0);
  const double slowest = rowSplitSeconds(m, c);
  if (m.role != RowSplit::Role::head && c.gemmGmacS > 0) {
    const double worst = rowSplitPrefillSeconds(m, c);
    const double prefillNet =
        addWire(c, false, 0, m.k, out, p, sums, m.partialSums, m.inWidth);
    sums.prefillMsPerChunk +=
        1e3 * worst + stepOverheadMs(c, int64_t(m.rows.size())) + prefillNet;
  }
  switch (m.role) {
  case RowSplit::Role::head:
    p.lmHeadOnDucks = true;
    p.lmHeadMsPerToken = 1e3 * slowest;
    return;
  case RowSplit::Role::oProj:
    p.oProjOnDucks = true;
    p.oProjByHeads = m.partialSums;
    p.oProjMsPerToken += 1e3 * slowest;
    break;
  case RowSplit::Role::inProj:
    p.inProjOnDucks = true;
    p.inProjMsPerToken += 1e3 * slowest;
    break;
  case RowSplit::Role::qProj:
    p.qProjOnDucks = true;
    p.qProjMsPerToken += 1e3 * slowest;
    break;
  }
  ++p.attnProjSteps;
}

/// The host's time a token: measured (host_ms_per_token), else its weights
/// at its bandwidth; plus its attention over the cache and a host LM
/// head's bytes when the bandwidth is known. A measured host time includes
/// the attention projections; those on the ducks come off it, their bytes
/// at the host's bandwidth (when known).
void addHost(const ModelFacts &m, const ClusterModel &c, PlanCost &p) {
  p.hostWeightBytesPerToken = m.hostWeightBytes;
  if (c.hostGmacS > 0 && c.contextTokens > 0) {
    const AttentionCost a = hostAttention(m.attention, c);
    p.hostAttnGmacPerToken = a.macs / 1e9;
    p.hostAttnCacheBytesPerToken = a.cacheBytes;
    p.hostAttnMsPerToken = a.ms;
  }
  if (c.hostReadGbs > 0 && c.hostMsPerToken <= 0) {
    p.hostOpsMsPerToken = 1e3 * m.hostWeightBytes / (c.hostReadGbs * 1e9);
    // Reads done while a step is out hide behind it, up to its overhead
    // (the wire and the ducks' stream would hide more: not counted).
    for (double b : m.overlappedHostBytes)
      p.hostOverlappedMsPerToken +=
          std::min(1e3 * b / (c.hostReadGbs * 1e9), stepOverheadMs(c, m.tp));
    p.hostOpsMsPerToken -= p.hostOverlappedMsPerToken;
  }
  if (!p.lmHeadOnDucks && c.hostReadGbs > 0 && m.lmHead) {
    const double perWeight = c.hostHeadBytesPerWeight > 0
                                 ? c.hostHeadBytesPerWeight
                                 : m.lmHead->bytesPerWeight;
    p.hostLmHeadMsPerToken =
        1e3 * m.lmHead->params * perWeight / (c.hostReadGbs * 1e9);
  }
  const double measuredHost =
      c.hostMsPerToken > 0 && c.hostReadGbs > 0
          ? std::max(0.0, c.hostMsPerToken -
                              1e3 * m.onDucksHostBytes / (c.hostReadGbs * 1e9))
          : c.hostMsPerToken;
  p.hostMsPerToken =
      (c.hostMsPerToken > 0 ? measuredHost : p.hostOpsMsPerToken) +
      p.hostAttnMsPerToken + p.hostLmHeadMsPerToken;
}

} // namespace

double cost::unionExperts(int64_t experts, int64_t topK, int64_t rows) {
  if (experts <= 0 || topK >= experts)
    return (double)experts;
  return experts * (1.0 - std::pow(1.0 - (double)topK / experts, rows));
}

namespace {
/// `m` as one step of `rows` rows (ms): each MoE layer reads the union of
/// the experts its rows choose, each extra row attends on the host.
double rowsStepMs(ModelFacts m, ClusterModel c, int64_t rows) {
  for (FfnLayer &l : m.ffn)
    if (l.moe)
      l.topK = std::min<int64_t>(
          l.numExperts, (int64_t)std::llround(
                            cost::unionExperts(l.numExperts, l.topK, rows)));
  c.decodeRows = rows;
  c.speculateDrafts = 0;
  const PlanCost p = costPlan(m, c);
  return (p.tokS > 0 ? 1e3 / p.tokS : 0) +
         double(rows - 1) * p.hostAttnMsPerToken;
}

/// The MTP module over `rows` accepted rows of a verify step: its layer,
/// its attention and projections, its host weights (a measured host time
/// shared by weight bytes), and the LM head again.
double mtpStepMs(const ModelFacts &m, const ClusterModel &c, int64_t rows) {
  ClusterModel mc = c;
  if (c.hostMsPerToken > 0)
    mc.hostMsPerToken =
        m.hostWeightBytes > 0
            ? c.hostMsPerToken * m.mtp->hostWeightBytes / m.hostWeightBytes
            : 0;
  return rowsStepMs(*m.mtp, mc, std::max<int64_t>(1, rows));
}

/// The speculative projection of a plan whose one-row token is `base`.
PlanCost::Speculative projectSpeculative(const ModelFacts &m,
                                         const ClusterModel &c,
                                         const PlanCost &base) {
  PlanCost::Speculative out;
  out.rows = c.speculateDrafts + 1;
  out.acceptance = c.speculateAcceptance;
  out.stepMs = rowsStepMs(m, c, out.rows);
  for (int64_t i = 0; i < out.rows; ++i)
    out.tokensPerStep += std::pow(c.speculateAcceptance, (double)i);
  if (m.mtp) {
    out.mtp = true;
    out.mtpMs = mtpStepMs(m, c, (int64_t)std::ceil(out.tokensPerStep - 1e-9));
    out.stepMs += out.mtpMs;
  }
  out.tokS = out.stepMs > 0 ? 1e3 * out.tokensPerStep / out.stepMs : 0;
  out.speedup = base.tokS > 0 ? out.tokS / base.tokS : 0;
  return out;
}
} // namespace

PlanCost cost::costPlan(const ModelFacts &m, const ClusterModel &c) {
  PlanCost p;
  p.mlaAbsorbedBytesPerToken = m.absorbedHostBytes;
  p.duckParamsPerToken.assign(m.tp, 0.0);
  p.duckBytesPerToken.assign(m.tp, 0.0);
  StepSums sums;
  SlowestMemo memo;
  // A prompt's rows stop at the last layer's attention but for the row
  // that samples (the runtime's Engine::RunRows): the last FFN costs a
  // prompt one row, nothing a chunk. A plan with an MTP module keeps every
  // row (the module reads their hidden states).
  for (size_t i = 0; i < m.ffn.size(); ++i)
    addFfnLayer(m.ffn[i], c, m.tp, memo, p, sums,
                i + 1 < m.ffn.size() || i == 0 || m.mtp != nullptr);
  for (const RowSplit &r : m.rowSplits)
    addRowSplit(r, c, p, sums);
  addHost(m, c, p);
  p.stagedShared =
      c.stageShared || (c.stageSharedOpen && p.stagedSharedMsPerToken > 0);
  if (p.stagedShared)
    p.hostMsPerToken -= p.stagedSharedMsPerToken;
  p.streamMsPerToken = sums.layerMs + p.lmHeadMsPerToken + p.oProjMsPerToken +
                       p.qProjMsPerToken + p.inProjMsPerToken;
  p.dispatchMsPerToken = double((int64_t)m.ffn.size() + p.attnProjSteps +
                                (p.lmHeadOnDucks ? 1 : 0)) *
                         stepOverheadMs(c, m.tp);
  p.networkMsPerToken = sums.netMs; // 0 without a link speed
  p.networkMsPerToken -= p.stagedXMsPerToken;
  p.networkOutMsPerToken -= p.stagedXMsPerToken;
  if (c.residualOnDucks)
    applyResidualOnDucks(m, c, p);
  const double ms = p.streamMsPerToken + p.dispatchMsPerToken +
                    p.hostMsPerToken + p.networkMsPerToken;
  p.tokS = ms > 0 ? 1e3 / ms : 0;
  if (c.gemmGmacS > 0) {
    p.prefillNetworkMsPerToken = sums.prefillNetMs / c.prefillChunk;
    p.prefillDucksMsPerToken = sums.prefillMsPerChunk / c.prefillChunk;
    const double pms = p.prefillDucksMsPerToken + c.hostPrefillMsPerToken;
    p.prefillTokS = pms > 0 ? 1e3 / pms : 0;
  }
  if (c.speculateDrafts > 0 && c.decodeRows == 1)
    p.speculative = projectSpeculative(m, c, p);
  return p;
}
