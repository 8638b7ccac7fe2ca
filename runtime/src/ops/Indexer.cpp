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
//===----------------------------------------------------------------------===//
#include "HostOp.h"
#include "Rope.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace duck::runtime::ops {
namespace {

struct IndexerShape {
  uint32_t hidden, q_lora, heads, dim, topk, rope;
  float eps;
};

class Indexer final : public HostOp {
public:
  Indexer(const IndexerShape &sh, ThreadPool *pool) : sh_(sh), pool_(pool) {}

  HostMatrix q_a_, wq_b_, wk_, wproj_;
  std::vector<float> q_a_norm_, k_w_, k_b_;
  YarnRope rope_;

  uint64_t OutWidth() const override { return sh_.topk; }
  void SetQLora(uint32_t q) { sh_.q_lora = q; }
  uint64_t KvBytesPerToken() const override { return (uint64_t)sh_.dim * 4; }
  uint64_t WeightBytesPerToken() const override {
    return MatrixBytes(q_a_) + MatrixBytes(wq_b_) + MatrixBytes(wk_) +
           MatrixBytes(wproj_);
  }

  absl::Status Allocate(uint32_t maxRows, uint32_t maxSeq, uint32_t maxSeqs) {
    cq_.assign((uint64_t)maxRows * sh_.q_lora, 0.0f);
    q_.assign((uint64_t)maxRows * sh_.heads * sh_.dim, 0.0f);
    k_.assign((uint64_t)maxRows * sh_.dim, 0.0f);
    w_.assign((uint64_t)maxRows * sh_.heads, 0.0f);
    DUCK_RETURN_IF_ERROR(kcache_.Init(sh_.dim, maxSeq, maxSeqs));
    score_.assign(maxSeq, 0.0f);
    order_.assign(maxSeq, 0);
    return absl::OkStatus();
  }

  absl::Status Run(const Step &s) override {
    const float *x = In(s, 0);
    const uint32_t n = s.rows();
    MatMul(*pool_, q_a_, x, n, cq_.data());
    for (uint32_t t = 0; t < n; ++t) {
      float *c = cq_.data() + (uint64_t)t * sh_.q_lora;
      RmsNorm(c, q_a_norm_.data(), sh_.q_lora, sh_.eps, c);
    }
    MatMul(*pool_, wq_b_, cq_.data(), n, q_.data());
    MatMul(*pool_, wk_, x, n, k_.data());
    MatMul(*pool_, wproj_, x, n, w_.data());
    for (uint32_t t = 0; t < n; ++t)
      Row(t, s.seq[t], s.pos[t], Out(s) + (uint64_t)t * sh_.topk);
    return absl::OkStatus();
  }

private:
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
    float *k = kcache_.At(seq, p);
    std::memcpy(k, k_.data() + (uint64_t)t * sh_.dim, sh_.dim * 4);
    LayerNorm(k);
    rope_.HalfSplit(k, p);
    float *q = q_.data() + (uint64_t)t * sh_.heads * sh_.dim;
    const float *w = w_.data() + (uint64_t)t * sh_.heads;
    const float wScale =
        1.0f / std::sqrt((float)sh_.heads) / std::sqrt((float)sh_.dim);
    for (uint32_t h = 0; h < sh_.heads; ++h)
      rope_.HalfSplit(q + (uint64_t)h * sh_.dim, p);
    for (uint64_t j = 0; j <= p; ++j) {
      const float *kj = kcache_.At(seq, j);
      float sum = 0;
      for (uint32_t h = 0; h < sh_.heads; ++h) {
        const float *qh = q + (uint64_t)h * sh_.dim;
        float d = 0;
        for (uint32_t i = 0; i < sh_.dim; ++i)
          d += qh[i] * kj[i];
        sum += w[h] * wScale * std::max(d, 0.0f);
      }
      score_[j] = sum;
    }
    Select(p + 1, out);
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
  std::vector<float> cq_, q_, k_, w_, score_;
  SeqCache kcache_;
  std::vector<uint64_t> order_;
};

absl::Status LoadWeights(const OpEnv &env, const pl::IndexerOpDef &p,
                         Indexer &op) {
  DUCK_RETURN_IF_ERROR(env.Load(p.q_a_proj(), "q_a_proj", &op.q_a_));
  DUCK_RETURN_IF_ERROR(
      env.Load(p.q_a_layernorm(), "q_a_layernorm", &op.q_a_norm_));
  DUCK_RETURN_IF_ERROR(env.Load(p.wq_b(), "indexer.wq_b", &op.wq_b_));
  DUCK_RETURN_IF_ERROR(env.Load(p.wk(), "indexer.wk", &op.wk_));
  DUCK_RETURN_IF_ERROR(env.Load(p.k_norm(), "indexer.k_norm", &op.k_w_));
  DUCK_RETURN_IF_ERROR(
      env.Load(p.k_norm_bias(), "indexer.k_norm_bias", &op.k_b_));
  DUCK_RETURN_IF_ERROR(
      env.Load(p.weights_proj(), "indexer.weights_proj", &op.wproj_));
  return absl::OkStatus();
}

} // namespace

HostOpOr CreateIndexer(const OpEnv &env) {
  const pl::IndexerOpDef *p = env.def.params_as_IndexerOpDef();
  IndexerShape sh{env.hidden,          0,         p->heads(),
                  p->head_dim(),       p->topk(), p->qk_rope_head_dim(),
                  (float)p->norm_eps()};
  if (!sh.heads || !sh.dim || !sh.topk || sh.rope > sh.dim || sh.rope % 2)
    return env.Error("bad indexer shape: ", sh.heads, " heads of ", sh.dim,
                     ", top ", sh.topk, ", rope dims ", sh.rope);
  auto op = std::make_unique<Indexer>(sh, env.pool);
  if (absl::Status s = LoadWeights(env, *p, *op); !s.ok())
    return s;
  sh.q_lora = (uint32_t)op->q_a_.rows;
  op->SetQLora(sh.q_lora);
  auto is = [](const HostMatrix &m, uint64_t r, uint64_t c) {
    return m.rows == r && m.cols == c;
  };
  if (!is(op->q_a_, sh.q_lora, sh.hidden) ||
      op->q_a_norm_.size() != sh.q_lora ||
      !is(op->wq_b_, (uint64_t)sh.heads * sh.dim, sh.q_lora) ||
      !is(op->wk_, sh.dim, sh.hidden) || op->k_w_.size() != sh.dim ||
      op->k_b_.size() != sh.dim || !is(op->wproj_, sh.heads, sh.hidden))
    return env.Error("indexer weights do not match ", sh.heads, " heads of ",
                     sh.dim, " and hidden size ", sh.hidden);
  op->rope_ = YarnRope::Make(sh.rope, p->rope_theta(), p->rope_scaling());
  DUCK_RETURN_IF_ERROR(op->Allocate(env.max_rows, env.max_seq, env.max_seqs));
  return op;
}

} // namespace duck::runtime::ops
