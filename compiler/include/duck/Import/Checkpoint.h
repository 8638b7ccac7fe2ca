//===- Checkpoint.h - A HF model directory: config + weights ----*- C++ -*-===//
//
// Opens a model directory (config.json plus model.safetensors, a sharded
// model.safetensors.index.json, loose *.safetensors files or no weights at
// all), gives one tensor lookup across files, detects FP8 block-scaled
// weights, checks the checkpoint against the tensors its config implies and
// builds the `duckc describe` report.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_IMPORT_CHECKPOINT_H
#define DUCK_IMPORT_CHECKPOINT_H

#include "duck/Import/ModelConfig.h"
#include "duck/Import/Safetensors.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mlir::duck::import {

/// A tensor found in a checkpoint and the file that holds it.
struct TensorRef {
  const TensorInfo *info = nullptr;
  const SafetensorsFile *file = nullptr;

  explicit operator bool() const { return info != nullptr; }
  llvm::ArrayRef<uint8_t> data() const { return file->data(*info); }
};

/// An FP8 block-scaled weight: F8_E4M3 `weight` with a `<name>_scale_inv`
/// sibling, one multiplier per weight_block_size tile.
struct Fp8Weight {
  TensorRef weight;
  TensorRef scale;
  DType scale_dtype = DType::F32; ///< F32 or BF16
};

/// How the weights of a directory are stored.
enum class WeightLayout : uint8_t {
  None,       ///< config.json only
  SingleFile, ///< model.safetensors
  Index,      ///< model.safetensors.index.json + shards
  Loose,      ///< every *.safetensors file in the directory
};
llvm::StringRef weightLayoutName(WeightLayout layout);

/// A model directory, opened and validated.
class Checkpoint {
public:
  /// Opens `directory`: parses config.json, finds and validates the weight
  /// files. Errors name the file (and tensor) at fault.
  static llvm::Expected<std::unique_ptr<Checkpoint>>
  open(llvm::StringRef directory);

  llvm::StringRef directory() const { return directory_; }
  llvm::StringRef configPath() const { return config_path_; }
  const ModelDesc &model() const { return model_; }

  WeightLayout layout() const { return layout_; }
  bool hasWeights() const { return layout_ != WeightLayout::None; }
  /// The weight files, in name order.
  llvm::ArrayRef<std::unique_ptr<SafetensorsFile>> files() const {
    return files_;
  }
  size_t numTensors() const { return by_name_.size(); }
  /// Every tensor, in name order.
  std::vector<TensorRef> tensors() const;

  /// The tensor called `name` in any file; empty TensorRef if absent.
  TensorRef find(llvm::StringRef name) const;
  /// `weightName` as an FP8 block-scaled weight: its dtype is F8_E4M3 and
  /// `<weightName>_scale_inv` exists with dtype F32 or BF16. std::nullopt
  /// otherwise (use verifyCheckpoint() to reject malformed pairs).
  std::optional<Fp8Weight> findFp8(llvm::StringRef weightName) const;

  /// Harmless findings while opening (gaps in files, shard tensors missing
  /// from the index, ...).
  llvm::ArrayRef<std::string> notes() const { return notes_; }

private:
  Checkpoint() = default;
  llvm::Error openWeights();
  llvm::Error openIndex(llvm::StringRef indexPath);
  llvm::Error addFile(llvm::StringRef path);

  std::string directory_;
  std::string config_path_;
  ModelDesc model_;
  WeightLayout layout_ = WeightLayout::None;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  /// Tensor name -> tensor and the file holding it.
  std::map<std::string, TensorRef, std::less<>> by_name_;
  std::vector<std::string> notes_;
};

/// The outcome of a successful verifyCheckpoint().
struct CheckpointCheck {
  size_t expected = 0;    ///< required tensors per the config
  size_t found = 0;       ///< expected tensors present (incl. optional)
  size_t fp8_weights = 0; ///< F8_E4M3 weights with a valid scale
  size_t mtp_skipped = 0; ///< DeepSeek MTP-layer tensors, ignored
  size_t unexpected = 0;  ///< other tensors, ignored
  std::vector<std::string> unexpected_examples; ///< first few names
  std::vector<std::string> notes;
};

/// Checks `ckpt` against expectedTensors(ckpt.model()): every required
/// tensor present with the expected shape; every F8_E4M3 tensor has a
/// `_scale_inv` of dtype F32/BF16 and shape [ceil(N/b0), ceil(K/b1)].
/// The first violation is the error, naming the tensor (and its file).
/// A checkpoint without weights passes trivially.
llvm::Expected<CheckpointCheck> verifyCheckpoint(const Checkpoint &ckpt);

/// An ordered key/value report: one "key: value" line each as text, or a
/// JSON object of sections. Keys are unique across sections.
class DescribeReport {
public:
  struct Entry {
    std::string key;
    llvm::json::Value value;
    std::string hint; ///< text-only suffix, e.g. "(30.5B)"
  };
  struct Section {
    std::string name;
    std::vector<Entry> entries;
  };

  void add(llvm::StringRef section, llvm::StringRef key,
           llvm::json::Value value, llvm::StringRef hint = "");
  llvm::ArrayRef<Section> sections() const { return sections_; }
  /// The value of `key`, or nullptr.
  const llvm::json::Value *get(llvm::StringRef key) const;

  void printText(llvm::raw_ostream &os) const;
  llvm::json::Value toJson() const;

private:
  std::vector<Section> sections_;
};

/// Builds the `duckc describe` report of `ckpt`; when it has weights the
/// verifyCheckpoint() result is included and its failure is the error.
llvm::Expected<DescribeReport> describeCheckpoint(const Checkpoint &ckpt);

} // namespace mlir::duck::import

#endif // DUCK_IMPORT_CHECKPOINT_H
