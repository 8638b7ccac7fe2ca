//===- HostOp.h - one op of a plan's host program ----------------*- C++
//-*-===//
//
// Every op kind of the plan (a table of the schema's OpParams union) has one
// file in this directory with a Create function: it reads its own table,
// takes its weights and every buffer it will need once, and returns a
// HostOp whose Run executes one chunk of tokens without allocating, and
// the kind's descriptor (HostOpKind: its Create, the tensors the plan's
// load checks, its duck step, its time bucket). The Engine only walks the
// ops; adding an op is a schema table, a file here (and its line in
// CMakeLists.txt) and one line in DUCK_HOST_OPS below.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_OPS_HOSTOP_H
#define DUCK_RUNTIME_OPS_HOSTOP_H

#include "duck/runtime/engine/Engine.h"
#include "duck/runtime/engine/HostKernels.h"
#include "duck/runtime/plan/Plan.h"
#include "duck/runtime/StatusMacros.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <sys/mman.h>
#include <vector>

namespace duck::runtime::ops {
namespace pl = ::duck::plan;

/// A plan's host tensors as the kernels want them: BF16 and F32 used in
/// place, FP8 packed once to fp9 (exact) for the duck GEMV kernels, other
/// types converted to fp32. FP8 uses the block the plan declares.
class WeightReader {
public:
  /// `max_rows`: the rows of the largest step, for KernelScratchFloats.
  explicit WeightReader(const LoadedPlan &plan, uint32_t max_rows = 1)
      : plan_(plan), max_rows_(max_rows) {}
  absl::StatusOr<std::vector<float>> ReadAll(const pl::TensorDef &t) const;
  absl::StatusOr<HostMatrix> Matrix(const pl::TensorDef &t) const {
    return Noted(ReadMatrix(t));
  }
  /// A BF16/F16/F32 matrix quantised to fp9 (a scale per row and K-block,
  /// amax-based): 1.125 bytes a weight, lossy.
  absl::StatusOr<HostMatrix> QuantizedFp9(const pl::TensorDef &t) const {
    return Noted(ReadQuantizedFp9(t));
  }
  /// A matrix quantised to int8 (a scale per 32 weights of a row); any
  /// dtype ReadAll takes, one row at a time, rows split over `pool`.
  absl::StatusOr<HostMatrix> QuantizedInt8(const pl::TensorDef &t,
                                           ThreadPool &pool) const;
  /// An FP8 [heads * per_head, K] matrix's first `take` rows of every head,
  /// each head transposed: [heads * K, take] in fp9, exact (every element
  /// keeps its FP8 tile's scale). Needs K and per_head to be whole tiles
  /// and take at most a tile's rows (a multiple of 32); otherwise
  /// FailedPrecondition, and the caller keeps a float copy.
  absl::StatusOr<HostMatrix> HeadsTransposedFp9(const pl::TensorDef &t,
                                                uint32_t heads,
                                                uint32_t per_head,
                                                uint32_t take) const {
    return Noted(ReadHeadsTransposedFp9(t, heads, per_head, take));
  }
  /// The most kernel scratch (RowsProductScratchFloats) a thread takes for
  /// any matrix read so far, at up to max_rows rows.
  uint64_t KernelScratchFloats() const { return scratch_floats_; }

private:
  absl::StatusOr<HostMatrix> ReadMatrix(const pl::TensorDef &t) const;
  absl::StatusOr<HostMatrix> ReadQuantizedFp9(const pl::TensorDef &t) const;
  absl::StatusOr<HostMatrix> ReadHeadsTransposedFp9(const pl::TensorDef &t,
                                                    uint32_t heads,
                                                    uint32_t per_head,
                                                    uint32_t take) const;
  absl::StatusOr<HostMatrix> Noted(absl::StatusOr<HostMatrix> m) const {
    if (m.ok())
      scratch_floats_ =
          std::max(scratch_floats_, RowsProductScratchFloats(*m, max_rows_));
    return m;
  }
  const LoadedPlan &plan_;
  uint32_t max_rows_;
  mutable uint64_t scratch_floats_ = 0; // what the matrices read so far need
};

/// Activations: one buffer of max_rows x width floats for every plan
/// value (width: what the op writing it declares), allocated once when the
/// engine is built.
class ValueArena {
public:
  void Init(const std::vector<uint64_t> &widths, uint32_t max_rows) {
    offsets_.clear();
    widths_ = widths;
    uint64_t at = 0;
    for (uint64_t w : widths) {
      offsets_.push_back(at);
      at += w * max_rows;
    }
    data_.assign(at, 0.0f);
  }
  float *Get(uint32_t id) { return data_.data() + offsets_[id]; }
  uint64_t Width(uint32_t id) const { return widths_[id]; }

private:
  std::vector<uint64_t> offsets_, widths_;
  std::vector<float> data_;
};

/// What an op's Create gets: its plan entry and the engine's resources.
struct OpEnv {
  const LoadedPlan &plan;
  const pl::OpDef &def;
  const WeightReader &weights;
  FfnRunner *runner;
  ThreadPool *pool;
  uint32_t hidden;
  uint32_t max_rows; // rows in the largest step
  uint32_t max_seq;  // KV cache length of a sequence
  uint32_t max_seqs; // sequences with a KV cache each (batched decode)
  bool kv_f16 = false; // attention caches in IEEE half (--kv-cache f16)
  uint32_t populate_seqs = 1; // caches mapped in at load (PopulateFirstPages)

  /// An error that names the op (kind and layer).
  template <typename... Parts> absl::Status Error(const Parts &...parts) const {
    return absl::InvalidArgumentError(
        absl::StrCat("plan op ", pl::EnumNameOpParams(def.params_type()),
                     " (layer ", def.layer(), "): ", parts...));
  }
  /// A required tensor of the op's table.
  absl::StatusOr<const pl::TensorDef *> Need(const pl::TensorDef *t,
                                             const char *role) const {
    if (!t)
      return Error("no '", role, "' tensor");
    return t;
  }
  /// A required tensor as a kernel matrix, or as fp32 values.
  absl::Status Load(const pl::TensorDef *t, const char *role,
                    HostMatrix *out) const {
    return Store(t, role, out, [&] { return weights.Matrix(*t); });
  }
  absl::Status Load(const pl::TensorDef *t, const char *role,
                    std::vector<float> *out) const {
    return Store(t, role, out, [&] { return weights.ReadAll(*t); });
  }

private:
  template <typename T, typename Read>
  absl::Status Store(const pl::TensorDef *t, const char *role, T *out,
                     Read read) const {
    if (!t)
      return Error("no '", role, "' tensor");
    auto v = read();
    if (!v.ok())
      return v.status();
    *out = std::move(*v);
    return absl::OkStatus();
  }
};

/// Checks that head slot `slot` of the ducks tiles a matrix of `rows`
/// rows, `k` wide, in rank order (the LM head, an o_proj on the ducks);
/// `what` names it in the error.
absl::Status CheckRowSlots(const OpEnv &env, uint32_t slot, uint64_t rows,
                           uint64_t k, const char *what);

/// What Run gets: the rows of one step. Rows may belong to different
/// sequences (batched decode, a prompt chunk joining running streams); a
/// row's result depends only on its own token and its sequence's cache.
struct Step {
  absl::Span<const int32_t> tokens; // every row's token
  absl::Span<const uint32_t> pos;   // every row's position in its sequence
  absl::Span<const uint32_t> seq;   // every row's sequence (cache slot)
  absl::Span<const uint32_t> logit_rows; // rows the LM head projects
  bool prefill; // duck prefill modes (5/6) rather than decode
  ValueArena *values;
  std::vector<float> *logits; // logit_rows.size() rows are appended
  /// For an op that agreed to KeepLogitRowsOnly: every row's cache
  /// entries, but the result for the logit rows only, row j for
  /// logit_rows[j].
  bool logit_rows_only = false;
  uint32_t rows() const { return (uint32_t)tokens.size(); }
};

/// A per-sequence cache of `width` values (fp32, or IEEE half) a
/// position, for every sequence slot; reserved once at Create but not
/// written, so the memory a server with many slots uses grows with the
/// positions its sequences reach (a position is always written before it
/// is read).
template <typename T> class SeqCacheOf {
public:
  SeqCacheOf() = default;
  SeqCacheOf(const SeqCacheOf &) = delete;
  SeqCacheOf &operator=(const SeqCacheOf &) = delete;
  ~SeqCacheOf() {
    if (data_ && asked_)
      BackgroundPopulate::Get().Forget(data_, bytes_);
    if (data_)
      munmap(data_, bytes_);
  }
  /// Reserves max_seqs caches of `rows` rows of `width` values. Address
  /// space only (MAP_NORESERVE): pages are taken as positions are written,
  /// so a long --max-seq costs little until sequences grow (the session
  /// checks the worst case against the machine's memory up front). The
  /// pages are 2 MiB where the kernel has transparent huge pages (a
  /// head's 4096 positions of 128 fp32 values): a decoded token writes one
  /// row into every head of every layer, each in its own page, and with 4
  /// KiB pages each such write was a TLB miss (about 1 us on a VM: 0.4-0.5
  /// ms a Qwen3-0.6B-shape token; docs/perf.md). The price: memory grows
  /// 2 MiB of a head at a time.
  absl::Status Init(uint64_t width, uint64_t rows, uint32_t max_seqs) {
    width_ = width;
    rows_ = rows;
    const uint64_t values = width * rows * max_seqs;
    if (rows && values / rows / max_seqs != width)
      return absl::ResourceExhaustedError("KV cache size overflows");
    bytes_ = (std::max<uint64_t>(4096, values * sizeof(T)) + 4095) & ~4095ull;
    void *p = HugePageMap(bytes_, /*noreserve=*/true);
    if (!p) {
      data_ = nullptr;
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot reserve ", bytes_ >> 20, " MiB of address space for the "
          "KV cache: ", std::strerror(errno), "; lower --max-seq"));
    }
    data_ = static_cast<T *>(p);
    return absl::OkStatus();
  }
  /// The first position of sequence `seq`.
  T *Base(uint32_t seq) { return data_ + Offset(seq, 0); }
  T *At(uint32_t seq, uint64_t p) { return data_ + Offset(seq, p); }
  /// At, for a row about to be written: the first row written in each
  /// kPopulateBytes of the cache maps that whole piece in one call
  /// (MADV_POPULATE_WRITE) instead of a page fault every few positions,
  /// which a paravirtualised VM charges about 20 us each (47 us a layer
  /// of a decoded Qwen3-0.6B-shape token; docs/perf.md). Best effort: rows
  /// written out of order, or a kernel without it, fault as before.
  T *AtForWrite(uint32_t seq, uint64_t p) {
    const uint64_t off = Offset(seq, p) * sizeof(T);
    if (off % kPopulateBytes < width_ * sizeof(T)) {
      const uint64_t b = off / kPopulateBytes * kPopulateBytes;
      PopulateRange(reinterpret_cast<uint8_t *>(data_) + b,
                    std::min(kPopulateBytes, bytes_ - b));
    }
    return data_ + off / sizeof(T);
  }
  /// A cache's pages are mapped this many bytes at a time (AtForWrite): 64
  /// positions of a 128-wide fp32 head.
  static constexpr uint64_t kPopulateBytes = 32768;
  /// Maps in the first 2 MiB (the first page where there are huge pages)
  /// of each of sequences [0, n) that exist, now, at load, as llama.cpp
  /// clears its whole KV cache when it starts: a VM that backs guest
  /// memory lazily took 0.3-0.65 GB/s to touch new pages here, 170-370 ms
  /// for a 0.6B-shape prompt's first 112 MB of cache if the prompt paid it.
  void PopulateFirstPages(uint32_t n) {
    for (uint32_t seq = 0; seq < n; ++seq) {
      const uint64_t off = Offset(seq, 0) * sizeof(T);
      if (off >= bytes_)
        break;
      PopulateBytes(off, off + kHugePageBytes, /*now=*/true);
    }
  }
  /// Rows [row, row + n) of sequence `seq` mapped in ahead of their first
  /// write, which would otherwise map them: off this thread
  /// (BackgroundPopulate) when `now` is false, else in this call
  /// (MADV_POPULATE_WRITE; nothing to do where they are mapped already).
  void Populate(uint32_t seq, uint64_t row, uint64_t n, bool now) {
    if (row >= rows_ || n == 0)
      return;
    n = std::min(n, rows_ - row);
    PopulateBytes(Offset(seq, row) * sizeof(T),
                  Offset(seq, row + n) * sizeof(T), now);
  }
  /// For a cache written a row a position in order: when row p + ahead
  /// (ahead >= 1) ends in a 2 MiB piece of the cache that row p + ahead - 1
  /// does not reach, that piece (Populate), `ahead` positions before the
  /// writes reach it. A new piece's first write maps all 2 MiB (a huge
  /// page) at once, and every layer's cache crosses at the same position:
  /// given an `ahead` of each layer's own, the layers' pieces come a token
  /// apart.
  void PopulateAhead(uint32_t seq, uint64_t p, uint64_t ahead, bool now) {
    const uint64_t r = p + ahead;
    if (ahead == 0 || r >= rows_)
      return;
    const uint64_t end = (Offset(seq, r + 1) * sizeof(T) - 1) / kHugePageBytes,
                   before = (Offset(seq, r) * sizeof(T) - 1) / kHugePageBytes;
    if (end != before)
      PopulateBytes(end * kHugePageBytes, (end + 1) * kHugePageBytes, now);
  }
  /// PopulateAhead for a cache written a row a position in order, both
  /// ways: the next 2 MiB asked of the background thread 256 + `layer`
  /// positions ahead, and mapped in this call 1 + `layer` ahead where it is
  /// still missing (`layer`: the layer's own offset, so that the layers'
  /// pieces come a token apart).
  void MapAhead(uint32_t seq, uint64_t p, uint64_t layer) {
    PopulateAhead(seq, p, 256 + layer, /*now=*/false);
    PopulateAhead(seq, p, 1 + layer, /*now=*/true);
  }
  /// Copies `bytes` at (seq, p) to `buf` (save) or from it.
  void Copy(uint32_t seq, uint64_t p, uint8_t *buf, uint64_t bytes, bool save) {
    if (save)
      std::memcpy(buf, At(seq, p), bytes);
    else
      std::memcpy(At(seq, p), buf, bytes);
  }

private:
  uint64_t Offset(uint32_t seq, uint64_t p) const {
    return ((uint64_t)seq * rows_ + p) * width_;
  }
  void PopulateBytes(uint64_t b, uint64_t e, bool now) {
    e = std::min(e, bytes_);
    if (b >= e)
      return;
    uint8_t *at = reinterpret_cast<uint8_t *>(data_) + b;
    if (now) {
      PopulateRange(at, e - b);
    } else {
      asked_ = true;
      BackgroundPopulate::Get().Request(at, e - b);
    }
  }
  uint64_t width_ = 0, rows_ = 0, bytes_ = 0;
  T *data_ = nullptr;
  bool asked_ = false; // the background thread was asked for some of it
};
using SeqCache = SeqCacheOf<float>;

class HostOp {
public:
  virtual ~HostOp() = default;
  virtual absl::Status Run(const Step &step) = 0;
  /// Floats a row of the value this op writes (0: the hidden size).
  virtual uint64_t OutWidth() const { return 0; }
  /// Bytes of cache this op keeps for every token of the sequence.
  virtual uint64_t KvBytesPerToken() const { return 0; }
  /// Weight bytes one decoded token streams through this op on the host.
  virtual uint64_t WeightBytesPerToken() const { return 0; }
  /// Where those bytes are (AppendMatrixRanges of the op's matrices, in
  /// the order it reads them): what the engine brings into the caches
  /// while the step before this op is on the ducks
  /// (EngineOptions::host_prefetch_bytes). An MLA's kv_b_proj, of which
  /// only some rows are read, is left out.
  virtual void HostWeights(std::vector<ByteRange> *out) const { (void)out; }
  /// Prefix reuse (Engine::SaveKv/LoadKv): position from + i of sequence
  /// `seq`'s cache, all KvBytesPerToken() bytes of it, to `buf + i *
  /// stride` (save) or from there into the cache, for i < n.
  virtual void CopyKv(uint32_t seq, uint64_t from, uint32_t n, uint8_t *buf,
                      uint64_t stride, bool save) {
    (void)seq, (void)from, (void)n, (void)buf, (void)stride, (void)save;
  }
  /// Asks the op to honour Step::logit_rows_only (the engine asks its last
  /// layer's attention, whose result only the logit rows need): whether it
  /// will, its buffers for steps of up to max_rows rows taken now.
  virtual bool KeepLogitRowsOnly(uint32_t max_rows) {
    (void)max_rows;
    return false;
  }
  /// Cache bytes one decoded token reads through this op when it attends
  /// over `positions` cached positions.
  virtual uint64_t CacheReadBytes(uint64_t positions) const {
    (void)positions;
    return 0;
  }

  /// Set by the engine from the plan (checked in range at load).
  std::vector<uint32_t> inputs;
  uint32_t result = 0;

protected:
  const float *In(const Step &s, size_t i) const {
    return s.values->Get(inputs[i]);
  }
  float *Out(const Step &s) const { return s.values->Get(result); }
};

using HostOpOr = absl::StatusOr<std::unique_ptr<HostOp>>;
using HostOpFactory = HostOpOr (*)(const OpEnv &env);

/// An op kind's whole contract: what the plan layer checks and counts
/// (OpKind) and how the engine builds it. Each op's file defines its kind
/// (k<Name>Kind, next to its Create) and the registry below lists it.
struct HostOpKind : OpKind {
  HostOpFactory create;
};

/// The registry: one line an op kind. Registry.cpp turns it into the table
/// the plan is checked against (HostOpKinds(), Engine.h).
#define DUCK_HOST_OPS(X)                                                       \
  X(Embedding)                                                                 \
  X(RmsNorm)                                                                   \
  X(Add)                                                                       \
  X(GqaAttention)                                                              \
  X(MlaAttention)                                                              \
  X(Indexer)                                                                   \
  X(DenseFfn)                                                                  \
  X(MoeFfn)                                                                    \
  X(LmHead)                                                                    \
  X(MtpInput)

#define DUCK_DECLARE_HOST_OP(name) extern const HostOpKind k##name##Kind;
DUCK_HOST_OPS(DUCK_DECLARE_HOST_OP)
#undef DUCK_DECLARE_HOST_OP

/// The kind's descriptor; null for NONE or a kind not in the registry.
const HostOpKind *FindHostOpKind(pl::OpParams kind);

} // namespace duck::runtime::ops

#endif
