//===- ModelConfig.h - Typed view of a HF config.json -----------*- C++ -*-===//
//
// Parses the config.json of the model families Duck compiles (Qwen3 dense,
// Qwen3-MoE, DeepSeek-V3, DeepSeek-V3.2) into one ModelDesc, answers
// per-layer questions (MoE or dense, FFN width) and lists the tensors a
// checkpoint of the model must contain (reference/TENSORS.md).
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_IMPORT_MODELCONFIG_H
#define DUCK_IMPORT_MODELCONFIG_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mlir::duck::import {

/// Supported model families, keyed by config.json "model_type". Append only.
enum class ModelFamily : uint8_t {
  Qwen3,       ///< "qwen3": dense, GQA attention with q/k norms
  Qwen3Moe,    ///< "qwen3_moe": softmax top-k router, no shared expert
  DeepSeekV3,  ///< "deepseek_v3": MLA, sigmoid group-limited router
  DeepSeekV32, ///< "deepseek_v32": V3 plus the DSA lightning indexer
};

/// The config.json "model_type" string of `family`.
llvm::StringRef modelTypeName(ModelFamily family);
std::optional<ModelFamily> parseModelType(llvm::StringRef modelType);
/// "qwen3, qwen3_moe, deepseek_v3, deepseek_v32" for messages.
std::string supportedModelTypeList();

/// "rope_scaling" (null in Qwen3 unless a user turns YaRN on for long
/// contexts; YaRN in DeepSeek). Only "default" (plain RoPE) and "yarn"
/// pass parsing.
struct RopeScaling {
  std::string type; ///< "rope_type" or legacy "type": "default" or "yarn"
  double factor = 1.0;
  std::optional<double> beta_fast;
  std::optional<double> beta_slow;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  std::optional<double> attention_factor;
  /// For "yarn", max_position_embeddings when the config leaves it out
  /// (as HF does).
  std::optional<int64_t> original_max_position_embeddings;

  bool isYarn() const { return type == "yarn"; }
  /// What HF's yarn scales cos and sin by: "attention_factor" when given,
  /// else mscale(factor, mscale) / mscale(factor, mscale_all_dim) when
  /// both are non-zero, else mscale(factor) = 0.1 ln(factor) + 1 (1 for
  /// factor <= 1).
  double yarnAttentionFactor() const;
};

/// "quantization_config". Only block FP8 (e4m3 weights, block scales) exists
/// in the supported checkpoints; anything else is refused at parse time.
struct QuantizationConfig {
  enum class Method : uint8_t { None, Fp8 };
  Method method = Method::None;
  /// [rows, cols] of one scale block; [128, 128] unless the config says.
  std::vector<int64_t> weight_block_size;
  std::string fmt;               ///< "e4m3"
  std::string scale_fmt;         ///< "" or "ue8m0" (power-of-two scales)
  std::string activation_scheme; ///< "dynamic"
  std::vector<std::string> modules_to_not_convert;

  bool isFp8() const { return method == Method::Fp8; }
};

/// Everything Duck needs from config.json, for every supported family.
/// Fields that a family does not have stay at their zero value.
struct ModelDesc {
  ModelFamily family = ModelFamily::Qwen3;
  std::vector<std::string> architectures; ///< informational only
  std::string torch_dtype;                ///< "bfloat16" (may be empty)

  // Shared by all families.
  int64_t hidden_size = 0;
  int64_t num_layers = 0; ///< num_hidden_layers (DeepSeek MTP excluded)
  int64_t vocab_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_kv_heads = 0; ///< defaults to num_attention_heads
  /// Qwen3: "head_dim" or hidden/heads. DeepSeek: qk_nope + qk_rope.
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids; ///< "eos_token_id" int or list
  /// Dense MLP width (every Qwen3 layer; DeepSeek layers < first_k_dense;
  /// Qwen3-MoE mlp_only_layers). 0 when the model has no dense layer.
  int64_t intermediate_size = 0;

  // MoE (Qwen3-MoE and DeepSeek).
  int64_t num_routed_experts = 0; ///< num_experts / n_routed_experts
  int64_t experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;      ///< Qwen3-MoE
  std::vector<int64_t> mlp_only_layers; ///< Qwen3-MoE
  int64_t n_shared_experts = 0;         ///< DeepSeek
  int64_t first_k_dense_replace = 0;    ///< DeepSeek
  int64_t moe_layer_freq = 1;           ///< DeepSeek
  std::string scoring_func;             ///< "softmax" / "sigmoid"
  std::string topk_method;              ///< "" / "noaux_tc"
  int64_t n_group = 0;
  int64_t topk_group = 0;
  double routed_scaling_factor = 1.0;

  // MLA (DeepSeek).
  int64_t q_lora_rank = 0; ///< 0 = no q LoRA (config null)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  // DSA lightning indexer (DeepSeek-V3.2).
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;

  int64_t num_nextn_predict_layers = 0; ///< DeepSeek MTP layers (skipped)

  QuantizationConfig quantization;

  bool isQwen() const {
    return family == ModelFamily::Qwen3 || family == ModelFamily::Qwen3Moe;
  }
  bool isDeepSeek() const { return !isQwen(); }
  /// True if any layer has a routed-expert FFN.
  bool hasMoe() const { return num_routed_experts > 0; }
  bool usesMla() const { return isDeepSeek(); }
  bool hasIndexer() const { return family == ModelFamily::DeepSeekV32; }

  /// Whether layer `layer` (0-based) has a routed-expert FFN.
  /// Qwen3-MoE: not in mlp_only_layers and (L+1) % decoder_sparse_step == 0.
  /// DeepSeek: L >= first_k_dense_replace and L % moe_layer_freq == 0,
  /// and the MTP layers after the last layer (docs/mtp.md).
  bool isMoeLayer(int64_t layer) const;
  /// Width of one FFN of the layer: moe_intermediate_size for an MoE layer
  /// (per routed expert), intermediate_size for a dense one.
  int64_t ffnIntermediate(int64_t layer) const;
  int64_t numMoeLayers() const;
  int64_t numDenseLayers() const { return num_layers - numMoeLayers(); }
};

/// Parses a config.json value. `source` (usually the file path) prefixes
/// every message, e.g. "config.json: missing required field 'hidden_size'
/// (needed for family qwen3)".
llvm::Expected<ModelDesc> parseModelConfig(const llvm::json::Value &config,
                                           llvm::StringRef source);
/// Parses config.json text.
llvm::Expected<ModelDesc> parseModelConfigText(llvm::StringRef text,
                                               llvm::StringRef source);
/// Reads and parses the file at `path`.
llvm::Expected<ModelDesc> loadModelConfig(llvm::StringRef path);

/// What a tensor is for; drives FP8 expectations and parameter accounting.
enum class TensorRole : uint8_t {
  Embedding,
  Norm,
  Attention, ///< attention projections (incl. MLA low-rank ones)
  Indexer,   ///< DeepSeek-V3.2 lightning-indexer projections
  Router,    ///< MoE gate weight and correction bias
  DenseFfn,  ///< dense MLP gate/up/down
  RoutedExpert,
  SharedExpert,
  LmHead,
};

/// One tensor a checkpoint must (or, if `optional`, may) contain.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  TensorRole role = TensorRole::Norm;
  /// A Linear weight that FP8 checkpoints store as F8_E4M3 + _scale_inv.
  bool fp8_eligible = false;
  /// May be absent (lm_head when tie_word_embeddings).
  bool optional = false;
  /// Layer index, -1 for global tensors.
  int64_t layer = -1;
};

/// Every tensor a checkpoint of `desc` has, per reference/TENSORS.md, in
/// model order. DeepSeek MTP layers (index >= num_layers) are not listed.
std::vector<ExpectedTensor> expectedTensors(const ModelDesc &desc);

/// The first MTP layer's tensors (docs/mtp.md: model.layers.<num_layers>.*,
/// its decoder layer a MoE layer), in module order; empty without one.
/// Only this layer is compiled (duckc compile --mtp); later ones are not.
std::vector<ExpectedTensor> mtpTensors(const ModelDesc &desc);

/// True if `name` belongs to a DeepSeek MTP layer ("model.layers.<L>." with
/// L >= num_layers), which plain inference skips.
bool isSkippedMtpTensor(const ModelDesc &desc, llvm::StringRef name);

/// Parameter counts derived from expectedTensors() (tied lm_head counted
/// once; FP8 scales not counted).
struct ParamCounts {
  int64_t total = 0;
  int64_t embedding = 0;      ///< embed_tokens (+ untied lm_head)
  int64_t ffn = 0;            ///< what the ducks hold: dense MLPs + experts
  int64_t routed_experts = 0; ///< all routed experts of all layers
  int64_t activated = 0;      ///< per token: total minus unused experts
};
ParamCounts countParams(const ModelDesc &desc);

} // namespace mlir::duck::import

#endif // DUCK_IMPORT_MODELCONFIG_H
