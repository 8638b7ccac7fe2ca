//===- Engine.cpp - runs a plan's host program ----------------------------===//
#include "duck/runtime/engine/Engine.h"

#include "ops/HostOp.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

namespace duck::runtime {
namespace pl = ::duck::plan;

Engine::Engine() = default;
Engine::~Engine() = default;

uint32_t Engine::vocab() const { return plan_->def().model()->vocab(); }

uint64_t Engine::host_weight_bytes_per_token() const {
  uint64_t n = 0;
  for (const auto &op : ops_)
    n += op->WeightBytesPerToken();
  return n;
}

uint64_t Engine::cache_read_bytes_per_token(uint64_t positions) const {
  uint64_t n = 0;
  for (const auto &op : ops_)
    n += op->CacheReadBytes(positions);
  return n;
}

uint64_t Engine::kv_bytes_per_token() const {
  uint64_t n = 0;
  for (const auto &op : ops_)
    n += op->KvBytesPerToken();
  return n;
}

uint64_t Engine::mtp_kv_bytes_per_token() const {
  uint64_t n = 0;
  for (const auto &op : mtp_ops_)
    n += op->KvBytesPerToken();
  return n;
}

void Engine::SaveKv(uint32_t seq, uint32_t pos, uint32_t n, uint8_t *out) {
  CopyKvRows(seq, pos, n, out, /*save=*/true);
}

void Engine::LoadKv(uint32_t seq, uint32_t pos, uint32_t n, const uint8_t *in) {
  // CopyKv only reads `buf` when it loads.
  CopyKvRows(seq, pos, n, const_cast<uint8_t *>(in), /*save=*/false);
}

uint64_t Engine::saved_kv_bytes_per_token() const {
  return kv_bytes_per_token() + mtp_kv_bytes_per_token();
}

void Engine::CopyKvRows(uint32_t seq, uint32_t pos, uint32_t n, uint8_t *buf,
                        bool save) {
  const uint64_t stride = saved_kv_bytes_per_token();
  // Positions split over the host threads: a long sequence's rows are
  // hundreds of MB on a large model, and one thread's copy is slower than
  // the memory.
  pool_->ParallelFor(n, [&](uint64_t b, uint64_t e) {
    uint64_t at = 0;
    // The MTP module's caches after the model's (built only with
    // EngineOptions::mtp): a prefix taken back has its drafts' rows too.
    for (const auto *list : {&ops_, &mtp_ops_})
      for (const auto &op : *list) {
        op->CopyKv(seq, pos + b, (uint32_t)(e - b), buf + b * stride + at,
                   stride, save);
        at += op->KvBytesPerToken();
      }
  });
}

absl::StatusOr<std::unique_ptr<Engine>>
Engine::Create(const LoadedPlan &plan, FfnRunner *runner,
               const EngineOptions &opts) {
  std::unique_ptr<Engine> e(new Engine());
  e->plan_ = &plan;
  e->runner_ = runner;
  e->opts_ = opts;
  e->opts_.prefill_chunk = std::max(1u, opts.prefill_chunk);
  e->opts_.max_seqs = std::max(1u, opts.max_seqs);
  e->opts_.max_rows = std::max(opts.max_rows, e->opts_.prefill_chunk);
  e->hidden_ = plan.def().model()->hidden();
  if (opts.max_seq == 0)
    return absl::InvalidArgumentError("--max-seq must be at least 1");
  e->pool_ = std::make_unique<ThreadPool>(std::max(1u, opts.threads));
  if (absl::Status s = e->Prepare(); !s.ok())
    return s;
  return e;
}

absl::Status Engine::BuildOps(const std::vector<const pl::OpDef *> &defs,
                              const ops::WeightReader &weights,
                              std::vector<uint64_t> &widths,
                              std::vector<std::unique_ptr<ops::HostOp>> &out,
                              std::vector<pl::OpParams> &kinds) {
  for (const pl::OpDef *def : defs) {
    const ops::HostOpKind *kind = ops::FindHostOpKind(def->params_type());
    if (!kind)
      return absl::InvalidArgumentError(absl::StrCat(
          "plan op of layer ", def->layer(), " has no parameters this runtime "
          "knows (a plan from another duckc?); recompile the model"));
    ops::OpEnv env{*plan_,
                   *def,
                   weights,
                   runner_,
                   pool_.get(),
                   hidden_,
                   opts_.max_rows,
                   opts_.max_seq,
                   opts_.max_seqs,
                   opts_.kv_f16,
                   opts_.populate_seqs};
    auto op = kind->create(env);
    if (!op.ok())
      return op.status();
    if (def->inputs())
      (*op)->inputs.assign(def->inputs()->begin(), def->inputs()->end());
    (*op)->result = def->result();
    if (uint64_t w = (*op)->OutWidth())
      widths[def->result()] = w;
    out.push_back(std::move(*op));
    kinds.push_back(def->params_type());
  }
  return absl::OkStatus();
}

/// Builds every op from its plan table and takes the activations' memory
/// once: nothing is allocated while a chunk runs.
absl::Status Engine::Prepare() {
  const pl::PlanDef &d = plan_->def();
  std::vector<uint64_t> widths(d.num_values(), hidden_);
  ops::WeightReader weights(*plan_, opts_.max_rows);
  DUCK_RETURN_IF_ERROR(BuildOps({d.ops()->begin(), d.ops()->end()}, weights,
                                widths, ops_, kinds_));
  if (opts_.mtp && d.mtp() && d.mtp()->ops()) {
    const pl::MtpDef &m = *d.mtp();
    DUCK_RETURN_IF_ERROR(BuildOps({m.ops()->begin(), m.ops()->end()}, weights,
                                  widths, mtp_ops_, mtp_kinds_));
    for (size_t i = 0; i < ops_.size(); ++i)
      if (kinds_[i] == pl::OpParams::LmHeadOpDef)
        head_ = ops_[i].get();
    if (!head_ || head_->inputs.empty() || head_->inputs[0] != m.hidden())
      return absl::InvalidArgumentError(
          "the plan's MTP module does not read its LM head's input; "
          "recompile the model");
    mtp_hidden_ = m.hidden();
    mtp_result_ = m.result();
    // The shared head's norm reads the layer's output.
    if (mtp_ops_.back()->inputs.size() != 1 ||
        mtp_kinds_.back() != pl::OpParams::RmsNormOpDef)
      return absl::InvalidArgumentError(
          "the plan's MTP module does not end with its shared head's norm; "
          "recompile the model");
    mtp_layer_out_ = mtp_ops_.back()->inputs[0];
    mtp_y_.assign(hidden_, 0.0f);
    mtp_h_.assign((uint64_t)opts_.max_rows * hidden_, 0.0f);
    mtp_tokens_.reserve(opts_.max_rows);
    mtp_next_.reserve(opts_.max_rows);
  }
  if (opts_.host_prefetch_bytes > 0 && runner_) {
    prefetch_ = PrefetchPlan(ops_, opts_.host_prefetch_bytes);
    mtp_prefetch_ = PrefetchPlan(mtp_ops_, opts_.host_prefetch_bytes);
  }
  values_ = std::make_unique<ops::ValueArena>();
  values_->Init(widths, opts_.max_rows);
  // The host kernels' scratch for the largest step, a buffer for each of
  // the pool's threads (at most 32 MiB each; more is taken when needed).
  if (weights.KernelScratchFloats() * sizeof(float) <= (32u << 20))
    ReserveKernelScratch(pool_->size(), weights.KernelScratchFloats());
  FindTail();
  row_tokens_.reserve(opts_.max_rows);
  row_pos_.reserve(opts_.max_rows);
  row_seq_.reserve(opts_.max_rows);
  logit_rows_.reserve(opts_.max_rows);
  return absl::OkStatus();
}

absl::Status Engine::Forward(absl::Span<const int32_t> tokens,
                             std::vector<float> *out_logits, bool logits) {
  if (tokens.empty())
    return absl::InvalidArgumentError("no tokens to run");
  if ((uint64_t)pos_ + tokens.size() > opts_.max_seq)
    return absl::OutOfRangeError(absl::StrCat(
        "sequence of ", pos_ + tokens.size(), " tokens exceeds --max-seq ",
        opts_.max_seq));
  const uint32_t chunk = std::max(1u, opts_.prefill_chunk);
  if (opts_.all_logits)
    out_logits->clear();
  for (size_t i = 0; i < tokens.size(); i += chunk) {
    size_t n = std::min<size_t>(chunk, tokens.size() - i);
    // Only the last chunk's last row is anyone's (all_logits: every row).
    const bool want = opts_.all_logits || (logits && i + n == tokens.size());
    if (absl::Status s = RunChunk(tokens.subspan(i, n), out_logits, want);
        !s.ok())
      return s;
  }
  return absl::OkStatus();
}

absl::Status Engine::ForwardDecodeOnly(absl::Span<const int32_t> tokens,
                                       std::vector<float> *out_logits) {
  if ((uint64_t)pos_ + tokens.size() > opts_.max_seq)
    return absl::OutOfRangeError(absl::StrCat(
        "sequence of ", pos_ + tokens.size(), " tokens exceeds --max-seq ",
        opts_.max_seq));
  if (opts_.all_logits)
    out_logits->clear();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (absl::Status s = RunChunk(tokens.subspan(i, 1), out_logits);
        !s.ok())
      return s;
  return absl::OkStatus();
}

absl::Status Engine::RunChunk(absl::Span<const int32_t> tokens,
                              std::vector<float> *out_logits, bool logits) {
  if (!opts_.all_logits)
    out_logits->clear(); // the last row's logits only
  DUCK_RETURN_IF_ERROR(MtpCatchUp(tokens[0], (uint32_t)tokens.size()));
  const SeqChunk chunk{0, pos_, tokens, logits};
  DUCK_RETURN_IF_ERROR(RunBatch(absl::MakeConstSpan(&chunk, 1), out_logits));
  KeepMtpRows(tokens, pos_);
  pos_ += tokens.size();
  return absl::OkStatus();
}

absl::Status Engine::Verify(absl::Span<const int32_t> tokens,
                            std::vector<float> *out_logits) {
  if (tokens.empty())
    return absl::InvalidArgumentError("no tokens to verify");
  out_logits->clear();
  DUCK_RETURN_IF_ERROR(MtpCatchUp(tokens[0], (uint32_t)tokens.size()));
  SeqChunk chunk{0, pos_, tokens, true};
  chunk.every_row = true;
  DUCK_RETURN_IF_ERROR(RunBatch(absl::MakeConstSpan(&chunk, 1), out_logits));
  KeepMtpRows(tokens, pos_);
  pos_ += tokens.size();
  return absl::OkStatus();
}

void Engine::KeepMtpRows(absl::Span<const int32_t> tokens, uint32_t pos) {
  if (!has_mtp() || mtp_stopped_)
    return;
  // Rows not yet run stay (MtpCatchUp made room for this step); a step
  // that does not follow them starts afresh.
  if (mtp_tokens_.empty() || pos != mtp_pos_ + mtp_tokens_.size()) {
    mtp_tokens_.clear();
    mtp_pos_ = pos;
  }
  mtp_step_at_ = (uint32_t)mtp_tokens_.size();
  mtp_tokens_.insert(mtp_tokens_.end(), tokens.begin(), tokens.end());
  std::memcpy(mtp_h_.data() + (uint64_t)mtp_step_at_ * hidden_,
              values_->Get(mtp_hidden_),
              tokens.size() * (uint64_t)hidden_ * sizeof(float));
  mtp_open_ = true;
}

absl::Status Engine::MtpDraft(uint32_t rows, int32_t next, MtpMode mode,
                              std::vector<float> *out_logits) {
  if (!has_mtp())
    return absl::FailedPreconditionError(
        "no MTP module: the plan has none or the engine was built without "
        "EngineOptions::mtp");
  if (!mtp_open_)
    return absl::FailedPreconditionError(
        "MTP draft twice for one step, or after none");
  if (rows == 0 || mtp_step_at_ + rows > mtp_tokens_.size())
    return absl::InvalidArgumentError(
        absl::StrCat("MTP draft over ", rows, " rows of a step of ",
                     mtp_tokens_.size() - mtp_step_at_));
  mtp_open_ = false;
  mtp_tokens_.resize(mtp_step_at_ + rows); // the rows the caller kept
  if (mode == MtpMode::kDefer)
    return absl::OkStatus(); // `next` comes again as the next step's first
  return RunPendingMtp(next, mode == MtpMode::kDraft, out_logits);
}

absl::Status Engine::MtpCatchUp(int32_t next, uint32_t rows) {
  // Rows wait for the token after their last, `next`, this step's first:
  // the prompt's chunks, or steps whose drafts were paused. They wait on
  // while the rows they and this step make fit in one step; a step that
  // does not follow them (a rewind nobody drafted after) drops them.
  if (!has_mtp() || mtp_tokens_.empty())
    return absl::OkStatus();
  mtp_open_ = false;
  if (pos_ != mtp_pos_ + mtp_tokens_.size()) {
    mtp_tokens_.clear();
    return absl::OkStatus();
  }
  if (mtp_tokens_.size() + rows <= opts_.max_rows)
    return absl::OkStatus();
  return RunPendingMtp(next, false, nullptr);
}

absl::Status Engine::MtpChain(int32_t draft, std::vector<float> *out_logits) {
  if (!has_mtp() || mtp_stopped_)
    return absl::FailedPreconditionError("no MTP module runs");
  if ((uint64_t)mtp_last_pos_ + 2 > opts_.max_seq)
    return absl::OutOfRangeError("a chained MTP draft past --max-seq");
  // A position past the kept ones: the module's caches get rows the real
  // ones overwrite before any row reads them (they run in position order).
  // RunMtp copies the hidden row in before it writes mtp_y_ again.
  const int32_t tok[1] = {draft};
  return RunMtp(mtp_last_pos_ + 1, tok, true, out_logits, mtp_y_.data());
}

absl::Status Engine::RunPendingMtp(int32_t next, bool logits,
                                   std::vector<float> *out_logits) {
  mtp_next_.assign(mtp_tokens_.begin() + 1, mtp_tokens_.end());
  mtp_next_.push_back(next);
  const uint32_t pos = mtp_pos_;
  mtp_tokens_.clear();
  return RunMtp(pos, mtp_next_, logits, out_logits);
}

absl::Status Engine::ProjectMtpRows(std::vector<float> *sink) {
  // The main LM head projects the module's result: put it in its input.
  const uint32_t n = (uint32_t)row_tokens_.size();
  std::memcpy(values_->Get(mtp_hidden_), values_->Get(mtp_result_),
              (uint64_t)n * hidden_ * sizeof(float));
  ops::Step step{row_tokens_, row_pos_,      row_seq_, logit_rows_,
                 n > 1,       values_.get(), sink};
  return head_->Run(step);
}

void Engine::ClearRows() {
  row_tokens_.clear();
  row_pos_.clear();
  row_seq_.clear();
  logit_rows_.clear();
}

absl::Status Engine::RunMtp(uint32_t pos, absl::Span<const int32_t> next,
                            bool last_logits, std::vector<float> *out_logits,
                            const float *hidden) {
  const uint32_t n = (uint32_t)next.size();
  row_tokens_.assign(next.begin(), next.end());
  row_pos_.clear();
  row_seq_.assign(n, 0);
  logit_rows_.clear();
  // --mtp-logits-out keeps every real row's logits, not a chained one's.
  const bool all = opts_.mtp_all_logits && !hidden;
  for (uint32_t i = 0; i < n; ++i) {
    row_pos_.push_back(pos + i);
    if (all || (last_logits && i + 1 == n))
      logit_rows_.push_back(i);
  }
  // The hidden rows the main steps left (the LM head's input value), or a
  // chained draft's: the module's own last output.
  float *h = values_->Get(mtp_hidden_);
  std::memcpy(h, hidden ? hidden : mtp_h_.data(),
              (uint64_t)n * hidden_ * sizeof(float));
  std::vector<float> *sink = out_logits ? out_logits : &mtp_scratch_;
  sink->clear();
  DUCK_RETURN_IF_ERROR(RunOps(mtp_ops_, mtp_kinds_, n > 1, nullptr));
  // The last row's layer output (before the shared head's norm): what a
  // chained draft reads as its hidden state.
  std::memcpy(mtp_y_.data(),
              values_->Get(mtp_layer_out_) + (uint64_t)(n - 1) * hidden_,
              (uint64_t)hidden_ * sizeof(float));
  mtp_last_pos_ = pos + n - 1;
  if (logit_rows_.empty())
    return absl::OkStatus();
  DUCK_RETURN_IF_ERROR(ProjectMtpRows(sink));
  const uint64_t V = vocab();
  if (all) {
    mtp_logits_all_.insert(mtp_logits_all_.end(), sink->begin(), sink->end());
    if (last_logits && out_logits) // the draft: the last row only
      out_logits->erase(out_logits->begin(), out_logits->end() - V);
  }
  return absl::OkStatus();
}

absl::Status Engine::RunBatch(absl::Span<const SeqChunk> chunks,
                              std::vector<float> *out_logits) {
  ClearRows();
  uint64_t rows = 0;
  for (const SeqChunk &c : chunks)
    rows += c.tokens.size();
  if (rows == 0)
    return absl::InvalidArgumentError("a batched step with no tokens");
  if (rows > opts_.max_rows)
    return absl::InvalidArgumentError(absl::StrCat(
        "a batched step of ", rows, " rows; the engine takes ",
        opts_.max_rows));
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SeqChunk &c = chunks[i];
    if (c.seq >= opts_.max_seqs)
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", c.seq, " of a batched step; the engine has ",
          opts_.max_seqs));
    if ((uint64_t)c.pos + c.tokens.size() > opts_.max_seq)
      return absl::OutOfRangeError(absl::StrCat(
          "sequence of ", c.pos + c.tokens.size(),
          " tokens exceeds --max-seq ", opts_.max_seq));
    for (size_t j = 0; j < i; ++j)
      if (chunks[j].seq == c.seq)
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence ", c.seq, " appears twice in one batched step"));
    for (uint32_t t = 0; t < c.tokens.size(); ++t) {
      if (c.logits &&
          (opts_.all_logits || c.every_row || t + 1 == c.tokens.size()))
        logit_rows_.push_back((uint32_t)row_tokens_.size());
      row_tokens_.push_back(c.tokens[t]);
      row_pos_.push_back(c.pos + t);
      row_seq_.push_back(c.seq);
    }
  }
  DUCK_RETURN_IF_ERROR(RunRows(rows > 1, out_logits));
  if (has_mtp())
    KeepBatchMtpRows(chunks);
  return absl::OkStatus();
}

void Engine::KeepBatchMtpRows(absl::Span<const SeqChunk> chunks) {
  if (mtp_kept_.size() < opts_.max_seqs)
    mtp_kept_.resize(opts_.max_seqs);
  const float *h = values_->Get(mtp_hidden_);
  uint64_t row = 0;
  for (const SeqChunk &c : chunks) {
    MtpKept &k = mtp_kept_[c.seq];
    k.tokens.clear(); // a step not marked drops what the last one kept
    if (c.mtp) {
      k.pos = c.pos;
      k.tokens.assign(c.tokens.begin(), c.tokens.end());
      k.h.assign(h + row * hidden_, h + (row + c.tokens.size()) * hidden_);
    }
    row += c.tokens.size();
  }
}

absl::Status Engine::MtpBatch(absl::Span<const MtpRun> runs,
                              std::vector<float> *out_logits,
                              std::vector<std::vector<int32_t>> *chained) {
  if (!has_mtp())
    return absl::FailedPreconditionError(
        "no MTP module: the plan has none or the engine was built without "
        "EngineOptions::mtp");
  out_logits->clear();
  for (const MtpRun &r : runs)
    if (r.seq >= mtp_kept_.size() || r.rows == 0 ||
        r.rows > mtp_kept_[r.seq].tokens.size())
      return absl::InvalidArgumentError(absl::StrCat(
          "MTP over ", r.rows, " rows of sequence ", r.seq, ", which kept ",
          r.seq < mtp_kept_.size() ? mtp_kept_[r.seq].tokens.size() : 0));
  std::vector<MtpLink> links;
  for (size_t i = 0; i < runs.size();) {
    auto next = MtpBatchStep(runs, i, out_logits, chained ? &links : nullptr);
    if (!next.ok())
      return next.status();
    i = *next;
  }
  for (const MtpRun &r : runs)
    mtp_kept_[r.seq].tokens.clear();
  if (!chained)
    return absl::OkStatus();
  chained->assign(runs.size(), {});
  return MtpChainLinks(std::move(links), chained);
}

absl::StatusOr<size_t> Engine::MtpBatchStep(absl::Span<const MtpRun> runs,
                                            size_t i,
                                            std::vector<float> *out_logits,
                                            std::vector<MtpLink> *links) {
  // As many runs as fit one step (each alone fits: its rows were one).
  ClearRows();
  float *h = values_->Get(mtp_hidden_);
  size_t j = i;
  for (uint32_t n = 0; j < runs.size(); ++j) {
    const MtpRun &r = runs[j];
    const MtpKept &k = mtp_kept_[r.seq];
    if (n + r.rows > opts_.max_rows && n > 0)
      break;
    for (uint32_t t = 0; t < r.rows; ++t) {
      row_tokens_.push_back(t + 1 < r.rows ? k.tokens[t + 1] : r.next);
      row_pos_.push_back(k.pos + t);
      row_seq_.push_back(r.seq);
    }
    std::memcpy(h + (uint64_t)n * hidden_, k.h.data(),
                (uint64_t)r.rows * hidden_ * sizeof(float));
    n += r.rows;
    if (r.draft)
      logit_rows_.push_back(n - 1);
  }
  const uint32_t n = (uint32_t)row_tokens_.size();
  DUCK_RETURN_IF_ERROR(RunOps(mtp_ops_, mtp_kinds_, n > 1, nullptr));
  if (logit_rows_.empty())
    return j;
  mtp_scratch_.clear();
  DUCK_RETURN_IF_ERROR(ProjectMtpRows(&mtp_scratch_));
  out_logits->insert(out_logits->end(), mtp_scratch_.begin(),
                     mtp_scratch_.end());
  const uint64_t V = vocab();
  const float *y = values_->Get(mtp_layer_out_);
  size_t d = 0;
  for (size_t r = i; r < j && links; ++r) {
    if (!runs[r].draft)
      continue;
    const uint32_t row = logit_rows_[d];
    const float *l = mtp_scratch_.data() + d++ * V;
    if (runs[r].chain > 0 && row_pos_[row] + 2 <= opts_.max_seq)
      links->push_back(
          {r,
           runs[r].seq,
           row_pos_[row],
           runs[r].chain,
           (int32_t)ArgMax(l, V),
           {y + (uint64_t)row * hidden_, y + (uint64_t)(row + 1) * hidden_}});
  }
  return j;
}

absl::Status Engine::MtpChainLinks(std::vector<MtpLink> links,
                                   std::vector<std::vector<int32_t>> *chained) {
  const uint64_t V = vocab();
  while (!links.empty()) {
    // One position past each link's last, its draft the token, its own
    // layer output the hidden state (as MtpChain): the rows overwrite
    // nothing a later real row reads before it writes it again.
    const uint32_t n = (uint32_t)links.size();
    ClearRows();
    float *h = values_->Get(mtp_hidden_);
    for (uint32_t i = 0; i < n; ++i) {
      const MtpLink &k = links[i];
      row_tokens_.push_back(k.token);
      row_pos_.push_back(k.pos + 1);
      row_seq_.push_back(k.seq);
      logit_rows_.push_back(i);
      std::memcpy(h + (uint64_t)i * hidden_, k.y.data(),
                  (uint64_t)hidden_ * sizeof(float));
    }
    DUCK_RETURN_IF_ERROR(RunOps(mtp_ops_, mtp_kinds_, n > 1, nullptr));
    const float *y = values_->Get(mtp_layer_out_);
    for (uint32_t i = 0; i < n; ++i)
      std::memcpy(links[i].y.data(), y + (uint64_t)i * hidden_,
                  (uint64_t)hidden_ * sizeof(float));
    mtp_scratch_.clear();
    DUCK_RETURN_IF_ERROR(ProjectMtpRows(&mtp_scratch_));
    std::vector<MtpLink> on;
    for (uint32_t i = 0; i < n; ++i) {
      MtpLink &k = links[i];
      const float *l = mtp_scratch_.data() + (uint64_t)i * V;
      k.token = (int32_t)ArgMax(l, V);
      (*chained)[k.run].push_back(k.token);
      ++k.pos;
      if (--k.left > 0 && k.pos + 2 <= opts_.max_seq)
        on.push_back(std::move(k));
    }
    links = std::move(on);
  }
  return absl::OkStatus();
}

void Engine::FindTail() {
  tail_ = 0;
  for (size_t i = 0; i < ops_.size(); ++i)
    if (ops_[i]->KvBytesPerToken() > 0)
      tail_ = i + 1;
  std::vector<bool> before(plan_->def().num_values(), false);
  for (size_t i = 0; i < tail_; ++i)
    before[ops_[i]->result] = true;
  // The last cache op may keep its result to the logit rows itself; its
  // result is then compact already.
  tail_compacts_ =
      tail_ > 0 && ops_[tail_ - 1]->KeepLogitRowsOnly(opts_.max_rows);
  if (tail_compacts_)
    before[ops_[tail_ - 1]->result] = false;
  tail_values_.clear();
  for (size_t i = tail_; i < ops_.size(); ++i)
    for (uint32_t v : ops_[i]->inputs)
      if (before[v] && std::find(tail_values_.begin(), tail_values_.end(), v) ==
                           tail_values_.end())
        tail_values_.push_back(v);
}

void Engine::KeepLogitRows() {
  kept_tokens_.clear();
  kept_pos_.clear();
  kept_seq_.clear();
  kept_logit_rows_.clear();
  for (uint32_t j = 0; j < logit_rows_.size(); ++j) {
    const uint32_t r = logit_rows_[j]; // ascending, so r >= j
    kept_tokens_.push_back(row_tokens_[r]);
    kept_pos_.push_back(row_pos_[r]);
    kept_seq_.push_back(row_seq_[r]);
    kept_logit_rows_.push_back(j);
    for (uint32_t v : tail_values_) {
      float *x = values_->Get(v);
      const uint64_t w = values_->Width(v);
      if (r != j)
        std::memmove(x + j * w, x + r * w, w * sizeof(float));
    }
  }
}

absl::Status Engine::RunRows(bool prefill, std::vector<float> *out_logits) {
  // Every row through the program, unless some rows want no logits and
  // nothing after the step reads the tail's rows (the MTP module reads
  // every row's hidden state).
  const size_t rows = row_tokens_.size(), keep = logit_rows_.size();
  if (has_mtp() || tail_ == 0 || keep == rows) {
    DUCK_RETURN_IF_ERROR(RunOps(ops_, kinds_, prefill, out_logits));
  } else {
    ops::Step all{row_tokens_, row_pos_,      row_seq_,  logit_rows_,
                  prefill,     values_.get(), out_logits};
    all.logit_rows_only = tail_compacts_;
    DUCK_RETURN_IF_ERROR(RunOpRange(ops_, kinds_, 0, tail_, all));
    if (keep > 0) {
      KeepLogitRows();
      // The ducks' prefill mode even for one row (the same bits as the
      // decode mode; the prompt's step in the summary's figures).
      const ops::Step kept{kept_tokens_,     kept_pos_, kept_seq_,
                           kept_logit_rows_, prefill,   values_.get(),
                           out_logits};
      DUCK_RETURN_IF_ERROR(RunOpRange(ops_, kinds_, tail_, ops_.size(), kept));
    }
  }
  (prefill ? prefill_times_ : decode_times_).tokens += rows;
  return absl::OkStatus();
}

absl::Status
Engine::RunOps(const std::vector<std::unique_ptr<ops::HostOp>> &ops,
               const std::vector<pl::OpParams> &kinds, bool prefill,
               std::vector<float> *out_logits) {
  const ops::Step step{row_tokens_, row_pos_,      row_seq_,  logit_rows_,
                       prefill,     values_.get(), out_logits};
  return RunOpRange(ops, kinds, 0, ops.size(), step);
}

std::vector<std::vector<ByteRange>>
Engine::PrefetchPlan(const std::vector<std::unique_ptr<ops::HostOp>> &ops,
                     uint64_t limit) {
  std::vector<std::vector<ByteRange>> plan(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    uint64_t bytes = 0;
    for (size_t n = 1; n < ops.size() && bytes < limit; ++n) {
      std::vector<ByteRange> w;
      ops[(i + n) % ops.size()]->HostWeights(&w);
      for (const ByteRange &r : w)
        if (bytes < limit) {
          plan[i].push_back({r.data, std::min(r.bytes, limit - bytes)});
          bytes += plan[i].back().bytes;
        }
      if (!w.empty())
        break;
    }
  }
  return plan;
}

absl::Status
Engine::RunOpRange(const std::vector<std::unique_ptr<ops::HostOp>> &ops,
                   const std::vector<pl::OpParams> &kinds, size_t begin,
                   size_t end, const ops::Step &step) {
  // Time by op kind, one clock read an op (a few tens of ns).
  OpTimes &times = step.prefill ? prefill_times_ : decode_times_;
  const std::vector<std::vector<ByteRange>> &prefetch =
      &ops == &ops_ ? prefetch_ : mtp_prefetch_;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = begin; i < end; ++i) {
    // A decoded row's next weights while the op's first step is out (a
    // prompt's chunk reads them right after its own step anyway).
    const bool pre =
        !step.prefill && i < prefetch.size() && !prefetch[i].empty();
    if (pre)
      runner_->Prefetch([this, &r = prefetch[i]] {
        prefetched_bytes_ += PrefetchRanges(r, ~0ull);
      });
    absl::Status s = ops[i]->Run(step);
    if (pre)
      runner_->DropPrefetch();
    if (!s.ok())
      return s;
    auto t1 = std::chrono::steady_clock::now();
    times.seconds[(size_t)kinds[i]] +=
        std::chrono::duration<double>(t1 - t0).count();
    t0 = t1;
  }
  return absl::OkStatus();
}

//===----------------------------------------------------------------------===//
// Sampler
//===----------------------------------------------------------------------===//

Sampler::Sampler(const SamplerOptions &o) : o_(o), state_(o.seed) {}

int32_t Sampler::Sample(absl::Span<const float> logits) {
  if (o_.temperature <= 0.0f) {
    return (int32_t)ArgMax(logits.data(), logits.size());
  }
  buf_.clear();
  for (size_t i = 0; i < logits.size(); ++i)
    buf_.push_back({logits[i] / o_.temperature, (int32_t)i});
  std::sort(buf_.begin(), buf_.end(),
            [](auto &a, auto &b) { return a.first > b.first; });
  size_t keep = buf_.size();
  if (o_.top_k > 0)
    keep = std::min<size_t>(keep, o_.top_k);
  float mx = buf_[0].first;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    buf_[i].first = std::exp(buf_[i].first - mx);
    sum += buf_[i].first;
  }
  if (o_.top_p < 1.0f) {
    double acc = 0;
    for (size_t i = 0; i < keep; ++i) {
      acc += buf_[i].first / sum;
      if (acc >= o_.top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = 0;
    for (size_t i = 0; i < keep; ++i)
      sum += buf_[i].first;
  }
  // splitmix64: reproducible across platforms for a given --seed.
  state_ += 0x9E3779B97F4A7C15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  double u = (z >> 11) * 0x1.0p-53 * sum;
  for (size_t i = 0; i < keep; ++i) {
    u -= buf_[i].first;
    if (u <= 0)
      return buf_[i].second;
  }
  return buf_[keep - 1].second;
}

} // namespace duck::runtime
