//===- Weights.cpp - a plan's host tensors as kernel operands -------------===//
#include "HostOp.h"

#include "duck_rt/kernel_select.h"

#include <immintrin.h>

#include <cstring>

namespace duck::runtime::ops {

namespace {

/// FP8 times the scale of the declared block that holds each element (the
/// plan checked the scale grid against the block; edge tiles may be
/// partial).
void DequantFp8(const uint8_t *p, const pl::TensorDef &t,
                const std::vector<float> &scale, float *out) {
  const uint64_t rows = t.shape()->Get(0), cols = t.shape()->Get(1);
  const uint64_t scols = t.scale()->shape()->Get(1);
  const uint64_t br = t.block_rows(), bc = t.block_cols();
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t c = 0; c < cols; ++c)
      out[r * cols + c] =
          duck_e4m3_to_f32(p[r * cols + c]) * scale[(r / br) * scols + c / bc];
}

/// Packs `src` as `desc` into `m` (64-byte aligned planes it owns) and
/// makes `m` an fp9 matrix; errors name the tensor and the element.
absl::Status PackInto(const duck_fp9_source &src, const duck_fp9_desc &desc,
                      const duck_fp9_layout &lay, const pl::TensorDef &t,
                      HostMatrix *m) {
  m->fp9_store.assign(lay.total_bytes / 8 + 8, 0);
  void *base = reinterpret_cast<void *>(
      (reinterpret_cast<uintptr_t>(m->fp9_store.data()) + 63) &
      ~uintptr_t(63));
  duck_fp9_error_at at{};
  if (duck_fp9_status st = duck_fp9_pack(&src, &desc, base, &at);
      st != DUCK_FP9_OK)
    return absl::InvalidArgumentError(absl::StrCat(
        "host tensor '", t.name()->str(), "': ", duck_fp9_status_str(st),
        " at row ", at.row, ", column ", at.col));
  m->fp9 = duck_fp9_matrix_view(&desc, base);
  m->is_fp9 = true;
  return absl::OkStatus();
}

/// Makes `m` an e4m3 matrix of the FP8 bytes `src.data` as `desc` lays
/// them out, without packing fp9 first: the checkpoint's bytes (copied to
/// 2 MiB pages) and the scale plane fp9's pack writes (each block's tile
/// scale). False, with `m` untouched, where the pack would fail (a NaN
/// byte, a scale out of fp9's range): the caller packs, and reports it.
bool KeepE4m3(const duck_fp9_source &src, const duck_fp9_desc &desc,
              const duck_fp9_layout &lay, HostMatrix *m) {
  const uint64_t tilesPerRow =
      (src.src_cols + src.tile_cols - 1) / src.tile_cols;
  std::vector<float> scale(lay.scale_bytes / 4, 0.0f);
  for (uint32_t t = 0; t < lay.scale_tiles; ++t)
    for (uint32_t b = 0; b < lay.blocks_per_row; ++b) {
      const float v = src.scale_inv[(uint64_t)t * tilesPerRow +
                                    (uint64_t)b * desc.block / src.tile_cols];
      if (!(v >= DUCK_FP9_SCALE_MIN && v <= DUCK_FP9_SCALE_MAX)) // or NaN
        return false;
      scale[(uint64_t)t * lay.blocks_per_row + b] = v;
    }
  const uint64_t n = (uint64_t)desc.rows * desc.k;
  const auto *p = static_cast<const uint8_t *>(src.data);
  // E4M3's NaN (0x7F or 0xFF), 32 bytes at a time, before anything is
  // allocated; then one copy (no zeroing first).
  const __m256i low7 = _mm256_set1_epi8(0x7F);
  __m256i nan = _mm256_setzero_si256();
  uint64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i));
    nan = _mm256_or_si256(nan,
                          _mm256_cmpeq_epi8(_mm256_and_si256(v, low7), low7));
  }
  bool bad = !_mm256_testz_si256(nan, nan);
  for (; i < n; ++i)
    bad |= duck_e4m3_is_nan(p[i]) != 0;
  if (bad)
    return false;
  HugePageVector<uint8_t> bytes(p, p + n);
  m->e4m3_store.swap(bytes);
  m->e4m3_scale.swap(scale);
  m->fp9 = duck_fp9_matrix{};
  m->fp9.rows = desc.rows;
  m->fp9.k = desc.k;
  m->fp9.block = desc.block;
  m->fp9.scale_rows = desc.scale_rows;
  m->fp9.row_phase = desc.row_phase;
  m->fp9.kernel = duck_select_kernel(desc.k, desc.block);
  m->fp9.mag = m->e4m3_store.data();
  // Not read; a pointer into the matrix for the kernels' row arithmetic.
  m->fp9.sign = reinterpret_cast<const uint32_t *>(m->e4m3_store.data());
  m->fp9.scale = m->e4m3_scale.data();
  m->is_fp9 = false;
  m->is_e4m3 = true;
  return true;
}

/// n 16-bit values (BF16 or F16, by `dt`) at `src` widened to floats:
/// BF16 eight at a time (the same bits as duck_bf16_to_f32), the rest one
/// by one.
void Widen16(const uint8_t *src, pl::DType dt, uint64_t n, float *out) {
  uint64_t c = 0;
  if (dt == pl::DType::BF16)
    for (; c + 8 <= n; c += 8)
      _mm256_storeu_ps(out + c,
                       _mm256_castsi256_ps(_mm256_slli_epi32(
                           _mm256_cvtepu16_epi32(_mm_loadu_si128(
                               reinterpret_cast<const __m128i *>(src + 2 * c))),
                           16)));
  for (; c < n; ++c) {
    uint16_t h;
    std::memcpy(&h, src + 2 * c, 2);
    out[c] = dt == pl::DType::BF16 ? duck_bf16_to_f32(h) : duck_f16_to_f32(h);
  }
}

} // namespace

absl::StatusOr<std::vector<float>>
WeightReader::ReadAll(const pl::TensorDef &t) const {
  const uint8_t *p = plan_.TensorData(t);
  uint64_t n = 1;
  for (int64_t d : *t.shape())
    n *= d;
  std::vector<float> out(n);
  switch (t.dtype()) {
  case pl::DType::F32:
    std::memcpy(out.data(), p, n * 4);
    break;
  case pl::DType::BF16:
  case pl::DType::F16:
    Widen16(p, t.dtype(), n, out.data());
    break;
  case pl::DType::F8_E4M3: {
    if (!t.scale() || t.shape()->size() != 2)
      return absl::InvalidArgumentError(absl::StrCat(
          "FP8 host tensor '", t.name()->str(), "' has no block scales"));
    auto scale = ReadAll(*t.scale());
    if (!scale.ok())
      return scale.status();
    DequantFp8(p, t, *scale, out.data());
    break;
  }
  default:
    return absl::InvalidArgumentError(absl::StrCat(
        "host tensor '", t.name()->str(), "' has an unsupported dtype"));
  }
  return out;
}

absl::StatusOr<HostMatrix>
WeightReader::ReadQuantizedFp9(const pl::TensorDef &t) const {
  if (t.shape()->size() != 2)
    return absl::InvalidArgumentError(
        absl::StrCat("host tensor '", t.name()->str(), "' is not a matrix"));
  HostMatrix m;
  m.rows = t.shape()->Get(0);
  m.cols = t.shape()->Get(1);
  duck_fp9_source src{};
  switch (t.dtype()) {
  case pl::DType::BF16: src.type = DUCK_FP9_SRC_BF16; break;
  case pl::DType::F16: src.type = DUCK_FP9_SRC_F16; break;
  case pl::DType::F32: src.type = DUCK_FP9_SRC_F32; break;
  default:
    return absl::InvalidArgumentError(absl::StrCat(
        "host tensor '", t.name()->str(), "' cannot be quantised to fp9"));
  }
  const uint32_t block = m.cols % 128 == 0 ? 128 : m.cols % 64 == 0 ? 64 : 32;
  if (m.cols % block)
    return absl::InvalidArgumentError(
        absl::StrCat("host tensor '", t.name()->str(), "' has ", m.cols,
                     " columns, not a multiple of 32 (fp9 blocks)"));
  src.data = plan_.TensorData(t);
  src.src_rows = m.rows;
  src.src_cols = m.cols;
  // One scale per 128-row tile and K-block: the GEMV pre-scales its input
  // once a tile, so per-row scales would cost a pre-scale a row.
  duck_fp9_desc desc{(uint32_t)m.rows, (uint32_t)m.cols, block, 128, 0};
  duck_fp9_layout lay;
  if (duck_fp9_compute_layout(&desc, &lay) != DUCK_FP9_OK)
    return absl::InvalidArgumentError(
        absl::StrCat("host tensor '", t.name()->str(), "': bad fp9 shape"));
  if (absl::Status s = PackInto(src, desc, lay, t, &m); !s.ok())
    return s;
  return m;
}

absl::StatusOr<HostMatrix>
WeightReader::QuantizedInt8(const pl::TensorDef &t, ThreadPool &pool) const {
  if (t.shape()->size() != 2)
    return absl::InvalidArgumentError(
        absl::StrCat("host tensor '", t.name()->str(), "' is not a matrix"));
  const uint64_t rows = t.shape()->Get(0), cols = t.shape()->Get(1);
  if (cols % kInt8Block)
    return absl::InvalidArgumentError(
        absl::StrCat("host tensor '", t.name()->str(), "' has ", cols,
                     " columns, not a multiple of ", kInt8Block,
                     " (int8 blocks)"));
  const uint8_t *p = plan_.TensorData(t);
  const pl::DType dt = t.dtype();
  if (dt == pl::DType::F8_E4M3) { // already 8-bit: dequantise, then requantise
    auto all = ReadAll(t);
    if (!all.ok())
      return all.status();
    const float *f = all->data();
    return QuantizeInt8(pool, rows, cols, [&](uint64_t r, float *buf) {
      std::memcpy(buf, f + r * cols, cols * 4);
    });
  }
  if (dt != pl::DType::BF16 && dt != pl::DType::F16 && dt != pl::DType::F32)
    return absl::InvalidArgumentError(absl::StrCat(
        "host tensor '", t.name()->str(), "' cannot be quantised to int8"));
  return QuantizeInt8(pool, rows, cols, [&](uint64_t r, float *buf) {
    if (dt == pl::DType::F32) {
      std::memcpy(buf, p + r * cols * 4, cols * 4);
      return;
    }
    Widen16(p + 2 * r * cols, dt, cols, buf);
  });
}

absl::StatusOr<HostMatrix>
WeightReader::ReadMatrix(const pl::TensorDef &t) const {
  if (t.shape()->size() != 2)
    return absl::InvalidArgumentError(
        absl::StrCat("host tensor '", t.name()->str(), "' is not a matrix"));
  HostMatrix m;
  m.rows = t.shape()->Get(0);
  m.cols = t.shape()->Get(1);
  if (t.dtype() == pl::DType::BF16) {
    m.bf16 = reinterpret_cast<const uint16_t *>(plan_.TensorData(t));
    return m;
  }
  // FP8 converts to fp9 exactly; the duck kernels then read 1.125 bytes a
  // weight instead of 4 for a dequantised fp32 copy. The fp9 K-block must
  // divide both the declared scale tile and the row, so that a partial
  // last tile still ends on a block boundary.
  const uint32_t tileRows = t.block_rows(), tileCols = t.block_cols();
  if (t.dtype() == pl::DType::F8_E4M3 && t.scale() && m.cols % 32 == 0) {
    auto scale = ReadAll(*t.scale());
    if (!scale.ok())
      return scale.status();
    uint32_t block = tileCols % 128 == 0 && m.cols % 128 == 0 ? 128
                     : tileCols % 64 == 0 && m.cols % 64 == 0 ? 64
                                                              : 32;
    duck_fp9_source src{};
    src.type = DUCK_FP9_SRC_E4M3;
    src.data = plan_.TensorData(t);
    src.src_rows = m.rows;
    src.src_cols = m.cols;
    src.scale_inv = scale->data();
    src.tile_rows = tileRows;
    src.tile_cols = tileCols;
    duck_fp9_desc desc{(uint32_t)m.rows, (uint32_t)m.cols, block, tileRows, 0};
    duck_fp9_layout lay;
    if (tileCols % block == 0 &&
        duck_fp9_compute_layout(&desc, &lay) == DUCK_FP9_OK) {
      if (HostReadsE4m3() && KeepE4m3(src, desc, lay, &m))
        return m;
      if (absl::Status s = PackInto(src, desc, lay, t, &m); !s.ok())
        return s;
      return m;
    }
  }
  auto all = ReadAll(t);
  if (!all.ok())
    return all.status();
  m.owned = std::move(*all);
  m.f32 = m.owned.data();
  return m;
}

absl::StatusOr<HostMatrix>
WeightReader::ReadHeadsTransposedFp9(const pl::TensorDef &t, uint32_t heads,
                                     uint32_t per_head, uint32_t take) const {
  if (t.dtype() != pl::DType::F8_E4M3 || !t.scale() ||
      t.shape()->size() != 2 || t.scale()->shape()->size() != 2)
    return absl::FailedPreconditionError("not an FP8 matrix");
  const uint64_t K = t.shape()->Get(1);
  const uint32_t br = t.block_rows(), bc = t.block_cols();
  const uint64_t scols = t.scale()->shape()->Get(1);
  // A transposed tile is bc rows (one source column tile) by `take`
  // columns (within one source row tile): every element's scale is the
  // tile's.
  const uint32_t block = take % 128 == 0 ? 128 : take % 64 == 0 ? 64 : 32;
  if (!br || !bc || K % bc || per_head % br || take > br || take % 32 ||
      (uint64_t)heads * per_head != (uint64_t)t.shape()->Get(0))
    return absl::FailedPreconditionError("tiles do not transpose whole");
  auto scale = ReadAll(*t.scale());
  if (!scale.ok())
    return scale.status();
  const uint8_t *p = plan_.TensorData(t);
  const uint64_t rows = (uint64_t)heads * K;
  std::vector<uint8_t> ut(rows * take);
  std::vector<float> st(rows / bc);
  for (uint64_t h = 0; h < heads; ++h) {
    for (uint64_t r = 0; r < K; ++r)
      for (uint64_t j = 0; j < take; ++j)
        ut[(h * K + r) * take + j] = p[(h * per_head + j) * K + r];
    for (uint64_t r = 0; r < K; r += bc)
      st[(h * K + r) / bc] = (*scale)[(h * per_head / br) * scols + r / bc];
  }
  duck_fp9_source src{};
  src.type = DUCK_FP9_SRC_E4M3;
  src.data = ut.data();
  src.src_rows = rows;
  src.src_cols = take;
  src.scale_inv = st.data();
  src.tile_rows = bc;
  src.tile_cols = take;
  const duck_fp9_desc desc{(uint32_t)rows, take, block, bc, 0};
  duck_fp9_layout lay;
  if (duck_fp9_compute_layout(&desc, &lay) != DUCK_FP9_OK)
    return absl::FailedPreconditionError("no fp9 layout");
  HostMatrix m;
  m.rows = rows;
  m.cols = take;
  if (HostReadsE4m3() && KeepE4m3(src, desc, lay, &m))
    return m;
  if (absl::Status s = PackInto(src, desc, lay, t, &m); !s.ok())
    return s;
  return m;
}

} // namespace duck::runtime::ops
