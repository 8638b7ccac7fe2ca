//===- ModelSpec.h - Family, dtype and shapes of a model --------*- C++ -*-===//
//
// A ModelSpec is the complete, validated description of one synthetic
// checkpoint. Presets give whole specs; command-line options override single
// fields (see Cli.h). Validation names the command-line option of the
// offending field, since that is what the user has to change.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_MKMODEL_MODELSPEC_H
#define DUCK_MKMODEL_MODELSPEC_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <optional>
#include <string>

namespace llvm {
class raw_ostream;
} // namespace llvm

namespace duck::mkmodel {

enum class Family : uint8_t { Qwen3, Qwen3Moe, DeepseekV3, DeepseekV32 };
enum class WeightFormat : uint8_t { BF16, FP8 };

/// config.json "model_type": "qwen3", "qwen3_moe", "deepseek_v3",
/// "deepseek_v32".
llvm::StringRef familyName(Family family);
std::optional<Family> parseFamily(llvm::StringRef name);
/// "bf16" or "fp8".
llvm::StringRef formatName(WeightFormat format);
std::optional<WeightFormat> parseFormat(llvm::StringRef name);

/// Bit of `family` in a family mask (see ShapeOption::families).
constexpr unsigned familyBit(Family family) {
  return 1u << static_cast<unsigned>(family);
}
constexpr unsigned kQwenFamilies =
    familyBit(Family::Qwen3) | familyBit(Family::Qwen3Moe);
constexpr unsigned kDeepseekFamilies =
    familyBit(Family::DeepseekV3) | familyBit(Family::DeepseekV32);
constexpr unsigned kMoeFamilies =
    familyBit(Family::Qwen3Moe) | kDeepseekFamilies;
constexpr unsigned kAllFamilies = kQwenFamilies | kDeepseekFamilies;

struct ModelSpec {
  Family family = Family::Qwen3;
  WeightFormat format = WeightFormat::BF16;
  uint64_t seed = 0;
  /// The preset the spec started from ("" if none); informational.
  std::string preset;

  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0; ///< Qwen3; DeepSeek configs repeat `heads`
  int64_t head_dim = 0; ///< Qwen3 only
  int64_t intermediate = 0;
  int64_t moe_intermediate = 0;
  int64_t experts = 0;
  int64_t top_k = 0;
  int64_t shared_experts = 0; ///< DeepSeek
  /// DeepSeek first_k_dense_replace; Qwen3-MoE mlp_only_layers = [0, n).
  int64_t dense_layers = 0;
  int64_t vocab = 0;
  int64_t max_pos = 0;
  bool tie_embeddings = false;

  // MLA (DeepSeek).
  int64_t q_lora = 0;
  int64_t kv_lora = 0;
  int64_t qk_nope = 0;
  int64_t qk_rope = 0;
  int64_t v_head = 0;
  int64_t n_group = 0;
  int64_t topk_group = 0;

  // Lightning indexer (DeepSeek-V3.2).
  int64_t index_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;

  /// DeepSeek num_nextn_predict_layers: 1 writes the MTP module as
  /// model.layers.{layers}.* (docs/mtp.md).
  int64_t mtp_layers = 0;

  bool isMoe() const { return familyBit(family) & kMoeFamilies; }
  bool isDeepseek() const { return familyBit(family) & kDeepseekFamilies; }
  bool hasIndexer() const { return family == Family::DeepseekV32; }
  bool isFp8() const { return format == WeightFormat::FP8; }
  /// Whether layer `layer` has routed experts (else a dense MLP of width
  /// `intermediate`).
  bool isMoeLayer(int64_t layer) const {
    return isMoe() && layer >= dense_layers;
  }
};

/// One integer field settable from the command line.
struct ShapeOption {
  const char *name; ///< without "--"
  const char *help;
  int64_t ModelSpec::*field;
  unsigned families; ///< mask of families the option applies to
  int64_t min_value;
  int64_t max_value;
};
llvm::ArrayRef<ShapeOption> shapeOptions();
const ShapeOption *findShapeOption(llvm::StringRef name);
/// "--hidden" for the option that sets `field`.
std::string optionNameOf(int64_t ModelSpec::*field);

struct PresetInfo {
  const char *name;
  const char *help;
  ModelSpec (*make)();
};
llvm::ArrayRef<PresetInfo> presets();
const PresetInfo *findPreset(llvm::StringRef name);
/// The tiny preset of `family` (the base when only --family is given).
ModelSpec tinyPresetFor(Family family);

/// Checks ranges and cross-field rules. The error names the option.
llvm::Error validateSpec(const ModelSpec &spec);

/// One line with the main shape numbers, e.g. for --help.
void describeShape(const ModelSpec &spec, llvm::raw_ostream &os);

} // namespace duck::mkmodel

#endif // DUCK_MKMODEL_MODELSPEC_H
