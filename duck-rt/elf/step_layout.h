// Carve-up of the shared scratch of one duck ELF step. The ELF and
// duck_step_scratch_bytes (host side) both use this one definition, so the
// size the host reserves and the bytes the ELF touches never disagree.
// Freestanding: included by the ELF.
#ifndef DUCK_RT_ELF_STEP_LAYOUT_H
#define DUCK_RT_ELF_STEP_LAYOUT_H

#include "duck_rt/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/// Limits of one step; the ELF refuses larger inputs (BAD_INPUT or
/// BAD_WEIGHTS) and duck_step_scratch_bytes returns UINT64_MAX beyond them,
/// which also keeps every size product below 2^56.
enum {
  DUCK_STEP_MAX_TOKENS = 1 << 16,
  DUCK_STEP_MAX_TOP_K = 64, // duck_moe_prefill orders at most 64 slots a token
  DUCK_STEP_MAX_DIM = 1 << 18, // hidden and inter
  DUCK_STEP_MAX_EXPERTS = 4096,
  DUCK_STEP_MAX_CORES = 64,
  DUCK_STEP_SCRATCH_ALIGN = 64, // duck_info.scratch must be this aligned
};

/// Byte offsets inside the shared scratch, each 64-byte aligned:
///   [core 0 FFN scratch]...[core n-1]  duck_ffn_scratch_floats(h, i, tokens)
///   shared   float[tokens][inter]       dense hidden activations
///   pairs    float[tokens * top_k][hidden]  per-slot expert outputs
///   slots    duck_expert_slot[tokens * top_k]  sorted/remapped IB slots
///   work     uint32[duck_moe_prefill_work_words(...)]
///   x        float[tokens][hidden]     x widened from a bf16 IB
typedef struct duck_step_layout {
  uint64_t core_bytes;
  uint64_t shared_offset;
  uint64_t pairs_offset;
  uint64_t slots_offset;
  uint64_t work_offset;
  uint64_t x_offset;
  uint64_t total_bytes;
} duck_step_layout;

static inline uint64_t duck_step_align64(uint64_t v) {
  return (v + 63u) & ~(uint64_t)63u;
}

/// Returns 0 when an argument is beyond the limits above.
static inline int duck_step_layout_of(uint32_t hidden, uint32_t inter,
                                      uint32_t n_tokens, uint32_t top_k,
                                      uint32_t n_experts, uint32_t cores,
                                      duck_step_layout *out) {
  if (hidden > DUCK_STEP_MAX_DIM || inter > DUCK_STEP_MAX_DIM ||
      n_tokens > DUCK_STEP_MAX_TOKENS || top_k > DUCK_STEP_MAX_TOP_K ||
      n_experts > DUCK_STEP_MAX_EXPERTS || cores > DUCK_STEP_MAX_CORES)
    return 0;
  const uint64_t t = n_tokens ? n_tokens : 1;
  const uint64_t c = cores ? cores : 1;
  out->core_bytes =
      duck_step_align64(4 * duck_ffn_scratch_floats(hidden, inter, (uint32_t)t));
  out->shared_offset = out->core_bytes * c;
  out->pairs_offset = out->shared_offset + duck_step_align64(4 * t * inter);
  out->slots_offset =
      out->pairs_offset + duck_step_align64(4 * t * top_k * (uint64_t)hidden);
  out->work_offset = out->slots_offset + duck_step_align64(8 * t * top_k);
  out->x_offset =
      out->work_offset +
      duck_step_align64(4 * duck_moe_prefill_work_words(
                                (uint32_t)t, top_k, n_experts, (uint32_t)c));
  out->total_bytes = out->x_offset + duck_step_align64(4 * t * hidden);
  return 1;
}

#ifdef __cplusplus
} // extern "C"
#endif

#endif // DUCK_RT_ELF_STEP_LAYOUT_H
