// fp9 packing and unpacking (see duck_rt/fp9_pack.h for the layout).
// Freestanding-clean: no libc calls, no allocation.
#include "duck_rt/fp9_pack.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace {

inline uint64_t alignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

inline uint64_t f64Bits(double d) {
  uint64_t u;
  __builtin_memcpy(&u, &d, sizeof u);
  return u;
}

inline float absf(float v) {
  return duck_fp9_bits_f32(duck_fp9_f32_bits(v) & 0x7FFFFFFFu);
}

inline bool isFinite(float v) {
  return (duck_fp9_f32_bits(v) & 0x7F800000u) != 0x7F800000u;
}

/// Round-to-nearest-even fp9 magnitude code of |q|, q given in double so
/// that v / scale is rounded once (to 53 bits) before the 3-bit rounding.
uint8_t encodeMagnitudeF64(double q) {
  uint64_t bits = f64Bits(q) & 0x7FFFFFFFFFFFFFFFull;
  uint64_t exp11 = bits >> 52;
  // fp9 E = exp11 - 1023 + 22 = exp11 - 1001.
  if (exp11 >= 1002) {
    uint64_t lsb = (bits >> 49) & 1u;
    uint64_t rounded = (bits + ((1ull << 48) - 1) + lsb) >> 49;
    uint64_t code = rounded - (1001ull << 3);
    return code > DUCK_FP9_MAX_CODE ? (uint8_t)DUCK_FP9_MAX_CODE
                                    : (uint8_t)code;
  }
  double a;
  __builtin_memcpy(&a, &bits, sizeof a);
  return a > 0x1p-22 ? (uint8_t)DUCK_FP9_MIN_CODE : (uint8_t)0;
}

float loadSource(const duck_fp9_source *src, uint64_t row, uint64_t col) {
  uint64_t i = row * src->src_cols + col;
  switch (src->type) {
  case DUCK_FP9_SRC_F32:
    return static_cast<const float *>(src->data)[i];
  case DUCK_FP9_SRC_BF16:
    return duck_bf16_to_f32(static_cast<const uint16_t *>(src->data)[i]);
  case DUCK_FP9_SRC_F16:
    return duck_f16_to_f32(static_cast<const uint16_t *>(src->data)[i]);
  case DUCK_FP9_SRC_E4M3:
    return duck_e4m3_to_f32(static_cast<const uint8_t *>(src->data)[i]);
  }
  return 0.0f;
}

/// 32 E4M3 bytes to fp9: magnitude codes into mag[0..31], the sign bits
/// as one word (bit i = weight i). False if one is NaN (nothing useful is
/// written then). The same codes as duck_fp9_from_e4m3: a normal's code
/// is its low 7 bits + 120 (exponent + 15), a subnormal's comes from
/// `sub` (its mantissa's code).
inline bool packE4m3x32(const uint8_t *src, uint8_t *mag, uint32_t *word,
                        const uint8_t sub[8]) {
#ifdef __AVX2__
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(src));
  const __m256i v = _mm256_and_si256(b, _mm256_set1_epi8(0x7F));
  if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(0x7F))))
    return false;
  const __m256i lut = _mm256_setr_epi8(
      (char)sub[0], (char)sub[1], (char)sub[2], (char)sub[3], (char)sub[4],
      (char)sub[5], (char)sub[6], (char)sub[7], 0, 0, 0, 0, 0, 0, 0, 0,
      (char)sub[0], (char)sub[1], (char)sub[2], (char)sub[3], (char)sub[4],
      (char)sub[5], (char)sub[6], (char)sub[7], 0, 0, 0, 0, 0, 0, 0, 0);
  const __m256i normal = _mm256_add_epi8(v, _mm256_set1_epi8(120));
  const __m256i isSub = _mm256_cmpgt_epi8(_mm256_set1_epi8(8), v);
  _mm256_storeu_si256(
      reinterpret_cast<__m256i *>(mag),
      _mm256_blendv_epi8(normal, _mm256_shuffle_epi8(lut, v), isSub));
  *word = (uint32_t)_mm256_movemask_epi8(b);
  return true;
#else
  uint32_t w = 0;
  for (uint32_t i = 0; i < 32; ++i) {
    if (duck_e4m3_is_nan(src[i]))
      return false;
    const uint32_t v = src[i] & 0x7Fu;
    mag[i] = v >= 8 ? (uint8_t)(v + 120) : sub[v];
    w |= (uint32_t)(src[i] >> 7) << i;
  }
  *word = w;
  return true;
#endif
}

struct Planes {
  uint8_t *mag;
  uint32_t *sign;
  float *scale;
};

Planes planesOf(const duck_fp9_layout &l, void *base) {
  uint8_t *b = static_cast<uint8_t *>(base);
  return {b + l.mag_offset, reinterpret_cast<uint32_t *>(b + l.sign_offset),
          reinterpret_cast<float *>(b + l.scale_offset)};
}

/// The source slice lies in the source, starts on a block, and its row
/// phase (and, from FP8, its scale tiles) agrees with the descriptor.
inline duck_fp9_status checkSlice(const duck_fp9_source *src,
                                  const duck_fp9_desc *d, bool fp8) {
  if (src->row0 + d->rows > src->src_rows || src->col0 + d->k > src->src_cols ||
      src->col0 % d->block != 0)
    return DUCK_FP9_BAD_SLICE;
  if (fp8 && (src->tile_rows == 0 || src->tile_cols == 0 ||
              src->tile_cols % d->block != 0 || d->scale_rows != src->tile_rows ||
              d->row_phase != src->row0 % src->tile_rows))
    return DUCK_FP9_BAD_TILE;
  if (!fp8 && d->row_phase != src->row0 % d->scale_rows)
    return DUCK_FP9_BAD_SLICE;
  return DUCK_FP9_OK;
}

/// The scale of the block at column c0 over local rows [rBegin, rEnd):
/// FP8's own tile scale (in range), else the block's max magnitude over
/// the largest fp9 value (every value finite).
inline duck_fp9_status blockScale(const duck_fp9_source *src, bool fp8,
                                  uint64_t tilesPerRow, uint32_t block,
                                  uint32_t rBegin, uint32_t rEnd, uint64_t c0,
                                  float *out, duck_fp9_error_at *where) {
  float scale;
  if (fp8) {
    uint64_t gr = src->row0 + rBegin;
    scale = src->scale_inv[(gr / src->tile_rows) * tilesPerRow +
                           c0 / src->tile_cols];
    if (!isFinite(scale) || scale < DUCK_FP9_SCALE_MIN ||
        scale > DUCK_FP9_SCALE_MAX) {
      if (where)
        *where = {gr, c0};
      return DUCK_FP9_SCALE_RANGE;
    }
  } else {
    float amax = 0.0f;
    for (uint32_t r = rBegin; r < rEnd; ++r)
      for (uint32_t c = 0; c < block; ++c) {
        float v = loadSource(src, src->row0 + r, c0 + c);
        if (!isFinite(v)) {
          if (where)
            *where = {src->row0 + r, c0 + c};
          return DUCK_FP9_NAN;
        }
        float a = absf(v);
        amax = a > amax ? a : amax;
      }
    scale = amax / DUCK_FP9_MAX_VALUE;
    if (scale < DUCK_FP9_SCALE_MIN)
      scale = DUCK_FP9_SCALE_MIN;
    if (scale > DUCK_FP9_SCALE_MAX) {
      if (where)
        *where = {src->row0 + rBegin, c0};
      return DUCK_FP9_SCALE_RANGE;
    }
  }
  *out = scale;
  return DUCK_FP9_OK;
}

/// Packs one row's block b (source row gr, columns from c0) into its
/// magnitudes and sign words: FP8 32 at a time (exact), else element by
/// element at `scale` (which also finds an FP8 NaN to report).
inline duck_fp9_status packBlockRow(const duck_fp9_source *src,
                                    const duck_fp9_desc *d, bool fp8,
                                    uint64_t gr, uint64_t c0, uint32_t b,
                                    float scale, uint8_t *mag, uint32_t *sign,
                                    const uint8_t sub[8],
                                    duck_fp9_error_at *where) {
  if (fp8) { // 32 at a time (a block is whole sign words); exact
    const uint8_t *row =
        static_cast<const uint8_t *>(src->data) + gr * src->src_cols + c0;
    bool ok = true;
    for (uint32_t c = 0; c < d->block && ok; c += 32)
      ok = packE4m3x32(row + c, mag + c, &sign[(b * d->block + c) / 32], sub);
    if (ok)
      return DUCK_FP9_OK;
    // A NaN: the element-wise loop below finds and reports it.
  }
  for (uint32_t c = 0; c < d->block; ++c) {
    uint32_t lc = b * d->block + c; // local column
    uint32_t s;
    uint8_t code;
    if (fp8) {
      uint8_t byte =
          static_cast<const uint8_t *>(src->data)[gr * src->src_cols + c0 + c];
      if (duck_e4m3_is_nan(byte)) {
        if (where)
          *where = {gr, c0 + c};
        return DUCK_FP9_NAN;
      }
      code = duck_fp9_from_e4m3(byte, &s);
    } else {
      float v = loadSource(src, gr, c0 + c);
      s = duck_fp9_f32_bits(v) >> 31;
      code = encodeMagnitudeF64((double)v / (double)scale);
    }
    mag[c] = code;
    sign[lc / 32] |= s << (lc % 32);
  }
  return DUCK_FP9_OK;
}

} // namespace

extern "C" {

duck_fp9_status duck_fp9_compute_layout(const duck_fp9_desc *d,
                                        duck_fp9_layout *out) {
  if (d->block != 32 && d->block != 64 && d->block != 128)
    return DUCK_FP9_BAD_BLOCK;
  if (d->rows == 0 || d->k == 0 || d->k % d->block != 0 ||
      d->scale_rows == 0 || d->row_phase >= d->scale_rows)
    return DUCK_FP9_BAD_SHAPE;
  duck_fp9_layout l;
  l.blocks_per_row = d->k / d->block;
  l.scale_tiles = (d->row_phase + d->rows + d->scale_rows - 1) / d->scale_rows;
  l.mag_offset = 0;
  l.mag_bytes = (uint64_t)d->rows * d->k;
  l.sign_offset = alignUp(l.mag_bytes, DUCK_FP9_PLANE_ALIGN);
  l.sign_bytes = (uint64_t)d->rows * (d->k / 32) * 4;
  l.scale_offset = alignUp(l.sign_offset + l.sign_bytes, DUCK_FP9_PLANE_ALIGN);
  l.scale_bytes = (uint64_t)l.scale_tiles * l.blocks_per_row * 4;
  l.total_bytes = alignUp(l.scale_offset + l.scale_bytes, DUCK_FP9_PLANE_ALIGN);
  *out = l;
  return DUCK_FP9_OK;
}

float duck_fp9_source_value(const duck_fp9_source *src, uint64_t row,
                            uint64_t col) {
  float v = loadSource(src, row, col);
  if (src->type == DUCK_FP9_SRC_E4M3) {
    uint64_t tilesPerRow = (src->src_cols + src->tile_cols - 1) / src->tile_cols;
    v *= src->scale_inv[(row / src->tile_rows) * tilesPerRow +
                        col / src->tile_cols];
  }
  return v;
}

duck_fp9_status duck_fp9_pack(const duck_fp9_source *src,
                              const duck_fp9_desc *d, void *out,
                              duck_fp9_error_at *where) {
  duck_fp9_layout l;
  duck_fp9_status st = duck_fp9_compute_layout(d, &l);
  if (st != DUCK_FP9_OK)
    return st;
  const bool fp8 = src->type == DUCK_FP9_SRC_E4M3;
  if ((st = checkSlice(src, d, fp8)) != DUCK_FP9_OK)
    return st;

  __builtin_memset(out, 0, l.total_bytes);
  Planes p = planesOf(l, out);
  const uint32_t words = d->k / 32;
  const uint64_t tilesPerRow =
      fp8 ? (src->src_cols + src->tile_cols - 1) / src->tile_cols : 0;
  uint8_t sub[8]; // codes of the E4M3 subnormals (mantissa 0..7)
  for (uint32_t m = 0; m < 8; ++m) {
    uint32_t ignored;
    sub[m] = duck_fp9_from_e4m3((uint8_t)m, &ignored);
  }

  for (uint32_t t = 0; t < l.scale_tiles; ++t) {
    // Local rows of tile t: [rBegin, rEnd).
    int64_t first = (int64_t)t * d->scale_rows - d->row_phase;
    uint32_t rBegin = first < 0 ? 0 : (uint32_t)first;
    uint32_t rEnd = (uint32_t)(first + d->scale_rows);
    if (rEnd > d->rows)
      rEnd = d->rows;
    for (uint32_t b = 0; b < l.blocks_per_row; ++b) {
      uint64_t c0 = src->col0 + (uint64_t)b * d->block;
      float scale;
      st = blockScale(src, fp8, tilesPerRow, d->block, rBegin, rEnd, c0,
                      &scale, where);
      if (st != DUCK_FP9_OK)
        return st;
      p.scale[(uint64_t)t * l.blocks_per_row + b] = scale;
      for (uint32_t r = rBegin; r < rEnd; ++r) {
        uint8_t *mag = p.mag + (uint64_t)r * d->k + (uint64_t)b * d->block;
        uint32_t *sign = p.sign + (uint64_t)r * words;
        st = packBlockRow(src, d, fp8, src->row0 + r, c0, b, scale, mag, sign,
                          sub, where);
        if (st != DUCK_FP9_OK)
          return st;
      }
    }
  }
  return DUCK_FP9_OK;
}

void duck_fp9_unpack_row(const duck_fp9_desc *d, const void *packed,
                         uint32_t r, float *out_row) {
  duck_fp9_layout l;
  if (duck_fp9_compute_layout(d, &l) != DUCK_FP9_OK)
    return;
  Planes p = planesOf(l, const_cast<void *>(packed));
  const uint32_t tile = (r + d->row_phase) / d->scale_rows;
  const uint8_t *mag = p.mag + (uint64_t)r * d->k;
  const uint32_t *sign = p.sign + (uint64_t)r * (d->k / 32);
  for (uint32_t c = 0; c < d->k; ++c) {
    float scale = p.scale[(uint64_t)tile * l.blocks_per_row + c / d->block];
    out_row[c] = duck_fp9_decode((sign[c / 32] >> (c % 32)) & 1u, mag[c]) * scale;
  }
}

const char *duck_fp9_status_str(duck_fp9_status st) {
  switch (st) {
  case DUCK_FP9_OK:
    return "ok";
  case DUCK_FP9_BAD_BLOCK:
    return "block size must be 32, 64 or 128";
  case DUCK_FP9_BAD_SHAPE:
    return "K must be a non-zero multiple of the block size, rows non-zero";
  case DUCK_FP9_BAD_SLICE:
    return "slice lies outside the source matrix or its K start is not a "
           "multiple of the block size";
  case DUCK_FP9_BAD_TILE:
    return "FP8 scale tile does not match the fp9 block/row tiling";
  case DUCK_FP9_NAN:
    return "weight is NaN or infinite";
  case DUCK_FP9_SCALE_RANGE:
    return "block scale outside [2^-40, 2^10]";
  }
  return "unknown fp9 status";
}

} // extern "C"
