//===- GqaAttention.cpp - Qwen3 grouped-query attention -------------------===//
//
// q/k/v projections, per-head q/k RMSNorm, NeoX RoPE (YaRN frequencies
// and cos/sin scale when config.json's rope_scaling asks for them, as
// Qwen3's model cards do for 128k contexts), causal softmax over the KV
// cache, o_proj (MATH.md section 1). The cache holds k and v for max_seq
// positions, fp32 or (--kv-cache f16) IEEE half; every buffer is taken at
// Create.
//===----------------------------------------------------------------------===//
#include "HostOp.h"
#include "MlaAbsorb.h"
#include "Rope.h"

#include <cmath>
#include <cstring>

namespace duck::runtime::ops {
namespace {

struct GqaShape {
  uint32_t heads, kv_heads, dim, hidden;
  float eps;
  double theta;
  uint64_t q() const { return (uint64_t)heads * dim; }
  uint64_t kv() const { return (uint64_t)kv_heads * dim; }
};

class GqaAttention final : public HostOp {
public:
  GqaAttention(const GqaShape &sh, ThreadPool *pool) : sh_(sh), pool_(pool) {}

  HostMatrix q_, k_, v_, o_;
  std::vector<float> qn_, kn_;
  // duckc --o-proj / --q-proj ducks: those rows run in head slots.
  FfnRunner *o_runner_ = nullptr, *q_runner_ = nullptr;
  uint32_t o_slot_ = 0, q_slot_ = 0;
  // duckc --o-proj heads: each duck's heads' outputs (float offsets into a
  // row of attn_, tp + 1), partial sums back; empty: o_proj by rows.
  std::vector<uint64_t> o_offsets_;
  // duckc --in-proj ducks: q, k and v in one step, rows [q | k | v].
  FfnRunner *in_runner_ = nullptr;
  uint32_t in_slot_ = 0;

  /// `populate`: sequences whose first cache chunk is mapped in now.
  absl::Status Allocate(uint32_t maxRows, uint32_t maxSeq, uint32_t maxSeqs,
                        uint32_t populate, const pl::RopeScalingDef *scaling) {
    // RoPE: frequencies once (YaRN-blended with rope scaling; the same
    // half-split pairs DeepSeek's indexer rotates); cos/sin once a
    // position, shared by the heads.
    const YarnRope rope = YarnRope::Make(sh_.dim, sh_.theta, scaling);
    inv_freq_ = rope.inv_freq;
    // HF's yarn attention_factor, which the compiler resolved; YarnRope's
    // own cos/sin scale follows DeepSeek's mscale fields instead. Plain
    // RoPE keeps 1 and so the exact bits it had before scaling existed.
    if (scaling)
      cos_sin_scale_ = scaling->attention_factor() > 0
                           ? (float)scaling->attention_factor()
                           : (float)(scaling->factor() <= 1.0
                                         ? 1.0
                                         : 0.1 * std::log(scaling->factor()) +
                                               1.0);
    cos_.assign(sh_.dim / 2, 0.0f);
    sin_.assign(sh_.dim / 2, 0.0f);
    q_buf_.assign((uint64_t)maxRows * sh_.q(), 0.0f);
    runs_.reserve(maxRows + 1);
    k_buf_.assign((uint64_t)maxRows * sh_.kv(), 0.0f);
    v_buf_.assign((uint64_t)maxRows * sh_.kv(), 0.0f);
    attn_.assign((uint64_t)maxRows * sh_.q(), 0.0f);
    rows_.reserve(maxRows);
    if (in_runner_)
      qkv_.assign((uint64_t)maxRows * (sh_.q() + 2 * sh_.kv()), 0.0f);
    // Chunks of positions, head-major inside ([chunk][kv head][chunk_][dim]):
    // a kv head's positions are contiguous for chunk_ of them, so attention
    // streams them instead of striding over the other heads, and a chunk of
    // every head is one 2 MiB page (SeqCacheOf), so the rows a token writes
    // into its heads share a page (with a head's whole max_seq contiguous,
    // each head's row was its own page, a TLB miss each).
    chunk_ = KvCacheChunk(sh_.kv_heads, sh_.dim, f16_ ? 2 : 4);
    max_seq_ = (maxSeq + chunk_ - 1) / chunk_ * chunk_;
    // A position a layer (chunk_ / 8 of them, 64 at 512 positions a chunk,
    // before two share a token): the request from half a chunk before the
    // end, the mapping of what is left within its last quarter.
    const uint64_t spread = std::max<uint64_t>(1, chunk_ / 8);
    populate_at_ = chunk_ / 2 - layer_ % spread;
    map_at_ = 2 + 2 * (layer_ % spread);
    const uint64_t rows = (uint64_t)max_seq_ * sh_.kv_heads;
    // Each sequence's first chunk mapped in now: a prompt's first 512
    // positions (fp32, 8 kv heads of 128).
    auto init = [&](auto &k, auto &v) -> absl::Status {
      DUCK_RETURN_IF_ERROR(k.Init(sh_.dim, rows, maxSeqs));
      DUCK_RETURN_IF_ERROR(v.Init(sh_.dim, rows, maxSeqs));
      k.PopulateFirstPages(populate);
      v.PopulateFirstPages(populate);
      return absl::OkStatus();
    };
    return f16_ ? init(kcache16_, vcache16_) : init(kcache_, vcache_);
  }
  bool f16_ = false; // --kv-cache f16
  uint64_t layer_ = 0; // the plan's layer: where PopulateAhead maps

  uint64_t KvBytesPerToken() const override {
    return 2 * sh_.kv() * (f16_ ? 2 : 4);
  }
  uint64_t CacheReadBytes(uint64_t positions) const override {
    return KvBytesPerToken() * positions; // every position's k and v
  }
  /// A position's bytes: every kv head's k, then every kv head's v.
  void CopyKv(uint32_t seq, uint64_t from, uint32_t n, uint8_t *buf,
              uint64_t stride, bool save) override {
    const uint64_t head = (uint64_t)sh_.dim * (f16_ ? 2 : 4);
    const uint64_t vAt = sh_.kv_heads * head;
    for (uint32_t i = 0; i < n; ++i)
      for (uint32_t h = 0; h < sh_.kv_heads; ++h) {
        const uint64_t row = Row(h, from + i);
        uint8_t *b = buf + i * stride + h * head;
        if (f16_) {
          kcache16_.Copy(seq, row, b, head, save);
          vcache16_.Copy(seq, row, b + vAt, head, save);
        } else {
          kcache_.Copy(seq, row, b, head, save);
          vcache_.Copy(seq, row, b + vAt, head, save);
        }
      }
  }
  uint64_t WeightBytesPerToken() const override {
    return MatrixBytes(q_) + MatrixBytes(k_) + MatrixBytes(v_) +
           MatrixBytes(o_);
  }
  void HostWeights(std::vector<ByteRange> *out) const override {
    for (const HostMatrix *m : {&q_, &k_, &v_, &o_})
      AppendMatrixRanges(*m, out);
  }

  /// With the projections on the host (the ducks' in/q/o steps take
  /// whole steps).
  bool KeepLogitRowsOnly(uint32_t max_rows) override {
    if (in_runner_ || q_runner_ || o_runner_)
      return false;
    x_rows_.assign((uint64_t)max_rows * sh_.hidden, 0.0f);
    logit_rows_only_ = true;
    return true;
  }

  absl::Status Run(const Step &s) override {
    if (s.logit_rows_only && logit_rows_only_)
      return RunLogitRows(s);
    const float *x = In(s, 0);
    const uint32_t n = s.rows();
    if (in_runner_) {
      const uint64_t w = sh_.q() + 2 * sh_.kv();
      DUCK_RETURN_IF_ERROR(in_runner_->RunRows(FfnRunner::Rows::kAttention,
                                               in_slot_, n, x, sh_.hidden,
                                               qkv_.data(), w));
      for (uint32_t t = 0; t < n; ++t) {
        const float *r = qkv_.data() + t * w;
        std::memcpy(q_buf_.data() + t * sh_.q(), r, sh_.q() * 4);
        std::memcpy(k_buf_.data() + t * sh_.kv(), r + sh_.q(), sh_.kv() * 4);
        std::memcpy(v_buf_.data() + t * sh_.kv(), r + sh_.q() + sh_.kv(),
                    sh_.kv() * 4);
      }
    } else {
      if (q_runner_) {
        DUCK_RETURN_IF_ERROR(q_runner_->RunRows(FfnRunner::Rows::kAttention,
                                                q_slot_, n, x, sh_.hidden,
                                                q_buf_.data(), sh_.q()));
        MatMulMany(*pool_, x, n,
                   {{&k_, k_buf_.data()}, {&v_, v_buf_.data()}});
      } else {
        MatMulMany(*pool_, x, n,
                   {{&q_, q_buf_.data()},
                    {&k_, k_buf_.data()},
                    {&v_, v_buf_.data()}});
      }
    }
    // Every row's k/v goes into its sequence's cache first (a row attends
    // only to positions up to its own, all written by then), then one
    // parallel pass attends every row.
    for (uint32_t t = 0; t < n; ++t) {
      Angles(s.pos[t]);
      NormRopeQ(q_buf_.data() + t * sh_.q());
      NormRopeStoreKv(t, s.seq[t], s.pos[t]);
    }
    rows_.resize(n);
    for (uint32_t t = 0; t < n; ++t)
      rows_[t] = t;
    Attend(s);
    if (o_runner_ && !o_offsets_.empty())
      return o_runner_->RunScatter(FfnRunner::Rows::kAttention, o_slot_, n,
                                   attn_.data(), sh_.q(), o_offsets_, Out(s),
                                   sh_.hidden);
    if (o_runner_)
      return o_runner_->RunRows(FfnRunner::Rows::kAttention, o_slot_, n,
                                attn_.data(), (uint32_t)sh_.q(), Out(s),
                                sh_.hidden);
    MatMul(*pool_, o_, attn_.data(), n, Out(s));
    return absl::OkStatus();
  }

  /// Step::logit_rows_only: every row's k and v into the caches, the
  /// query, attention and o_proj for the logit rows only (result row j:
  /// logit row j). The same bits a row as Run: a product's row does not
  /// depend on the other rows, nor a row's attention on its run.
  absl::Status RunLogitRows(const Step &s) {
    const float *x = In(s, 0);
    const uint32_t n = s.rows(), m = (uint32_t)s.logit_rows.size();
    MatMulMany(*pool_, x, n, {{&k_, k_buf_.data()}, {&v_, v_buf_.data()}});
    for (uint32_t t = 0; t < n; ++t) {
      Angles(s.pos[t]);
      NormRopeStoreKv(t, s.seq[t], s.pos[t]);
    }
    if (m == 0)
      return absl::OkStatus();
    for (uint32_t j = 0; j < m; ++j)
      std::memcpy(x_rows_.data() + (uint64_t)j * sh_.hidden,
                  x + (uint64_t)s.logit_rows[j] * sh_.hidden, sh_.hidden * 4);
    MatMul(*pool_, q_, x_rows_.data(), m, q_buf_.data());
    for (uint32_t j = 0; j < m; ++j) {
      Angles(s.pos[s.logit_rows[j]]);
      NormRopeQ(q_buf_.data() + (uint64_t)j * sh_.q());
    }
    rows_.assign(s.logit_rows.begin(), s.logit_rows.end());
    Attend(s);
    MatMul(*pool_, o_, attn_.data(), m, Out(s));
    return absl::OkStatus();
  }

private:
  /// The rows rows_[0..) of the step (their queries and results at 0..):
  /// one parallel pass, the heads split along kv heads when there are
  /// enough of them (a group's query heads then share its K/V reads), rows
  /// of one sequence at consecutive positions (a prompt chunk) as runs of
  /// up to kRunRows, which read the cache once for the run.
  void Attend(const Step &s) {
    const uint64_t T = pool_->size(), H = sh_.heads, KV = sh_.kv_heads;
    const uint64_t unit = KV >= T ? H / KV : 1, units = H / unit;
    const uint32_t n = (uint32_t)rows_.size();
    runs_.clear();
    for (uint32_t j = 0; j < n; ++j) {
      const uint32_t t = rows_[j];
      if (j == 0 || j - runs_.back() == kRunRows ||
          s.seq[t] != s.seq[rows_[j - 1]] ||
          s.pos[t] != s.pos[rows_[j - 1]] + 1)
        runs_.push_back(j);
    }
    runs_.push_back(n);
    const uint64_t nRuns = runs_.size() - 1;
    pool_->ParallelFor(nRuns * units, [&](uint64_t b, uint64_t e) {
      for (uint64_t i = b; i < e; ++i) {
        const uint64_t u = i % units;
        const uint32_t j = runs_[i / units], rows = runs_[i / units + 1] - j;
        const uint32_t t = rows_[j];
        auto attend = [&](auto &kc, auto &vc) {
          AttendRows(q_buf_.data() + j * sh_.q(), sh_.q(), rows, s.pos[t] + 1,
                     kc.Base(s.seq[t]), vc.Base(s.seq[t]), chunk_ * sh_.dim, H,
                     KV, sh_.dim, u * unit, (u + 1) * unit,
                     attn_.data() + j * sh_.q(), sh_.q(), chunk_,
                     KV * chunk_ * sh_.dim);
        };
        if (f16_)
          attend(kcache16_, vcache16_);
        else
          attend(kcache_, vcache_);
      }
    });
  }

  /// RoPE's cos/sin table for position p.
  void Angles(uint64_t p) {
    for (uint32_t i = 0; i < sh_.dim / 2; ++i) {
      const double a = (double)p * inv_freq_[i];
      cos_[i] = (float)std::cos(a) * cos_sin_scale_;
      sin_[i] = (float)std::sin(a) * cos_sin_scale_;
    }
  }

  /// A row's query heads normed and rotated (Angles' position).
  void NormRopeQ(float *q) {
    for (uint32_t h = 0; h < sh_.heads; ++h) {
      float *qh = q + (uint64_t)h * sh_.dim;
      RmsNorm(qh, qn_.data(), sh_.dim, sh_.eps, qh);
      Rope(qh);
    }
  }

  /// Row t of the step, position p of sequence `seq` (Angles' position):
  /// norm and rotate k, append k/v to the sequence's cache.
  void NormRopeStoreKv(uint32_t t, uint32_t seq, uint64_t p) {
    float *k = k_buf_.data() + t * sh_.kv();
    for (uint32_t h = 0; h < sh_.kv_heads; ++h) {
      float *kh = k + (uint64_t)h * sh_.dim;
      RmsNorm(kh, kn_.data(), sh_.dim, sh_.eps, kh);
      Rope(kh);
    }
    PopulateAhead(seq, p);
    const float *v = v_buf_.data() + t * sh_.kv();
    for (uint32_t h = 0; h < sh_.kv_heads; ++h) {
      const uint64_t row = Row(h, p);
      if (f16_) {
        ToHalf(k + h * sh_.dim, sh_.dim, kcache16_.AtForWrite(seq, row));
        ToHalf(v + h * sh_.dim, sh_.dim, vcache16_.AtForWrite(seq, row));
      } else {
        std::memcpy(kcache_.AtForWrite(seq, row), k + h * sh_.dim, sh_.dim * 4);
        std::memcpy(vcache_.AtForWrite(seq, row), v + h * sh_.dim, sh_.dim * 4);
      }
    }
  }

  /// The chunk after position p's, mapped in ahead of its first write. A
  /// chunk is a 2 MiB page of k and one of v, and its first write maps the
  /// page: every layer's at the same position, 56 pages on one token of a
  /// Qwen3-0.6B shape (287-332 ms on a VM that backs guest memory lazily;
  /// docs/perf.md). Each layer asks the background thread for its pages
  /// half a chunk before (populate_at_, a position of its own), and maps
  /// what is still missing itself near the end (k at map_at_, v one
  /// position before), one page a token at worst.
  void PopulateAhead(uint32_t seq, uint64_t p) {
    const uint64_t next = (p / chunk_ + 1) * chunk_, left = next - p;
    if (next >= max_seq_ ||
        (left != populate_at_ && left != map_at_ && left != map_at_ + 1))
      return;
    const uint64_t rows = sh_.kv_heads * chunk_;
    const bool now = left != populate_at_;
    const bool k = left != map_at_ + 1, v = left != map_at_;
    auto populate = [&](auto &kc, auto &vc) {
      if (k)
        kc.Populate(seq, Row(0, next), rows, now);
      if (v)
        vc.Populate(seq, Row(0, next), rows, now);
    };
    if (f16_)
      populate(kcache16_, vcache16_);
    else
      populate(kcache_, vcache_);
  }

  /// NeoX RoPE of one head with this position's table: pairs (i, i + D/2).
  void Rope(float *h) const {
    const uint32_t half = sh_.dim / 2;
    for (uint32_t i = 0; i < half; ++i) {
      const float x0 = h[i], x1 = h[i + half];
      h[i] = x0 * cos_[i] - x1 * sin_[i];
      h[i + half] = x1 * cos_[i] + x0 * sin_[i];
    }
  }

  /// Rows of a prompt chunk attended together (bounds the scores buffer
  /// a thread keeps: rows x group x context).
  static constexpr uint32_t kRunRows = 64;

  /// The cache row of kv head h at position p.
  uint64_t Row(uint64_t h, uint64_t p) const {
    return (p / chunk_ * sh_.kv_heads + h) * chunk_ + p % chunk_;
  }

  GqaShape sh_;
  ThreadPool *pool_;
  std::vector<uint32_t> runs_; // first row of each run, then n
  std::vector<uint32_t> rows_; // the step's rows Attend attends
  uint64_t max_seq_ = 0;       // a multiple of chunk_
  uint64_t chunk_ = 64;        // positions a cache chunk (KvCacheChunk)
  // Positions before a chunk's end where PopulateAhead asks for the next
  // one, and where it maps k (v: one more).
  uint64_t populate_at_ = 32, map_at_ = 2;
  std::vector<double> inv_freq_;
  float cos_sin_scale_ = 1.0f;
  std::vector<float> cos_, sin_;
  std::vector<float> q_buf_, k_buf_, v_buf_, attn_, qkv_;
  std::vector<float> x_rows_;    // RunLogitRows' inputs of the logit rows
  bool logit_rows_only_ = false; // KeepLogitRowsOnly agreed
  SeqCache kcache_, vcache_;
  SeqCacheOf<uint16_t> kcache16_, vcache16_;
};

} // namespace

HostOpOr CreateGqaAttention(const OpEnv &env) {
  const pl::GqaAttentionOpDef *p = env.def.params_as_GqaAttentionOpDef();
  GqaShape sh{p->heads(), p->kv_heads(),        p->head_dim(),
              env.hidden, (float)p->norm_eps(), p->rope_theta()};
  if (sh.heads == 0 || sh.kv_heads == 0 || sh.dim == 0 ||
      sh.heads % sh.kv_heads != 0 || sh.dim % 2 != 0)
    return env.Error("bad attention shape: ", sh.heads, " heads, ", sh.kv_heads,
                     " kv heads of ", sh.dim);
  // Only YaRN reaches a plan (the compiler refuses other rope types and
  // leaves "default" out); anything else would rotate wrongly unnoticed.
  const pl::RopeScalingDef *rs = p->rope_scaling();
  if (rs && (!rs->type() || rs->type()->str() != "yarn" ||
             rs->original_max_position_embeddings() == 0 ||
             !(rs->factor() >= 1.0) || !(rs->beta_fast() > 0) ||
             !(rs->beta_slow() > 0) || rs->attention_factor() < 0))
    return env.Error("rope_scaling '", rs->type() ? rs->type()->str() : "",
                     "' with factor ", rs->factor(),
                     " is not supported (YaRN with factor >= 1 and "
                     "original_max_position_embeddings only)");
  auto op = std::make_unique<GqaAttention>(sh, env.pool);
  op->f16_ = env.kv_f16;
  if (p->in_proj_on_ducks()) {
    if (!env.runner)
      return env.Error("q/k/v_proj on the ducks, but no ducks to run them");
    if (p->q_proj_on_ducks())
      return env.Error("q_proj both on its own and among the input "
                       "projections on the ducks");
    DUCK_RETURN_IF_ERROR(CheckRowSlots(env, p->in_proj_slot(),
                                       sh.q() + 2 * sh.kv(), sh.hidden,
                                       "q/k/v_proj"));
    op->in_runner_ = env.runner;
    op->in_slot_ = p->in_proj_slot();
  } else if (p->q_proj_on_ducks()) {
    if (!env.runner)
      return env.Error("q_proj on the ducks, but no ducks to run it");
    DUCK_RETURN_IF_ERROR(CheckRowSlots(env, p->q_proj_slot(), sh.q(),
                                       sh.hidden, "q_proj"));
    op->q_runner_ = env.runner;
    op->q_slot_ = p->q_proj_slot();
  } else {
    DUCK_RETURN_IF_ERROR(env.Load(p->q_proj(), "q_proj", &op->q_));
  }
  if (!op->in_runner_) {
    DUCK_RETURN_IF_ERROR(env.Load(p->k_proj(), "k_proj", &op->k_));
    DUCK_RETURN_IF_ERROR(env.Load(p->v_proj(), "v_proj", &op->v_));
  }
  if (p->o_proj_on_ducks()) {
    if (!env.runner)
      return env.Error("o_proj on the ducks, but no ducks to run it");
    std::vector<uint32_t> heads;
    DUCK_RETURN_IF_ERROR(
        ReadAbsorbBounds(env, p->o_heads(), sh.heads, "o_heads", &heads));
    if (heads.empty())
      DUCK_RETURN_IF_ERROR(
          CheckRowSlots(env, p->o_proj_slot(), sh.hidden, sh.q(), "o_proj"));
    else
      DUCK_RETURN_IF_ERROR(CheckHeadColumnsSlot(env, p->o_proj_slot(), heads,
                                                sh.dim, sh.hidden));
    for (uint32_t h : heads)
      op->o_offsets_.push_back((uint64_t)h * sh.dim);
    op->o_runner_ = env.runner;
    op->o_slot_ = p->o_proj_slot();
  } else {
    DUCK_RETURN_IF_ERROR(env.Load(p->o_proj(), "o_proj", &op->o_));
  }
  DUCK_RETURN_IF_ERROR(env.Load(p->q_norm(), "q_norm", &op->qn_));
  DUCK_RETURN_IF_ERROR(env.Load(p->k_norm(), "k_norm", &op->kn_));
  const bool hostQ = !op->q_runner_ && !op->in_runner_;
  if ((hostQ && (op->q_.rows != sh.q() || op->q_.cols != sh.hidden)) ||
      (!op->in_runner_ && (op->k_.rows != sh.kv() || op->v_.rows != sh.kv())) ||
      (!op->o_runner_ && (op->o_.rows != sh.hidden || op->o_.cols != sh.q())) ||
      op->qn_.size() != sh.dim || op->kn_.size() != sh.dim)
    return env.Error("attention weights do not match ", sh.heads, " heads, ",
                     sh.kv_heads, " kv heads of ", sh.dim, " and hidden size ",
                     sh.hidden);
  op->layer_ = env.def.layer();
  DUCK_RETURN_IF_ERROR(op->Allocate(env.max_rows, env.max_seq, env.max_seqs,
                                    env.populate_seqs, rs));
  return op;
}

namespace {
void GqaTensors(const pl::OpDef &op, HostTensors *out) {
  const pl::GqaAttentionOpDef *p = op.params_as_GqaAttentionOpDef();
  // A projection on the ducks is never read by the host.
  const bool in = p->in_proj_on_ducks();
  AppendTensors(out, {p->q_proj_on_ducks() || in ? nullptr : p->q_proj(),
                      in ? nullptr : p->k_proj(), in ? nullptr : p->v_proj(),
                      p->o_proj_on_ducks() ? nullptr : p->o_proj(), p->q_norm(),
                      p->k_norm()});
}
} // namespace

const HostOpKind kGqaAttentionKind{
    {pl::OpParams::GqaAttentionOpDef, TimeBucket::kHostAttention, GqaTensors},
    CreateGqaAttention};

} // namespace duck::runtime::ops
