// DeepSeek MLA with kv_b_proj on the ducks by heads (duckc --mla-absorb
// ducks; runtime/src/engine/ops/MlaAbsorb.h). The tiny DeepSeek-V3.2 test
// plan is unpacked (the schema's object API), its layer-0 MLA (and, in the
// indexer cases, its indexer) put on 2 or 3 "ducks" by uneven heads, with
// head slots as duckc lays them out and weight images of just a header,
// and loaded again. A fake runner answers every duck's step from the
// checkpoint's weights in double, as the contract says; the absorbed ops
// must give what the same ops give on the host from the compiled plan.
#include "HostOp.h"

#include "TestPlans.h"
#include "duck/plan_obj_generated.h"
#include "plan_trailer.h"

#include "duck_rt/abi.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

namespace pl = ::duck::plan;
namespace po = ::duck::plan_obj;
using namespace duck::runtime;
using namespace duck::runtime::ops;
using duck::runtime::test::ModelDir;
using duck::runtime::test::PlanDir;

constexpr uint32_t kMaxRows = 8, kMaxSeq = 64;

std::vector<uint8_t> ReadFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}
void WriteFile(const std::string &path, const void *b, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char *>(b), (std::streamsize)n);
}

/// Where an absorbed layer's steps live and how they are split.
struct Layout {
  std::vector<uint32_t> heads;      // absorb_heads
  std::vector<uint32_t> index_rows; // absorb_index_rows (indexer cases)
  bool indexer = false;             // the query step is the indexer's
  uint32_t in_slot = 0, q_slot = 0, o_slot = 0;
};

/// The checkpoint's weights of layer 0's attention, as floats.
struct Weights {
  uint32_t hidden, heads, q_lora, L, nope, rope, v, ih, idim;
  std::vector<float> q_a, kv_a, q_b, kv_b, o, wq_b, wk;
  uint64_t qk() const { return (uint64_t)nope + rope; }
};

/// Rows `rows` of w (k wide) times x (k floats) in double, rounded.
void Product(const std::vector<float> &w, uint64_t k, uint64_t row0,
             uint64_t rows, const float *x, float *out) {
  for (uint64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (uint64_t c = 0; c < k; ++c)
      s += (double)w[(row0 + r) * k + c] * x[c];
    out[r] = (float)s;
  }
}

/// The ducks of an absorbed layer, each step answered duck by duck as the
/// contract says (MlaAttentionOpDef.absorb_heads), in double.
class AbsorbRunner : public FfnRunner {
public:
  AbsorbRunner(const Weights &w, const Layout &l) : w_(w), l_(l) {}

  absl::Status Run(uint32_t, uint32_t, uint32_t, uint32_t,
                   const duck_expert_slot *, const float *, float *) override {
    return absl::InternalError("no FFN steps here");
  }
  absl::Status RunRows(Rows, uint32_t slot, uint32_t n, const float *x,
                       uint32_t k, float *out, uint64_t width) override {
    ++row_steps;
    for (uint32_t t = 0; t < n; ++t) {
      const float *xt = x + (uint64_t)t * k;
      float *ot = out + t * width;
      if (slot == l_.in_slot && l_.indexer) {
        // [q_a_proj | kv_a_proj_with_mqa | indexer wk] over the ducks.
        Product(w_.q_a, w_.hidden, 0, w_.q_lora, xt, ot);
        Product(w_.kv_a, w_.hidden, 0, w_.L + w_.rope, xt, ot + w_.q_lora);
        Product(w_.wk, w_.hidden, 0, w_.idim, xt,
                ot + w_.q_lora + w_.L + w_.rope);
      } else if (slot == l_.q_slot) {
        for (size_t r = 0; r + 1 < l_.heads.size(); ++r)
          ot = QueryStep(r, xt, ot);
        if ((uint64_t)(ot - (out + t * width)) != width)
          return absl::InternalError("query step width");
      } else {
        return absl::InternalError("unexpected row step");
      }
    }
    return absl::OkStatus();
  }
  absl::Status RunScatter(Rows, uint32_t slot, uint32_t n, const float *x,
                          uint64_t stride, absl::Span<const uint64_t> offsets,
                          float *out, uint32_t width) override {
    ++scatter_steps;
    if (slot != l_.o_slot || width != w_.hidden ||
        offsets.size() != l_.heads.size())
      return absl::InternalError("unexpected scattered step");
    for (size_t r = 0; r < offsets.size(); ++r)
      if (offsets[r] != (uint64_t)l_.heads[r] * w_.L)
        return absl::InternalError("offsets are not the heads' latents");
    std::vector<float> part(w_.hidden);
    for (uint32_t t = 0; t < n; ++t) {
      float *ot = out + (uint64_t)t * width;
      std::fill(ot, ot + width, 0.0f);
      for (size_t r = 0; r + 1 < offsets.size(); ++r) {
        OutputStep(r, x + t * stride + offsets[r], part.data());
        for (uint32_t i = 0; i < width; ++i)
          ot[i] += part[i]; // rank order
      }
    }
    return absl::OkStatus();
  }
  int row_steps = 0, scatter_steps = 0;

private:
  /// Duck r's answer to one row of the query step (x: c_q, normed).
  float *QueryStep(size_t r, const float *x, float *out) {
    const uint32_t h0 = l_.heads[r], h1 = l_.heads[r + 1];
    const uint64_t qk = w_.qk(), kvb = (uint64_t)w_.nope + w_.v;
    Product(w_.q_b, w_.q_lora, h0 * qk, (h1 - h0) * qk, x, out);
    const float *q = out;
    out += (h1 - h0) * qk;
    if (l_.indexer) {
      const uint32_t i0 = l_.index_rows[r], i1 = l_.index_rows[r + 1];
      Product(w_.wq_b, w_.q_lora, i0, i1 - i0, x, out);
      out += i1 - i0;
    }
    for (uint32_t h = h0; h < h1; ++h, out += w_.L)
      for (uint32_t c = 0; c < w_.L; ++c) {
        double s = 0;
        for (uint32_t j = 0; j < w_.nope; ++j)
          s += (double)w_.kv_b[(h * kvb + j) * w_.L + c] * q[(h - h0) * qk + j];
        out[c] = (float)s;
      }
    return out;
  }
  /// Duck r's partial sum for one row: W_UV of its heads' latents, then
  /// its o_proj columns.
  void OutputStep(size_t r, const float *lat, float *out) {
    const uint32_t h0 = l_.heads[r], h1 = l_.heads[r + 1];
    const uint64_t kvb = (uint64_t)w_.nope + w_.v,
                   cols = (uint64_t)w_.heads * w_.v;
    std::vector<float> attn((uint64_t)(h1 - h0) * w_.v);
    for (uint32_t h = h0; h < h1; ++h)
      Product(w_.kv_b, w_.L, h * kvb + w_.nope, w_.v,
              lat + (uint64_t)(h - h0) * w_.L,
              attn.data() + (uint64_t)(h - h0) * w_.v);
    for (uint32_t i = 0; i < w_.hidden; ++i) {
      double s = 0;
      for (uint64_t c = 0; c < attn.size(); ++c)
        s += (double)w_.o[i * cols + (uint64_t)h0 * w_.v + c] * attn[c];
      out[i] = (float)s;
    }
  }

  const Weights &w_;
  const Layout &l_;
};

/// Answers nothing: the host ops of the compiled plan need no ducks.
class NoRunner : public FfnRunner {
public:
  absl::Status Run(uint32_t, uint32_t, uint32_t, uint32_t,
                   const duck_expert_slot *, const float *, float *) override {
    return absl::InternalError("no ducks");
  }
};

class MlaAbsorb : public ::testing::Test {
protected:
  void SetUp() override {
    auto p = LoadedPlan::Load(PlanDir("deepseek"), HostOpKinds());
    ASSERT_TRUE(p.ok()) << p.status();
    ref_ = std::move(*p);
    refWeights_ = std::make_unique<WeightReader>(*ref_);
    pool_ = std::make_unique<ThreadPool>(2);
    char tmpl[] = "/tmp/duck-mla-absorb-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ReadWeights();
  }
  void TearDown() override {
    for (const std::string &f : written_)
      ::unlink((dir_ + "/" + f).c_str());
    ::rmdir(dir_.c_str());
  }

  /// Layer 0's op of a kind in a plan, and its index.
  static const pl::OpDef *Op(const LoadedPlan &p, pl::OpParams kind) {
    for (const pl::OpDef *op : *p.def().ops())
      if (op->params_type() == kind && op->layer() == 0)
        return op;
    return nullptr;
  }
  std::vector<float> Read(const pl::TensorDef *t) {
    auto v = refWeights_->ReadAll(*t);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : std::vector<float>();
  }
  void ReadWeights() {
    const pl::MlaAttentionOpDef *m = Op(*ref_, pl::OpParams::MlaAttentionOpDef)
                                         ->params_as_MlaAttentionOpDef();
    const pl::IndexerOpDef *ix =
        Op(*ref_, pl::OpParams::IndexerOpDef)->params_as_IndexerOpDef();
    w_ = Weights{ref_->def().model()->hidden(),
                 m->heads(),
                 m->q_lora_rank(),
                 m->kv_lora_rank(),
                 m->qk_nope_head_dim(),
                 m->qk_rope_head_dim(),
                 m->v_head_dim(),
                 ix->heads(),
                 ix->head_dim(),
                 {},
                 {},
                 {},
                 {},
                 {},
                 {},
                 {}};
    w_.q_a = Read(m->q_a_proj());
    w_.kv_a = Read(m->kv_a_proj_with_mqa());
    w_.q_b = Read(m->q_b_proj());
    w_.kv_b = Read(m->kv_b_proj());
    w_.o = Read(m->o_proj());
    w_.wq_b = Read(ix->wq_b());
    w_.wk = Read(ix->wk());
  }

  /// A head slot of `pieces` (rows, k): rows [begin, end) of a row split
  /// (end 0), or a chain whose OB carries its rows from `begin` on.
  static std::unique_ptr<po::SlotDefT>
  HeadSlot(const std::vector<std::pair<uint32_t, uint32_t>> &pieces,
           uint32_t begin, uint32_t end = 0) {
    auto s = std::make_unique<po::SlotDefT>();
    s->head = true;
    s->layer = 0;
    s->inter_begin = begin;
    for (auto [rows, k] : pieces) {
      auto m = std::make_unique<po::MatrixDefT>();
      m->rows = rows;
      m->k = k;
      s->matrices.push_back(std::move(m));
      s->inter_end += rows;
    }
    if (end)
      s->inter_end = end;
    return s;
  }

  /// Duck r's three new slots, as duckc lays them out: the indexer's input
  /// step (its share of [q_a | kv_a | wk]), the query step (its heads' q
  /// rows, its indexer rows, W_UK^T a head) and the output step (W_UV a
  /// head, then its heads' o_proj columns, which its OB carries).
  void AddSlots(po::DuckDefT &d, uint32_t r, uint32_t tp, uint32_t *maxRows) {
    const uint32_t H = l_.heads[r + 1] - l_.heads[r];
    const uint32_t inRows = w_.q_lora + w_.L + w_.rope + w_.idim;
    const uint32_t in0 = inRows * r / tp, in1 = inRows * (r + 1) / tp;
    d.slots.push_back(HeadSlot({{in1 - in0, w_.hidden}}, in0, in1));
    std::vector<std::pair<uint32_t, uint32_t>> q = {
        {H * (uint32_t)w_.qk(), w_.q_lora}};
    if (l_.indexer)
      q.push_back({l_.index_rows[r + 1] - l_.index_rows[r], w_.q_lora});
    for (uint32_t h = 0; h < H; ++h)
      q.push_back({w_.L, w_.nope});
    d.slots.push_back(HeadSlot(q, 0));
    std::vector<std::pair<uint32_t, uint32_t>> o(H, {w_.v, w_.L});
    o.push_back({w_.hidden, H * w_.v});
    d.slots.push_back(HeadSlot(o, H * w_.v));
    *maxRows = std::max({*maxRows, d.slots[l_.q_slot]->inter_end,
                         d.slots[l_.o_slot]->inter_end});
  }

  /// A header-only weight image for duck r of tp.
  void WriteImage(uint32_t r, uint32_t tp, uint32_t slots) {
    std::vector<uint8_t> img(DUCK_IMAGE_HEADER_BYTES, 0);
    duck_image_header h{};
    h.magic = DUCK_IMAGE_MAGIC;
    h.format_version = DUCK_IMAGE_FORMAT_VERSION_CHAINED;
    h.abi_version = DUCK_ABI_VERSION;
    h.tp_size = tp;
    h.tp_rank = r;
    h.slot_count = slots;
    h.total_bytes = img.size();
    h.hidden = w_.hidden;
    h.header_checksum = XXH3_64bits(&h, sizeof h);
    std::memcpy(img.data(), &h, sizeof h);
    const std::string name = "duck-" + std::to_string(r) + ".weights";
    WriteFile(dir_ + "/" + name, img.data(), img.size());
    written_.push_back(name);
  }

  /// The compiled plan with layer 0 absorbed on tp ducks as l_ says, then
  /// `change`, loaded from the scratch directory.
  absl::StatusOr<std::unique_ptr<LoadedPlan>>
  Absorbed(uint32_t tp,
           const std::function<void(po::PlanDefT &)> &change = {}) {
    std::vector<uint8_t> b = ReadFile(PlanDir("deepseek") + "/model.duckplan");
    uint64_t size = 0;
    EXPECT_TRUE(duck_plan_trailer_ok(b.data(), b.size(), &size));
    b.resize(size);
    std::unique_ptr<po::PlanDefT> p(po::GetPlanDef(b.data())->UnPack());
    while (p->ducks.size() < tp) {
      auto d = std::make_unique<po::DuckDefT>(*p->ducks.back());
      d->rank = (uint32_t)p->ducks.size();
      d->image = "duck-" + std::to_string(d->rank) + ".weights";
      p->ducks.push_back(std::move(d));
    }
    p->tp = tp;
    const uint32_t first = (uint32_t)p->ducks[0]->slots.size();
    l_.in_slot = first, l_.q_slot = first + 1, l_.o_slot = first + 2;
    uint32_t maxRows = 0;
    for (uint32_t r = 0; r < tp; ++r) {
      AddSlots(*p->ducks[r], r, tp, &maxRows);
      p->ducks[r]->image_bytes = DUCK_IMAGE_HEADER_BYTES;
      WriteImage(r, tp, (uint32_t)p->ducks[r]->slots.size());
    }
    p->step_limits->max_head_rows =
        std::max(p->step_limits->max_head_rows, maxRows);
    SetOps(*p);
    if (change)
      change(*p);
    flatbuffers::FlatBufferBuilder fb;
    fb.Finish(po::PlanDef::Pack(fb, p.get()), po::PlanDefIdentifier());
    std::vector<uint8_t> out(fb.GetBufferPointer(),
                             fb.GetBufferPointer() + fb.GetSize());
    uint8_t t[DUCK_PLAN_TRAILER_BYTES];
    duck_plan_trailer(out.data(), out.size(), t);
    out.insert(out.end(), t, t + sizeof t);
    WriteFile(dir_ + "/model.duckplan", out.data(), out.size());
    written_.push_back("model.duckplan");
    PlanLoadOptions o;
    o.checkpoint_dir = ModelDir("deepseek");
    return LoadedPlan::Load(dir_, HostOpKinds(), o);
  }

  /// Layer 0's MLA (and indexer) as l_ says.
  void SetOps(po::PlanDefT &p) {
    for (auto &op : p.ops) {
      if (op->layer != 0)
        continue;
      if (auto *m = op->params.AsMlaAttentionOpDef()) {
        m->q_proj_on_ducks = !l_.indexer;
        m->q_proj_slot = l_.q_slot;
        m->o_proj_on_ducks = true;
        m->o_proj_slot = l_.o_slot;
        m->from_indexer = l_.indexer;
        m->absorb_heads = l_.heads;
      } else if (auto *ix = op->params.AsIndexerOpDef(); ix && l_.indexer) {
        ix->on_ducks = true;
        ix->in_proj_slot = l_.in_slot;
        ix->q_proj_slot = l_.q_slot;
        ix->mla_heads = w_.heads;
        ix->mla_qk_dim = (uint32_t)w_.qk();
        ix->mla_kv_width = w_.L + w_.rope;
        ix->absorb_heads = l_.heads;
        ix->absorb_index_rows = l_.index_rows;
        ix->mla_kv_lora = w_.L;
      }
    }
  }

  HostOpOr Create(const LoadedPlan &plan, const WeightReader &weights,
                  const pl::OpDef &def, FfnRunner *runner) {
    OpEnv env{plan,      def,      weights, runner, pool_.get(),
              w_.hidden, kMaxRows, kMaxSeq, 1};
    auto op = FindHostOpKind(def.params_type())->create(env);
    if (op.ok()) {
      if (def.inputs())
        (*op)->inputs.assign(def.inputs()->begin(), def.inputs()->end());
      (*op)->result = def.result();
    }
    return op;
  }

  /// Layer 0's attention output (and the indexer's result, when it runs)
  /// for `steps` (rows of positions, one sequence) of the same inputs:
  /// from the plan's ops on `runner`, or the reference host ops.
  struct Outputs {
    std::vector<float> attn, index;
  };
  Outputs RunLayer(const LoadedPlan &plan, FfnRunner *runner, bool indexer,
                   const std::vector<std::vector<uint32_t>> &steps);

  std::unique_ptr<LoadedPlan> ref_;
  std::unique_ptr<WeightReader> refWeights_;
  std::unique_ptr<ThreadPool> pool_;
  std::string dir_;
  std::vector<std::string> written_;
  Weights w_;
  Layout l_;
};

MlaAbsorb::Outputs
MlaAbsorb::RunLayer(const LoadedPlan &plan, FfnRunner *runner, bool indexer,
                    const std::vector<std::vector<uint32_t>> &steps) {
  WeightReader weights(plan);
  const pl::OpDef *mDef = Op(plan, pl::OpParams::MlaAttentionOpDef);
  const pl::OpDef *iDef = Op(plan, pl::OpParams::IndexerOpDef);
  auto mla = Create(plan, weights, *mDef, runner);
  EXPECT_TRUE(mla.ok()) << mla.status();
  std::unique_ptr<HostOp> ix;
  if (indexer) {
    auto op = Create(plan, weights, *iDef, runner);
    EXPECT_TRUE(op.ok()) << op.status();
    if (op.ok())
      ix = std::move(*op);
  }
  Outputs out;
  if (!mla.ok() || (indexer && !ix))
    return out;
  ValueArena values;
  values.Init(std::vector<uint64_t>(plan.def().num_values(), 2048), kMaxRows);
  const uint32_t x = mDef->inputs()->Get(0), sel = mDef->inputs()->Get(1);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0, 1);
  std::vector<int32_t> tokens;
  std::vector<uint32_t> seq, logitRows;
  for (const std::vector<uint32_t> &pos : steps) {
    tokens.assign(pos.size(), 0);
    seq.assign(pos.size(), 0);
    Step s{tokens, pos, seq, logitRows, pos.size() > 1, &values, nullptr};
    for (uint64_t i = 0; i < pos.size() * w_.hidden; ++i)
      values.Get(x)[i] = nd(rng);
    const uint32_t topk = iDef->params_as_IndexerOpDef()->topk();
    if (indexer) {
      absl::Status st = ix->Run(s);
      EXPECT_TRUE(st.ok()) << st;
      const uint64_t w = ix->OutWidth();
      for (uint64_t t = 0; t < pos.size(); ++t) // the selections
        out.index.insert(out.index.end(), values.Get(sel) + t * w,
                         values.Get(sel) + t * w + topk);
    } else {
      // A selection of our own: every position up to p but p - 1.
      for (uint64_t t = 0; t < pos.size(); ++t) {
        float *row = values.Get(sel) + t * topk;
        uint32_t k = 0;
        for (uint32_t q = 0; q <= pos[t]; ++q)
          if (q + 1 != pos[t])
            row[k++] = (float)q;
        std::fill(row + k, row + topk, -1.0f);
      }
    }
    absl::Status st = (*mla)->Run(s);
    EXPECT_TRUE(st.ok()) << st;
    const float *o = values.Get(mDef->result());
    out.attn.insert(out.attn.end(), o, o + pos.size() * w_.hidden);
  }
  return out;
}

/// Largest |a - b| over the largest |b|.
double RelativeError(const std::vector<float> &a, const std::vector<float> &b) {
  double diff = 0, mag = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs((double)a[i] - b[i]));
    mag = std::max(mag, std::fabs((double)b[i]));
  }
  return mag > 0 ? diff / mag : diff;
}

/// A prefill of 5 rows, then two decode rows.
const std::vector<std::vector<uint32_t>> kSteps = {{0, 1, 2, 3, 4}, {5}, {6}};

void ExpectSame(const std::vector<float> &got, const std::vector<float> &want) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(want.empty());
  EXPECT_LT(RelativeError(got, want), 1e-5);
}

TEST_F(MlaAbsorb, TwoDucksMatchTheHost) {
  l_.heads = {0, 3, w_.heads};
  auto plan = Absorbed(2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  AbsorbRunner ducks(w_, l_);
  NoRunner none;
  Outputs got = RunLayer(**plan, &ducks, false, kSteps);
  Outputs want = RunLayer(*ref_, &none, false, kSteps);
  ExpectSame(got.attn, want.attn);
  EXPECT_EQ(ducks.row_steps, 3); // a query and an output step a step
  EXPECT_EQ(ducks.scatter_steps, 3);
  // The host reads no kv_b_proj.
  const pl::OpDef *m = Op(**plan, pl::OpParams::MlaAttentionOpDef);
  for (const pl::TensorDef *t : (*plan)->OpTensors(*m))
    EXPECT_EQ(t->name()->str().find("kv_b_proj"), std::string::npos);
}

TEST_F(MlaAbsorb, ThreeUnevenDucksMatchTheHost) {
  ASSERT_EQ(w_.heads, 4u);
  l_.heads = {0, 1, 1, 4}; // duck 1 holds no head
  auto plan = Absorbed(3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  AbsorbRunner ducks(w_, l_);
  NoRunner none;
  ExpectSame(RunLayer(**plan, &ducks, false, kSteps).attn,
             RunLayer(*ref_, &none, false, kSteps).attn);
}

TEST_F(MlaAbsorb, WithTheIndexerTwoDucksMatchTheHost) {
  l_.indexer = true;
  l_.heads = {0, 1, w_.heads};
  l_.index_rows = {0, 100, w_.ih * w_.idim};
  auto plan = Absorbed(2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  AbsorbRunner ducks(w_, l_);
  NoRunner none;
  Outputs got = RunLayer(**plan, &ducks, true, kSteps);
  Outputs want = RunLayer(*ref_, &none, true, kSteps);
  EXPECT_EQ(got.index, want.index); // every position (p < topk)
  ExpectSame(got.attn, want.attn);
}

TEST_F(MlaAbsorb, WithTheIndexerThreeUnevenDucksMatchTheHost) {
  l_.indexer = true;
  l_.heads = {0, 2, 3, w_.heads};
  l_.index_rows = {0, 37, 200, w_.ih * w_.idim};
  auto plan = Absorbed(3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  AbsorbRunner ducks(w_, l_);
  NoRunner none;
  Outputs got = RunLayer(**plan, &ducks, true, kSteps);
  Outputs want = RunLayer(*ref_, &none, true, kSteps);
  EXPECT_EQ(got.index, want.index);
  ExpectSame(got.attn, want.attn);
}

TEST_F(MlaAbsorb, BadHeadBoundariesAreRefused) {
  l_.heads = {0, 3, w_.heads};
  const std::vector<std::vector<uint32_t>> bad = {
      {0, w_.heads},        // one duck's boundaries for two ducks
      {0, 3, w_.heads - 1}, // not every head
      {1, 3, w_.heads},     // not from 0
      {0, 3, 2, w_.heads}}; // three ducks' worth (and decreasing)
  for (const auto &b : bad) {
    auto plan = Absorbed(2, [&](po::PlanDefT &p) {
      for (auto &op : p.ops)
        if (auto *m = op->params.AsMlaAttentionOpDef(); m && op->layer == 0)
          m->absorb_heads = b;
    });
    ASSERT_TRUE(plan.ok()) << plan.status();
    AbsorbRunner ducks(w_, l_);
    const pl::OpDef *m = Op(**plan, pl::OpParams::MlaAttentionOpDef);
    WeightReader weights(**plan);
    auto op = Create(**plan, weights, *m, &ducks);
    ASSERT_FALSE(op.ok());
    EXPECT_NE(op.status().message().find("MlaAttentionOpDef (layer 0)"),
              std::string::npos)
        << op.status();
    EXPECT_NE(op.status().message().find("absorb_heads"), std::string::npos)
        << op.status();
  }
}

TEST_F(MlaAbsorb, AbsorbedNeedsItsStepsOnTheDucks) {
  l_.heads = {0, 3, w_.heads};
  auto plan = Absorbed(2, [&](po::PlanDefT &p) {
    for (auto &op : p.ops)
      if (auto *m = op->params.AsMlaAttentionOpDef(); m && op->layer == 0)
        m->o_proj_on_ducks = false;
  });
  ASSERT_TRUE(plan.ok()) << plan.status();
  AbsorbRunner ducks(w_, l_);
  WeightReader weights(**plan);
  auto op = Create(**plan, weights,
                   *Op(**plan, pl::OpParams::MlaAttentionOpDef), &ducks);
  ASSERT_FALSE(op.ok());
  EXPECT_NE(op.status().message().find("o_proj on the ducks too"),
            std::string::npos)
      << op.status();
}

TEST_F(MlaAbsorb, SlotsOfOtherWidthsAreRefused) {
  l_.heads = {0, 3, w_.heads};
  struct Case {
    const char *what;
    std::function<void(po::PlanDefT &)> change;
    const char *error;
  };
  const std::vector<Case> cases = {
      {"a query slot one row short",
       [&](po::PlanDefT &p) {
         auto &s = p.ducks[1]->slots[l_.q_slot];
         s->inter_end -= 1;
         s->matrices[0]->rows -= 1;
       },
       "q_b_proj on the ducks (kv_b_proj absorbed): duck 1"},
      {"a query slot answering only its latent queries",
       [&](po::PlanDefT &p) {
         auto &s = p.ducks[1]->slots[l_.q_slot];
         s->inter_begin = s->matrices[0]->rows;
       },
       "q_b_proj on the ducks (kv_b_proj absorbed): duck 1"},
      {"an output slot without o_proj's hidden rows",
       [&](po::PlanDefT &p) {
         auto &s = p.ducks[1]->slots[l_.o_slot];
         s->matrices.back()->rows -= 1;
         s->inter_end -= 1;
       },
       "o_proj on the ducks (kv_b_proj absorbed): duck 1"},
      {"an output slot answering its W_UV rows too",
       [&](po::PlanDefT &p) { p.ducks[0]->slots[l_.o_slot]->inter_begin = 0; },
       "o_proj on the ducks (kv_b_proj absorbed): duck 0"},
      {"an output slot whose o_proj reads other values",
       [&](po::PlanDefT &p) {
         p.ducks[0]->slots[l_.o_slot]->matrices.back()->k += 1;
       },
       "o_proj on the ducks (kv_b_proj absorbed): duck 0"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.what);
    auto plan = Absorbed(2, c.change);
    ASSERT_TRUE(plan.ok()) << plan.status();
    AbsorbRunner ducks(w_, l_);
    WeightReader weights(**plan);
    auto op = Create(**plan, weights,
                     *Op(**plan, pl::OpParams::MlaAttentionOpDef), &ducks);
    ASSERT_FALSE(op.ok());
    EXPECT_NE(op.status().message().find(c.error), std::string::npos)
        << op.status();
  }
}

} // namespace
