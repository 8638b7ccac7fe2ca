//===- Fp9Report.cpp - what fp9 conversion does to a checkpoint -----------===//
#include "duck/Import/Fp9Report.h"

#include "duck/Import/WeightSource.h"
#include "duck_rt/fp9_pack.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <cstring>

using namespace mlir::duck::import;
using llvm::Error;

namespace {

Error err(const llvm::Twine &m) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), m);
}

bool isFfnTensor(const ExpectedTensor &t) {
  return t.role == TensorRole::DenseFfn || t.role == TensorRole::RoutedExpert ||
         t.role == TensorRole::SharedExpert;
}

} // namespace

namespace {

/// Unpacks every row of a packed tensor and compares it with the source's
/// values: bit mismatches, the largest and the RMS relative error.
void compareWithSource(const duck_fp9_desc &d, const void *packed,
                       const duck_fp9_source &src, std::vector<float> &row,
                       Fp9TensorReport &tr) {
  row.resize(tr.cols);
  double sumErr = 0, sumRef = 0;
  for (int64_t r = 0; r < tr.rows; ++r) {
    duck_fp9_unpack_row(&d, packed, (uint32_t)r, row.data());
    for (int64_t c = 0; c < tr.cols; ++c) {
      float want = duck_fp9_source_value(&src, r, c);
      uint32_t a, b;
      std::memcpy(&a, &row[c], 4);
      std::memcpy(&b, &want, 4);
      if (a != b)
        ++tr.mismatches;
      double e = std::fabs((double)row[c] - want);
      tr.maxAbsError = std::max(tr.maxAbsError, e);
      sumErr += e * e;
      sumRef += (double)want * want;
    }
  }
  tr.rmsRelError = sumRef > 0 ? std::sqrt(sumErr / sumRef) : 0;
}

/// One FFN tensor converted to fp9 at `block` and measured against its
/// source; `buf` and `row` are scratch kept across tensors.
llvm::Expected<Fp9TensorReport> reportTensor(const Checkpoint &ckpt,
                                             const ExpectedTensor &t,
                                             uint32_t block,
                                             std::vector<uint64_t> &buf,
                                             std::vector<float> &row) {
  llvm::Expected<mlir::duck::WeightSource> ws =
      mlir::duck::openWeightSource(ckpt, t.name);
  if (!ws)
    return ws.takeError();
  const duck_fp9_source &src = ws->src;
  const TensorInfo &info = *ckpt.find(t.name).info;
  Fp9TensorReport tr;
  tr.name = t.name;
  tr.dtype = dtypeName(info.dtype).str();
  tr.rows = info.shape[0];
  tr.cols = info.shape[1];
  tr.sourceBytes = info.byte_size;
  tr.fp8 = src.type == DUCK_FP9_SRC_E4M3;
  // An fp9 block takes its FP8 tile's scale: it must lie inside one.
  if (tr.fp8 && src.tile_cols % block != 0)
    return err(llvm::formatv(
        "tensor '{0}': --block {1} does not divide its FP8 scale tiles' {2} "
        "columns (quantization_config.weight_block_size; use --block {3})",
        t.name, block, src.tile_cols, src.tile_cols % 64 == 0 ? 64 : 32));
  const uint32_t scaleRows = tr.fp8 ? src.tile_rows : 128;
  duck_fp9_desc d{(uint32_t)tr.rows, (uint32_t)tr.cols, block, scaleRows, 0};
  duck_fp9_layout lay;
  if (duck_fp9_compute_layout(&d, &lay) != DUCK_FP9_OK)
    return err(llvm::formatv("tensor '{0}' [{1}, {2}]: K = {2} is not a "
                             "multiple of block {3}",
                             t.name, tr.rows, tr.cols, block));
  buf.assign(lay.total_bytes / 8 + 8, 0);
  void *out = reinterpret_cast<void *>(
      (reinterpret_cast<uintptr_t>(buf.data()) + 63) / 64 * 64);
  duck_fp9_error_at at{};
  duck_fp9_status st = duck_fp9_pack(&src, &d, out, &at);
  if (st != DUCK_FP9_OK)
    return err(llvm::formatv("tensor '{0}': {1} at row {2}, column {3}",
                             t.name, duck_fp9_status_str(st), at.row, at.col));
  tr.fp9Bytes = lay.total_bytes;
  compareWithSource(d, out, src, row, tr);
  return tr;
}

} // namespace

llvm::Expected<Fp9Report>
mlir::duck::import::buildFp9Report(const Checkpoint &ckpt, uint32_t block,
                                   size_t maxTensors) {
  if (!ckpt.hasWeights())
    return err("'" + ckpt.directory() +
               "' has no safetensors weights to convert");
  if (block != 32 && block != 64 && block != 128)
    return err("--block must be 32, 64 or 128");
  Fp9Report rep;
  rep.block = block;
  std::vector<uint64_t> buf;
  std::vector<float> row;
  for (const ExpectedTensor &t : expectedTensors(ckpt.model())) {
    if (!isFfnTensor(t))
      continue;
    if (maxTensors && rep.tensors.size() >= maxTensors)
      break;
    llvm::Expected<Fp9TensorReport> tr = reportTensor(ckpt, t, block, buf, row);
    if (!tr)
      return tr.takeError();
    rep.params += (uint64_t)tr->rows * tr->cols;
    rep.sourceBytes += tr->sourceBytes;
    rep.fp9Bytes += tr->fp9Bytes;
    if (tr->fp8) {
      ++rep.fp8Tensors;
      if (tr->mismatches == 0)
        ++rep.fp8Exact;
    } else {
      rep.worstRmsRelError = std::max(rep.worstRmsRelError, tr->rmsRelError);
    }
    rep.tensors.push_back(std::move(*tr));
  }
  return rep;
}

void mlir::duck::import::printFp9Report(const Fp9Report &r, bool verbose,
                                        llvm::raw_ostream &os) {
  os << "fp9 conversion report (block " << r.block << ")\n";
  if (verbose) {
    os << llvm::format("%-56s %-8s %12s %10s %12s %10s\n", (const char *)"tensor",
                       (const char *)"dtype", (const char *)"shape",
                       (const char *)"fp9 bytes", (const char *)"max |err|",
                       (const char *)"rms rel");
    for (const Fp9TensorReport &t : r.tensors) {
      std::string shape = llvm::formatv("{0}x{1}", t.rows, t.cols).str();
      os << llvm::format("%-56s %-8s %12s %10llu %12.3e %10.5f%s\n",
                         t.name.c_str(), t.dtype.c_str(), shape.c_str(),
                         (unsigned long long)t.fp9Bytes, t.maxAbsError,
                         t.rmsRelError,
                         t.fp8 ? (t.mismatches ? "  NOT EXACT" : "  exact")
                               : "");
    }
  }
  os << "ffn tensors: " << r.tensors.size() << "\n";
  os << "ffn params: " << r.params << "\n";
  os << "source bytes: " << r.sourceBytes << "\n";
  os << "fp9 bytes: " << r.fp9Bytes
     << llvm::format(" (%.4f bytes/param)\n",
                     r.params ? double(r.fp9Bytes) / r.params : 0.0);
  os << "fp8 tensors exact: " << r.fp8Exact << " of " << r.fp8Tensors << "\n";
  os << llvm::format("worst rms relative error (quantised tensors): %.5f\n",
                     r.worstRmsRelError);
}

llvm::json::Value mlir::duck::import::fp9ReportToJson(const Fp9Report &r) {
  llvm::json::Array ts;
  for (const Fp9TensorReport &t : r.tensors)
    ts.push_back(llvm::json::Object{{"name", t.name},
                                    {"dtype", t.dtype},
                                    {"shape", llvm::json::Array{t.rows, t.cols}},
                                    {"source_bytes", (int64_t)t.sourceBytes},
                                    {"fp9_bytes", (int64_t)t.fp9Bytes},
                                    {"max_abs_error", t.maxAbsError},
                                    {"rms_rel_error", t.rmsRelError},
                                    {"mismatches", (int64_t)t.mismatches},
                                    {"fp8", t.fp8}});
  return llvm::json::Object{{"block", (int64_t)r.block},
                            {"ffn_tensors", (int64_t)r.tensors.size()},
                            {"params", (int64_t)r.params},
                            {"source_bytes", (int64_t)r.sourceBytes},
                            {"fp9_bytes", (int64_t)r.fp9Bytes},
                            {"fp8_tensors", (int64_t)r.fp8Tensors},
                            {"fp8_exact", (int64_t)r.fp8Exact},
                            {"worst_rms_rel_error", r.worstRmsRelError},
                            {"tensors", std::move(ts)}};
}
