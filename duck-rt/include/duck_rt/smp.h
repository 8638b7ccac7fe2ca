// Multi-core primitives for code running on every core of a duck at once:
// a spinning barrier and a phase-based job board. Built only on __atomic
// builtins and `pause`, so they work inside the freestanding duck ELF.
#ifndef DUCK_RT_SMP_H
#define DUCK_RT_SMP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline void duck_cpu_relax(void) { __builtin_ia32_pause(); }

/// A reusable barrier for `n` cores (generation counting: a core that
/// leaves barrier k can never be confused with barrier k+1).
typedef struct duck_barrier {
  uint32_t n;
  /// Called every DUCK_SPIN_YIELD_EVERY spins when set: a host running more
  /// threads than cores (tests, an oversubscribed duckd) passes sched_yield;
  /// the bare-metal duck leaves it null and spins.
  void (*yield)(void);
  uint32_t count __attribute__((aligned(64)));
  uint32_t generation __attribute__((aligned(64)));
} duck_barrier;

enum { DUCK_SPIN_YIELD_EVERY = 256 };

static inline void duck_spin_pause(void (*yield)(void), uint32_t *spins) {
  duck_cpu_relax();
  if (yield && ++*spins % DUCK_SPIN_YIELD_EVERY == 0)
    yield();
}

static inline void duck_barrier_init(duck_barrier *b, uint32_t n) {
  b->n = n;
  b->yield = 0;
  __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&b->generation, 0, __ATOMIC_RELEASE);
}

static inline void duck_barrier_wait(duck_barrier *b) {
  if (b->n <= 1)
    return;
  uint32_t gen = __atomic_load_n(&b->generation, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == b->n) {
    __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&b->generation, gen + 1, __ATOMIC_RELEASE);
    return;
  }
  uint32_t spins = 0;
  while (__atomic_load_n(&b->generation, __ATOMIC_ACQUIRE) == gen)
    duck_spin_pause(b->yield, &spins);
}

/// What a multi-core kernel needs to know about its cores.
typedef struct duck_smp_ctx {
  uint32_t cores;
  duck_barrier *barrier;
} duck_smp_ctx;

static inline void duck_smp_sync(const duck_smp_ctx *smp) {
  if (smp->cores > 1)
    duck_barrier_wait(smp->barrier);
}

/// Contiguous share [*out_begin, *out_end) of `total` items for `core`.
static inline void duck_smp_split(uint32_t total, uint32_t cores, uint32_t core,
                                  uint32_t *out_begin, uint32_t *out_end) {
  uint32_t base = total / cores, extra = total % cores;
  *out_begin = core * base + (core < extra ? core : extra);
  *out_end = *out_begin + base + (core < extra ? 1 : 0);
}

/// Job publication between core 0 and the secondary cores. Core 0 writes
/// the job, then flips the phase to ACTIVE with the step's sequence number;
/// a secondary core runs a job only when the phase is ACTIVE *and* the
/// sequence is the one it waits for, so a core that arrives late can run
/// neither the previous step's job nor the next one's. Core 0 flips back to
/// IDLE once every core has finished (after a barrier).
enum { DUCK_PHASE_IDLE = 0, DUCK_PHASE_ACTIVE = 1 };

typedef struct duck_job_board {
  uint64_t word __attribute__((aligned(64))); // phase << 63 | sequence
  const void *job;
  void (*yield)(void); // as in duck_barrier
} duck_job_board;

static inline uint64_t duck_job_word(uint32_t phase, uint64_t seq) {
  return ((uint64_t)phase << 63) | (seq & 0x7FFFFFFFFFFFFFFFull);
}

static inline void duck_job_board_init(duck_job_board *b) {
  b->job = 0;
  b->yield = 0;
  __atomic_store_n(&b->word, duck_job_word(DUCK_PHASE_IDLE, 0),
                   __ATOMIC_RELEASE);
}

/// Core 0: publishes `job` as step `seq` (seq increases by one each step).
static inline void duck_job_publish(duck_job_board *b, const void *job,
                                    uint64_t seq) {
  __atomic_store_n(&b->job, job, __ATOMIC_RELEASE);
  __atomic_store_n(&b->word, duck_job_word(DUCK_PHASE_ACTIVE, seq),
                   __ATOMIC_RELEASE);
}

/// Core 0: marks step `seq` finished.
static inline void duck_job_retire(duck_job_board *b, uint64_t seq) {
  __atomic_store_n(&b->word, duck_job_word(DUCK_PHASE_IDLE, seq),
                   __ATOMIC_RELEASE);
}

/// Secondary core: waits for step `seq` to be ACTIVE and returns its job.
/// Returns 0 if the board has moved past `seq` (the step was missed).
static inline const void *duck_job_wait(duck_job_board *b, uint64_t seq) {
  uint32_t spins = 0;
  for (;;) {
    uint64_t w = __atomic_load_n(&b->word, __ATOMIC_ACQUIRE);
    uint64_t s = w & 0x7FFFFFFFFFFFFFFFull;
    if (s == seq && (w >> 63) == DUCK_PHASE_ACTIVE) {
      const void *job = __atomic_load_n(&b->job, __ATOMIC_ACQUIRE);
      // Re-check: the job pointer must belong to the step we matched.
      if (__atomic_load_n(&b->word, __ATOMIC_ACQUIRE) == w)
        return job;
      continue;
    }
    if (s > seq)
      return 0;
    duck_spin_pause(b->yield, &spins);
  }
}

#ifdef __cplusplus
} // extern "C"
#endif

#endif // DUCK_RT_SMP_H
