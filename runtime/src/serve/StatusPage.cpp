//===- StatusPage.cpp - duckrun serve's page and its status JSON ----------===//
#include "duck/runtime/serve/StatusPage.h"

#include "absl/strings/str_cat.h"

#include <algorithm>

namespace duck::runtime {
namespace {

using json = nlohmann::json;

/// Snapshots kept for the windows: one every kRingStep seconds, kRingSpan
/// seconds of them.
constexpr double kRingStep = 0.25, kRingSpan = 30;
/// The token rate and the breakdown are over about this many seconds.
constexpr double kWindow = 5;

const char *CacheName(duckd_cache_result r) {
  return r == DUCKD_CACHE_HIT    ? "hit"
         : r == DUCKD_CACHE_MISS ? "miss"
                                 : "partial";
}

/// null for a value not measured yet (negative).
json Measured(double v) { return v < 0 ? json(nullptr) : json(v); }

} // namespace

// The embedded files (PageFiles.cpp, generated from runtime/src/serve/page).
extern const PageFile kPageFiles[];
extern const size_t kPageFileCount;

const PageFile *FindPageFile(const std::string &path) {
  for (size_t i = 0; i < kPageFileCount; ++i)
    if (path == kPageFiles[i].path)
      return &kPageFiles[i];
  return nullptr;
}

void ClusterStatus::ReadDucks(const Session &ses) {
  const DuckClient &c = ses.client();
  const PrepareReport &prep = ses.prepare_report();
  const auto *defs = ses.plan().def().ducks();
  std::vector<Duck> ducks(c.size());
  for (size_t r = 0; r < c.size(); ++r) {
    Duck &d = ducks[r];
    d.address = c.endpoint(r).ToString();
    d.name = c.hello(r).name;
    d.cores = c.hello(r).cores;
    d.cache = r < prep.result.size() ? CacheName(prep.result[r]) : "";
    d.uploaded = r < prep.bytes_uploaded.size() ? prep.bytes_uploaded[r] : 0;
    d.image_bytes = r < defs->size() ? defs->Get(r)->image_bytes() : 0;
    if (r < ducks_.size())
      d.gparam_s = ducks_[r].gparam_s;
  }
  ducks_ = std::move(ducks);
}

void ClusterStatus::Start(const Session &ses, double now) {
  std::lock_guard<std::mutex> lock(mu_);
  ReadDucks(ses);
  started_ = now;
  cur_.t = now;
  ring_.push_back(cur_);
}

void ClusterStatus::AddSteps(const RunnerStats &rs) {
  const std::vector<StepMetrics> *kept[4] = {
      &rs.decode_steps, &rs.prefill_steps, &rs.attn_decode_steps,
      &rs.attn_prefill_steps};
  for (int k = 0; k < 4; ++k) {
    const std::vector<StepMetrics> &v = *kept[k];
    // The runner drops its oldest max_steps when it holds twice that; an
    // engine step adds far fewer than max_steps.
    if (v.size() < seen_[k])
      seen_[k] = seen_[k] >= rs.max_steps ? seen_[k] - rs.max_steps : 0;
    for (size_t i = seen_[k]; i < v.size(); ++i) {
      (k < 2 ? cur_.ffn_wait_us : cur_.attn_wait_us) += v[i].judge_wait_us;
      cur_.kernel_us += v[i].duck_max_us;
      cur_.gap_us += v[i].judge_gap_us;
    }
    seen_[k] = v.size();
  }
}

void ClusterStatus::AfterStep(const Session &ses, const BatcherStats &bs,
                              double now) {
  const RunnerStats &rs = ses.runner().stats();
  // The judge gap's median over the recent steps, now and then.
  double gap = -1;
  if (cur_.steps % 32 == 0) {
    std::vector<double> gaps;
    for (const auto *v : {&rs.decode_steps, &rs.prefill_steps})
      for (size_t i = v->size() > 512 ? v->size() - 512 : 0; i < v->size(); ++i)
        gaps.push_back((*v)[i].judge_gap_us);
    if (!gaps.empty()) {
      std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2,
                       gaps.end());
      gap = gaps[gaps.size() / 2];
    }
  }
  const Engine &e = ses.engine();
  const LoadedPlan &plan = ses.plan();
  std::lock_guard<std::mutex> lock(mu_);
  if (ses.runner().recoveries() != recoveries_) {
    recoveries_ = ses.runner().recoveries();
    ReadDucks(ses); // a duck brought back may be a spare
  }
  for (size_t r = 0; r < rs.params.size() && r < ducks_.size(); ++r)
    if (rs.kernel_ns[r] > 0)
      ducks_[r].gparam_s = rs.params[r] / rs.kernel_ns[r];
  if (gap >= 0)
    judge_gap_us_ = gap;
  AddSteps(rs);
  ++cur_.steps;
  cur_.t = last_step_ = now;
  cur_.rows = e.decode_times().tokens + e.prefill_times().tokens;
  cur_.generated = bs.generated_tokens;
  std::fill(std::begin(cur_.bucket_s), std::end(cur_.bucket_s), 0.0);
  for (const Engine::OpTimes *t : {&e.decode_times(), &e.prefill_times()})
    for (size_t k = 0; k < t->seconds.size(); ++k)
      if (const OpKind *kind = plan.kinds().Find((::duck::plan::OpParams)k))
        cur_.bucket_s[(int)kind->bucket] += t->seconds[k];
  if (ring_.empty() || now - ring_.back().t >= kRingStep)
    ring_.push_back(cur_);
  while (ring_.size() > 2 && ring_.front().t < now - kRingSpan)
    ring_.pop_front();
}

double ClusterStatus::JudgeGapUs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return judge_gap_us_;
}

std::vector<double> ClusterStatus::Gparams() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<double> out;
  for (const Duck &d : ducks_)
    out.push_back(d.gparam_s);
  return out;
}

json ClusterStatus::DucksJson(double now) const {
  json out = json::array();
  for (size_t r = 0; r < ducks_.size(); ++r) {
    const Duck &d = ducks_[r];
    // A step is sent to every duck and succeeds only when all of them
    // answer: the last step's time is each duck's last answer.
    const double seen = last_step_ > 0 ? last_step_ : started_;
    out.push_back(json{
        {"index", r},
        {"address", d.address},
        {"name", d.name},
        {"health", "ok"},
        {"last_answer_s_ago", now - seen},
        {"cores", d.cores},
        {"weight_cache", d.cache},
        {"uploaded_bytes", d.uploaded},
        {"image_bytes", d.image_bytes},
        {"kernel_gparam_s", Measured(d.gparam_s)},
    });
  }
  return out;
}

json ClusterStatus::BreakdownJson() const {
  // The steps of the last kWindow seconds (all of them, early on).
  if (ring_.empty())
    return nullptr;
  Totals base = ring_.front();
  for (const Totals &t : ring_)
    if (t.t <= cur_.t - kWindow)
      base = t;
  const double steps = (double)(cur_.steps - base.steps);
  if (steps <= 0)
    return nullptr;
  auto ms = [&](double cur, double was, double unit) {
    return (cur - was) * unit / steps;
  };
  const int att = (int)TimeBucket::kHostAttention,
            norms = (int)TimeBucket::kHostNormsRouter,
            head = (int)TimeBucket::kLmHead, ffn = (int)TimeBucket::kDuckFfn;
  double engine = 0;
  for (int b = 0; b < (int)TimeBucket::kCount; ++b)
    engine += ms(cur_.bucket_s[b], base.bucket_s[b], 1e3);
  // As duckrun's decode breakdown (Breakdown.h): the ducks' waits are
  // taken out of the host ops that wait for them.
  const double attention = ms(cur_.bucket_s[att], base.bucket_s[att], 1e3) -
                           ms(cur_.attn_wait_us, base.attn_wait_us, 1e-3);
  const double ffnHost = ms(cur_.bucket_s[ffn], base.bucket_s[ffn], 1e3) -
                         ms(cur_.ffn_wait_us, base.ffn_wait_us, 1e-3);
  return json{
      {"window_s", cur_.t - base.t},
      {"steps", cur_.steps - base.steps},
      {"rows_per_step", ms((double)cur_.rows, (double)base.rows, 1)},
      {"step_ms", engine},
      {"host_attention_ms", std::max(0.0, attention)},
      {"host_norms_router_ms",
       ms(cur_.bucket_s[norms], base.bucket_s[norms], 1e3) +
           std::max(0.0, ffnHost)},
      {"lm_head_ms", ms(cur_.bucket_s[head], base.bucket_s[head], 1e3)},
      {"duck_kernel_ms", ms(cur_.kernel_us, base.kernel_us, 1e-3)},
      {"dispatch_gap_ms", ms(cur_.gap_us, base.gap_us, 1e-3)},
  };
}

json ClusterStatus::Json(const BatcherStats &bs, const char *state,
                         double now) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Tokens a second over the last kWindow seconds (since the start, early).
  json tokS = nullptr;
  if (!ring_.empty()) {
    const Totals *base = &ring_.front();
    for (const Totals &t : ring_)
      if (t.t <= now - kWindow)
        base = &t;
    if (now - base->t > 0.1)
      tokS = (double)(bs.generated_tokens - base->generated) / (now - base->t);
  }
  return json{
      {"state", state},
      {"uptime_s", started_ > 0 ? json(now - started_) : json(nullptr)},
      {"ducks", DucksJson(now)},
      {"judge_gap_us", Measured(judge_gap_us_)},
      {"recoveries", recoveries_},
      {"tok_s", tokS},
      {"generated_tokens", bs.generated_tokens},
      {"prompt_tokens", bs.prompt_tokens},
      {"steps", bs.steps},
      {"queue_depth", bs.queued},
      {"active_sequences", bs.active},
      {"step_breakdown", BreakdownJson()},
  };
}

} // namespace duck::runtime
