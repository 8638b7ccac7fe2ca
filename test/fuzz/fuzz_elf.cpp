// libFuzzer: duckd's ELF loader (headers, segments, relocations, symbols).
#include "ElfLoader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  duck::duckd::ElfLimits limits;
  limits.max_image_bytes = 64u << 20;
  (void)duck::duckd::CheckElf(absl::MakeConstSpan(data, size), limits);
  return 0;
}
