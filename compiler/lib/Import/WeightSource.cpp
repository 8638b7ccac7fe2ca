//===- WeightSource.cpp - checkpoint matrices as fp9 sources --------------===//
#include "duck/Import/WeightSource.h"

#include "llvm/Support/FormatVariadic.h"

#include <cstring>

using namespace mlir::duck;
using namespace mlir::duck::import;

static llvm::Error err(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

llvm::Expected<WeightSource>
mlir::duck::openWeightSource(const Checkpoint &ckpt, llvm::StringRef name) {
  WeightSource s;
  s.name = name.str();
  TensorRef ref = ckpt.find(name);
  if (!ref)
    return err("tensor '" + name + "' is missing from the checkpoint in " +
               ckpt.directory());
  const TensorInfo &t = *ref.info;
  if (t.shape.size() != 2)
    return err("tensor '" + name + "' is not a matrix");
  s.src.data = ref.data().data();
  s.src.src_rows = t.shape[0];
  s.src.src_cols = t.shape[1];
  switch (t.dtype) {
  case DType::F32:
    s.src.type = DUCK_FP9_SRC_F32;
    break;
  case DType::BF16:
    s.src.type = DUCK_FP9_SRC_BF16;
    break;
  case DType::F16:
    s.src.type = DUCK_FP9_SRC_F16;
    break;
  case DType::F8_E4M3: {
    std::optional<Fp8Weight> fp8 = ckpt.findFp8(name);
    if (!fp8)
      return err("FP8 tensor '" + name + "' has no '" + name +
                 "_scale_inv' block scales");
    const auto &bs = ckpt.model().quantization.weight_block_size;
    s.src.type = DUCK_FP9_SRC_E4M3;
    s.src.tile_rows = bs.size() == 2 ? bs[0] : 128;
    s.src.tile_cols = bs.size() == 2 ? bs[1] : 128;
    llvm::ArrayRef<uint8_t> sd = fp8->scale.data();
    size_t n = fp8->scale.info->numElements();
    s.scales.resize(n);
    for (size_t i = 0; i < n; ++i) {
      if (fp8->scale_dtype == DType::F32) {
        std::memcpy(&s.scales[i], sd.data() + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, sd.data() + 2 * i, 2);
        s.scales[i] = duck_bf16_to_f32(h);
      }
    }
    s.src.scale_inv = s.scales.data();
    break;
  }
  default:
    return err("tensor '" + name + "' has dtype " + dtypeName(t.dtype) +
               "; fp9 packing needs F32, BF16, F16 or F8_E4M3");
  }
  return s;
}

ExpertTensorNames mlir::duck::expertTensorNames(int64_t layer, bool moe,
                                                int64_t e, int64_t numRouted,
                                                int64_t inter) {
  std::string p = llvm::formatv("model.layers.{0}.mlp.", layer).str();
  if (!moe)
    return {p + "gate_proj.weight", p + "up_proj.weight",
            p + "down_proj.weight", 0};
  if (e < numRouted) {
    std::string q = llvm::formatv("{0}experts.{1}.", p, e).str();
    return {q + "gate_proj.weight", q + "up_proj.weight",
            q + "down_proj.weight", 0};
  }
  std::string q = p + "shared_experts.";
  return {q + "gate_proj.weight", q + "up_proj.weight", q + "down_proj.weight",
          (e - numRouted) * inter};
}
