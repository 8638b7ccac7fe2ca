//===- Plan.h - a compiled plan, loaded and verified ------------*- C++ -*-===//
//
// Loads model.duckplan (the FlatBuffers verifier runs once, then semantic
// checks whose messages name the failing index), maps the checkpoint files
// the plan references (checking each is the file the plan was compiled
// against: size and header hash) and checks the weight images are present
// with the planned sizes. After Load() succeeds the rest of the runtime
// trusts the plan.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_PLAN_H
#define DUCK_RUNTIME_PLAN_H

#include "duck/plan/plan_generated.h"
#include "duck/runtime/plan/OpKinds.h"
#include "plan_ops.h"

#include "absl/status/statusor.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace duck::runtime {

/// The plan version this runtime reads (the schema's PlanFormat).
constexpr uint32_t kPlanVersion = (uint32_t)::duck::plan::PlanFormat::Version;

/// A read-only memory mapping of a whole file.
class MappedFile {
public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string &path);
  ~MappedFile();
  const uint8_t *data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string &path() const { return path_; }

private:
  MappedFile() = default;
  std::string path_;
  const uint8_t *data_ = nullptr;
  uint64_t size_ = 0;
};

struct PlanLoadOptions {
  /// Also re-hash every slot of every weight image (slow for big models).
  bool verify_weight_checksums = false;
  /// Checkpoint directory; default: the plan's checkpoint_dir.
  std::string checkpoint_dir;
};

class LoadedPlan {
public:
  /// Checks every op against its descriptor in `kinds` (the engine's
  /// registry, HostOpKinds()), which must outlive the plan.
  static absl::StatusOr<std::unique_ptr<LoadedPlan>>
  Load(const std::string &dir, const OpKindTable &kinds,
       const PlanLoadOptions &options = {});

  const duck::plan::PlanDef &def() const { return *def_; }
  const std::string &dir() const { return dir_; }
  const OpKindTable &kinds() const { return *kinds_; }
  /// The checkpoint tensors op reads on the host (its descriptor's list).
  HostTensors OpTensors(const ::duck::plan::OpDef &op) const;
  /// The op that writes value `id` (null: an input of the program).
  const ::duck::plan::OpDef *Producer(uint32_t id) const;
  /// Path of duck `rank`'s weight image.
  std::string ImagePath(uint32_t rank) const;
  /// The bytes of a host tensor (inside a mapped checkpoint file).
  const uint8_t *TensorData(const duck::plan::TensorDef &t) const;
  /// Maps every page of the host's tensors (the ones OpTensors names, and
  /// their scales) into this process now, so the first prompt does not
  /// take the page faults (a 0.6B model's bf16 LM head alone is 76,000
  /// pages). Reads nothing the host ops would not read; the ducks' FFN
  /// weights in the same files stay unmapped. Returns the bytes mapped.
  uint64_t MapHostTensors() const;
  /// "tokenizer.json" next to the checkpoint, if it exists, else "".
  std::string TokenizerPath() const;

private:
  LoadedPlan() = default;
  absl::Status CheckVersions() const;
  absl::Status Check(const PlanLoadOptions &options);

  std::string dir_, checkpoint_dir_;
  const OpKindTable *kinds_ = nullptr;
  std::unique_ptr<MappedFile> plan_file_;
  const duck::plan::PlanDef *def_ = nullptr;
  std::vector<std::unique_ptr<MappedFile>> files_;
};

} // namespace duck::runtime

#endif
