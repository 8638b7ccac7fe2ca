// libFuzzer: duckd's frame decoding: a frame header, then an error payload.
#include "duck_rt/wire.h"

#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  duckd_frame_header h;
  if (size < sizeof h)
    return 0;
  std::memcpy(&h, data, sizeof h);
  (void)duck::duckd::ValidateHeader(h, 1u << 20);
  (void)duck::duckd::MessageTypeName(h.type);
  auto e = duck::duckd::DecodeError(
      absl::MakeConstSpan(data + sizeof h, size - sizeof h));
  (void)e;
  return 0;
}
