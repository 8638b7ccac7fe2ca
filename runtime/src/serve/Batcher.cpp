//===- Batcher.cpp - continuous batching of sequences over the ducks ------===//
#include "duck/runtime/serve/Batcher.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <cmath>

namespace duck::runtime {

const char *FinishReasonName(FinishReason r) {
  switch (r) {
  case FinishReason::kStop:
    return "stop";
  case FinishReason::kLength:
    return "length";
  case FinishReason::kCancelled:
    return "cancelled";
  case FinishReason::kError:
    return "error";
  }
  return "?";
}

Batcher::Batcher(Engine &engine, const BatcherOptions &opts)
    : engine_(engine), opts_(opts) {
  opts_.parallel = std::max(1u, std::min(opts.parallel, engine.max_seqs()));
  opts_.prefill_chunk = std::max(1u, opts.prefill_chunk);
  // A step is every decoding row plus one prompt chunk. A step with
  // prompt rows has a sequence in prefill, so at most parallel - 1 decode
  // beside it: with one sequence the chunk is the engine's whole step.
  const uint32_t others = opts_.parallel - 1;
  opts_.prefill_chunk =
      std::min(opts_.prefill_chunk,
               engine.max_rows() > others ? engine.max_rows() - others : 1u);
  for (uint32_t s = opts_.parallel; s-- > 0;)
    free_slots_.push_back(s); // slot 0 is taken first
  slot_tokens_.resize(opts_.parallel);
  if (opts_.reuse_prefix && opts_.kv_budget > 0) {
    store_ = std::make_unique<PrefixStore>(opts_.kv_budget,
                                           engine.saved_kv_bytes_per_token());
    stats_.store = store_->stats();
  }
}

void Batcher::UseStore(Seq &s, uint32_t common) {
  if (!store_ || !store_->enabled())
    return;
  std::vector<int32_t> &have = slot_tokens_[s.slot];
  const std::vector<int32_t> &prompt = s.req.prompt;
  // Only positions the store does not hold yet are copied; the prompt's
  // stored prefix is not evicted for them.
  if (common < have.size())
    store_->Insert(
        have,
        [&](uint32_t pos, uint32_t n, uint8_t *out) {
          engine_.SaveKv(s.slot, pos, n, out);
        },
        prompt);
  // At least the prompt's last token runs: its row gives the logits.
  const uint32_t found =
      std::min<uint32_t>(store_->Find(prompt), (uint32_t)prompt.size() - 1);
  if (found <= s.pos)
    return;
  store_->Read(prompt, s.pos, found,
               [&](uint32_t pos, uint32_t n, const uint8_t *in) {
                 engine_.LoadKv(s.slot, pos, n, in);
               });
  have.assign(prompt.begin(), prompt.begin() + found);
  s.pos = found;
}

size_t Batcher::PickSlot(const std::vector<int32_t> &prompt,
                         uint32_t *common) const {
  size_t best = free_slots_.size() - 1; // the next slot in order
  *common = 0;
  if (!opts_.reuse_prefix)
    return best;
  for (size_t i = free_slots_.size(); i-- > 0;) {
    const std::vector<int32_t> &have = slot_tokens_[free_slots_[i]];
    const size_t n = std::min(have.size(), prompt.size());
    const uint32_t c =
        (uint32_t)(std::mismatch(have.begin(), have.begin() + n, prompt.begin())
                       .first -
                   have.begin());
    if (c > *common) {
      *common = c;
      best = i;
    }
  }
  return best;
}

absl::StatusOr<uint64_t> Batcher::Submit(GenRequest r) {
  if (r.prompt.empty())
    return absl::InvalidArgumentError("the prompt is empty");
  if (r.prompt.size() + 1 > engine_.max_seq())
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt has ", r.prompt.size(),
                     " tokens; this server's context is ", engine_.max_seq()));
  auto s = std::make_unique<Seq>();
  s->req = std::move(r);
  s->sampler = std::make_unique<Sampler>(s->req.sampler);
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_)
    return absl::FailedPreconditionError("the server is shutting down");
  // Free slots take requests at the next step: they do not count as
  // waiting.
  if (queue_.size() >= opts_.queue_limit + free_slots_.size())
    return absl::ResourceExhaustedError(absl::StrCat(
        "the queue is full (", opts_.parallel, " requests running, ",
        queue_.size() - std::min(queue_.size(), free_slots_.size()),
        " waiting)"));
  s->id = next_id_++;
  const uint64_t id = s->id;
  queue_.push_back(std::move(s));
  stats_.queued = (uint32_t)queue_.size();
  cv_.notify_all();
  return id;
}

void Batcher::Cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(id);
  cv_.notify_all();
}

void Batcher::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = true;
  cv_.notify_all();
}

bool Batcher::Busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !queue_.empty() || stats_.active > 0;
}

BatcherStats Batcher::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Batcher::Finish(Seq &s, FinishReason why, const absl::Status &error) {
  if (s.req.on_done)
    s.req.on_done(why, error);
}

/// Moves cancellations and queued requests in (under the lock), then
/// finishes the cancelled ones outside it.
void Batcher::Admit() {
  std::vector<std::unique_ptr<Seq>> cancelled;
  std::vector<std::pair<Seq *, uint32_t>> admitted; // and its slot's common
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t id : cancels_) {
      auto q = std::find_if(queue_.begin(), queue_.end(),
                            [&](const auto &s) { return s->id == id; });
      if (q != queue_.end()) {
        cancelled.push_back(std::move(*q));
        queue_.erase(q);
        continue;
      }
      auto a = std::find_if(active_.begin(), active_.end(),
                            [&](const auto &s) { return s->id == id; });
      if (a != active_.end()) {
        free_slots_.push_back((*a)->slot);
        cancelled.push_back(std::move(*a));
        active_.erase(a);
      }
    }
    cancels_.clear();
    while (!queue_.empty() && !free_slots_.empty()) {
      std::unique_ptr<Seq> s = std::move(queue_.front());
      queue_.pop_front();
      uint32_t common = 0;
      const size_t pick = PickSlot(s->req.prompt, &common);
      s->slot = free_slots_[pick];
      free_slots_.erase(free_slots_.begin() + pick);
      // At least the prompt's last token runs: its row gives the logits.
      s->pos = std::min(common, (uint32_t)s->req.prompt.size() - 1);
      if (s->req.speculative && opts_.mtp) {
        s->mtp = true;
        s->budget = std::make_unique<DraftBudget>(
            std::min(s->req.speculative, std::max(1u, opts_.mtp_drafts)));
      } else if (s->req.speculative) {
        s->text = s->req.prompt;
        s->budget = std::make_unique<DraftBudget>(s->req.speculative);
        s->drafter = std::make_unique<LookupDrafter>(s->req.lookup_corpus);
      }
      admitted.emplace_back(s.get(), common);
      active_.push_back(std::move(s));
    }
    stats_.queued = (uint32_t)queue_.size();
    stats_.active = (uint32_t)active_.size();
  }
  for (auto &s : cancelled)
    Finish(*s, FinishReason::kCancelled, absl::OkStatus());
  // Copies between a slot and the store happen outside the lock (Submit
  // and Stats do not wait for them).
  for (auto [s, common] : admitted)
    UseStore(*s, common);
  if (!admitted.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto &a : admitted)
      stats_.cached_tokens += a.first->pos;
    if (store_)
      stats_.store = store_->stats();
  }
  for (const auto &a : admitted)
    if (a.first->req.on_admit)
      a.first->req.on_admit(a.first->pos);
}

TokenLogprobs LogprobsAt(absl::Span<const float> logits, int32_t token,
                         uint32_t top) {
  TokenLogprobs out;
  if (logits.empty())
    return out;
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float v : logits)
    sum += std::exp((double)v - mx);
  const double logZ = mx + std::log(sum);
  out.logprob = (float)((double)logits[token] - logZ);
  top = std::min<uint32_t>(top, (uint32_t)logits.size());
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = (int32_t)i;
  std::partial_sort(ids.begin(), ids.begin() + top, ids.end(),
                    [&](int32_t a, int32_t b) {
                      return logits[a] != logits[b] ? logits[a] > logits[b]
                                                    : a < b;
                    });
  for (uint32_t i = 0; i < top; ++i)
    out.top.emplace_back(ids[i], (float)((double)logits[ids[i]] - logZ));
  return out;
}

bool Batcher::Deliver(Seq &s, int32_t token, absl::Span<const float> row) {
  const GenRequest &r = s.req;
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), token) !=
      r.stop_ids.end()) {
    Finish(s, FinishReason::kStop, absl::OkStatus());
    return false;
  }
  if (r.on_logprobs)
    r.on_logprobs(token, LogprobsAt(row, token, r.top_logprobs));
  ++s.generated;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.generated_tokens;
  }
  const TokenVerdict v =
      r.on_token ? r.on_token(token) : TokenVerdict::kContinue;
  if (v == TokenVerdict::kCancel) {
    Finish(s, FinishReason::kCancelled, absl::OkStatus());
    return false;
  }
  if (v == TokenVerdict::kStop || (r.chooser && r.chooser->Finished())) {
    Finish(s, FinishReason::kStop, absl::OkStatus());
    return false;
  }
  if (s.generated >= r.max_tokens || s.pos + 1 > engine_.max_seq()) {
    Finish(s, FinishReason::kLength, absl::OkStatus());
    return false;
  }
  s.next = token;
  return true;
}

uint32_t Batcher::GatherChunks(size_t *decode_rows) {
  // Every decoding sequence gives a row; sequences still in prefill fill
  // up to prefill_chunk more rows, oldest first. Where a prompt is cut
  // does not change its rows' results, only how long the running streams
  // wait for this step.
  chunks_.clear();
  sampling_.clear();
  // Drafts take the rows that neither a decoding row nor the prompt chunk
  // needs.
  uint32_t decoding = 0, prompt = 0;
  for (auto &s : active_)
    if (s->next >= 0)
      ++decoding;
    else
      prompt += (uint32_t)s->req.prompt.size() - s->pos;
  uint32_t spare = engine_.max_rows() - decoding -
                   std::min(prompt, opts_.prefill_chunk);
  for (auto &s : active_)
    if (s->next >= 0) {
      DecodeRows(*s, &spare);
      SeqChunk c{s->slot, s->pos, s->rows, true};
      c.every_row = s->rows.size() > 1;
      c.mtp = s->mtp;
      chunks_.push_back(c);
      sampling_.push_back(s.get());
    }
  *decode_rows = chunks_.size();
  uint32_t prefillRows = 0;
  for (auto &s : active_) {
    if (s->next >= 0 || prefillRows >= opts_.prefill_chunk)
      continue;
    const uint32_t left = (uint32_t)s->req.prompt.size() - s->pos;
    const uint32_t n = std::min(left, opts_.prefill_chunk - prefillRows);
    const bool last = n == left;
    SeqChunk c{s->slot, s->pos,
               absl::MakeConstSpan(s->req.prompt).subspan(s->pos, n), last};
    c.mtp = s->mtp;
    chunks_.push_back(c);
    if (last)
      sampling_.push_back(s.get());
    prefillRows += n;
  }
  return prefillRows;
}

void Batcher::DecodeRows(Seq &s, uint32_t *spare) {
  s.rows.assign(1, s.next);
  if (!s.budget)
    return;
  // Never past --max-tokens, nor so far that the context would end a
  // step sooner than without drafts.
  const uint64_t room = std::min<uint64_t>(
      s.req.max_tokens - s.generated - 1,
      engine_.max_seq() >= s.pos + 2 ? engine_.max_seq() - s.pos - 2 : 0);
  const uint32_t k = (uint32_t)std::min<uint64_t>(
      std::min<uint64_t>(s.budget->Next(), *spare), room);
  std::vector<int32_t> drafts;
  if (s.drafter)
    drafts = s.drafter->Propose(s.text, k);
  else if (s.mtp)
    drafts.assign(s.mtp_drafts.begin(),
                  s.mtp_drafts.begin() +
                      std::min<size_t>(k, s.mtp_drafts.size()));
  s.rows.insert(s.rows.end(), drafts.begin(), drafts.end());
  *spare -= (uint32_t)drafts.size();
}

bool Batcher::SampleRows(Seq &s, size_t at, uint32_t pos0) {
  const uint32_t V = engine_.vocab();
  const size_t drafts = s.next >= 0 ? s.rows.size() - 1 : 0;
  size_t i = 0;
  bool going = true;
  for (;; ++i) {
    const auto row =
        absl::MakeConstSpan(logits_).subspan((uint64_t)(at + i) * V, V);
    const int32_t token =
        s.req.chooser
            ? s.req.chooser->Choose(row, *s.sampler,
                                    s.req.max_tokens - s.generated)
            : s.sampler->Sample(row);
    going = Deliver(s, token, row);
    if (s.budget)
      s.text.push_back(token);
    // A draft the model would have produced: its row is the next one's.
    if (!going || i == drafts || token != s.rows[i + 1])
      break;
  }
  if (drafts) {
    // The rows after the last accepted draft hold what was not produced.
    s.pos = pos0 + 1 + (uint32_t)i;
    std::vector<int32_t> &have = slot_tokens_[s.slot];
    have.resize(std::min<size_t>(have.size(), s.pos));
    s.budget->Record((uint32_t)drafts, (uint32_t)i);
    if (s.mtp) { // as duckrun's: a module whose first 4 drafts fail stops
      s.mtp_accepted |= i > 0;
      s.mtp_rejected += i == 0;
      if (!s.mtp_accepted && s.mtp_rejected >= 4)
        s.mtp = false;
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.drafts_proposed += drafts;
    stats_.drafts_accepted += i;
    ++stats_.verify_steps;
  }
  return going;
}

void Batcher::Step() {
  size_t decodeRows = 0;
  const uint32_t prefillRows = GatherChunks(&decodeRows);
  if (chunks_.empty())
    return;
  // The positions a chunk writes no longer hold what the slot had (even if
  // the step fails half way); its tokens are theirs once it succeeds.
  for (const SeqChunk &c : chunks_)
    slot_tokens_[c.seq].resize(
        std::min<size_t>(c.pos, slot_tokens_[c.seq].size()));
  logits_.clear();
  absl::Status st = engine_.RunBatch(chunks_, &logits_);
  if (!st.ok()) {
    // The ducks could not be brought back (or a bug): every running
    // request ends with the error; queued ones get their turn next.
    for (auto &s : active_)
      Finish(*s, FinishReason::kError, st);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto &s : active_)
      free_slots_.push_back(s->slot);
    active_.clear();
    stats_.active = 0;
    return;
  }
  std::vector<uint32_t> pos0(sampling_.size());
  for (size_t i = 0; i < sampling_.size(); ++i)
    pos0[i] = sampling_[i]->pos;
  for (const SeqChunk &c : chunks_) {
    for (auto &s : active_)
      if (s->slot == c.seq)
        s->pos += (uint32_t)c.tokens.size();
    std::vector<int32_t> &have = slot_tokens_[c.seq];
    if (have.size() == c.pos)
      have.insert(have.end(), c.tokens.begin(), c.tokens.end());
  }
  std::vector<Seq *> done;
  size_t at = 0; // the logits row of each sampling sequence's first row
  for (size_t i = 0; i < sampling_.size(); ++i) {
    Seq &s = *sampling_[i];
    const size_t rows = s.next >= 0 ? s.rows.size() : 1; // before sampling
    if (!SampleRows(s, at, pos0[i]))
      done.push_back(&s);
    at += rows;
  }
  if (opts_.mtp)
    DraftWithMtp(done);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  stats_.max_decode_rows =
      std::max(stats_.max_decode_rows, (uint32_t)decodeRows);
  for (const SeqChunk &c : chunks_)
    stats_.rows += c.tokens.size();
  stats_.prompt_tokens += prefillRows;
  for (Seq *s : done) {
    free_slots_.push_back(s->slot);
    active_.erase(std::find_if(active_.begin(), active_.end(),
                               [&](const auto &a) { return a.get() == s; }));
  }
  stats_.active = (uint32_t)active_.size();
}

void Batcher::DraftWithMtp(const std::vector<Seq *> &done) {
  std::vector<MtpRun> runs;
  std::vector<Seq *> of;
  for (const SeqChunk &c : chunks_) {
    if (!c.mtp)
      continue;
    auto a = std::find_if(active_.begin(), active_.end(),
                          [&](const auto &s) { return s->slot == c.seq; });
    if (a == active_.end() || !(*a)->mtp ||
        std::find(done.begin(), done.end(), a->get()) != done.end())
      continue;
    Seq &s = **a;
    // The rows the sequence keeps: its accepted ones, or the prompt chunk;
    // the token after the last is the one sampled or the prompt's next.
    MtpRun r;
    r.seq = c.seq;
    r.rows = s.pos - c.pos;
    r.next = s.next >= 0 ? s.next : s.req.prompt[s.pos];
    r.draft = s.next >= 0;
    r.chain = r.draft ? std::max(1u, s.budget->Peek()) - 1 : 0;
    runs.push_back(r);
    of.push_back(&s);
  }
  if (runs.empty())
    return;
  std::vector<float> logits;
  std::vector<std::vector<int32_t>> chained;
  if (absl::Status st = engine_.MtpBatch(runs, &logits, &chained); !st.ok()) {
    // The drafts only save steps: without them the answers are the same.
    for (Seq *s : of) {
      s->mtp = false;
      s->mtp_drafts.clear();
    }
    return;
  }
  const uint64_t V = engine_.vocab();
  size_t row = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    of[i]->mtp_drafts.clear();
    if (!runs[i].draft)
      continue;
    const float *l = logits.data() + row++ * V;
    of[i]->mtp_drafts.push_back((int32_t)(std::max_element(l, l + V) - l));
    of[i]->mtp_drafts.insert(of[i]->mtp_drafts.end(), chained[i].begin(),
                             chained[i].end());
  }
}

void Batcher::Run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || !cancels_.empty() || !active_.empty() ||
               !queue_.empty();
      });
      if (stop_) {
        for (auto &s : queue_)
          cancels_.push_back(s->id);
        for (auto &s : active_)
          cancels_.push_back(s->id);
      }
    }
    Admit();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ && active_.empty() && queue_.empty())
        return;
    }
    Step();
    if (after_step_)
      after_step_();
  }
}

} // namespace duck::runtime
