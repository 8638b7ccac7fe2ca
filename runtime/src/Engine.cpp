//===- Engine.cpp - runs a plan's host program ----------------------------===//
#include "duck/runtime/Engine.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace duck::runtime {
namespace pl = ::duck::plan;

namespace {

// Element conversions are fp9.h's (duck_e4m3_to_f32, duck_f16_to_f32,
// duck_bf16_to_f32): one definition for the compiler, host and ducks.

/// Element i of a host tensor as fp32 (FP8 times its block scale).
struct TensorReader {
  const LoadedPlan &plan;
  absl::StatusOr<std::vector<float>> ReadAll(const pl::TensorDef &t) const {
    const uint8_t *p = plan.TensorData(t);
    uint64_t n = 1;
    for (int64_t d : *t.shape())
      n *= d;
    std::vector<float> out(n);
    switch (t.dtype()) {
    case pl::DType::F32:
      std::memcpy(out.data(), p, n * 4);
      break;
    case pl::DType::BF16:
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = duck_bf16_to_f32(h);
      }
      break;
    case pl::DType::F16:
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = duck_f16_to_f32(h);
      }
      break;
    case pl::DType::F8_E4M3: {
      if (!t.scale() || t.shape()->size() != 2)
        return absl::InvalidArgumentError(absl::StrCat(
            "FP8 host tensor '", t.name()->str(), "' has no block scales"));
      auto scale = ReadAll(*t.scale());
      if (!scale.ok())
        return scale.status();
      // The declared block (the plan checked it against the scale grid);
      // the last tile of a row or column may be partial.
      uint64_t rows = t.shape()->Get(0), cols = t.shape()->Get(1);
      uint64_t scols = t.scale()->shape()->Get(1);
      uint64_t br = t.block_rows(), bc = t.block_cols();
      for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t c = 0; c < cols; ++c)
          out[r * cols + c] = duck_e4m3_to_f32(p[r * cols + c]) *
                              (*scale)[(r / br) * scols + c / bc];
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "host tensor '", t.name()->str(), "' has an unsupported dtype"));
    }
    return out;
  }

  /// A matrix: bf16 and fp32 are used in place, others converted to fp32.
  absl::StatusOr<HostMatrix> Matrix(const pl::TensorDef &t) const {
    if (t.shape()->size() != 2)
      return absl::InvalidArgumentError(
          absl::StrCat("host tensor '", t.name()->str(), "' is not a matrix"));
    HostMatrix m;
    m.rows = t.shape()->Get(0);
    m.cols = t.shape()->Get(1);
    if (t.dtype() == pl::DType::BF16) {
      m.bf16 = reinterpret_cast<const uint16_t *>(plan.TensorData(t));
      return m;
    }
    if (t.dtype() == pl::DType::F8_E4M3 && t.scale() && m.cols % 32 == 0) {
      // FP8 converts to fp9 exactly; the duck kernels then read 1.125
      // bytes a weight instead of 4 for a dequantised fp32 copy.
      auto scale = ReadAll(*t.scale());
      if (!scale.ok())
        return scale.status();
      const uint32_t tileRows = t.block_rows(), tileCols = t.block_cols();
      // The fp9 K-block must divide both the scale tile and the row, so
      // that a partial last tile still ends on a block boundary.
      uint32_t block = tileCols % 128 == 0 && m.cols % 128 == 0 ? 128
                       : tileCols % 64 == 0 && m.cols % 64 == 0 ? 64 : 32;
      duck_fp9_source src{};
      src.type = DUCK_FP9_SRC_E4M3;
      src.data = plan.TensorData(t);
      src.src_rows = m.rows;
      src.src_cols = m.cols;
      src.scale_inv = scale->data();
      src.tile_rows = tileRows;
      src.tile_cols = tileCols;
      duck_fp9_desc desc{(uint32_t)m.rows, (uint32_t)m.cols, block, tileRows, 0};
      duck_fp9_layout lay;
      if (tileCols % block == 0 &&
          duck_fp9_compute_layout(&desc, &lay) == DUCK_FP9_OK) {
        m.fp9_store.assign(lay.total_bytes / 8 + 8, 0);
        void *base = reinterpret_cast<void *>(
            (reinterpret_cast<uintptr_t>(m.fp9_store.data()) + 63) & ~uintptr_t(63));
        duck_fp9_error_at at{};
        duck_fp9_status st = duck_fp9_pack(&src, &desc, base, &at);
        if (st != DUCK_FP9_OK)
          return absl::InvalidArgumentError(absl::StrCat(
              "host tensor '", t.name()->str(), "': ", duck_fp9_status_str(st),
              " at row ", at.row, ", column ", at.col));
        m.fp9 = duck_fp9_matrix_view(&desc, base);
        m.is_fp9 = true;
        return m;
      }
    }
    auto all = ReadAll(t);
    if (!all.ok())
      return all.status();
    m.owned = std::move(*all);
    m.f32 = m.owned.data();
    return m;
  }
};

} // namespace

struct Engine::Op {
  pl::OpKind kind;
  const pl::OpDef *def;
  std::vector<uint32_t> inputs;
  uint32_t result;
  // Weights by role.
  HostMatrix m0;                  // embedding / lm_head / router
  HostMatrix q, k, v, o;          // attention
  std::vector<float> w, qn, kn;   // norms
  std::vector<float> bias;        // router correction bias
  // Attention state.
  uint32_t heads = 0, kvHeads = 0, dim = 0;
  std::vector<float> kcache, vcache;
};

Engine::~Engine() = default;

uint32_t Engine::vocab() const { return plan_->def().model()->vocab(); }

absl::StatusOr<std::unique_ptr<Engine>>
Engine::Create(const LoadedPlan &plan, FfnRunner *runner,
               const EngineOptions &opts) {
  std::unique_ptr<Engine> e(new Engine());
  e->plan_ = &plan;
  e->runner_ = runner;
  e->opts_ = opts;
  e->hidden_ = plan.def().model()->hidden();
  if (opts.max_seq == 0)
    return absl::InvalidArgumentError("--max-seq must be at least 1");
  e->pool_ = std::make_unique<ThreadPool>(std::max(1u, opts.threads));
  if (absl::Status s = e->Prepare(); !s.ok())
    return s;
  return e;
}

absl::Status Engine::Prepare() {
  const pl::PlanDef &d = plan_->def();
  const pl::ModelDef &m = *d.model();
  TensorReader rd{*plan_};
  for (const pl::OpDef *def : *d.ops()) {
    auto op = std::make_unique<Op>();
    op->kind = def->kind();
    op->def = def;
    if (def->inputs())
      op->inputs.assign(def->inputs()->begin(), def->inputs()->end());
    op->result = def->result();
    auto weight = [&](const char *role) -> const pl::TensorDef * {
      if (def->weights())
        for (const pl::TensorDef *t : *def->weights())
          if (t->role() && t->role()->str() == role)
            return t;
      return nullptr;
    };
    auto need = [&](const char *role) -> absl::StatusOr<const pl::TensorDef *> {
      const pl::TensorDef *t = weight(role);
      if (!t)
        return absl::InvalidArgumentError(absl::StrCat(
            "plan op ", pl::EnumNameOpKind(def->kind()), " of layer ",
            def->layer(), " has no '", role, "' weight"));
      return t;
    };
#define DUCK_TRY_ASSIGN(lhs, expr)                                             \
  {                                                                            \
    auto _v = (expr);                                                          \
    if (!_v.ok())                                                              \
      return _v.status();                                                      \
    lhs = std::move(*_v);                                                      \
  }
    switch (def->kind()) {
    case pl::OpKind::Embedding:
    case pl::OpKind::LmHead: {
      const pl::TensorDef *t;
      DUCK_TRY_ASSIGN(t, need("weight"));
      DUCK_TRY_ASSIGN(op->m0, rd.Matrix(*t));
      if (def->kind() == pl::OpKind::Embedding && op->m0.is_fp9)
        return absl::UnimplementedError(
            "FP8 embeddings are not supported (row lookup needs bf16/fp32)");
      break;
    }
    case pl::OpKind::RmsNorm: {
      const pl::TensorDef *t;
      DUCK_TRY_ASSIGN(t, need("weight"));
      DUCK_TRY_ASSIGN(op->w, rd.ReadAll(*t));
      break;
    }
    case pl::OpKind::AttentionGqa: {
      const pl::TensorDef *t;
      DUCK_TRY_ASSIGN(t, need("q_proj"));
      DUCK_TRY_ASSIGN(op->q, rd.Matrix(*t));
      DUCK_TRY_ASSIGN(t, need("k_proj"));
      DUCK_TRY_ASSIGN(op->k, rd.Matrix(*t));
      DUCK_TRY_ASSIGN(t, need("v_proj"));
      DUCK_TRY_ASSIGN(op->v, rd.Matrix(*t));
      DUCK_TRY_ASSIGN(t, need("o_proj"));
      DUCK_TRY_ASSIGN(op->o, rd.Matrix(*t));
      DUCK_TRY_ASSIGN(t, need("q_norm"));
      DUCK_TRY_ASSIGN(op->qn, rd.ReadAll(*t));
      DUCK_TRY_ASSIGN(t, need("k_norm"));
      DUCK_TRY_ASSIGN(op->kn, rd.ReadAll(*t));
      op->heads = m.heads();
      op->kvHeads = m.kv_heads();
      op->dim = m.head_dim();
      if (op->q.rows != (uint64_t)op->heads * op->dim ||
          op->k.rows != (uint64_t)op->kvHeads * op->dim ||
          op->qn.size() != op->dim || op->heads % op->kvHeads != 0)
        return absl::InvalidArgumentError(absl::StrCat(
            "layer ", def->layer(), ": attention weights do not match ",
            op->heads, " heads, ", op->kvHeads, " kv heads of ", op->dim));
      op->kcache.assign((uint64_t)opts_.max_seq * op->kvHeads * op->dim, 0.0f);
      op->vcache.assign((uint64_t)opts_.max_seq * op->kvHeads * op->dim, 0.0f);
      break;
    }
    case pl::OpKind::AttentionMla:
      return absl::UnimplementedError(
          "this runtime does not run DeepSeek MLA attention yet (the plan "
          "compiles; duckrun supports Qwen3 and Qwen3-MoE)");
    case pl::OpKind::Add:
      break;
    case pl::OpKind::DenseFfn:
      break;
    case pl::OpKind::MoeFfn: {
      const pl::TensorDef *t;
      DUCK_TRY_ASSIGN(t, need("router"));
      DUCK_TRY_ASSIGN(op->m0, rd.Matrix(*t));
      if (const pl::TensorDef *b = weight("correction_bias"))
        DUCK_TRY_ASSIGN(op->bias, rd.ReadAll(*b));
      if (def->top_k() == 0 || def->top_k() > def->num_experts() ||
          op->m0.rows != def->num_experts())
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", def->layer(), ": bad router (", def->top_k(),
                         " of ", def->num_experts(), " experts)"));
      break;
    }
    }
#undef DUCK_TRY_ASSIGN
    ops_.push_back(std::move(op));
  }
  return absl::OkStatus();
}

absl::Status Engine::Forward(absl::Span<const int32_t> tokens,
                             std::vector<float> *out_logits) {
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
    if (absl::Status s = RunChunk(tokens.subspan(i, n), n > 1, out_logits);
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
    if (absl::Status s = RunChunk(tokens.subspan(i, 1), false, out_logits);
        !s.ok())
      return s;
  return absl::OkStatus();
}

absl::Status Engine::RunChunk(absl::Span<const int32_t> tokens, bool prefill,
                              std::vector<float> *out_logits) {
  const pl::PlanDef &d = plan_->def();
  const pl::ModelDef &m = *d.model();
  const uint64_t n = tokens.size(), H = hidden_;
  std::vector<std::vector<float>> values(d.num_values());
  std::vector<float> tmp;
  for (auto &opPtr : ops_) {
    Op &op = *opPtr;
    std::vector<float> &out = values[op.result];
    switch (op.kind) {
    case pl::OpKind::Embedding: {
      out.resize(n * H);
      for (uint64_t t = 0; t < n; ++t) {
        int32_t id = tokens[t];
        if (id < 0 || (uint64_t)id >= op.m0.rows)
          return absl::InvalidArgumentError(absl::StrCat(
              "token id ", id, " is outside the vocabulary of ", op.m0.rows));
        float *dst = out.data() + t * H;
        if (op.m0.bf16)
          for (uint64_t c = 0; c < H; ++c)
            dst[c] = duck_bf16_to_f32(op.m0.bf16[id * H + c]);
        else
          std::memcpy(dst, op.m0.f32 + (uint64_t)id * H, H * 4);
      }
      break;
    }
    case pl::OpKind::RmsNorm: {
      const std::vector<float> &x = values[op.inputs[0]];
      out.resize(n * H);
      for (uint64_t t = 0; t < n; ++t)
        RmsNorm(x.data() + t * H, op.w.data(), H, (float)op.def->eps(),
                out.data() + t * H);
      break;
    }
    case pl::OpKind::Add: {
      const std::vector<float> &a = values[op.inputs[0]],
                               &b = values[op.inputs[1]];
      out.resize(a.size());
      for (size_t i = 0; i < a.size(); ++i)
        out[i] = a[i] + b[i];
      break;
    }
    case pl::OpKind::AttentionGqa: {
      const std::vector<float> &x = values[op.inputs[0]];
      const uint64_t qd = (uint64_t)op.heads * op.dim,
                     kd = (uint64_t)op.kvHeads * op.dim;
      std::vector<float> q(n * qd), k(n * kd), v(n * kd), attn(n * qd);
      MatMul(*pool_, op.q, x.data(), n, q.data());
      MatMul(*pool_, op.k, x.data(), n, k.data());
      MatMul(*pool_, op.v, x.data(), n, v.data());
      tmp.resize(pos_ + n);
      for (uint64_t t = 0; t < n; ++t) {
        const int64_t p = pos_ + t;
        for (uint32_t h = 0; h < op.heads; ++h) {
          float *qh = q.data() + t * qd + h * op.dim;
          RmsNorm(qh, op.qn.data(), op.dim, (float)m.rms_norm_eps(), qh);
          RopeNeox(qh, op.dim, p, m.rope_theta());
        }
        for (uint32_t h = 0; h < op.kvHeads; ++h) {
          float *kh = k.data() + t * kd + h * op.dim;
          RmsNorm(kh, op.kn.data(), op.dim, (float)m.rms_norm_eps(), kh);
          RopeNeox(kh, op.dim, p, m.rope_theta());
        }
        std::memcpy(op.kcache.data() + p * kd, k.data() + t * kd, kd * 4);
        std::memcpy(op.vcache.data() + p * kd, v.data() + t * kd, kd * 4);
        AttendOne(q.data() + t * qd, op.kcache.data(), op.vcache.data(), p + 1,
                  op.heads, op.kvHeads, op.dim, attn.data() + t * qd,
                  tmp.data());
      }
      out.resize(n * H);
      MatMul(*pool_, op.o, attn.data(), n, out.data());
      break;
    }
    case pl::OpKind::DenseFfn: {
      const std::vector<float> &x = values[op.inputs[0]];
      out.assign(n * H, 0.0f);
      uint32_t mode = prefill ? op.def->prefill_mode() : op.def->decode_mode();
      if (absl::Status s =
              runner_->Run(mode, op.def->slot(), n, 0, nullptr, x.data(),
                           out.data());
          !s.ok())
        return s;
      break;
    }
    case pl::OpKind::MoeFfn: {
      const std::vector<float> &x = values[op.inputs[0]];
      const pl::OpDef &def = *op.def;
      const uint32_t E = def.num_experts(), K = def.top_k(),
                     S = def.num_shared(), slotsPerToken = K + S;
      std::vector<duck_expert_slot> slots(n * slotsPerToken);
      std::vector<float> logits(E), sel(E);
      std::vector<uint32_t> idx(K);
      for (uint64_t t = 0; t < n; ++t) {
        MatVecRows(op.m0, x.data() + t * H, logits.data(), 0, E);
        duck_expert_slot *ts = slots.data() + t * slotsPerToken;
        if (def.router() == pl::Router::Softmax) {
          Softmax(logits.data(), E);
          TopK(logits.data(), E, K, idx.data());
          float sum = 0;
          for (uint32_t j = 0; j < K; ++j)
            sum += logits[idx[j]];
          for (uint32_t j = 0; j < K; ++j)
            ts[j] = {idx[j], def.norm_topk_prob() ? logits[idx[j]] / sum
                                                  : logits[idx[j]]};
        } else {
          // DeepSeek: sigmoid scores; bias only for selection; groups.
          for (uint32_t i = 0; i < E; ++i) {
            logits[i] = 1.0f / (1.0f + std::exp(-logits[i]));
            sel[i] = logits[i] + (op.bias.empty() ? 0.0f : op.bias[i]);
          }
          uint32_t G = def.n_group() ? def.n_group() : 1, per = E / G;
          uint32_t keep = def.topk_group() ? def.topk_group() : G;
          std::vector<float> gscore(G);
          for (uint32_t g = 0; g < G; ++g) {
            std::vector<float> grp(sel.begin() + g * per,
                                   sel.begin() + (g + 1) * per);
            std::partial_sort(grp.begin(), grp.begin() + std::min(2u, per),
                              grp.end(), std::greater<float>());
            gscore[g] = grp[0] + (per > 1 ? grp[1] : 0.0f);
          }
          std::vector<uint32_t> gidx(keep);
          TopK(gscore.data(), G, keep, gidx.data());
          std::vector<bool> kept(G, false);
          for (uint32_t g : gidx)
            kept[g] = true;
          for (uint32_t i = 0; i < E; ++i)
            if (!kept[i / per])
              sel[i] = -INFINITY;
          TopK(sel.data(), E, K, idx.data());
          float sum = 0;
          for (uint32_t j = 0; j < K; ++j)
            sum += logits[idx[j]];
          for (uint32_t j = 0; j < K; ++j) {
            float w = logits[idx[j]];
            if (def.norm_topk_prob())
              w /= sum + 1e-20f;
            ts[j] = {idx[j], w * def.routed_scaling_factor()};
          }
        }
        for (uint32_t s = 0; s < S; ++s)
          ts[K + s] = {E + s, 1.0f};
      }
      out.assign(n * H, 0.0f);
      uint32_t mode = prefill ? def.prefill_mode() : def.decode_mode();
      if (absl::Status s = runner_->Run(mode, def.slot(), n, slotsPerToken,
                                        slots.data(), x.data(), out.data());
          !s.ok())
        return s;
      break;
    }
    case pl::OpKind::LmHead: {
      const std::vector<float> &x = values[op.inputs[0]];
      if (opts_.all_logits) { // every token's logits, appended
        const size_t at = out_logits->size();
        out_logits->resize(at + n * op.m0.rows);
        for (uint64_t t = 0; t < n; ++t)
          MatVec(*pool_, op.m0, x.data() + t * H,
                 out_logits->data() + at + t * op.m0.rows);
        break;
      }
      // Sampling needs only the last token's logits.
      out_logits->resize(op.m0.rows);
      MatVec(*pool_, op.m0, x.data() + (n - 1) * H, out_logits->data());
      break;
    }
    case pl::OpKind::AttentionMla:
      return absl::UnimplementedError("MLA attention");
    }
  }
  pos_ += n;
  return absl::OkStatus();
}

//===----------------------------------------------------------------------===//
// Sampler
//===----------------------------------------------------------------------===//

Sampler::Sampler(const SamplerOptions &o) : o_(o), state_(o.seed) {}

int32_t Sampler::Sample(absl::Span<const float> logits) {
  if (o_.temperature <= 0.0f) {
    return (int32_t)(std::max_element(logits.begin(), logits.end()) -
                     logits.begin());
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
