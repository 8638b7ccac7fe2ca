//===- Checkpoint.cpp - A HF model directory: config + weights ------------===//
//
// Directory layouts and the FP8 sibling rule follow reference/TENSORS.md and
// reference/FORMATS.md; the describe report is what `duckc describe` prints.
//
//===----------------------------------------------------------------------===//

#include "duck/Import/Checkpoint.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <algorithm>

using namespace llvm;

namespace mlir::duck::import {

namespace {
Error makeError(const Twine &msg) {
  return createStringError(inconvertibleErrorCode(), msg.str());
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string joinPath(StringRef dir, StringRef name) {
  SmallString<256> p(dir);
  sys::path::append(p, name);
  return std::string(p);
}
} // namespace

StringRef weightLayoutName(WeightLayout layout) {
  switch (layout) {
  case WeightLayout::None:
    return "none";
  case WeightLayout::SingleFile:
    return "single-file";
  case WeightLayout::Index:
    return "sharded-index";
  case WeightLayout::Loose:
    return "loose-files";
  }
  llvm_unreachable("unknown WeightLayout");
}

//===----------------------------------------------------------------------===//
// Opening a directory
//===----------------------------------------------------------------------===//

Expected<std::unique_ptr<Checkpoint>> Checkpoint::open(StringRef directory) {
  if (!sys::fs::exists(directory))
    return makeError(directory + ": no such file or directory");
  if (!sys::fs::is_directory(directory))
    return makeError(directory +
                     ": not a directory (expected a model directory "
                     "holding config.json and optional *.safetensors)");

  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->directory_ = directory.str();
  ckpt->config_path_ = joinPath(directory, "config.json");
  if (!sys::fs::exists(ckpt->config_path_))
    return makeError(directory + ": no config.json in the model directory");
  Expected<ModelDesc> desc = loadModelConfig(ckpt->config_path_);
  if (!desc)
    return desc.takeError();
  ckpt->model_ = std::move(*desc);
  if (Error err = ckpt->openWeights())
    return err;
  return ckpt;
}

Error Checkpoint::openWeights() {
  std::string index = joinPath(directory_, "model.safetensors.index.json");
  if (sys::fs::exists(index)) {
    layout_ = WeightLayout::Index;
    return openIndex(index);
  }
  std::string single = joinPath(directory_, "model.safetensors");
  if (sys::fs::exists(single)) {
    layout_ = WeightLayout::SingleFile;
    return addFile(single);
  }

  std::vector<std::string> loose;
  std::error_code ec;
  for (sys::fs::directory_iterator it(directory_, ec), end; it != end && !ec;
       it.increment(ec))
    if (sys::path::extension(it->path()) == ".safetensors")
      loose.push_back(it->path());
  if (ec)
    return makeError(directory_ + ": cannot list directory: " + ec.message());
  llvm::sort(loose);
  for (const std::string &path : loose)
    if (Error err = addFile(path))
      return err;
  layout_ = loose.empty() ? WeightLayout::None : WeightLayout::Loose;
  return Error::success();
}

Error Checkpoint::addFile(StringRef path) {
  Expected<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(path);
  if (!file)
    return file.takeError();
  const SafetensorsFile *f = file->get();
  for (const TensorInfo &t : f->tensors()) {
    auto [it, inserted] = by_name_.try_emplace(t.name, TensorRef{&t, f});
    if (!inserted)
      return makeError(path + ": tensor '" + t.name + "' also appears in " +
                       it->second.file->path());
  }
  for (const std::string &note : f->notes())
    notes_.push_back((path + ": " + note).str());
  files_.push_back(std::move(*file));
  return Error::success();
}

Error Checkpoint::openIndex(StringRef indexPath) {
  ErrorOr<std::unique_ptr<MemoryBuffer>> buf =
      MemoryBuffer::getFile(indexPath, /*IsText=*/true);
  if (!buf)
    return makeError(indexPath + ": cannot read: " + buf.getError().message());
  Expected<json::Value> root = json::parse((*buf)->getBuffer());
  if (!root)
    return makeError(indexPath +
                     ": not valid JSON: " + toString(root.takeError()));
  const json::Object *obj = root->getAsObject();
  if (!obj)
    return makeError(indexPath + ": must be a JSON object, found " +
                     jsonKindName(*root));
  const json::Value *mapV = obj->get("weight_map");
  if (!mapV)
    return makeError(indexPath + ": missing field 'weight_map'");
  const json::Object *map = mapV->getAsObject();
  if (!map)
    return makeError(indexPath +
                     ": field 'weight_map' must be an object (tensor -> "
                     "shard file), found " +
                     jsonKindName(*mapV));

  // Sorted so the first error reported does not depend on hashing.
  std::map<std::string, std::string> tensorToShard;
  for (const auto &kv : *map) {
    std::optional<StringRef> shard = kv.second.getAsString();
    if (!shard)
      return makeError(indexPath + ": weight_map entry for tensor '" +
                       kv.first.str() +
                       "' must be a string (shard file), "
                       "found " +
                       jsonKindName(kv.second));
    tensorToShard[kv.first.str()] = shard->str();
  }

  std::map<std::string, const SafetensorsFile *> shards;
  for (const auto &[tensor, shard] : tensorToShard) {
    if (shards.count(shard))
      continue;
    std::string path = joinPath(directory_, shard);
    if (!sys::fs::exists(path))
      return makeError(indexPath + ": tensor '" + tensor + "' maps to shard '" +
                       shard + "', which does not exist in " + directory_);
    shards[shard] = nullptr;
  }
  for (auto &[shard, file] : shards) {
    if (Error err = addFile(joinPath(directory_, shard)))
      return err;
    file = files_.back().get();
  }
  for (const auto &[tensor, shard] : tensorToShard)
    if (!shards[shard]->contains(tensor))
      return makeError(indexPath + ": tensor '" + tensor +
                       "' is listed in shard '" + shard +
                       "' but that file does not contain it");
  size_t unlisted = by_name_.size() - tensorToShard.size();
  if (unlisted)
    notes_.push_back(
        formatv("{0}: {1} tensors in the shards are not listed in the index",
                indexPath, unlisted)
            .str());
  return Error::success();
}

std::vector<TensorRef> Checkpoint::tensors() const {
  std::vector<TensorRef> out;
  out.reserve(by_name_.size());
  for (const auto &kv : by_name_)
    out.push_back(kv.second);
  return out;
}

TensorRef Checkpoint::find(StringRef name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? TensorRef{} : it->second;
}

std::optional<Fp8Weight> Checkpoint::findFp8(StringRef weightName) const {
  TensorRef w = find(weightName);
  if (!w || w.info->dtype != DType::F8_E4M3)
    return std::nullopt;
  TensorRef s = find((weightName + "_scale_inv").str());
  if (!s || (s.info->dtype != DType::F32 && s.info->dtype != DType::BF16))
    return std::nullopt;
  return Fp8Weight{w, s, s.info->dtype};
}

//===----------------------------------------------------------------------===//
// Checking against the config
//===----------------------------------------------------------------------===//

namespace {
/// Every tensor the config implies is there with its shape: counts them in
/// `result` and collects their names in `expectedNames`.
Error checkExpectedTensors(const Checkpoint &ckpt, CheckpointCheck &result,
                           StringSet<> &expectedNames) {
  const ModelDesc &d = ckpt.model();
  StringRef family = modelTypeName(d.family);
  for (const ExpectedTensor &t : expectedTensors(d)) {
    expectedNames.insert(t.name);
    if (!t.optional)
      ++result.expected;
    TensorRef ref = ckpt.find(t.name);
    if (!ref) {
      if (t.optional)
        continue;
      return makeError(ckpt.directory() + ": checkpoint is missing tensor '" +
                       t.name + "' (shape " + formatShape(t.shape) +
                       ", required by family " + family + ")");
    }
    if (ref.info->shape != t.shape)
      return makeError(ref.file->path() + ": tensor '" + t.name +
                       "' has shape " + formatShape(ref.info->shape) +
                       ", expected " + formatShape(t.shape) + " from " +
                       ckpt.configPath());
    ++result.found;
  }
  return Error::success();
}

/// An FP8 weight is 2-D and has its "_scale_inv" sibling: F32 or BF16, one
/// value a `block` tile.
Error checkFp8Scale(const Checkpoint &ckpt, const TensorRef &ref,
                    ArrayRef<int64_t> block) {
  const TensorInfo &t = *ref.info;
  std::string scaleName = t.name + "_scale_inv";
  TensorRef scale = ckpt.find(scaleName);
  if (!scale)
    return makeError(ref.file->path() + ": FP8 weight '" + t.name +
                     "' (F8_E4M3 " + formatShape(t.shape) +
                     ") has no scale tensor '" + scaleName + "'");
  if (t.shape.size() != 2)
    return makeError(ref.file->path() + ": FP8 weight '" + t.name +
                     "' must be 2-D [N, K], found shape " +
                     formatShape(t.shape));
  DType sd = scale.info->dtype;
  if (sd != DType::F32 && sd != DType::BF16)
    return makeError(scale.file->path() + ": scale tensor '" + scaleName +
                     "' has dtype " + dtypeName(sd) + ", expected F32 or BF16");
  std::vector<int64_t> want = {ceilDiv(t.shape[0], block[0]),
                               ceilDiv(t.shape[1], block[1])};
  if (scale.info->shape != want)
    return makeError(scale.file->path() + ": scale tensor '" + scaleName +
                     "' has shape " + formatShape(scale.info->shape) +
                     ", expected " + formatShape(want) + " for FP8 weight " +
                     formatShape(t.shape) + " with " + Twine(block[0]) + "x" +
                     Twine(block[1]) + " blocks");
  return Error::success();
}
} // namespace

Expected<CheckpointCheck> verifyCheckpoint(const Checkpoint &ckpt) {
  CheckpointCheck result;
  if (!ckpt.hasWeights())
    return result;
  const ModelDesc &d = ckpt.model();

  StringSet<> expectedNames;
  if (Error e = checkExpectedTensors(ckpt, result, expectedNames))
    return e;

  std::vector<int64_t> block = d.quantization.weight_block_size;
  if (block.size() != 2)
    block = {128, 128};
  for (const TensorRef &ref : ckpt.tensors()) {
    const TensorInfo &t = *ref.info;
    if (isSkippedMtpTensor(d, t.name)) {
      ++result.mtp_skipped;
      continue;
    }
    if (t.dtype == DType::F8_E4M3) {
      if (Error e = checkFp8Scale(ckpt, ref, block))
        return e;
      ++result.fp8_weights;
      continue;
    }
    StringRef name = t.name;
    if (name.ends_with("_scale_inv")) {
      TensorRef w = ckpt.find(name.drop_back(strlen("_scale_inv")));
      if (w && w.info->dtype == DType::F8_E4M3)
        continue; // checked with its weight
    }
    if (!expectedNames.contains(name)) {
      ++result.unexpected;
      if (result.unexpected_examples.size() < 3)
        result.unexpected_examples.push_back(t.name);
    }
  }

  if (d.quantization.isFp8() && result.fp8_weights == 0)
    result.notes.push_back("config.json declares fp8 quantization but no "
                           "F8_E4M3 weights were found");
  if (!d.quantization.isFp8() && result.fp8_weights > 0)
    result.notes.push_back("F8_E4M3 weights found but config.json has no "
                           "fp8 quantization_config");
  return result;
}

//===----------------------------------------------------------------------===//
// Describe report
//===----------------------------------------------------------------------===//

void DescribeReport::add(StringRef section, StringRef key, json::Value value,
                         StringRef hint) {
  if (sections_.empty() || sections_.back().name != section)
    sections_.push_back(Section{section.str(), {}});
  sections_.back().entries.push_back(
      Entry{key.str(), std::move(value), hint.str()});
}

const json::Value *DescribeReport::get(StringRef key) const {
  for (const Section &s : sections_)
    for (const Entry &e : s.entries)
      if (e.key == key)
        return &e.value;
  return nullptr;
}

namespace {
void printTextValue(raw_ostream &os, const json::Value &v) {
  switch (v.kind()) {
  case json::Value::Null:
    os << "none";
    return;
  case json::Value::Boolean:
    os << (*v.getAsBoolean() ? "true" : "false");
    return;
  case json::Value::String:
    os << *v.getAsString();
    return;
  case json::Value::Number:
    if (std::optional<int64_t> i = v.getAsInteger())
      os << *i;
    else
      os << format("%g", *v.getAsNumber());
    return;
  case json::Value::Array: {
    os << "[";
    ListSeparator sep;
    for (const json::Value &e : *v.getAsArray()) {
      os << sep;
      printTextValue(os, e);
    }
    os << "]";
    return;
  }
  case json::Value::Object:
    os << v;
    return;
  }
}
} // namespace

void DescribeReport::printText(raw_ostream &os) const {
  for (const Section &s : sections_)
    for (const Entry &e : s.entries) {
      os << e.key << ": ";
      printTextValue(os, e.value);
      if (!e.hint.empty())
        os << " " << e.hint;
      os << "\n";
    }
}

json::Value DescribeReport::toJson() const {
  json::Object root;
  for (const Section &s : sections_) {
    json::Object sec;
    for (const Entry &e : s.entries)
      sec[e.key] = e.value;
    root[s.name] = std::move(sec);
  }
  return root;
}

namespace {
/// "30.53B" style, for text hints.
std::string humanCount(int64_t n) {
  double v = static_cast<double>(n);
  if (v >= 1e9)
    return formatv("({0:F2}B)", v / 1e9).str();
  if (v >= 1e6)
    return formatv("({0:F2}M)", v / 1e6).str();
  if (v >= 1e3)
    return formatv("({0:F2}K)", v / 1e3).str();
  return "";
}

std::string humanBytes(uint64_t n) {
  double v = static_cast<double>(n);
  if (v >= double(1ull << 30))
    return formatv("({0:F2} GiB)", v / double(1ull << 30)).str();
  if (v >= double(1ull << 20))
    return formatv("({0:F2} MiB)", v / double(1ull << 20)).str();
  if (v >= double(1ull << 10))
    return formatv("({0:F2} KiB)", v / double(1ull << 10)).str();
  return "";
}

/// Layers matching `pred` as "0-2,5", or "none".
template <typename Pred> std::string layerRanges(int64_t numLayers, Pred pred) {
  std::string out;
  for (int64_t l = 0; l < numLayers;) {
    if (!pred(l)) {
      ++l;
      continue;
    }
    int64_t first = l;
    while (l < numLayers && pred(l))
      ++l;
    if (!out.empty())
      out += ",";
    out += std::to_string(first);
    if (l - 1 > first)
      out += "-" + std::to_string(l - 1);
  }
  return out.empty() ? "none" : out;
}

json::Array toJsonArray(ArrayRef<int64_t> values) {
  json::Array a;
  for (int64_t v : values)
    a.push_back(v);
  return a;
}

std::string routerSummary(const ModelDesc &d) {
  std::string s = formatv("{0} top-{1} of {2}", d.scoring_func,
                          d.experts_per_tok, d.num_routed_experts)
                      .str();
  if (d.isDeepSeek() && d.n_group > 1)
    s += formatv(", {0} groups keep {1}", d.n_group, d.topk_group).str();
  if (!d.topk_method.empty())
    s += " (" + d.topk_method + ")";
  if (d.norm_topk_prob)
    s += ", normalized";
  if (d.routed_scaling_factor != 1.0)
    s += formatv(", scaled x{0}", d.routed_scaling_factor).str();
  return s;
}


/// about: the model's directory name, family, architectures and dtype.
void describeAbout(DescribeReport &r, const Checkpoint &ckpt) {
  const ModelDesc &d = ckpt.model();
  StringRef dir = sys::path::filename(
      StringRef(ckpt.directory()).rtrim(sys::path::get_separator()));
  r.add("about", "model", dir.empty() ? ckpt.directory() : dir);
  r.add("about", "family", modelTypeName(d.family));
  json::Array archs;
  for (const std::string &a : d.architectures)
    archs.push_back(a);
  r.add("about", "architectures", std::move(archs));
  r.add("about", "torch_dtype",
        d.torch_dtype.empty() ? json::Value(nullptr)
                              : json::Value(d.torch_dtype));
}

/// sizes and layers: the model's widths and token ids, which layers are
/// MoE and which dense.
void describeSizesAndLayers(DescribeReport &r, const ModelDesc &d) {
  r.add("sizes", "hidden_size", d.hidden_size);
  r.add("sizes", "vocab_size", d.vocab_size);
  r.add("sizes", "max_position_embeddings", d.max_position_embeddings);
  r.add("sizes", "rms_norm_eps", d.rms_norm_eps);
  r.add("sizes", "tie_word_embeddings", d.tie_word_embeddings);
  r.add("sizes", "bos_token_id",
        d.bos_token_id ? json::Value(*d.bos_token_id) : json::Value(nullptr));
  r.add("sizes", "eos_token_ids", toJsonArray(d.eos_token_ids));

  r.add("layers", "num_layers", d.num_layers);
  r.add("layers", "moe_layers", d.numMoeLayers());
  r.add("layers", "dense_layers", d.numDenseLayers());
  r.add("layers", "moe_layer_ids",
        layerRanges(d.num_layers, [&](int64_t l) { return d.isMoeLayer(l); }));
  r.add("layers", "dense_layer_ids",
        layerRanges(d.num_layers, [&](int64_t l) { return !d.isMoeLayer(l); }));
  if (d.isDeepSeek())
    r.add("layers", "mtp_layers", d.num_nextn_predict_layers,
          d.num_nextn_predict_layers > 1    ? "(the first compiled; --mtp)"
          : d.num_nextn_predict_layers == 1 ? "(compiled; --mtp)"
                                            : "");
}

/// attention's RoPE entries: theta and the scaling with its parameters.
void describeRope(DescribeReport &r, const ModelDesc &d) {
  r.add("attention", "rope_theta", d.rope_theta);
  if (!d.rope_scaling) {
    r.add("attention", "rope_scaling", nullptr);
    return;
  }
  const RopeScaling &rs = *d.rope_scaling;
  r.add("attention", "rope_scaling", rs.type.empty() ? "unnamed" : rs.type);
  r.add("attention", "rope_factor", rs.factor);
  if (rs.original_max_position_embeddings)
    r.add("attention", "rope_original_max_position_embeddings",
          *rs.original_max_position_embeddings);
  if (rs.beta_fast)
    r.add("attention", "rope_beta_fast", *rs.beta_fast);
  if (rs.beta_slow)
    r.add("attention", "rope_beta_slow", *rs.beta_slow);
  if (rs.mscale)
    r.add("attention", "rope_mscale", *rs.mscale);
  if (rs.mscale_all_dim)
    r.add("attention", "rope_mscale_all_dim", *rs.mscale_all_dim);
  // What GQA scales cos/sin by (DeepSeek's MLA uses mscale_all_dim on
  // the softmax instead).
  if (rs.isYarn() && d.isQwen())
    r.add("attention", "rope_attention_factor", rs.yarnAttentionFactor());
}

/// attention: its kind (MHA, GQA or MLA), heads and sizes, the indexer's,
/// and RoPE.
void describeAttention(DescribeReport &r, const ModelDesc &d) {
  std::string kind = d.usesMla()                               ? "mla"
                     : d.num_kv_heads == d.num_attention_heads ? "mha"
                                                               : "gqa";
  r.add("attention", "attention", kind);
  r.add("attention", "num_attention_heads", d.num_attention_heads);
  r.add("attention", "num_kv_heads", d.num_kv_heads);
  r.add("attention", "head_dim", d.head_dim);
  if (d.isQwen()) {
    r.add("attention", "qk_norm", true);
  } else {
    r.add("attention", "q_lora_rank", d.q_lora_rank);
    r.add("attention", "kv_lora_rank", d.kv_lora_rank);
    r.add("attention", "qk_nope_head_dim", d.qk_nope_head_dim);
    r.add("attention", "qk_rope_head_dim", d.qk_rope_head_dim);
    r.add("attention", "v_head_dim", d.v_head_dim);
    r.add("attention", "kv_cache_per_token",
          d.kv_lora_rank + d.qk_rope_head_dim, "(latent + rope key)");
  }
  r.add("attention", "indexer", d.hasIndexer());
  if (d.hasIndexer()) {
    r.add("attention", "index_n_heads", d.index_n_heads);
    r.add("attention", "index_head_dim", d.index_head_dim);
    r.add("attention", "index_topk", d.index_topk);
  }
  describeRope(r, d);
}

/// ffn: the dense width, and the experts with their routing.
void describeFfn(DescribeReport &r, const ModelDesc &d) {
  r.add("ffn", "intermediate_size", d.intermediate_size,
        d.numDenseLayers() == 0 ? "(unused: no dense layer)" : "");
  if (!d.hasMoe()) {
    r.add("ffn", "experts", 0);
    return;
  }
  r.add("ffn", "moe_intermediate_size", d.moe_intermediate_size);
  r.add("ffn", "experts", d.num_routed_experts);
  r.add("ffn", "experts_per_tok", d.experts_per_tok);
  r.add("ffn", "shared_experts", d.n_shared_experts);
  r.add("ffn", "router", routerSummary(d));
  r.add("ffn", "norm_topk_prob", d.norm_topk_prob);
  if (d.isQwen()) {
    r.add("ffn", "decoder_sparse_step", d.decoder_sparse_step);
    r.add("ffn", "mlp_only_layers", toJsonArray(d.mlp_only_layers));
  } else {
    r.add("ffn", "first_k_dense_replace", d.first_k_dense_replace);
    r.add("ffn", "moe_layer_freq", d.moe_layer_freq);
    r.add("ffn", "n_group", d.n_group);
    r.add("ffn", "topk_group", d.topk_group);
    r.add("ffn", "routed_scaling_factor", d.routed_scaling_factor);
  }
}

/// quantization and params: the FP8 config, and the parameter counts.
void describeQuantizationAndParams(DescribeReport &r, const ModelDesc &d) {
  const QuantizationConfig &q = d.quantization;
  if (q.isFp8()) {
    r.add("quantization", "quantization", "fp8");
    r.add("quantization", "fp8_fmt", q.fmt);
    r.add("quantization", "weight_block_size",
          formatv("{0}x{1}", q.weight_block_size[0], q.weight_block_size[1])
              .str());
    r.add("quantization", "scale_fmt",
          q.scale_fmt.empty() ? json::Value(nullptr)
                              : json::Value(q.scale_fmt));
    r.add("quantization", "activation_scheme", q.activation_scheme);
  } else {
    r.add("quantization", "quantization", "none");
  }

  ParamCounts pc = countParams(d);
  r.add("params", "params_total", pc.total, humanCount(pc.total));
  r.add("params", "params_embedding", pc.embedding, humanCount(pc.embedding));
  r.add("params", "params_ffn", pc.ffn, humanCount(pc.ffn));
  r.add("params", "params_routed_experts", pc.routed_experts,
        humanCount(pc.routed_experts));
  r.add("params", "params_activated", pc.activated, humanCount(pc.activated));
}

/// The LM head stays on the host and is read whole for every decoded
/// token; duckc compile --lm-head int8 (or fp9) reads 1.125 bytes a weight.
void describeLmHead(DescribeReport &r, const Checkpoint &ckpt) {
  const ModelDesc &d = ckpt.model();
  TensorRef head = ckpt.find(d.tie_word_embeddings ? "model.embed_tokens.weight"
                                                   : "lm_head.weight");
  if (!head)
    return;
  const uint64_t n = (uint64_t)d.vocab_size * (uint64_t)d.hidden_size;
  const uint64_t asIs = head.info->dtype == DType::F8_E4M3
                            ? n + n / 8 // fp9 on the host
                            : head.info->byte_size;
  r.add("weights", "lm_head",
        formatv("{0} [{1}, {2}]{3}, on the host", dtypeName(head.info->dtype),
                d.vocab_size, d.hidden_size,
                d.tie_word_embeddings ? " (the tied embedding)" : "")
            .str());
  r.add("weights", "lm_head_bytes_per_token", static_cast<int64_t>(asIs),
        (humanBytes(asIs) + "; with --lm-head int8 or fp9: " +
         std::to_string(n + n / 8) + " " + humanBytes(n + n / 8))
            .c_str());
}

/// weights: the files, the bytes of each dtype, the FP8 weights and the
/// LM head.
void describeWeights(DescribeReport &r, const Checkpoint &ckpt,
                     const CheckpointCheck &check) {
  r.add("weights", "weight_layout", weightLayoutName(ckpt.layout()));
  r.add("weights", "weight_files", static_cast<int64_t>(ckpt.files().size()));
  r.add("weights", "tensors", static_cast<int64_t>(ckpt.numTensors()));
  std::map<DType, uint64_t> bytesPerDType;
  uint64_t totalBytes = 0;
  for (const TensorRef &t : ckpt.tensors()) {
    bytesPerDType[t.info->dtype] += t.info->byte_size;
    totalBytes += t.info->byte_size;
  }
  r.add("weights", "weight_bytes", static_cast<int64_t>(totalBytes),
        humanBytes(totalBytes));
  for (const auto &[dtype, bytes] : bytesPerDType)
    r.add("weights", ("bytes_" + dtypeName(dtype)).str(),
          static_cast<int64_t>(bytes), humanBytes(bytes));
  r.add("weights", "fp8_weights", static_cast<int64_t>(check.fp8_weights));
  describeLmHead(r, ckpt);
}

/// check: verifyCheckpoint's counts, examples and notes.
void describeCheck(DescribeReport &r, const Checkpoint &ckpt,
                   const CheckpointCheck &check) {
  r.add("check", "check", "ok");
  r.add("check", "expected_tensors", static_cast<int64_t>(check.expected));
  r.add("check", "found_tensors", static_cast<int64_t>(check.found));
  r.add("check", "mtp_tensors", static_cast<int64_t>(check.mtp_skipped));
  r.add("check", "unexpected_tensors", static_cast<int64_t>(check.unexpected));
  json::Array examples;
  for (const std::string &e : check.unexpected_examples)
    examples.push_back(e);
  if (!examples.empty())
    r.add("check", "unexpected_examples", std::move(examples));
  json::Array notes;
  for (const std::string &n : ckpt.notes())
    notes.push_back(n);
  for (const std::string &n : check.notes)
    notes.push_back(n);
  r.add("check", "notes", std::move(notes));
}
} // namespace

Expected<DescribeReport> describeCheckpoint(const Checkpoint &ckpt) {
  const ModelDesc &d = ckpt.model();
  DescribeReport r;
  describeAbout(r, ckpt);
  describeSizesAndLayers(r, d);
  describeAttention(r, d);
  describeFfn(r, d);
  describeQuantizationAndParams(r, d);

  r.add("weights", "weights", ckpt.hasWeights() ? "present" : "none");
  if (!ckpt.hasWeights()) {
    r.add("weights", "check", "skipped (no weights)");
    return r;
  }
  Expected<CheckpointCheck> check = verifyCheckpoint(ckpt);
  if (!check)
    return check.takeError();
  describeWeights(r, ckpt, *check);
  describeCheck(r, ckpt, *check);
  return r;
}

} // namespace mlir::duck::import
