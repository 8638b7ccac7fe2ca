//===- Safetensors.cpp - Validating reader for .safetensors files ---------===//
//
// Layout (reference/FORMATS.md 1): u64 LE header length N, N bytes of JSON,
// then the data section that every data_offsets pair is relative to.
//
//===----------------------------------------------------------------------===//

#include "duck/Import/Safetensors.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Endian.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <algorithm>

using namespace llvm;

namespace mlir::duck::import {

//===----------------------------------------------------------------------===//
// DType helpers
//===----------------------------------------------------------------------===//

namespace {
struct DTypeEntry {
  DType dtype;
  const char *name;
  unsigned size;
};
// Sizes per FORMATS.md: 1 byte for BOOL/U8/I8/F8_*, 2 for 16-bit, 4, 8.
constexpr DTypeEntry kDTypes[] = {
    {DType::BOOL, "BOOL", 1},       {DType::U8, "U8", 1},
    {DType::I8, "I8", 1},           {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::F8_E5M2, "F8_E5M2", 1}, {DType::I16, "I16", 2},
    {DType::U16, "U16", 2},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},       {DType::I32, "I32", 4},
    {DType::U32, "U32", 4},         {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},         {DType::I64, "I64", 8},
    {DType::U64, "U64", 8},
};
constexpr DType kAllDTypes[] = {
    DType::BOOL, DType::U8,  DType::I8,  DType::F8_E4M3, DType::F8_E5M2,
    DType::I16,  DType::U16, DType::F16, DType::BF16,    DType::I32,
    DType::U32,  DType::F32, DType::F64, DType::I64,     DType::U64,
};
static_assert(std::size(kDTypes) == std::size(kAllDTypes),
              "every DType needs a table entry");

const DTypeEntry &entryFor(DType dtype) {
  for (const DTypeEntry &e : kDTypes)
    if (e.dtype == dtype)
      return e;
  llvm_unreachable("DType missing from kDTypes");
}
} // namespace

StringRef dtypeName(DType dtype) { return entryFor(dtype).name; }
unsigned dtypeSize(DType dtype) { return entryFor(dtype).size; }

std::optional<DType> parseDType(StringRef name) {
  for (const DTypeEntry &e : kDTypes)
    if (name == e.name)
      return e.dtype;
  return std::nullopt;
}

ArrayRef<DType> allDTypes() { return kAllDTypes; }

std::string supportedDTypeList() {
  std::string out;
  for (const DTypeEntry &e : kDTypes) {
    if (!out.empty())
      out += ", ";
    out += e.name;
  }
  return out;
}

std::string formatShape(ArrayRef<int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i)
      out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

int64_t numElements(ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

//===----------------------------------------------------------------------===//
// Header parsing
//===----------------------------------------------------------------------===//

namespace {

/// Collects the top-level keys of a JSON object text in the order written.
/// llvm::json::Object silently keeps one of two equal keys, so duplicate
/// tensor names have to be found on the text. Only called on text that
/// llvm::json::parse accepted, so the scan can be simple.
class TopLevelKeyScanner {
public:
  explicit TopLevelKeyScanner(StringRef text) : text_(text) {}

  std::vector<std::string> keys() {
    std::vector<std::string> out;
    skipSpace();
    if (!consume('{'))
      return out;
    while (pos_ < text_.size()) {
      skipSpace();
      if (peek() != '"')
        break; // '}' of an empty object
      size_t begin = pos_;
      skipString();
      out.push_back(decodeKey(text_.slice(begin, pos_)));
      skipSpace();
      consume(':');
      skipSpace();
      skipValue();
      skipSpace();
      if (!consume(','))
        break;
    }
    return out;
  }

private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool consume(char c) {
    if (peek() != c)
      return false;
    ++pos_;
    return true;
  }
  void skipSpace() {
    while (pos_ < text_.size() && isSpace(text_[pos_]))
      ++pos_;
  }
  void skipString() {
    ++pos_; // opening quote
    while (pos_ < text_.size() && text_[pos_] != '"')
      pos_ += text_[pos_] == '\\' ? 2 : 1;
    ++pos_; // closing quote
  }
  void skipValue() {
    char c = peek();
    if (c == '"') {
      skipString();
      return;
    }
    if (c == '{' || c == '[') {
      int depth = 0;
      while (pos_ < text_.size()) {
        char d = text_[pos_];
        if (d == '"') {
          skipString();
          continue;
        }
        ++pos_;
        if (d == '{' || d == '[')
          ++depth;
        else if ((d == '}' || d == ']') && --depth == 0)
          return;
      }
      return;
    }
    while (pos_ < text_.size() && !isSpace(text_[pos_]) &&
           !StringRef(",}]").contains(text_[pos_]))
      ++pos_;
  }
  static std::string decodeKey(StringRef quoted) {
    StringRef inner = quoted.drop_front().drop_back();
    if (!inner.contains('\\'))
      return inner.str();
    Expected<json::Value> v = json::parse(quoted);
    if (!v) {
      consumeError(v.takeError());
      return inner.str();
    }
    return v->getAsString() ? v->getAsString()->str() : inner.str();
  }

  StringRef text_;
  size_t pos_ = 0;
};

/// Short rendering of a JSON value for "found ..." in messages.
std::string renderJson(const json::Value &v) {
  std::string s = formatv("{0}", v).str();
  if (s.size() > 48)
    s = s.substr(0, 45) + "...";
  return s;
}

} // namespace

StringRef jsonKindName(const json::Value &v) {
  switch (v.kind()) {
  case json::Value::Null:
    return "null";
  case json::Value::Boolean:
    return "boolean";
  case json::Value::Number:
    return "number";
  case json::Value::String:
    return "string";
  case json::Value::Array:
    return "array";
  case json::Value::Object:
    return "object";
  }
  llvm_unreachable("unknown json kind");
}

Expected<std::unique_ptr<SafetensorsFile>>
SafetensorsFile::open(StringRef path) {
  ErrorOr<std::unique_ptr<MemoryBuffer>> buf =
      MemoryBuffer::getFile(path, /*IsText=*/false,
                            /*RequiresNullTerminator=*/false,
                            /*IsVolatile=*/false);
  if (!buf)
    return createStringError(buf.getError(), "%s: cannot open: %s",
                             path.str().c_str(),
                             buf.getError().message().c_str());
  return fromBuffer(std::move(*buf), path);
}

Expected<std::unique_ptr<SafetensorsFile>>
SafetensorsFile::fromBuffer(std::unique_ptr<MemoryBuffer> buffer,
                            StringRef displayName) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = displayName.str();
  file->buffer_ = std::move(buffer);
  if (Error err = file->parse())
    return err;
  return file;
}

uint64_t SafetensorsFile::fileSize() const { return buffer_->getBufferSize(); }

uint64_t SafetensorsFile::dataSectionSize() const {
  return fileSize() - 8 - header_size_;
}

const TensorInfo *SafetensorsFile::lookup(StringRef name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

ArrayRef<uint8_t> SafetensorsFile::data(const TensorInfo &tensor) const {
  const auto *base =
      reinterpret_cast<const uint8_t *>(buffer_->getBufferStart());
  return ArrayRef<uint8_t>(base + 8 + header_size_ + tensor.data_offset,
                           tensor.byte_size);
}

namespace {
/// An error about the file at `path`.
Error fileError(StringRef path, const Twine &msg) {
  return createStringError(inconvertibleErrorCode(),
                           path + ": " + msg.str());
}

/// An error about the header entry of tensor `key`.
Error tensorError(StringRef path, StringRef key, const Twine &msg) {
  return fileError(path, "tensor '" + key + "': " + msg);
}

/// The "__metadata__" entry: an object of strings, into `metadata`.
Error readMetadata(StringRef path, const json::Value &value,
                   std::map<std::string, std::string> &metadata) {
  const json::Object *meta = value.getAsObject();
  if (!meta)
    return fileError(path,
                     "'__metadata__' must be an object of strings, found " +
                         jsonKindName(value));
  for (const auto &kv : *meta) {
    std::optional<StringRef> s = kv.second.getAsString();
    if (!s)
      return fileError(path, "'__metadata__' entry '" + kv.first.str() +
                                 "' must be a string, found " +
                                 jsonKindName(kv.second));
    metadata[kv.first.str()] = s->str();
  }
  return Error::success();
}

/// A tensor entry's "dtype": a string naming a supported dtype.
Expected<DType> entryDType(StringRef path, StringRef key,
                           const json::Object &entry) {
  const json::Value *dtypeV = entry.get("dtype");
  if (!dtypeV)
    return tensorError(path, key, "missing field 'dtype'");
  std::optional<StringRef> dtypeS = dtypeV->getAsString();
  if (!dtypeS)
    return tensorError(path, key,
                       "field 'dtype' must be a string, found " +
                           jsonKindName(*dtypeV));
  std::optional<DType> dtype = parseDType(*dtypeS);
  if (!dtype)
    return tensorError(path, key,
                       "unknown dtype '" + *dtypeS + "' (expected one of " +
                           supportedDTypeList() + ")");
  return *dtype;
}

/// A tensor entry's "shape": an array of non-negative integers, into
/// `shape`.
Error entryShape(StringRef path, StringRef key, const json::Object &entry,
                 std::vector<int64_t> &shape) {
  const json::Value *shapeV = entry.get("shape");
  if (!shapeV)
    return tensorError(path, key, "missing field 'shape'");
  const json::Array *shapeA = shapeV->getAsArray();
  if (!shapeA)
    return tensorError(path, key,
                       "field 'shape' must be an array of integers, found " +
                           jsonKindName(*shapeV));
  for (size_t i = 0; i < shapeA->size(); ++i) {
    const json::Value &d = (*shapeA)[i];
    std::optional<int64_t> dim = d.getAsInteger();
    if (!dim || *dim < 0)
      return tensorError(path, key,
                         "shape[" + Twine(i) +
                             "] must be a non-negative integer, found " +
                             renderJson(d));
    shape.push_back(*dim);
  }
  return Error::success();
}

/// A tensor entry's "data_offsets" [begin, end], into `info`'s offset and
/// byte size.
Error entryOffsets(StringRef path, StringRef key, const json::Object &entry,
                   TensorInfo &info) {
  const json::Value *offV = entry.get("data_offsets");
  if (!offV)
    return tensorError(path, key, "missing field 'data_offsets'");
  const json::Array *offA = offV->getAsArray();
  std::optional<uint64_t> begin, end;
  if (offA && offA->size() == 2) {
    begin = (*offA)[0].getAsUINT64();
    end = (*offA)[1].getAsUINT64();
  }
  if (!begin || !end)
    return tensorError(path, key,
                       "field 'data_offsets' must be an array of two "
                       "non-negative integers [begin, end], found " +
                           renderJson(*offV));
  if (*end < *begin)
    return tensorError(path, key,
                       "data_offsets end " + Twine(*end) + " is before begin " +
                           Twine(*begin));
  info.data_offset = *begin;
  info.byte_size = *end - *begin;
  return Error::success();
}

/// The entry's byte span matches its shape exactly (computed without
/// overflowing) and lies inside the data section.
Error checkEntrySize(StringRef path, StringRef key, const TensorInfo &info,
                     uint64_t dataSize) {
  const uint64_t begin = info.data_offset, end = begin + info.byte_size;
  uint64_t expected = dtypeSize(info.dtype);
  bool overflow = false;
  if (llvm::is_contained(info.shape, 0))
    expected = 0;
  for (int64_t d : info.shape) {
    if (expected == 0)
      break;
    auto dim = static_cast<uint64_t>(d);
    if (dim != 0 && expected > (uint64_t(INT64_MAX) / dim))
      overflow = true;
    else
      expected *= dim;
  }
  if (overflow)
    return tensorError(path, key,
                       "shape " + formatShape(info.shape) +
                           " is too large (byte size overflows)");
  if (expected != info.byte_size)
    return tensorError(
        path, key,
        "byte size mismatch: shape " + formatShape(info.shape) + " of " +
            dtypeName(info.dtype) + " needs " + Twine(expected) + " bytes (" +
            Twine(info.numElements()) + " x " + Twine(dtypeSize(info.dtype)) +
            ") but data_offsets [" + Twine(begin) + ", " + Twine(end) +
            "] span " + Twine(info.byte_size) + " bytes");
  if (end > dataSize)
    return tensorError(path, key,
                       "data_offsets [" + Twine(begin) + ", " + Twine(end) +
                           "] extend beyond the data section, which has " +
                           Twine(dataSize) + " bytes (truncated file?)");
  return Error::success();
}

/// One tensor's header entry: dtype, shape and data_offsets, checked
/// against each other and the data section's `dataSize` bytes.
Expected<TensorInfo> parseTensorEntry(StringRef path, const std::string &key,
                                      const json::Value &value,
                                      uint64_t dataSize) {
  const json::Object *entry = value.getAsObject();
  if (!entry)
    return tensorError(path, key,
                       "entry must be an object with dtype, shape and "
                       "data_offsets, found " +
                           jsonKindName(value));
  TensorInfo info;
  info.name = key;
  Expected<DType> dtype = entryDType(path, key, *entry);
  if (!dtype)
    return dtype.takeError();
  info.dtype = *dtype;
  if (Error e = entryShape(path, key, *entry, info.shape))
    return e;
  if (Error e = entryOffsets(path, key, *entry, info))
    return e;
  if (Error e = checkEntrySize(path, key, info, dataSize))
    return e;
  return info;
}

/// Sorts the tensors into file order (offset order; ties, empty tensors,
/// by name for stability). Overlaps are errors; gaps and trailing bytes
/// are tolerated with a note.
Error sortAndCheckSpans(StringRef path, std::vector<TensorInfo> &tensors,
                        uint64_t dataSize, std::vector<std::string> &notes) {
  llvm::sort(tensors, [](const TensorInfo &a, const TensorInfo &b) {
    if (a.data_offset != b.data_offset)
      return a.data_offset < b.data_offset;
    if (a.byte_size != b.byte_size)
      return a.byte_size < b.byte_size;
    return a.name < b.name;
  });
  uint64_t coveredEnd = 0;
  const TensorInfo *last = nullptr;
  for (const TensorInfo &t : tensors) {
    if (t.byte_size == 0)
      continue;
    if (last && t.data_offset < coveredEnd)
      return fileError(path, "tensors '" + last->name + "' (bytes [" +
                                 Twine(last->data_offset) + ", " +
                                 Twine(last->data_offset + last->byte_size) +
                                 ")) and '" + t.name + "' (bytes [" +
                                 Twine(t.data_offset) + ", " +
                                 Twine(t.data_offset + t.byte_size) +
                                 ")) overlap");
    if (t.data_offset > coveredEnd)
      notes.push_back(formatv("{0} unused bytes before tensor '{1}'",
                              t.data_offset - coveredEnd, t.name)
                          .str());
    coveredEnd = t.data_offset + t.byte_size;
    last = &t;
  }
  if (coveredEnd < dataSize)
    notes.push_back(
        formatv("{0} unused bytes after the last tensor", dataSize - coveredEnd)
            .str());
  return Error::success();
}
} // namespace

Error SafetensorsFile::parse() {
  auto fail = [&](const Twine &msg) -> Error { return fileError(path_, msg); };
  const uint64_t size = buffer_->getBufferSize();
  const char *bytes = buffer_->getBufferStart();

  if (size < 8)
    return fail("file is " + Twine(size) +
                " bytes, too small to hold the 8-byte header length "
                "(truncated or not a safetensors file)");
  header_size_ = support::endian::read64le(bytes);
  if (header_size_ > kMaxSafetensorsHeaderSize)
    return fail("header length " + Twine(header_size_) +
                " exceeds the maximum of " + Twine(kMaxSafetensorsHeaderSize) +
                " bytes (oversized or not a safetensors file)");
  if (header_size_ > size - 8)
    return fail("header length " + Twine(header_size_) +
                " exceeds the file size: only " + Twine(size - 8) +
                " bytes follow the 8-byte length (truncated file?)");

  StringRef headerText(bytes + 8, header_size_);
  Expected<json::Value> parsed = json::parse(headerText);
  if (!parsed)
    return fail("header is not valid JSON: " + toString(parsed.takeError()));
  const json::Object *root = parsed->getAsObject();
  if (!root)
    return fail("header is not a JSON object (found " + jsonKindName(*parsed) +
                ")");

  const uint64_t dataSize = size - 8 - header_size_;
  StringSet<> seen;
  for (const std::string &key : TopLevelKeyScanner(headerText).keys()) {
    if (!seen.insert(key).second)
      return fail("duplicate tensor name '" + key + "' in header");
    const json::Value *value = root->get(key);
    if (!value) // only if the key scan and the parser disagree
      return fail("cannot read the header entry '" + key + "'");
    if (key == "__metadata__") {
      if (Error e = readMetadata(path_, *value, metadata_))
        return e;
      continue;
    }
    Expected<TensorInfo> info = parseTensorEntry(path_, key, *value, dataSize);
    if (!info)
      return info.takeError();
    tensors_.push_back(std::move(*info));
  }
  if (Error e = sortAndCheckSpans(path_, tensors_, dataSize, notes_))
    return e;
  for (size_t i = 0; i < tensors_.size(); ++i)
    index_[tensors_[i].name] = i;
  return Error::success();
}

} // namespace mlir::duck::import
