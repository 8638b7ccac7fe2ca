/* plan_trailer.h - the checksum after the FlatBuffer in model.duckplan.
 *
 * A plan file is the FlatBuffer (plan.fbs) followed by this 16-byte
 * trailer: the bytes "DKCS", four zero bytes, and the XXH3-64 of every
 * byte before the trailer, little-endian. duckc writes it; every reader
 * checks it before it trusts a field, so a flipped byte anywhere in the
 * plan is an error, never a silent run. */
#ifndef DUCK_PLAN_TRAILER_H
#define DUCK_PLAN_TRAILER_H

#include <stdint.h>
#include <string.h>
#include <xxhash.h>

enum { DUCK_PLAN_TRAILER_BYTES = 16 };
static const char DUCK_PLAN_TRAILER_MAGIC[4] = {'D', 'K', 'C', 'S'};

/* Writes the trailer of the `size` plan bytes at `data` into `out`. */
static inline void duck_plan_trailer(const void *data, uint64_t size,
                                     uint8_t out[DUCK_PLAN_TRAILER_BYTES]) {
  uint64_t h = XXH3_64bits(data, size);
  memcpy(out, DUCK_PLAN_TRAILER_MAGIC, 4);
  memset(out + 4, 0, 4);
  memcpy(out + 8, &h, 8);
}

/* 1 when the file of `size` bytes at `data` ends with a trailer that
 * matches the bytes before it; *out_plan_size is the FlatBuffer's size. */
static inline int duck_plan_trailer_ok(const void *data, uint64_t size,
                                       uint64_t *out_plan_size) {
  uint8_t want[DUCK_PLAN_TRAILER_BYTES];
  if (size < DUCK_PLAN_TRAILER_BYTES)
    return 0;
  *out_plan_size = size - DUCK_PLAN_TRAILER_BYTES;
  duck_plan_trailer(data, *out_plan_size, want);
  return memcmp(want, (const uint8_t *)data + *out_plan_size,
                DUCK_PLAN_TRAILER_BYTES) == 0;
}

#endif
