//===- TokenChooser.cpp - a request's own logit processing and sampling ---===//
#include "duck/runtime/serve/TokenChooser.h"

#include <algorithm>
#include <cmath>

namespace duck::runtime {

TokenChooser::TokenChooser(ChooserOptions o, const Tokenizer &tokenizer)
    : o_(std::move(o)), tok_(tokenizer),
      rng_(o_.sampler.seed ^ 0x5DEECE66Dull) {
  active_ = o_.trigger.empty();
  for (const auto &[id, byte] : o_.markers)
    marker_bytes_[id] = std::string(1, (char)byte);
  if (active_)
    for (size_t i = 0; i < o_.grammars.size(); ++i)
      states_.emplace_back(i, o_.grammars[i]->Start());
}

std::string_view TokenChooser::Bytes(int32_t id) const {
  if (!marker_bytes_.empty())
    if (auto it = marker_bytes_.find(id); it != marker_bytes_.end())
      return it->second;
  return tok_.TokenBytes(id);
}

bool TokenChooser::Barred(int32_t id) const {
  if (marker_bytes_.empty())
    return tok_.IsSpecial(id);
  if (marker_bytes_.count(id))
    return false;
  if (tok_.IsSpecial(id))
    return true;
  for (const auto &[m, byte] : o_.markers)
    if (tok_.TokenBytes(id).find((char)byte) != std::string_view::npos)
      return true;
  return false;
}

void TokenChooser::Watch(int32_t id) {
  if (active_ || spent_ || o_.trigger.empty() || Barred(id))
    return;
  tail_ += Bytes(id);
  const size_t at = tail_.find(o_.trigger);
  if (at == std::string::npos) {
    if (tail_.size() >= o_.trigger.size())
      tail_.erase(0, tail_.size() - (o_.trigger.size() - 1));
    return;
  }
  const std::string_view from = std::string_view(tail_).substr(at);
  for (size_t i = 0; i < o_.grammars.size(); ++i) {
    JsonState st = o_.grammars[i]->Start();
    if (st.FeedAll(*o_.grammars[i], from))
      states_.emplace_back(i, std::move(st));
  }
  active_ = !states_.empty();
  spent_ = !active_;
  tail_.clear();
}

bool TokenChooser::Finished() const {
  if (!active_)
    return false;
  for (const auto &[i, st] : states_)
    if (st.Done())
      return true;
  return false;
}

uint32_t TokenChooser::Closing(const States &s) const {
  uint32_t best = UINT32_MAX;
  for (const auto &[i, st] : s)
    best = std::min(best, st.ClosingLength(*o_.grammars[i]));
  return best;
}

int32_t TokenChooser::Choose(absl::Span<const float> row, Sampler &sampler,
                             uint32_t budget) {
  const bool penalties =
      o_.presence_penalty != 0 || o_.frequency_penalty != 0;
  absl::Span<const float> use = row;
  if (penalties || !o_.logit_bias.empty()) {
    row_.assign(row.begin(), row.end());
    for (const auto &[t, b] : o_.logit_bias)
      if ((size_t)t < row_.size())
        row_[t] += b;
    for (const auto &[t, c] : counts_)
      if ((size_t)t < row_.size())
        row_[t] -= o_.presence_penalty + o_.frequency_penalty * (float)c;
    use = row_;
  }
  const int32_t id = o_.grammars.empty() || !active_
                         ? sampler.Sample(use)
                         : Constrained(use, budget);
  Record(id);
  Watch(id);
  return id;
}

void TokenChooser::Record(int32_t id) {
  if (o_.presence_penalty != 0 || o_.frequency_penalty != 0)
    ++counts_[id];
}

bool TokenChooser::Accepts(int32_t id, uint32_t after, States *next) const {
  if (std::find(o_.stop_ids.begin(), o_.stop_ids.end(), id) !=
      o_.stop_ids.end()) {
    for (const auto &[i, st] : states_)
      if (st.CanEnd(*o_.grammars[i]))
        return true;
    return false;
  }
  if (Barred(id))
    return false;
  const std::string_view bytes = Bytes(id);
  if (bytes.empty() || !first_ok_[(unsigned char)bytes[0]])
    return false;
  next->clear();
  for (const auto &[i, st] : states_) {
    JsonState n = st;
    if (n.FeedAll(*o_.grammars[i], bytes))
      next->emplace_back(i, std::move(n));
  }
  return !next->empty() && Closing(*next) <= after;
}

void TokenChooser::Rank(absl::Span<const float> row) {
  const SamplerOptions &s = o_.sampler;
  cands_.resize(row.size());
  for (size_t i = 0; i < row.size(); ++i)
    cands_[i] = {0, row[i], (int32_t)i};
  if (s.temperature <= 0)
    return;
  if (s.top_k > 0 || s.top_p < 1) {
    // The nucleus of the unconstrained distribution comes first (tier 0).
    std::sort(cands_.begin(), cands_.end(), [](const Cand &a, const Cand &b) {
      return a.key != b.key ? a.key > b.key : a.id < b.id;
    });
    size_t keep = s.top_k > 0 ? std::min<size_t>(s.top_k, row.size())
                              : row.size();
    if (s.top_p < 1) {
      const double mx = cands_[0].key / s.temperature;
      double sum = 0, acc = 0;
      for (size_t i = 0; i < keep; ++i)
        sum += std::exp(cands_[i].key / s.temperature - mx);
      for (size_t i = 0; i < keep; ++i) {
        acc += std::exp(cands_[i].key / s.temperature - mx) / sum;
        if (acc >= s.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    for (size_t i = keep; i < cands_.size(); ++i)
      cands_[i].tier = 1;
  }
  for (Cand &c : cands_) {
    if (c.tier)
      continue;
    // splitmix64, then a Gumbel variate.
    uint64_t z = (rng_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u = ((double)(z >> 11) + 0.5) * 0x1.0p-53;
    c.key = (float)(c.key / s.temperature - std::log(-std::log(u)));
  }
}

int32_t TokenChooser::Constrained(absl::Span<const float> row,
                                  uint32_t budget) {
  Rank(row);
  const uint32_t after = budget > 0 ? budget - 1 : 0;
  // The bytes some grammar takes next: most tokens fail on their first.
  first_ok_.reset();
  for (int c = 0; c < 256; ++c)
    for (const auto &[i, st] : states_) {
      JsonState n = st;
      if (n.Feed(*o_.grammars[i], (unsigned char)c)) {
        first_ok_.set(c);
        break;
      }
    }
  // Only those candidates can be taken (and an end-of-sequence token).
  cands_.erase(std::remove_if(cands_.begin(), cands_.end(),
                              [&](const Cand &c) {
                                if (std::count(o_.stop_ids.begin(),
                                               o_.stop_ids.end(), c.id))
                                  return false;
                                const std::string_view b = Bytes(c.id);
                                return b.empty() ||
                                       !first_ok_[(unsigned char)b[0]];
                              }),
               cands_.end());
  auto better = [](const Cand &a, const Cand &b) {
    if (a.tier != b.tier)
      return a.tier < b.tier;
    return a.key != b.key ? a.key > b.key : a.id < b.id;
  };
  States next;
  size_t done = 0;
  for (size_t window : {size_t(64), size_t(4096), cands_.size()}) {
    const size_t end = std::min(window, cands_.size());
    if (end <= done)
      continue;
    std::partial_sort(cands_.begin() + done, cands_.begin() + end,
                      cands_.end(), better);
    for (size_t i = done; i < end; ++i)
      if (Accepts(cands_[i].id, after, &next)) {
        if (!std::count(o_.stop_ids.begin(), o_.stop_ids.end(),
                        cands_[i].id))
          states_ = std::move(next);
        return cands_[i].id;
      }
    done = end;
  }
  // No token keeps the text closable in time (the budget was short from
  // the start): the one that leaves the shortest closing.
  uint32_t best = UINT32_MAX;
  int32_t pick = o_.stop_ids.empty() ? 0 : o_.stop_ids[0];
  States bestStates = states_;
  for (const Cand &c : cands_)
    if (!std::count(o_.stop_ids.begin(), o_.stop_ids.end(), c.id) &&
        Accepts(c.id, UINT32_MAX - 1, &next) && Closing(next) < best) {
      best = Closing(next);
      pick = c.id, bestStates = next;
    }
  states_ = std::move(bestStates);
  return pick;
}

} // namespace duck::runtime
