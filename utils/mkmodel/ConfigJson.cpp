//===- ConfigJson.cpp - config.json and friends for a ModelSpec -----------===//

#include "ConfigJson.h"

#include "Quantize.h"
#include "TokenizerJson.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>

using llvm::StringRef;

namespace duck::mkmodel {

std::string formatPythonFloat(double value) {
  if (std::isnan(value))
    return "NaN";
  if (std::isinf(value))
    return value > 0 ? "Infinity" : "-Infinity";
  if (value == 0.0)
    return std::signbit(value) ? "-0.0" : "0.0";
  // Shortest digit string that reads back to the same double.
  char buf[48];
  for (int precision = 0; precision < 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision, value);
    if (std::strtod(buf, nullptr) == value)
      break;
  }
  std::string text = buf;
  std::string sign;
  if (text[0] == '-') {
    sign = "-";
    text.erase(0, 1);
  }
  size_t e_pos = text.find('e');
  int exponent = std::atoi(text.c_str() + e_pos + 1);
  std::string digits = text.substr(0, 1);
  if (e_pos > 1)
    digits += text.substr(2, e_pos - 2);
  while (digits.size() > 1 && digits.back() == '0')
    digits.pop_back();
  // Python's repr switches to exponent form outside [1e-4, 1e16).
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0)
      return sign + "0." + std::string(-exponent - 1, '0') + digits;
    size_t int_digits = static_cast<size_t>(exponent) + 1;
    std::string int_part = digits.substr(0, int_digits);
    int_part.append(int_digits - int_part.size(), '0');
    std::string frac_part =
        digits.size() > int_digits ? digits.substr(int_digits) : "0";
    return sign + int_part + "." + frac_part;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1)
    out += "." + digits.substr(1);
  char exp_text[16];
  std::snprintf(exp_text, sizeof exp_text, "e%c%02d", exponent < 0 ? '-' : '+',
                std::abs(exponent));
  return sign + out + exp_text;
}

namespace {

/// A JSON object written with sorted keys, whose numbers keep the int/float
/// distinction of the real configs (llvm::json::Value folds integral doubles
/// into integers when printing).
class JsonObject {
public:
  using Emitter = std::function<void(llvm::json::OStream &)>;

  JsonObject &integer(StringRef key, int64_t v) {
    return set(key, [v](llvm::json::OStream &j) { j.value(v); });
  }
  JsonObject &number(StringRef key, double v) {
    return set(
        key, [v](llvm::json::OStream &j) { j.rawValue(formatPythonFloat(v)); });
  }
  JsonObject &string(StringRef key, StringRef v) {
    return set(key, [s = v.str()](llvm::json::OStream &j) { j.value(s); });
  }
  JsonObject &boolean(StringRef key, bool v) {
    return set(key, [v](llvm::json::OStream &j) { j.value(v); });
  }
  JsonObject &null(StringRef key) {
    return set(key, [](llvm::json::OStream &j) { j.value(nullptr); });
  }
  JsonObject &integers(StringRef key, std::vector<int64_t> v) {
    return set(key, [v = std::move(v)](llvm::json::OStream &j) {
      j.array([&] {
        for (int64_t x : v)
          j.value(x);
      });
    });
  }
  JsonObject &strings(StringRef key, std::vector<std::string> v) {
    return set(key, [v = std::move(v)](llvm::json::OStream &j) {
      j.array([&] {
        for (const std::string &x : v)
          j.value(x);
      });
    });
  }
  JsonObject &object(StringRef key, JsonObject v) {
    return set(key, [v = std::move(v)](llvm::json::OStream &j) { v.emit(j); });
  }

  void emit(llvm::json::OStream &j) const {
    j.object([&] {
      for (const auto &[key, emitter] : fields_) {
        j.attributeBegin(key);
        emitter(j);
        j.attributeEnd();
      }
    });
  }

  std::string render() const {
    std::string text;
    llvm::raw_string_ostream os(text);
    llvm::json::OStream j(os, /*IndentSize=*/2);
    emit(j);
    os << "\n";
    os.flush();
    return text;
  }

private:
  JsonObject &set(StringRef key, Emitter emitter) {
    fields_[key.str()] = std::move(emitter);
    return *this;
  }

  std::map<std::string, Emitter> fields_;
};

} // namespace

// The ids of the special tokens in the generated tokenizer.json, for every
// family (the real Qwen3/DeepSeek ids would name ordinary tokens there).
int64_t bosTokenId(const ModelSpec &spec) { return endOfTextId(spec.vocab); }

int64_t eosTokenId(const ModelSpec &spec) { return endOfTextId(spec.vocab); }

std::vector<int64_t> generationEosTokenIds(const ModelSpec &spec) {
  return {endOfTextId(spec.vocab), imEndId(spec.vocab)};
}

static void addQwenFields(const ModelSpec &s, JsonObject &c) {
  c.strings("architectures",
            {s.isMoe() ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"})
      .integer("head_dim", s.head_dim)
      .integer("max_window_layers", s.layers)
      .integer("num_key_value_heads", s.kv_heads)
      .null("rope_scaling")
      .null("sliding_window")
      .string("transformers_version", "4.51.0")
      .boolean("use_sliding_window", false);
  if (!s.isMoe()) {
    // Qwen3-0.6B writes an integer rope_theta, the MoE configs a float.
    c.integer("rope_theta", 1000000);
    return;
  }
  std::vector<int64_t> mlp_only;
  for (int64_t l = 0; l < s.dense_layers; ++l)
    mlp_only.push_back(l);
  c.number("rope_theta", 1000000.0)
      .integer("decoder_sparse_step", 1)
      .integers("mlp_only_layers", std::move(mlp_only))
      .integer("moe_intermediate_size", s.moe_intermediate)
      .boolean("norm_topk_prob", true)
      .integer("num_experts", s.experts)
      .integer("num_experts_per_tok", s.top_k)
      .boolean("output_router_logits", false)
      .number("router_aux_loss_coef", 0.001);
}

static void addDeepseekFields(const ModelSpec &s, JsonObject &c) {
  bool v32 = s.hasIndexer();
  JsonObject rope;
  rope.integer("beta_fast", 32)
      .integer("beta_slow", 1)
      .integer("factor", 40)
      .number("mscale", 1.0)
      .number("mscale_all_dim", 1.0)
      .integer("original_max_position_embeddings", 4096)
      .string("type", "yarn");
  c.strings("architectures",
            {v32 ? "DeepseekV32ForCausalLM" : "DeepseekV3ForCausalLM"})
      .integer("ep_size", 1)
      .integer("first_k_dense_replace", s.dense_layers)
      .integer("kv_lora_rank", s.kv_lora)
      .integer("moe_intermediate_size", s.moe_intermediate)
      .integer("moe_layer_freq", 1)
      .integer("n_group", s.n_group)
      .integer("n_routed_experts", s.experts)
      .integer("n_shared_experts", s.shared_experts)
      .boolean("norm_topk_prob", true)
      .integer("num_experts_per_tok", s.top_k)
      .integer("num_key_value_heads", s.heads)
      .integer("num_nextn_predict_layers", s.mtp_layers)
      .integer("q_lora_rank", s.q_lora)
      .integer("qk_nope_head_dim", s.qk_nope)
      .integer("qk_rope_head_dim", s.qk_rope)
      .object("rope_scaling", std::move(rope))
      .integer("rope_theta", 10000)
      .number("routed_scaling_factor", 2.5)
      .string("scoring_func", "sigmoid")
      .integer("topk_group", s.topk_group)
      .string("topk_method", "noaux_tc")
      .integer("v_head_dim", s.v_head);
  if (v32) {
    c.integer("index_head_dim", s.index_head_dim)
        .integer("index_n_heads", s.index_heads)
        .integer("index_topk", s.index_topk)
        .string("transformers_version", "4.44.2");
  } else {
    c.number("aux_loss_alpha", 0.001)
        .integer("pretraining_tp", 1)
        .boolean("seq_aux", true)
        .string("transformers_version", "4.33.1");
  }
}

std::string renderConfigJson(const ModelSpec &s) {
  JsonObject c;
  c.boolean("attention_bias", false)
      .number("attention_dropout", 0.0)
      .integer("bos_token_id", bosTokenId(s))
      .integer("eos_token_id", eosTokenId(s))
      .string("hidden_act", "silu")
      .integer("hidden_size", s.hidden)
      .number("initializer_range", 0.02)
      .integer("intermediate_size", s.intermediate)
      .integer("max_position_embeddings", s.max_pos)
      .string("model_type", familyName(s.family))
      .integer("num_attention_heads", s.heads)
      .integer("num_hidden_layers", s.layers)
      .number("rms_norm_eps", 1e-6)
      .boolean("tie_word_embeddings", s.tie_embeddings)
      .string("torch_dtype", "bfloat16")
      .boolean("use_cache", true)
      .integer("vocab_size", s.vocab);
  if (s.isDeepseek())
    addDeepseekFields(s, c);
  else
    addQwenFields(s, c);
  if (s.isFp8()) {
    JsonObject q;
    q.string("activation_scheme", "dynamic")
        .string("fmt", "e4m3")
        .string("quant_method", "fp8")
        .integers("weight_block_size", {kFp8Tile, kFp8Tile});
    // V3.2 quantises activations with power-of-two scales.
    if (s.hasIndexer())
      q.string("scale_fmt", "ue8m0");
    c.object("quantization_config", std::move(q));
  }
  return c.render();
}

std::string renderGenerationConfig(const ModelSpec &s) {
  JsonObject c;
  c.integer("bos_token_id", bosTokenId(s))
      .integers("eos_token_id", generationEosTokenIds(s))
      .string("transformers_version", s.isDeepseek() ? "4.44.2" : "4.51.0");
  return c.render();
}

std::string renderIndexJson(
    uint64_t total_size,
    llvm::ArrayRef<std::pair<std::string, std::string>> weight_map) {
  JsonObject meta;
  meta.integer("total_size", static_cast<int64_t>(total_size));
  JsonObject root;
  root.object("metadata", std::move(meta));
  JsonObject files;
  for (const auto &[name, file] : weight_map)
    files.string(name, file);
  root.object("weight_map", std::move(files));
  return root.render();
}

} // namespace duck::mkmodel
