// The byte layout of one FFN slot of a weight image (abi.h, section 2):
// the slot header and its descriptor table, then each expert this duck
// holds as gate | up | down packed fp9 matrices. The one definition the
// compiler's layout pass, duckd's synthetic images and the benchmarks use.
// C-compatible and freestanding-clean.
#ifndef DUCK_RT_SLOT_LAYOUT_H
#define DUCK_RT_SLOT_LAYOUT_H

#include "duck_rt/abi.h"
#include "duck_rt/fp9_pack.h"

#ifdef __cplusplus
extern "C" {
#endif

/// One expert's (or a dense slice's) three matrices on a duck: gate and up
/// [local_inter, hidden], down [hidden, local_inter], all with `block`-wide
/// K blocks and scale tiles of `scale_rows` source rows; gate/up start
/// `row_phase` rows into their first tile (the slice's offset in the full
/// intermediate dimension modulo scale_rows).
typedef struct duck_slot_shape {
  uint32_t hidden, local_inter, block, scale_rows, row_phase;
  uint32_t n_experts; // descriptors in the table: 1 dense, routed + shared
  uint32_t held;      // experts stored in this slot (present ones)
} duck_slot_shape;

typedef struct duck_slot_layout {
  duck_fp9_desc gate, up, down;
  duck_fp9_layout gate_layout, up_layout, down_layout;
  uint64_t table_bytes;  // header + descriptors, DUCK_FP9_PLANE_ALIGN'ed
  uint64_t up_offset, down_offset; // within an expert (gate at 0)
  uint64_t expert_bytes; // gate + up + down of one expert
  uint64_t total_bytes;  // table + held experts, DUCK_IMAGE_ALIGN'ed
} duck_slot_layout;

/// Computes a slot's layout; DUCK_FP9_OK, or the status of the first matrix
/// whose shape has no fp9 layout.
duck_fp9_status duck_compute_slot_layout(const duck_slot_shape *shape,
                                         duck_slot_layout *out);

/// A HEAD slot (abi.h): the table (header + one descriptor), then the
/// [rows, hidden] head matrix at `table_bytes`.
typedef struct duck_head_slot_layout {
  duck_fp9_desc matrix;
  duck_fp9_layout matrix_layout;
  uint64_t table_bytes, total_bytes; // total DUCK_IMAGE_ALIGN'ed
} duck_head_slot_layout;

duck_fp9_status duck_compute_head_slot_layout(uint32_t rows, uint32_t hidden,
                                              uint32_t block,
                                              uint32_t scale_rows,
                                              uint32_t row_phase,
                                              duck_head_slot_layout *out);

/// A HEAD slot of `count` matrices (abi.h; pieces of one or several
/// [*, hidden] weights whose rows the slot concatenates in order): the
/// table (header + `count` descriptors), then matrix i, shaped
/// rows[i] x hidden with row_phase[i], at offsets[i] from the slot's start.
/// `descs` and `offsets` take `count` entries each.
duck_fp9_status duck_compute_head_slot_pieces(
    uint32_t count, const uint32_t *rows, const uint32_t *row_phase,
    uint32_t hidden, uint32_t block, uint32_t scale_rows, duck_fp9_desc *descs,
    uint64_t *offsets, uint64_t *total_bytes);

/// The same with each matrix's own K (`ks[i]`; null: `hidden` for all):
/// a chained head slot's pieces (abi.h).
duck_fp9_status
duck_compute_head_slot_pieces_k(uint32_t count, const uint32_t *rows,
                                const uint32_t *ks, const uint32_t *row_phase,
                                uint32_t hidden, uint32_t block,
                                uint32_t scale_rows, duck_fp9_desc *descs,
                                uint64_t *offsets, uint64_t *total_bytes);

/// Offset of a slot's `held_index`-th stored expert from the slot's start.
static inline uint64_t duck_slot_expert_offset(const duck_slot_layout *l,
                                               uint64_t held_index) {
  return l->table_bytes + held_index * l->expert_bytes;
}

#ifdef __cplusplus
} // extern "C"
#endif

#endif // DUCK_RT_SLOT_LAYOUT_H
