// Synthetic weight images and step buffers for the duckd tests and the
// judge/cache benchmarks: a duck weight image exactly as abi.h lays it out
// (header, slot table, dense and MoE slots of packed fp9 matrices), host
// views of its matrices for running the kernels in-process, and IB
// builders. Never used on the production path (the compiler writes real
// images).
#ifndef DUCK_RT_DUCKD_SYNTHETICIMAGE_H
#define DUCK_RT_DUCKD_SYNTHETICIMAGE_H

#include "duck_rt/abi.h"

#include "absl/status/statusor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace duck::duckd {

struct SyntheticSlot {
  duck_slot_kind kind = DUCK_SLOT_DENSE;
  uint32_t layer = 0;
  uint32_t inter = 128; // a HEAD slot: its vocabulary rows
  uint32_t experts = 1;      // MoE: routed experts of the slot
  std::vector<bool> present; // MoE: which experts this duck holds (all)
  uint32_t k = 0; // a HEAD slot: its K (0: the spec's hidden; an o_proj's
                  // is heads x v_head_dim)
  /// A HEAD slot of several matrices: each one's rows (summing to
  /// `inter`); empty: one matrix.
  std::vector<uint32_t> pieces = {};
};

struct SyntheticSpec {
  uint32_t hidden = 128;
  uint32_t block = 64;
  uint32_t tp_size = 1, tp_rank = 0;
  uint64_t seed = 1; // weights and the model key derive from it
  std::vector<SyntheticSlot> slots;
  /// true: random FP8 sources packed with duck_fp9_pack (exact, slow);
  /// false: valid fp9 planes filled directly (fast, for big images).
  bool pack = true;
};

/// Bytes of the image `spec` describes.
uint64_t SyntheticImageBytes(const SyntheticSpec &spec);

/// Builds the image in memory.
absl::StatusOr<std::vector<uint8_t>> BuildSyntheticImage(
    const SyntheticSpec &spec);

/// Builds the image into a file (streamed slot by slot).
absl::Status WriteSyntheticImage(const SyntheticSpec &spec,
                                 const std::string &path);

/// Host views of slot `slot` of an image in memory: one duck_ffn_weights
/// per expert (shape-only for experts the duck does not hold).
std::vector<duck_ffn_weights> SlotViews(const uint8_t *image, uint32_t slot);

/// An IB per abi.h: header, slots[n_tokens * top_k], x at a 32-byte aligned
/// offset.
std::vector<uint8_t> MakeIb(uint32_t mode, uint32_t slot, uint32_t n_tokens,
                            uint32_t top_k,
                            const std::vector<duck_expert_slot> &slots,
                            const std::vector<float> &x);

/// Random activations and routing (deterministic in `seed`).
std::vector<float> RandomX(uint32_t n, uint64_t seed);
std::vector<duck_expert_slot> RandomRouting(uint32_t n_tokens, uint32_t top_k,
                                            uint32_t experts, uint64_t seed);

} // namespace duck::duckd

#endif // DUCK_RT_DUCKD_SYNTHETICIMAGE_H
