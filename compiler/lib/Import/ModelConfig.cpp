//===- ModelConfig.cpp - Typed view of a HF config.json -------------------===//
//
// Field names and defaults follow the HF configuration classes of each
// family; tensor names and shapes follow reference/TENSORS.md.
//
//===----------------------------------------------------------------------===//

#include "duck/Import/ModelConfig.h"

#include "duck/Import/Safetensors.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cmath>

using namespace llvm;

namespace mlir::duck::import {

//===----------------------------------------------------------------------===//
// Families
//===----------------------------------------------------------------------===//

namespace {
struct FamilyEntry {
  ModelFamily family;
  const char *modelType;
};
constexpr FamilyEntry kFamilies[] = {
    {ModelFamily::Qwen3, "qwen3"},
    {ModelFamily::Qwen3Moe, "qwen3_moe"},
    {ModelFamily::DeepSeekV3, "deepseek_v3"},
    {ModelFamily::DeepSeekV32, "deepseek_v32"},
};
} // namespace

StringRef modelTypeName(ModelFamily family) {
  for (const FamilyEntry &e : kFamilies)
    if (e.family == family)
      return e.modelType;
  llvm_unreachable("ModelFamily missing from kFamilies");
}

std::optional<ModelFamily> parseModelType(StringRef modelType) {
  for (const FamilyEntry &e : kFamilies)
    if (modelType == e.modelType)
      return e.family;
  return std::nullopt;
}

std::string supportedModelTypeList() {
  std::string out;
  for (const FamilyEntry &e : kFamilies) {
    if (!out.empty())
      out += ", ";
    out += e.modelType;
  }
  return out;
}

double RopeScaling::yarnAttentionFactor() const {
  if (attention_factor)
    return *attention_factor;
  auto mscaleOf = [&](double m) {
    return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
  };
  if (mscale && mscale_all_dim && *mscale != 0 && *mscale_all_dim != 0)
    return mscaleOf(*mscale) / mscaleOf(*mscale_all_dim);
  return mscaleOf(1.0);
}

//===----------------------------------------------------------------------===//
// Per-layer queries
//===----------------------------------------------------------------------===//

bool ModelDesc::isMoeLayer(int64_t layer) const {
  // DeepSeek's MTP layers (docs/mtp.md) follow the last layer, past
  // first_k_dense_replace: MoE layers.
  if (hasMoe() && isDeepSeek() && layer >= num_layers &&
      layer < num_layers + num_nextn_predict_layers)
    return true;
  if (!hasMoe() || layer < 0 || layer >= num_layers)
    return false;
  if (isQwen())
    return !llvm::is_contained(mlp_only_layers, layer) &&
           (layer + 1) % decoder_sparse_step == 0;
  return layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
}

int64_t ModelDesc::ffnIntermediate(int64_t layer) const {
  return isMoeLayer(layer) ? moe_intermediate_size : intermediate_size;
}

int64_t ModelDesc::numMoeLayers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_layers; ++l)
    n += isMoeLayer(l);
  return n;
}

//===----------------------------------------------------------------------===//
// Parsing
//===----------------------------------------------------------------------===//

namespace {

/// Where the first parse problem is kept; shared by nested readers.
struct ParseDiag {
  std::string source;
  std::string family;
  std::string message;
};

/// Typed field access on one JSON object. The first problem is kept and the
/// getters return a default afterwards, so parsing reads straight through and
/// checks `failed()` once.
class FieldReader {
public:
  FieldReader(const json::Object &obj, ParseDiag &diag, StringRef prefix = "")
      : obj_(obj), diag_(diag), prefix_(prefix) {}

  /// A reader for the object field `key`, naming fields "key.sub".
  FieldReader nested(const json::Object &obj, StringRef key) {
    return FieldReader(obj, diag_, (prefix_ + key + ".").str());
  }

  bool failed() const { return !diag_.message.empty(); }
  Error takeError() {
    return createStringError(inconvertibleErrorCode(), diag_.message);
  }
  void fail(const Twine &msg) {
    if (!failed())
      diag_.message = (diag_.source + ": " + msg).str();
  }
  bool has(StringRef key) const {
    const json::Value *v = obj_.get(key);
    return v && v->kind() != json::Value::Null;
  }
  std::string fieldName(StringRef key) const { return (prefix_ + key).str(); }

  /// Present and non-null, else records "missing required field".
  const json::Value *required(StringRef key) {
    const json::Value *v = obj_.get(key);
    if (!v) {
      fail("missing required field '" + fieldName(key) +
           "' (needed for family " + diag_.family + ")");
      return nullptr;
    }
    return v;
  }
  /// Present and non-null, else nullptr (a null counts as absent, as HF does
  /// for "rope_scaling": null).
  const json::Value *optional(StringRef key) const {
    const json::Value *v = obj_.get(key);
    return v && v->kind() != json::Value::Null ? v : nullptr;
  }

  void typeError(StringRef key, StringRef expected, const json::Value &v) {
    std::string found = jsonKindName(v).str();
    if (v.kind() == json::Value::Number || v.kind() == json::Value::String ||
        v.kind() == json::Value::Boolean)
      found += " " + formatv("{0}", v).str();
    fail("field '" + fieldName(key) + "' must be " + expected + ", found " +
         found);
  }

  int64_t asInt(StringRef key, const json::Value *v, int64_t dflt) {
    if (!v)
      return dflt;
    if (std::optional<int64_t> i = v->getAsInteger())
      return *i;
    typeError(key, "an integer", *v);
    return dflt;
  }
  double asDouble(StringRef key, const json::Value *v, double dflt) {
    if (!v)
      return dflt;
    if (std::optional<double> d = v->getAsNumber())
      return *d;
    typeError(key, "a number", *v);
    return dflt;
  }
  bool asBool(StringRef key, const json::Value *v, bool dflt) {
    if (!v)
      return dflt;
    if (std::optional<bool> b = v->getAsBoolean())
      return *b;
    typeError(key, "a boolean", *v);
    return dflt;
  }
  std::string asString(StringRef key, const json::Value *v, StringRef dflt) {
    if (!v)
      return dflt.str();
    if (std::optional<StringRef> s = v->getAsString())
      return s->str();
    typeError(key, "a string", *v);
    return dflt.str();
  }
  std::vector<int64_t> asIntList(StringRef key, const json::Value *v) {
    std::vector<int64_t> out;
    if (!v)
      return out;
    const json::Array *a = v->getAsArray();
    if (!a) {
      typeError(key, "an array of integers", *v);
      return out;
    }
    for (const json::Value &e : *a) {
      std::optional<int64_t> i = e.getAsInteger();
      if (!i) {
        typeError(key, "an array of integers", e);
        return {};
      }
      out.push_back(*i);
    }
    return out;
  }

  int64_t reqInt(StringRef key) { return asInt(key, required(key), 0); }
  int64_t optInt(StringRef key, int64_t dflt) {
    return asInt(key, optional(key), dflt);
  }
  double optDouble(StringRef key, double dflt) {
    return asDouble(key, optional(key), dflt);
  }
  bool optBool(StringRef key, bool dflt) {
    return asBool(key, optional(key), dflt);
  }
  std::string optString(StringRef key, StringRef dflt = "") {
    return asString(key, optional(key), dflt);
  }
  std::optional<double> maybeDouble(StringRef key) {
    if (const json::Value *v = optional(key))
      return asDouble(key, v, 0.0);
    return std::nullopt;
  }
  std::optional<int64_t> maybeInt(StringRef key) {
    if (const json::Value *v = optional(key))
      return asInt(key, v, 0);
    return std::nullopt;
  }

  /// Records an error unless `value` > 0 (or >= 0 when `allowZero`).
  void checkPositive(StringRef key, int64_t value, bool allowZero = false) {
    if (value > 0 || (allowZero && value == 0))
      return;
    fail("field '" + fieldName(key) + "' must be " +
         (allowZero ? "non-negative" : "positive") + ", found " + Twine(value));
  }

private:
  const json::Object &obj_;
  ParseDiag &diag_;
  std::string prefix_;
};

void parseRopeScaling(FieldReader &top, ModelDesc &d) {
  const json::Value *v = top.optional("rope_scaling");
  if (!v)
    return;
  const json::Object *obj = v->getAsObject();
  if (!obj) {
    top.typeError("rope_scaling", "an object or null", *v);
    return;
  }
  FieldReader r = top.nested(*obj, "rope_scaling");
  RopeScaling rs;
  // HF reads "rope_type" and falls back to the legacy "type". A scaling
  // Duck does not implement is refused: dropping it would run the model
  // at long contexts with the wrong positions and no word said.
  StringRef typeKey = r.has("rope_type") ? "rope_type" : "type";
  if (!r.has(typeKey)) {
    r.fail("field 'rope_scaling' names no 'rope_type' (supported: default, "
           "yarn)");
    return;
  }
  rs.type = r.asString(typeKey, r.optional(typeKey), "");
  if (r.failed())
    return;
  if (rs.type != "default" && rs.type != "yarn") {
    r.fail(r.fieldName(typeKey) + " '" + rs.type +
           "' is not supported (supported: default, yarn)");
    return;
  }
  rs.factor = r.optDouble("factor", 1.0);
  rs.beta_fast = r.maybeDouble("beta_fast");
  rs.beta_slow = r.maybeDouble("beta_slow");
  rs.mscale = r.maybeDouble("mscale");
  rs.mscale_all_dim = r.maybeDouble("mscale_all_dim");
  rs.attention_factor = r.maybeDouble("attention_factor");
  rs.original_max_position_embeddings =
      r.maybeInt("original_max_position_embeddings");
  if (rs.isYarn() && !r.failed()) {
    if (!r.has("factor"))
      r.fail("missing required field 'rope_scaling.factor' (needed for "
             "rope_type yarn)");
    else if (!(rs.factor >= 1.0))
      r.fail("field 'rope_scaling.factor' must be at least 1 for yarn, "
             "found " +
             formatv("{0}", rs.factor).str());
    // The correction range divides by these and takes their logarithm.
    for (auto [key, v] : {std::pair{"beta_fast", rs.beta_fast},
                          std::pair{"beta_slow", rs.beta_slow},
                          std::pair{"attention_factor", rs.attention_factor}})
      if (!r.failed() && v && !(*v > 0))
        r.fail("field '" + r.fieldName(key) + "' must be positive, found " +
               formatv("{0}", *v).str());
    // HF's default: the context the model was trained at.
    if (!rs.original_max_position_embeddings && d.max_position_embeddings > 0)
      rs.original_max_position_embeddings = d.max_position_embeddings;
    if (!r.failed() && !rs.original_max_position_embeddings)
      r.fail("rope_scaling (yarn) needs 'original_max_position_embeddings' "
             "or a top-level 'max_position_embeddings'");
    if (!r.failed())
      r.checkPositive("original_max_position_embeddings",
                      *rs.original_max_position_embeddings);
    // HF's truncate=false (gpt-oss) keeps the correction range unrounded;
    // Duck rounds it as every model it supports does.
    if (!r.failed() && !r.optBool("truncate", true))
      r.fail("field 'rope_scaling.truncate' false is not supported (the "
             "YaRN correction range is always rounded)");
  }
  d.rope_scaling = std::move(rs);
}

void parseQuantization(FieldReader &top, ModelDesc &d) {
  const json::Value *v = top.optional("quantization_config");
  if (!v)
    return;
  const json::Object *obj = v->getAsObject();
  if (!obj) {
    top.typeError("quantization_config", "an object", *v);
    return;
  }
  FieldReader r = top.nested(*obj, "quantization_config");
  QuantizationConfig &q = d.quantization;
  std::string method =
      r.asString("quant_method", r.required("quant_method"), "");
  if (!r.failed() && method != "fp8")
    r.fail("unsupported quant_method '" + method +
           "' in quantization_config (supported: fp8)");
  q.method = QuantizationConfig::Method::Fp8;
  q.fmt = r.optString("fmt", "e4m3");
  if (!r.failed() && q.fmt != "e4m3")
    r.fail("unsupported FP8 fmt '" + q.fmt +
           "' in quantization_config (supported: e4m3)");
  q.scale_fmt = r.optString("scale_fmt");
  q.activation_scheme = r.optString("activation_scheme", "dynamic");
  if (const json::Value *bs = r.optional("weight_block_size")) {
    q.weight_block_size = r.asIntList("weight_block_size", bs);
    if (!r.failed() &&
        (q.weight_block_size.size() != 2 || q.weight_block_size[0] <= 0 ||
         q.weight_block_size[1] <= 0))
      r.fail("field 'quantization_config.weight_block_size' must be two "
             "positive integers [rows, cols], found " +
             formatv("{0}", *bs).str());
  } else {
    q.weight_block_size = {128, 128};
  }
  if (const json::Value *m = r.optional("modules_to_not_convert")) {
    const json::Array *a = m->getAsArray();
    if (!a) {
      r.typeError("modules_to_not_convert", "an array of strings", *m);
    } else {
      for (const json::Value &e : *a) {
        if (std::optional<StringRef> s = e.getAsString()) {
          q.modules_to_not_convert.push_back(s->str());
        } else {
          r.typeError("modules_to_not_convert", "an array of strings", e);
          break;
        }
      }
    }
  }
}

/// The fields every family has: architectures, dtype, the model's sizes,
/// its token ids, RoPE scaling and quantization.
void parseSharedFields(FieldReader &r, ModelDesc &d) {
  if (const json::Value *a = r.optional("architectures")) {
    const json::Array *arr = a->getAsArray();
    if (!arr)
      r.typeError("architectures", "an array of strings", *a);
    else
      for (const json::Value &e : *arr)
        if (std::optional<StringRef> s = e.getAsString())
          d.architectures.push_back(s->str());
  }
  d.torch_dtype =
      r.has("torch_dtype") ? r.optString("torch_dtype") : r.optString("dtype");

  d.hidden_size = r.reqInt("hidden_size");
  d.num_layers = r.reqInt("num_hidden_layers");
  d.vocab_size = r.reqInt("vocab_size");
  d.num_attention_heads = r.reqInt("num_attention_heads");
  d.num_kv_heads = r.optInt("num_key_value_heads", d.num_attention_heads);
  d.rms_norm_eps = r.optDouble("rms_norm_eps", 1e-6);
  d.rope_theta = r.optDouble("rope_theta", 10000.0);
  d.tie_word_embeddings = r.optBool("tie_word_embeddings", false);
  d.max_position_embeddings = r.optInt("max_position_embeddings", 0);
  d.bos_token_id = r.maybeInt("bos_token_id");
  if (const json::Value *eos = r.optional("eos_token_id")) {
    if (eos->getAsArray())
      d.eos_token_ids = r.asIntList("eos_token_id", eos);
    else if (std::optional<int64_t> i = eos->getAsInteger())
      d.eos_token_ids = {*i};
    else
      r.typeError("eos_token_id", "an integer or an array of integers", *eos);
  }
  parseRopeScaling(r, d);
  parseQuantization(r, d);
}

/// Bounds far above any real model; they keep tensor lists and parameter
/// counts finite for a hostile or corrupted config.
void checkMax(FieldReader &r, StringRef key, int64_t value, int64_t max) {
  if (!r.failed() && value > max)
    r.fail("field '" + key + "' (" + Twine(value) +
           ") exceeds the supported maximum " + Twine(max));
}
constexpr int64_t kMaxDim = int64_t(1) << 18;

/// Qwen3 and Qwen3-MoE's own fields: the FFN widths, the experts and the
/// head size (hidden / heads unless given).
void parseQwenFields(FieldReader &r, ModelDesc &d) {
  bool moe = d.family == ModelFamily::Qwen3Moe;
  if (moe) {
    d.num_routed_experts = r.reqInt("num_experts");
    d.experts_per_tok = r.reqInt("num_experts_per_tok");
    d.moe_intermediate_size = r.reqInt("moe_intermediate_size");
    d.norm_topk_prob = r.optBool("norm_topk_prob", false);
    d.decoder_sparse_step = r.optInt("decoder_sparse_step", 1);
    d.mlp_only_layers =
        r.asIntList("mlp_only_layers", r.optional("mlp_only_layers"));
    d.scoring_func = "softmax";
    // Dense width only matters if some layer is dense.
    d.intermediate_size = r.optInt("intermediate_size", 0);
  } else {
    d.intermediate_size = r.reqInt("intermediate_size");
  }
  if (!r.failed())
    r.checkPositive("num_attention_heads", d.num_attention_heads);
  if (!r.failed() && !r.has("head_dim") &&
      d.hidden_size % d.num_attention_heads != 0)
    r.fail("field 'hidden_size' (" + Twine(d.hidden_size) +
           ") is not divisible by 'num_attention_heads' (" +
           Twine(d.num_attention_heads) + ") and 'head_dim' is absent");
  if (!r.failed())
    d.head_dim = r.optInt("head_dim", d.hidden_size / d.num_attention_heads);
}

/// DeepSeek-V3(.2)'s own fields: the FFN widths, the experts and their
/// routing, MLA's ranks and head sizes, and the indexer's.
void parseDeepSeekFields(FieldReader &r, ModelDesc &d) {
  d.intermediate_size = r.reqInt("intermediate_size");
  d.moe_intermediate_size = r.reqInt("moe_intermediate_size");
  d.num_routed_experts = r.reqInt("n_routed_experts");
  d.experts_per_tok = r.reqInt("num_experts_per_tok");
  d.n_shared_experts = r.reqInt("n_shared_experts");
  d.first_k_dense_replace = r.reqInt("first_k_dense_replace");
  d.moe_layer_freq = r.optInt("moe_layer_freq", 1);
  d.norm_topk_prob = r.optBool("norm_topk_prob", true);
  d.scoring_func = r.optString("scoring_func", "sigmoid");
  d.topk_method = r.optString("topk_method", "noaux_tc");
  d.n_group = r.optInt("n_group", 1);
  d.topk_group = r.optInt("topk_group", 1);
  d.routed_scaling_factor = r.optDouble("routed_scaling_factor", 1.0);
  // "q_lora_rank": null means queries are projected directly.
  if (r.required("q_lora_rank"))
    d.q_lora_rank = r.optInt("q_lora_rank", 0);
  d.kv_lora_rank = r.reqInt("kv_lora_rank");
  d.qk_nope_head_dim = r.reqInt("qk_nope_head_dim");
  d.qk_rope_head_dim = r.reqInt("qk_rope_head_dim");
  d.v_head_dim = r.reqInt("v_head_dim");
  checkMax(r, "qk_nope_head_dim", d.qk_nope_head_dim, 65536);
  checkMax(r, "qk_rope_head_dim", d.qk_rope_head_dim, 65536);
  checkMax(r, "v_head_dim", d.v_head_dim, 65536);
  if (!r.failed())
    d.head_dim = d.qk_nope_head_dim + d.qk_rope_head_dim;
  d.num_nextn_predict_layers = r.optInt("num_nextn_predict_layers", 0);
  if (d.hasIndexer()) {
    d.index_n_heads = r.reqInt("index_n_heads");
    d.index_head_dim = r.reqInt("index_head_dim");
    d.index_topk = r.reqInt("index_topk");
  }
}

/// Every size under its supported maximum.
void checkBounds(FieldReader &r, const ModelDesc &d) {
  checkMax(r, "hidden_size", d.hidden_size, kMaxDim);
  checkMax(r, "num_hidden_layers", d.num_layers, 1024);
  checkMax(r, "vocab_size", d.vocab_size, int64_t(1) << 22);
  checkMax(r, "num_attention_heads", d.num_attention_heads, 4096);
  checkMax(r, "head_dim", d.head_dim, 65536);
  checkMax(r, "intermediate_size", d.intermediate_size, kMaxDim);
  checkMax(r, "moe_intermediate_size", d.moe_intermediate_size, kMaxDim);
  checkMax(r, d.isQwen() ? "num_experts" : "n_routed_experts",
           d.num_routed_experts, 4096);
  checkMax(r, "n_shared_experts", d.n_shared_experts, 64);
  checkMax(r, "q_lora_rank", d.q_lora_rank, kMaxDim);
  checkMax(r, "kv_lora_rank", d.kv_lora_rank, kMaxDim);
  checkMax(r, "index_n_heads", d.index_n_heads, 4096);
  checkMax(r, "index_head_dim", d.index_head_dim, 65536);
}

/// DeepSeek's values that later stages divide by or index with: MLA's
/// sizes, the expert groups and the indexer's.
void checkDeepSeekValues(FieldReader &r, const ModelDesc &d) {
  r.checkPositive("n_shared_experts", d.n_shared_experts, true);
  r.checkPositive("first_k_dense_replace", d.first_k_dense_replace, true);
  r.checkPositive("q_lora_rank", d.q_lora_rank, true);
  r.checkPositive("kv_lora_rank", d.kv_lora_rank);
  r.checkPositive("qk_nope_head_dim", d.qk_nope_head_dim);
  r.checkPositive("qk_rope_head_dim", d.qk_rope_head_dim);
  r.checkPositive("v_head_dim", d.v_head_dim);
  r.checkPositive("n_group", d.n_group);
  r.checkPositive("topk_group", d.topk_group);
  if (!r.failed() && d.num_routed_experts % d.n_group != 0)
    r.fail("field 'n_group' (" + Twine(d.n_group) +
           ") must divide 'n_routed_experts' (" + Twine(d.num_routed_experts) +
           ")");
  if (!r.failed() && d.topk_group > d.n_group)
    r.fail("field 'topk_group' (" + Twine(d.topk_group) +
           ") exceeds 'n_group' (" + Twine(d.n_group) + ")");
  if (d.hasIndexer()) {
    r.checkPositive("index_n_heads", d.index_n_heads);
    r.checkPositive("index_head_dim", d.index_head_dim);
    r.checkPositive("index_topk", d.index_topk);
    if (!r.failed() && d.index_head_dim < d.qk_rope_head_dim)
      r.fail("field 'index_head_dim' (" + Twine(d.index_head_dim) +
             ") is smaller than 'qk_rope_head_dim' (" +
             Twine(d.qk_rope_head_dim) + ")");
  }
}

/// Semantic checks: values every later stage divides by or indexes with.
void checkValues(FieldReader &r, const ModelDesc &d, StringRef modelType) {
  r.checkPositive("hidden_size", d.hidden_size);
  r.checkPositive("num_hidden_layers", d.num_layers);
  r.checkPositive("vocab_size", d.vocab_size);
  r.checkPositive("num_attention_heads", d.num_attention_heads);
  r.checkPositive("num_key_value_heads", d.num_kv_heads);
  r.checkPositive("head_dim", d.head_dim);
  if (!r.failed() && d.num_attention_heads % d.num_kv_heads != 0)
    r.fail("field 'num_key_value_heads' (" + Twine(d.num_kv_heads) +
           ") must divide 'num_attention_heads' (" +
           Twine(d.num_attention_heads) + ")");
  if (d.family != ModelFamily::Qwen3) {
    StringRef expertsKey = d.isQwen() ? "num_experts" : "n_routed_experts";
    r.checkPositive(expertsKey, d.num_routed_experts);
    r.checkPositive("num_experts_per_tok", d.experts_per_tok);
    r.checkPositive("moe_intermediate_size", d.moe_intermediate_size);
    if (!r.failed() && d.experts_per_tok > d.num_routed_experts)
      r.fail("field 'num_experts_per_tok' (" + Twine(d.experts_per_tok) +
             ") exceeds '" + expertsKey + "' (" + Twine(d.num_routed_experts) +
             ")");
    r.checkPositive("decoder_sparse_step", d.decoder_sparse_step);
    r.checkPositive("moe_layer_freq", d.moe_layer_freq);
  }
  if (d.isQwen()) {
    for (int64_t l : d.mlp_only_layers)
      if (!r.failed() && (l < 0 || l >= d.num_layers))
        r.fail("field 'mlp_only_layers' entry " + Twine(l) +
               " is not a layer index (num_hidden_layers " +
               Twine(d.num_layers) + ")");
  } else {
    checkDeepSeekValues(r, d);
  }
  // A dense layer needs a dense width (optional for an all-MoE Qwen3-MoE).
  if (!r.failed() && d.numDenseLayers() > 0) {
    if (!r.has("intermediate_size"))
      r.fail("missing required field 'intermediate_size' (needed for "
             "family " +
             modelType + ": layers " + Twine(d.numDenseLayers()) + " of " +
             Twine(d.num_layers) + " are dense)");
    r.checkPositive("intermediate_size", d.intermediate_size);
  }
}

} // namespace

Expected<ModelDesc> parseModelConfig(const json::Value &config,
                                     StringRef source) {
  const json::Object *root = config.getAsObject();
  if (!root)
    return createStringError(
        inconvertibleErrorCode(), "%s: config must be a JSON object, found %s",
        source.str().c_str(), jsonKindName(config).str().c_str());

  // model_type picks the family (and the required fields).
  ParseDiag headDiag{source.str(), "any", ""};
  FieldReader head(*root, headDiag);
  std::string modelType =
      head.asString("model_type", head.required("model_type"), "");
  if (head.failed())
    return head.takeError();
  std::optional<ModelFamily> family = parseModelType(modelType);
  if (!family)
    return createStringError(inconvertibleErrorCode(),
                             "%s: unsupported model_type '%s' (supported: %s)",
                             source.str().c_str(), modelType.c_str(),
                             supportedModelTypeList().c_str());

  ModelDesc d;
  d.family = *family;
  ParseDiag diag{source.str(), modelType, ""};
  FieldReader r(*root, diag);
  parseSharedFields(r, d);
  if (d.isQwen())
    parseQwenFields(r, d);
  else
    parseDeepSeekFields(r, d);
  if (r.failed())
    return r.takeError();
  checkBounds(r, d);
  checkValues(r, d, modelType);
  if (r.failed())
    return r.takeError();
  return d;
}

Expected<ModelDesc> parseModelConfigText(StringRef text, StringRef source) {
  Expected<json::Value> v = json::parse(text);
  if (!v)
    return createStringError(inconvertibleErrorCode(), "%s: not valid JSON: %s",
                             source.str().c_str(),
                             toString(v.takeError()).c_str());
  return parseModelConfig(*v, source);
}

Expected<ModelDesc> loadModelConfig(StringRef path) {
  ErrorOr<std::unique_ptr<MemoryBuffer>> buf =
      MemoryBuffer::getFile(path, /*IsText=*/true);
  if (!buf)
    return createStringError(buf.getError(), "%s: cannot read: %s",
                             path.str().c_str(),
                             buf.getError().message().c_str());
  return parseModelConfigText((*buf)->getBuffer(), path);
}

//===----------------------------------------------------------------------===//
// Expected tensors
//===----------------------------------------------------------------------===//

namespace {
class TensorListBuilder {
public:
  explicit TensorListBuilder(std::vector<ExpectedTensor> &out) : out_(out) {}

  void add(std::string name, std::vector<int64_t> shape, TensorRole role,
           int64_t layer, bool fp8Eligible = false, bool optional = false) {
    ExpectedTensor t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.role = role;
    t.layer = layer;
    t.fp8_eligible = fp8Eligible;
    t.optional = optional;
    out_.push_back(std::move(t));
  }
  /// A Linear weight stored [out, in]; FP8-eligible.
  void linear(std::string name, int64_t out, int64_t in, TensorRole role,
              int64_t layer) {
    add(std::move(name), {out, in}, role, layer, /*fp8Eligible=*/true);
  }
  /// gate_proj/up_proj [inter, hidden] and down_proj [hidden, inter].
  void mlp(const std::string &prefix, int64_t hidden, int64_t inter,
           TensorRole role, int64_t layer) {
    linear(prefix + "gate_proj.weight", inter, hidden, role, layer);
    linear(prefix + "up_proj.weight", inter, hidden, role, layer);
    linear(prefix + "down_proj.weight", hidden, inter, role, layer);
  }

private:
  std::vector<ExpectedTensor> &out_;
};

/// A Qwen layer's attention: q/k/v/o projections and the q/k norms.
void addQwenAttention(TensorListBuilder &b, const ModelDesc &d,
                      const std::string &a, int64_t l) {
  const int64_t H = d.hidden_size;
  const int64_t q = d.num_attention_heads * d.head_dim;
  const int64_t kv = d.num_kv_heads * d.head_dim;
  b.linear(a + "q_proj.weight", q, H, TensorRole::Attention, l);
  b.linear(a + "k_proj.weight", kv, H, TensorRole::Attention, l);
  b.linear(a + "v_proj.weight", kv, H, TensorRole::Attention, l);
  b.linear(a + "o_proj.weight", H, q, TensorRole::Attention, l);
  b.add(a + "q_norm.weight", {d.head_dim}, TensorRole::Norm, l);
  b.add(a + "k_norm.weight", {d.head_dim}, TensorRole::Norm, l);
}

/// A DeepSeek layer's MLA: the query (LoRA or direct), the kv latent, the
/// output projection, and with V3.2 the indexer.
void addMlaAttention(TensorListBuilder &b, const ModelDesc &d,
                     const std::string &a, int64_t l) {
  const int64_t H = d.hidden_size;
  const int64_t heads = d.num_attention_heads;
  const int64_t qk = d.qk_nope_head_dim + d.qk_rope_head_dim;
  if (d.q_lora_rank > 0) {
    b.linear(a + "q_a_proj.weight", d.q_lora_rank, H, TensorRole::Attention,
             l);
    b.add(a + "q_a_layernorm.weight", {d.q_lora_rank}, TensorRole::Norm, l);
    b.linear(a + "q_b_proj.weight", heads * qk, d.q_lora_rank,
             TensorRole::Attention, l);
  } else {
    b.linear(a + "q_proj.weight", heads * qk, H, TensorRole::Attention, l);
  }
  b.linear(a + "kv_a_proj_with_mqa.weight",
           d.kv_lora_rank + d.qk_rope_head_dim, H, TensorRole::Attention, l);
  b.add(a + "kv_a_layernorm.weight", {d.kv_lora_rank}, TensorRole::Norm, l);
  b.linear(a + "kv_b_proj.weight", heads * (d.qk_nope_head_dim + d.v_head_dim),
           d.kv_lora_rank, TensorRole::Attention, l);
  b.linear(a + "o_proj.weight", H, heads * d.v_head_dim, TensorRole::Attention,
           l);
  if (d.hasIndexer()) {
    const std::string ix = a + "indexer.";
    // The indexer's queries come from the q LoRA latent.
    int64_t qIn = d.q_lora_rank > 0 ? d.q_lora_rank : H;
    b.linear(ix + "wq_b.weight", d.index_n_heads * d.index_head_dim, qIn,
             TensorRole::Indexer, l);
    b.linear(ix + "wk.weight", d.index_head_dim, H, TensorRole::Indexer, l);
    b.add(ix + "k_norm.weight", {d.index_head_dim}, TensorRole::Norm, l);
    b.add(ix + "k_norm.bias", {d.index_head_dim}, TensorRole::Norm, l);
    b.add(ix + "weights_proj.weight", {d.index_n_heads, H},
          TensorRole::Indexer, l);
  }
}

/// A layer's FFN: a dense MLP, or the router, every expert and the shared
/// experts.
void addFfn(TensorListBuilder &b, const ModelDesc &d, const std::string &m,
            int64_t l) {
  const int64_t H = d.hidden_size;
  if (!d.isMoeLayer(l)) {
    b.mlp(m, H, d.intermediate_size, TensorRole::DenseFfn, l);
    return;
  }
  const int64_t E = d.num_routed_experts;
  b.add(m + "gate.weight", {E, H}, TensorRole::Router, l);
  if (d.topk_method == "noaux_tc")
    b.add(m + "gate.e_score_correction_bias", {E}, TensorRole::Router, l);
  for (int64_t e = 0; e < E; ++e)
    b.mlp(m + "experts." + std::to_string(e) + ".", H, d.moe_intermediate_size,
          TensorRole::RoutedExpert, l);
  if (d.n_shared_experts > 0)
    b.mlp(m + "shared_experts.", H,
          d.n_shared_experts * d.moe_intermediate_size,
          TensorRole::SharedExpert, l);
}
} // namespace

std::vector<ExpectedTensor> expectedTensors(const ModelDesc &d) {
  std::vector<ExpectedTensor> out;
  TensorListBuilder b(out);
  const int64_t H = d.hidden_size;
  b.add("model.embed_tokens.weight", {d.vocab_size, H}, TensorRole::Embedding,
        -1);

  for (int64_t l = 0; l < d.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    b.add(p + "input_layernorm.weight", {H}, TensorRole::Norm, l);
    if (d.isQwen())
      addQwenAttention(b, d, a, l);
    else
      addMlaAttention(b, d, a, l);
    b.add(p + "post_attention_layernorm.weight", {H}, TensorRole::Norm, l);
    addFfn(b, d, p + "mlp.", l);
  }

  b.add("model.norm.weight", {H}, TensorRole::Norm, -1);
  b.add("lm_head.weight", {d.vocab_size, H}, TensorRole::LmHead, -1,
        /*fp8Eligible=*/false, /*optional=*/d.tie_word_embeddings);
  return out;
}

std::vector<ExpectedTensor> mtpTensors(const ModelDesc &d) {
  std::vector<ExpectedTensor> out;
  if (!d.isDeepSeek() || d.num_nextn_predict_layers < 1)
    return out;
  TensorListBuilder b(out);
  const int64_t H = d.hidden_size, l = d.num_layers;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  b.add(p + "embed_tokens.weight", {d.vocab_size, H}, TensorRole::Embedding, l);
  b.add(p + "enorm.weight", {H}, TensorRole::Norm, l);
  b.add(p + "hnorm.weight", {H}, TensorRole::Norm, l);
  b.linear(p + "eh_proj.weight", H, 2 * H, TensorRole::Attention, l);
  b.add(p + "input_layernorm.weight", {H}, TensorRole::Norm, l);
  addMlaAttention(b, d, p + "self_attn.", l);
  b.add(p + "post_attention_layernorm.weight", {H}, TensorRole::Norm, l);
  addFfn(b, d, p + "mlp.", l);
  b.add(p + "shared_head.norm.weight", {H}, TensorRole::Norm, l);
  b.add(p + "shared_head.head.weight", {d.vocab_size, H}, TensorRole::LmHead,
        l);
  return out;
}

bool isSkippedMtpTensor(const ModelDesc &d, StringRef name) {
  if (!d.isDeepSeek() || !name.consume_front("model.layers."))
    return false;
  int64_t layer;
  StringRef digits = name.take_until([](char c) { return c == '.'; });
  if (digits.getAsInteger(10, layer))
    return false;
  return layer >= d.num_layers;
}

ParamCounts countParams(const ModelDesc &d) {
  ParamCounts c;
  for (const ExpectedTensor &t : expectedTensors(d)) {
    if (t.optional)
      continue; // a tied lm_head shares embed_tokens
    int64_t n = numElements(t.shape);
    c.total += n;
    switch (t.role) {
    case TensorRole::Embedding:
    case TensorRole::LmHead:
      c.embedding += n;
      break;
    case TensorRole::RoutedExpert:
      c.routed_experts += n;
      c.ffn += n;
      break;
    case TensorRole::DenseFfn:
    case TensorRole::SharedExpert:
      c.ffn += n;
      break;
    default:
      break;
    }
  }
  c.activated = c.total - c.routed_experts;
  if (d.num_routed_experts > 0)
    c.activated += c.routed_experts / d.num_routed_experts * d.experts_per_tok;
  return c;
}

} // namespace mlir::duck::import
