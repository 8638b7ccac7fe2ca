//===- MlaAttention.cpp - DeepSeek multi-head latent attention ------------===//
//
// Not written yet: the plan carries MLA's weights (MlaAttentionOpDef), the
// host does not run it. duckrun refuses DeepSeek plans here, at load, with
// this message.
//===----------------------------------------------------------------------===//
#include "HostOp.h"

namespace duck::runtime::ops {

HostOpOr CreateMlaAttention(const OpEnv &env) {
  (void)env;
  return absl::UnimplementedError(
      "this runtime does not run DeepSeek MLA attention yet (the plan "
      "compiles; duckrun supports Qwen3 and Qwen3-MoE)");
}

} // namespace duck::runtime::ops
