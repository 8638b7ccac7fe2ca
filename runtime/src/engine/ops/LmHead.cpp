//===- LmHead.cpp - the final projection to the vocabulary ----------------===//
#include "HostOp.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <immintrin.h>

namespace duck::runtime::ops {
namespace {

/// --lm-head int8 made exact where it matters: the int8 logits, then every
/// row whose logit could be the largest under the quantisation's error
/// bound is recomputed from the checkpoint's matrix, with the very bits
/// the exact head (--lm-head checkpoint) gives it. So the argmax, and the
/// logits of every row near it, are the exact head's: greedy ids are
/// identical, for a few rows of the exact matrix a token.
///
/// The bound: a weight is q * s with |q * s - w| <= s / 2 (s its block's
/// scale, q clamped only when the half-rounded scale is below amax / 127,
/// by under 0.1 s), so the weights' part of |logit8 - logit| is at most
/// max_s(row) / 2 * sum |x|, with a margin factor for the exact product's
/// fp32 rounding (2 * hidden * 2^-24 * sum |w x|, |w| <= 127.5 s). The
/// int8 head multiplies int16 inputs (QuantizeX16: |x - x16| <= 0.51 sx,
/// sx = max|x| / 32767), which adds at most 0.51 sx * sum |q s| over the
/// row, and its fp32 sum of the blocks' exact integer sums rounds by at
/// most (blocks / 8 + 8) * 2^-24 * max|x| * sum |q s|.
class ExactTop {
public:
  ExactTop(HostMatrix exact, const HostMatrix &q8) : exact_(std::move(exact)) {
    const uint64_t blocks = q8.cols / kInt8Block;
    const double margin =
        1.01 + 2.0 * (double)q8.cols * std::ldexp(1.0, -24) * 255.0;
    half_step_.resize(q8.rows);
    l1w_.resize(q8.rows);
    for (uint64_t r = 0; r < q8.rows; ++r) {
      float s = 0;
      for (uint64_t b = 0; b < blocks; ++b)
        s = std::max(s, duck_f16_to_f32(q8.i8_scale[r * blocks + b]));
      half_step_[r] = (float)(0.5 * s * margin);
      l1w_[r] = (float)(q8.i8_l1[r] * (1.0 + 1e-6));
    }
    round_ = (double)(blocks / 8 + 8) * std::ldexp(1.0, -24);
  }
  /// Recomputes y's candidate rows exactly; returns how many. Both passes
  /// over the vocabulary (the floor, then the rows above it) run on the
  /// pool, 8 rows a vector.
  uint64_t Refine(ThreadPool &pool, const float *x, float *y) const {
    float l1 = 0, amax = 0;
    for (uint64_t i = 0; i < exact_.cols; ++i) {
      l1 += std::fabs(x[i]);
      amax = std::max(amax, std::fabs(x[i]));
    }
    l1 *= 1.0f + 1e-5f; // the sum's own rounding
    // The inputs' rounding to int16 and the blocks' fp32 sum, a unit of
    // sum |q s|.
    const float xr =
        (float)((0.51 / 32767.0 + round_) * (double)amax * (1.0 + 1e-6));
    const uint64_t V = exact_.rows, parts = (V + kPart - 1) / kPart;
    std::vector<float> part_floor(parts, -INFINITY);
    std::vector<uint64_t> part_rows(parts, 0);
    pool.ParallelFor(parts, [&](uint64_t b, uint64_t e) {
      for (uint64_t p = b; p < e; ++p)
        part_floor[p] =
            Floor(y, l1, xr, p * kPart, std::min(V, (p + 1) * kPart));
    });
    const float floor = *std::max_element(part_floor.begin(), part_floor.end());
    pool.ParallelFor(parts, [&](uint64_t b, uint64_t e) {
      for (uint64_t p = b; p < e; ++p)
        part_rows[p] = Recompute(x, y, l1, xr, floor, p * kPart,
                                 std::min(V, (p + 1) * kPart));
    });
    uint64_t n = 0;
    for (uint64_t c : part_rows)
      n += c;
    return n;
  }

private:
  /// Rows a piece of Refine's passes.
  static constexpr uint64_t kPart = 8192;

  /// max(y[r] - BoundAt(r)) over rows [r0, r1).
  float Floor(const float *y, float l1, float xr, uint64_t r0,
              uint64_t r1) const {
    const __m256 vl1 = _mm256_set1_ps(l1), vxr = _mm256_set1_ps(xr);
    __m256 m = _mm256_set1_ps(-INFINITY);
    uint64_t r = r0;
    for (; r + 8 <= r1; r += 8)
      m = _mm256_max_ps(
          m, _mm256_sub_ps(_mm256_loadu_ps(y + r), Bound(r, vl1, vxr)));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    float f = *std::max_element(lanes, lanes + 8);
    for (; r < r1; ++r)
      f = std::max(f, y[r] - BoundAt(r, l1, xr));
    return f;
  }
  /// Rows [r0, r1) whose y + bound reaches `floor`, recomputed exactly.
  uint64_t Recompute(const float *x, float *y, float l1, float xr, float floor,
                     uint64_t r0, uint64_t r1) const {
    const __m256 vl1 = _mm256_set1_ps(l1), vxr = _mm256_set1_ps(xr),
                 vf = _mm256_set1_ps(floor);
    uint64_t n = 0, r = r0;
    for (; r + 8 <= r1; r += 8) {
      const __m256 hi =
          _mm256_add_ps(_mm256_loadu_ps(y + r), Bound(r, vl1, vxr));
      unsigned bits =
          (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(hi, vf, _CMP_GE_OQ));
      for (; bits; bits &= bits - 1, ++n) {
        const uint64_t i = r + (uint64_t)__builtin_ctz(bits);
        MatVecRows(exact_, x, y, i, i + 1);
      }
    }
    for (; r < r1; ++r)
      if (y[r] + BoundAt(r, l1, xr) >= floor) {
        MatVecRows(exact_, x, y, r, r + 1);
        ++n;
      }
    return n;
  }
  /// Row r's error bound: half_step[r] * l1 + l1w[r] * xr.
  float BoundAt(uint64_t r, float l1, float xr) const {
    return half_step_[r] * l1 + l1w_[r] * xr;
  }
  /// BoundAt for rows r .. r + 7: the same operations (a product, a
  /// product, a sum) in the same order.
  __m256 Bound(uint64_t r, __m256 l1, __m256 xr) const {
    return _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(&half_step_[r]), l1),
                         _mm256_mul_ps(_mm256_loadu_ps(&l1w_[r]), xr));
  }

  HostMatrix exact_;
  std::vector<float> half_step_; // max scale / 2 a row, times the margin
  std::vector<float> l1w_;       // sum |q s| a row
  double round_ = 0;
};

class LmHead final : public HostOp {
public:
  LmHead(HostMatrix w, ThreadPool *pool, uint32_t hidden, uint32_t maxRows,
         std::unique_ptr<ExactTop> top = nullptr)
      : w_(std::move(w)), pool_(pool), hidden_(hidden),
        gathered_((uint64_t)maxRows * hidden), top_(std::move(top)) {}
  /// DUCK_DEBUG_LM_HEAD=1: how many rows the int8 head recomputed exactly.
  ~LmHead() override {
    if (top_ && std::getenv("DUCK_DEBUG_LM_HEAD"))
      std::fprintf(stderr, "lm head: %llu exact rows for %llu logit rows\n",
                   (unsigned long long)refined_, (unsigned long long)rows_);
  }
  /// On the ducks: each holds whole tiles of the vocabulary in `slot`.
  LmHead(FfnRunner *runner, uint32_t slot, uint64_t vocab, uint32_t hidden,
         uint32_t maxRows)
      : runner_(runner), slot_(slot), vocab_(vocab), hidden_(hidden),
        gathered_((uint64_t)maxRows * hidden) {}

  uint64_t WeightBytesPerToken() const override {
    return runner_ ? 0 : MatrixBytes(w_);
  }
  void HostWeights(std::vector<ByteRange> *out) const override {
    if (!runner_)
      AppendMatrixRanges(w_, out);
  }

  /// The rows the step asks for (the last of each sequence that samples,
  /// or every row for --logits-out), appended in order. Several rows go
  /// through one GEMM, so a batch streams the head's weights once; every
  /// row's logits are bit-identical to its own GEMV.
  absl::Status Run(const Step &s) override {
    const float *x = In(s, 0);
    const uint64_t V = runner_ ? vocab_ : w_.rows, n = s.logit_rows.size();
    if (n == 0)
      return absl::OkStatus();
    const size_t at = s.logits->size();
    s.logits->resize(at + n * V); // keeps its capacity between steps
    float *y = s.logits->data() + at;
    if (runner_) {
      for (uint64_t i = 0; i < n; ++i)
        std::copy_n(x + (uint64_t)s.logit_rows[i] * hidden_, hidden_,
                    gathered_.data() + i * hidden_);
      return runner_->RunRows(FfnRunner::Rows::kLmHead, slot_, (uint32_t)n,
                              gathered_.data(), hidden_, y, V);
    }
    if (n == 1) {
      const float *row = x + (uint64_t)s.logit_rows[0] * hidden_;
      MatVec(*pool_, w_, row, y);
      if (top_)
        refined_ += top_->Refine(*pool_, row, y), ++rows_;
      return absl::OkStatus();
    }
    for (uint64_t i = 0; i < n; ++i)
      std::copy_n(x + (uint64_t)s.logit_rows[i] * hidden_, hidden_,
                  gathered_.data() + i * hidden_);
    MatMul(*pool_, w_, gathered_.data(), n, y);
    for (uint64_t i = 0; top_ && i < n; ++i)
      refined_ +=
          top_->Refine(*pool_, gathered_.data() + i * hidden_, y + i * V),
          ++rows_;
    return absl::OkStatus();
  }

private:
  HostMatrix w_;
  ThreadPool *pool_ = nullptr;
  FfnRunner *runner_ = nullptr;
  uint32_t slot_ = 0;
  uint64_t vocab_ = 0;
  uint32_t hidden_;
  std::vector<float> gathered_;
  std::unique_ptr<ExactTop> top_; // int8: the rows near the top, exact
  uint64_t refined_ = 0, rows_ = 0;
};

} // namespace

absl::Status CheckRowSlots(const OpEnv &env, uint32_t slot, uint64_t rows,
                           uint64_t k, const char *what) {
  uint64_t next = 0;
  const auto *ducks = env.plan.def().ducks();
  for (uint32_t r = 0; r < ducks->size(); ++r) {
    const auto *slots = ducks->Get(r)->slots();
    if (!slots || slot >= slots->size() || !slots->Get(slot)->head())
      return env.Error(what, " on the ducks: duck ", r, " has no head slot ",
                       slot);
    const pl::SlotDef *sd = slots->Get(slot);
    if (sd->inter_begin() != next || sd->inter_end() <= sd->inter_begin() ||
        sd->inter_end() > rows)
      return env.Error(what, " on the ducks: duck ", r, " holds rows [",
                       sd->inter_begin(), ", ", sd->inter_end(),
                       "), expected rows from ", next, " of ", rows);
    bool wide = sd->matrices() && sd->matrices()->size() > 0;
    for (uint32_t m = 0; wide && m < sd->matrices()->size(); ++m)
      wide = sd->matrices()->Get(m)->k() == k;
    if (!wide)
      return env.Error(what, " on the ducks: duck ", r, " slot ", slot,
                       " is not of matrices ", k, " wide");
    next = sd->inter_end();
  }
  if (next != rows)
    return env.Error(what, " on the ducks: the ducks hold ", next, " of ",
                     rows, " rows");
  return absl::OkStatus();
}

HostOpOr CreateLmHead(const OpEnv &env) {
  const pl::LmHeadOpDef *p = env.def.params_as_LmHeadOpDef();
  const uint64_t vocab = env.plan.def().model()->vocab();
  if (p->on_ducks()) {
    if (!env.runner)
      return env.Error("LM head on the ducks, but no ducks to run it");
    if (absl::Status s =
            CheckRowSlots(env, p->duck_slot(), vocab, env.hidden, "LM head");
        !s.ok())
      return s;
    return std::make_unique<LmHead>(env.runner, p->duck_slot(), vocab,
                                    env.hidden, env.max_rows);
  }
  const pl::TensorDef *t;
  DUCK_ASSIGN_OR_RETURN(t, env.Need(p->weight(), "weight"));
  HostMatrix m;
  DUCK_ASSIGN_OR_RETURN(m, env.weights.Matrix(*t));
  std::unique_ptr<ExactTop> top;
  if (p->int8()) { // duckc --lm-head int8: the top rows exact (ExactTop)
    HostMatrix q8;
    DUCK_ASSIGN_OR_RETURN(q8, env.weights.QuantizedInt8(*t, *env.pool));
    top = std::make_unique<ExactTop>(std::move(m), q8);
    m = std::move(q8);
  } else if (p->fp9() && !m.is_fp9 && !m.is_e4m3) { // --lm-head fp9
    DUCK_ASSIGN_OR_RETURN(m, env.weights.QuantizedFp9(*t));
  }
  if (m.cols != env.hidden)
    return env.Error("LM head width ", m.cols, " is not the hidden size ",
                     env.hidden);
  if (m.rows != env.plan.def().model()->vocab())
    return env.Error("LM head of ", m.rows, " rows for a vocabulary of ",
                     env.plan.def().model()->vocab());
  return std::make_unique<LmHead>(std::move(m), env.pool, env.hidden,
                                  env.max_rows, std::move(top));
}

namespace {
void LmHeadTensors(const pl::OpDef &op, HostTensors *out) {
  const pl::LmHeadOpDef *p = op.params_as_LmHeadOpDef();
  if (!p->on_ducks()) // on the ducks the host never reads it
    AppendTensors(out, {p->weight()});
}
} // namespace

const HostOpKind kLmHeadKind{
    {pl::OpParams::LmHeadOpDef, TimeBucket::kLmHead, LmHeadTensors},
    CreateLmHead};

} // namespace duck::runtime::ops
