// A weight-image slot's byte layout (duck_rt/slot_layout.h).
#include "duck_rt/slot_layout.h"

namespace {
uint64_t alignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
} // namespace

extern "C" duck_fp9_status
duck_compute_slot_layout(const duck_slot_shape *s, duck_slot_layout *out) {
  duck_slot_layout l = {};
  l.gate = duck_fp9_desc{s->local_inter, s->hidden, s->block, s->scale_rows,
                         s->row_phase};
  l.up = l.gate;
  l.down = duck_fp9_desc{s->hidden, s->local_inter, s->block, s->scale_rows,
                         0};
  duck_fp9_status st;
  if ((st = duck_fp9_compute_layout(&l.gate, &l.gate_layout)) != DUCK_FP9_OK ||
      (st = duck_fp9_compute_layout(&l.up, &l.up_layout)) != DUCK_FP9_OK ||
      (st = duck_fp9_compute_layout(&l.down, &l.down_layout)) != DUCK_FP9_OK)
    return st;
  l.table_bytes = alignUp(sizeof(duck_slot_header) +
                              (uint64_t)s->n_experts * sizeof(duck_ffn_desc),
                          DUCK_FP9_PLANE_ALIGN);
  l.up_offset = l.gate_layout.total_bytes;
  l.down_offset = l.up_offset + l.up_layout.total_bytes;
  l.expert_bytes = l.down_offset + l.down_layout.total_bytes;
  l.total_bytes = alignUp(l.table_bytes + (uint64_t)s->held * l.expert_bytes,
                          DUCK_IMAGE_ALIGN);
  *out = l;
  return DUCK_FP9_OK;
}

extern "C" duck_fp9_status
duck_compute_head_slot_layout(uint32_t rows, uint32_t hidden, uint32_t block,
                              uint32_t scale_rows, uint32_t row_phase,
                              duck_head_slot_layout *out) {
  duck_head_slot_layout l = {};
  l.matrix = duck_fp9_desc{rows, hidden, block, scale_rows, row_phase};
  const duck_fp9_status st = duck_fp9_compute_layout(&l.matrix, &l.matrix_layout);
  if (st != DUCK_FP9_OK)
    return st;
  l.table_bytes = alignUp(sizeof(duck_slot_header) + sizeof(duck_ffn_desc),
                          DUCK_FP9_PLANE_ALIGN);
  l.total_bytes =
      alignUp(l.table_bytes + l.matrix_layout.total_bytes, DUCK_IMAGE_ALIGN);
  *out = l;
  return DUCK_FP9_OK;
}

extern "C" duck_fp9_status duck_compute_head_slot_pieces(
    uint32_t count, const uint32_t *rows, const uint32_t *row_phase,
    uint32_t hidden, uint32_t block, uint32_t scale_rows, duck_fp9_desc *descs,
    uint64_t *offsets, uint64_t *total_bytes) {
  return duck_compute_head_slot_pieces_k(count, rows, nullptr, row_phase,
                                         hidden, block, scale_rows, descs,
                                         offsets, total_bytes);
}

extern "C" duck_fp9_status
duck_compute_head_slot_pieces_k(uint32_t count, const uint32_t *rows,
                                const uint32_t *ks, const uint32_t *row_phase,
                                uint32_t hidden, uint32_t block,
                                uint32_t scale_rows, duck_fp9_desc *descs,
                                uint64_t *offsets, uint64_t *total_bytes) {
  if (count == 0)
    return DUCK_FP9_BAD_SHAPE;
  uint64_t at = alignUp(sizeof(duck_slot_header) +
                            (uint64_t)count * sizeof(duck_ffn_desc),
                        DUCK_FP9_PLANE_ALIGN);
  for (uint32_t i = 0; i < count; ++i) {
    descs[i] = duck_fp9_desc{rows[i], ks ? ks[i] : hidden, block, scale_rows,
                             row_phase[i]};
    duck_fp9_layout l;
    const duck_fp9_status st = duck_fp9_compute_layout(&descs[i], &l);
    if (st != DUCK_FP9_OK)
      return st;
    offsets[i] = at;
    at += l.total_bytes; // a multiple of DUCK_FP9_PLANE_ALIGN
  }
  *total_bytes = alignUp(at, DUCK_IMAGE_ALIGN);
  return DUCK_FP9_OK;
}
