//===- Indexer.cpp - DeepSeek-V3.2's lightning indexer --------------------===//
//
// MATH.md section 5. For each row at position p:
//   q = wq_b . c_q  (heads x head_dim; c_q = q_a_layernorm(q_a_proj . x))
//   k = LayerNorm(wk . x)  (one key a token, kept in the indexer's cache)
//   NeoX RoPE on the first qk_rope_head_dim dims of q and k (YaRN freqs)
//   w = weights_proj . x * heads^-0.5
//   I[t] = sum_h w[h] * head_dim^-0.5 * ReLU(q[h] . k[t]),  t <= p
// and writes the topk positions with the largest I (ties to the earlier
// position) in ascending order, -1 after them: with p + 1 <= topk every
// position is kept in order, so the MLA op computes exactly dense MLA.
// The Hadamard rotation and FP8 activation rounding of DeepSeek's code do
// not change these values in exact arithmetic and are not reproduced.
//
// Debugging: with DUCK_DEBUG_INDEXER_DUMP=PREFIX in the environment, every
// row that drops positions (p + 1 > topk) is appended to PREFIX.L<layer>
// as int32 seq, int32 position, int32 len (p + 1), then len bits (LSB
// first, ceil(len / 8) bytes) saying which positions were kept. Near-ties
// in the scores may legitimately select differently from a float64
// reference; test/oracle/check-indexer.py compares the selections as sets
// and allows a swap only between positions whose scores are that close.
//===----------------------------------------------------------------------===//
#include "HostOp.h"
#include "MlaAbsorb.h"
#include "Rope.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace duck::runtime::ops {
namespace {

struct IndexerShape {
  uint32_t hidden, q_lora, heads, dim, topk, rope;
  float eps;
};

class Indexer final : public HostOp {
public:
  uint64_t populate_ahead_ = 0; // the layer's positions: MapAhead
  Indexer(const IndexerShape &sh, ThreadPool *pool) : sh_(sh), pool_(pool) {}
  ~Indexer() override {
    if (dump_)
      std::fclose(dump_);
  }
  Indexer(const Indexer &) = delete;
  Indexer &operator=(const Indexer &) = delete;

  /// DUCK_DEBUG_INDEXER_DUMP (see the file comment); off when unset.
  absl::Status OpenDump(int32_t layer) {
    const char *prefix = std::getenv("DUCK_DEBUG_INDEXER_DUMP");
    if (!prefix || !*prefix)
      return absl::OkStatus();
    const std::string path =
        std::string(prefix) + ".L" + std::to_string(layer);
    dump_ = std::fopen(path.c_str(), "wb");
    if (!dump_)
      return absl::InvalidArgumentError(
          "DUCK_DEBUG_INDEXER_DUMP: cannot write " + path);
    return absl::OkStatus();
  }

  HostMatrix q_a_, wq_b_, wk_, wproj_;
  std::vector<float> q_a_norm_, k_w_, k_b_;
  YarnRope rope_;
  // duckc --in-proj ducks: the layer's projections run on the ducks in two
  // steps (IndexerOpDef.on_ducks), and each result row carries the MLA's
  // queries (mla_q_ floats) and kv_a output (mla_kv_) after the selection.
  FfnRunner *runner_ = nullptr;
  uint32_t in_slot_ = 0, q_slot_ = 0;
  uint64_t mla_q_ = 0, mla_kv_ = 0;
  // With the MLA's kv_b_proj absorbed on the ducks (absorb_.heads not
  // empty): the q step answers by the MLA's heads (MlaAbsorb.h) and the
  // result carries the MLA's latent queries (mla_lat_ floats) after its
  // queries.
  AbsorbShape absorb_;
  uint64_t mla_lat_ = 0;

  uint64_t OutWidth() const override {
    return sh_.topk + (runner_ ? mla_q_ + mla_lat_ + mla_kv_ : 0);
  }
  void SetQLora(uint32_t q) { sh_.q_lora = q; }
  uint64_t KvBytesPerToken() const override { return (uint64_t)sh_.dim * 4; }
  /// A position's indexer key.
  void CopyKv(uint32_t seq, uint64_t from, uint32_t n, uint8_t *buf,
              uint64_t stride, bool save) override {
    for (uint32_t i = 0; i < n; ++i)
      kcache_.Copy(seq, from + i, buf + i * stride, KvBytesPerToken(), save);
  }
  uint64_t CacheReadBytes(uint64_t positions) const override {
    return KvBytesPerToken() * positions; // every position's key
  }
  uint64_t WeightBytesPerToken() const override {
    return MatrixBytes(q_a_) + MatrixBytes(wq_b_) + MatrixBytes(wk_) +
           MatrixBytes(wproj_);
  }
  void HostWeights(std::vector<ByteRange> *out) const override {
    for (const HostMatrix *m : {&q_a_, &wq_b_, &wk_, &wproj_})
      AppendMatrixRanges(*m, out);
  }

  /// `populate`: sequences whose first 2 MiB of cache are mapped in now.
  absl::Status Allocate(uint32_t maxRows, uint32_t maxSeq, uint32_t maxSeqs,
                        uint32_t populate) {
    cq_.assign((uint64_t)maxRows * sh_.q_lora, 0.0f);
    q_.assign((uint64_t)maxRows * sh_.heads * sh_.dim, 0.0f);
    k_.assign((uint64_t)maxRows * sh_.dim, 0.0f);
    w_.assign((uint64_t)maxRows * sh_.heads, 0.0f);
    if (runner_) {
      a_.assign((uint64_t)maxRows * InWidth(), 0.0f);
      b_.assign((uint64_t)maxRows * QWidth(), 0.0f);
    }
    DUCK_RETURN_IF_ERROR(kcache_.Init(sh_.dim, maxSeq, maxSeqs));
    kcache_.PopulateFirstPages(populate);
    score_.assign(maxSeq, 0.0f);
    wh_.assign(sh_.heads, 0.0f);
    order_.assign(maxSeq, 0);
    return absl::OkStatus();
  }

  /// Rows of the two duck steps: [q_a | kv_a | wk] and [q_b | wq_b].
  uint64_t InWidth() const { return sh_.q_lora + mla_kv_ + sh_.dim; }
  uint64_t QWidth() const {
    return mla_q_ + (uint64_t)sh_.heads * sh_.dim + mla_lat_;
  }

  absl::Status Run(const Step &s) override {
    const float *x = In(s, 0);
    const uint32_t n = s.rows();
    if (runner_)
      return RunOnDucks(s, x, n);
    // Every product of the input in one pass over the pool.
    MatMulMany(*pool_, x, n,
               {{&q_a_, cq_.data()}, {&wk_, k_.data()}, {&wproj_, w_.data()}});
    for (uint32_t t = 0; t < n; ++t) {
      float *c = cq_.data() + (uint64_t)t * sh_.q_lora;
      RmsNorm(c, q_a_norm_.data(), sh_.q_lora, sh_.eps, c);
    }
    MatMul(*pool_, wq_b_, cq_.data(), n, q_.data());
    for (uint32_t t = 0; t < n; ++t)
      Row(t, s.seq[t], s.pos[t], Out(s) + (uint64_t)t * sh_.topk);
    if (dump_)
      std::fflush(dump_);
    return absl::OkStatus();
  }

private:
  /// The projections on the ducks: each row's pieces go where the host's
  /// own products would have put them, then the same selection; the MLA's
  /// queries and kv_a output follow it in the result.
  absl::Status RunOnDucks(const Step &s, const float *x, uint32_t n) {
    const uint64_t wa = InWidth(), wb = QWidth();
    const uint64_t hd = (uint64_t)sh_.heads * sh_.dim;
    // weights_proj (bf16, on the host as without the ducks) needs only x:
    // it runs while the ducks compute the input projections.
    runner_->Meanwhile([&] { MatMul(*pool_, wproj_, x, n, w_.data()); });
    const absl::Status in = runner_->RunRows(FfnRunner::Rows::kAttention,
                                             in_slot_, n, x, sh_.hidden,
                                             a_.data(), wa);
    runner_->RunMeanwhile(); // never left behind, even after an error
    DUCK_RETURN_IF_ERROR(in);
    for (uint32_t t = 0; t < n; ++t) {
      const float *a = a_.data() + t * wa;
      float *c = cq_.data() + (uint64_t)t * sh_.q_lora;
      RmsNorm(a, q_a_norm_.data(), sh_.q_lora, sh_.eps, c);
      std::memcpy(k_.data() + (uint64_t)t * sh_.dim,
                  a + sh_.q_lora + mla_kv_, sh_.dim * 4);
    }
    DUCK_RETURN_IF_ERROR(runner_->RunRows(FfnRunner::Rows::kAttention, q_slot_,
                                          n, cq_.data(), sh_.q_lora, b_.data(),
                                          wb));
    const uint64_t ow = OutWidth();
    for (uint32_t t = 0; t < n; ++t) {
      const float *b = b_.data() + t * wb;
      float *out = Out(s) + t * ow;
      if (absorb_.heads.empty()) {
        std::memcpy(q_.data() + t * hd, b + mla_q_, hd * 4);
        std::memcpy(out + sh_.topk, b, mla_q_ * 4);
      } else {
        SplitAbsorbedQuery(absorb_, b, out + sh_.topk, q_.data() + t * hd,
                           out + sh_.topk + mla_q_);
      }
      Row(t, s.seq[t], s.pos[t], out);
      std::memcpy(out + sh_.topk + mla_q_ + mla_lat_,
                  a_.data() + t * wa + sh_.q_lora, mla_kv_ * 4);
    }
    if (dump_)
      std::fflush(dump_);
    return absl::OkStatus();
  }

  /// LayerNorm (weight and bias, eps 1e-6) of one key, in place.
  void LayerNorm(float *k) const {
    double mean = 0, var = 0;
    for (uint32_t i = 0; i < sh_.dim; ++i)
      mean += k[i];
    mean /= sh_.dim;
    for (uint32_t i = 0; i < sh_.dim; ++i)
      var += (k[i] - mean) * (k[i] - mean);
    const float inv = (float)(1.0 / std::sqrt(var / sh_.dim + 1e-6));
    for (uint32_t i = 0; i < sh_.dim; ++i)
      k[i] = (float)(k[i] - mean) * inv * k_w_[i] + k_b_[i];
  }

  void Row(uint32_t t, uint32_t seq, uint64_t p, float *out) {
    float *k = kcache_.AtForWrite(seq, p);
    kcache_.MapAhead(seq, p, populate_ahead_);
    std::memcpy(k, k_.data() + (uint64_t)t * sh_.dim, sh_.dim * 4);
    LayerNorm(k);
    rope_.HalfSplit(k, p);
    float *q = q_.data() + (uint64_t)t * sh_.heads * sh_.dim;
    const float *w = w_.data() + (uint64_t)t * sh_.heads;
    const float wScale =
        1.0f / std::sqrt((float)sh_.heads) / std::sqrt((float)sh_.dim);
    for (uint32_t h = 0; h < sh_.heads; ++h) {
      rope_.HalfSplit(q + (uint64_t)h * sh_.dim, p);
      wh_[h] = w[h] * wScale;
    }
    // Positions in chunks of four over the pool (a score's bits do not
    // depend on the chunk).
    const float *keys = kcache_.Base(seq);
    pool_->ParallelFor(
        p + 1,
        [&](uint64_t b, uint64_t e) {
          IndexScores(q, wh_.data(), sh_.heads, sh_.dim, keys, b, e,
                      score_.data());
        },
        4);
    Select(p + 1, out);
    if (dump_ && p + 1 > sh_.topk)
      Dump(seq, p, out);
  }

  /// One row of the debug dump: which of positions 0..p were kept.
  void Dump(uint32_t seq, uint64_t p, const float *out) {
    const int32_t head[3] = {(int32_t)seq, (int32_t)p, (int32_t)(p + 1)};
    dump_bits_.assign((p + 1 + 7) / 8, 0); // grows to max_seq / 8 once
    for (uint32_t i = 0; i < sh_.topk; ++i) {
      const uint64_t j = (uint64_t)out[i];
      dump_bits_[j / 8] |= (uint8_t)(1u << (j % 8));
    }
    std::fwrite(head, sizeof head, 1, dump_);
    std::fwrite(dump_bits_.data(), 1, dump_bits_.size(), dump_);
  }

  /// The topk best of positions 0..len-1, ascending, then -1s.
  void Select(uint64_t len, float *out) {
    const uint64_t keep = std::min<uint64_t>(sh_.topk, len);
    for (uint64_t j = 0; j < len; ++j)
      order_[j] = j;
    if (keep < len)
      std::partial_sort(order_.begin(), order_.begin() + keep,
                        order_.begin() + len, [&](uint64_t a, uint64_t b) {
                          return score_[a] > score_[b] ||
                                 (score_[a] == score_[b] && a < b);
                        });
    std::sort(order_.begin(), order_.begin() + keep);
    for (uint64_t i = 0; i < sh_.topk; ++i)
      out[i] = i < keep ? (float)order_[i] : -1.0f;
  }

  IndexerShape sh_;
  ThreadPool *pool_;
  std::vector<float> cq_, q_, k_, w_, score_, a_, b_;
  std::vector<float> wh_; // a row's head weights times the score scale
  SeqCache kcache_;
  std::vector<uint64_t> order_;
  std::FILE *dump_ = nullptr;
  std::vector<uint8_t> dump_bits_;
};

absl::Status LoadWeights(const OpEnv &env, const pl::IndexerOpDef &p,
                         Indexer &op) {
  DUCK_RETURN_IF_ERROR(
      env.Load(p.q_a_layernorm(), "q_a_layernorm", &op.q_a_norm_));
  DUCK_RETURN_IF_ERROR(env.Load(p.k_norm(), "indexer.k_norm", &op.k_w_));
  DUCK_RETURN_IF_ERROR(
      env.Load(p.k_norm_bias(), "indexer.k_norm_bias", &op.k_b_));
  DUCK_RETURN_IF_ERROR(
      env.Load(p.weights_proj(), "indexer.weights_proj", &op.wproj_));
  if (p.on_ducks())
    return absl::OkStatus(); // the other projections are the ducks'
  DUCK_RETURN_IF_ERROR(env.Load(p.q_a_proj(), "q_a_proj", &op.q_a_));
  DUCK_RETURN_IF_ERROR(env.Load(p.wq_b(), "indexer.wq_b", &op.wq_b_));
  DUCK_RETURN_IF_ERROR(env.Load(p.wk(), "indexer.wk", &op.wk_));
  return absl::OkStatus();
}

/// The MLA's kv_b_proj absorbed on the ducks (absorb_heads): the heads and
/// the indexer rows each duck answers in the q step.
absl::Status LoadAbsorb(const OpEnv &env, const pl::IndexerOpDef &p,
                        Indexer &op) {
  AbsorbShape &a = op.absorb_;
  DUCK_RETURN_IF_ERROR(ReadAbsorbBounds(env, p.absorb_heads(), p.mla_heads(),
                                        "absorb_heads", &a.heads));
  if (a.heads.empty())
    return p.absorb_index_rows() && p.absorb_index_rows()->size()
               ? env.Error("absorb_index_rows without absorb_heads")
               : absl::OkStatus();
  DUCK_RETURN_IF_ERROR(ReadAbsorbBounds(env, p.absorb_index_rows(),
                                        (uint64_t)p.heads() * p.head_dim(),
                                        "absorb_index_rows", &a.index_rows));
  if (a.index_rows.empty() || !p.mla_kv_lora() ||
      p.mla_qk_dim() <= p.qk_rope_head_dim())
    return env.Error("absorbed heads (absorb_heads) need the indexer rows "
                     "each duck answers (absorb_index_rows), mla_kv_lora "
                     "and the MLA's nope dims (mla_qk_dim - "
                     "qk_rope_head_dim)");
  a.qk = p.mla_qk_dim();
  a.kv_lora = p.mla_kv_lora();
  op.mla_lat_ = (uint64_t)p.mla_heads() * p.mla_kv_lora();
  return absl::OkStatus();
}

} // namespace

HostOpOr CreateIndexer(const OpEnv &env) {
  if (env.kv_f16)
    return absl::InvalidArgumentError(
        "--kv-cache f16 is for grouped-query attention (Qwen3); this plan's "
        "attention is DeepSeek's MLA, whose caches are kept in fp32 only: "
        "use --kv-cache f32");
  const pl::IndexerOpDef *p = env.def.params_as_IndexerOpDef();
  IndexerShape sh{env.hidden,          0,         p->heads(),
                  p->head_dim(),       p->topk(), p->qk_rope_head_dim(),
                  (float)p->norm_eps()};
  if (!sh.heads || !sh.dim || !sh.topk || sh.rope > sh.dim || sh.rope % 2)
    return env.Error("bad indexer shape: ", sh.heads, " heads of ", sh.dim,
                     ", top ", sh.topk, ", rope dims ", sh.rope);
  auto op = std::make_unique<Indexer>(sh, env.pool);
  // Each layer's caches map their next 2 MiB positions of its own ahead
  // (SeqCacheOf::MapAhead).
  op->populate_ahead_ = env.def.layer() % 128;
  if (absl::Status s = LoadWeights(env, *p, *op); !s.ok())
    return s;
  sh.q_lora = (uint32_t)op->q_a_norm_.size();
  op->SetQLora(sh.q_lora);
  auto is = [](const HostMatrix &m, uint64_t r, uint64_t c) {
    return m.rows == r && m.cols == c;
  };
  if (p->on_ducks()) {
    if (!env.runner)
      return env.Error("the indexer's projections on the ducks, but no "
                       "ducks to run them");
    op->runner_ = env.runner;
    op->in_slot_ = p->in_proj_slot();
    op->q_slot_ = p->q_proj_slot();
    op->mla_q_ = (uint64_t)p->mla_heads() * p->mla_qk_dim();
    op->mla_kv_ = p->mla_kv_width();
    if (!op->mla_q_ || !op->mla_kv_ || !sh.q_lora)
      return env.Error("the indexer's projections on the ducks need the "
                       "attention's query and kv_a widths");
    DUCK_RETURN_IF_ERROR(LoadAbsorb(env, *p, *op));
    DUCK_RETURN_IF_ERROR(CheckRowSlots(env, op->in_slot_, op->InWidth(),
                                       sh.hidden, "q_a/kv_a/indexer wk"));
    DUCK_RETURN_IF_ERROR(
        op->absorb_.heads.empty()
            ? CheckRowSlots(env, op->q_slot_, op->QWidth(), sh.q_lora,
                            "q_b_proj/indexer wq_b")
            : CheckAbsorbedQuerySlot(env, op->q_slot_, op->absorb_, sh.q_lora,
                                     p->mla_qk_dim() - p->qk_rope_head_dim(),
                                     "q_b_proj/indexer wq_b"));
  } else if (!is(op->q_a_, sh.q_lora, sh.hidden) ||
             !is(op->wq_b_, (uint64_t)sh.heads * sh.dim, sh.q_lora) ||
             !is(op->wk_, sh.dim, sh.hidden)) {
    return env.Error("indexer weights do not match ", sh.heads, " heads of ",
                     sh.dim, " and hidden size ", sh.hidden);
  }
  if (op->k_w_.size() != sh.dim || op->k_b_.size() != sh.dim ||
      !is(op->wproj_, sh.heads, sh.hidden) || !sh.q_lora)
    return env.Error("indexer weights do not match ", sh.heads, " heads of ",
                     sh.dim, " and hidden size ", sh.hidden);
  op->rope_ = YarnRope::Make(sh.rope, p->rope_theta(), p->rope_scaling());
  DUCK_RETURN_IF_ERROR(
      op->Allocate(env.max_rows, env.max_seq, env.max_seqs, env.populate_seqs));
  DUCK_RETURN_IF_ERROR(op->OpenDump(env.def.layer()));
  return op;
}

namespace {
void IndexerTensors(const pl::OpDef &op, HostTensors *out) {
  const pl::IndexerOpDef *p = op.params_as_IndexerOpDef();
  const bool d = p->on_ducks();
  AppendTensors(out, {d ? nullptr : p->q_a_proj(), p->q_a_layernorm(),
                      d ? nullptr : p->wq_b(), d ? nullptr : p->wk(),
                      p->k_norm(), p->k_norm_bias(), p->weights_proj()});
}
} // namespace

const HostOpKind kIndexerKind{
    {pl::OpParams::IndexerOpDef, TimeBucket::kHostAttention, IndexerTensors},
    CreateIndexer};

} // namespace duck::runtime::ops
