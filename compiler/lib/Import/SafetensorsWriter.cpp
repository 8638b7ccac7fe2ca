//===- SafetensorsWriter.cpp - Streaming .safetensors writer --------------===//

#include "duck/Import/SafetensorsWriter.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/Endian.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>

using llvm::Error;
using llvm::StringRef;

namespace mlir::duck::import {

static Error makeError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

SafetensorsWriter::SafetensorsWriter() { metadata_["format"] = "pt"; }

unsigned SafetensorsWriter::elementSize(StringRef dtype) {
  return llvm::StringSwitch<unsigned>(dtype)
      .Cases("BOOL", "U8", "I8", 1)
      .Cases("F8_E4M3", "F8_E5M2", "F8_E8M0", 1)
      .Cases("I16", "U16", "F16", "BF16", 2)
      .Cases("I32", "U32", "F32", 4)
      .Cases("I64", "U64", "F64", "C64", 8)
      .Default(0);
}

Error SafetensorsWriter::addTensor(StringRef name, StringRef dtype,
                                   llvm::ArrayRef<int64_t> shape) {
  if (state_ != State::Declaring)
    return makeError("safetensors writer: tensor '" + name +
                     "' declared after the layout was finalized");
  if (name.empty() || name == "__metadata__")
    return makeError("safetensors writer: invalid tensor name '" + name + "'");
  if (!llvm::json::isUTF8(name))
    return makeError("safetensors writer: tensor name is not UTF-8");
  if (index_.count(name))
    return makeError("safetensors writer: duplicate tensor '" + name + "'");
  unsigned elem = elementSize(dtype);
  if (elem == 0)
    return makeError("safetensors writer: tensor '" + name +
                     "' has unknown dtype '" + dtype + "'");
  uint64_t bytes = elem;
  for (int64_t dim : shape) {
    if (dim < 0)
      return makeError(llvm::formatv(
          "safetensors writer: tensor '{0}' has negative dim {1}", name, dim));
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes))
      return makeError("safetensors writer: tensor '" + name +
                       "' is too large");
  }
  Entry entry;
  entry.name = name.str();
  entry.dtype = dtype.str();
  entry.shape.assign(shape.begin(), shape.end());
  entry.end = bytes; // a size until finalizeLayout turns it into offsets
  index_[name] = entries_.size();
  entries_.push_back(std::move(entry));
  return Error::success();
}

void SafetensorsWriter::setMetadata(StringRef key, StringRef value) {
  metadata_[key.str()] = value.str();
}

Error SafetensorsWriter::finalizeLayout() {
  if (state_ != State::Declaring)
    return makeError("safetensors writer: layout finalized twice");
  // Widest dtype first keeps every tensor aligned to its element size
  // without gaps (the reference reader rejects gaps).
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const Entry &a, const Entry &b) {
                     unsigned ea = elementSize(a.dtype);
                     unsigned eb = elementSize(b.dtype);
                     if (ea != eb)
                       return ea > eb;
                     return a.name < b.name;
                   });
  uint64_t offset = 0;
  llvm::json::Object root;
  llvm::json::Object meta;
  for (const auto &[key, value] : metadata_)
    meta[key] = value;
  root["__metadata__"] = std::move(meta);
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry &entry = entries_[i];
    uint64_t size = entry.end;
    entry.begin = offset;
    if (__builtin_add_overflow(offset, size, &entry.end))
      return makeError("safetensors writer: data larger than 2^64 bytes");
    offset = entry.end;
    index_[entry.name] = i;
    llvm::json::Array shape;
    for (int64_t dim : entry.shape)
      shape.push_back(dim);
    root[entry.name] = llvm::json::Object{
        {"dtype", entry.dtype},
        {"shape", std::move(shape)},
        {"data_offsets", llvm::json::Array{entry.begin, entry.end}},
    };
  }
  data_size_ = offset;
  header_.clear();
  llvm::raw_string_ostream os(header_);
  os << llvm::json::Value(std::move(root));
  os.flush();
  header_.append((8 - header_.size() % 8) % 8, ' ');
  state_ = State::Laid;
  return Error::success();
}

const SafetensorsWriter::Entry *
SafetensorsWriter::lookup(StringRef name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

Error SafetensorsWriter::writeHeader(llvm::raw_ostream &os) {
  if (state_ != State::Laid)
    return makeError(state_ == State::Declaring
                         ? "safetensors writer: header written before "
                           "finalizeLayout"
                         : "safetensors writer: header written twice");
  char length[8];
  llvm::support::endian::write64le(length, header_.size());
  os.write(length, sizeof length);
  os << header_;
  os_ = &os;
  current_ = 0;
  written_ = 0;
  state_ = State::Writing;
  return Error::success();
}

Error SafetensorsWriter::writeTensorData(StringRef name,
                                         llvm::ArrayRef<uint8_t> bytes) {
  if (state_ != State::Writing)
    return makeError("safetensors writer: data for '" + name +
                     "' written outside the data phase");
  // Step past complete tensors (empty ones need no call) up to `name`.
  while (current_ < entries_.size() && entries_[current_].name != name &&
         written_ == entries_[current_].byteSize()) {
    ++current_;
    written_ = 0;
  }
  if (current_ == entries_.size() || entries_[current_].name != name) {
    if (!lookup(name))
      return makeError("safetensors writer: unknown tensor '" + name + "'");
    if (current_ == entries_.size())
      return makeError("safetensors writer: tensor '" + name +
                       "' written out of order (all tensors are complete)");
    const Entry &cur = entries_[current_];
    if (written_ != 0)
      return makeError(llvm::formatv(
          "safetensors writer: tensor '{0}' is short: {1} of {2} bytes "
          "written before data for '{3}'",
          cur.name, written_, cur.byteSize(), name));
    return makeError("safetensors writer: tensor '" + name +
                     "' written out of order (expected '" + cur.name + "')");
  }
  const Entry &cur = entries_[current_];
  if (bytes.size() > cur.byteSize() - written_)
    return makeError(llvm::formatv(
        "safetensors writer: tensor '{0}' is long: {1} bytes written, "
        "{2} declared",
        cur.name, written_ + bytes.size(), cur.byteSize()));
  os_->write(reinterpret_cast<const char *>(bytes.data()), bytes.size());
  written_ += bytes.size();
  return Error::success();
}

Error SafetensorsWriter::finish() {
  if (state_ != State::Writing)
    return makeError("safetensors writer: finish outside the data phase");
  for (; current_ < entries_.size(); ++current_, written_ = 0) {
    const Entry &cur = entries_[current_];
    if (written_ != cur.byteSize())
      return makeError(llvm::formatv(
          "safetensors writer: tensor '{0}' is short: {1} of {2} bytes "
          "written",
          cur.name, written_, cur.byteSize()));
  }
  state_ = State::Done;
  return Error::success();
}

} // namespace mlir::duck::import
