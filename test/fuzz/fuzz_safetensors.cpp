// libFuzzer: the safetensors reader (header length, JSON header, offsets).
#include "duck/Import/Safetensors.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto buf = llvm::MemoryBuffer::getMemBufferCopy(
      llvm::StringRef(reinterpret_cast<const char *>(data), size), "fuzz");
  auto file = mlir::duck::import::SafetensorsFile::fromBuffer(std::move(buf),
                                                              "fuzz");
  if (!file)
    llvm::consumeError(file.takeError());
  return 0;
}
