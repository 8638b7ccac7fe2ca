// Unit tests for DuckImport: safetensors validation, config.json parsing,
// checkpoint directories and the expected-tensor check.

#include "duck/Import/Checkpoint.h"
#include "duck/Import/ModelConfig.h"
#include "duck/Import/Safetensors.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include "gtest/gtest.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#ifndef DUCK_SOURCE_DIR
#error "DUCK_SOURCE_DIR must point at the source tree (for models/)"
#endif

using namespace mlir::duck::import;

namespace {

//===----------------------------------------------------------------------===//
// Helpers: write safetensors files from the test itself
//===----------------------------------------------------------------------===//

struct Spec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

/// Raw file: u64 LE header length, header text, `dataSize` bytes of data
/// (byte i = i & 0xff, so tests can check which bytes a tensor maps to).
std::string rawFile(const std::string &header, size_t dataSize,
                    uint64_t declaredLength = UINT64_MAX) {
  uint64_t n = declaredLength == UINT64_MAX ? header.size() : declaredLength;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += header;
  for (size_t i = 0; i < dataSize; ++i)
    out += static_cast<char>(i & 0xff);
  return out;
}

uint64_t bytesOf(const Spec &s) {
  uint64_t n = dtypeSize(*parseDType(s.dtype));
  for (int64_t d : s.shape)
    n *= static_cast<uint64_t>(d);
  return n;
}

/// A well-formed file: tensors laid out contiguously in the given order.
std::string validFile(const std::vector<Spec> &specs,
                      const std::string &metadata = "") {
  llvm::json::Object header;
  uint64_t offset = 0;
  for (const Spec &s : specs) {
    llvm::json::Array shape;
    for (int64_t d : s.shape)
      shape.push_back(d);
    uint64_t end = offset + bytesOf(s);
    header[s.name] =
        llvm::json::Object{{"dtype", s.dtype},
                           {"shape", std::move(shape)},
                           {"data_offsets", llvm::json::Array{offset, end}}};
    offset = end;
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(header));
  os.flush();
  if (!metadata.empty())
    text.insert(1, "\"__metadata__\":" + metadata + ",");
  while (text.size() % 8)
    text += ' ';
  return rawFile(text, offset);
}

class TempDir {
public:
  TempDir() {
    llvm::SmallString<128> path;
    std::error_code ec =
        llvm::sys::fs::createUniqueDirectory("duck-import-test", path);
    EXPECT_FALSE(ec) << ec.message();
    path_ = std::string(path);
  }
  ~TempDir() { llvm::sys::fs::remove_directories(path_); }

  std::string path(const std::string &name) const {
    llvm::SmallString<128> p(path_);
    llvm::sys::path::append(p, name);
    return std::string(p);
  }
  std::string write(const std::string &name, const std::string &bytes) const {
    std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  const std::string &root() const { return path_; }

private:
  std::string path_;
};

/// Opens `bytes` as a file and returns the error message ("" on success).
std::string openError(const TempDir &dir, const std::string &bytes,
                      const std::string &name = "t.safetensors") {
  std::string p = dir.write(name, bytes);
  auto file = SafetensorsFile::open(p);
  if (file)
    return "";
  return llvm::toString(file.takeError());
}

/// A header with one tensor entry `entry` and `dataSize` data bytes.
std::string oneEntry(const std::string &entry, size_t dataSize) {
  return rawFile("{\"w\":" + entry + "}", dataSize);
}

//===----------------------------------------------------------------------===//
// DType helpers
//===----------------------------------------------------------------------===//

TEST(DType, NamesAndSizesRoundTrip) {
  EXPECT_EQ(allDTypes().size(), 15u);
  for (DType d : allDTypes())
    EXPECT_EQ(parseDType(dtypeName(d)), d) << dtypeName(d).str();
  EXPECT_EQ(dtypeSize(DType::BOOL), 1u);
  EXPECT_EQ(dtypeSize(DType::F8_E4M3), 1u);
  EXPECT_EQ(dtypeSize(DType::F8_E5M2), 1u);
  EXPECT_EQ(dtypeSize(DType::BF16), 2u);
  EXPECT_EQ(dtypeSize(DType::U16), 2u);
  EXPECT_EQ(dtypeSize(DType::F32), 4u);
  EXPECT_EQ(dtypeSize(DType::U32), 4u);
  EXPECT_EQ(dtypeSize(DType::F64), 8u);
  EXPECT_EQ(dtypeSize(DType::I64), 8u);
  EXPECT_FALSE(parseDType("F7"));
  EXPECT_FALSE(parseDType("bf16")); // case matters in the format
  EXPECT_EQ(formatShape({2, 3}), "[2, 3]");
  EXPECT_EQ(formatShape({}), "[]");
}

//===----------------------------------------------------------------------===//
// Safetensors: valid files
//===----------------------------------------------------------------------===//

TEST(Safetensors, ReadsTensorsInOffsetOrder) {
  TempDir dir;
  std::string p = dir.write(
      "ok.safetensors",
      validFile({{"b", "BF16", {2, 3}}, {"a", "F32", {4}}, {"s", "I64", {}}},
                R"({"format":"pt"})"));
  auto file = SafetensorsFile::open(p);
  ASSERT_TRUE(bool(file)) << llvm::toString(file.takeError());
  const SafetensorsFile &f = **file;
  ASSERT_EQ(f.tensors().size(), 3u);
  // File order is offset order, not header or name order.
  EXPECT_EQ(f.tensors()[0].name, "b");
  EXPECT_EQ(f.tensors()[1].name, "a");
  EXPECT_EQ(f.tensors()[2].name, "s");

  const TensorInfo *a = f.lookup("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::F32);
  EXPECT_EQ(a->shape, std::vector<int64_t>({4}));
  EXPECT_EQ(a->data_offset, 12u);
  EXPECT_EQ(a->byte_size, 16u);
  // The data pointer lands on the right bytes of the data section.
  llvm::ArrayRef<uint8_t> bytes = f.data(*a);
  ASSERT_EQ(bytes.size(), 16u);
  EXPECT_EQ(bytes[0], 12);
  EXPECT_EQ(f.dataPointer(*a)[15], 27);

  const TensorInfo *s = f.lookup("s");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty()); // scalar
  EXPECT_EQ(s->numElements(), 1);
  EXPECT_EQ(f.lookup("missing"), nullptr);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_TRUE(f.notes().empty());
}

TEST(Safetensors, EmptyTensorAndEmptyHeader) {
  TempDir dir;
  auto file = SafetensorsFile::open(
      dir.write("e.safetensors", validFile({{"z", "F32", {0, 4}}})));
  ASSERT_TRUE(bool(file)) << llvm::toString(file.takeError());
  EXPECT_EQ((*file)->lookup("z")->byte_size, 0u);

  auto none =
      SafetensorsFile::open(dir.write("n.safetensors", rawFile("{}", 0)));
  ASSERT_TRUE(bool(none)) << llvm::toString(none.takeError());
  EXPECT_TRUE((*none)->tensors().empty());
}

TEST(Safetensors, GapsAreNotedNotRejected) {
  TempDir dir;
  // 'b' starts 4 bytes after 'a' ends; 8 bytes trail the last tensor.
  std::string hdr = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                    R"("b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})";
  auto file =
      SafetensorsFile::open(dir.write("g.safetensors", rawFile(hdr, 20)));
  ASSERT_TRUE(bool(file)) << llvm::toString(file.takeError());
  ASSERT_EQ((*file)->notes().size(), 2u);
  EXPECT_NE((*file)->notes()[0].find("4 unused bytes before tensor 'b'"),
            std::string::npos);
  EXPECT_NE((*file)->notes()[1].find("8 unused bytes after the last tensor"),
            std::string::npos);
}

//===----------------------------------------------------------------------===//
// Safetensors: every validation error
//===----------------------------------------------------------------------===//

// Each case: the message names the file, the tensor (if any) and what was
// expected versus found.
#define EXPECT_HAS(haystack, needle)                                           \
  EXPECT_NE((haystack).find(needle), std::string::npos)                        \
      << "message: " << (haystack) << "\nexpected to contain: " << (needle)

TEST(SafetensorsErrors, TruncatedBelowEightBytes) {
  TempDir dir;
  std::string msg = openError(dir, std::string("\x05\x00\x00", 3));
  EXPECT_HAS(msg, dir.path("t.safetensors"));
  EXPECT_HAS(msg,
             "file is 3 bytes, too small to hold the 8-byte header length");
}

TEST(SafetensorsErrors, HeaderLongerThanFile) {
  TempDir dir;
  std::string msg = openError(dir, rawFile("{}", 0, /*declaredLength=*/64));
  EXPECT_HAS(msg,
             "header length 64 exceeds the file size: only 2 bytes follow");
}

TEST(SafetensorsErrors, HeaderOverLimit) {
  TempDir dir;
  std::string msg = openError(dir, rawFile("{}", 0, 100000001));
  EXPECT_HAS(msg, "header length 100000001 exceeds the maximum of 100000000");
}

TEST(SafetensorsErrors, HeaderNotJson) {
  TempDir dir;
  std::string msg = openError(dir, rawFile("{\"a\": ", 0));
  EXPECT_HAS(msg, "t.safetensors: header is not valid JSON");
}

TEST(SafetensorsErrors, HeaderNotObject) {
  TempDir dir;
  std::string msg = openError(dir, rawFile("[1, 2]", 0));
  EXPECT_HAS(msg, "header is not a JSON object (found array)");
}

TEST(SafetensorsErrors, EntryNotObject) {
  TempDir dir;
  std::string msg = openError(dir, oneEntry("[1]", 0));
  EXPECT_HAS(msg, "tensor 'w': entry must be an object");
  EXPECT_HAS(msg, "found array");
}

TEST(SafetensorsErrors, MissingDtype) {
  TempDir dir;
  std::string msg =
      openError(dir, oneEntry(R"({"shape":[1],"data_offsets":[0,1]})", 1));
  EXPECT_HAS(msg, "tensor 'w': missing field 'dtype'");
}

TEST(SafetensorsErrors, MissingShape) {
  TempDir dir;
  std::string msg =
      openError(dir, oneEntry(R"({"dtype":"U8","data_offsets":[0,1]})", 1));
  EXPECT_HAS(msg, "tensor 'w': missing field 'shape'");
}

TEST(SafetensorsErrors, MissingDataOffsets) {
  TempDir dir;
  std::string msg =
      openError(dir, oneEntry(R"({"dtype":"U8","shape":[1]})", 1));
  EXPECT_HAS(msg, "tensor 'w': missing field 'data_offsets'");
}

TEST(SafetensorsErrors, DtypeWrongJsonType) {
  TempDir dir;
  std::string msg = openError(
      dir, oneEntry(R"({"dtype":7,"shape":[1],"data_offsets":[0,1]})", 1));
  EXPECT_HAS(msg, "tensor 'w': field 'dtype' must be a string, found number");
}

TEST(SafetensorsErrors, ShapeWrongJsonType) {
  TempDir dir;
  std::string msg = openError(
      dir, oneEntry(R"({"dtype":"U8","shape":"1","data_offsets":[0,1]})", 1));
  EXPECT_HAS(msg, "tensor 'w': field 'shape' must be an array of integers, "
                  "found string");
}

TEST(SafetensorsErrors, DataOffsetsWrongJsonType) {
  TempDir dir;
  std::string msg = openError(
      dir, oneEntry(R"({"dtype":"U8","shape":[1],"data_offsets":[0]})", 1));
  EXPECT_HAS(msg, "tensor 'w': field 'data_offsets' must be an array of two "
                  "non-negative integers [begin, end], found [0]");
}

TEST(SafetensorsErrors, UnknownDtype) {
  TempDir dir;
  std::string msg = openError(
      dir, oneEntry(R"({"dtype":"F7","shape":[1],"data_offsets":[0,1]})", 1));
  EXPECT_HAS(msg, "tensor 'w': unknown dtype 'F7' (expected one of BOOL, U8");
}

TEST(SafetensorsErrors, NegativeDim) {
  TempDir dir;
  std::string msg = openError(
      dir,
      oneEntry(R"({"dtype":"U8","shape":[2,-3],"data_offsets":[0,1]})", 1));
  EXPECT_HAS(msg, "tensor 'w': shape[1] must be a non-negative integer, "
                  "found -3");
}

TEST(SafetensorsErrors, NonIntegerDim) {
  TempDir dir;
  std::string msg = openError(
      dir, oneEntry(R"({"dtype":"U8","shape":[2.5],"data_offsets":[0,1]})", 1));
  EXPECT_HAS(msg, "tensor 'w': shape[0] must be a non-negative integer, "
                  "found 2.5");
}

TEST(SafetensorsErrors, EndBeforeBegin) {
  TempDir dir;
  std::string msg = openError(
      dir, oneEntry(R"({"dtype":"U8","shape":[0],"data_offsets":[8,4]})", 8));
  EXPECT_HAS(msg, "tensor 'w': data_offsets end 4 is before begin 8");
}

TEST(SafetensorsErrors, ByteSizeMismatchNamesBothNumbers) {
  TempDir dir;
  std::string msg = openError(
      dir,
      oneEntry(R"({"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]})", 10));
  EXPECT_HAS(msg, "tensor 'w': byte size mismatch: shape [2, 3] of BF16 needs "
                  "12 bytes (6 x 2) but data_offsets [0, 10] span 10 bytes");
}

TEST(SafetensorsErrors, OffsetsBeyondDataSection) {
  TempDir dir;
  std::string msg = openError(
      dir, oneEntry(R"({"dtype":"U8","shape":[16],"data_offsets":[0,16]})", 8));
  EXPECT_HAS(msg, "tensor 'w': data_offsets [0, 16] extend beyond the data "
                  "section, which has 8 bytes");
}

TEST(SafetensorsErrors, OverlapNamesBothTensors) {
  TempDir dir;
  std::string hdr = R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})";
  std::string msg = openError(dir, rawFile(hdr, 12));
  EXPECT_HAS(msg, "tensors 'a' (bytes [0, 8)) and 'b' (bytes [4, 12)) overlap");
}

TEST(SafetensorsErrors, DuplicateNames) {
  TempDir dir;
  std::string hdr = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                    R"("a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})";
  std::string msg = openError(dir, rawFile(hdr, 8));
  EXPECT_HAS(msg, "duplicate tensor name 'a' in header");
}

TEST(SafetensorsErrors, MetadataMustBeStrings) {
  TempDir dir;
  std::string msg = openError(dir, rawFile(R"({"__metadata__":{"n":1}})", 0));
  EXPECT_HAS(msg, "'__metadata__' entry 'n' must be a string, found number");
}

TEST(SafetensorsErrors, MissingFile) {
  TempDir dir;
  auto file = SafetensorsFile::open(dir.path("nope.safetensors"));
  ASSERT_FALSE(bool(file));
  std::string msg = llvm::toString(file.takeError());
  EXPECT_HAS(msg, "nope.safetensors: cannot open");
}

//===----------------------------------------------------------------------===//
// ModelConfig
//===----------------------------------------------------------------------===//

ModelDesc loadModel(const std::string &name) {
  std::string path =
      std::string(DUCK_SOURCE_DIR) + "/models/" + name + "/config.json";
  auto desc = loadModelConfig(path);
  EXPECT_TRUE(bool(desc)) << llvm::toString(desc.takeError());
  return desc ? *desc : ModelDesc();
}

std::string configError(const std::string &text) {
  auto desc = parseModelConfigText(text, "config.json");
  if (desc)
    return "";
  return llvm::toString(desc.takeError());
}

TEST(ModelConfig, Qwen3Dense) {
  ModelDesc d = loadModel("Qwen3-0.6B");
  EXPECT_EQ(d.family, ModelFamily::Qwen3);
  EXPECT_EQ(d.hidden_size, 1024);
  EXPECT_EQ(d.num_layers, 28);
  EXPECT_EQ(d.head_dim, 128);
  EXPECT_EQ(d.num_kv_heads, 8);
  EXPECT_TRUE(d.tie_word_embeddings);
  EXPECT_EQ(d.numMoeLayers(), 0);
  EXPECT_EQ(d.ffnIntermediate(5), 3072);
  EXPECT_FALSE(d.quantization.isFp8());
  EXPECT_EQ(d.eos_token_ids, std::vector<int64_t>({151645}));
  // 0.6B: tied head counted once.
  EXPECT_EQ(countParams(d).total, 596049920);
}

TEST(ModelConfig, Qwen3Moe30B) {
  ModelDesc d = loadModel("Qwen3-30B-A3B");
  EXPECT_EQ(d.family, ModelFamily::Qwen3Moe);
  EXPECT_EQ(d.num_layers, 48);
  EXPECT_EQ(d.numMoeLayers(), 48);
  EXPECT_EQ(d.num_routed_experts, 128);
  EXPECT_EQ(d.experts_per_tok, 8);
  EXPECT_EQ(d.ffnIntermediate(0), 768);
  EXPECT_TRUE(d.norm_topk_prob);
  ParamCounts pc = countParams(d);
  EXPECT_NEAR(pc.total / 1e9, 30.5, 0.1);
  EXPECT_NEAR(pc.activated / 1e9, 3.3, 0.1);
}

TEST(ModelConfig, Qwen3MoeFp8) {
  ModelDesc d = loadModel("Qwen3-235B-A22B-FP8");
  EXPECT_EQ(d.num_layers, 94);
  EXPECT_EQ(d.moe_intermediate_size, 1536);
  EXPECT_TRUE(d.quantization.isFp8());
  EXPECT_EQ(d.quantization.weight_block_size, std::vector<int64_t>({128, 128}));
  EXPECT_EQ(d.quantization.fmt, "e4m3");
  EXPECT_EQ(d.quantization.activation_scheme, "dynamic");
}

TEST(ModelConfig, DeepSeekV32) {
  ModelDesc d = loadModel("DeepSeek-V3.2");
  EXPECT_EQ(d.family, ModelFamily::DeepSeekV32);
  EXPECT_EQ(d.num_layers, 61);
  EXPECT_EQ(d.numMoeLayers(), 58);
  EXPECT_EQ(d.numDenseLayers(), 3);
  EXPECT_FALSE(d.isMoeLayer(2));
  EXPECT_TRUE(d.isMoeLayer(3));
  EXPECT_EQ(d.ffnIntermediate(2), 18432);
  EXPECT_EQ(d.ffnIntermediate(3), 2048);
  EXPECT_EQ(d.n_shared_experts, 1);
  EXPECT_EQ(d.num_routed_experts, 256);
  EXPECT_EQ(d.head_dim, 192);
  EXPECT_EQ(d.index_n_heads, 64);
  EXPECT_EQ(d.index_head_dim, 128);
  EXPECT_EQ(d.index_topk, 2048);
  EXPECT_EQ(d.quantization.scale_fmt, "ue8m0");
  ASSERT_TRUE(d.rope_scaling.has_value());
  EXPECT_EQ(d.rope_scaling->type, "yarn");
  EXPECT_EQ(d.rope_scaling->factor, 40.0);
  EXPECT_EQ(d.rope_scaling->original_max_position_embeddings, 4096);
  EXPECT_EQ(d.routed_scaling_factor, 2.5);
  EXPECT_EQ(d.scoring_func, "sigmoid");
  EXPECT_EQ(d.topk_method, "noaux_tc");
  EXPECT_EQ(d.num_nextn_predict_layers, 1);
}

TEST(ModelConfig, QwenMoeLayerRule) {
  // MoE iff L not in mlp_only_layers and (L+1) % decoder_sparse_step == 0.
  auto d = parseModelConfigText(R"({"model_type":"qwen3_moe","hidden_size":8,
      "num_hidden_layers":6,"vocab_size":16,"num_attention_heads":2,
      "num_key_value_heads":1,"intermediate_size":32,"num_experts":4,
      "num_experts_per_tok":2,"moe_intermediate_size":16,
      "decoder_sparse_step":2,"mlp_only_layers":[3]})",
                                "config.json");
  ASSERT_TRUE(bool(d)) << llvm::toString(d.takeError());
  std::vector<bool> moe;
  for (int64_t l = 0; l < 6; ++l)
    moe.push_back(d->isMoeLayer(l));
  EXPECT_EQ(moe, std::vector<bool>({false, true, false, false, false, true}));
  EXPECT_EQ(d->ffnIntermediate(1), 16);
  EXPECT_EQ(d->ffnIntermediate(3), 32);
  EXPECT_EQ(d->head_dim, 4); // hidden / heads when head_dim is absent
}

TEST(ModelConfig, DeepSeekMoeLayerFreq) {
  // MoE iff L >= first_k_dense_replace and L % moe_layer_freq == 0.
  auto d = parseModelConfigText(R"({"model_type":"deepseek_v3","hidden_size":8,
      "num_hidden_layers":6,"vocab_size":16,"num_attention_heads":2,
      "intermediate_size":32,"moe_intermediate_size":16,"n_routed_experts":4,
      "num_experts_per_tok":2,"n_shared_experts":1,"first_k_dense_replace":1,
      "moe_layer_freq":2,"n_group":2,"topk_group":1,"q_lora_rank":null,
      "kv_lora_rank":8,"qk_nope_head_dim":4,"qk_rope_head_dim":2,
      "v_head_dim":4,"eos_token_id":[1,2]})",
                                "config.json");
  ASSERT_TRUE(bool(d)) << llvm::toString(d.takeError());
  std::vector<bool> moe;
  for (int64_t l = 0; l < 6; ++l)
    moe.push_back(d->isMoeLayer(l));
  EXPECT_EQ(moe, std::vector<bool>({false, false, true, false, true, false}));
  EXPECT_EQ(d->q_lora_rank, 0); // null: queries projected directly
  EXPECT_EQ(d->eos_token_ids, std::vector<int64_t>({1, 2}));
  // Without q LoRA the query projection is q_proj [H*(nope+rope), hidden].
  bool sawQProj = false;
  for (const ExpectedTensor &t : expectedTensors(*d))
    if (t.name == "model.layers.0.self_attn.q_proj.weight") {
      sawQProj = true;
      EXPECT_EQ(t.shape, std::vector<int64_t>({12, 8}));
    }
  EXPECT_TRUE(sawQProj);
}

TEST(ModelConfigErrors, MissingRequiredField) {
  EXPECT_EQ(configError(R"({"model_type":"qwen3","num_hidden_layers":2})"),
            "config.json: missing required field 'hidden_size' (needed for "
            "family qwen3)");
}

TEST(ModelConfigErrors, WrongJsonType) {
  std::string msg = configError(
      R"({"model_type":"qwen3","hidden_size":"1024","num_hidden_layers":2,
          "vocab_size":8,"num_attention_heads":2,"intermediate_size":4})");
  EXPECT_EQ(msg, "config.json: field 'hidden_size' must be an integer, found "
                 "string \"1024\"");
}

TEST(ModelConfigErrors, WrongNestedType) {
  std::string msg = configError(
      R"({"model_type":"qwen3","hidden_size":8,"num_hidden_layers":2,
          "vocab_size":8,"num_attention_heads":2,"intermediate_size":4,
          "quantization_config":{"quant_method":"fp8",
                                 "weight_block_size":128}})");
  EXPECT_HAS(msg, "field 'quantization_config.weight_block_size' must be an "
                  "array of integers, found number 128");
}

TEST(ModelConfigErrors, UnsupportedModelType) {
  EXPECT_EQ(configError(R"({"model_type":"llama"})"),
            "config.json: unsupported model_type 'llama' (supported: qwen3, "
            "qwen3_moe, deepseek_v3, deepseek_v32)");
}

TEST(ModelConfigErrors, MissingModelType) {
  EXPECT_HAS(configError("{}"), "missing required field 'model_type'");
}

TEST(ModelConfigErrors, UnsupportedQuantMethod) {
  std::string msg = configError(
      R"({"model_type":"qwen3","hidden_size":8,"num_hidden_layers":2,
          "vocab_size":8,"num_attention_heads":2,"intermediate_size":4,
          "quantization_config":{"quant_method":"awq"}})");
  EXPECT_HAS(msg, "unsupported quant_method 'awq'");
}

TEST(ModelConfigErrors, KvHeadsMustDivideHeads) {
  std::string msg = configError(
      R"({"model_type":"qwen3","hidden_size":8,"num_hidden_layers":2,
          "vocab_size":8,"num_attention_heads":4,"num_key_value_heads":3,
          "intermediate_size":4})");
  EXPECT_HAS(msg, "'num_key_value_heads' (3) must divide "
                  "'num_attention_heads' (4)");
}

TEST(ModelConfigErrors, DenseLayerNeedsIntermediateSize) {
  // A Qwen3-MoE with a dense layer (mlp_only_layers) needs intermediate_size.
  std::string msg = configError(
      R"({"model_type":"qwen3_moe","hidden_size":8,"num_hidden_layers":2,
          "vocab_size":8,"num_attention_heads":2,"num_experts":4,
          "num_experts_per_tok":2,"moe_intermediate_size":4,
          "mlp_only_layers":[0]})");
  EXPECT_EQ(msg, "config.json: missing required field 'intermediate_size' "
                 "(needed for family qwen3_moe: layers 1 of 2 are dense)");
}

TEST(ModelConfigErrors, AbsurdSizesAreRefused) {
  // Bounds keep tensor lists and parameter counts finite.
  std::string msg = configError(
      R"({"model_type":"qwen3","hidden_size":8,"num_hidden_layers":1000000,
          "vocab_size":8,"num_attention_heads":2,"intermediate_size":4})");
  EXPECT_EQ(msg, "config.json: field 'num_hidden_layers' (1000000) exceeds "
                 "the supported maximum 1024");
}

/// A tiny Qwen3 config with `ropeScaling` as its rope_scaling.
std::string qwenWithRope(const std::string &ropeScaling) {
  return R"({"model_type":"qwen3","hidden_size":8,"num_hidden_layers":2,
             "vocab_size":8,"num_attention_heads":2,"intermediate_size":4,
             "max_position_embeddings":40960,"rope_scaling":)" +
         ropeScaling + "}";
}

TEST(ModelConfig, QwenYarnAsTheModelCardsSetIt) {
  auto d = parseModelConfigText(
      qwenWithRope(R"({"rope_type":"yarn","factor":4.0,
                       "original_max_position_embeddings":32768})"),
      "config.json");
  ASSERT_TRUE(bool(d)) << llvm::toString(d.takeError());
  ASSERT_TRUE(d->rope_scaling && d->rope_scaling->isYarn());
  EXPECT_EQ(d->rope_scaling->original_max_position_embeddings, 32768);
  // HF's default attention factor: 0.1 ln(factor) + 1.
  EXPECT_DOUBLE_EQ(d->rope_scaling->yarnAttentionFactor(),
                   0.1 * std::log(4.0) + 1.0);
}

TEST(ModelConfig, YarnAttentionFactorFollowsHf) {
  RopeScaling rs;
  rs.type = "yarn";
  rs.factor = 40;
  // Both mscales (DeepSeek's 1 and 1): their ratio.
  rs.mscale = 1.0;
  rs.mscale_all_dim = 1.0;
  EXPECT_DOUBLE_EQ(rs.yarnAttentionFactor(), 1.0);
  rs.mscale = 0.707;
  EXPECT_DOUBLE_EQ(rs.yarnAttentionFactor(),
                   (0.1 * 0.707 * std::log(40.0) + 1) /
                       (0.1 * std::log(40.0) + 1));
  // Only one of them: the default, as HF's `if mscale and mscale_all_dim`.
  rs.mscale_all_dim.reset();
  EXPECT_DOUBLE_EQ(rs.yarnAttentionFactor(), 0.1 * std::log(40.0) + 1);
  // Given outright, it wins.
  rs.attention_factor = 1.25;
  EXPECT_DOUBLE_EQ(rs.yarnAttentionFactor(), 1.25);
  // No scaling at factor 1.
  rs.attention_factor.reset();
  rs.factor = 1.0;
  EXPECT_DOUBLE_EQ(rs.yarnAttentionFactor(), 1.0);
}

TEST(ModelConfig, YarnOriginalDefaultsToMaxPositions) {
  auto d = parseModelConfigText(
      qwenWithRope(R"({"type":"yarn","factor":2.0})"), "config.json");
  ASSERT_TRUE(bool(d)) << llvm::toString(d.takeError());
  EXPECT_EQ(d->rope_scaling->original_max_position_embeddings, 40960);
}

TEST(ModelConfigErrors, UnsupportedRopeTypeIsNamed) {
  EXPECT_EQ(configError(qwenWithRope(R"({"rope_type":"dynamic",
                                         "factor":2.0})")),
            "config.json: rope_scaling.rope_type 'dynamic' is not supported "
            "(supported: default, yarn)");
  EXPECT_EQ(configError(qwenWithRope(R"({"type":"linear","factor":2.0})")),
            "config.json: rope_scaling.type 'linear' is not supported "
            "(supported: default, yarn)");
  // rope_type wins over the legacy key, as in HF.
  EXPECT_EQ(configError(qwenWithRope(R"({"rope_type":"llama3",
                                         "type":"yarn","factor":8.0})")),
            "config.json: rope_scaling.rope_type 'llama3' is not supported "
            "(supported: default, yarn)");
  EXPECT_EQ(configError(qwenWithRope(R"({"rope_type":"default"})")), "");
  EXPECT_EQ(configError(qwenWithRope("null")), "");
}

//===----------------------------------------------------------------------===//
// Expected tensors
//===----------------------------------------------------------------------===//

const ExpectedTensor *findExpected(const std::vector<ExpectedTensor> &ts,
                                   const std::string &name) {
  for (const ExpectedTensor &t : ts)
    if (t.name == name)
      return &t;
  return nullptr;
}

TEST(ExpectedTensors, Qwen3DenseNamesAndShapes) {
  std::vector<ExpectedTensor> ts = expectedTensors(loadModel("Qwen3-1.7B"));
  // embed + 28 x (2 norms + 4 proj + 2 qk norms + 3 mlp) + norm + lm_head.
  EXPECT_EQ(ts.size(), 1u + 28u * 11u + 2u);
  const ExpectedTensor *q =
      findExpected(ts, "model.layers.3.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, std::vector<int64_t>({2048, 2048}));
  const ExpectedTensor *k =
      findExpected(ts, "model.layers.3.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, std::vector<int64_t>({1024, 2048}));
  const ExpectedTensor *head = findExpected(ts, "lm_head.weight");
  ASSERT_NE(head, nullptr);
  EXPECT_TRUE(head->optional); // tied
}

TEST(ExpectedTensors, DeepSeekV32) {
  ModelDesc d = loadModel("DeepSeek-V3.2");
  std::vector<ExpectedTensor> ts = expectedTensors(d);
  auto shapeOf = [&](const std::string &name) {
    const ExpectedTensor *t = findExpected(ts, name);
    EXPECT_NE(t, nullptr) << name;
    return t ? t->shape : std::vector<int64_t>();
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(shapeOf("model.layers.0.self_attn.q_b_proj.weight"),
            V({24576, 1536}));
  EXPECT_EQ(shapeOf("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"),
            V({576, 7168}));
  EXPECT_EQ(shapeOf("model.layers.0.self_attn.kv_b_proj.weight"),
            V({32768, 512}));
  EXPECT_EQ(shapeOf("model.layers.0.self_attn.o_proj.weight"),
            V({7168, 16384}));
  EXPECT_EQ(shapeOf("model.layers.0.mlp.gate_proj.weight"), V({18432, 7168}));
  EXPECT_EQ(shapeOf("model.layers.3.mlp.gate.e_score_correction_bias"),
            V({256}));
  EXPECT_EQ(shapeOf("model.layers.60.mlp.experts.255.down_proj.weight"),
            V({7168, 2048}));
  EXPECT_EQ(shapeOf("model.layers.3.mlp.shared_experts.up_proj.weight"),
            V({2048, 7168}));
  EXPECT_EQ(shapeOf("model.layers.5.self_attn.indexer.wq_b.weight"),
            V({8192, 1536}));
  EXPECT_EQ(shapeOf("model.layers.5.self_attn.indexer.wk.weight"),
            V({128, 7168}));
  EXPECT_EQ(shapeOf("model.layers.5.self_attn.indexer.k_norm.bias"), V({128}));
  EXPECT_EQ(shapeOf("model.layers.5.self_attn.indexer.weights_proj.weight"),
            V({64, 7168}));
  // Router, weights_proj and lm_head are never FP8.
  EXPECT_FALSE(
      findExpected(ts, "model.layers.3.mlp.gate.weight")->fp8_eligible);
  EXPECT_FALSE(
      findExpected(ts, "model.layers.5.self_attn.indexer.weights_proj.weight")
          ->fp8_eligible);
  EXPECT_FALSE(findExpected(ts, "lm_head.weight")->fp8_eligible);
  EXPECT_TRUE(findExpected(ts, "model.layers.5.self_attn.indexer.wk.weight")
                  ->fp8_eligible);
  // MTP layer 61 is not part of plain inference.
  EXPECT_EQ(findExpected(ts, "model.layers.61.input_layernorm.weight"),
            nullptr);
  EXPECT_TRUE(isSkippedMtpTensor(d, "model.layers.61.eh_proj.weight"));
  EXPECT_FALSE(isSkippedMtpTensor(d, "model.layers.60.input_layernorm.weight"));
}

//===----------------------------------------------------------------------===//
// Checkpoint directories
//===----------------------------------------------------------------------===//

/// A tiny qwen3_moe: 2 layers, layer 1 dense via mlp_only_layers.
constexpr const char *kTinyMoeConfig = R"({
  "model_type": "qwen3_moe", "hidden_size": 8, "num_hidden_layers": 2,
  "vocab_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
  "head_dim": 4, "intermediate_size": 12, "num_experts": 4,
  "num_experts_per_tok": 2, "moe_intermediate_size": 6,
  "mlp_only_layers": [1], "tie_word_embeddings": false%s
})";

std::string tinyConfig(bool fp8) {
  std::string quant = fp8 ? R"(, "quantization_config": {"quant_method": "fp8",
             "weight_block_size": [4, 4]})"
                          : "";
  std::string text = kTinyMoeConfig;
  text.replace(text.find("%s"), 2, quant);
  return text;
}

/// Specs for every expected tensor of `d`; FP8-eligible ones as F8_E4M3
/// plus scales when `fp8`.
std::vector<Spec> specsFor(const ModelDesc &d, bool fp8) {
  std::vector<Spec> specs;
  for (const ExpectedTensor &t : expectedTensors(d)) {
    if (fp8 && t.fp8_eligible) {
      specs.push_back({t.name, "F8_E4M3", t.shape});
      specs.push_back({t.name + "_scale_inv",
                       "F32",
                       {(t.shape[0] + 3) / 4, (t.shape[1] + 3) / 4}});
    } else {
      specs.push_back({t.name, "BF16", t.shape});
    }
  }
  return specs;
}

std::string checkpointError(const std::string &dir) {
  auto ckpt = Checkpoint::open(dir);
  if (!ckpt)
    return llvm::toString(ckpt.takeError());
  auto check = verifyCheckpoint(**ckpt);
  if (!check)
    return llvm::toString(check.takeError());
  return "";
}

TEST(Checkpoint, ConfigOnly) {
  TempDir dir;
  dir.write("config.json", tinyConfig(false));
  auto ckpt = Checkpoint::open(dir.root());
  ASSERT_TRUE(bool(ckpt)) << llvm::toString(ckpt.takeError());
  EXPECT_FALSE((*ckpt)->hasWeights());
  EXPECT_EQ((*ckpt)->layout(), WeightLayout::None);
  EXPECT_EQ((*ckpt)->model().numMoeLayers(), 1);
  auto report = describeCheckpoint(**ckpt);
  ASSERT_TRUE(bool(report));
  EXPECT_EQ(*report->get("weights")->getAsString(), "none");
}

TEST(Checkpoint, SingleFileFp8PassesCheck) {
  TempDir dir;
  dir.write("config.json", tinyConfig(true));
  ModelDesc d = *parseModelConfigText(tinyConfig(true), "config.json");
  dir.write("model.safetensors", validFile(specsFor(d, true)));
  auto ckpt = Checkpoint::open(dir.root());
  ASSERT_TRUE(bool(ckpt)) << llvm::toString(ckpt.takeError());
  EXPECT_EQ((*ckpt)->layout(), WeightLayout::SingleFile);
  auto check = verifyCheckpoint(**ckpt);
  ASSERT_TRUE(bool(check)) << llvm::toString(check.takeError());
  EXPECT_EQ(check->found, check->expected);
  EXPECT_EQ(check->unexpected, 0u);
  // Layer 0 attention (4 proj) + 4 experts x 3, layer 1: 4 proj + 3 mlp.
  EXPECT_EQ(check->fp8_weights, 4u + 12u + 4u + 3u);

  std::optional<Fp8Weight> fp8 =
      (*ckpt)->findFp8("model.layers.0.mlp.experts.3.down_proj.weight");
  ASSERT_TRUE(fp8.has_value());
  EXPECT_EQ(fp8->scale_dtype, DType::F32);
  EXPECT_EQ(fp8->scale.info->shape, std::vector<int64_t>({2, 2}));
  // The router is not FP8.
  EXPECT_FALSE((*ckpt)->findFp8("model.layers.0.mlp.gate.weight").has_value());
  TensorRef router = (*ckpt)->find("model.layers.0.mlp.gate.weight");
  ASSERT_TRUE(bool(router));
  EXPECT_EQ(router.info->shape, std::vector<int64_t>({4, 8}));
  EXPECT_EQ(router.data().size(), 4u * 8u * 2u);
}

TEST(Checkpoint, IndexLayoutAndItsErrors) {
  TempDir dir;
  dir.write("config.json", tinyConfig(false));
  ModelDesc d = *parseModelConfigText(tinyConfig(false), "config.json");
  std::vector<Spec> all = specsFor(d, false);
  std::vector<Spec> first(all.begin(), all.begin() + all.size() / 2);
  std::vector<Spec> second(all.begin() + all.size() / 2, all.end());
  dir.write("model-00001-of-00002.safetensors", validFile(first));
  dir.write("model-00002-of-00002.safetensors", validFile(second));
  llvm::json::Object map;
  for (const Spec &s : first)
    map[s.name] = "model-00001-of-00002.safetensors";
  for (const Spec &s : second)
    map[s.name] = "model-00002-of-00002.safetensors";
  auto writeIndex = [&](const llvm::json::Object &m) {
    std::string text;
    llvm::raw_string_ostream os(text);
    os << llvm::json::Value(
        llvm::json::Object{{"weight_map", llvm::json::Object(m)}});
    os.flush();
    dir.write("model.safetensors.index.json", text);
  };
  writeIndex(map);
  auto ckpt = Checkpoint::open(dir.root());
  ASSERT_TRUE(bool(ckpt)) << llvm::toString(ckpt.takeError());
  EXPECT_EQ((*ckpt)->layout(), WeightLayout::Index);
  EXPECT_EQ((*ckpt)->files().size(), 2u);
  EXPECT_EQ((*ckpt)->numTensors(), all.size());
  EXPECT_TRUE(bool((*ckpt)->find(second.back().name)));
  EXPECT_EQ(checkpointError(dir.root()), "");

  // A shard that does not exist: the index file and the tensor are named.
  llvm::json::Object badShard = map;
  badShard["model.norm.weight"] = "model-00003-of-00002.safetensors";
  writeIndex(badShard);
  std::string msg = checkpointError(dir.root());
  EXPECT_HAS(msg, "model.safetensors.index.json: tensor 'model.norm.weight' "
                  "maps to shard 'model-00003-of-00002.safetensors', which "
                  "does not exist");

  // A tensor listed in a shard that does not hold it.
  llvm::json::Object wrongShard = map;
  wrongShard[all.front().name] = "model-00002-of-00002.safetensors";
  writeIndex(wrongShard);
  msg = checkpointError(dir.root());
  EXPECT_HAS(msg, "model.safetensors.index.json: tensor '" + all.front().name +
                      "' is listed in shard 'model-00002-of-00002.safetensors' "
                      "but that file does not contain it");
}

TEST(CheckpointErrors, MissingTensor) {
  TempDir dir;
  dir.write("config.json", tinyConfig(false));
  ModelDesc d = *parseModelConfigText(tinyConfig(false), "config.json");
  std::vector<Spec> specs = specsFor(d, false);
  llvm::erase_if(specs, [](const Spec &s) {
    return s.name == "model.layers.0.mlp.experts.2.up_proj.weight";
  });
  dir.write("model.safetensors", validFile(specs));
  EXPECT_HAS(checkpointError(dir.root()),
             "checkpoint is missing tensor "
             "'model.layers.0.mlp.experts.2.up_proj.weight' (shape [6, 8]");
}

TEST(CheckpointErrors, ShapeMismatch) {
  TempDir dir;
  dir.write("config.json", tinyConfig(false));
  ModelDesc d = *parseModelConfigText(tinyConfig(false), "config.json");
  std::vector<Spec> specs = specsFor(d, false);
  for (Spec &s : specs)
    if (s.name == "model.layers.1.mlp.down_proj.weight")
      s.shape = {8, 10};
  dir.write("model.safetensors", validFile(specs));
  EXPECT_HAS(checkpointError(dir.root()),
             "model.safetensors: tensor 'model.layers.1.mlp.down_proj.weight' "
             "has shape [8, 10], expected [8, 12]");
}

TEST(CheckpointErrors, Fp8WithoutScale) {
  TempDir dir;
  dir.write("config.json", tinyConfig(true));
  ModelDesc d = *parseModelConfigText(tinyConfig(true), "config.json");
  std::vector<Spec> specs = specsFor(d, true);
  llvm::erase_if(specs, [](const Spec &s) {
    return s.name == "model.layers.0.self_attn.o_proj.weight_scale_inv";
  });
  dir.write("model.safetensors", validFile(specs));
  EXPECT_HAS(checkpointError(dir.root()),
             "FP8 weight 'model.layers.0.self_attn.o_proj.weight' (F8_E4M3 "
             "[8, 8]) has no scale tensor "
             "'model.layers.0.self_attn.o_proj.weight_scale_inv'");
}

TEST(CheckpointErrors, Fp8ScaleShape) {
  TempDir dir;
  dir.write("config.json", tinyConfig(true));
  ModelDesc d = *parseModelConfigText(tinyConfig(true), "config.json");
  std::vector<Spec> specs = specsFor(d, true);
  for (Spec &s : specs)
    if (s.name == "model.layers.1.mlp.up_proj.weight_scale_inv")
      s.shape = {3, 3};
  dir.write("model.safetensors", validFile(specs));
  // up_proj [12, 8] with 4x4 blocks needs a [3, 2] scale.
  EXPECT_HAS(checkpointError(dir.root()),
             "scale tensor 'model.layers.1.mlp.up_proj.weight_scale_inv' has "
             "shape [3, 3], expected [3, 2] for FP8 weight [12, 8] with 4x4 "
             "blocks");
}

TEST(CheckpointErrors, Fp8ScaleDtype) {
  TempDir dir;
  dir.write("config.json", tinyConfig(true));
  ModelDesc d = *parseModelConfigText(tinyConfig(true), "config.json");
  std::vector<Spec> specs = specsFor(d, true);
  for (Spec &s : specs)
    if (s.name == "model.layers.1.mlp.up_proj.weight_scale_inv")
      s.dtype = "F16";
  dir.write("model.safetensors", validFile(specs));
  EXPECT_HAS(checkpointError(dir.root()),
             "scale tensor 'model.layers.1.mlp.up_proj.weight_scale_inv' has "
             "dtype F16, expected F32 or BF16");
}

TEST(CheckpointErrors, DuplicateAcrossLooseFiles) {
  TempDir dir;
  dir.write("config.json", tinyConfig(false));
  dir.write("a.safetensors", validFile({{"x", "U8", {1}}}));
  dir.write("b.safetensors", validFile({{"x", "U8", {1}}}));
  EXPECT_HAS(checkpointError(dir.root()),
             "b.safetensors: tensor 'x' also appears in");
}

TEST(CheckpointErrors, NoConfig) {
  TempDir dir;
  EXPECT_HAS(checkpointError(dir.root()),
             "no config.json in the model directory");
}

} // namespace
