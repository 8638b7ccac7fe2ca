//===- DuckOps.cpp - duck dialect verifiers -------------------------------===//
//
// Each check names the rule it enforces in its message, so a diagnostic
// says what is wrong and what was expected.
//===----------------------------------------------------------------------===//
#include "duck/Dialect/Duck/IR/DuckOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallSet.h"

using namespace mlir;
using namespace mlir::duck;

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

static LogicalResult verifyShape(function_ref<InFlightDiagnostic()> emitError,
                                 ArrayRef<int64_t> shape, Type dtype) {
  if (shape.empty())
    return emitError() << "weight shape must have at least one dimension";
  for (int64_t d : shape)
    if (d <= 0)
      return emitError() << "weight dimensions must be positive, got " << d;
  if (!isa<FloatType, IntegerType>(dtype))
    return emitError() << "weight dtype must be a float or integer type, got "
                       << dtype;
  return success();
}

LogicalResult WeightAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                 StringRef name, Type dtype,
                                 ArrayRef<int64_t> shape, StringAttr file,
                                 StringAttr scale) {
  if (name.empty())
    return emitError() << "weight needs a tensor name";
  return verifyShape(emitError, shape, dtype);
}

LogicalResult
ExpertWeightsAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                          StringRef pattern, Type dtype,
                          ArrayRef<int64_t> shape, int64_t count,
                          StringAttr scale) {
  if (!pattern.contains("{e}"))
    return emitError() << "expert name pattern '" << pattern
                       << "' must contain {e}";
  if (count <= 0)
    return emitError() << "expert count must be positive, got " << count;
  if (scale && !scale.getValue().contains("{e}"))
    return emitError() << "expert scale pattern must contain {e}";
  return verifyShape(emitError, shape, dtype);
}

LogicalResult
PartitionAttr::verify(function_ref<InFlightDiagnostic()> emitError, int64_t tp,
                      int64_t multipleOf, Strategy strategy, int64_t tpMax,
                      DenseF64ArrayAttr shares) {
  if (tp < 1)
    return emitError() << "partition: tp must be at least 1, got " << tp;
  if (multipleOf != 128 && multipleOf != 64 && multipleOf != 32)
    return emitError() << "partition: multiple_of must be 128, 64 or 32, got "
                       << multipleOf;
  if (tpMax < 0)
    return emitError() << "partition: tp_max must not be negative, got "
                       << tpMax;
  if (shares) {
    if ((int64_t)shares.size() != tp)
      return emitError() << "partition: shares has " << shares.size()
                         << " values for tp = " << tp;
    if (llvm::any_of(shares.asArrayRef(), [](double v) { return !(v > 0); }))
      return emitError() << "partition: every share must be positive";
  }
  return success();
}

static std::string substituteExpert(StringRef pattern, int64_t e) {
  auto pos = pattern.find("{e}");
  return (pattern.substr(0, pos) + Twine(e) + pattern.substr(pos + 3)).str();
}

std::string ExpertWeightsAttr::nameOf(int64_t e) const {
  return substituteExpert(getPattern(), e);
}

std::string ExpertWeightsAttr::scaleNameOf(int64_t e) const {
  return getScale() ? substituteExpert(getScale().getValue(), e) : "";
}

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

/// Last dimension of an activation tensor (checked by verifyActivations).
static int64_t hiddenOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape().back();
}

/// Activations are [..., hidden]: a rank-0 tensor has no hidden size.
static LogicalResult verifyActivations(Operation *op) {
  SmallVector<Type> types(op->getOperandTypes());
  llvm::append_range(types, op->getResultTypes());
  for (Type t : types)
    if (auto rt = dyn_cast<RankedTensorType>(t);
        rt && rt.getElementType().isF32() && rt.getRank() == 0)
      return op->emitOpError("activations must have a hidden dimension, got ")
             << t;
  return success();
}

static LogicalResult expectShape(Operation *op, StringRef role,
                                 ArrayRef<int64_t> got,
                                 ArrayRef<int64_t> want) {
  if (got == want)
    return success();
  auto diag = op->emitOpError() << role << " weight has shape [";
  llvm::interleaveComma(got, diag);
  diag << "], expected [";
  llvm::interleaveComma(want, diag);
  return diag << "]";
}

//===----------------------------------------------------------------------===//
// Ops
//===----------------------------------------------------------------------===//

LogicalResult ModelOp::verify() {
  Block &body = getBody().front();
  // A second argument: the tokens after each row, for an MTP module.
  if (body.getNumArguments() < 1 || body.getNumArguments() > 2 ||
      !llvm::all_of(body.getArgumentTypes(),
                    [](Type t) { return isa<RankedTensorType>(t); }))
    return emitOpError("body must take the token ids (and, with an MTP "
                       "module, the tokens after them)");
  return success();
}

LogicalResult MtpInputOp::verify() {
  if (failed(verifyActivations(*this)))
    return failure();
  const int64_t h = hiddenOf(getResult());
  if (hiddenOf(getEmbedded()) != h || hiddenOf(getHidden()) != h)
    return emitOpError("embedding, hidden state and result must have the "
                       "same hidden size");
  if (failed(expectShape(*this, "enorm", getEnorm().getShape(), {h})) ||
      failed(expectShape(*this, "hnorm", getHnorm().getShape(), {h})) ||
      failed(expectShape(*this, "eh_proj", getEhProj().getShape(), {h, 2 * h})))
    return failure();
  if (getEps().convertToDouble() <= 0)
    return emitOpError("eps must be positive");
  return success();
}

LogicalResult EmbeddingOp::verify() {
  if (failed(verifyActivations(*this)))
    return failure();
  ArrayRef<int64_t> s = getWeight().getShape();
  if (s.size() != 2)
    return emitOpError("embedding weight must be 2-D [vocab, hidden]");
  if (s[1] != hiddenOf(getResult()))
    return emitOpError() << "embedding width " << s[1]
                         << " does not match the result's hidden size "
                         << hiddenOf(getResult());
  return success();
}

LogicalResult RmsNormOp::verify() {
  if (failed(verifyActivations(*this)))
    return failure();
  int64_t h = hiddenOf(getInput());
  if (getWeight().getShape().size() != 1 || getWeight().getShape()[0] != h)
    return expectShape(*this, "norm", getWeight().getShape(), {h});
  if (getEps().convertToDouble() <= 0)
    return emitOpError("eps must be positive");
  return success();
}

/// A matrix whose rows are split over the ducks (the LM head, an o_proj):
/// `duck_rows` runs from 0 to `rows` in increasing tp + 1 boundaries, the
/// block divides K, and the per-duck attrs have one value a duck.
static LogicalResult verifyDuckRows(Operation *op, StringRef what,
                                    int64_t rows, int64_t k,
                                    std::optional<ArrayRef<int64_t>> duckRows,
                                    std::optional<int64_t> block,
                                    std::optional<ArrayRef<int64_t>> offsets,
                                    std::optional<ArrayRef<int64_t>> bytes) {
  if (!duckRows)
    return success();
  if (duckRows->size() < 2 || duckRows->front() != 0 ||
      duckRows->back() != rows)
    return op->emitOpError() << "duck_rows must run from 0 to the " << what
                             << " " << rows << " in tp + 1 boundaries";
  for (size_t i = 1; i < duckRows->size(); ++i)
    if ((*duckRows)[i] <= (*duckRows)[i - 1])
      return op->emitOpError() << "duck_rows must increase: duck " << i - 1
                               << " gets no rows";
  if (!block || (*block != 32 && *block != 64 && *block != 128) ||
      k % *block != 0)
    return op->emitOpError() << "duck_block must be 32, 64 or 128 and divide "
                                "the "
                             << (what == "vocab" ? "hidden size" : "input width")
                             << " " << k;
  const size_t tp = duckRows->size() - 1;
  for (auto [name, a] :
       {std::pair{"duck_offsets", offsets}, std::pair{"duck_bytes", bytes}})
    if (a && a->size() != tp)
      return op->emitOpError() << name << " needs " << tp
                               << " values, one a duck";
  return success();
}

LogicalResult AttentionOp::verify() {
  if (getKind() != "gqa" && getKind() != "mla")
    return emitOpError() << "attention kind must be \"gqa\" or \"mla\", got \""
                         << getKind() << "\"";
  if (getNumHeads() <= 0 || getNumKvHeads() <= 0 || getHeadDim() <= 0)
    return emitOpError("head counts and head_dim must be positive");
  if (getNumHeads() % getNumKvHeads() != 0)
    return emitOpError() << "num_heads " << getNumHeads()
                         << " is not a multiple of num_kv_heads "
                         << getNumKvHeads();
  for (NamedAttribute w : getWeights())
    if (!isa<WeightAttr>(w.getValue()))
      return emitOpError() << "weights entry '" << w.getName().getValue()
                           << "' is not a #duck.weight";
  static const StringRef gqaRoles[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
  static const StringRef mlaRoles[] = {"kv_a_proj_with_mqa", "kv_b_proj",
                                       "o_proj"};
  ArrayRef<StringRef> roles =
      getKind() == "gqa" ? ArrayRef<StringRef>(gqaRoles) : ArrayRef<StringRef>(mlaRoles);
  for (StringRef role : roles)
    if (!getWeights().get(role))
      return emitOpError() << "attention is missing its '" << role
                           << "' weight";
  ArrayRef<int64_t> o = getOProj().getShape();
  if (getDuckRows() && o.size() != 2)
    return emitOpError("o_proj must be a matrix to go on the ducks");
  if (failed(verifyDuckRows(*this, "o_proj rows", o.empty() ? 0 : o[0],
                            o.size() == 2 ? o[1] : 0, getDuckRows(),
                            getDuckBlock(), getDuckOffsets(), getDuckBytes())))
    return failure();
  // A group's rows concatenate; its matrices share K.
  auto group = [&](ArrayRef<WeightAttr> ws, StringRef what, int64_t &rows,
                   int64_t &k) -> LogicalResult {
    rows = 0;
    k = -1;
    for (WeightAttr w : ws) {
      if (!w || w.getShape().size() != 2 || (k >= 0 && w.getShape()[1] != k))
        return emitOpError() << "the " << what
                             << " must be matrices of one width to go on "
                                "the ducks";
      k = w.getShape()[1];
      rows += w.getShape()[0];
    }
    return success();
  };
  int64_t rows = 0, k = 0;
  if (getInDuckRows()) {
    SmallVector<WeightAttr, 4> in = getInProjs();
    if (in.empty() || failed(group(in, "input projections", rows, k)) ||
        failed(verifyDuckRows(*this, "input projection rows", rows, k,
                              getInDuckRows(), getInDuckBlock(),
                              getInDuckOffsets(), getInDuckBytes())))
      return failure();
    // The indexer hands the MLA its queries from the query group's step.
    if (getIndexerAttr() && !getQDuckRows())
      return emitOpError("with an indexer, the input projections go to the "
                         "ducks only with the query projections");
    // GQA's q_proj (MLA's without a query LoRA) is one of them.
    if (getQDuckRows() && !getWeights().get("q_b_proj"))
      return emitOpError("the query projection is one of the input "
                         "projections: it cannot also have its own rows");
  }
  if (!getQDuckRows())
    return success();
  if (failed(group(getQProjs(), "query projection", rows, k)))
    return failure();
  return verifyDuckRows(*this, "query projection rows", rows, k,
                        getQDuckRows(), getQDuckBlock(), getQDuckOffsets(),
                        getQDuckBytes());
}

LogicalResult LmHeadOp::verify() {
  if (failed(verifyActivations(*this)))
    return failure();
  ArrayRef<int64_t> s = getWeight().getShape();
  if (s.size() != 2 || s[1] != hiddenOf(getInput()))
    return emitOpError("lm_head weight must be [vocab, hidden]");
  if (hiddenOf(getResult()) != s[0])
    return emitOpError() << "result width " << hiddenOf(getResult())
                         << " does not match vocab " << s[0];
  return verifyDuckRows(*this, "vocab", s[0], s[1], getDuckRows(),
                        getDuckBlock(), getDuckOffsets(), getDuckBytes());
}

/// Rules shared by mlp and moe: shard ranks, ranges and partition attrs.
static LogicalResult verifyShards(Operation *op, int64_t inter, int64_t experts,
                                  std::optional<int64_t> tp,
                                  std::optional<int64_t> multipleOf,
                                  std::optional<Strategy> strategy) {
  // A layer is split one way; `mixed` only describes a module.
  if (strategy == Strategy::mixed)
    return op->emitOpError("a layer's strategy is intermediate or experts; "
                           "mixed only describes a module's partition");
  if (strategy == Strategy::experts && isa<MlpOp>(op))
    return op->emitOpError("a dense layer has no experts to place: its "
                           "strategy is intermediate");
  // Checked before the shards: a zero multiple_of would divide by zero.
  if (multipleOf && *multipleOf <= 0)
    return op->emitOpError() << "multiple_of must be positive, got "
                             << *multipleOf;
  Region &r = op->getRegion(0);
  if (r.empty())
    return success();
  if (!tp)
    return op->emitOpError("has shards but no 'tp' attribute");
  llvm::SmallSet<int64_t, 16> ranks;
  for (Operation &child : r.front()) {
    auto shard = dyn_cast<Fp9FfnOp>(child);
    if (!shard)
      return op->emitOpError("shards region may only hold duck.fp9_ffn ops");
    int64_t rank = (int64_t)shard.getRank();
    if (rank < 0 || rank >= *tp)
      return shard.emitOpError() << "rank " << rank
                                 << " is outside the cluster of tp = " << *tp;
    if (!ranks.insert(rank).second)
      return shard.emitOpError() << "duplicate shard for rank "
                                 << shard.getRank();
    if ((int64_t)shard.getInterEnd() > inter)
      return shard.emitOpError() << "intermediate slice ends at "
                                 << shard.getInterEnd()
                                 << ", past the layer's intermediate size "
                                 << inter;
    if ((int64_t)shard.getExpertEnd() > experts)
      return shard.emitOpError() << "expert range ends at "
                                 << shard.getExpertEnd() << ", past the "
                                 << experts << " experts of the layer";
    if (multipleOf && shard.getLocalInter() % *multipleOf != 0)
      return shard.emitOpError()
             << "local intermediate size " << shard.getLocalInter()
             << " is not a multiple of multiple_of = " << *multipleOf;
  }
  return success();
}

// The shards region is a set of per-duck records, not a sequence.
RegionKind MlpOp::getRegionKind(unsigned) { return RegionKind::Graph; }
RegionKind MoeOp::getRegionKind(unsigned) { return RegionKind::Graph; }

LogicalResult MlpOp::verify() {
  if (failed(verifyActivations(*this)))
    return failure();
  int64_t h = getHidden(), i = getInter();
  if (hiddenOf(getInput()) != h)
    return emitOpError() << "input hidden size " << hiddenOf(getInput())
                         << " does not match hidden = " << h;
  if (failed(expectShape(*this, "gate", getGate().getShape(), {i, h})) ||
      failed(expectShape(*this, "up", getUp().getShape(), {i, h})) ||
      failed(expectShape(*this, "down", getDown().getShape(), {h, i})))
    return failure();
  return verifyShards(*this, i, 1, getTp(), getMultipleOf(), getStrategy());
}

LogicalResult MoeOp::verify() {
  if (failed(verifyActivations(*this)))
    return failure();
  int64_t h = getHidden(), i = getInter(), e = getNumExperts();
  if (hiddenOf(getInput()) != h)
    return emitOpError() << "input hidden size " << hiddenOf(getInput())
                         << " does not match hidden = " << h;
  if ((int64_t)getTopK() < 1 || (int64_t)getTopK() > e)
    return emitOpError() << "top_k = " << getTopK() << " must be in [1, "
                         << e << "]";
  for (auto [role, w] : {std::pair<StringRef, ExpertWeightsAttr>{"gate",
                                                                 getGate()},
                         {"up", getUp()},
                         {"down", getDown()}})
    if (w.getCount() != e)
      return emitOpError() << role << " experts count " << w.getCount()
                           << " does not match num_experts = " << e;
  if (failed(expectShape(*this, "expert gate", getGate().getShape(), {i, h})) ||
      failed(expectShape(*this, "expert up", getUp().getShape(), {i, h})) ||
      failed(expectShape(*this, "expert down", getDown().getShape(), {h, i})) ||
      failed(expectShape(*this, "router", getRouterWeight().getShape(),
                         {e, h})))
    return failure();
  // I64Attr getters are unsigned: compare as int64_t so negatives fail.
  std::optional<int64_t> nGroup = getNGroup(), topkGroup = getTopkGroup();
  if (nGroup && (*nGroup <= 0 || e % *nGroup != 0))
    return emitOpError() << "n_group = " << *nGroup
                         << " must divide num_experts = " << e;
  if (topkGroup && *topkGroup < 1)
    return emitOpError() << "topk_group = " << *topkGroup
                         << " must be at least 1";
  if (topkGroup && nGroup && *topkGroup > *nGroup)
    return emitOpError("topk_group must not exceed n_group");
  if (getCorrectionBias() &&
      failed(expectShape(*this, "correction_bias",
                         getCorrectionBias()->getShape(), {e})))
    return failure();
  int64_t shared = getNumShared();
  if (shared < 0)
    return emitOpError() << "num_shared = " << shared
                         << " must not be negative";
  if (shared > 0 && !(getSharedGate() && getSharedUp() && getSharedDown()))
    return emitOpError("num_shared > 0 needs shared_gate, shared_up and "
                       "shared_down weights");
  // The shared experts are one FFN of num_shared * inter neurons, which the
  // layout cuts into num_shared experts of `inter` neurons each.
  if (shared > 0 &&
      (failed(expectShape(*this, "shared gate", getSharedGate()->getShape(),
                          {shared * i, h})) ||
       failed(expectShape(*this, "shared up", getSharedUp()->getShape(),
                          {shared * i, h})) ||
       failed(expectShape(*this, "shared down", getSharedDown()->getShape(),
                          {h, shared * i}))))
    return failure();
  return verifyShards(*this, i, getTotalExperts(), getTp(), getMultipleOf(),
                      getStrategy());
}

LogicalResult Fp9FfnOp::verify() {
  // I64Attr getters are unsigned: compare as int64_t so negatives fail.
  int64_t ib = getInterBegin(), ie = getInterEnd();
  int64_t eb = getExpertBegin(), ee = getExpertEnd();
  if (ib < 0 || ib >= ie)
    return emitOpError() << "intermediate slice [" << ib << ", " << ie
                         << ") is empty or negative";
  if (eb < 0 || eb >= ee)
    return emitOpError() << "expert range [" << eb << ", " << ee
                         << ") is empty or negative";
  int64_t b = getBlock();
  if (b != 32 && b != 64 && b != 128)
    return emitOpError() << "block must be 32, 64 or 128, got " << b;
  if (getLocalInter() % b != 0)
    return emitOpError() << "local intermediate size " << getLocalInter()
                         << " is not a multiple of the block " << b
                         << " (down_proj's K)";
  if (getDecodeMode() && *getDecodeMode() > 6)
    return emitOpError("decode_mode must be a duck mode 0..6");
  if (getPrefillMode() && *getPrefillMode() > 6)
    return emitOpError("prefill_mode must be a duck mode 0..6");
  return success();
}

#define GET_OP_CLASSES
#include "duck/Dialect/Duck/IR/DuckOps.cpp.inc"
