// Fused FFN paths on a duck: dense MLP and MoE, decode and prefill, on one
// or many cores (modes 0, 1, 4, 5, 6 of the duck ELF).
#include "duck_rt/kernels.h"
#include "duck_rt/exp_avx2.h"

#include <immintrin.h>

namespace {

/// exp(x) for 8 lanes without libc: x clamped to [-87, 88], n rounded by
/// floor(x / ln 2 + 0.5) (duck_exp8_reduced does the rest).
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)),
                    _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(
      x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  return duck_exp8_reduced(x, n);
}

/// h = silu(g) * u for 8 lanes, flushed to zero below 2^-64 in magnitude.
/// A strongly negative gate (silu(-90) is about 1e-37) would otherwise feed
/// the down projection inputs whose products with the weights are
/// subnormal, and every such FMA takes a microcode assist: 64-token prefill
/// ran 70x slower on activations like that. Nothing that small changes an
/// fp32 sum of the down projection's size.
inline __m256 siluMul8(__m256 g, __m256 u) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
  const __m256 h = _mm256_mul_ps(
      _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
  const __m256 mag = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), h);
  return _mm256_and_ps(h, _mm256_cmp_ps(mag, _mm256_set1_ps(0x1p-64f), _CMP_GE_OQ));
}

/// h[i] = silu(g[i]) * u[i]. Every element goes through the same vector
/// code (the tail through a masked load), so an element's result does not
/// depend on where a core's slice starts: decode and prefill agree bit for
/// bit.
inline void siluMul(const float *g, const float *u, float *h, uint32_t n) {
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(h + i, siluMul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  if (i < n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask =
        _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), lane);
    const __m256 v = siluMul8(_mm256_maskload_ps(g + i, mask),
                              _mm256_maskload_ps(u + i, mask));
    _mm256_maskstore_ps(h + i, mask, v);
  }
}

inline uint32_t maxu(uint32_t a, uint32_t b) { return a > b ? a : b; }

/// Per-core scratch carve-up (floats, each piece 32-byte aligned).
struct Scratch {
  float *xs; // pre-scaled inputs (+ negated copy): 2 * n_tokens * max(H, I)
  float *g;  // n_tokens * I
  float *u;  // n_tokens * I
  float *xe; // gathered expert inputs / hidden activations: n_tokens * max(H,I)
  float *y;  // n_tokens * H
};

inline uint64_t round8(uint64_t v) { return (v + 7) / 8 * 8; }

Scratch carve(float *base, uint32_t hidden, uint32_t inter, uint32_t tokens) {
  uint64_t mx = maxu(hidden, inter);
  Scratch s;
  s.xs = base;
  s.g = s.xs + round8(2ull * tokens * mx);
  s.u = s.g + round8((uint64_t)tokens * inter);
  s.xe = s.u + round8((uint64_t)tokens * inter);
  s.y = s.xe + round8((uint64_t)tokens * mx);
  return s;
}

/// One expert (or dense slice) for one token on one core:
/// y = down(silu(gate x) * up x).
void ffnOneToken(const duck_ffn_weights *w, const float *x, float *y,
                 const Scratch &s) {
  const uint32_t inter = w->gate.rows, hidden = w->down.rows;
  duck_gemv(&w->gate, x, s.g, 0, inter, s.xs, DUCK_DECODE_SHIFT);
  duck_gemv(&w->up, x, s.u, 0, inter, s.xs, DUCK_DECODE_SHIFT);
  siluMul(s.g, s.u, s.xe, inter);
  duck_gemv(&w->down, s.xe, y, 0, hidden, s.xs, DUCK_DECODE_SHIFT);
}

/// One expert for n tokens (rows of xin) on one core, batched GEMM.
void ffnTokens(const duck_ffn_weights *w, const float *xin, uint32_t n,
               float *y, const Scratch &s) {
  const uint32_t inter = w->gate.rows, hidden = w->down.rows;
  duck_gemm(&w->gate, xin, hidden, n, s.g, inter, 0, inter, s.xs);
  duck_gemm(&w->up, xin, hidden, n, s.u, inter, 0, inter, s.xs);
  siluMul(s.g, s.u, s.g, n * inter);
  duck_gemm(&w->down, s.g, inter, n, y, hidden, 0, hidden, s.xs);
}

void sortSlotsByExpert(duck_expert_slot *slots, uint32_t n) {
  for (uint32_t i = 1; i < n; ++i) { // stable insertion sort, n <= top-k
    duck_expert_slot v = slots[i];
    uint32_t j = i;
    while (j > 0 && slots[j - 1].expert > v.expert) {
      slots[j] = slots[j - 1];
      --j;
    }
    slots[j] = v;
  }
}

/// MoE prefill's work area: each expert's count and start, the (token,
/// slot) pairs sorted by expert, and each worker's first expert.
struct PrefillWork {
  uint32_t *count, *start, *pairs, *first;
};

/// Core 0: a counting sort of the (token, slot) pairs by expert id, then
/// contiguous expert ranges per worker, balanced by token count.
void sortPairsByExpert(const duck_expert_slot *slots, uint32_t n_experts,
                       uint32_t n_pairs, uint32_t cores, PrefillWork &w) {
  uint32_t *count = w.count, *start = w.start, *pairs = w.pairs,
           *first = w.first;
  for (uint32_t e = 0; e < n_experts; ++e)
    count[e] = 0;
  for (uint32_t p = 0; p < n_pairs; ++p)
    if (slots[p].expert < n_experts)
      ++count[slots[p].expert];
  start[0] = 0;
  for (uint32_t e = 0; e < n_experts; ++e)
    start[e + 1] = start[e] + count[e];
  for (uint32_t e = 0; e < n_experts; ++e)
    count[e] = start[e];
  for (uint32_t p = 0; p < n_pairs; ++p)
    if (slots[p].expert < n_experts)
      pairs[count[slots[p].expert]++] = p;
  const uint32_t total = start[n_experts];
  uint32_t e = 0;
  first[0] = 0;
  for (uint32_t c = 1; c < cores; ++c) {
    uint64_t target = (uint64_t)total * c / cores;
    while (e < n_experts && start[e + 1] <= target)
      ++e;
    first[c] = e;
  }
  first[cores] = n_experts;
  for (uint32_t c = 1; c <= cores; ++c)
    if (first[c] < first[c - 1])
      first[c] = first[c - 1];
}

/// One core: runs its experts over the tokens that chose them, each pair's
/// output weighted into pair_out.
void runExpertRange(const duck_ffn_weights *experts,
                    const duck_expert_slot *slots, uint32_t top_k,
                    const float *x, uint32_t n_tokens, uint32_t hidden,
                    const PrefillWork &w, uint32_t core, float *pair_out,
                    const Scratch &s) {
  for (uint32_t e = w.first[core]; e < w.first[core + 1]; ++e) {
    const uint32_t n = w.start[e + 1] - w.start[e];
    if (n == 0)
      continue;
    // Chunks of at most n_tokens pairs (the scratch size); a token that
    // names the same expert twice makes n exceed n_tokens.
    for (uint32_t off = 0; off < n; off += n_tokens) {
      const uint32_t chunk = n - off < n_tokens ? n - off : n_tokens;
      const uint32_t *list = w.pairs + w.start[e] + off;
      for (uint32_t i = 0; i < chunk; ++i) {
        const float *src = x + (uint64_t)(list[i] / top_k) * hidden;
        float *dst = s.xe + (uint64_t)i * hidden;
        for (uint32_t j = 0; j < hidden; ++j)
          dst[j] = src[j];
      }
      ffnTokens(&experts[e], s.xe, chunk, s.y, s);
      for (uint32_t i = 0; i < chunk; ++i) {
        const float wt = slots[list[i]].weight;
        float *dst = pair_out + (uint64_t)list[i] * hidden;
        const float *y = s.y + (uint64_t)i * hidden;
        for (uint32_t j = 0; j < hidden; ++j)
          dst[j] = y[j] * wt;
      }
    }
  }
}

/// Each token adds its experts' outputs in ascending expert order (the
/// order MoE decode uses), so prefill matches decode bit for bit; the
/// tokens are split over the cores.
void sumTokenOutputs(const duck_smp_ctx *smp, uint32_t core,
                     const duck_expert_slot *slots, uint32_t n_experts,
                     uint32_t top_k, uint32_t n_tokens, uint32_t hidden,
                     const float *pair_out, float *out) {
  uint32_t tb, te;
  duck_smp_split(n_tokens, smp->cores, core, &tb, &te);
  for (uint32_t t = tb; t < te; ++t) {
    const duck_expert_slot *ts = slots + (uint64_t)t * top_k;
    uint32_t order[64];
    uint32_t n = top_k < 64 ? top_k : 64;
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t j = i;
      while (j > 0 && ts[order[j - 1]].expert > ts[i].expert) {
        order[j] = order[j - 1];
        --j;
      }
      order[j] = i;
    }
    float *o = out + (uint64_t)t * hidden;
    for (uint32_t j = 0; j < hidden; ++j)
      o[j] = 0.0f;
    for (uint32_t i = 0; i < n; ++i) {
      if (ts[order[i]].expert >= n_experts)
        continue;
      const float *y = pair_out + ((uint64_t)t * top_k + order[i]) * hidden;
      for (uint32_t j = 0; j < hidden; ++j)
        o[j] += y[j];
    }
  }
}

} // namespace

extern "C" {

uint64_t duck_ffn_scratch_floats(uint32_t hidden, uint32_t inter,
                                 uint32_t n_tokens) {
  uint64_t mx = maxu(hidden, inter), t = n_tokens ? n_tokens : 1;
  return round8(2 * t * mx) + 2 * round8(t * inter) + round8(t * mx) +
         round8(t * hidden) + 8;
}

void duck_mlp_decode(const duck_smp_ctx *smp, uint32_t core,
                     const duck_ffn_weights *w, const float *x, float *out,
                     float *shared, float *scratch) {
  const uint32_t inter = w->gate.rows, hidden = w->down.rows;
  Scratch s = carve(scratch, hidden, inter, 1);
  uint32_t b, e;
  duck_smp_split(inter, smp->cores, core, &b, &e);
  if (b < e) {
    duck_gemv(&w->gate, x, s.g, b, e, s.xs, DUCK_DECODE_SHIFT);
    duck_gemv(&w->up, x, s.u, b, e, s.xs, DUCK_DECODE_SHIFT);
    siluMul(s.g, s.u, shared + b, e - b);
  }
  duck_smp_sync(smp);
  duck_smp_split(hidden, smp->cores, core, &b, &e);
  if (b < e)
    duck_gemv(&w->down, shared, out + b, b, e, s.xs, DUCK_DECODE_SHIFT);
  duck_smp_sync(smp);
}

void duck_moe_decode(const duck_smp_ctx *smp, uint32_t core,
                     const duck_ffn_weights *experts, uint32_t n_experts,
                     duck_expert_slot *slots, uint32_t n_slots, const float *x,
                     float *out, float *slot_out, float *scratch) {
  const uint32_t hidden = experts[0].down.rows, inter = experts[0].gate.rows;
  if (core == 0)
    sortSlotsByExpert(slots, n_slots);
  duck_smp_sync(smp);
  const uint32_t workers = n_slots < smp->cores ? n_slots : smp->cores;
  if (core < workers) {
    Scratch s = carve(scratch, hidden, inter, 1);
    uint32_t b, e;
    duck_smp_split(n_slots, workers, core, &b, &e);
    for (uint32_t i = b; i < e; ++i) {
      float *y = slot_out + (uint64_t)i * hidden;
      if (slots[i].expert >= n_experts) // contributes nothing (checked by
        continue;                         // the caller; never trusted here)
      ffnOneToken(&experts[slots[i].expert], x, y, s);
      const float wt = slots[i].weight;
      for (uint32_t j = 0; j < hidden; ++j)
        y[j] *= wt;
    }
  }
  duck_smp_sync(smp);
  if (core == 0) {
    for (uint32_t j = 0; j < hidden; ++j)
      out[j] = 0.0f;
    for (uint32_t i = 0; i < n_slots; ++i) {
      if (slots[i].expert >= n_experts)
        continue;
      const float *y = slot_out + (uint64_t)i * hidden;
      for (uint32_t j = 0; j < hidden; ++j)
        out[j] += y[j];
    }
  }
  duck_smp_sync(smp);
}

void duck_moe_decode_one(const duck_smp_ctx *smp, uint32_t core,
                         const duck_ffn_weights *experts, uint32_t n_experts,
                         const duck_expert_slot *slot, const float *x,
                         float *out, float *shared, float *scratch) {
  const uint32_t hidden = experts[0].down.rows;
  const bool used = slot->expert < n_experts; // else it contributes nothing
  if (used)
    duck_mlp_decode(smp, core, &experts[slot->expert], x, out, shared, scratch);
  uint32_t b, e;
  duck_smp_split(hidden, smp->cores, core, &b, &e);
  const float wt = slot->weight;
  for (uint32_t j = b; j < e; ++j)
    out[j] = used ? 0.0f + out[j] * wt : 0.0f;
  duck_smp_sync(smp);
}

void duck_mlp_prefill(const duck_smp_ctx *smp, uint32_t core,
                      const duck_ffn_weights *w, const float *x,
                      uint32_t n_tokens, float *out, float *shared,
                      float *scratch) {
  const uint32_t inter = w->gate.rows, hidden = w->down.rows;
  Scratch s = carve(scratch, hidden, inter, n_tokens);
  uint32_t b, e;
  duck_smp_split(inter, smp->cores, core, &b, &e);
  if (b < e) {
    const uint32_t n = e - b;
    duck_gemm(&w->gate, x, hidden, n_tokens, s.g, n, b, e, s.xs);
    duck_gemm(&w->up, x, hidden, n_tokens, s.u, n, b, e, s.xs);
    for (uint32_t t = 0; t < n_tokens; ++t)
      siluMul(s.g + (uint64_t)t * n, s.u + (uint64_t)t * n,
              shared + (uint64_t)t * inter + b, n);
  }
  duck_smp_sync(smp);
  duck_smp_split(hidden, smp->cores, core, &b, &e);
  if (b < e)
    duck_gemm(&w->down, shared, inter, n_tokens, out + b, hidden, b, e, s.xs);
  duck_smp_sync(smp);
}

// Work area of MoE prefill (uint32 words):
//   count[n_experts] start[n_experts + 1] pairs[n_tokens * top_k]
//   worker_first_expert[cores + 1]
uint64_t duck_moe_prefill_work_words(uint32_t n_tokens, uint32_t top_k,
                                     uint32_t n_experts, uint32_t cores) {
  return 2ull * n_experts + 1 + (uint64_t)n_tokens * top_k + cores + 1;
}

void duck_moe_prefill(const duck_smp_ctx *smp, uint32_t core,
                      const duck_ffn_weights *experts, uint32_t n_experts,
                      const duck_expert_slot *slots, uint32_t top_k,
                      const float *x, uint32_t n_tokens, float *out,
                      float *pair_out, uint32_t *work, float *scratch) {
  const uint32_t hidden = experts[0].down.rows, inter = experts[0].gate.rows;
  const uint32_t n_pairs = n_tokens * top_k;
  PrefillWork w;
  w.count = work;
  w.start = w.count + n_experts;
  w.pairs = w.start + n_experts + 1;
  w.first = w.pairs + n_pairs;
  if (core == 0)
    sortPairsByExpert(slots, n_experts, n_pairs, smp->cores, w);
  duck_smp_sync(smp);

  Scratch s = carve(scratch, hidden, inter, n_tokens);
  runExpertRange(experts, slots, top_k, x, n_tokens, hidden, w, core,
                 pair_out, s);
  duck_smp_sync(smp);

  sumTokenOutputs(smp, core, slots, n_experts, top_k, n_tokens, hidden,
                  pair_out, out);
  duck_smp_sync(smp);
}

} // extern "C"
