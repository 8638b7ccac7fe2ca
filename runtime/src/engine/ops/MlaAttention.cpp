//===- MlaAttention.cpp - DeepSeek multi-head latent attention ------------===//
//
// MATH.md section 4, in the absorbed form for every row (decode and
// prefill alike): the KV cache holds only the normalised latent c_kv
// (kv_lora_rank floats) and the one shared rope key (qk_rope_head_dim) a
// token; a head's query is moved into the latent space through W_UK
// (q~ = q_nope . W_UK[h]), attends over c_kv, and the latent output comes
// back through W_UV. RoPE is interleaved (adjacent pairs) with YaRN-
// corrected frequencies, and the softmax scale carries YaRN's mscale^2.
//
// DeepSeek-V3.2: a second input, the layer's IndexerOpDef selection
// (Indexer.cpp), limits every row to the positions it lists.
//
// duckc --mla-absorb ducks (absorb_heads, MlaAbsorb.h): the ducks move the
// queries into the latent space in the query step and bring the latent
// outputs back through W_UV and o_proj in the output step, by heads; the
// host then reads no kv_b_proj.
//===----------------------------------------------------------------------===//
#include "HostOp.h"
#include "MlaAbsorb.h"
#include "Rope.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace duck::runtime::ops {
namespace {

struct MlaShape {
  uint32_t hidden, heads, q_lora, kv_lora, nope, rope, v;
  float eps;
  uint64_t qk() const { return (uint64_t)nope + rope; }
  uint64_t kvb() const { return (uint64_t)nope + v; }
  uint64_t cache() const { return (uint64_t)kv_lora + rope; }
};

class MlaAttention final : public HostOp {
public:
  uint64_t populate_ahead_ = 0; // the layer's positions: MapAhead
  MlaAttention(const MlaShape &sh, ThreadPool *pool) : sh_(sh), pool_(pool) {}

  HostMatrix q_a_, q_b_, q_, kv_a_, kv_b_, o_;
  std::vector<float> q_a_norm_, kv_a_norm_;
  // duckc --o-proj / --q-proj ducks: those rows run in head slots (the
  // query projection: q_b_proj with a query LoRA, else q_proj).
  FfnRunner *o_runner_ = nullptr, *q_runner_ = nullptr;
  uint32_t o_slot_ = 0, q_slot_ = 0;
  // duckc --in-proj ducks: rows [q_a_proj (or q_proj) | kv_a_proj] in one
  // step; or, with an indexer, both projections come from it, after its
  // selection in the second input (from_indexer_).
  FfnRunner *in_runner_ = nullptr;
  uint32_t in_slot_ = 0;
  bool from_indexer_ = false;
  // W_UK transposed, [heads * kv_lora, nope]: bf16 when every value is
  // exact in bf16 (FP8 with power-of-two scales), else fp32.
  HostMatrix w_uk_;
  std::vector<uint16_t> w_uk_bf16_;
  YarnRope rope_;
  float softmax_scale_ = 1.0f;
  bool indexed_ = false; // a second input lists each row's positions
  // kv_b_proj on the ducks by heads (absorb_.heads empty: on the host);
  // o_offsets_: where each duck's heads start in a row of olat_.
  AbsorbShape absorb_;
  std::vector<uint64_t> o_offsets_;
  bool absorbed() const { return !absorb_.heads.empty(); }

  /// `populate`: sequences whose first 2 MiB of cache are mapped in now.
  absl::Status Allocate(uint32_t maxRows, uint32_t maxSeq, uint32_t maxSeqs,
                        uint32_t populate) {
    cq_.assign((uint64_t)maxRows * std::max(1u, sh_.q_lora), 0.0f);
    q_buf_.assign((uint64_t)maxRows * sh_.heads * sh_.qk(), 0.0f);
    kva_.assign((uint64_t)maxRows * sh_.cache(), 0.0f);
    attn_.assign((uint64_t)maxRows * sh_.heads * sh_.v, 0.0f);
    if (in_runner_)
      in_.assign((uint64_t)maxRows * InWidth(), 0.0f);
    if (absorbed() && q_runner_)
      qa_.assign((uint64_t)maxRows * absorb_.QueryWidth(), 0.0f);
    DUCK_RETURN_IF_ERROR(cache_.Init(sh_.cache(), maxSeq, maxSeqs));
    cache_.PopulateFirstPages(populate);
    qt_.assign((uint64_t)maxRows * sh_.heads * sh_.kv_lora, 0.0f);
    olat_.assign((uint64_t)maxRows * sh_.heads * sh_.kv_lora, 0.0f);
    iota_.resize(maxSeq);
    for (uint64_t i = 0; i < maxSeq; ++i)
      iota_[i] = i;
    sel_pos_.assign((uint64_t)maxRows * topk_, 0);
    count_.assign(maxRows, 0);
    return absl::OkStatus();
  }

  uint32_t topk_ = 0;     // positions a row of the selection input
  uint64_t sel_width_ = 0; // floats a row of that input
  /// Rows of the input-projection step: [q_a_proj or q_proj | kv_a].
  uint64_t InWidth() const {
    return (sh_.q_lora ? sh_.q_lora : (uint64_t)sh_.heads * sh_.qk()) +
           sh_.cache();
  }

  uint64_t KvBytesPerToken() const override { return sh_.cache() * 4; }
  /// A position's normalised latent and rope key.
  void CopyKv(uint32_t seq, uint64_t from, uint32_t n, uint8_t *buf,
              uint64_t stride, bool save) override {
    for (uint32_t i = 0; i < n; ++i)
      cache_.Copy(seq, from + i, buf + i * stride, KvBytesPerToken(), save);
  }
  uint64_t CacheReadBytes(uint64_t positions) const override {
    // Every head's shared latent, once a token (MlaAttend), over at most
    // the indexer's selection.
    return KvBytesPerToken() *
           (indexed_ ? std::min<uint64_t>(positions, topk_) : positions);
  }
  uint64_t WeightBytesPerToken() const override {
    // Of kv_b_proj only the W_UV rows (v of every head's nope + v) are
    // read; W_UK is read in its own copy.
    return MatrixBytes(q_a_) + MatrixBytes(q_b_) + MatrixBytes(q_) +
           MatrixBytes(kv_a_) + MatrixBytes(kv_b_) * sh_.v / sh_.kvb() +
           MatrixBytes(o_) + MatrixBytes(w_uk_);
  }
  void HostWeights(std::vector<ByteRange> *out) const override {
    for (const HostMatrix *m : {&q_a_, &q_b_, &q_, &kv_a_, &o_, &w_uk_})
      AppendMatrixRanges(*m, out);
  }

  absl::Status Run(const Step &s) override {
    const float *x = In(s, 0);
    const uint32_t n = s.rows();
    const uint64_t qRows = (uint64_t)sh_.heads * sh_.qk();
    if (from_indexer_) {
      // The indexer ran the projections: [selection | q | (absorbed: the
      // latent queries) | kv_a] a row.
      const float *in = In(s, 1);
      const uint64_t lat = absorbed() ? (uint64_t)sh_.heads * sh_.kv_lora : 0;
      for (uint32_t t = 0; t < n; ++t) {
        const float *r = in + t * sel_width_ + topk_;
        std::memcpy(q_buf_.data() + t * qRows, r, qRows * 4);
        std::memcpy(qt_.data() + t * lat, r + qRows, lat * 4);
        std::memcpy(kva_.data() + t * sh_.cache(), r + qRows + lat,
                    sh_.cache() * 4);
      }
    } else if (in_runner_) {
      const uint64_t w = InWidth(), wq = w - sh_.cache();
      DUCK_RETURN_IF_ERROR(in_runner_->RunRows(FfnRunner::Rows::kAttention,
                                               in_slot_, n, x, sh_.hidden,
                                               in_.data(), w));
      for (uint32_t t = 0; t < n; ++t) {
        const float *r = in_.data() + t * w;
        std::memcpy((sh_.q_lora ? cq_.data() : q_buf_.data()) + t * wq, r,
                    wq * 4);
        std::memcpy(kva_.data() + t * sh_.cache(), r + wq, sh_.cache() * 4);
      }
      if (sh_.q_lora)
        DUCK_RETURN_IF_ERROR(QueryFromLatent(n));
    } else if (sh_.q_lora) {
      // Both projections of the input in one pass over the pool.
      MatMulMany(*pool_, x, n,
                 {{&q_a_, cq_.data()}, {&kv_a_, kva_.data()}});
      DUCK_RETURN_IF_ERROR(QueryFromLatent(n));
    } else if (q_runner_) {
      DUCK_RETURN_IF_ERROR(QueryOnDucks(x, sh_.hidden, n));
      MatMul(*pool_, kv_a_, x, n, kva_.data());
    } else {
      MatMulMany(*pool_, x, n,
                 {{&q_, q_buf_.data()}, {&kv_a_, kva_.data()}});
    }
    // Every row's latent goes into its sequence's cache first (a row
    // attends only to positions up to its own, all written by then), then
    // the heads of every row attend in one parallel pass.
    for (uint32_t t = 0; t < n; ++t)
      StoreLatent(t, s.seq[t], s.pos[t]);
    Attend(s, n);
    if (absorbed())
      return o_runner_->RunScatter(
          FfnRunner::Rows::kAttention, o_slot_, n, olat_.data(),
          (uint64_t)sh_.heads * sh_.kv_lora, o_offsets_, Out(s), sh_.hidden);
    if (o_runner_)
      return o_runner_->RunRows(
          FfnRunner::Rows::kAttention, o_slot_, n, attn_.data(),
          (uint32_t)((uint64_t)sh_.heads * sh_.v), Out(s), sh_.hidden);
    MatMul(*pool_, o_, attn_.data(), n, Out(s));
    return absl::OkStatus();
  }

private:
  /// Queries from the query latent (q_a_proj's output, in cq_): normed in
  /// place, then q_b_proj on the ducks or here.
  absl::Status QueryFromLatent(uint32_t n) {
    for (uint32_t t = 0; t < n; ++t) {
      float *c = cq_.data() + (uint64_t)t * sh_.q_lora;
      RmsNorm(c, q_a_norm_.data(), sh_.q_lora, sh_.eps, c);
    }
    if (q_runner_)
      return QueryOnDucks(cq_.data(), sh_.q_lora, n);
    MatMul(*pool_, q_b_, cq_.data(), n, q_buf_.data());
    return absl::OkStatus();
  }

  /// The query projection's step on the ducks (x: n rows of k floats):
  /// the queries into q_buf_; absorbed, each duck answers its heads' q
  /// and latent queries, the latter into qt_.
  absl::Status QueryOnDucks(const float *x, uint32_t k, uint32_t n) {
    const uint64_t qRows = (uint64_t)sh_.heads * sh_.qk();
    if (!absorbed())
      return q_runner_->RunRows(FfnRunner::Rows::kAttention, q_slot_, n, x, k,
                                q_buf_.data(), qRows);
    const uint64_t w = absorb_.QueryWidth(),
                   lat = (uint64_t)sh_.heads * sh_.kv_lora;
    DUCK_RETURN_IF_ERROR(q_runner_->RunRows(FfnRunner::Rows::kAttention,
                                            q_slot_, n, x, k, qa_.data(), w));
    for (uint32_t t = 0; t < n; ++t)
      SplitAbsorbedQuery(absorb_, qa_.data() + t * w, q_buf_.data() + t * qRows,
                         nullptr, qt_.data() + t * lat);
    return absl::OkStatus();
  }

  /// Row t of the step, position p of sequence `seq`: its normalised
  /// latent and rope key into the sequence's cache.
  void StoreLatent(uint32_t t, uint32_t seq, uint64_t p) {
    const float *kv = kva_.data() + t * sh_.cache();
    float *slot = cache_.AtForWrite(seq, p);
    cache_.MapAhead(seq, p, populate_ahead_);
    RmsNorm(kv, kv_a_norm_.data(), sh_.kv_lora, sh_.eps, slot);
    std::memcpy(slot + sh_.kv_lora, kv + sh_.kv_lora, sh_.rope * 4);
    rope_.Interleaved(slot + sh_.kv_lora, p);
  }

  /// Every row's heads over their positions (0..p, or the indexer's list
  /// in the second input, -1 ending it), the heads split over the pool's
  /// threads: a thread moves its heads' queries of every row into the
  /// latent space (W_UK, one product a head for all the rows), attends each
  /// row's heads together over its cache (MlaAttend: the latent is every
  /// head's), and brings the outputs back (W_UV, likewise). A row's bits
  /// are those it gets alone (the products' rows are the GEMV's).
  /// Absorbed, the ducks do both products: the latent queries are in qt_
  /// already and the latent outputs stay in olat_.
  void Attend(const Step &s, uint32_t n) {
    const uint64_t H = sh_.heads, R = sh_.kv_lora, qk = sh_.qk(),
                   T = pool_->size();
    for (uint32_t t = 0; t < n; ++t) {
      if (!indexed_) {
        count_[t] = s.pos[t] + 1;
        continue;
      }
      const float *sel = In(s, 1) + (uint64_t)t * sel_width_;
      uint64_t *pos = sel_pos_.data() + (uint64_t)t * topk_, k = 0;
      for (; k < topk_ && sel[k] >= 0; ++k)
        pos[k] = (uint64_t)sel[k];
      count_[t] = k;
    }
    pool_->ParallelFor(T, [&](uint64_t b, uint64_t e) {
      for (uint64_t i = b; i < e; ++i) {
        const uint64_t h0 = i * H / T, h1 = (i + 1) * H / T;
        for (uint64_t h = h0; h < h1; ++h) {
          for (uint32_t t = 0; t < n; ++t)
            rope_.Interleaved(q_buf_.data() + (t * H + h) * qk + sh_.nope,
                              s.pos[t]);
          if (!absorbed())
            RowsProduct(w_uk_, q_buf_.data() + h * qk, H * qk, n,
                        qt_.data() + h * R, H * R, h * R, (h + 1) * R);
        }
        for (uint32_t t = 0; t < n; ++t)
          MlaAttend(qt_.data() + (t * H + h0) * R,
                    q_buf_.data() + (t * H + h0) * qk + sh_.nope, qk,
                    cache_.Base(s.seq[t]),
                    indexed_ ? sel_pos_.data() + (uint64_t)t * topk_
                             : iota_.data(),
                    count_[t], R, sh_.rope, softmax_scale_, h1 - h0,
                    olat_.data() + (t * H + h0) * R);
        for (uint64_t h = h0; h < h1 && !absorbed(); ++h) {
          const uint64_t row0 = h * sh_.kvb() + sh_.nope;
          RowsProduct(kv_b_, olat_.data() + h * R, H * R, n,
                      attn_.data() + h * sh_.v, H * sh_.v, row0,
                      row0 + sh_.v);
        }
      }
    });
  }

  MlaShape sh_;
  ThreadPool *pool_;
  // qt_ and olat_: [rows][heads][kv_lora], a row's queries in the latent
  // space and its latent outputs.
  std::vector<float> cq_, q_buf_, kva_, attn_, qt_, in_, olat_;
  std::vector<float> qa_; // an absorbed query step's answer, a row apart
  std::vector<uint64_t> iota_;    // 0, 1, 2, ...: every position up to p
  std::vector<uint64_t> sel_pos_; // [rows][topk]: the indexer's positions
  std::vector<uint64_t> count_;   // positions a row attends
  SeqCache cache_;
};

absl::Status CheckShapes(const OpEnv &env, const MlaShape &sh,
                         const MlaAttention &op) {
  auto is = [](const HostMatrix &m, uint64_t r, uint64_t c) {
    return m.rows == r && m.cols == c;
  };
  const uint64_t qRows = (uint64_t)sh.heads * sh.qk();
  const bool in = op.in_runner_ || op.from_indexer_;
  bool ok = op.from_indexer_ ||
            (sh.q_lora ? (in || is(op.q_a_, sh.q_lora, sh.hidden)) &&
                             op.q_a_norm_.size() == sh.q_lora &&
                             (op.q_runner_ || is(op.q_b_, qRows, sh.q_lora))
                       : in || op.q_runner_ || is(op.q_, qRows, sh.hidden));
  ok = ok && (in || is(op.kv_a_, sh.cache(), sh.hidden)) &&
       op.kv_a_norm_.size() == sh.kv_lora &&
       (op.absorbed() ||
        is(op.kv_b_, (uint64_t)sh.heads * sh.kvb(), sh.kv_lora)) &&
       (op.o_runner_ || is(op.o_, sh.hidden, (uint64_t)sh.heads * sh.v));
  if (!ok)
    return env.Error("MLA weights do not match ", sh.heads, " heads, ",
                     "q_lora_rank ", sh.q_lora, ", kv_lora_rank ", sh.kv_lora,
                     ", qk_nope/rope/v head dims ", sh.nope, "/", sh.rope, "/",
                     sh.v, " and hidden size ", sh.hidden);
  return absl::OkStatus();
}

/// What the indexer hands over (the op's queries, latent queries when
/// absorbed, and kv_a output) is what this op reads.
absl::Status CheckIndexerHandover(const OpEnv &env, const pl::IndexerOpDef &ix,
                                  const MlaShape &sh, MlaAttention &op) {
  if ((uint64_t)ix.mla_heads() * ix.mla_qk_dim() !=
          (uint64_t)sh.heads * sh.qk() ||
      ix.mla_kv_width() != sh.cache())
    return env.Error("the indexer's queries and kv_a widths (", ix.mla_heads(),
                     " x ", ix.mla_qk_dim(), ", ", ix.mla_kv_width(),
                     ") do not match the attention");
  const auto *ixHeads = ix.absorb_heads();
  const bool same =
      ixHeads && ixHeads->size() > 0
          ? std::equal(ixHeads->begin(), ixHeads->end(),
                       op.absorb_.heads.begin(), op.absorb_.heads.end()) &&
                ix.mla_kv_lora() == sh.kv_lora
          : !op.absorbed();
  if (!same)
    return env.Error("the indexer's absorbed heads (absorb_heads, "
                     "mla_kv_lora) are not the attention's");
  op.sel_width_ += (uint64_t)sh.heads * sh.qk() + sh.cache() +
                   (op.absorbed() ? (uint64_t)sh.heads * sh.kv_lora : 0);
  return absl::OkStatus();
}

absl::Status LoadWeights(const OpEnv &env, const pl::MlaAttentionOpDef &p,
                         MlaAttention &op) {
  if ((p.in_proj_on_ducks() || p.q_proj_on_ducks()) && p.from_indexer())
    return env.Error("projections both from the indexer and on the ducks");
  if (p.from_indexer()) {
    op.from_indexer_ = true;
    DUCK_RETURN_IF_ERROR(
        env.Load(p.kv_a_layernorm(), "kv_a_layernorm", &op.kv_a_norm_));
  } else if (p.in_proj_on_ducks()) {
    if (!env.runner)
      return env.Error("the input projections on the ducks, but no ducks to "
                       "run them");
    if (!p.q_lora_rank() && p.q_proj_on_ducks())
      return env.Error("q_proj both on its own and among the input "
                       "projections on the ducks");
    op.in_runner_ = env.runner;
    op.in_slot_ = p.in_proj_slot();
    DUCK_RETURN_IF_ERROR(CheckRowSlots(
        env, op.in_slot_, op.InWidth(), env.hidden,
        p.q_lora_rank() ? "q_a_proj/kv_a_proj" : "q_proj/kv_a_proj"));
  }
  if (p.q_proj_on_ducks()) {
    if (!env.runner)
      return env.Error("the query projection on the ducks, but no ducks to "
                       "run it");
    const uint64_t k = p.q_lora_rank() ? p.q_lora_rank() : env.hidden;
    const char *what = p.q_lora_rank() ? "q_b_proj" : "q_proj";
    DUCK_RETURN_IF_ERROR(
        op.absorbed()
            ? CheckAbsorbedQuerySlot(env, p.q_proj_slot(), op.absorb_, k,
                                     p.qk_nope_head_dim(), what)
            : CheckRowSlots(env, p.q_proj_slot(),
                            (uint64_t)p.heads() *
                                (p.qk_nope_head_dim() + p.qk_rope_head_dim()),
                            k, what));
    op.q_runner_ = env.runner;
    op.q_slot_ = p.q_proj_slot();
  }
  if (op.from_indexer_) {
    // The queries and kv_a output arrive ready; kv_a_layernorm is loaded.
  } else if (p.q_lora_rank()) {
    if (!op.in_runner_)
      DUCK_RETURN_IF_ERROR(env.Load(p.q_a_proj(), "q_a_proj", &op.q_a_));
    DUCK_RETURN_IF_ERROR(
        env.Load(p.q_a_layernorm(), "q_a_layernorm", &op.q_a_norm_));
    if (!op.q_runner_)
      DUCK_RETURN_IF_ERROR(env.Load(p.q_b_proj(), "q_b_proj", &op.q_b_));
  } else if (!op.q_runner_ && !op.in_runner_) {
    DUCK_RETURN_IF_ERROR(env.Load(p.q_proj(), "q_proj", &op.q_));
  }
  if (!op.from_indexer_) {
    if (!op.in_runner_)
      DUCK_RETURN_IF_ERROR(
          env.Load(p.kv_a_proj_with_mqa(), "kv_a_proj_with_mqa", &op.kv_a_));
    DUCK_RETURN_IF_ERROR(
        env.Load(p.kv_a_layernorm(), "kv_a_layernorm", &op.kv_a_norm_));
  }
  if (p.o_proj_on_ducks()) {
    if (!env.runner)
      return env.Error("o_proj on the ducks, but no ducks to run it");
    DUCK_RETURN_IF_ERROR(
        op.absorbed()
            ? CheckAbsorbedOutputSlot(env, p.o_proj_slot(), op.absorb_)
            : CheckRowSlots(env, p.o_proj_slot(), env.hidden,
                            (uint64_t)p.heads() * p.v_head_dim(), "o_proj"));
    op.o_runner_ = env.runner;
    op.o_slot_ = p.o_proj_slot();
  } else {
    DUCK_RETURN_IF_ERROR(env.Load(p.o_proj(), "o_proj", &op.o_));
  }
  if (op.absorbed())
    return absl::OkStatus(); // kv_b_proj is the ducks'
  return env.Need(p.kv_b_proj(), "kv_b_proj").status();
}

/// duckc --mla-absorb ducks: the heads each duck holds (absorb_heads),
/// which need the query and output steps on the ducks.
absl::Status LoadAbsorb(const OpEnv &env, const pl::MlaAttentionOpDef &p,
                        const MlaShape &sh, MlaAttention &op) {
  AbsorbShape &a = op.absorb_;
  DUCK_RETURN_IF_ERROR(ReadAbsorbBounds(env, p.absorb_heads(), sh.heads,
                                        "absorb_heads", &a.heads));
  if (a.heads.empty())
    return absl::OkStatus();
  if (!env.runner || !p.o_proj_on_ducks() ||
      !(p.q_proj_on_ducks() || p.from_indexer()))
    return env.Error("kv_b_proj absorbed on the ducks (absorb_heads) needs "
                     "the query projection (or the indexer's) and o_proj on "
                     "the ducks too");
  a.qk = sh.qk();
  a.kv_lora = sh.kv_lora;
  a.v = sh.v;
  a.hidden = sh.hidden;
  for (uint32_t h : a.heads)
    op.o_offsets_.push_back((uint64_t)h * sh.kv_lora);
  return absl::OkStatus();
}

/// kv_b_proj as W_UV rows (kernel operand) and W_UK transposed, per head
/// [kv_lora][nope], for q~ = W_UK[h]^T q_nope: from FP8 in fp9 (exact,
/// 1.125 bytes a weight) when its tiles transpose whole (DeepSeek's:
/// kv_lora 512, 256 rows a head, 128 x 128 tiles), else bf16 when that is
/// exact, else fp32.
absl::Status LoadKvB(const OpEnv &env, const pl::MlaAttentionOpDef &p,
                     const MlaShape &sh, MlaAttention &op) {
  const pl::TensorDef *t = p.kv_b_proj();
  DUCK_ASSIGN_OR_RETURN(op.kv_b_, env.weights.Matrix(*t));
  if (op.kv_b_.rows != (uint64_t)sh.heads * sh.kvb() ||
      op.kv_b_.cols != sh.kv_lora)
    return absl::OkStatus(); // CheckShapes names the mismatch
  if (auto fp9 = env.weights.HeadsTransposedFp9(*t, sh.heads,
                                                (uint32_t)sh.kvb(), sh.nope);
      fp9.ok()) {
    op.w_uk_ = std::move(*fp9);
    return absl::OkStatus();
  } else if (!absl::IsFailedPrecondition(fp9.status())) {
    return fp9.status();
  }
  std::vector<float> all;
  DUCK_ASSIGN_OR_RETURN(all, env.weights.ReadAll(*t));
  std::vector<float> &ukt = op.w_uk_.owned;
  ukt.assign((uint64_t)sh.heads * sh.kv_lora * sh.nope, 0.0f);
  for (uint32_t h = 0; h < sh.heads; ++h)
    for (uint32_t j = 0; j < sh.nope; ++j)
      for (uint32_t r = 0; r < sh.kv_lora; ++r)
        ukt[((uint64_t)h * sh.kv_lora + r) * sh.nope + j] =
            all[((uint64_t)h * sh.kvb() + j) * sh.kv_lora + r];
  op.w_uk_.rows = (uint64_t)sh.heads * sh.kv_lora;
  op.w_uk_.cols = sh.nope;
  // Half the bytes when bf16 holds every value exactly.
  bool exact = true;
  op.w_uk_bf16_.resize(ukt.size());
  for (size_t i = 0; i < ukt.size() && exact; ++i) {
    uint32_t u;
    std::memcpy(&u, &ukt[i], 4);
    op.w_uk_bf16_[i] = (uint16_t)(u >> 16);
    exact = (u & 0xFFFF) == 0;
  }
  if (exact) {
    op.w_uk_.bf16 = op.w_uk_bf16_.data();
    ukt.clear();
    ukt.shrink_to_fit();
  } else {
    op.w_uk_bf16_.clear();
    op.w_uk_bf16_.shrink_to_fit();
    op.w_uk_.f32 = ukt.data();
  }
  return absl::OkStatus();
}

} // namespace

HostOpOr CreateMlaAttention(const OpEnv &env) {
  if (env.kv_f16)
    return absl::InvalidArgumentError(
        "--kv-cache f16 is for grouped-query attention (Qwen3); this plan's "
        "attention is DeepSeek's MLA, whose caches are kept in fp32 only: "
        "use --kv-cache f32");
  const pl::MlaAttentionOpDef *p = env.def.params_as_MlaAttentionOpDef();
  MlaShape sh{env.hidden,
              p->heads(),
              p->q_lora_rank(),
              p->kv_lora_rank(),
              p->qk_nope_head_dim(),
              p->qk_rope_head_dim(),
              p->v_head_dim(),
              (float)p->norm_eps()};
  if (!sh.heads || !sh.kv_lora || !sh.nope || !sh.v || !sh.rope || sh.rope % 2)
    return env.Error("bad MLA shape: ", sh.heads, " heads, kv_lora_rank ",
                     sh.kv_lora, ", head dims ", sh.nope, "/", sh.rope, "/",
                     sh.v);
  if (const pl::RopeScalingDef *rs = p->rope_scaling())
    if (rs->factor() > 1.0 && (!rs->type() || rs->type()->str() != "yarn" ||
                               rs->original_max_position_embeddings() == 0))
      return env.Error("rope_scaling '", rs->type() ? rs->type()->str() : "",
                       "' is not supported (YaRN with "
                       "original_max_position_embeddings only)");
  auto op = std::make_unique<MlaAttention>(sh, env.pool);
  // Each layer's caches map their next 2 MiB positions of its own ahead
  // (SeqCacheOf::MapAhead).
  op->populate_ahead_ = env.def.layer() % 128;
  if (absl::Status s = LoadAbsorb(env, *p, sh, *op); !s.ok())
    return s;
  if (absl::Status s = LoadWeights(env, *p, *op); !s.ok())
    return s;
  if (absl::Status s =
          op->absorbed() ? absl::OkStatus() : LoadKvB(env, *p, sh, *op);
      !s.ok())
    return s;
  if (absl::Status s = CheckShapes(env, sh, *op); !s.ok())
    return s;
  op->rope_ = YarnRope::Make(sh.rope, p->rope_theta(), p->rope_scaling());
  op->softmax_scale_ =
      (float)(op->rope_.attn_scale / std::sqrt((double)sh.qk()));
  if (env.def.inputs() && env.def.inputs()->size() == 2) {
    // The selection's width is its indexer's topk (the engine sized it).
    const uint32_t sel = env.def.inputs()->Get(1);
    const pl::OpDef *from = env.plan.Producer(sel);
    const pl::IndexerOpDef *ix =
        from ? from->params_as_IndexerOpDef() : nullptr;
    if (!ix || !ix->topk())
      return env.Error("second input is not an indexer's selection");
    op->topk_ = ix->topk();
    op->sel_width_ = op->topk_;
    if (ix->on_ducks() != op->from_indexer_)
      return env.Error(op->from_indexer_
                           ? "the indexer does not hand over the projections"
                           : "the indexer hands over projections no one reads");
    if (op->from_indexer_)
      DUCK_RETURN_IF_ERROR(CheckIndexerHandover(env, *ix, sh, *op));
    op->indexed_ = true;
  }
  if (op->from_indexer_ && !op->indexed_)
    return env.Error("the projections come from an indexer, but the op has "
                     "no indexer input");
  DUCK_RETURN_IF_ERROR(
      op->Allocate(env.max_rows, env.max_seq, env.max_seqs, env.populate_seqs));
  return op;
}

namespace {
void MlaTensors(const pl::OpDef &op, HostTensors *out) {
  const pl::MlaAttentionOpDef *p = op.params_as_MlaAttentionOpDef();
  // From its indexer: neither the query nor the kv_a projections.
  const bool in = p->in_proj_on_ducks() || p->from_indexer();
  const bool q = p->q_proj_on_ducks() || p->from_indexer();
  // Absorbed: kv_b_proj is the ducks' by heads.
  const bool absorbed = p->absorb_heads() && p->absorb_heads()->size() > 0;
  AppendTensors(out,
                {in ? nullptr : p->q_a_proj(),
                 p->from_indexer() ? nullptr : p->q_a_layernorm(),
                 q ? nullptr : p->q_b_proj(), q || in ? nullptr : p->q_proj(),
                 in ? nullptr : p->kv_a_proj_with_mqa(), p->kv_a_layernorm(),
                 absorbed ? nullptr : p->kv_b_proj(),
                 p->o_proj_on_ducks() ? nullptr : p->o_proj()});
}
} // namespace

const HostOpKind kMlaAttentionKind{
    {pl::OpParams::MlaAttentionOpDef, TimeBucket::kHostAttention, MlaTensors},
    CreateMlaAttention};

} // namespace duck::runtime::ops
