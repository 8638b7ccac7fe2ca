// duck_step_scratch_bytes: the shared scratch a duck ELF step needs. Built
// into the ELF and into the host library duck_abi (the host sizes the
// scratch it asks duckd for at open).
#include "step_layout.h"

extern "C" uint64_t duck_step_scratch_bytes(uint32_t hidden, uint32_t inter,
                                            uint32_t n_tokens, uint32_t top_k,
                                            uint32_t n_experts,
                                            uint32_t cores) {
  duck_step_layout l;
  if (!duck_step_layout_of(hidden, inter, n_tokens, top_k, n_experts, cores,
                           &l))
    return ~(uint64_t)0;
  return l.total_bytes;
}
