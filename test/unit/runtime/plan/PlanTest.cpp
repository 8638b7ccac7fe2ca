// The plan loader (runtime/src/plan/Plan.cpp): a plan duckc compiled loads;
// each check refuses a plan with one field wrong, by its own message.
//
// The plans are compiled at build time (test/unit/runtime/CMakeLists.txt:
// duck-mkmodel, then duckc compile --tp 2). A test unpacks one with the
// schema's object API (a copy of plan.fbs in namespace duck::plan_obj),
// changes a field, packs it again, reseals it (plan_trailer.h) into a
// scratch directory beside links to the original weight images, and loads
// that.
#include "duck/runtime/plan/Plan.h"
#include "duck/runtime/engine/Engine.h"

#include "duck/plan_obj_generated.h"
#include "TestPlans.h"
#include "plan_trailer.h"

#include "duck_rt/abi.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

namespace po = ::duck::plan_obj;
namespace pl = ::duck::plan;
using duck::runtime::LoadedPlan;
using duck::runtime::PlanLoadOptions;

using duck::runtime::test::ModelDir;
using duck::runtime::test::PlanDir;

std::vector<uint8_t> ReadFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void WriteFile(const std::string &path, const std::vector<uint8_t> &b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char *>(b.data()), (std::streamsize)b.size());
}

/// The plan bytes with their trailer appended.
std::vector<uint8_t> Sealed(std::vector<uint8_t> b) {
  uint8_t t[DUCK_PLAN_TRAILER_BYTES];
  duck_plan_trailer(b.data(), b.size(), t);
  b.insert(b.end(), t, t + sizeof t);
  return b;
}

std::vector<uint8_t> Packed(const po::PlanDefT &p) {
  flatbuffers::FlatBufferBuilder b;
  b.Finish(po::PlanDef::Pack(b, &p), po::PlanDefIdentifier());
  return std::vector<uint8_t>(b.GetBufferPointer(),
                              b.GetBufferPointer() + b.GetSize());
}

bool Has(const absl::Status &s, const std::string &text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

class PlanTest : public ::testing::Test {
protected:
  /// The plan under test: "qwen3-moe" (FP8, MoE) or "qwen3" (bf16, dense).
  void Use(const std::string &name) {
    name_ = name;
    for (const char *img : {"duck-0.weights", "duck-1.weights"}) {
      const std::string link = dir_ + "/" + img;
      ::unlink(link.c_str());
      ASSERT_EQ(::symlink((PlanDir(name) + "/" + img).c_str(), link.c_str()),
                0);
    }
  }
  void SetUp() override {
    char tmpl[] = "/tmp/duck-plan-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Use("qwen3-moe");
  }
  void TearDown() override {
    for (const char *f : {"model.duckplan", "duck-0.weights", "duck-1.weights",
                          "duck-9.weights"})
      ::unlink((dir_ + "/" + f).c_str());
    ::rmdir(dir_.c_str());
  }

  /// The compiled plan, unpacked (checked sealed first).
  std::unique_ptr<po::PlanDefT> Unpack() {
    std::vector<uint8_t> b = ReadFile(PlanDir(name_) + "/model.duckplan");
    uint64_t size = 0;
    EXPECT_TRUE(duck_plan_trailer_ok(b.data(), b.size(), &size));
    b.resize(size);
    return std::unique_ptr<po::PlanDefT>(po::GetPlanDef(b.data())->UnPack());
  }
  absl::Status LoadBytes(const std::vector<uint8_t> &bytes,
                         PlanLoadOptions o = {}) {
    WriteFile(dir_ + "/model.duckplan", bytes);
    if (o.checkpoint_dir.empty())
      o.checkpoint_dir = ModelDir(name_);
    return LoadedPlan::Load(dir_, duck::runtime::HostOpKinds(), o).status();
  }
  /// Packs, reseals and loads the plan after `change`.
  absl::Status LoadChanged(const std::function<void(po::PlanDefT &)> &change,
                           const PlanLoadOptions &o = {}) {
    std::unique_ptr<po::PlanDefT> p = Unpack();
    change(*p);
    return LoadBytes(Sealed(Packed(*p)), o);
  }

  /// The first op of a kind.
  template <typename Table>
  static Table *First(po::PlanDefT &p, po::OpParams kind, size_t *index) {
    for (size_t i = 0; i < p.ops.size(); ++i)
      if (p.ops[i]->params.type == kind) {
        *index = i;
        return static_cast<Table *>(p.ops[i]->params.value);
      }
    ADD_FAILURE() << "the plan has no op of kind " << (int)kind;
    static Table none;
    return &none;
  }

  std::string name_, dir_;
};

// The plans as duckc wrote them, and again after an unpack/pack round trip
// (so every refusal below is the one field's doing).
TEST_F(PlanTest, CompiledPlansLoad) {
  for (const char *name : {"qwen3-moe", "qwen3"}) {
    SCOPED_TRACE(name);
    PlanLoadOptions o;
    o.verify_weight_checksums = true;
    auto p = LoadedPlan::Load(PlanDir(name), duck::runtime::HostOpKinds(), o);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ((*p)->def().tp(), 2u);
    EXPECT_EQ((*p)->def().ducks()->size(), 2u);
    EXPECT_EQ((*p)->def().version(), duck::runtime::kPlanVersion);
    EXPECT_EQ((*p)->ImagePath(1), PlanDir(name) + "/duck-1.weights");
    EXPECT_EQ((*p)->TokenizerPath(), ModelDir(name) + "/tokenizer.json");
    EXPECT_GT((*p)->MapHostTensors(), 0u);
    Use(name);
    absl::Status s = LoadChanged([](po::PlanDefT &) {}, o);
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST_F(PlanTest, CheckpointInsteadOfPlanSaysToCompile) {
  absl::Status s =
      LoadedPlan::Load(ModelDir("qwen3"), duck::runtime::HostOpKinds())
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Has(s, "is not a plan directory")) << s;
  EXPECT_TRUE(Has(s, "compile it first with 'duckc compile")) << s;
}

TEST_F(PlanTest, NotAPlanIsRefusedByIdentifier) {
  absl::Status s = LoadBytes(Sealed(std::vector<uint8_t>(64, 'x')));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s, "no 'DKPL' file identifier")) << s;
}

TEST_F(PlanTest, TruncatedPlanFailsTheVerifier) {
  std::vector<uint8_t> b = Packed(*Unpack());
  b.resize(b.size() / 2);
  absl::Status s = LoadBytes(Sealed(b));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Has(s, "FlatBuffers verifier failed")) << s;
}

TEST_F(PlanTest, OtherVersionsAreRefusedByName) {
  absl::Status s = LoadChanged([](po::PlanDefT &p) { ++p.version; });
  EXPECT_TRUE(Has(s, "plan version " +
                         std::to_string(duck::runtime::kPlanVersion + 1) +
                         " but this runtime reads version " +
                         std::to_string(duck::runtime::kPlanVersion)))
      << s;
  s = LoadChanged([](po::PlanDefT &p) { p.abi_version += 7; });
  EXPECT_TRUE(Has(s, "duck ABI " + std::to_string(DUCK_ABI_VERSION + 7)))
      << s;
  s = LoadChanged([](po::PlanDefT &p) { p.fp9_version += 7; });
  EXPECT_TRUE(Has(s, "fp9 format " +
                         std::to_string(DUCK_FP9_FORMAT_VERSION + 7)))
      << s;
  // The version is checked before the trailer: an old plan without one
  // is told its version, not that it is corrupt.
  std::unique_ptr<po::PlanDefT> p = Unpack();
  ++p->version;
  s = LoadBytes(Packed(*p));
  EXPECT_TRUE(Has(s, "plan version")) << s;
}

TEST_F(PlanTest, MissingOrWrongTrailerIsRefused) {
  std::vector<uint8_t> b = Packed(*Unpack());
  absl::Status s = LoadBytes(b);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Has(s, "has no checksum trailer")) << s;

  std::vector<uint8_t> sealed = Sealed(b);
  sealed.back() ^= 1; // the hash
  s = LoadBytes(sealed);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Has(s, "checksum does not match its bytes")) << s;

  // A byte of the plan itself (the compiler's name, which nothing else
  // checks), the trailer as it was.
  sealed = Sealed(b);
  const std::string name = Unpack()->compiler;
  ASSERT_FALSE(name.empty());
  auto at = std::search(sealed.begin(), sealed.end(), name.begin(), name.end());
  ASSERT_NE(at, sealed.end());
  *at ^= 0x20;
  s = LoadBytes(sealed);
  EXPECT_TRUE(Has(s, "checksum does not match its bytes")) << s;
}

TEST_F(PlanTest, TpMustCountTheDucks) {
  absl::Status s = LoadChanged([](po::PlanDefT &p) { p.tp = 3; });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s, "tp is 3 but the plan lists 2 ducks")) << s;
  s = LoadChanged([](po::PlanDefT &p) { p.tp = 0; });
  EXPECT_TRUE(Has(s, "tp is 0 but the plan lists 2 ducks")) << s;
  s = LoadChanged([](po::PlanDefT &p) { p.ducks.pop_back(); });
  EXPECT_TRUE(Has(s, "tp is 2 but the plan lists 1 ducks")) << s;
}

TEST_F(PlanTest, MissingSectionsAndZeroSizes) {
  absl::Status s = LoadChanged([](po::PlanDefT &p) { p.ops.clear(); });
  EXPECT_TRUE(Has(s, "missing model, ops, ducks or files")) << s;
  s = LoadChanged([](po::PlanDefT &p) { p.model.reset(); });
  EXPECT_TRUE(Has(s, "missing model, ops, ducks or files")) << s;
  s = LoadChanged([](po::PlanDefT &p) { p.model->vocab = 0; });
  EXPECT_TRUE(Has(s, "model sizes are zero")) << s;
  s = LoadChanged([](po::PlanDefT &p) { p.step_limits.reset(); });
  EXPECT_TRUE(Has(s, "has no step limits")) << s;
  s = LoadChanged([](po::PlanDefT &p) { p.ops[1]->params.Reset(); });
  EXPECT_TRUE(Has(s, "ops[1] has no parameters or an unknown kind (0)")) << s;
}

TEST_F(PlanTest, SlotIndexOutOfRange) {
  size_t i = 0;
  absl::Status s = LoadChanged([&](po::PlanDefT &p) {
    First<po::MoeFfnOpDefT>(p, po::OpParams::MoeFfnOpDef, &i)->step->mutate_slot(9);
  });
  EXPECT_TRUE(Has(s, "ops[" + std::to_string(i) + "] (layer 0) runs slot 9 "
                     "but duck 0 has 2 slots"))
      << s;
  // A slot that exists but holds another layer.
  s = LoadChanged([&](po::PlanDefT &p) {
    First<po::MoeFfnOpDefT>(p, po::OpParams::MoeFfnOpDef, &i)->step->mutate_slot(1);
  });
  EXPECT_TRUE(Has(s, "runs slot 1 of duck 0, which holds the MoE layer 1"))
      << s;
  // The slot is the layer's but of the other kind.
  s = LoadChanged([&](po::PlanDefT &p) {
    for (auto &d : p.ducks)
      d->slots[0]->moe = false;
  });
  EXPECT_TRUE(Has(s, "which holds the dense layer 0")) << s;
  s = LoadChanged([&](po::PlanDefT &p) {
    First<po::MoeFfnOpDefT>(p, po::OpParams::MoeFfnOpDef, &i)->step.reset();
  });
  EXPECT_TRUE(Has(s, "has no duck step")) << s;
}

TEST_F(PlanTest, ValueIdsOutOfRange) {
  uint32_t values = Unpack()->num_values;
  ASSERT_GT(values, 0u);
  absl::Status s = LoadChanged([](po::PlanDefT &p) {
    p.ops[2]->result = p.num_values;
  });
  EXPECT_TRUE(Has(s, "ops[2] writes value " + std::to_string(values) + " of " +
                         std::to_string(values)))
      << s;
  s = LoadChanged([](po::PlanDefT &p) {
    p.ops[1]->inputs.at(0) = p.num_values + 5;
  });
  EXPECT_TRUE(Has(s, "ops[1] reads value " + std::to_string(values + 5) +
                         " of " + std::to_string(values)))
      << s;
}

TEST_F(PlanTest, ModePairsMustMatchTheKind) {
  size_t i = 0;
  absl::Status s = LoadChanged([&](po::PlanDefT &p) {
    First<po::MoeFfnOpDefT>(p, po::OpParams::MoeFfnOpDef, &i)
        ->step->mutate_decode_mode(0); // the dense decode mode
  });
  EXPECT_TRUE(Has(s, "ops[" + std::to_string(i) +
                         "] (layer 0) has modes 0/6, not a MoE (1 or 4/6) "
                         "pair"))
      << s;
  // Both MoE decode modes are good.
  s = LoadChanged([&](po::PlanDefT &p) {
    for (auto &op : p.ops)
      if (auto *m = op->params.AsMoeFfnOpDef())
        m->step->mutate_decode_mode(m->step->decode_mode() == 1 ? 4 : 1);
  });
  EXPECT_TRUE(s.ok()) << s;

  Use("qwen3");
  s = LoadChanged([&](po::PlanDefT &p) {
    First<po::DenseFfnOpDefT>(p, po::OpParams::DenseFfnOpDef, &i)
        ->step->mutate_prefill_mode(6);
  });
  EXPECT_TRUE(Has(s, "ops[" + std::to_string(i) +
                         "] (layer 0) has modes 0/6, not a dense (0/5) pair"))
      << s;
}

TEST_F(PlanTest, RouterTopKWithinTheExperts) {
  size_t i = 0;
  absl::Status s = LoadChanged([&](po::PlanDefT &p) {
    auto *m = First<po::MoeFfnOpDefT>(p, po::OpParams::MoeFfnOpDef, &i);
    m->top_k = m->num_experts + 1;
  });
  EXPECT_TRUE(Has(s, "has router 0 with top 17 of 16 experts")) << s;
  s = LoadChanged([&](po::PlanDefT &p) {
    First<po::MoeFfnOpDefT>(p, po::OpParams::MoeFfnOpDef, &i)->router =
        (po::Router)7;
  });
  EXPECT_TRUE(Has(s, "has router 7")) << s;
}

TEST_F(PlanTest, StepLimitsBoundMoeOpsAndSlots) {
  absl::Status s = LoadChanged([](po::PlanDefT &p) {
    p.step_limits->max_experts = 8;
  });
  EXPECT_TRUE(Has(s, "beyond the step limits")) << s;
  s = LoadChanged([](po::PlanDefT &p) { p.step_limits->max_active = 1; });
  EXPECT_TRUE(Has(s, "beyond the step limits")) << s;
  s = LoadChanged([](po::PlanDefT &p) {
    auto &sl = *p.ducks[1]->slots[1];
    sl.inter_end = sl.inter_begin + p.step_limits->max_inter + 1;
  });
  EXPECT_TRUE(Has(s, "duck 1 slot 1 (intermediate [")) << s;
  EXPECT_TRUE(Has(s, "exceeds the step limits")) << s;
  s = LoadChanged([](po::PlanDefT &p) {
    auto &sl = *p.ducks[1]->slots[0];
    ASSERT_GT(sl.inter_begin, 0u);
    sl.inter_end = sl.inter_begin - 1; // an empty, reversed range
  });
  EXPECT_TRUE(Has(s, "duck 1 slot 0 (intermediate [")) << s;
}

TEST_F(PlanTest, CheckpointFileMustBeTheCompiledOne) {
  absl::Status s =
      LoadChanged([](po::PlanDefT &p) { p.files[0]->size += 1; });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s, "when the plan was compiled; recompile")) << s;
  EXPECT_TRUE(Has(s, "model.safetensors' is ")) << s;
  s = LoadChanged([](po::PlanDefT &p) { p.files[0]->header_hash ^= 1; });
  EXPECT_TRUE(Has(s, "is not the one the plan was compiled from (header "
                     "differs)"))
      << s;
  s = LoadChanged([](po::PlanDefT &p) { p.files[0]->path = "gone.safetensors"; });
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Has(s, "needs checkpoint file")) << s;
  EXPECT_TRUE(Has(s, "gone.safetensors")) << s;
  // Without an explicit directory the plan's own checkpoint_dir is used.
  s = LoadChanged([](po::PlanDefT &p) { p.checkpoint_dir = "/nonexistent"; });
  EXPECT_TRUE(s.ok()) << "the option overrides the plan's directory: " << s;
  std::unique_ptr<po::PlanDefT> p = Unpack();
  p->checkpoint_dir = "/nonexistent";
  WriteFile(dir_ + "/model.duckplan", Sealed(Packed(*p)));
  s = LoadedPlan::Load(dir_, duck::runtime::HostOpKinds()).status();
  EXPECT_TRUE(Has(s, "(compile-time checkpoint: /nonexistent)")) << s;
}

TEST_F(PlanTest, TensorsMustFitTheirFiles) {
  auto embedding = [](po::PlanDefT &p) -> po::TensorDefT & {
    return *p.ops[0]->params.AsEmbeddingOpDef()->weight;
  };
  absl::Status s =
      LoadChanged([&](po::PlanDefT &p) { embedding(p).file = 1; });
  EXPECT_TRUE(Has(s, "ops[0] tensor 'model.embed_tokens.weight' names file 1 "
                     "of 1"))
      << s;
  s = LoadChanged([&](po::PlanDefT &p) { embedding(p).bytes += 2; });
  EXPECT_TRUE(Has(s, "has a byte size that disagrees with its shape")) << s;
  s = LoadChanged([&](po::PlanDefT &p) { embedding(p).shape[0] += 1; });
  EXPECT_TRUE(Has(s, "has a byte size that disagrees with its shape")) << s;
  s = LoadChanged([&](po::PlanDefT &p) { embedding(p).offset += 1u << 30; });
  EXPECT_TRUE(Has(s, "lies outside its file")) << s;
  // An offset whose sum with the size wraps past 2^64 (fuzz-plan found it).
  s = LoadChanged([&](po::PlanDefT &p) { embedding(p).offset = ~0ull - 1; });
  EXPECT_TRUE(Has(s, "lies outside its file")) << s;
  s = LoadChanged([&](po::PlanDefT &p) { embedding(p).dtype = (po::DType)99; });
  EXPECT_TRUE(Has(s, "has dtype 99, not one of the plan's")) << s;
  // An empty vector is not written: no shape.
  s = LoadChanged([&](po::PlanDefT &p) { embedding(p).shape.clear(); });
  EXPECT_TRUE(Has(s, "ops[0] has an incomplete tensor")) << s;
}

TEST_F(PlanTest, Fp8ScaleGridMustMatchTheDeclaredBlock) {
  size_t i = 0;
  auto q = [&](po::PlanDefT &p) -> po::TensorDefT & {
    return *First<po::GqaAttentionOpDefT>(p, po::OpParams::GqaAttentionOpDef,
                                          &i)
                ->q_proj;
  };
  // q_proj [256, 128] in 128x128 blocks has a 2x1 grid.
  absl::Status s = LoadChanged([&](po::PlanDefT &p) { q(p).block_rows = 64; });
  EXPECT_TRUE(Has(s, "FP8 tensor 'model.layers.0.self_attn.q_proj.weight' "
                     "[256, 128] with 64x128 blocks needs a 4x1 scale grid, "
                     "found 2x1"))
      << s;
  // The last tile may be partial: 96-row blocks still make 3 of 256 rows.
  s = LoadChanged([&](po::PlanDefT &p) { q(p).block_rows = 96; });
  EXPECT_TRUE(Has(s, "needs a 3x1 scale grid")) << s;
  s = LoadChanged([&](po::PlanDefT &p) { q(p).block_cols = 0; });
  EXPECT_TRUE(Has(s, "has no quantization block size")) << s;
  s = LoadChanged([&](po::PlanDefT &p) { q(p).scale.reset(); });
  EXPECT_TRUE(Has(s, "is not a 2-D matrix with a 2-D scale grid")) << s;
  // The scale tensor is checked as a tensor too.
  s = LoadChanged([&](po::PlanDefT &p) { q(p).scale->bytes = 4; });
  EXPECT_TRUE(Has(s, "weight_scale_inv' has a byte size that disagrees")) << s;
}

TEST_F(PlanTest, WeightImagesMustBePresentAndTheirs) {
  absl::Status s =
      LoadChanged([](po::PlanDefT &p) { p.ducks[1]->image = "duck-9.weights"; });
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Has(s, "duck-9.weights' is missing")) << s;
  s = LoadChanged([](po::PlanDefT &p) { p.ducks[0]->image_bytes += 4096; });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Has(s, "the plan says")) << s;
  EXPECT_TRUE(Has(s, "(truncated?)")) << s;
  // Duck 1's image where duck 0's belongs: same size, another rank.
  s = LoadChanged([](po::PlanDefT &p) { p.ducks[0]->image = "duck-1.weights"; });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Has(s, "duck-1.weights' has a bad header")) << s;
  s = LoadChanged([](po::PlanDefT &p) { p.ducks[1]->rank = 0; });
  EXPECT_TRUE(Has(s, "ducks[1] is incomplete or out of order")) << s;
  // A slot whose checksum disagrees, only when asked to re-hash.
  auto badSum = [](po::PlanDefT &p) { p.ducks[1]->slots[0]->checksum ^= 1; };
  s = LoadChanged(badSum);
  EXPECT_TRUE(s.ok()) << s;
  PlanLoadOptions o;
  o.verify_weight_checksums = true;
  s = LoadChanged(badSum, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Has(s, "duck-1.weights' slot 0 (layer 0) fails its checksum"))
      << s;
  // A slot whose offset plus size wraps past 2^64 is outside the image, not
  // a read before it (fuzz-plan found it).
  s = LoadChanged([](po::PlanDefT &p) { p.ducks[1]->slots[0]->offset = ~0ull; },
                  o);
  EXPECT_TRUE(Has(s, "duck-1.weights' slot 0 (layer 0) fails its checksum"))
      << s;
}

// A shape vector whose elements are not 8-byte aligned (the verifier only
// checks its length word's 4-byte alignment; fuzz-plan found it): built by
// pointing the embedding's shape at a copy of it inside a string.
TEST_F(PlanTest, MisalignedShapeIsRefused) {
  std::unique_ptr<po::PlanDefT> p = Unpack();
  p->compiler = std::string(48, 'x');
  std::vector<uint8_t> b = Packed(*p);
  const po::PlanDef *d = po::GetPlanDef(b.data());
  const po::TensorDef *t = d->ops()->Get(0)->params_as_EmbeddingOpDef()->weight();
  ASSERT_EQ(t->shape()->size(), 2u);
  const int64_t dims[2] = {t->shape()->Get(0), t->shape()->Get(1)};
  const uint8_t *field =
      reinterpret_cast<const flatbuffers::Table *>(t)->GetAddressOf(
          po::TensorDef::VT_SHAPE);
  ASSERT_NE(field, nullptr);
  // A 4-aligned length word whose elements start 4 bytes off 8.
  const uint8_t *str = reinterpret_cast<const uint8_t *>(d->compiler()->data());
  size_t at = (size_t)(str - b.data());
  at = (at + 3) / 4 * 4;
  if (at % 8 != 0)
    at += 4;
  ASSERT_LE(at + 4 + 16, (size_t)(str - b.data()) + 48);
  ASSERT_GT(at, (size_t)(field - b.data())) << "the string lies before the "
                                               "field: no forward offset";
  const uint32_t len = 2;
  std::memcpy(&b[at], &len, 4);
  std::memcpy(&b[at + 4], dims, 16);
  const uint32_t rel = (uint32_t)(at - (size_t)(field - b.data()));
  std::memcpy(&b[field - b.data()], &rel, 4);
  // The patch took: the shape reads the same dims, 4 bytes off 8.
  {
    const po::TensorDef *t2 = po::GetPlanDef(b.data())
                                  ->ops()
                                  ->Get(0)
                                  ->params_as_EmbeddingOpDef()
                                  ->weight();
    ASSERT_EQ(reinterpret_cast<uintptr_t>(t2->shape()->data()) % 8, 4u);
    ASSERT_EQ(t2->shape()->Get(0), dims[0]);
  }
  absl::Status s = LoadBytes(Sealed(b));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s, "ops[0] tensor 'model.embed_tokens.weight' has a "
                     "misaligned shape (a corrupt plan)"))
      << s;
}

// The op contract: every kind of the schema's OpParams union has its
// descriptor in the engine's registry (a kind added to the schema without
// one fails here, not at a user's load), and a plan is only as good as the
// table it is checked against.
TEST(OpKindTableTest, EveryKindOfTheSchemaIsRegistered) {
  const duck::runtime::OpKindTable &kinds = duck::runtime::HostOpKinds();
  for (auto k : pl::EnumValuesOpParams()) {
    if (k == pl::OpParams::NONE) {
      EXPECT_EQ(kinds.Find(k), nullptr);
      continue;
    }
    const duck::runtime::OpKind *d = kinds.Find(k);
    ASSERT_NE(d, nullptr) << pl::EnumNameOpParams(k) << " has no descriptor";
    EXPECT_EQ(d->kind, k);
    EXPECT_NE(d->host_tensors, nullptr) << pl::EnumNameOpParams(k);
    EXPECT_EQ(d->duck_step != nullptr, d->modes_ok != nullptr)
        << pl::EnumNameOpParams(k);
  }
  EXPECT_EQ(kinds.all().size(), std::size(pl::EnumValuesOpParams()) - 1);
  EXPECT_EQ(kinds.Find(pl::OpParams::LmHeadOpDef)->bucket,
            duck::runtime::TimeBucket::kLmHead);
  EXPECT_TRUE(kinds.Find(pl::OpParams::MoeFfnOpDef)->moe);
}

TEST(OpKindTableTest, AKindTheTableLacksIsRefusedAtLoad) {
  const duck::runtime::OpKindTable none({});
  absl::Status s = LoadedPlan::Load(PlanDir("qwen3"), none).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s, "ops[0] has no parameters or an unknown kind")) << s;
}

} // namespace
