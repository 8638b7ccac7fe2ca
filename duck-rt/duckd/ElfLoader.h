// duckd's loader for the duck ELF: validates an untrusted x86-64 ELF image
// (header, program headers, dynamic section, relocations, symbols) and maps
// it with anonymous memory, applying only R_X86_64_RELATIVE relocations.
// No dlopen, no libc resolution: the ELF must be self-contained.
#ifndef DUCK_RT_DUCKD_ELFLOADER_H
#define DUCK_RT_DUCKD_ELFLOADER_H

#include "duck_rt/abi.h"

#include "absl/status/statusor.h"
#include "absl/types/span.h"

#include <cstdint>
#include <memory>

namespace duck::duckd {

struct ElfLimits {
  uint64_t max_file_bytes = 64ull << 20;
  uint64_t max_image_bytes = 1ull << 30; // mapped span, .bss included
  uint32_t max_program_headers = 64;
  uint64_t max_relocations = 1u << 20;
  uint32_t max_symbols = 1u << 16;
};

/// A mapped, relocated ELF. Unmapped on destruction.
class LoadedElf {
public:
  /// Validates and maps `file`. Every refusal names what was wrong.
  static absl::StatusOr<std::unique_ptr<LoadedElf>>
  Load(absl::Span<const uint8_t> file, const ElfLimits &limits = {});

  ~LoadedElf();
  LoadedElf(const LoadedElf &) = delete;
  LoadedElf &operator=(const LoadedElf &) = delete;

  duck_entry_fn run() const { return run_; }
  duck_entry_fn step() const { return step_; }
  uint64_t mapped_bytes() const { return span_; }
  uint64_t relocations() const { return relocations_; }

private:
  LoadedElf() = default;
  uint8_t *base_ = nullptr;
  uint64_t span_ = 0;
  uint64_t relocations_ = 0;
  duck_entry_fn run_ = nullptr;
  duck_entry_fn step_ = nullptr;
};

/// Validates `file` as LoadedElf::Load would, without keeping the mapping.
absl::Status CheckElf(absl::Span<const uint8_t> file,
                      const ElfLimits &limits = {});

} // namespace duck::duckd

#endif // DUCK_RT_DUCKD_ELFLOADER_H
