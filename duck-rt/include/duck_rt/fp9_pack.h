// fp9 packing: the exact byte layout the duck kernels read for one [rows, k]
// weight matrix (or a tensor-parallel slice of a larger one).
//
// A packed matrix is three planes at 64-byte aligned offsets from its base:
//
//   magnitudes  uint8  [rows][k]                  row-major, one code a weight
//   signs       uint32 [rows][k / 32]             bit i of word w: weight 32w+i
//   scales      float  [tiles][k / block]         one scale per (row tile, block)
//
// A row tile is `scale_rows` consecutive rows of the *source* matrix (128
// for FP8 checkpoints with 128x128 blocks); a slice that starts inside a tile
// has row_phase = first_row % scale_rows, and local row r uses scale row
// (r + row_phase) / scale_rows. When a 128-wide FP8 tile is cut into 64- or
// 32-blocks, every block carries its own copy of the tile's scale.
// Weight value = sign * fp9(magnitude) * scale.
//
// Everything here is freestanding-clean: no libc, no allocation; the caller
// owns every buffer. Status codes, not exceptions.
#ifndef DUCK_RT_FP9_PACK_H
#define DUCK_RT_FP9_PACK_H

#include "duck_rt/fp9.h"

#ifdef __cplusplus
extern "C" {
#endif

/// Alignment of every plane and of a packed matrix's total size.
#define DUCK_FP9_PLANE_ALIGN 64u

/// Scale range whose kernel arithmetic docs/fp9.md guarantees.
#define DUCK_FP9_SCALE_MIN 0x1p-40f
#define DUCK_FP9_SCALE_MAX 0x1p+10f

typedef enum duck_fp9_status {
  DUCK_FP9_OK = 0,
  DUCK_FP9_BAD_BLOCK = 1,     // block not 32, 64 or 128
  DUCK_FP9_BAD_SHAPE = 2,     // k not a multiple of block, or empty
  DUCK_FP9_BAD_SLICE = 3,     // slice outside the source, or K start unaligned
  DUCK_FP9_BAD_TILE = 4,      // FP8 tile width not a multiple of block
  DUCK_FP9_NAN = 5,           // NaN or infinite weight
  DUCK_FP9_SCALE_RANGE = 6,   // scale outside [2^-40, 2^10] or not finite
} duck_fp9_status;

/// Shape of one packed matrix.
typedef struct duck_fp9_desc {
  uint32_t rows;       // local rows
  uint32_t k;          // local K (multiple of block)
  uint32_t block;      // 32, 64 or 128
  uint32_t scale_rows; // rows sharing one scale row (>= 1)
  uint32_t row_phase;  // first source row % scale_rows
} duck_fp9_desc;

/// Byte offsets of the planes of a packed matrix, relative to its base.
typedef struct duck_fp9_layout {
  uint64_t mag_offset, mag_bytes;
  uint64_t sign_offset, sign_bytes;
  uint64_t scale_offset, scale_bytes;
  uint32_t scale_tiles;  // rows of the scale plane
  uint32_t blocks_per_row;
  uint64_t total_bytes;  // multiple of DUCK_FP9_PLANE_ALIGN
} duck_fp9_layout;

/// Checks `desc` and computes its layout.
duck_fp9_status duck_fp9_compute_layout(const duck_fp9_desc *desc,
                                        duck_fp9_layout *out_layout);

/// Element type of a source matrix.
typedef enum duck_fp9_src_type {
  DUCK_FP9_SRC_F32 = 0,
  DUCK_FP9_SRC_BF16 = 1,
  DUCK_FP9_SRC_F16 = 2,
  DUCK_FP9_SRC_E4M3 = 3,
} duck_fp9_src_type;

/// A row-major source matrix [src_rows, src_cols] and the slice to pack:
/// rows [row0, row0 + desc.rows), columns [col0, col0 + desc.k).
typedef struct duck_fp9_source {
  duck_fp9_src_type type;
  const void *data;
  uint64_t src_rows, src_cols;
  uint64_t row0, col0;
  // E4M3 only: the scale_inv grid, one fp32 per tile_rows x tile_cols tile,
  // row-major [ceil(src_rows/tile_rows), ceil(src_cols/tile_cols)].
  const float *scale_inv;
  uint32_t tile_rows, tile_cols;
} duck_fp9_source;

/// Where packing stopped on an error (source coordinates).
typedef struct duck_fp9_error_at {
  uint64_t row, col;
} duck_fp9_error_at;

/// Packs a slice into `out` (layout.total_bytes bytes, 64-byte aligned).
///
/// E4M3 sources convert losslessly: desc.scale_rows must equal tile_rows,
/// desc.row_phase must equal row0 % tile_rows, tile_cols must be a multiple
/// of desc.block and col0 a multiple of desc.block.
/// Float sources (F32/BF16/F16) are quantised: each (row tile, block) gets
/// scale = max(amax / 480, 2^-40) over the slice's part of that tile, and
/// every weight rounds to nearest, ties to even.
/// Padding bytes between planes are written as zero.
duck_fp9_status duck_fp9_pack(const duck_fp9_source *src,
                              const duck_fp9_desc *desc, void *out,
                              duck_fp9_error_at *out_where);

/// Dequantises local row `r` of a packed matrix into out_row[k] (exact:
/// sign * fp9 * scale, computed in fp32; for the tests and references).
void duck_fp9_unpack_row(const duck_fp9_desc *desc, const void *packed,
                         uint32_t r, float *out_row);

/// Reads one source element as fp32 (E4M3 multiplied by its tile scale).
float duck_fp9_source_value(const duck_fp9_source *src, uint64_t row,
                            uint64_t col);

/// Human-readable name of a status code.
const char *duck_fp9_status_str(duck_fp9_status st);

#ifdef __cplusplus
} // extern "C"
#endif

#endif // DUCK_RT_FP9_PACK_H
