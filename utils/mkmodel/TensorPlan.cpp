//===- TensorPlan.cpp - The tensors of a synthetic checkpoint -------------===//

#include "TensorPlan.h"

#include "Quantize.h"

#include "llvm/Support/FormatVariadic.h"

#include <cassert>
#include <cmath>
#include <cstdio>

namespace duck::mkmodel {

uint64_t PlannedTensor::numElements() const {
  uint64_t n = 1;
  for (int64_t dim : shape)
    n *= static_cast<uint64_t>(dim);
  return n;
}

uint64_t PlannedTensor::byteSize() const {
  unsigned elem = dtype == "F32" ? 4 : dtype == "BF16" ? 2 : 1;
  return numElements() * elem;
}

namespace {

class Planner {
public:
  explicit Planner(const ModelSpec &spec) : spec_(spec) {}

  std::vector<PlannedTensor> run() {
    const ModelSpec &s = spec_;
    add("model.embed_tokens.weight", "BF16", {s.vocab, s.hidden},
        InitKind::Embedding, 0.75f);
    for (int64_t layer = 0; layer < s.layers; ++layer)
      decoderLayer(layer);
    norm("model.norm.weight", s.hidden);
    if (!s.tie_embeddings)
      add("lm_head.weight", "BF16", {s.vocab, s.hidden}, InitKind::Linear,
          gain(s.hidden));
    if (s.isDeepseek() && s.mtp_layers > 0)
      mtpModule();
    return std::move(plan_);
  }

private:
  static float gain(int64_t fan_in) {
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  }

  int add(std::string name, const char *dtype, std::vector<int64_t> shape,
          InitKind init, float stddev, float mean = 0.0f) {
    PlannedTensor t;
    t.name = std::move(name);
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.init = init;
    t.stddev = stddev;
    t.mean = mean;
    plan_.push_back(std::move(t));
    return static_cast<int>(plan_.size() - 1);
  }

  void norm(std::string name, int64_t n) {
    add(std::move(name), "BF16", {n}, InitKind::Norm, 0.05f, 1.0f);
  }

  /// A Linear [n, k]; FP8 (+ scale) in an fp8 checkpoint unless `keep_bf16`.
  void linear(const std::string &prefix, int64_t n, int64_t k,
              bool keep_bf16 = false) {
    bool fp8 = spec_.isFp8() && !keep_bf16;
    int w = add(prefix + ".weight", fp8 ? "F8_E4M3" : "BF16", {n, k},
                InitKind::Linear, gain(k));
    if (!fp8)
      return;
    int s = add(prefix + ".weight_scale_inv", "F32",
                {(n + kFp8Tile - 1) / kFp8Tile, (k + kFp8Tile - 1) / kFp8Tile},
                InitKind::BlockScale, 0.0f);
    plan_[w].partner = s;
    plan_[s].partner = w;
  }

  void decoderLayer(int64_t layer) {
    const ModelSpec &s = spec_;
    std::string p = llvm::formatv("model.layers.{0}.", layer).str();
    norm(p + "input_layernorm.weight", s.hidden);
    if (s.isDeepseek())
      mlaAttention(p + "self_attn.");
    else
      qwenAttention(p + "self_attn.");
    norm(p + "post_attention_layernorm.weight", s.hidden);
    if (s.isMoeLayer(layer))
      moe(p + "mlp.");
    else
      ffn(p + "mlp.", s.intermediate);
  }

  /// DeepSeek's MTP module, model.layers.<layers>.* (reference/TENSORS.md,
  /// docs/mtp.md): a decoder layer, enorm, hnorm, eh_proj [H, 2H],
  /// shared_head.norm, and copies of the LM head and the embedding.
  void mtpModule() {
    const ModelSpec &s = spec_;
    decoderLayer(s.layers);
    std::string p = llvm::formatv("model.layers.{0}.", s.layers).str();
    norm(p + "enorm.weight", s.hidden);
    norm(p + "hnorm.weight", s.hidden);
    linear(p + "eh_proj", s.hidden, 2 * s.hidden);
    norm(p + "shared_head.norm.weight", s.hidden);
    copyOf(p + "shared_head.head.weight",
           s.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    copyOf(p + "embed_tokens.weight", "model.embed_tokens.weight");
  }

  /// A tensor named `name` with the values of the planned tensor `source`.
  void copyOf(std::string name, const std::string &source) {
    for (size_t i = 0; i < plan_.size(); ++i) {
      if (plan_[i].name != source)
        continue;
      PlannedTensor t = plan_[i];
      t.name = std::move(name);
      t.values_of = source;
      plan_.push_back(std::move(t));
      return;
    }
    assert(false && "copy of a tensor not planned");
  }

  void qwenAttention(const std::string &p) {
    const ModelSpec &s = spec_;
    linear(p + "q_proj", s.heads * s.head_dim, s.hidden);
    linear(p + "k_proj", s.kv_heads * s.head_dim, s.hidden);
    linear(p + "v_proj", s.kv_heads * s.head_dim, s.hidden);
    linear(p + "o_proj", s.hidden, s.heads * s.head_dim);
    norm(p + "q_norm.weight", s.head_dim);
    norm(p + "k_norm.weight", s.head_dim);
  }

  void mlaAttention(const std::string &p) {
    const ModelSpec &s = spec_;
    linear(p + "q_a_proj", s.q_lora, s.hidden);
    norm(p + "q_a_layernorm.weight", s.q_lora);
    linear(p + "q_b_proj", s.heads * (s.qk_nope + s.qk_rope), s.q_lora);
    linear(p + "kv_a_proj_with_mqa", s.kv_lora + s.qk_rope, s.hidden);
    norm(p + "kv_a_layernorm.weight", s.kv_lora);
    linear(p + "kv_b_proj", s.heads * (s.qk_nope + s.v_head), s.kv_lora);
    linear(p + "o_proj", s.hidden, s.heads * s.v_head);
    if (!s.hasIndexer())
      return;
    linear(p + "indexer.wq_b", s.index_heads * s.index_head_dim, s.q_lora);
    linear(p + "indexer.wk", s.index_head_dim, s.hidden);
    norm(p + "indexer.k_norm.weight", s.index_head_dim);
    add(p + "indexer.k_norm.bias", "BF16", {s.index_head_dim}, InitKind::Bias,
        0.02f);
    linear(p + "indexer.weights_proj", s.index_heads, s.hidden,
           /*keep_bf16=*/true);
  }

  void ffn(const std::string &p, int64_t width) {
    linear(p + "gate_proj", width, spec_.hidden);
    linear(p + "up_proj", width, spec_.hidden);
    linear(p + "down_proj", spec_.hidden, width);
  }

  void moe(const std::string &p) {
    const ModelSpec &s = spec_;
    // Small router weights keep the initial routing soft.
    add(p + "gate.weight", "BF16", {s.experts, s.hidden}, InitKind::Router,
        0.5f * gain(s.hidden));
    if (s.isDeepseek())
      add(p + "gate.e_score_correction_bias", "F32", {s.experts},
          InitKind::Bias, 0.01f);
    for (int64_t e = 0; e < s.experts; ++e)
      ffn(llvm::formatv("{0}experts.{1}.", p, e).str(), s.moe_intermediate);
    if (s.isDeepseek() && s.shared_experts > 0)
      ffn(p + "shared_experts.", s.shared_experts * s.moe_intermediate);
  }

  const ModelSpec &spec_;
  std::vector<PlannedTensor> plan_;
};

} // namespace

std::vector<PlannedTensor> planTensors(const ModelSpec &spec) {
  return Planner(spec).run();
}

uint64_t countParams(llvm::ArrayRef<PlannedTensor> plan) {
  uint64_t n = 0;
  for (const PlannedTensor &t : plan)
    if (t.init != InitKind::BlockScale)
      n += t.numElements();
  return n;
}

std::vector<unsigned> assignShards(llvm::ArrayRef<uint64_t> unit_bytes,
                                   unsigned shards) {
  assert(shards >= 1 && shards <= unit_bytes.size());
  uint64_t total = 0;
  for (uint64_t b : unit_bytes)
    total += b;
  std::vector<unsigned> out(unit_bytes.size());
  unsigned shard = 0;
  uint64_t done = 0;
  for (size_t i = 0; i < unit_bytes.size(); ++i) {
    out[i] = shard;
    done += unit_bytes[i];
    if (shard + 1 == shards)
      continue;
    size_t units_left = unit_bytes.size() - i - 1;
    unsigned shards_left = shards - shard - 1;
    // Close the shard once it reaches its share of the bytes, or when every
    // remaining shard needs one of the remaining units.
    // done / total >= (shard + 1) / shards, exact in 128 bits.
    bool full = static_cast<unsigned __int128>(done) * shards >=
                static_cast<unsigned __int128>(total) * (shard + 1);
    if (units_left == shards_left || (full && units_left >= shards_left))
      ++shard;
  }
  return out;
}

std::string shardFileName(unsigned shard, unsigned shards) {
  if (shards == 1)
    return "model.safetensors";
  char name[64];
  std::snprintf(name, sizeof name, "model-%05u-of-%05u.safetensors", shard,
                shards);
  return name;
}

} // namespace duck::mkmodel
