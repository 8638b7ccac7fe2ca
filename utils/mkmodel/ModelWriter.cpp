//===- ModelWriter.cpp - Writes a HF model directory ----------------------===//

#include "ModelWriter.h"

#include "ConfigJson.h"
#include "Quantize.h"
#include "Sampler.h"
#include "TensorPlan.h"
#include "TokenizerJson.h"

#include "duck/Import/SafetensorsWriter.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Endian.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/Signals.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

using llvm::Error;
using llvm::StringRef;
using mlir::duck::import::SafetensorsWriter;

namespace duck::mkmodel {

static Error makeError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

namespace {

/// "bytes done / total, MB/s" on one line, refreshed in place on a
/// terminal. Silent for writes shorter than half a second unless forced.
class Progress {
public:
  Progress(llvm::raw_ostream &os, bool enabled, bool forced, bool tty,
           uint64_t total)
      : os_(os), enabled_(enabled), forced_(forced), tty_(tty), total_(total),
        start_(Clock::now()), last_(start_) {}

  void advance(uint64_t bytes) {
    done_ += bytes;
    if (!enabled_)
      return;
    auto now = Clock::now();
    double since_start = seconds(now - start_);
    double since_last = seconds(now - last_);
    if ((since_start >= 0.5 || forced_) && since_last >= (tty_ ? 0.25 : 1.0)) {
      print(now);
      last_ = now;
    }
  }

  void finish() {
    if (!enabled_ || !(printed_ || forced_))
      return;
    print(Clock::now());
    if (tty_)
      os_ << "\n";
    os_.flush();
  }

private:
  using Clock = std::chrono::steady_clock;
  static double seconds(Clock::duration d) {
    return std::chrono::duration<double>(d).count();
  }

  void print(Clock::time_point now) {
    double elapsed = seconds(now - start_);
    double mb = static_cast<double>(done_) / 1e6;
    double rate = elapsed > 0 ? mb / elapsed : 0.0;
    double percent = total_ ? 100.0 * static_cast<double>(done_) /
                                  static_cast<double>(total_)
                            : 100.0;
    os_ << (tty_ ? "\r" : "")
        << llvm::formatv("duck-mkmodel: {0:f1} / {1:f1} MB ({2:f0}%), "
                         "{3:f1} MB/s",
                         mb, static_cast<double>(total_) / 1e6, percent, rate);
    // On a terminal, spaces wipe what a longer previous line left behind.
    os_ << (tty_ ? "   " : "\n");
    os_.flush();
    printed_ = true;
  }

  llvm::raw_ostream &os_;
  bool enabled_, forced_, tty_;
  uint64_t total_;
  uint64_t done_ = 0;
  bool printed_ = false;
  Clock::time_point start_, last_;
};

/// Removes the temporary directory unless the write was committed.
class TempDirGuard {
public:
  explicit TempDirGuard(std::string path) : path_(std::move(path)) {}
  ~TempDirGuard() {
    if (!committed_)
      llvm::sys::fs::remove_directories(path_, /*IgnoreErrors=*/true);
  }
  void commit() { committed_ = true; }

private:
  std::string path_;
  bool committed_ = false;
};

/// Files an interrupt deletes until the write is over, so that a stopped
/// run does not leave gigabytes behind (LLVM removes regular files only;
/// the empty temporary directory stays).
/// Set by Ctrl-C / SIGTERM while a model is written (LLVM's handler calls
/// the interrupt function once, after removing the registered files, and
/// restores the defaults: a second signal kills). The writer stops at its
/// next chunk, so the temporary directory goes too.
std::atomic<bool> gInterrupted{false};

class SignalCleanup {
public:
  SignalCleanup() {
    gInterrupted.store(false);
    llvm::sys::SetInterruptFunction([] { gInterrupted.store(true); });
  }
  ~SignalCleanup() {
    llvm::sys::SetInterruptFunction(nullptr);
    for (const std::string &path : paths_)
      llvm::sys::DontRemoveFileOnSignal(path);
  }
  void add(std::string path) {
    llvm::sys::RemoveFileOnSignal(path);
    paths_.push_back(std::move(path));
  }

private:
  std::vector<std::string> paths_;
};

/// Floats per generated chunk of a bf16/f32 tensor (4 MiB).
constexpr int64_t kChunkElements = 1 << 20;

void appendF32(std::vector<uint8_t> &out, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  uint8_t le[4];
  llvm::support::endian::write32le(le, bits);
  out.insert(out.end(), le, le + 4);
}

/// Generates tensor `index` of `plan` and streams it into `writer`.
Error streamTensor(uint64_t seed, llvm::ArrayRef<PlannedTensor> plan,
                   size_t index, SafetensorsWriter &writer,
                   Progress &progress) {
  const PlannedTensor &t = plan[index];
  std::vector<uint8_t> bytes;
  auto emit = [&]() -> Error {
    if (gInterrupted.load(std::memory_order_relaxed))
      return makeError("interrupted: nothing was written");
    if (Error e = writer.writeTensorData(t.name, bytes))
      return e;
    progress.advance(bytes.size());
    bytes.clear();
    return Error::success();
  };

  if (t.init == InitKind::BlockScale || t.dtype == "F8_E4M3") {
    // Both the codes and the scales come from the same 128-row bands of the
    // float weight; the scale tensor is written first (F32 sorts first), so
    // the band is simply generated twice.
    const PlannedTensor &weight =
        t.init == InitKind::BlockScale ? plan[t.partner] : t;
    TensorSampler sampler(seed, weight);
    int64_t rows = sampler.rows(), cols = sampler.cols();
    int64_t tiles = (cols + kFp8Tile - 1) / kFp8Tile;
    std::vector<float> band(std::min(rows, kFp8Tile) * cols);
    std::vector<float> scales(tiles);
    for (int64_t r0 = 0; r0 < rows; r0 += kFp8Tile) {
      int64_t n = std::min(kFp8Tile, rows - r0);
      sampler.fillRows(r0, n, band.data());
      computeBandScales(band.data(), n, cols, scales.data());
      if (t.init == InitKind::BlockScale) {
        for (float s : scales)
          appendF32(bytes, s);
      } else {
        bytes.resize(n * cols);
        for (int64_t r = 0; r < n; ++r)
          quantizeRowE4M3(&band[r * cols], cols, scales.data(),
                          &bytes[r * cols]);
      }
      if (Error e = emit())
        return e;
    }
    return Error::success();
  }

  TensorSampler sampler(seed, t);
  int64_t rows = sampler.rows(), cols = sampler.cols();
  int64_t chunk_rows = std::max<int64_t>(1, kChunkElements / cols);
  std::vector<float> values(std::min(rows, chunk_rows) * cols);
  bool f32 = t.dtype == "F32";
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    int64_t n = std::min(chunk_rows, rows - r0);
    sampler.fillRows(r0, n, values.data());
    if (f32) {
      for (int64_t i = 0; i < n * cols; ++i)
        appendF32(bytes, values[i]);
    } else {
      bytes.resize(2 * n * cols);
      floatsToBF16LE(values.data(), n * cols, bytes.data());
    }
    if (Error e = emit())
      return e;
  }
  return Error::success();
}

Error writeTextFile(StringRef path, StringRef text, Progress &progress) {
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec, llvm::sys::fs::OF_None);
  if (ec)
    return makeError("cannot create '" + path + "': " + ec.message());
  os << text;
  os.close();
  if (os.has_error()) {
    std::error_code write_ec = os.error();
    os.clear_error();
    return makeError("cannot write '" + path + "': " + write_ec.message());
  }
  progress.advance(text.size());
  return Error::success();
}

Error writeShard(uint64_t seed, llvm::ArrayRef<PlannedTensor> plan,
                 const llvm::StringMap<size_t> &plan_index,
                 SafetensorsWriter &writer, StringRef path,
                 Progress &progress) {
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec, llvm::sys::fs::OF_None);
  if (ec)
    return makeError("cannot create '" + path + "': " + ec.message());
  os.SetBufferSize(1 << 20);
  Error result = [&]() -> Error {
    if (Error e = writer.writeHeader(os))
      return e;
    progress.advance(8 + writer.header().size());
    for (const SafetensorsWriter::Entry &entry : writer.entries())
      if (Error e = streamTensor(seed, plan, plan_index.lookup(entry.name),
                                 writer, progress))
        return e;
    return writer.finish();
  }();
  os.close();
  if (os.has_error()) {
    std::error_code write_ec = os.error();
    os.clear_error();
    llvm::consumeError(std::move(result));
    return makeError("cannot write '" + path + "': " + write_ec.message());
  }
  return result;
}

std::string formatBytes(uint64_t bytes) {
  return llvm::formatv("{0:f1} MB", static_cast<double>(bytes) / 1e6).str();
}

} // namespace

llvm::Expected<WriteSummary> writeModelDirectory(const ModelSpec &spec,
                                                 const WriteOptions &options,
                                                 llvm::raw_ostream &progress_os,
                                                 bool progress_is_tty) {
  namespace fs = llvm::sys::fs;
  if (Error e = validateSpec(spec))
    return e;

  // Lay out every file before touching the disk.
  std::vector<PlannedTensor> plan = planTensors(spec);
  llvm::StringMap<size_t> plan_index;
  std::vector<size_t> unit_of(plan.size());
  std::vector<uint64_t> unit_bytes;
  for (size_t i = 0; i < plan.size(); ++i) {
    plan_index[plan[i].name] = i;
    // A scale travels with its weight, which precedes it in the plan.
    if (plan[i].init == InitKind::BlockScale) {
      unit_of[i] = unit_of[plan[i].partner];
    } else {
      unit_of[i] = unit_bytes.size();
      unit_bytes.push_back(0);
    }
    unit_bytes[unit_of[i]] += plan[i].byteSize();
  }
  unsigned shards = options.shards;
  if (shards < 1 || shards > unit_bytes.size())
    return makeError(llvm::formatv(
        "--shards ({0}) must be in [1, {1}] (this model has {1} weights)",
        shards, unit_bytes.size()));
  std::vector<unsigned> shard_of_unit = assignShards(unit_bytes, shards);
  std::vector<SafetensorsWriter> writers(shards);
  std::vector<std::pair<std::string, std::string>> weight_map;
  for (size_t i = 0; i < plan.size(); ++i) {
    unsigned shard = shard_of_unit[unit_of[i]];
    if (Error e = writers[shard].addTensor(plan[i].name, plan[i].dtype,
                                           plan[i].shape))
      return e;
    weight_map.emplace_back(plan[i].name, shardFileName(shard + 1, shards));
  }
  uint64_t data_total = 0, total = 0;
  for (SafetensorsWriter &writer : writers) {
    if (Error e = writer.finalizeLayout())
      return e;
    data_total += writer.dataSize();
    total += writer.fileSize();
  }
  std::vector<std::pair<std::string, std::string>> texts = {
      {"config.json", renderConfigJson(spec)},
      {"generation_config.json", renderGenerationConfig(spec)},
      {"tokenizer.json", renderTokenizerJson(spec.vocab)},
      {"tokenizer_config.json", renderTokenizerConfig(spec)},
  };
  if (shards > 1)
    texts.emplace_back("model.safetensors.index.json",
                       renderIndexJson(data_total, weight_map));
  for (const auto &text : texts)
    total += text.second.size();

  // The output directory: refuse to clobber, make the parent, check space.
  llvm::SmallString<256> out(options.out_dir);
  while (out.size() > 1 && llvm::sys::path::is_separator(out.back()))
    out.pop_back();
  if (out.empty())
    return makeError("-o needs a directory name");
  bool replace = false;
  if (fs::exists(out)) {
    if (!fs::is_directory(out))
      return makeError("output '" + out + "' exists and is not a directory");
    if (!options.force)
      return makeError("output directory '" + out +
                       "' already exists (use --force to replace it)");
    replace = true;
  }
  StringRef parent = llvm::sys::path::parent_path(out);
  if (!parent.empty()) {
    if (std::error_code ec = fs::create_directories(parent))
      return makeError("cannot create directory '" + parent +
                       "': " + ec.message());
    if (!fs::is_directory(parent))
      return makeError("cannot create directory '" + parent +
                       "': it exists and is not a directory");
  }
  if (llvm::ErrorOr<fs::space_info> space =
          fs::disk_space(parent.empty() ? StringRef(".") : parent)) {
    if (space->available < total)
      return makeError("not enough disk space for '" + out + "': need " +
                       formatBytes(total) + ", " +
                       formatBytes(space->available) + " available");
  }

  std::string pid = std::to_string(llvm::sys::Process::getProcessId());
  std::string tmp = (out + ".tmp-" + pid).str();
  fs::remove_directories(tmp, /*IgnoreErrors=*/true);
  if (std::error_code ec = fs::create_directory(tmp))
    return makeError("cannot create '" + tmp + "': " + ec.message());
  TempDirGuard guard(tmp);

  bool show = !options.quiet && (options.progress || progress_is_tty);
  Progress progress(progress_os, show, options.progress, progress_is_tty,
                    total);
  WriteSummary summary;
  SignalCleanup cleanup;
  auto fileIn = [](StringRef dir, StringRef name) {
    llvm::SmallString<256> path(dir);
    llvm::sys::path::append(path, name);
    return std::string(path);
  };
  for (const auto &[name, text] : texts) {
    std::string path = fileIn(tmp, name);
    cleanup.add(path);
    if (Error e = writeTextFile(path, text, progress))
      return e;
    summary.files.push_back(name);
  }
  for (unsigned shard = 0; shard < shards; ++shard) {
    std::string name = shardFileName(shard + 1, shards);
    std::string path = fileIn(tmp, name);
    cleanup.add(path);
    if (Error e = writeShard(spec.seed, plan, plan_index, writers[shard], path,
                             progress))
      return e;
    summary.files.push_back(name);
  }
  progress.finish();

  // A signal handler may have deleted files while the write went on (e.g.
  // SIGINT to a background job whose default action is "ignore"): check
  // every file before publishing the directory.
  for (size_t i = 0; i < summary.files.size(); ++i) {
    uint64_t expected = i < texts.size() ? texts[i].second.size()
                                         : writers[i - texts.size()].fileSize();
    uint64_t size = 0;
    if (fs::file_size(fileIn(tmp, summary.files[i]), size) || size != expected)
      return makeError("'" + summary.files[i] +
                       "' vanished or changed size while being written");
  }

  // Commit: move any old directory aside, move the new one in, drop the old.
  if (replace) {
    std::string old = (out + ".old-" + pid).str();
    fs::remove_directories(old, /*IgnoreErrors=*/true);
    if (std::error_code ec = fs::rename(out, old))
      return makeError("cannot move '" + out + "' aside: " + ec.message());
    if (std::error_code ec = fs::rename(tmp, out)) {
      (void)fs::rename(old, out);
      return makeError("cannot rename '" + tmp + "' to '" + out +
                       "': " + ec.message());
    }
    fs::remove_directories(old, /*IgnoreErrors=*/true);
  } else if (std::error_code ec = fs::rename(tmp, out)) {
    return makeError("cannot rename '" + tmp + "' to '" + out +
                     "': " + ec.message());
  }
  guard.commit();

  summary.out_dir = std::string(out);
  summary.params = countParams(plan);
  summary.tensors = plan.size();
  summary.bytes = total;
  std::sort(summary.files.begin(), summary.files.end());
  return summary;
}

} // namespace duck::mkmodel
