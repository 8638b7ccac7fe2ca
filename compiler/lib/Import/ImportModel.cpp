//===- ImportModel.cpp - checkpoint to duck dialect -----------------------===//
#include "duck/Import/ImportModel.h"

#include "duck/Dialect/Duck/IR/DuckOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <xxhash.h>

using namespace mlir;
using namespace mlir::duck;
using namespace mlir::duck::import;

namespace {

Type mlirTypeOf(MLIRContext *ctx, DType d) {
  Builder b(ctx);
  switch (d) {
  case DType::BF16:
    return b.getBF16Type();
  case DType::F16:
    return b.getF16Type();
  case DType::F32:
    return b.getF32Type();
  case DType::F64:
    return b.getF64Type();
  case DType::F8_E4M3:
    return b.getType<Float8E4M3FNType>();
  case DType::F8_E5M2:
    return b.getType<Float8E5M2Type>();
  case DType::BOOL:
    return b.getI1Type();
  case DType::U8:
  case DType::I8:
    return b.getIntegerType(8);
  case DType::I16:
  case DType::U16:
    return b.getIntegerType(16);
  case DType::I32:
  case DType::U32:
    return b.getIntegerType(32);
  case DType::I64:
  case DType::U64:
    return b.getIntegerType(64);
  }
  return b.getF32Type();
}

class Importer {
public:
  Importer(MLIRContext &ctx, const Checkpoint &ckpt, bool mtp)
      : ctx(ctx), ckpt(ckpt), desc(ckpt.model()), b(&ctx), mtp(mtp) {
    for (ExpectedTensor &t : expectedTensors(desc))
      expected.try_emplace(t.name, t);
    if (mtp)
      for (ExpectedTensor &t : mtpTensors(desc))
        expected.try_emplace(t.name, t);
    configLoc = FileLineColLoc::get(&ctx, ckpt.configPath(), 1, 1);
  }

  OwningOpRef<ModuleOp> run();

private:
  Location layerLoc(int64_t layer) {
    return NameLoc::get(b.getStringAttr("model.layers." + Twine(layer)),
                        configLoc);
  }

  /// The dtype a tensor has: the checkpoint's, else what the config implies.
  Type dtypeOf(const ExpectedTensor &t, const TensorRef &ref) {
    if (ref)
      return mlirTypeOf(&ctx, ref.info->dtype);
    if (t.fp8_eligible && desc.quantization.isFp8())
      return b.getType<Float8E4M3FNType>();
    return b.getBF16Type();
  }

  std::string relativeFile(const TensorRef &ref) {
    return llvm::sys::path::filename(ref.file->path()).str();
  }

  WeightAttr weight(StringRef name) {
    auto it = expected.find(name);
    if (it == expected.end()) {
      emitError(configLoc) << "internal: tensor '" << name
                           << "' is not expected for this family";
      hadError = true;
      return {};
    }
    const ExpectedTensor &t = it->second;
    TensorRef ref = ckpt.hasWeights() ? ckpt.find(name) : TensorRef{};
    StringAttr file, scale;
    if (ref)
      file = b.getStringAttr(relativeFile(ref));
    Type dt = dtypeOf(t, ref);
    if (isa<Float8E4M3FNType>(dt))
      scale = b.getStringAttr(std::string(name) + "_scale_inv");
    return WeightAttr::get(&ctx, name, dt, t.shape, file, scale);
  }

  ExpertWeightsAttr experts(int64_t layer, StringRef proj) {
    std::string first = "model.layers." + std::to_string(layer) +
                        ".mlp.experts.0." + proj.str() + ".weight";
    WeightAttr w0 = weight(first);
    if (!w0)
      return {};
    std::string pattern = "model.layers." + std::to_string(layer) +
                          ".mlp.experts.{e}." + proj.str() + ".weight";
    StringAttr scale;
    if (w0.getScale())
      scale = b.getStringAttr(pattern + "_scale_inv");
    return ExpertWeightsAttr::get(&ctx, pattern, w0.getDtype(), w0.getShape(),
                                  desc.num_routed_experts, scale);
  }

  std::string lw(int64_t layer, StringRef rest) {
    return "model.layers." + std::to_string(layer) + "." + rest.str();
  }

  Value attention(Value x, int64_t layer);
  Value ffn(Value x, int64_t layer);
  /// One decoder layer: norm, attention, residual, norm, FFN, residual.
  Value decoderLayer(Value x, int64_t layer);
  /// The MTP module after the model (docs/mtp.md): its hidden state after
  /// the shared head's norm, for the LM head.
  Value mtpModule(Value hidden, Value nextTokens, WeightAttr embed);
  DictionaryAttr configDict();

  MLIRContext &ctx;
  const Checkpoint &ckpt;
  const ModelDesc &desc;
  Builder b;
  OpBuilder *ob = nullptr;
  Location configLoc = UnknownLoc::get(&ctx);
  llvm::StringMap<ExpectedTensor> expected;
  bool hadError = false;
  bool mtp = false;
  RankedTensorType act;
};

Value Importer::decoderLayer(Value x, int64_t l) {
  Location loc = layerLoc(l);
  FloatAttr eps = b.getF64FloatAttr(desc.rms_norm_eps);
  WeightAttr n1 = weight(lw(l, "input_layernorm.weight"));
  WeightAttr n2 = weight(lw(l, "post_attention_layernorm.weight"));
  if (!n1 || !n2)
    return {};
  Value h = ob->create<RmsNormOp>(loc, act, x, n1, eps);
  h = attention(h, l);
  x = ob->create<AddOp>(loc, x, h);
  h = ob->create<RmsNormOp>(loc, act, x, n2, eps);
  h = ffn(h, l);
  if (!h)
    return {};
  return ob->create<AddOp>(loc, x, h);
}

Value Importer::mtpModule(Value hidden, Value nextTokens, WeightAttr embed) {
  const int64_t l = desc.num_layers;
  Location loc = layerLoc(l);
  // The module's embed_tokens equals the model's (docs/mtp.md): the plan
  // reads the model's, which the host has mapped already.
  Value e = ob->create<EmbeddingOp>(loc, act, nextTokens, embed);
  WeightAttr en = weight(lw(l, "enorm.weight")),
             hn = weight(lw(l, "hnorm.weight")),
             eh = weight(lw(l, "eh_proj.weight")),
             sn = weight(lw(l, "shared_head.norm.weight"));
  if (!en || !hn || !eh || !sn)
    return {};
  FloatAttr eps = b.getF64FloatAttr(desc.rms_norm_eps);
  Value x = ob->create<MtpInputOp>(loc, act, e, hidden, b.getI64IntegerAttr(l),
                                   en, hn, eh, eps);
  x = decoderLayer(x, l);
  if (!x || hadError)
    return {};
  return ob->create<RmsNormOp>(loc, act, x, sn, eps);
}

DictionaryAttr Importer::configDict() {
  SmallVector<NamedAttribute> a;
  auto i64 = [&](StringRef k, int64_t v) {
    a.push_back(b.getNamedAttr(k, b.getI64IntegerAttr(v)));
  };
  auto f64 = [&](StringRef k, double v) {
    a.push_back(b.getNamedAttr(k, b.getF64FloatAttr(v)));
  };
  i64("hidden_size", desc.hidden_size);
  i64("num_layers", desc.num_layers);
  i64("vocab_size", desc.vocab_size);
  i64("num_attention_heads", desc.num_attention_heads);
  i64("num_kv_heads", desc.num_kv_heads);
  i64("head_dim", desc.head_dim);
  f64("rms_norm_eps", desc.rms_norm_eps);
  f64("rope_theta", desc.rope_theta);
  i64("max_position_embeddings", desc.max_position_embeddings);
  a.push_back(b.getNamedAttr("tie_word_embeddings",
                             b.getBoolAttr(desc.tie_word_embeddings)));
  if (desc.bos_token_id)
    i64("bos_token_id", *desc.bos_token_id);
  SmallVector<int64_t> eos(desc.eos_token_ids.begin(), desc.eos_token_ids.end());
  a.push_back(b.getNamedAttr("eos_token_ids", b.getI64ArrayAttr(eos)));
  if (desc.rope_scaling) {
    const RopeScaling &r = *desc.rope_scaling;
    a.push_back(b.getNamedAttr("rope_scaling_type", b.getStringAttr(r.type)));
    f64("rope_scaling_factor", r.factor);
    if (r.beta_fast)
      f64("rope_beta_fast", *r.beta_fast);
    if (r.beta_slow)
      f64("rope_beta_slow", *r.beta_slow);
    if (r.mscale)
      f64("rope_mscale", *r.mscale);
    if (r.mscale_all_dim)
      f64("rope_mscale_all_dim", *r.mscale_all_dim);
    if (r.original_max_position_embeddings)
      i64("rope_original_max_position_embeddings",
          *r.original_max_position_embeddings);
    // Resolved here, where the config's absent keys are still known (the
    // plan's defaults cannot tell absent from 1).
    if (r.isYarn())
      f64("rope_attention_factor", r.yarnAttentionFactor());
  }
  if (desc.usesMla()) {
    i64("q_lora_rank", desc.q_lora_rank);
    i64("kv_lora_rank", desc.kv_lora_rank);
    i64("qk_nope_head_dim", desc.qk_nope_head_dim);
    i64("qk_rope_head_dim", desc.qk_rope_head_dim);
    i64("v_head_dim", desc.v_head_dim);
  }
  if (desc.quantization.isFp8()) {
    a.push_back(b.getNamedAttr(
        "fp8_block", b.getI64ArrayAttr(desc.quantization.weight_block_size)));
  }
  return b.getDictionaryAttr(a);
}

Value Importer::attention(Value x, int64_t layer) {
  SmallVector<NamedAttribute> w;
  auto add = [&](StringRef role, StringRef rest) {
    if (WeightAttr a = weight(lw(layer, rest)))
      w.push_back(b.getNamedAttr(role, a));
  };
  StringRef kind;
  SmallVector<NamedAttribute> idx;
  if (desc.isQwen()) {
    kind = "gqa";
    for (StringRef p : {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm",
                        "k_norm"})
      add(p, ("self_attn." + p + ".weight").str());
  } else {
    kind = "mla";
    if (desc.q_lora_rank > 0) {
      add("q_a_proj", "self_attn.q_a_proj.weight");
      add("q_a_layernorm", "self_attn.q_a_layernorm.weight");
      add("q_b_proj", "self_attn.q_b_proj.weight");
    } else {
      add("q_proj", "self_attn.q_proj.weight");
    }
    for (StringRef p : {"kv_a_proj_with_mqa", "kv_b_proj", "o_proj"})
      add(p, ("self_attn." + p + ".weight").str());
    add("kv_a_layernorm", "self_attn.kv_a_layernorm.weight");
    if (desc.hasIndexer()) {
      for (auto [role, rest] :
           {std::pair<StringRef, StringRef>{"wq_b", "self_attn.indexer.wq_b.weight"},
            {"wk", "self_attn.indexer.wk.weight"},
            {"k_norm", "self_attn.indexer.k_norm.weight"},
            {"k_norm_bias", "self_attn.indexer.k_norm.bias"},
            {"weights_proj", "self_attn.indexer.weights_proj.weight"}})
        if (WeightAttr a = weight(lw(layer, rest)))
          idx.push_back(b.getNamedAttr(role, a));
      idx.push_back(b.getNamedAttr("n_heads", b.getI64IntegerAttr(desc.index_n_heads)));
      idx.push_back(b.getNamedAttr("head_dim", b.getI64IntegerAttr(desc.index_head_dim)));
      idx.push_back(b.getNamedAttr("topk", b.getI64IntegerAttr(desc.index_topk)));
    }
  }
  auto op = ob->create<AttentionOp>(
      layerLoc(layer), act, x, b.getI64IntegerAttr(layer),
      b.getStringAttr(kind), b.getI64IntegerAttr(desc.num_attention_heads),
      b.getI64IntegerAttr(desc.num_kv_heads),
      b.getI64IntegerAttr(desc.head_dim), b.getDictionaryAttr(w),
      idx.empty() ? DictionaryAttr() : b.getDictionaryAttr(idx),
      /*duck_rows=*/nullptr, /*duck_block=*/nullptr, /*duck_slot=*/nullptr,
      /*duck_offsets=*/nullptr, /*duck_bytes=*/nullptr,
      /*q_duck_*=*/nullptr, nullptr, nullptr, nullptr, nullptr,
      /*in_duck_*=*/nullptr, nullptr, nullptr, nullptr, nullptr,
      /*absorb_heads=*/nullptr, /*absorb_index_rows=*/nullptr);
  return op.getResult();
}

Value Importer::ffn(Value x, int64_t layer) {
  Location loc = layerLoc(layer);
  if (!desc.isMoeLayer(layer)) {
    WeightAttr g = weight(lw(layer, "mlp.gate_proj.weight"));
    WeightAttr u = weight(lw(layer, "mlp.up_proj.weight"));
    WeightAttr d = weight(lw(layer, "mlp.down_proj.weight"));
    if (!g || !u || !d)
      return {};
    auto op = ob->create<MlpOp>(
        loc, act, x, b.getI64IntegerAttr(layer),
        b.getI64IntegerAttr(desc.hidden_size),
        b.getI64IntegerAttr(desc.ffnIntermediate(layer)), g, u, d, nullptr,
        nullptr, nullptr, nullptr);
    return op.getResult();
  }
  bool sigmoid = desc.scoring_func == "sigmoid";
  WeightAttr router = weight(lw(layer, "mlp.gate.weight"));
  WeightAttr bias;
  if (desc.isDeepSeek())
    bias = weight(lw(layer, "mlp.gate.e_score_correction_bias"));
  ExpertWeightsAttr g = experts(layer, "gate_proj"),
                    u = experts(layer, "up_proj"),
                    d = experts(layer, "down_proj");
  WeightAttr sg, su, sd;
  if (desc.n_shared_experts > 0) {
    sg = weight(lw(layer, "mlp.shared_experts.gate_proj.weight"));
    su = weight(lw(layer, "mlp.shared_experts.up_proj.weight"));
    sd = weight(lw(layer, "mlp.shared_experts.down_proj.weight"));
  }
  if (!router || !g || !u || !d || hadError)
    return {};
  OperationState st(loc, MoeOp::getOperationName());
  MoeOp::build(
      *ob, st, act, x, b.getI64IntegerAttr(layer),
      b.getI64IntegerAttr(desc.hidden_size),
      b.getI64IntegerAttr(desc.moe_intermediate_size),
      b.getI64IntegerAttr(desc.num_routed_experts),
      b.getI64IntegerAttr(desc.experts_per_tok),
      RouterKindAttr::get(&ctx, sigmoid ? RouterKind::sigmoid : RouterKind::softmax),
      b.getBoolAttr(desc.norm_topk_prob), router, bias,
      desc.n_group ? b.getI64IntegerAttr(desc.n_group) : IntegerAttr(),
      desc.topk_group ? b.getI64IntegerAttr(desc.topk_group) : IntegerAttr(),
      desc.isDeepSeek() ? b.getF64FloatAttr(desc.routed_scaling_factor)
                        : FloatAttr(),
      g, u, d, b.getI64IntegerAttr(desc.n_shared_experts), sg, su, sd, nullptr,
      nullptr, nullptr, nullptr);
  return ob->create(st)->getResult(0);
}

OwningOpRef<ModuleOp> Importer::run() {
  if (ckpt.hasWeights()) {
    auto check = verifyCheckpoint(ckpt);
    if (!check) {
      emitError(configLoc) << llvm::toString(check.takeError());
      return {};
    }
  }
  OwningOpRef<ModuleOp> module = ModuleOp::create(configLoc);
  int64_t scaleRows = 128;
  if (desc.quantization.isFp8() && !desc.quantization.weight_block_size.empty())
    scaleRows = desc.quantization.weight_block_size[0];
  (*module)->setAttr("duck.scale_rows", b.getI64IntegerAttr(scaleRows));
  OpBuilder builder(&ctx);
  ob = &builder;
  builder.setInsertionPointToEnd(module->getBody());
  std::string symName = llvm::sys::path::filename(ckpt.directory()).str();
  if (symName.empty())
    symName = "model";
  auto model = builder.create<ModelOp>(
      configLoc, b.getStringAttr(symName),
      b.getStringAttr(modelTypeName(desc.family)), configDict());
  Block *body = new Block();
  model.getBody().push_back(body);
  Value tokens = body->addArgument(
      RankedTensorType::get({ShapedType::kDynamic}, b.getI32Type()), configLoc);
  builder.setInsertionPointToEnd(body);
  act = RankedTensorType::get({ShapedType::kDynamic, desc.hidden_size},
                              b.getF32Type());
  WeightAttr embed = weight("model.embed_tokens.weight");
  if (!embed)
    return {};
  Value x = builder.create<EmbeddingOp>(configLoc, act, tokens, embed);
  FloatAttr eps = b.getF64FloatAttr(desc.rms_norm_eps);
  for (int64_t l = 0; l < desc.num_layers && !hadError; ++l)
    if (!(x = decoderLayer(x, l)))
      return {};
  if (hadError)
    return {};
  WeightAttr fn = weight("model.norm.weight");
  x = builder.create<RmsNormOp>(configLoc, act, x, fn, eps);
  WeightAttr head;
  if (desc.tie_word_embeddings && !(ckpt.hasWeights() && ckpt.find("lm_head.weight")))
    head = embed;
  else
    head = weight("lm_head.weight");
  if (!head)
    return {};
  auto logitsTy =
      RankedTensorType::get({ShapedType::kDynamic, desc.vocab_size}, b.getF32Type());
  Value logits = builder.create<LmHeadOp>(configLoc, logitsTy, x, head, nullptr,
                                          nullptr, nullptr, nullptr, nullptr);
  SmallVector<Value, 2> results{logits};
  if (mtp) {
    Value next = body->addArgument(tokens.getType(), configLoc);
    Value m = mtpModule(x, next, embed);
    if (!m)
      return {};
    results.push_back(m);
  }
  builder.create<ReturnOp>(configLoc, results);
  if (failed(mlir::verify(*module)))
    return {};
  return module;
}

} // namespace

llvm::Expected<bool> mlir::duck::import::wantMtp(const Checkpoint &ckpt,
                                                 StringRef mode,
                                                 std::string *note) {
  if (mode == "off")
    return false;
  if (mode != "on" && mode != "auto")
    return llvm::createStringError("--mtp must be auto, on or off, not '" +
                                   mode + "'");
  const ModelDesc &d = ckpt.model();
  const std::vector<ExpectedTensor> want = mtpTensors(d);
  if (want.empty()) {
    if (mode == "auto")
      return false;
    return llvm::createStringError(
        "--mtp on: " + ckpt.configPath().str() +
        " declares no MTP module (num_nextn_predict_layers is 0 or absent, "
        "or the family has none)");
  }
  if (!ckpt.hasWeights())
    return true;
  for (const ExpectedTensor &t : want) {
    TensorRef ref = ckpt.find(t.name);
    std::string why;
    if (!ref)
      why = "has no tensor '" + t.name + "'";
    else if (llvm::ArrayRef<int64_t>(ref.info->shape) !=
             llvm::ArrayRef<int64_t>(t.shape))
      why = "has '" + t.name + "' in another shape than the config implies";
    if (why.empty())
      continue;
    if (mode == "auto") { // a checkpoint shipped without its module
      if (note)
        *note = "the config declares an MTP module but the checkpoint " + why +
                ": compiled without it (--speculative mtp needs it)";
      return false;
    }
    return llvm::createStringError("--mtp on: the checkpoint " + why +
                                   " (its MTP module, docs/mtp.md)");
  }
  return true;
}

OwningOpRef<ModuleOp> mlir::duck::import::importModel(MLIRContext &ctx,
                                                      const Checkpoint &ckpt,
                                                      bool mtp) {
  ctx.getOrLoadDialect<DuckDialect>();
  return Importer(ctx, ckpt, mtp).run();
}

std::string mlir::duck::import::checkpointIdentity(const Checkpoint &ckpt) {
  XXH3_state_t *st = XXH3_createState();
  XXH3_64bits_reset(st);
  if (auto buf = llvm::MemoryBuffer::getFile(ckpt.configPath()))
    XXH3_64bits_update(st, (*buf)->getBufferStart(), (*buf)->getBufferSize());
  for (const auto &f : ckpt.files()) {
    std::string name = llvm::sys::path::filename(f->path()).str();
    uint64_t size = f->fileSize(), hsz = f->headerSize();
    XXH3_64bits_update(st, name.data(), name.size());
    XXH3_64bits_update(st, &size, sizeof size);
    // A rewritten file with the same header (another seed, a re-quantised
    // export) has a new modification time.
    llvm::sys::fs::file_status status;
    if (!llvm::sys::fs::status(f->path(), status)) {
      int64_t mtime = llvm::sys::toTimeT(status.getLastModificationTime());
      XXH3_64bits_update(st, &mtime, sizeof mtime);
    }
    // The header (tensor names, dtypes, shapes, offsets), read from the map.
    XXH3_64bits_update(st, &hsz, sizeof hsz);
    for (const TensorInfo &t : f->tensors()) {
      XXH3_64bits_update(st, t.name.data(), t.name.size());
      XXH3_64bits_update(st, &t.data_offset, sizeof t.data_offset);
      XXH3_64bits_update(st, &t.byte_size, sizeof t.byte_size);
    }
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  char out[17];
  snprintf(out, sizeof out, "%016llx", (unsigned long long)h);
  return out;
}
