// Unit tests for duck-mkmodel: RNG, number formats, safetensors writer,
// sharding, tensor plans, tokenizer.json, option checks and whole-directory
// determinism.

#include "Cli.h"
#include "ConfigJson.h"
#include "ModelSpec.h"
#include "ModelWriter.h"
#include "Quantize.h"
#include "Random.h"
#include "Sampler.h"
#include "TensorPlan.h"
#include "TokenizerJson.h"

#include "duck/Import/SafetensorsWriter.h"
#include "duck_rt/fp9.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Endian.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include "gtest/gtest.h"

#include <cmath>
#include <cstring>
#include <set>

using namespace duck::mkmodel;
using mlir::duck::import::SafetensorsWriter;

namespace {

float bitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::string errorText(llvm::Error e) { return llvm::toString(std::move(e)); }

//===----------------------------------------------------------------------===//
// Random numbers
//===----------------------------------------------------------------------===//

TEST(MkModelRandom, SplitMix64KnownAnswers) {
  // Reference outputs of splitmix64 seeded with 1234567.
  SplitMix64 rng(1234567);
  EXPECT_EQ(rng.next(), 6457827717110365317ull);
  EXPECT_EQ(rng.next(), 3203168211198807973ull);
  EXPECT_EQ(rng.next(), 9817491932198370423ull);
  EXPECT_EQ(rng.next(), 4593380528125082431ull);
  EXPECT_EQ(rng.next(), 16408922859458223821ull);
}

TEST(MkModelRandom, CounterMatchesSequentialStream) {
  for (uint64_t key : {0ull, 42ull, 0xDEADBEEFCAFEull}) {
    SplitMix64 rng(key);
    for (uint64_t i = 0; i < 1000; ++i)
      ASSERT_EQ(counterRandom(key, i), rng.next()) << key << " " << i;
  }
}

TEST(MkModelRandom, StreamKeysDependOnSeedAndName) {
  EXPECT_EQ(streamKey(1, "a.weight"), streamKey(1, "a.weight"));
  EXPECT_NE(streamKey(1, "a.weight"), streamKey(2, "a.weight"));
  EXPECT_NE(streamKey(1, "a.weight"), streamKey(1, "b.weight"));
  EXPECT_NE(streamKey(0, ""), streamKey(0, "x"));
}

TEST(MkModelRandom, BellSampleHasUnitSpread) {
  double sum = 0, sum2 = 0, max_abs = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    float z = bellSample(counterRandom(7, i));
    sum += z;
    sum2 += static_cast<double>(z) * z;
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(z)));
  }
  double mean = sum / n, sd = std::sqrt(sum2 / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sd, 1.0, 0.01);
  EXPECT_LE(max_abs, 3.0);
  EXPECT_GT(max_abs, 2.5);
}

//===----------------------------------------------------------------------===//
// bf16 and E4M3
//===----------------------------------------------------------------------===//

TEST(MkModelQuantize, BF16RoundsToNearestEven) {
  EXPECT_EQ(floatToBF16(1.0f), 0x3F80);
  EXPECT_EQ(floatToBF16(-2.0f), 0xC000);
  // 1 + 2^-8 is halfway between 0x3F80 and 0x3F81: ties to even (0x3F80).
  EXPECT_EQ(floatToBF16(1.0f + 0x1p-8f), 0x3F80);
  // 1 + 3 * 2^-8 is halfway between 0x3F81 and 0x3F82: even is 0x3F82.
  EXPECT_EQ(floatToBF16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(floatToBF16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  uint16_t nan = floatToBF16(std::nanf(""));
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x7F, 0);
}

TEST(MkModelQuantize, E4M3RoundTripsEveryFiniteCode) {
  for (unsigned c = 0; c < 256; ++c) {
    if (duck_e4m3_is_nan(static_cast<uint8_t>(c)))
      continue;
    float v = duck_e4m3_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(encodeE4M3(v), c) << "code " << c << " value " << v;
  }
}

TEST(MkModelQuantize, E4M3TiesGoToTheEvenCode) {
  for (unsigned c = 0; c < 0x7E; ++c) {
    float lo = duck_e4m3_to_f32(static_cast<uint8_t>(c));
    float hi = duck_e4m3_to_f32(static_cast<uint8_t>(c + 1));
    float mid = (lo + hi) / 2; // exact: neighbours differ by one step
    unsigned even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(encodeE4M3(mid), even)
        << "between codes " << c << " and " << c + 1;
    EXPECT_EQ(encodeE4M3(-mid), even | 0x80u);
  }
}

TEST(MkModelQuantize, E4M3PicksTheNearestValue) {
  // Brute force over all positive finite codes for many inputs spread over
  // every binade (and below the subnormals, and beyond 448).
  std::vector<float> table;
  for (unsigned c = 0; c < 0x7F; ++c)
    table.push_back(duck_e4m3_to_f32(static_cast<uint8_t>(c)));
  SplitMix64 rng(99);
  for (int i = 0; i < 200000; ++i) {
    uint64_t r = rng.next();
    // Exponents 2^-12 .. 2^9, random mantissa bits, random sign.
    int exp = static_cast<int>(r % 22) - 12;
    uint32_t mant = static_cast<uint32_t>(r >> 32) & 0x7FFFFFu;
    float x = bitsToFloat((static_cast<uint32_t>(exp + 127) << 23) | mant);
    if (r & (1ull << 20))
      x = -x;
    uint8_t code = encodeE4M3(x);
    ASSERT_FALSE(duck_e4m3_is_nan(code)) << x;
    float a = std::fabs(x);
    unsigned best = 0;
    for (unsigned c = 1; c < table.size(); ++c) {
      float d = std::fabs(table[c] - a), db = std::fabs(table[best] - a);
      if (d < db || (d == db && c % 2 == 0))
        best = c;
    }
    ASSERT_EQ(code & 0x7Fu, best) << "x = " << x;
    ASSERT_EQ(code >> 7, x < 0 ? 1u : 0u) << "x = " << x;
  }
}

TEST(MkModelQuantize, E4M3SaturatesAndNeverEmitsNaN) {
  EXPECT_EQ(encodeE4M3(448.0f), 0x7E);
  EXPECT_EQ(encodeE4M3(463.9f), 0x7E);
  EXPECT_EQ(encodeE4M3(464.0f), 0x7E);
  EXPECT_EQ(encodeE4M3(1e6f), 0x7E);
  EXPECT_EQ(encodeE4M3(INFINITY), 0x7E);
  EXPECT_EQ(encodeE4M3(-INFINITY), 0xFE);
  EXPECT_EQ(encodeE4M3(-0.0f), 0x80);
  EXPECT_EQ(encodeE4M3(0x1p-10f), 0x00); // half the smallest subnormal: even
  EXPECT_EQ(encodeE4M3(0x1p-10f + 0x1p-20f), 0x01);
  EXPECT_EQ(encodeE4M3(0x1p-9f), 0x01); // smallest subnormal
}

TEST(MkModelQuantize, BandScalesMapEachTileMaxTo448) {
  const int64_t rows = 100, cols = 300; // partial tiles in both directions
  std::vector<float> band(rows * cols);
  SplitMix64 rng(5);
  for (float &v : band)
    v = bellSample(rng.next()) * 0.01f;
  band[7 * cols + 200] = 0.5f; // tile 1 has a clear maximum
  std::vector<float> scales(3);
  computeBandScales(band.data(), rows, cols, scales.data());
  EXPECT_EQ(scales[1], 0.5f / 448.0f);
  std::vector<uint8_t> codes(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    quantizeRowE4M3(&band[r * cols], cols, scales.data(), &codes[r * cols]);
  EXPECT_EQ(codes[7 * cols + 200], 0x7E);
  for (int64_t t = 0; t < 3; ++t) {
    unsigned max_code = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = t * 128; c < std::min<int64_t>(cols, (t + 1) * 128); ++c)
        max_code = std::max<unsigned>(max_code, codes[r * cols + c] & 0x7F);
    EXPECT_EQ(max_code, 0x7Eu) << "tile " << t;
  }
  // Dequantised values are within half a step (2^-4 relative, or the
  // subnormal step) of the originals.
  for (int64_t i = 0; i < rows * cols; ++i) {
    float s = scales[(i % cols) / 128];
    float back = duck_e4m3_to_f32(codes[i]) * s;
    float tol = std::max(std::fabs(band[i]) * 0x1p-4f, s * 0x1p-10f) * 1.0001f;
    ASSERT_LE(std::fabs(back - band[i]), tol) << i;
  }
  EXPECT_EQ(fp8TileScale(0.0f), 1.0f);
}

//===----------------------------------------------------------------------===//
// Safetensors writer
//===----------------------------------------------------------------------===//

struct WrittenFile {
  uint64_t header_size;
  std::string header;
  std::string data;
};

WrittenFile splitFile(const std::string &bytes) {
  WrittenFile f;
  f.header_size = llvm::support::endian::read64le(bytes.data());
  f.header = bytes.substr(8, f.header_size);
  f.data = bytes.substr(8 + f.header_size);
  return f;
}

TEST(MkModelSafetensorsWriter, LayoutSortsByAlignmentThenName) {
  SafetensorsWriter w;
  ASSERT_FALSE(errorText(w.addTensor("b.f8", "F8_E4M3", {3, 3})).size());
  ASSERT_FALSE(errorText(w.addTensor("z.bf16", "BF16", {5})).size());
  ASSERT_FALSE(errorText(w.addTensor("a.bf16", "BF16", {1})).size());
  ASSERT_FALSE(errorText(w.addTensor("s.f32", "F32", {2, 1})).size());
  ASSERT_FALSE(errorText(w.addTensor("empty", "F32", {0, 4})).size());
  ASSERT_FALSE(errorText(w.finalizeLayout()).size());

  std::vector<std::string> order;
  for (const auto &e : w.entries())
    order.push_back(e.name);
  EXPECT_EQ(order, (std::vector<std::string>{"empty", "s.f32", "a.bf16",
                                             "z.bf16", "b.f8"}));
  const auto *s = w.lookup("s.f32");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->begin, 0u);
  EXPECT_EQ(s->end, 8u);
  EXPECT_EQ(w.lookup("a.bf16")->begin, 8u);
  EXPECT_EQ(w.lookup("z.bf16")->begin, 10u);
  EXPECT_EQ(w.lookup("b.f8")->begin, 20u);
  EXPECT_EQ(w.dataSize(), 29u);
  EXPECT_EQ(w.header().size() % 8, 0u);
  EXPECT_EQ(w.fileSize(), 8 + w.header().size() + 29);

  std::string bytes;
  llvm::raw_string_ostream os(bytes);
  ASSERT_FALSE(errorText(w.writeHeader(os)).size());
  // Empty tensors need no call; chunks may split a tensor anywhere.
  std::vector<uint8_t> f32(8, 0x11), bf(2, 0x22), z(10, 0x33), f8(9, 0x44);
  ASSERT_FALSE(errorText(w.writeTensorData("s.f32", {f32.data(), 3})).size());
  ASSERT_FALSE(
      errorText(w.writeTensorData("s.f32", {f32.data() + 3, 5})).size());
  ASSERT_FALSE(errorText(w.writeTensorData("a.bf16", bf)).size());
  ASSERT_FALSE(errorText(w.writeTensorData("z.bf16", z)).size());
  ASSERT_FALSE(errorText(w.writeTensorData("b.f8", f8)).size());
  ASSERT_FALSE(errorText(w.finish()).size());
  os.flush();

  WrittenFile file = splitFile(bytes);
  EXPECT_EQ(file.header_size, w.header().size());
  EXPECT_EQ((8 + file.header_size) % 8, 0u);
  EXPECT_EQ(file.data.size(), 29u);
  EXPECT_EQ(file.data.substr(20), std::string(9, 0x44));
  llvm::StringRef json = llvm::StringRef(file.header).rtrim(' ');
  EXPECT_EQ(json.front(), '{');
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(json);
  ASSERT_TRUE(bool(parsed)) << llvm::toString(parsed.takeError());
  const llvm::json::Object *root = parsed->getAsObject();
  ASSERT_TRUE(root);
  EXPECT_EQ(root->getObject("__metadata__")->getString("format"),
            llvm::StringRef("pt"));
  const llvm::json::Object *f8e = root->getObject("b.f8");
  ASSERT_TRUE(f8e);
  EXPECT_EQ(f8e->getString("dtype"), llvm::StringRef("F8_E4M3"));
  EXPECT_EQ(*f8e->getArray("data_offsets"), (llvm::json::Array{20, 29}));
  EXPECT_EQ(*f8e->getArray("shape"), (llvm::json::Array{3, 3}));
  EXPECT_EQ(*root->getObject("empty")->getArray("data_offsets"),
            (llvm::json::Array{0, 0}));
}

TEST(MkModelSafetensorsWriter, RejectsBadDeclarations) {
  SafetensorsWriter w;
  ASSERT_FALSE(errorText(w.addTensor("x", "BF16", {2})).size());
  EXPECT_NE(errorText(w.addTensor("x", "BF16", {2})).find("duplicate"),
            std::string::npos);
  EXPECT_NE(errorText(w.addTensor("y", "BF17", {2})).find("unknown dtype"),
            std::string::npos);
  EXPECT_NE(errorText(w.addTensor("y", "F32", {-1})).find("negative"),
            std::string::npos);
  EXPECT_NE(errorText(w.addTensor("__metadata__", "F32", {1}))
                .find("invalid tensor name"),
            std::string::npos);
  EXPECT_EQ(SafetensorsWriter::elementSize("F8_E4M3"), 1u);
  EXPECT_EQ(SafetensorsWriter::elementSize("I64"), 8u);
  EXPECT_EQ(SafetensorsWriter::elementSize("nope"), 0u);
}

TEST(MkModelSafetensorsWriter, ChecksByteCountsAndOrder) {
  auto make = [](SafetensorsWriter &w, std::string &bytes,
                 llvm::raw_string_ostream &os) {
    (void)bytes;
    ASSERT_FALSE(errorText(w.addTensor("a", "F32", {2})).size());
    ASSERT_FALSE(errorText(w.addTensor("b", "F32", {1})).size());
    ASSERT_FALSE(errorText(w.finalizeLayout()).size());
    ASSERT_FALSE(errorText(w.writeHeader(os)).size());
  };
  std::vector<uint8_t> four(4), twelve(12);
  {
    SafetensorsWriter w;
    std::string bytes;
    llvm::raw_string_ostream os(bytes);
    make(w, bytes, os);
    std::string e = errorText(w.writeTensorData("a", twelve));
    EXPECT_NE(e.find("'a' is long"), std::string::npos) << e;
  }
  {
    SafetensorsWriter w;
    std::string bytes;
    llvm::raw_string_ostream os(bytes);
    make(w, bytes, os);
    ASSERT_FALSE(errorText(w.writeTensorData("a", four)).size());
    std::string e = errorText(w.writeTensorData("b", four));
    EXPECT_NE(e.find("'a' is short: 4 of 8"), std::string::npos) << e;
  }
  {
    SafetensorsWriter w;
    std::string bytes;
    llvm::raw_string_ostream os(bytes);
    make(w, bytes, os);
    std::string e = errorText(w.writeTensorData("b", four));
    EXPECT_NE(e.find("out of order (expected 'a')"), std::string::npos) << e;
  }
  {
    SafetensorsWriter w;
    std::string bytes;
    llvm::raw_string_ostream os(bytes);
    make(w, bytes, os);
    ASSERT_FALSE(errorText(w.writeTensorData("a", {twelve.data(), 8})).size());
    std::string e = errorText(w.finish());
    EXPECT_NE(e.find("'b' is short: 0 of 4"), std::string::npos) << e;
  }
  {
    SafetensorsWriter w;
    std::string bytes;
    llvm::raw_string_ostream os(bytes);
    make(w, bytes, os);
    std::string e = errorText(w.writeTensorData("c", four));
    EXPECT_NE(e.find("unknown tensor 'c'"), std::string::npos) << e;
  }
}

//===----------------------------------------------------------------------===//
// Sharding, plans, configs
//===----------------------------------------------------------------------===//

TEST(MkModelShards, SplitsIntoNonEmptyBalancedRuns) {
  std::vector<uint64_t> units = {100, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10};
  for (unsigned n = 1; n <= units.size(); ++n) {
    std::vector<unsigned> shard = assignShards(units, n);
    ASSERT_EQ(shard.size(), units.size());
    EXPECT_EQ(shard.front(), 0u);
    EXPECT_EQ(shard.back(), n - 1);
    for (size_t i = 1; i < shard.size(); ++i) {
      EXPECT_GE(shard[i], shard[i - 1]);
      EXPECT_LE(shard[i], shard[i - 1] + 1); // no shard skipped (empty)
    }
  }
  // Two shards of 200 equal units split in the middle.
  std::vector<uint64_t> even(200, 7);
  std::vector<unsigned> two = assignShards(even, 2);
  EXPECT_EQ(std::count(two.begin(), two.end(), 0u), 100);
  EXPECT_EQ(shardFileName(1, 1), "model.safetensors");
  EXPECT_EQ(shardFileName(2, 12), "model-00002-of-00012.safetensors");
}

TEST(MkModelPlan, QwenTiedHasNoLmHeadAndFp8HasScales) {
  ModelSpec spec = findPreset("tiny-qwen3")->make();
  ASSERT_FALSE(errorText(validateSpec(spec)).size());
  std::vector<PlannedTensor> plan = planTensors(spec);
  EXPECT_EQ(plan.size(), 1 + 11 * 2 + 1u);
  for (const PlannedTensor &t : plan) {
    EXPECT_NE(t.name, "lm_head.weight");
    EXPECT_EQ(t.dtype, "BF16");
  }
  spec.format = WeightFormat::FP8;
  spec.tie_embeddings = false;
  spec.hidden = 320; // partial K tiles
  plan = planTensors(spec);
  std::map<std::string, const PlannedTensor *> byName;
  for (const PlannedTensor &t : plan)
    byName[t.name] = &t;
  ASSERT_TRUE(byName.count("lm_head.weight"));
  EXPECT_EQ(byName["lm_head.weight"]->dtype, "BF16");
  EXPECT_EQ(byName["model.embed_tokens.weight"]->dtype, "BF16");
  const PlannedTensor *q = byName["model.layers.1.self_attn.q_proj.weight"];
  ASSERT_TRUE(q);
  EXPECT_EQ(q->dtype, "F8_E4M3");
  EXPECT_EQ(q->shape, (std::vector<int64_t>{256, 320}));
  const PlannedTensor *qs =
      byName["model.layers.1.self_attn.q_proj.weight_scale_inv"];
  ASSERT_TRUE(qs);
  EXPECT_EQ(qs->dtype, "F32");
  EXPECT_EQ(qs->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(&plan[qs->partner], q);
  EXPECT_EQ(byName["model.layers.0.self_attn.q_norm.weight"]->dtype, "BF16");
}

TEST(MkModelPlan, DeepseekV32HasIndexerSharedExpertsAndRouterBias) {
  ModelSpec spec = findPreset("tiny-deepseek")->make();
  spec.format = WeightFormat::FP8;
  std::map<std::string, PlannedTensor> byName;
  for (PlannedTensor &t : planTensors(spec))
    byName[t.name] = t;
  auto has = [&](const std::string &n) { return byName.count(n) != 0; };
  // Layer 0 is dense, layers 1-2 are MoE.
  EXPECT_TRUE(has("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_FALSE(has("model.layers.0.mlp.gate.weight"));
  EXPECT_EQ(byName["model.layers.1.mlp.gate.weight"].dtype, "BF16");
  EXPECT_EQ(byName["model.layers.1.mlp.gate.weight"].shape,
            (std::vector<int64_t>{16, 256}));
  EXPECT_EQ(byName["model.layers.1.mlp.gate.e_score_correction_bias"].dtype,
            "F32");
  EXPECT_EQ(byName["model.layers.2.mlp.experts.15.down_proj.weight"].shape,
            (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(byName["model.layers.2.mlp.shared_experts.up_proj.weight"].dtype,
            "F8_E4M3");
  EXPECT_EQ(byName["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].shape,
            (std::vector<int64_t>{160, 256}));
  EXPECT_EQ(
      byName["model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"]
          .shape,
      (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(byName["model.layers.0.self_attn.q_b_proj.weight"].shape,
            (std::vector<int64_t>{4 * 64, 128}));
  EXPECT_EQ(byName["model.layers.0.self_attn.kv_b_proj.weight"].shape,
            (std::vector<int64_t>{4 * 64, 128}));
  EXPECT_EQ(byName["model.layers.0.self_attn.o_proj.weight"].shape,
            (std::vector<int64_t>{256, 4 * 32}));
  EXPECT_EQ(byName["model.layers.2.self_attn.indexer.wq_b.weight"].dtype,
            "F8_E4M3");
  EXPECT_EQ(
      byName["model.layers.2.self_attn.indexer.weights_proj.weight"].dtype,
      "BF16");
  EXPECT_TRUE(has("model.layers.2.self_attn.indexer.k_norm.bias"));
  EXPECT_FALSE(
      has("model.layers.2.self_attn.indexer.weights_proj.weight_scale_inv"));
  spec.family = Family::DeepseekV3;
  for (PlannedTensor &t : planTensors(spec))
    EXPECT_EQ(t.name.find("indexer"), std::string::npos) << t.name;
}

TEST(MkModelPlan, DeepseekMtpModuleComesLastWithCopiedHead) {
  ModelSpec spec = findPreset("tiny-deepseek")->make();
  spec.format = WeightFormat::FP8;
  std::vector<PlannedTensor> without = planTensors(spec);
  spec.mtp_layers = 1;
  std::vector<PlannedTensor> plan = planTensors(spec);
  // The main model's tensors come first, unchanged; then layer 3's.
  ASSERT_GT(plan.size(), without.size());
  for (size_t i = 0; i < without.size(); ++i)
    EXPECT_EQ(plan[i].name, without[i].name);
  std::map<std::string, const PlannedTensor *> byName;
  for (size_t i = without.size(); i < plan.size(); ++i) {
    EXPECT_EQ(plan[i].name.rfind("model.layers.3.", 0), 0u) << plan[i].name;
    byName[plan[i].name] = &plan[i];
  }
  for (const char *n :
       {"input_layernorm.weight", "mlp.gate.weight",
        "mlp.shared_experts.down_proj.weight", "self_attn.indexer.wk.weight",
        "enorm.weight", "hnorm.weight", "shared_head.norm.weight"})
    EXPECT_TRUE(byName.count(std::string("model.layers.3.") + n)) << n;
  const PlannedTensor *eh = byName["model.layers.3.eh_proj.weight"];
  ASSERT_TRUE(eh);
  EXPECT_EQ(eh->dtype, "F8_E4M3");
  EXPECT_EQ(eh->shape, (std::vector<int64_t>{256, 512}));
  EXPECT_EQ(byName["model.layers.3.eh_proj.weight_scale_inv"]->shape,
            (std::vector<int64_t>{2, 4}));
  // The head and the embedding draw the values of lm_head and the model's.
  const PlannedTensor *head = byName["model.layers.3.shared_head.head.weight"];
  const PlannedTensor *emb = byName["model.layers.3.embed_tokens.weight"];
  ASSERT_TRUE(head && emb);
  const PlannedTensor *lm = nullptr;
  for (const PlannedTensor &t : without)
    if (t.name == "lm_head.weight")
      lm = &t;
  ASSERT_TRUE(lm);
  TensorSampler a(5, *head), b(5, *lm), e(5, *emb), m(5, without[0]);
  for (int64_t r : {0, 17, 1023})
    for (int64_t c : {0, 100, 255}) {
      EXPECT_EQ(a.at(r, c), b.at(r, c));
      EXPECT_EQ(e.at(r, c), m.at(r, c));
    }
  EXPECT_NE(a.at(1, 2) + a.at(3, 4), e.at(1, 2) + e.at(3, 4));
}

TEST(MkModelSampler, ChunkingDoesNotChangeValues) {
  ModelSpec spec = findPreset("tiny-qwen3")->make();
  std::vector<PlannedTensor> plan = planTensors(spec);
  const PlannedTensor *w = nullptr;
  for (const PlannedTensor &t : plan)
    if (t.name == "model.layers.0.mlp.down_proj.weight")
      w = &t;
  ASSERT_TRUE(w);
  TensorSampler a(3, *w), b(3, *w), other(4, *w);
  std::vector<float> whole(10 * a.cols()), part(3 * a.cols());
  a.fillRows(100, 10, whole.data());
  b.fillRows(105, 3, part.data());
  for (int64_t c = 0; c < a.cols(); ++c) {
    ASSERT_EQ(part[c], whole[5 * a.cols() + c]);
    ASSERT_EQ(a.at(107, c), whole[7 * a.cols() + c]);
  }
  EXPECT_NE(other.at(100, 0) + other.at(100, 1), whole[0] + whole[1]);
  // Exact zeros and tiny values occur in Linear weights.
  std::vector<float> all(a.rows() * a.cols());
  a.fillRows(0, a.rows(), all.data());
  size_t zeros = std::count(all.begin(), all.end(), 0.0f);
  EXPECT_GT(zeros, all.size() / 2048);
  EXPECT_LT(zeros, all.size() / 512);
}

TEST(MkModelConfig, PythonFloatFormatting) {
  EXPECT_EQ(formatPythonFloat(1e-6), "1e-06");
  EXPECT_EQ(formatPythonFloat(0.02), "0.02");
  EXPECT_EQ(formatPythonFloat(0.001), "0.001");
  EXPECT_EQ(formatPythonFloat(1000000.0), "1000000.0");
  EXPECT_EQ(formatPythonFloat(2.5), "2.5");
  EXPECT_EQ(formatPythonFloat(0.0), "0.0");
  EXPECT_EQ(formatPythonFloat(1.0), "1.0");
  EXPECT_EQ(formatPythonFloat(1e16), "1e+16");
  EXPECT_EQ(formatPythonFloat(-1.5e-7), "-1.5e-07");
  EXPECT_EQ(formatPythonFloat(0.1), "0.1");
  EXPECT_EQ(formatPythonFloat(123.456), "123.456");
}

TEST(MkModelConfig, ConfigParsesAndCarriesQuantization) {
  ModelSpec spec = findPreset("tiny-qwen3-moe")->make();
  spec.format = WeightFormat::FP8;
  spec.dense_layers = 1;
  llvm::Expected<llvm::json::Value> v =
      llvm::json::parse(renderConfigJson(spec));
  ASSERT_TRUE(bool(v)) << llvm::toString(v.takeError());
  const llvm::json::Object &c = *v->getAsObject();
  EXPECT_EQ(c.getString("model_type"), llvm::StringRef("qwen3_moe"));
  EXPECT_EQ(c.getInteger("num_experts"), 16);
  EXPECT_EQ(*c.getArray("mlp_only_layers"), (llvm::json::Array{0}));
  const llvm::json::Object *q = c.getObject("quantization_config");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->getString("quant_method"), llvm::StringRef("fp8"));
  EXPECT_EQ(*q->getArray("weight_block_size"), (llvm::json::Array{128, 128}));
  EXPECT_EQ(c.getBoolean("tie_word_embeddings"), false);
}

//===----------------------------------------------------------------------===//
// tokenizer.json
//===----------------------------------------------------------------------===//

TEST(MkModelTokenizer, ByteTokensFollowTheGpt2Table) {
  EXPECT_EQ(byteToken('!'), "!");
  EXPECT_EQ(byteToken('a'), "a");
  EXPECT_EQ(byteToken(0x00), "\u0100");
  EXPECT_EQ(byteToken(0x0A), "\u010A"); // Ċ
  EXPECT_EQ(byteToken(0x20), "\u0120"); // Ġ
  EXPECT_EQ(byteToken(0x7F), "\u0121");
  EXPECT_EQ(byteToken(0xA0), "\u0142");
  EXPECT_EQ(byteToken(0xA1), "\u00A1");
  EXPECT_EQ(byteToken(0xAD), "\u0143");
  EXPECT_EQ(byteToken(0xFF), "\u00FF");
  std::set<std::string> all;
  for (unsigned b = 0; b < 256; ++b)
    all.insert(byteToken(static_cast<uint8_t>(b)));
  EXPECT_EQ(all.size(), 256u);
  EXPECT_EQ(bytesToTokenText(" the\n"), "\u0120the\u010A");
}

TEST(MkModelTokenizer, PretokenizerFollowsTheQwenRegex) {
  std::string text = "Hello world's  end\n\n 42!  \tx, (ok)?\n";
  std::vector<std::string> pieces = pretokenize(text);
  std::vector<std::string> expected = {
      "Hello", " world", "'s", " ",   " end", "\n\n", " ",  "4",
      "2",     "!",      "  ", "\tx", ",",    " (",   "ok", ")?\n"};
  EXPECT_EQ(pieces, expected);
  std::string joined;
  for (const std::string &p : pretokenize(trainingText()))
    joined += p;
  EXPECT_EQ(joined, trainingText().str());
}

TEST(MkModelTokenizer, VocabHasExactSizeBytesMergesAndNoDuplicates) {
  for (int64_t vocab : {259, 260, 300, 512, 1024, 5000}) {
    SCOPED_TRACE(vocab);
    BpeVocab v = buildBpeVocab(vocab);
    ASSERT_EQ(static_cast<int64_t>(v.tokens.size()), vocab - 3);
    ASSERT_EQ(static_cast<int64_t>(v.merges.size()), vocab - 259);
    for (unsigned b = 0; b < 256; ++b)
      ASSERT_EQ(v.tokens[b], std::string(1, static_cast<char>(b)));
    std::set<std::string> unique(v.tokens.begin(), v.tokens.end());
    EXPECT_EQ(unique.size(), v.tokens.size());
    for (llvm::StringRef special : specialTokens())
      EXPECT_FALSE(unique.count(special.str()));
    for (size_t i = 0; i < v.merges.size(); ++i) {
      auto [a, b] = v.merges[i];
      // Both parts exist before the merge; the result is the next id.
      ASSERT_LT(static_cast<size_t>(a), 256 + i);
      ASSERT_LT(static_cast<size_t>(b), 256 + i);
      ASSERT_EQ(v.tokens[256 + i], v.tokens[a] + v.tokens[b]) << i;
    }
  }
  // The tiny presets' vocabularies are learned from the text entirely.
  BpeVocab tiny = buildBpeVocab(1024);
  EXPECT_EQ(tiny.learned_merges, tiny.merges.size());
  std::set<std::string> words(tiny.tokens.begin(), tiny.tokens.end());
  EXPECT_TRUE(words.count(" duck"));
  EXPECT_TRUE(words.count(" compiler"));
  EXPECT_LT(buildBpeVocab(5000).learned_merges, 4741u);
}

TEST(MkModelTokenizer, TokenizerJsonParsesWithTheQwen2Pipeline) {
  const int64_t vocab = 1024;
  std::string text = renderTokenizerJson(vocab);
  EXPECT_EQ(text, renderTokenizerJson(vocab));
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(text);
  ASSERT_TRUE(bool(parsed)) << llvm::toString(parsed.takeError());
  const llvm::json::Object &root = *parsed->getAsObject();
  auto typeOf = [](const llvm::json::Object *o) {
    return o ? o->getString("type").value_or("") : llvm::StringRef("<none>");
  };
  EXPECT_EQ(typeOf(root.getObject("normalizer")), "NFC");
  EXPECT_EQ(typeOf(root.getObject("decoder")), "ByteLevel");
  EXPECT_EQ(typeOf(root.getObject("post_processor")), "ByteLevel");
  const llvm::json::Object *pre = root.getObject("pre_tokenizer");
  ASSERT_EQ(typeOf(pre), "Sequence");
  const llvm::json::Array *steps = pre->getArray("pretokenizers");
  ASSERT_TRUE(steps && steps->size() == 2);
  const llvm::json::Object *split = (*steps)[0].getAsObject();
  EXPECT_EQ(typeOf(split), "Split");
  EXPECT_EQ(
      split->getObject("pattern")->getString("Regex"),
      llvm::StringRef(
          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"));
  EXPECT_EQ(split->getString("behavior"), llvm::StringRef("Isolated"));
  EXPECT_EQ(split->getBoolean("invert"), false);
  const llvm::json::Object *byte_level = (*steps)[1].getAsObject();
  EXPECT_EQ(typeOf(byte_level), "ByteLevel");
  EXPECT_EQ(byte_level->getBoolean("add_prefix_space"), false);
  EXPECT_EQ(byte_level->getBoolean("use_regex"), false);

  const llvm::json::Object *model = root.getObject("model");
  ASSERT_EQ(typeOf(model), "BPE");
  EXPECT_EQ(model->getString("continuing_subword_prefix"), llvm::StringRef(""));
  EXPECT_EQ(model->getString("end_of_word_suffix"), llvm::StringRef(""));
  EXPECT_EQ(model->getBoolean("fuse_unk"), false);
  EXPECT_EQ(model->getBoolean("byte_fallback"), false);
  EXPECT_EQ(model->getBoolean("ignore_merges"), false);
  ASSERT_TRUE(model->get("dropout") && model->get("dropout")->getAsNull());
  ASSERT_TRUE(model->get("unk_token") && model->get("unk_token")->getAsNull());

  // Vocab: the byte tokens by byte, then one id per merge.
  const llvm::json::Object *vocab_map = model->getObject("vocab");
  ASSERT_TRUE(vocab_map);
  EXPECT_EQ(static_cast<int64_t>(vocab_map->size()), vocab - 3);
  llvm::StringMap<int64_t> ids;
  std::set<int64_t> seen;
  for (const auto &[key, value] : *vocab_map) {
    ASSERT_TRUE(value.getAsInteger());
    ids[key.str()] = *value.getAsInteger();
    seen.insert(*value.getAsInteger());
  }
  EXPECT_EQ(seen.size(), vocab_map->size());
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), vocab - 4);
  for (unsigned b = 0; b < 256; ++b)
    EXPECT_EQ(ids.lookup(byteToken(static_cast<uint8_t>(b))), b) << b;
  const llvm::json::Array *merges = model->getArray("merges");
  ASSERT_TRUE(merges);
  ASSERT_EQ(static_cast<int64_t>(merges->size()), vocab - 259);
  for (size_t i = 0; i < merges->size(); ++i) {
    std::optional<llvm::StringRef> merge = (*merges)[i].getAsString();
    ASSERT_TRUE(merge);
    auto [left, right] = merge->split(' ');
    ASSERT_FALSE(right.empty() || right.contains(' ')) << merge->str();
    ASSERT_TRUE(ids.count(left) && ids.count(right)) << merge->str();
    EXPECT_LT(ids.lookup(left), static_cast<int64_t>(256 + i));
    EXPECT_LT(ids.lookup(right), static_cast<int64_t>(256 + i));
    EXPECT_EQ(ids.lookup((left + right).str()), static_cast<int64_t>(256 + i))
        << merge->str();
  }

  // The specials are the last three ids.
  const llvm::json::Array *added = root.getArray("added_tokens");
  ASSERT_TRUE(added && added->size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    const llvm::json::Object *t = (*added)[i].getAsObject();
    ASSERT_TRUE(t);
    EXPECT_EQ(t->getInteger("id"), vocab - 3 + static_cast<int64_t>(i));
    EXPECT_EQ(t->getString("content"), specialTokens()[i]);
    EXPECT_EQ(t->getBoolean("special"), true);
    EXPECT_EQ(t->getBoolean("normalized"), false);
    EXPECT_EQ(t->getBoolean("single_word"), false);
    EXPECT_EQ(t->getBoolean("lstrip"), false);
    EXPECT_EQ(t->getBoolean("rstrip"), false);
    EXPECT_FALSE(ids.count(specialTokens()[i]));
  }
  EXPECT_EQ(specialTokens()[0], "<|endoftext|>");
  EXPECT_EQ(specialTokens()[1], "<|im_start|>");
  EXPECT_EQ(specialTokens()[2], "<|im_end|>");
}

TEST(MkModelTokenizer, ConfigIdsMatchTheSpecialTokens) {
  for (const char *preset : {"tiny-qwen3", "tiny-qwen3-moe", "tiny-deepseek"}) {
    SCOPED_TRACE(preset);
    ModelSpec spec = findPreset(preset)->make();
    int64_t eot = spec.vocab - 3, im_end = spec.vocab - 1;
    llvm::Expected<llvm::json::Value> config =
        llvm::json::parse(renderConfigJson(spec));
    ASSERT_TRUE(bool(config)) << llvm::toString(config.takeError());
    EXPECT_EQ(config->getAsObject()->getInteger("bos_token_id"), eot);
    EXPECT_EQ(config->getAsObject()->getInteger("eos_token_id"), eot);
    llvm::Expected<llvm::json::Value> gen =
        llvm::json::parse(renderGenerationConfig(spec));
    ASSERT_TRUE(bool(gen)) << llvm::toString(gen.takeError());
    EXPECT_EQ(gen->getAsObject()->getInteger("bos_token_id"), eot);
    EXPECT_EQ(*gen->getAsObject()->getArray("eos_token_id"),
              (llvm::json::Array{eot, im_end}));
    llvm::Expected<llvm::json::Value> tc =
        llvm::json::parse(renderTokenizerConfig(spec));
    ASSERT_TRUE(bool(tc)) << llvm::toString(tc.takeError());
    const llvm::json::Object &o = *tc->getAsObject();
    EXPECT_EQ(o.getString("eos_token"), llvm::StringRef("<|endoftext|>"));
    EXPECT_EQ(o.getString("pad_token"), llvm::StringRef("<|endoftext|>"));
    const llvm::json::Object *decoder = o.getObject("added_tokens_decoder");
    ASSERT_TRUE(decoder);
    for (int64_t i = 0; i < 3; ++i) {
      const llvm::json::Object *t = decoder->getObject(std::to_string(eot + i));
      ASSERT_TRUE(t) << eot + i;
      EXPECT_EQ(t->getString("content"), specialTokens()[i]);
    }
    EXPECT_NE(o.getString("chat_template").value_or("").find("<|im_start|>"),
              llvm::StringRef::npos);
  }
}

//===----------------------------------------------------------------------===//
// Command line
//===----------------------------------------------------------------------===//

std::string parseError(std::vector<std::string> args) {
  llvm::Expected<CliRequest> r = parseCommandLine(args);
  if (r)
    return "";
  return llvm::toString(r.takeError());
}

TEST(MkModelCli, PresetsValidateAndOptionsOverride) {
  for (const PresetInfo &p : presets())
    EXPECT_FALSE(errorText(validateSpec(p.make())).size()) << p.name;
  llvm::Expected<CliRequest> r = parseCommandLine(
      {"--preset", "tiny-qwen3", "--hidden=512", "--layers", "3", "-o", "x",
       "--dtype", "fp8", "--seed", "0x10", "--no-tie-embeddings"});
  ASSERT_TRUE(bool(r)) << llvm::toString(r.takeError());
  EXPECT_EQ(r->spec.hidden, 512);
  EXPECT_EQ(r->spec.layers, 3);
  EXPECT_EQ(r->spec.heads, 4); // from the preset
  EXPECT_EQ(r->spec.seed, 16u);
  EXPECT_TRUE(r->spec.isFp8());
  EXPECT_FALSE(r->spec.tie_embeddings);
  EXPECT_EQ(r->write.out_dir, "x");
}

TEST(MkModelCli, ErrorsNameTheOption) {
  EXPECT_NE(parseError({"--preset", "tiny-qwen3", "--hidden", "100", "-o", "x"})
                .find("--hidden (100) must be a multiple of 32"),
            std::string::npos);
  EXPECT_NE(parseError({"--preset", "tiny-qwen3", "--kv-heads", "3", "-o", "x"})
                .find("--kv-heads (3) must divide --heads (4)"),
            std::string::npos);
  EXPECT_NE(parseError({"--preset", "tiny-qwen3", "--q-lora", "64", "-o", "x"})
                .find("--q-lora does not apply to family qwen3"),
            std::string::npos);
  EXPECT_NE(parseError({"--preset", "tiny-qwen3", "--layers", "abc", "-o", "x"})
                .find("--layers expects an integer"),
            std::string::npos);
  EXPECT_NE(parseError({"--preset", "tiny-qwen3"}).find("-o DIR"),
            std::string::npos);
  EXPECT_NE(parseError({"--preset", "nope", "-o", "x"})
                .find("unknown --preset 'nope'"),
            std::string::npos);
  EXPECT_NE(
      parseError({"--preset", "tiny-deepseek", "--family", "qwen3", "-o", "x"})
          .find("does not fit --preset"),
      std::string::npos);
  EXPECT_NE(
      parseError({"--preset", "tiny-deepseek", "--n-group", "3", "-o", "x"})
          .find("--n-group (3) must divide --experts (16)"),
      std::string::npos);
  EXPECT_NE(parseError({"--family", "qwen3_moe", "--top-k", "17", "-o", "x"})
                .find("--top-k (17) must not exceed --experts (16)"),
            std::string::npos);
  EXPECT_NE(parseError({"--preset", "tiny-qwen3", "--vocab", "258", "-o", "x"})
                .find("--vocab (258) must be at least 259"),
            std::string::npos);
  EXPECT_EQ(parseError({"--preset", "tiny-qwen3", "--vocab", "259", "-o", "x"}),
            "");
  EXPECT_NE(parseError({"--bogus"}).find("unknown option '--bogus'"),
            std::string::npos);
  EXPECT_NE(parseError({}).find("--preset or --family"), std::string::npos);
}

//===----------------------------------------------------------------------===//
// Whole directories
//===----------------------------------------------------------------------===//

class MkModelDirTest : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_FALSE(
        llvm::sys::fs::createUniqueDirectory("duck-mkmodel-test", root_));
  }
  void TearDown() override { llvm::sys::fs::remove_directories(root_); }

  std::string path(llvm::StringRef a, llvm::StringRef b = "") {
    llvm::SmallString<256> p(root_);
    llvm::sys::path::append(p, a, b);
    return std::string(p);
  }
  static std::string slurp(const std::string &p) {
    auto buf = llvm::MemoryBuffer::getFile(p);
    return buf ? (*buf)->getBuffer().str() : std::string("<missing>");
  }
  llvm::Expected<WriteSummary> write(const ModelSpec &spec, std::string out,
                                     unsigned shards = 1, bool force = false) {
    WriteOptions opts;
    opts.out_dir = std::move(out);
    opts.shards = shards;
    opts.force = force;
    opts.quiet = true;
    return writeModelDirectory(spec, opts, llvm::nulls(), false);
  }

  llvm::SmallString<256> root_;
};

TEST_F(MkModelDirTest, DeterministicShardedAndAtomic) {
  ModelSpec spec = findPreset("tiny-deepseek")->make();
  spec.format = WeightFormat::FP8;
  spec.seed = 9;
  auto a = write(spec, path("a"), 3);
  ASSERT_TRUE(bool(a)) << llvm::toString(a.takeError());
  auto b = write(spec, path("b"), 3);
  ASSERT_TRUE(bool(b)) << llvm::toString(b.takeError());
  // 3 shards, index, config, generation config, tokenizer and its config.
  EXPECT_EQ(a->files.size(), 8u);
  for (const std::string &f : a->files)
    EXPECT_EQ(slurp(path("a", f)), slurp(path("b", f))) << f;

  // One shard holds exactly the same tensors with the same bytes.
  auto one = write(spec, path("one"));
  ASSERT_TRUE(bool(one)) << llvm::toString(one.takeError());
  EXPECT_EQ(one->params, a->params);

  // The index maps every tensor to an existing shard; total_size adds up.
  llvm::Expected<llvm::json::Value> index =
      llvm::json::parse(slurp(path("a", "model.safetensors.index.json")));
  ASSERT_TRUE(bool(index));
  const llvm::json::Object *map = index->getAsObject()->getObject("weight_map");
  ASSERT_TRUE(map);
  EXPECT_EQ(map->size(), a->tensors);
  uint64_t data = 0;
  for (unsigned s = 1; s <= 3; ++s) {
    std::string bytes = slurp(path("a", shardFileName(s, 3)));
    data += bytes.size() - 8 - llvm::support::endian::read64le(bytes.data());
  }
  EXPECT_EQ(index->getAsObject()
                ->getObject("metadata")
                ->getInteger("total_size")
                .value_or(-1),
            static_cast<int64_t>(data));

  // A different seed changes the weights.
  spec.seed = 10;
  auto c = write(spec, path("c"));
  ASSERT_TRUE(bool(c));
  EXPECT_NE(slurp(path("c", "model.safetensors")),
            slurp(path("one", "model.safetensors")));

  // Existing directories are refused without --force, replaced with it, and
  // no temporary directory is left behind.
  std::string e = errorText(write(spec, path("c")).takeError());
  EXPECT_NE(e.find("already exists"), std::string::npos) << e;
  spec.seed = 9;
  auto replaced = write(spec, path("c"), 1, /*force=*/true);
  ASSERT_TRUE(bool(replaced)) << llvm::toString(replaced.takeError());
  EXPECT_EQ(slurp(path("c", "model.safetensors")),
            slurp(path("one", "model.safetensors")));
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(root_, ec), end; it != end && !ec;
       it.increment(ec)) {
    llvm::StringRef name = llvm::sys::path::filename(it->path());
    EXPECT_EQ(name.find(".tmp-"), llvm::StringRef::npos) << name.str();
    EXPECT_EQ(name.find(".old-"), llvm::StringRef::npos) << name.str();
  }
}

TEST_F(MkModelDirTest, TooManyShardsIsAnErrorAndLeavesNothing) {
  ModelSpec spec = findPreset("tiny-qwen3")->make();
  std::string e = errorText(write(spec, path("m"), 1000).takeError());
  EXPECT_NE(e.find("--shards (1000) must be in [1, 24]"), std::string::npos)
      << e;
  EXPECT_FALSE(llvm::sys::fs::exists(path("m")));
}

} // namespace
