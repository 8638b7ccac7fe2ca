// libFuzzer: config.json parsing, then what the importer derives from it.
#include "duck/Import/ModelConfig.h"

#include "llvm/Support/Error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto desc = mlir::duck::import::parseModelConfigText(
      llvm::StringRef(reinterpret_cast<const char *>(data), size), "fuzz");
  if (!desc) {
    llvm::consumeError(desc.takeError());
    return 0;
  }
  (void)mlir::duck::import::expectedTensors(*desc);
  (void)mlir::duck::import::countParams(*desc);
  return 0;
}
