//===- SafetensorsWriter.h - Streaming .safetensors writer ------*- C++ -*-===//
//
// Writes one safetensors file without holding its tensors in memory: every
// tensor is declared first (name, dtype, shape), the layout is fixed, the
// header is written, then the data of each tensor is streamed in chunks, in
// layout order. The writer checks that each tensor gets exactly its byte
// count. Layout follows the reference writer (reference/FORMATS.md section 1):
// tensors sorted by descending dtype alignment, then name, contiguous from
// offset 0, header JSON padded with spaces so the data starts at a multiple
// of 8; every tensor is therefore aligned to its element size.
//
// Depends on LLVM Support only.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_IMPORT_SAFETENSORSWRITER_H
#define DUCK_IMPORT_SAFETENSORSWRITER_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace llvm {
class raw_ostream;
} // namespace llvm

namespace mlir::duck::import {

class SafetensorsWriter {
public:
  /// One declared tensor. `begin`/`end` (relative to the data section,
  /// end exclusive) are valid once the layout is finalized.
  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0;
    uint64_t end = 0;

    uint64_t byteSize() const { return end - begin; }
  };

  SafetensorsWriter();

  /// Bytes per element of a safetensors dtype string ("BF16" -> 2), or 0 if
  /// the writer does not know the dtype.
  static unsigned elementSize(llvm::StringRef dtype);

  /// Declares a tensor. Fails on a duplicate or reserved name, an unknown
  /// dtype, a negative dim or a size that overflows 64 bits.
  llvm::Error addTensor(llvm::StringRef name, llvm::StringRef dtype,
                        llvm::ArrayRef<int64_t> shape);
  /// Sets a "__metadata__" entry; {"format": "pt"} is there by default.
  void setMetadata(llvm::StringRef key, llvm::StringRef value);

  /// Fixes the data order and offsets and renders the header. No tensor may
  /// be added afterwards.
  llvm::Error finalizeLayout();

  /// Tensors in data order (declaration order before finalizeLayout).
  llvm::ArrayRef<Entry> entries() const { return entries_; }
  /// The declared tensor `name`, or nullptr.
  const Entry *lookup(llvm::StringRef name) const;
  /// The header JSON including its space padding (the N bytes after the
  /// 8-byte length).
  llvm::StringRef header() const { return header_; }
  /// Sum of all tensor byte sizes.
  uint64_t dataSize() const { return data_size_; }
  /// 8 + header + data.
  uint64_t fileSize() const { return 8 + header_.size() + data_size_; }

  /// Writes the 8-byte length and the header to `os`, which later data
  /// chunks go to as well.
  llvm::Error writeHeader(llvm::raw_ostream &os);
  /// Appends `bytes` to tensor `name`. Tensors must be written in entries()
  /// order; a tensor may take any number of chunks. Moving on to the next
  /// tensor while the current one is short, or writing more than a tensor's
  /// size, is an error naming the tensor.
  llvm::Error writeTensorData(llvm::StringRef name,
                              llvm::ArrayRef<uint8_t> bytes);
  /// Checks that every tensor got all of its bytes.
  llvm::Error finish();

private:
  enum class State { Declaring, Laid, Writing, Done };

  State state_ = State::Declaring;
  std::vector<Entry> entries_;
  llvm::StringMap<size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::string header_;
  uint64_t data_size_ = 0;
  llvm::raw_ostream *os_ = nullptr;
  size_t current_ = 0;
  uint64_t written_ = 0; ///< bytes of entries_[current_] written so far
};

} // namespace mlir::duck::import

#endif // DUCK_IMPORT_SAFETENSORSWRITER_H
