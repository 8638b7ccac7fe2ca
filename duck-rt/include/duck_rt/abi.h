// The one contract between the compiler, the host and the duck ELF:
//   1. duck_info and the ELF entry points (what duckd passes to the ELF),
//   2. the weight image (what the compiler writes and a duck keeps in its
//      weight buffer: header, slot table, per-layer slots of fp9 matrices),
//   3. the step input/output buffers (IB/OB) of every mode.
// C-compatible, little-endian x86-64, versioned as a schema: fields are
// only appended, sizes are pinned with static asserts at the bottom.
#ifndef DUCK_RT_ABI_H
#define DUCK_RT_ABI_H

#include "duck_rt/fp9_pack.h"
#include "duck_rt/kernels.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum { DUCK_ABI_VERSION = 1 };

/* ---------------------------------------------------------------------------
 * 1. duck_info and entry points
 * ------------------------------------------------------------------------- */

/// Kernel modes of the duck ELF (docs/reference-system.md). Append only.
typedef enum duck_mode {
  DUCK_MODE_DENSE_DECODE = 0, // dense MLP forward, GEMV
  DUCK_MODE_MOE_DECODE = 1,   // MoE forward, single core
  DUCK_MODE_DENSE_PREPARE = 2, // attach a dense slot: validate, cache descriptors
  DUCK_MODE_MOE_PREPARE = 3,  // attach a MoE slot
  DUCK_MODE_MOE_DECODE_SMP = 4, // MoE forward, all cores
  DUCK_MODE_DENSE_PREFILL = 5, // batched GEMM
  DUCK_MODE_MOE_PREFILL = 6,  // MoE prefill
  DUCK_MODE_HEAD = 7,         // LM head rows: logits slice (GEMV or GEMM)
  DUCK_MODE_COUNT = 8,
} duck_mode;

/// Everything a call of the ELF sees. duckd fills one per core per call;
/// all cores of a call share ib, ob, weights and scratch.
typedef struct duck_info {
  uint32_t abi_version; // DUCK_ABI_VERSION
  uint32_t info_size;   // sizeof(duck_info) as the caller built it
  const uint8_t *ib;    // input buffer
  uint64_t ib_size;
  uint8_t *ob; // output buffer
  uint64_t ob_limit;
  uint64_t ob_size; // out (core 0): bytes produced
  char *log;        // stderr-like text buffer, per core
  uint64_t log_limit;
  uint64_t log_size; // out
  uint64_t tsc_hz;
  uint32_t smp_cpu_index;
  uint32_t smp_cpu_count;
  uint8_t *weights; // the weight buffer (starts with duck_image_header)
  uint64_t weights_size;
  uint8_t *scratch; // shared scratch, at least DUCK_SCRATCH_BYTES(...)
  uint64_t scratch_size;
  uint64_t *core_cycles; // [smp_cpu_count]: each core writes its kernel TSC ticks
  void (*yield)(void);   // optional: called while spinning (oversubscribed hosts)
  // Appended in ABI 1 (info_size >= 144): changes whenever the bytes of the
  // weight buffer may have changed (duckd bumps it on every prepare write).
  // The ELF keys its cached slot views on it; 0 means "unknown", and the
  // ELF then re-validates the slot on every step.
  uint64_t weights_generation;
  // Appended in ABI 1 (info_size >= 152): the call's sequence number, the
  // same on every core of a call and strictly increasing over the calls a
  // loaded ELF sees. Core 0 publishes its job on the duck_job_board under
  // it, so a secondary core can never run a stale or a future job.
  uint64_t step_seq;
} duck_info;

/// Return codes of the entry points (also reported in duck_ob_header.status).
typedef enum duck_status {
  DUCK_STATUS_OK = 0,
  DUCK_STATUS_BAD_ABI = 1,
  DUCK_STATUS_BAD_INPUT = 2,  // IB malformed or inconsistent
  DUCK_STATUS_BAD_WEIGHTS = 3, // weight buffer header/slot invalid or unfinished
  DUCK_STATUS_OB_TOO_SMALL = 4,
  DUCK_STATUS_SCRATCH_TOO_SMALL = 5,
  DUCK_STATUS_BAD_MODE = 6,
} duck_status;

/// Entry point signature: every core calls it with its own duck_info.
typedef int (*duck_entry_fn)(duck_info *info);

/// Names of the two exported entry points: a one-shot `run` (the ELF may
/// assume nothing about earlier calls) and a persistent `step` (the ELF's
/// globals survive between steps of one session).
#define DUCK_ENTRY_RUN_SYMBOL "duck_rt_run"
#define DUCK_ENTRY_STEP_SYMBOL "duck_rt_step"

#define DUCK_DECLARE_ENTRY(name)                                               \
  __attribute__((visibility("default"), used)) int name(duck_info *info)

/* ---------------------------------------------------------------------------
 * 2. The weight image
 *
 *   [duck_image_header (4096 bytes)]
 *   [duck_slot_entry x slot_count]         (at header.slot_table_offset)
 *   [slot 0][slot 1]...                     (each DUCK_IMAGE_ALIGN aligned)
 *
 * A slot is one FFN layer's share on this duck:
 *   [duck_slot_header][duck_ffn_desc x n_experts][packed fp9 matrices...]
 * Offsets inside a slot are relative to the slot's start. An expert this
 * duck does not hold (expert placement) has all offsets 0 and present = 0.
 * A HEAD slot holds this duck's rows of one or more matrices of the same
 * K: n_experts descriptors, each present, whose `gate` is a [rows_i, K]
 * matrix; its `up` and `down` are empty (all zero). Their rows concatenate
 * in descriptor order to the header's `inter` (K is its `hidden`), and so
 * do the results of DUCK_MODE_HEAD. The LM head's vocabulary rows (K =
 * hidden, `layer` = the model's layer count), an attention's o_proj or
 * query projection rows (K = heads x v_head_dim, or the query LoRA rank),
 * or its input projections (K = hidden: pieces of q_a_proj, kv_a_proj and
 * the indexer's wk, or q/k/v_proj; `layer` = the attention's layer).
 *
 * Chained head pieces (DUCK_IMAGE_FORMAT_VERSION_CHAINED): a piece's descriptor
 * `input` names what it multiplies: floats [offset, offset + k) of the step's x
 * (DUCK_HEAD_INPUT_X, offset 0 and k = K: every piece of a version 1
 * image), or of the slot's own results (DUCK_HEAD_INPUT_RESULTS: rows an
 * earlier piece produced, below this piece's first row), so a duck can
 * take its rows of one matrix through a second one (an MLA head's query
 * into the latent space through W_UK, a head's latent output through W_UV
 * and then its o_proj columns). The header's `ob_begin` is the first
 * result row the OB carries: rows below it are working values only.
 * ------------------------------------------------------------------------- */

#define DUCK_IMAGE_MAGIC 0x314B435544475755ull /* "UWGDUCK1" little-endian */
#define DUCK_SLOT_MAGIC 0x544F4C53u             /* "SLOT" */
enum {
  DUCK_IMAGE_FORMAT_VERSION = 1,
  /// An image with chained head pieces (below) says so: a reader that
  /// predates them refuses it rather than ignore the chain.
  DUCK_IMAGE_FORMAT_VERSION_CHAINED = 2,
  DUCK_IMAGE_HEADER_BYTES = 4096,
  DUCK_IMAGE_ALIGN = 4096,
  DUCK_MODEL_KEY_BYTES = 16,
};

typedef struct duck_image_header {
  uint64_t magic;          // DUCK_IMAGE_MAGIC
  uint32_t format_version; // DUCK_IMAGE_FORMAT_VERSION[_CHAINED]
  uint32_t abi_version;    // DUCK_ABI_VERSION
  uint32_t fp9_version;    // DUCK_FP9_FORMAT_VERSION
  uint32_t tp_size;
  uint32_t tp_rank;
  uint32_t slot_count;
  uint8_t model_key[DUCK_MODEL_KEY_BYTES];
  uint64_t slot_table_offset;
  uint64_t total_bytes; // the whole image
  uint32_t hidden;      // model hidden size (rows of down, K of gate/up)
  uint32_t reserved0;
  uint64_t header_checksum; // XXH3-64 of this header with this field zero
} duck_image_header;

typedef enum duck_slot_kind {
  DUCK_SLOT_DENSE = 0,
  DUCK_SLOT_MOE = 1,
  DUCK_SLOT_HEAD = 2, // LM head rows (mode DUCK_MODE_HEAD)
} duck_slot_kind;

/// One row of the slot table.
typedef struct duck_slot_entry {
  uint64_t offset; // from the image start
  uint64_t bytes;
  uint64_t checksum; // XXH3-64 of the slot's bytes
  uint32_t layer;    // model layer index
  uint32_t kind;     // duck_slot_kind
} duck_slot_entry;

/// One packed matrix inside a slot.
typedef struct duck_matrix_ref {
  uint64_t offset; // from the slot start; DUCK_IMAGE... 64-byte aligned
  duck_fp9_desc desc;
  uint32_t kernel; // duck_kernel_id chosen by the compiler
  uint32_t reserved;
} duck_matrix_ref;

typedef struct duck_ffn_desc {
  duck_matrix_ref gate, up, down;
  uint32_t present; // 1 when this duck holds this expert
  uint32_t input;   // HEAD slots: duck_head_input | offset; else 0
} duck_ffn_desc;

/// A head piece's input (duck_ffn_desc.input): the source in the top bit,
/// the offset (floats) in the rest.
typedef enum duck_head_input {
  DUCK_HEAD_INPUT_X = 0u,
  DUCK_HEAD_INPUT_RESULTS = 0x80000000u,
  DUCK_HEAD_INPUT_OFFSET_MASK = 0x7fffffffu,
} duck_head_input;

typedef struct duck_slot_header {
  uint32_t magic; // DUCK_SLOT_MAGIC
  uint32_t kind;  // duck_slot_kind
  uint32_t layer;
  uint32_t hidden;
  uint32_t inter;     // local intermediate size of each FFN on this duck
  uint32_t n_experts; // 1 for dense; routed + shared experts for MoE
  uint32_t block;
  uint32_t ob_begin; // HEAD slots: the first result row in the OB; else 0
  // followed by duck_ffn_desc[n_experts]
} duck_slot_header;

/* ---------------------------------------------------------------------------
 * 3. Step buffers
 *
 * IB: [duck_ib_header][slots: duck_expert_slot[n_tokens * top_k]]
 *     [x: float[n_tokens][hidden]]  (x at header.x_offset, 32-byte aligned)
 * OB: [duck_ob_header][out: float[n_tokens][hidden]] (out at 64 bytes)
 * With DUCK_IB_X_BF16 in header.flags, x is bf16 instead (uint16_t
 * [n_tokens][hidden], the top half of each fp32): half the bytes on the
 * wire; the ELF widens it to fp32 in its scratch before any kernel runs.
 * With DUCK_IB_OUT_BF16, the OB's out is bf16 (uint16_t[n_tokens][hidden]).
 * With DUCK_IB_X_Q8 (DUCK_IB_OUT_Q8), x (out) is q8 instead: each token's
 * row in blocks of 32 values (the last may be shorter), a block its bf16
 * scale s then its values as int8 q, value = q * s (duck_q8_encode_row):
 * n + 2 * ceil(n / 32) bytes a row of n values, 1.0625 bytes a value
 * where n is a multiple of 32. A value's error is at most s / 2, s being
 * at most 1/127 of its block's largest magnitude (rounded up to bf16).
 * At most one of the x flags and one of the out flags.
 * DUCK_MODE_HEAD: top_k = 0; x is float[n_tokens][K] (the slot's K);
 * out is float[n_tokens][rows], the results of the rows this duck holds
 * from the slot's ob_begin on (duck_ob_header.hidden = rows - ob_begin).
 * ------------------------------------------------------------------------- */

#define DUCK_IB_MAGIC 0x50545344u /* "DSTP" */
#define DUCK_OB_MAGIC 0x534F5344u /* "DSOS" */

typedef struct duck_ib_header {
  uint32_t magic;
  uint32_t abi_version;
  uint32_t mode; // duck_mode
  uint32_t slot; // index into the slot table
  uint32_t n_tokens;
  uint32_t top_k; // MoE: slots per token (0 for dense)
  uint32_t x_offset;
  uint32_t flags; // duck_ib_flags; unknown bits are refused (BAD_INPUT)
} duck_ib_header;

typedef enum duck_ib_flags {
  DUCK_IB_X_BF16 = 1u, // x is bf16 (round to nearest even of the fp32)
  /// The OB's out is bf16: each fp32 result rounded to nearest even, two
  /// bytes a value (duck_ob_header.hidden values a token still).
  DUCK_IB_OUT_BF16 = 2u,
  DUCK_IB_X_Q8 = 4u,   // x is q8 rows (duck_q8_encode_row)
  DUCK_IB_OUT_Q8 = 8u, // the OB's out is q8 rows
  /// Staged steps (duckd's, never the ELF's: duckd takes them off before
  /// the call; docs/protocol.md "Staged steps"). DUCK_IB_STAGE: a MoE
  /// decode step whose slots are the token's shared experts, sent before
  /// the host has routed, in a quiet frame (DUCKD_FLAG_QUIET): duckd runs
  /// it, keeps its fp32 results and its x, and answers nothing.
  /// DUCK_IB_STAGED: the next
  /// step on that connection, the routed slots without x (the IB ends
  /// after its slots): duckd puts the stage's x back, runs it, adds the
  /// stage's results last (after the routed experts', as the ELF's sum in
  /// expert order would: shared ids follow routed ones) and narrows the
  /// sum as the out flags ask, so the OB has the bits of the whole step
  /// (and the stage's kernel time in duck_ob_header.stage_ns).
  /// A DUCK_IB_STAGED step with no such stage is answered
  /// DUCKD_ERR_STAGE_MISSED; any other step forgets the stage.
  DUCK_IB_STAGE = 16u,
  DUCK_IB_STAGED = 32u,
} duck_ib_flags;

/// Values in a q8 block (a row's last block may hold fewer).
#define DUCK_Q8_BLOCK 32u

/// Bytes of a q8 row of n values: n int8 values and a bf16 scale a block.
static inline uint64_t duck_q8_row_bytes(uint64_t n) {
  return n + 2 * ((n + DUCK_Q8_BLOCK - 1) / DUCK_Q8_BLOCK);
}

/// Bytes of one token's row of n activations (x) as `flags` sends them.
static inline uint64_t duck_x_row_bytes(uint64_t n, uint32_t flags) {
  return (flags & DUCK_IB_X_Q8)     ? duck_q8_row_bytes(n)
         : (flags & DUCK_IB_X_BF16) ? 2 * n
                                    : 4 * n;
}

/// Bytes of one token's row of n results as `flags` asks the duck for.
static inline uint64_t duck_out_row_bytes(uint64_t n, uint32_t flags) {
  return (flags & DUCK_IB_OUT_Q8)     ? duck_q8_row_bytes(n)
         : (flags & DUCK_IB_OUT_BF16) ? 2 * n
                                      : 4 * n;
}

/// A q8 block's scale (bf16 bits) for its n values: the largest magnitude
/// over 127, rounded up to bf16 so that no value's q exceeds 127; a NaN
/// among the values gives a NaN scale, an infinity an infinite one (every
/// value of the block then decodes to NaN: q is 0).
static inline uint16_t duck_q8_scale(const float *v, uint32_t n) {
  uint32_t amax = 0;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t u;
    __builtin_memcpy(&u, &v[i], 4);
    u &= 0x7fffffffu;
    amax = u > amax ? u : amax;
  }
  if (amax > 0x7f800000u)
    return 0x7fc0u;
  float a, s;
  __builtin_memcpy(&a, &amax, 4);
  s = a / 127.0f;
  uint32_t b;
  __builtin_memcpy(&b, &s, 4);
  if (b & 0xffffu)
    b += 0x10000u; // up: positive, and far below the largest finite
  return (uint16_t)(b >> 16);
}

/// Encodes one block of m <= 32 values as q8 at `out` (2 + m bytes): the
/// definition every faster form must match bit for bit. The values are
/// read whole before a byte is written (`out` may overlap them).
static inline void duck_q8_encode_block(const float *v, uint32_t m,
                                        uint8_t *out) {
  float blk[DUCK_Q8_BLOCK] = {0};
  __builtin_memcpy(blk, v, (m < DUCK_Q8_BLOCK ? m : DUCK_Q8_BLOCK) * 4);
  const uint16_t sb = duck_q8_scale(blk, m);
  const float s = duck_bf16_to_f32(sb);
  int8_t q[DUCK_Q8_BLOCK];
  for (uint32_t i = 0; i < m; ++i) {
    float t = s > 0.0f ? blk[i] / s : 0.0f; // s 0: the block is zeros
    t = t > 127.0f ? 127.0f : t < -127.0f ? -127.0f : t;
    t = t == t ? t : 0.0f;
    // Nearest, ties to even: |t| <= 127, far below 2^22.
    t = (t + 12582912.0f) - 12582912.0f;
    q[i] = (int8_t)(int)t;
  }
  __builtin_memcpy(out, &sb, 2);
  __builtin_memcpy(out + 2, q, m);
}

#if defined(__AVX2__)
/// duck_q8_encode_block of a whole block with AVX2: the same bytes (the
/// same scale, IEEE division, clamp, NaN to 0 and rounding to even).
static inline void duck_q8_encode_block32_avx2(const float *v, uint8_t *out) {
  __m256 x[4];
  __m256i amax = _mm256_setzero_si256();
  const __m256i absMask = _mm256_set1_epi32(0x7fffffff);
  for (int k = 0; k < 4; ++k) {
    x[k] = _mm256_loadu_ps(v + 8 * k);
    amax = _mm256_max_epu32(
        amax, _mm256_and_si256(_mm256_castps_si256(x[k]), absMask));
  }
  __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(amax),
                             _mm256_extracti128_si256(amax, 1));
  m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4e));
  m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0xb1));
  const uint32_t a = (uint32_t)_mm_cvtsi128_si32(m4);
  float af;
  __builtin_memcpy(&af, &a, 4);
  const uint16_t sb = duck_q8_scale(&af, 1);
  const float s = duck_bf16_to_f32(sb);
  __m256i qi[4];
  for (int k = 0; k < 4; ++k) {
    __m256 t =
        s > 0.0f ? _mm256_div_ps(x[k], _mm256_set1_ps(s)) : _mm256_setzero_ps();
    const __m256 ord = _mm256_cmp_ps(t, t, _CMP_ORD_Q);
    t = _mm256_max_ps(_mm256_min_ps(t, _mm256_set1_ps(127.0f)),
                      _mm256_set1_ps(-127.0f));
    t = _mm256_and_ps(t, ord);
    qi[k] = _mm256_cvtps_epi32(
        _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]),
                                       _mm256_packs_epi32(qi[2], qi[3]));
  const __m256i q =
      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  __builtin_memcpy(out, &sb, 2);
  _mm256_storeu_si256((__m256i *)(void *)(out + 2), q);
}

/// duck_q8_decode_row's whole block with AVX2 (the same products).
static inline void duck_q8_decode_block32_avx2(const uint8_t *in, float *v) {
  uint16_t sb;
  __builtin_memcpy(&sb, in, 2);
  const __m256 s = _mm256_set1_ps(duck_bf16_to_f32(sb));
  for (int k = 0; k < 4; ++k) {
    const __m256i q = _mm256_cvtepi8_epi32(
        _mm_loadl_epi64((const __m128i *)(const void *)(in + 2 + 8 * k)));
    _mm256_storeu_ps(v + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(q), s));
  }
}
#endif

/// Encodes a row of n values as q8 at `out` (duck_q8_row_bytes(n) bytes),
/// block by block, each read whole before its bytes are written: `out`
/// may be the row's own storage (the bytes written never pass the values
/// still to read).
static inline void duck_q8_encode_row(const float *v, uint64_t n,
                                      uint8_t *out) {
  for (uint64_t b = 0; b < n; b += DUCK_Q8_BLOCK) {
    const uint32_t m =
        (uint32_t)(n - b < DUCK_Q8_BLOCK ? n - b : DUCK_Q8_BLOCK);
#if defined(__AVX2__)
    if (m == DUCK_Q8_BLOCK)
      duck_q8_encode_block32_avx2(v + b, out);
    else
#endif
      duck_q8_encode_block(v + b, m, out);
    out += 2 + m;
  }
}

/// Decodes a q8 row of n values (duck_q8_encode_row's) into fp32 `v`.
static inline void duck_q8_decode_row(const uint8_t *in, uint64_t n, float *v) {
  for (uint64_t b = 0; b < n; b += DUCK_Q8_BLOCK) {
    const uint32_t m =
        (uint32_t)(n - b < DUCK_Q8_BLOCK ? n - b : DUCK_Q8_BLOCK);
#if defined(__AVX2__)
    if (m == DUCK_Q8_BLOCK) {
      duck_q8_decode_block32_avx2(in, v + b);
      in += 2 + m;
      continue;
    }
#endif
    uint16_t sb;
    __builtin_memcpy(&sb, in, 2);
    const float s = duck_bf16_to_f32(sb);
    const int8_t *q = (const int8_t *)(const void *)(in + 2);
    for (uint32_t i = 0; i < m; ++i)
      v[b + i] = (float)q[i] * s;
    in += 2 + m;
  }
}

typedef struct duck_ob_header {
  uint32_t magic;
  uint32_t status; // duck_status
  uint32_t n_tokens;
  uint32_t hidden;
  uint64_t out_offset; // 64
  /// duckd's, never the ELF's (which writes 0): on a DUCK_IB_STAGED
  /// step's OB, the time its stage spent in the ELF on its slowest core
  /// (ns), the stage itself being answered with nothing.
  uint64_t stage_ns;
  /// duckd's too: on a staged step whose stage came as a cast batch alone
  /// (step_staged), how long before the step's frame came the stage had
  /// finished (ns); 0: it ran after the frame (or came in a frame).
  uint64_t stage_ahead_ns;
  uint64_t reserved[3];
} duck_ob_header;

/// Offset of x in an IB that carries `n_slots` routing slots (32-aligned).
/// Whether a reader takes an image of this format version.
static inline int duck_image_format_known(uint32_t v) {
  return v == DUCK_IMAGE_FORMAT_VERSION ||
         v == DUCK_IMAGE_FORMAT_VERSION_CHAINED;
}

static inline uint32_t duck_ib_x_offset(uint64_t n_slots) {
  return (uint32_t)((sizeof(duck_ib_header) +
                     n_slots * sizeof(duck_expert_slot) + 31) / 32 * 32);
}

/// Bytes of an IB for n_tokens x hidden activations (fp32, or bf16 or q8
/// as `flags` says) and n_tokens * top_k slots.
static inline uint64_t duck_ib_bytes_flags(uint32_t n_tokens, uint32_t top_k,
                                           uint32_t hidden, uint32_t flags) {
  return duck_ib_x_offset((uint64_t)n_tokens * top_k) +
         (uint64_t)n_tokens * duck_x_row_bytes(hidden, flags);
}

static inline uint64_t duck_ib_bytes(uint32_t n_tokens, uint32_t top_k,
                                     uint32_t hidden) {
  return duck_ib_bytes_flags(n_tokens, top_k, hidden, 0);
}

/// fp32 -> bf16, round to nearest, ties to even (a NaN stays a quiet NaN);
/// duck_bf16_to_f32 (fp9.h) widens it back exactly.
static inline uint16_t duck_f32_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/// Narrows `rows` results of `width` fp32 values at `out`, in place and
/// front to back, to the form `out_flags` asks (DUCK_IB_OUT_Q8, _BF16; a
/// row's bytes land at or below the floats they were read from, moved as
/// bytes); returns their bytes. The ELF's OB and duckd's staged sums.
static inline uint64_t duck_narrow_out(float *out, uint64_t rows,
                                       uint64_t width, uint32_t out_flags) {
  uint8_t *b = (uint8_t *)(void *)out;
  if (out_flags & DUCK_IB_OUT_Q8) {
    const uint64_t row = duck_q8_row_bytes(width);
    for (uint64_t r = 0; r < rows; ++r)
      duck_q8_encode_row(out + r * width, width, b + r * row);
    return rows * row;
  }
  if (out_flags & DUCK_IB_OUT_BF16) {
    for (uint64_t i = 0; i < rows * width; ++i) {
      float v;
      __builtin_memcpy(&v, b + 4 * i, 4);
      const uint16_t h = duck_f32_to_bf16(v);
      __builtin_memcpy(b + 2 * i, &h, 2);
    }
    return rows * width * 2;
  }
  return rows * width * 4;
}

/// Encodes one step's IB into `ib` (duck_ib_bytes_flags(...) bytes): the
/// header, n_tokens * top_k slots (may be null when top_k is 0) and x,
/// rounded to bf16 or q8 when `flags` has DUCK_IB_X_BF16 or DUCK_IB_X_Q8.
static inline void duck_ib_write_flags(uint8_t *ib, uint32_t mode,
                                       uint32_t slot, uint32_t n_tokens,
                                       uint32_t top_k,
                                       const duck_expert_slot *slots,
                                       const float *x, uint32_t hidden,
                                       uint32_t flags) {
  duck_ib_header h;
  __builtin_memset(&h, 0, sizeof h);
  h.magic = DUCK_IB_MAGIC;
  h.abi_version = DUCK_ABI_VERSION;
  h.mode = mode;
  h.slot = slot;
  h.n_tokens = n_tokens;
  h.top_k = top_k;
  h.x_offset = duck_ib_x_offset((uint64_t)n_tokens * top_k);
  h.flags = flags;
  __builtin_memset(ib, 0, h.x_offset);
  __builtin_memcpy(ib, &h, sizeof h);
  if (top_k && slots)
    __builtin_memcpy(ib + sizeof h, slots,
                     (uint64_t)n_tokens * top_k * sizeof(duck_expert_slot));
  if (x && (flags & DUCK_IB_X_Q8)) {
    const uint64_t row = duck_q8_row_bytes(hidden);
    for (uint64_t t = 0; t < n_tokens; ++t)
      duck_q8_encode_row(x + t * hidden, hidden, ib + h.x_offset + t * row);
  } else if (x && (flags & DUCK_IB_X_BF16)) {
    uint16_t *o = (uint16_t *)(void *)(ib + h.x_offset);
    for (uint64_t i = 0; i < (uint64_t)n_tokens * hidden; ++i)
      o[i] = duck_f32_to_bf16(x[i]);
  } else if (x) {
    __builtin_memcpy(ib + h.x_offset, x,
                     (uint64_t)n_tokens * hidden * sizeof(float));
  }
}

/// duck_ib_write_flags with fp32 x.
static inline void duck_ib_write(uint8_t *ib, uint32_t mode, uint32_t slot,
                                 uint32_t n_tokens, uint32_t top_k,
                                 const duck_expert_slot *slots, const float *x,
                                 uint32_t hidden) {
  duck_ib_write_flags(ib, mode, slot, n_tokens, top_k, slots, x, hidden, 0);
}

/// Shared scratch an ELF step needs for a slot (bytes), for every mode:
/// per-core FFN scratch for `cores` cores plus the shared buffers of dense
/// and MoE decode and prefill (duck-rt/elf/step_layout.h carves it). The
/// scratch must be 64-byte aligned. UINT64_MAX for arguments beyond the
/// ELF's limits (n_tokens > 65536, top_k > 64, hidden/inter > 2^18,
/// n_experts > 4096, cores > 64). Defined in the ELF and in duck_abi.
uint64_t duck_step_scratch_bytes(uint32_t hidden, uint32_t inter,
                                 uint32_t n_tokens, uint32_t top_k,
                                 uint32_t n_experts, uint32_t cores);

#ifdef __cplusplus
} // extern "C"

static_assert(sizeof(duck_image_header) == 80, "duck_image_header is ABI");
static_assert(sizeof(duck_slot_entry) == 32, "duck_slot_entry is ABI");
static_assert(sizeof(duck_fp9_desc) == 20, "duck_fp9_desc is ABI");
static_assert(sizeof(duck_matrix_ref) == 40, "duck_matrix_ref is ABI");
static_assert(sizeof(duck_ffn_desc) == 128, "duck_ffn_desc is ABI");
static_assert(sizeof(duck_slot_header) == 32, "duck_slot_header is ABI");
static_assert(sizeof(duck_ib_header) == 32, "duck_ib_header is ABI");
static_assert(sizeof(duck_ob_header) == 64, "duck_ob_header is ABI");
static_assert(sizeof(duck_expert_slot) == 8, "duck_expert_slot is ABI");
static_assert(sizeof(duck_info) == 152, "duck_info is ABI");
static_assert(offsetof(duck_info, weights_generation) == 136 &&
                  offsetof(duck_info, step_seq) == 144,
              "duck_info is ABI (appended fields)");
#endif

#endif // DUCK_RT_ABI_H
