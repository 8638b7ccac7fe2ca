// libFuzzer: what a duck's cast socket takes from the network
// (duck_rt/cast.h): datagrams offered to a batch being assembled. The
// input's first 16 bytes choose the batch (its id, the IB's size and the
// datagram limit); the rest is cut into datagrams by 2-byte lengths. Every
// datagram either lands exactly within the IB (ASan checks the bounds of an
// IB allocated at its size) or is refused, and the batch counts what it
// placed. The same datagrams are then kept as a duck keeps them while no
// frame asks for their batch (CastHeld: a cast stage's, whose shape is
// read off its datagrams); a whole batch they make is assembled into an
// IB of exactly the size they claim, within the session's limit.
#include "duck_rt/cast.h"

#include <algorithm>
#include <cstring>
#include <memory>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 16)
    return 0;
  uint64_t id;
  uint32_t ibBytes, limit;
  std::memcpy(&id, data, 8);
  std::memcpy(&ibBytes, data + 8, 4);
  std::memcpy(&limit, data + 12, 4);
  ibBytes = 1 + ibBytes % (1 << 18);
  limit = 25 + limit % 2000;
  auto shape = duck::duckd::CastShapeFor(ibBytes, limit);
  if (!shape.ok())
    __builtin_trap(); // every (ibBytes, limit) above is a legal shape
  auto ib = std::make_unique<uint8_t[]>(ibBytes);
  duck::duckd::CastBatch batch;
  batch.Begin(id % 4, *shape, ibBytes, ib.get());
  // The rest cut into datagrams by 2-byte lengths; some "truncated".
  auto eachDatagram = [&](auto &&fn) {
    for (size_t at = 16; at + 2 <= size;) {
      uint16_t len;
      std::memcpy(&len, data + at, 2);
      at += 2;
      len = uint16_t(std::min<size_t>(len, size - at));
      fn(absl::Span<const uint8_t>(data + at, len), len & 1 && at & 1);
      at += len;
    }
  };
  uint32_t placed = 0;
  eachDatagram([&](absl::Span<const uint8_t> d, bool truncated) {
    placed += batch.Offer(d, truncated) == duck::duckd::CastBatch::Took::placed;
  });
  if (batch.missing() + placed != shape->datagrams)
    __builtin_trap();

  duck::duckd::CastHeld held(1 + (id >> 8) % (1 << 19));
  uint64_t stale = 0;
  eachDatagram([&](absl::Span<const uint8_t> d, bool truncated) {
    held.Keep(d, truncated, &stale);
  });
  duck::duckd::CastShape kept;
  uint64_t keptBytes = 0;
  if (!held.Shape(ibBytes, &kept, &keptBytes))
    return 0;
  if (keptBytes == 0 || keptBytes > ibBytes)
    __builtin_trap();
  auto staged = std::make_unique<uint8_t[]>(keptBytes);
  duck::duckd::CastBatch whole;
  whole.Begin(held.cast_id(), kept, keptBytes, staged.get(), held.magic());
  uint32_t offered = 0, fitted = 0;
  held.Replay(whole, [&](duck::duckd::CastBatch::Took t) {
    ++offered;
    fitted += t == duck::duckd::CastBatch::Took::placed;
  });
  if (offered != kept.datagrams || whole.missing() + fitted != kept.datagrams)
    __builtin_trap();
  return 0;
}
