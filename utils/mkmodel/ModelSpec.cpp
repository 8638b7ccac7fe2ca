//===- ModelSpec.cpp - Families, presets, shape options and validation ----===//

#include "ModelSpec.h"

#include "TokenizerJson.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

using llvm::Error;
using llvm::StringRef;

namespace duck::mkmodel {

static Error makeError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

StringRef familyName(Family family) {
  switch (family) {
  case Family::Qwen3:
    return "qwen3";
  case Family::Qwen3Moe:
    return "qwen3_moe";
  case Family::DeepseekV3:
    return "deepseek_v3";
  case Family::DeepseekV32:
    return "deepseek_v32";
  }
  return "?";
}

std::optional<Family> parseFamily(StringRef name) {
  return llvm::StringSwitch<std::optional<Family>>(name)
      .Case("qwen3", Family::Qwen3)
      .Case("qwen3_moe", Family::Qwen3Moe)
      .Case("deepseek_v3", Family::DeepseekV3)
      .Case("deepseek_v32", Family::DeepseekV32)
      .Default(std::nullopt);
}

StringRef formatName(WeightFormat format) {
  return format == WeightFormat::FP8 ? "fp8" : "bf16";
}

std::optional<WeightFormat> parseFormat(StringRef name) {
  return llvm::StringSwitch<std::optional<WeightFormat>>(name)
      .Case("bf16", WeightFormat::BF16)
      .Case("fp8", WeightFormat::FP8)
      .Default(std::nullopt);
}

//===----------------------------------------------------------------------===//
// Shape options
//===----------------------------------------------------------------------===//

static constexpr unsigned kQwen3Moe = familyBit(Family::Qwen3Moe);
static constexpr unsigned kV32 = familyBit(Family::DeepseekV32);

static const ShapeOption kShapeOptions[] = {
    {"hidden", "hidden_size (multiple of 32)", &ModelSpec::hidden, kAllFamilies,
     32, 1 << 16},
    {"layers", "num_hidden_layers", &ModelSpec::layers, kAllFamilies, 1, 1024},
    {"heads", "num_attention_heads", &ModelSpec::heads, kAllFamilies, 1, 1024},
    {"kv-heads", "num_key_value_heads (must divide --heads)",
     &ModelSpec::kv_heads, kQwenFamilies, 1, 1024},
    {"head-dim", "head_dim (even, for RoPE)", &ModelSpec::head_dim,
     kQwenFamilies, 2, 1024},
    {"intermediate", "intermediate_size of dense MLP layers (multiple of 32)",
     &ModelSpec::intermediate, kAllFamilies, 32, 1 << 20},
    {"moe-intermediate", "moe_intermediate_size per expert (multiple of 32)",
     &ModelSpec::moe_intermediate, kMoeFamilies, 32, 1 << 20},
    {"experts", "routed experts per MoE layer", &ModelSpec::experts,
     kMoeFamilies, 1, 4096},
    {"top-k", "num_experts_per_tok", &ModelSpec::top_k, kMoeFamilies, 1, 4096},
    {"shared-experts", "n_shared_experts (0 = none)",
     &ModelSpec::shared_experts, kDeepseekFamilies, 0, 64},
    {"dense-layers",
     "leading dense layers (DeepSeek first_k_dense_replace, Qwen3-MoE "
     "mlp_only_layers)",
     &ModelSpec::dense_layers, kMoeFamilies, 0, 1024},
    {"vocab", "vocab_size (>= 259: 256 byte tokens, merges, 3 specials)",
     &ModelSpec::vocab, kAllFamilies, kMinVocab, 1 << 22},
    {"max-pos", "max_position_embeddings", &ModelSpec::max_pos, kAllFamilies, 1,
     1 << 24},
    {"q-lora", "MLA q_lora_rank", &ModelSpec::q_lora, kDeepseekFamilies, 1,
     1 << 16},
    {"kv-lora", "MLA kv_lora_rank", &ModelSpec::kv_lora, kDeepseekFamilies, 1,
     1 << 16},
    {"qk-nope", "MLA qk_nope_head_dim", &ModelSpec::qk_nope, kDeepseekFamilies,
     1, 4096},
    {"qk-rope", "MLA qk_rope_head_dim (even)", &ModelSpec::qk_rope,
     kDeepseekFamilies, 2, 4096},
    {"v-head", "MLA v_head_dim", &ModelSpec::v_head, kDeepseekFamilies, 1,
     4096},
    {"n-group", "router expert groups n_group (must divide --experts)",
     &ModelSpec::n_group, kDeepseekFamilies, 1, 4096},
    {"topk-group", "router groups kept, topk_group", &ModelSpec::topk_group,
     kDeepseekFamilies, 1, 4096},
    {"index-heads", "V3.2 indexer index_n_heads", &ModelSpec::index_heads, kV32,
     1, 1024},
    {"index-head-dim", "V3.2 indexer index_head_dim (>= --qk-rope, even)",
     &ModelSpec::index_head_dim, kV32, 2, 4096},
    {"index-topk", "V3.2 indexer index_topk (tokens kept)",
     &ModelSpec::index_topk, kV32, 1, 1 << 24},
    {"mtp", "num_nextn_predict_layers (1: the MTP module, see below)",
     &ModelSpec::mtp_layers, kDeepseekFamilies, 0, 1},
};

llvm::ArrayRef<ShapeOption> shapeOptions() { return kShapeOptions; }

const ShapeOption *findShapeOption(StringRef name) {
  for (const ShapeOption &option : kShapeOptions)
    if (name == option.name)
      return &option;
  return nullptr;
}

std::string optionNameOf(int64_t ModelSpec::*field) {
  for (const ShapeOption &option : kShapeOptions)
    if (option.field == field)
      return std::string("--") + option.name;
  return "?";
}

//===----------------------------------------------------------------------===//
// Presets
//===----------------------------------------------------------------------===//

static ModelSpec makeTinyQwen3() {
  ModelSpec s;
  s.family = Family::Qwen3;
  s.preset = "tiny-qwen3";
  s.hidden = 256;
  s.layers = 2;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.intermediate = 768;
  s.vocab = 1024;
  s.max_pos = 4096;
  s.tie_embeddings = true;
  return s;
}

static ModelSpec makeTinyQwen3Moe() {
  ModelSpec s;
  s.family = Family::Qwen3Moe;
  s.preset = "tiny-qwen3-moe";
  s.hidden = 128;
  s.layers = 2;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.intermediate = 768;
  s.moe_intermediate = 256;
  s.experts = 16;
  s.top_k = 4;
  s.vocab = 512;
  s.max_pos = 4096;
  return s;
}

static ModelSpec makeTinyDeepseek() {
  ModelSpec s;
  s.family = Family::DeepseekV32;
  s.preset = "tiny-deepseek";
  s.hidden = 256;
  s.layers = 3;
  s.dense_layers = 1;
  s.heads = 4;
  s.kv_heads = 4;
  s.intermediate = 768;
  s.moe_intermediate = 256;
  s.experts = 16;
  s.top_k = 4;
  s.shared_experts = 1;
  s.n_group = 4;
  s.topk_group = 2;
  s.q_lora = 128;
  s.kv_lora = 128;
  s.qk_nope = 32;
  s.qk_rope = 32;
  s.v_head = 32;
  s.index_heads = 4;
  s.index_head_dim = 64;
  s.index_topk = 64;
  s.vocab = 1024;
  s.max_pos = 16384;
  return s;
}

// Dims that are not multiples of 128 (partial FP8 tiles everywhere:
// hidden 320, kv_a_proj_with_mqa 96 + 32 rows) and an indexer that keeps
// 16 tokens, so it drops tokens on any longer prompt.
static ModelSpec makeTinyDeepseekRagged() {
  ModelSpec s = makeTinyDeepseek();
  s.preset = "tiny-deepseek-ragged";
  s.hidden = 320;
  s.layers = 4;
  s.intermediate = 864;
  s.moe_intermediate = 192;
  s.q_lora = 160;
  s.kv_lora = 96;
  s.index_topk = 16;
  return s;
}

static ModelSpec makeQwen3_0_6B() {
  ModelSpec s;
  s.family = Family::Qwen3;
  s.preset = "qwen3-0.6b-shape";
  s.hidden = 1024;
  s.layers = 28;
  s.heads = 16;
  s.kv_heads = 8;
  s.head_dim = 128;
  s.intermediate = 3072;
  s.vocab = 151936;
  s.max_pos = 40960;
  s.tie_embeddings = true;
  return s;
}

static ModelSpec makeQwen3_30B_A3B() {
  ModelSpec s;
  s.family = Family::Qwen3Moe;
  s.preset = "qwen3-30b-a3b-shape";
  s.hidden = 2048;
  s.layers = 48;
  s.heads = 32;
  s.kv_heads = 4;
  s.head_dim = 128;
  s.intermediate = 6144;
  s.moe_intermediate = 768;
  s.experts = 128;
  s.top_k = 8;
  s.vocab = 151936;
  s.max_pos = 40960;
  return s;
}

static const PresetInfo kPresets[] = {
    {"tiny-qwen3", "Qwen3 dense, tied embeddings", makeTinyQwen3},
    {"tiny-qwen3-moe", "Qwen3-MoE", makeTinyQwen3Moe},
    {"tiny-deepseek",
     "DeepSeek-V3.2 (MLA + indexer; --family deepseek_v3 drops the indexer)",
     makeTinyDeepseek},
    {"tiny-deepseek-ragged",
     "DeepSeek-V3.2 with dims that are not multiples of 128, indexer top 16",
     makeTinyDeepseekRagged},
    {"qwen3-0.6b-shape", "the real Qwen3-0.6B shapes (~1.2 GB in bf16)",
     makeQwen3_0_6B},
    {"qwen3-30b-a3b-shape",
     "the real Qwen3-30B-A3B shapes (~1.2 GB a layer in bf16; use --layers)",
     makeQwen3_30B_A3B},
};

llvm::ArrayRef<PresetInfo> presets() { return kPresets; }

const PresetInfo *findPreset(StringRef name) {
  for (const PresetInfo &preset : kPresets)
    if (name == preset.name)
      return &preset;
  return nullptr;
}

ModelSpec tinyPresetFor(Family family) {
  ModelSpec spec;
  switch (family) {
  case Family::Qwen3:
    spec = makeTinyQwen3();
    break;
  case Family::Qwen3Moe:
    spec = makeTinyQwen3Moe();
    break;
  case Family::DeepseekV3:
  case Family::DeepseekV32:
    spec = makeTinyDeepseek();
    break;
  }
  spec.family = family;
  return spec;
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

/// "--hidden (100)".
static std::string show(const ModelSpec &spec, int64_t ModelSpec::*field) {
  return llvm::formatv("{0} ({1})", optionNameOf(field), spec.*field).str();
}

Error validateSpec(const ModelSpec &spec) {
  // Said before the generic range check, which would not tell why.
  if (spec.vocab < kMinVocab)
    return makeError(llvm::formatv(
        "--vocab ({0}) must be at least {1}: tokenizer.json needs the 256 "
        "byte tokens and <|endoftext|>, <|im_start|>, <|im_end|>",
        spec.vocab, kMinVocab));
  unsigned bit = familyBit(spec.family);
  for (const ShapeOption &option : kShapeOptions) {
    if (!(option.families & bit))
      continue;
    int64_t value = spec.*option.field;
    if (value < option.min_value || value > option.max_value)
      return makeError(llvm::formatv(
          "--{0} must be in [{1}, {2}] for {3}, got {4}", option.name,
          option.min_value, option.max_value, familyName(spec.family), value));
  }
  auto require = [&](bool ok, const llvm::Twine &message) -> Error {
    return ok ? Error::success() : makeError(message);
  };
  auto multipleOf32 = [&](int64_t ModelSpec::*field, const char *why) -> Error {
    return require(spec.*field % 32 == 0, show(spec, field) +
                                              " must be a multiple of 32 (" +
                                              why + ")");
  };
  if (Error e = multipleOf32(&ModelSpec::hidden,
                             "the K dim of gate/up; smallest fp9 block"))
    return e;
  if (Error e =
          multipleOf32(&ModelSpec::intermediate, "fp9 tensor-parallel slices"))
    return e;
  if (spec.isMoe())
    if (Error e = multipleOf32(&ModelSpec::moe_intermediate,
                               "fp9 tensor-parallel slices"))
      return e;

  if (!spec.isDeepseek()) {
    if (Error e = require(spec.heads % spec.kv_heads == 0,
                          show(spec, &ModelSpec::kv_heads) + " must divide " +
                              show(spec, &ModelSpec::heads) +
                              " (grouped-query attention)"))
      return e;
    if (Error e = require(spec.head_dim % 2 == 0,
                          show(spec, &ModelSpec::head_dim) +
                              " must be even (RoPE rotates pairs)"))
      return e;
  }

  if (spec.isMoe()) {
    if (Error e = require(spec.top_k <= spec.experts,
                          show(spec, &ModelSpec::top_k) + " must not exceed " +
                              show(spec, &ModelSpec::experts)))
      return e;
    if (Error e =
            require(spec.dense_layers <= spec.layers,
                    show(spec, &ModelSpec::dense_layers) + " must not exceed " +
                        show(spec, &ModelSpec::layers)))
      return e;
  }

  if (spec.isDeepseek()) {
    if (Error e = require(spec.qk_rope % 2 == 0,
                          show(spec, &ModelSpec::qk_rope) +
                              " must be even (RoPE rotates pairs)"))
      return e;
    if (Error e = require(spec.experts % spec.n_group == 0,
                          show(spec, &ModelSpec::n_group) + " must divide " +
                              show(spec, &ModelSpec::experts)))
      return e;
    int64_t per_group = spec.experts / spec.n_group;
    if (Error e = require(per_group >= 2,
                          show(spec, &ModelSpec::experts) + " / " +
                              show(spec, &ModelSpec::n_group) +
                              " must be at least 2 (a group scores by the "
                              "sum of its top-2 experts)"))
      return e;
    if (Error e =
            require(spec.topk_group <= spec.n_group,
                    show(spec, &ModelSpec::topk_group) + " must not exceed " +
                        show(spec, &ModelSpec::n_group)))
      return e;
    if (Error e = require(
            spec.top_k <= spec.topk_group * per_group,
            show(spec, &ModelSpec::top_k) + " must not exceed the experts " +
                "in the kept groups, --topk-group x --experts / --n-group = " +
                llvm::Twine(spec.topk_group * per_group)))
      return e;
  }

  if (spec.hasIndexer()) {
    if (Error e = require(spec.index_head_dim >= spec.qk_rope &&
                              spec.index_head_dim % 2 == 0,
                          show(spec, &ModelSpec::index_head_dim) +
                              " must be even and at least " +
                              show(spec, &ModelSpec::qk_rope) +
                              " (the indexer ropes its first qk_rope dims)"))
      return e;
  }
  return Error::success();
}

void describeShape(const ModelSpec &s, llvm::raw_ostream &os) {
  os << familyName(s.family) << ": hidden " << s.hidden << ", layers "
     << s.layers;
  if (s.isDeepseek()) {
    os << ", heads " << s.heads << " (MLA q_lora " << s.q_lora << ", kv_lora "
       << s.kv_lora << ", nope/rope/v " << s.qk_nope << "/" << s.qk_rope << "/"
       << s.v_head << ")";
  } else {
    os << ", heads " << s.heads << "/" << s.kv_heads << " x " << s.head_dim;
  }
  if (!s.isMoe() || s.dense_layers > 0)
    os << ", intermediate " << s.intermediate;
  if (s.isMoe()) {
    os << ", experts " << s.experts << " top-" << s.top_k << " x "
       << s.moe_intermediate;
    if (s.isDeepseek())
      os << " (+" << s.shared_experts << " shared, groups " << s.topk_group
         << "/" << s.n_group << ")";
    if (s.dense_layers > 0)
      os << ", " << s.dense_layers << " dense first";
  }
  if (s.hasIndexer())
    os << ", indexer " << s.index_heads << " x " << s.index_head_dim << " top "
       << s.index_topk;
  os << ", vocab " << s.vocab;
  if (s.tie_embeddings)
    os << ", tied embeddings";
}

} // namespace duck::mkmodel
