//===- Safetensors.h - Validating reader for .safetensors files -*- C++ -*-===//
//
// Reads the header of one safetensors file, validates every entry against the
// file (see reference/FORMATS.md section 1) and gives tensor metadata plus a
// pointer into the memory-mapped data. Every failure is one llvm::Error that
// names the file, the tensor and what was expected versus found.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_IMPORT_SAFETENSORS_H
#define DUCK_IMPORT_SAFETENSORS_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace llvm::json {
class Value;
} // namespace llvm::json

namespace mlir::duck::import {

/// "null", "boolean", "number", "string", "array" or "object", for messages
/// that say which JSON type was found.
llvm::StringRef jsonKindName(const llvm::json::Value &value);

/// Element types a safetensors header may name. Append only: the numeric
/// values may end up in serialized plans.
enum class DType : uint8_t {
  BOOL,
  U8,
  I8,
  F8_E4M3,
  F8_E5M2,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  F64,
  I64,
  U64,
};

/// The header spelling of `dtype`, e.g. "BF16".
llvm::StringRef dtypeName(DType dtype);
/// Bytes per element of `dtype`.
unsigned dtypeSize(DType dtype);
/// Parses a header dtype string; std::nullopt if unknown.
std::optional<DType> parseDType(llvm::StringRef name);
/// Every supported dtype in enum order.
llvm::ArrayRef<DType> allDTypes();
/// "BOOL, U8, ..." for error messages.
std::string supportedDTypeList();

/// Formats a shape as "[2048, 1024]" (scalars as "[]").
std::string formatShape(llvm::ArrayRef<int64_t> shape);
/// Product of the dims (1 for a scalar). Callers pass validated shapes.
int64_t numElements(llvm::ArrayRef<int64_t> shape);

/// One tensor entry of a safetensors header, already validated.
struct TensorInfo {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  /// Offset of the first byte, relative to the start of the data section.
  uint64_t data_offset = 0;
  uint64_t byte_size = 0;

  int64_t numElements() const { return import::numElements(shape); }
};

/// Largest header the reader accepts (the reference reader's limit).
constexpr uint64_t kMaxSafetensorsHeaderSize = 100000000;

/// A validated, memory-mapped safetensors file.
class SafetensorsFile {
public:
  /// Maps `path` and validates its header. The error names the file.
  static llvm::Expected<std::unique_ptr<SafetensorsFile>>
  open(llvm::StringRef path);
  /// Validates an in-memory file; `buffer` stays owned by the result.
  /// `displayName` is the name used in messages.
  static llvm::Expected<std::unique_ptr<SafetensorsFile>>
  fromBuffer(std::unique_ptr<llvm::MemoryBuffer> buffer,
             llvm::StringRef displayName);

  llvm::StringRef path() const { return path_; }
  uint64_t fileSize() const;
  /// The JSON header length N (bytes [8, 8+N)).
  uint64_t headerSize() const { return header_size_; }
  /// Bytes after the header; tensor offsets are relative to its start.
  uint64_t dataSectionSize() const;

  /// Tensors sorted by data offset (then name), i.e. file order.
  llvm::ArrayRef<TensorInfo> tensors() const { return tensors_; }
  /// The tensor called `name`, or nullptr.
  const TensorInfo *lookup(llvm::StringRef name) const;
  bool contains(llvm::StringRef name) const { return lookup(name) != nullptr; }

  /// The bytes of `tensor`, which must belong to this file. No alignment is
  /// guaranteed beyond what the writer chose.
  llvm::ArrayRef<uint8_t> data(const TensorInfo &tensor) const;
  const uint8_t *dataPointer(const TensorInfo &tensor) const {
    return data(tensor).data();
  }

  /// The optional "__metadata__" map (string -> string).
  const std::map<std::string, std::string> &metadata() const {
    return metadata_;
  }
  /// Harmless oddities seen while validating (gaps between tensors, bytes
  /// after the last tensor). One human-readable sentence each.
  llvm::ArrayRef<std::string> notes() const { return notes_; }

private:
  SafetensorsFile() = default;
  llvm::Error parse();

  std::string path_;
  std::unique_ptr<llvm::MemoryBuffer> buffer_;
  uint64_t header_size_ = 0;
  std::vector<TensorInfo> tensors_;
  llvm::StringMap<size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::string> notes_;
};

} // namespace mlir::duck::import

#endif // DUCK_IMPORT_SAFETENSORS_H
