//===- StatusPage.h - duckrun serve's page and its status JSON -*- C++ -*-===//
//
// The page at `/` (runtime/src/serve/page, embedded in the binary at build
// time) and what its endpoint, GET /v1/duck/status, reports: each duck's
// address, health, cores, weight cache and kernel rate, the judge gap, the
// token rate, where a step's time goes, the queue and the sequences. The
// batcher's thread feeds it after every step; the connection threads read
// it. Values not measured yet are null, never a made-up zero.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_SERVE_STATUSPAGE_H
#define DUCK_RUNTIME_SERVE_STATUSPAGE_H

#include "duck/runtime/plan/OpKinds.h"
#include "duck/runtime/serve/Batcher.h"
#include "duck/runtime/session/Session.h"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace duck::runtime {

/// One file of the page, as embedded.
struct PageFile {
  const char *path; // "/", "/app.js", ...
  const char *type; // its Content-Type
  const unsigned char *data;
  size_t size;
};

/// The page's file served at `path`, or null.
const PageFile *FindPageFile(const std::string &path);

class ClusterStatus {
public:
  /// The ducks as Start left them (before the batcher runs).
  void Start(const Session &ses, double now);
  /// On the batcher's thread after each step.
  void AfterStep(const Session &ses, const BatcherStats &bs, double now);
  /// The endpoint's JSON; `state` is /health's ("ok", "preparing", ...).
  nlohmann::json Json(const BatcherStats &bs, const char *state,
                      double now) const;
  /// The median dispatch gap of the recent duck steps (us) and each duck's
  /// kernel rate (Gparam/s); empty or negative before the first step.
  double JudgeGapUs() const;
  std::vector<double> Gparams() const;

  /// Counters a window of steps is the difference of.
  struct Totals {
    double t = 0;
    uint64_t steps = 0, rows = 0, generated = 0;
    // Engine seconds by TimeBucket, decode and prefill.
    double bucket_s[(int)TimeBucket::kCount] = {};
    double ffn_wait_us = 0, attn_wait_us = 0, kernel_us = 0, gap_us = 0;
  };

private:
  struct Duck {
    std::string address, name, cache;
    uint32_t cores = 0;
    uint64_t uploaded = 0, image_bytes = 0;
    double gparam_s = -1; // not measured yet
  };
  void ReadDucks(const Session &ses);
  /// Adds the duck steps the runner kept since the last call.
  void AddSteps(const RunnerStats &rs);
  nlohmann::json DucksJson(double now) const;
  nlohmann::json BreakdownJson() const;

  mutable std::mutex mu_;
  std::vector<Duck> ducks_;
  double started_ = 0, last_step_ = 0;
  uint64_t recoveries_ = 0;
  double judge_gap_us_ = -1;
  Totals cur_;
  std::deque<Totals> ring_; // a snapshot every 0.25 s, the last 30 s
  // Batcher thread only: the runner's kept steps seen so far.
  size_t seen_[4] = {};
};

} // namespace duck::runtime

#endif
