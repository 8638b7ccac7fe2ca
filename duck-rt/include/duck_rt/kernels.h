// The duck compute kernels: fp9 GEMV/GEMM, fused dense and MoE FFN paths
// for decode and prefill, single and multi-core. AVX2 + FMA + F16C only,
// freestanding-clean (no libc, no heap, no exceptions): every buffer is
// passed in by the caller, so the same objects link into the duck ELF.
//
// Multi-core entry points are called by every core of a duck at once with
// the same arguments and their own `core` index; they synchronise through
// the duck_smp_ctx barrier (duck_rt/smp.h). Results are bit-identical
// whatever the number of cores: every output element is produced by exactly
// one core with the same instruction sequence, and every cross-core
// reduction runs on core 0 in a fixed order.
#ifndef DUCK_RT_KERNELS_H
#define DUCK_RT_KERNELS_H

#include "duck_rt/fp9_pack.h"
#include "duck_rt/kernel_select.h"
#include "duck_rt/smp.h"

#ifdef __cplusplus
extern "C" {
#endif

/// Inner-loop decode path of the general kernels (benchmark switch).
typedef enum duck_decode_path {
  DUCK_DECODE_SHIFT = 0, // vpmovzxbd + vpslld: fp32 bits
  DUCK_DECODE_F16C = 1,  // vpmovzxbw + vpsllw + vcvtph2ps
} duck_decode_path;


/// A packed fp9 matrix in memory (planes resolved from a base pointer).
typedef struct duck_fp9_matrix {
  const uint8_t *mag;
  const uint32_t *sign;
  const float *scale;
  uint32_t rows, k, block, scale_rows, row_phase;
  uint32_t kernel; // duck_kernel_id
} duck_fp9_matrix;

/// Resolves the planes of a packed matrix and selects its kernel.
duck_fp9_matrix duck_fp9_matrix_view(const duck_fp9_desc *desc,
                                     const void *base);

/// y[r - row_begin] = sum_k W[r][k] * x[k] for rows [row_begin, row_end).
/// `xs` is scratch of 2 * m->k floats (32-byte aligned): the pre-scaled input
/// (and, for the F16C path, its negation).
void duck_gemv(const duck_fp9_matrix *m, const float *x, float *y,
               uint32_t row_begin, uint32_t row_end, float *xs,
               duck_decode_path path);

/// Batched GEMM for prefill: y[t][r - row_begin] (row stride y_ld) for
/// tokens t < n_tokens with inputs x[t][k] (row stride x_ld). From
/// DUCK_GEMM_PANEL_MIN tokens on, every weight is read and decoded once for
/// all the tokens: rows are decoded three at a time into a panel in L1 (K
/// in segments, below) and every token's pre-scaled input streams past
/// them (from 16 tokens two of the four accumulator groups at a time, all
/// the tokens passing groups 0 and 1 before 2 and 3); below it, each row
/// is decoded in registers for its 1 to 4 tokens (three and four: two
/// passes over the row, two accumulator groups each). Each token's result
/// is bit-identical to duck_gemv on that token alone. `xs` holds 2 *
/// n_tokens * m->k floats (32-byte aligned): the pre-scaled inputs, then
/// the panel and the tokens' accumulators.
enum { DUCK_N_TILE = 3, DUCK_GEMM_PANEL_MIN = 5 };

/// Weight decodes a row of duck_gemm makes for n tokens (one for any n).
static inline uint32_t duck_gemm_tiles(uint32_t n) { return n ? 1 : 0; }
void duck_gemm(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
               uint32_t n_tokens, float *y, uint32_t y_ld, uint32_t row_begin,
               uint32_t row_end, float *xs);

/// Fills duck_gemm's panel: columns [c0, c1) of `rows` consecutive rows
/// (magnitudes k bytes a row from `mag`, sign words k / 32 a row from
/// `sign`) into `panel`, row r at r * (c1 - c0) floats, each 32-chunk in
/// the shift path's order (position 8q + j holds weight 4j + q) as the
/// fp32 bits (m << 20) with the weight's sign: exact values, so any
/// decoder that writes them gives duck_gemm's bits.
typedef void (*duck_panel_decode_fn)(const uint8_t *mag, const uint32_t *sign,
                                     uint32_t k, uint32_t rows, uint32_t c0,
                                     uint32_t c1, float *panel);

/// The panel GEMM's K segment in columns: 1024 from 16 tokens (two
/// accumulator groups a pass); below, 1024 where this core's L1 data cache
/// holds 48 KiB or more, 512 where it holds less (CPUID, once).
/// duck_gemm_set_panel_segment sets one for every token count (a multiple
/// of 32; 0 returns to the defaults), for tests of every segment; results
/// do not depend on it.
void duck_gemm_set_panel_segment(uint32_t columns);

/// duck_gemm with another panel decoder (null: the AVX2 one), for hosts
/// with a cheaper decode (the host's AVX-512); from DUCK_GEMM_PANEL_MIN
/// tokens on the decode is a large part of a small batch's work.
void duck_gemm_with_decoder(const duck_fp9_matrix *m, const float *x,
                            uint32_t x_ld, uint32_t n_tokens, float *y,
                            uint32_t y_ld, uint32_t row_begin,
                            uint32_t row_end, float *xs,
                            duck_panel_decode_fn decode);

/// Host matrices of an FP8 checkpoint kept as its e4m3 bytes (the ducks hold
/// fp9; a host without AVX-512 reads these instead): `m->mag` points at
/// the bytes, row-major, 1 byte a weight with its sign inside; `m->scale`
/// is an fp9 scale plane (the checkpoint's scale_inv, as duck_fp9_pack
/// lays it out); `m->sign` is not read. The e4m3 bits moved to fp32 bit 20
/// are the value times 2^-120, so one arithmetic shift right and one mask
/// decode a weight with its sign (11 vector operations a 32-chunk where fp9
/// takes 12). Results have the fp9 kernels' bits for the same weights (each
/// product is theirs times 2^-15, undone exactly at the end).
///
/// Rows [row_begin, row_end) against one input; `xs` is m->k floats.
void duck_e4m3_gemv(const duck_fp9_matrix *m, const float *x, float *y,
                    uint32_t row_begin, uint32_t row_end, float *xs);
/// duck_gemm for such a matrix, any n_tokens (the panel path from 2 tokens
/// on, the GEMV for one); `xs` holds duck_e4m3_gemm_scratch_floats floats.
void duck_e4m3_gemm(const duck_fp9_matrix *m, const float *x, uint32_t x_ld,
                    uint32_t n_tokens, float *y, uint32_t y_ld,
                    uint32_t row_begin, uint32_t row_end, float *xs);
uint64_t duck_e4m3_gemm_scratch_floats(uint32_t n_tokens, uint32_t k);

/// One FFN (a dense MLP slice or one expert's slice): gate/up [inter, hidden],
/// down [hidden, inter].
typedef struct duck_ffn_weights {
  duck_fp9_matrix gate, up, down;
} duck_ffn_weights;

/// Scratch floats a core needs for the FFN entry points below.
uint64_t duck_ffn_scratch_floats(uint32_t hidden, uint32_t inter,
                                 uint32_t n_tokens);

/// Dense MLP decode on a tensor-parallel slice (mode 0): out[hidden] is the
/// slice's partial output. `shared` is scratch of inter floats visible to all
/// cores; `scratch[core]` is per-core scratch.
void duck_mlp_decode(const duck_smp_ctx *smp, uint32_t core,
                     const duck_ffn_weights *w, const float *x, float *out,
                     float *shared, float *scratch);

/// One activated expert of a token: expert id and routing weight.
typedef struct duck_expert_slot {
  uint32_t expert;
  float weight;
} duck_expert_slot;

/// MoE decode (modes 1 and 4): out[hidden] = sum over slots of
/// weight * expert(x), slots sorted by expert id on core 0, contiguous slot
/// runs per worker, one fp32 buffer per slot in `slot_out`
/// [n_slots][hidden], reduced on core 0 in slot order.
/// `experts[id]` gives each expert's weights.
void duck_moe_decode(const duck_smp_ctx *smp, uint32_t core,
                     const duck_ffn_weights *experts, uint32_t n_experts,
                     duck_expert_slot *slots, uint32_t n_slots,
                     const float *x, float *out, float *slot_out,
                     float *scratch);

/// MoE decode of a token with one slot (a staged step's shared expert,
/// duckd's DUCK_IB_STAGE) over every core: the expert's rows split as
/// duck_mlp_decode splits a dense slice (`shared`: inter floats for all
/// cores), weighted and written as duck_moe_decode's sum of one slot
/// (0 + y * weight), so the bits are those of duck_moe_decode.
void duck_moe_decode_one(const duck_smp_ctx *smp, uint32_t core,
                         const duck_ffn_weights *experts, uint32_t n_experts,
                         const duck_expert_slot *slot, const float *x,
                         float *out, float *shared, float *scratch);

/// Dense prefill (mode 5): out[t][hidden] for n_tokens inputs x[t][hidden].
/// `shared` holds n_tokens * inter floats.
void duck_mlp_prefill(const duck_smp_ctx *smp, uint32_t core,
                      const duck_ffn_weights *w, const float *x,
                      uint32_t n_tokens, float *out, float *shared,
                      float *scratch);

/// MoE prefill (mode 6). `slots` is [n_tokens][top_k]. `work` is integer
/// scratch of duck_moe_prefill_work_words(...) words shared by all cores;
/// `pair_out` is [n_tokens * top_k][hidden] floats.
uint64_t duck_moe_prefill_work_words(uint32_t n_tokens, uint32_t top_k,
                                     uint32_t n_experts, uint32_t cores);
void duck_moe_prefill(const duck_smp_ctx *smp, uint32_t core,
                      const duck_ffn_weights *experts, uint32_t n_experts,
                      const duck_expert_slot *slots, uint32_t top_k,
                      const float *x, uint32_t n_tokens, float *out,
                      float *pair_out, uint32_t *work, float *scratch);

#ifdef __cplusplus
} // extern "C"
#endif

#endif // DUCK_RT_KERNELS_H
