"""Writers for the lit tests: crafted safetensors files and tiny model dirs.

The tensor lists below are written from reference/TENSORS.md independently
of the C++ importer, so the lit tests cross-check expectedTensors().
"""
import json
import os
import struct

DTYPE_SIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}


def nbytes(dtype, shape):
    n = DTYPE_SIZE[dtype]
    for d in shape:
        n *= d
    return n


def write_raw(path, header, data_size, declared_len=None):
    """u64 LE header length (or `declared_len`), header text, zero data."""
    if isinstance(header, (dict, list)):
        header = json.dumps(header)
    header = header.encode()
    n = len(header) if declared_len is None else declared_len
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + header + bytes(data_size))


def write_tensors(path, tensors, metadata=None):
    """tensors: [(name, dtype, shape)], laid out contiguously in that order."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape in tensors:
        end = offset + nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header)
    text += " " * (-len(text) % 8)  # writers pad the header to 8 bytes
    write_raw(path, text, offset)


TINY = {
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 16, "num_hidden_layers": 2, "vocab_size": 32,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "intermediate_size": 24, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "eos_token_id": 1,
    },
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 16, "num_hidden_layers": 2, "vocab_size": 32,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "intermediate_size": 48, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 12, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [],
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "deepseek_v32": {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "hidden_size": 16, "num_hidden_layers": 3, "vocab_size": 32,
        "num_attention_heads": 2, "num_key_value_heads": 2,
        "intermediate_size": 40, "moe_intermediate_size": 12,
        "n_routed_experts": 4, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "first_k_dense_replace": 1,
        "moe_layer_freq": 1, "n_group": 2, "topk_group": 1,
        "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
        "topk_method": "noaux_tc", "norm_topk_prob": True,
        "q_lora_rank": 12, "kv_lora_rank": 8, "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4, "v_head_dim": 8, "index_n_heads": 2,
        "index_head_dim": 8, "index_topk": 4, "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
}
FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3",
              "activation_scheme": "dynamic", "weight_block_size": [8, 8]}


def tiny_config(family, fp8=False):
    cfg = json.loads(json.dumps(TINY[family]))
    if fp8:
        cfg["quantization_config"] = dict(FP8_CONFIG)
    return cfg


def expected_tensors(cfg, layers=None):
    """[(name, shape, is_fp8_linear)] per reference/TENSORS.md."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    out = [("model.embed_tokens.weight", [V, H], False)]
    qwen = cfg["model_type"].startswith("qwen3")
    n_layers = cfg["num_hidden_layers"] if layers is None else layers

    def mlp(prefix, inter):
        out.append((prefix + "gate_proj.weight", [inter, H], True))
        out.append((prefix + "up_proj.weight", [inter, H], True))
        out.append((prefix + "down_proj.weight", [H, inter], True))

    for L in range(n_layers):
        p = "model.layers.%d." % L
        a = p + "self_attn."
        out.append((p + "input_layernorm.weight", [H], False))
        out.append((p + "post_attention_layernorm.weight", [H], False))
        if qwen:
            D, Hq, Hkv = cfg["head_dim"], cfg["num_attention_heads"], \
                cfg["num_key_value_heads"]
            out += [(a + "q_proj.weight", [Hq * D, H], True),
                    (a + "k_proj.weight", [Hkv * D, H], True),
                    (a + "v_proj.weight", [Hkv * D, H], True),
                    (a + "o_proj.weight", [H, Hq * D], True),
                    (a + "q_norm.weight", [D], False),
                    (a + "k_norm.weight", [D], False)]
            moe = cfg["model_type"] == "qwen3_moe" and \
                L not in cfg["mlp_only_layers"] and \
                (L + 1) % cfg["decoder_sparse_step"] == 0
        else:
            nh, ql, kl = cfg["num_attention_heads"], cfg["q_lora_rank"], \
                cfg["kv_lora_rank"]
            nope, rope, vd = cfg["qk_nope_head_dim"], \
                cfg["qk_rope_head_dim"], cfg["v_head_dim"]
            out += [(a + "q_a_proj.weight", [ql, H], True),
                    (a + "q_a_layernorm.weight", [ql], False),
                    (a + "q_b_proj.weight", [nh * (nope + rope), ql], True),
                    (a + "kv_a_proj_with_mqa.weight", [kl + rope, H], True),
                    (a + "kv_a_layernorm.weight", [kl], False),
                    (a + "kv_b_proj.weight", [nh * (nope + vd), kl], True),
                    (a + "o_proj.weight", [H, nh * vd], True)]
            if cfg["model_type"] == "deepseek_v32":
                ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
                i = a + "indexer."
                out += [(i + "wq_b.weight", [ih * idim, ql], True),
                        (i + "wk.weight", [idim, H], True),
                        (i + "k_norm.weight", [idim], False),
                        (i + "k_norm.bias", [idim], False),
                        (i + "weights_proj.weight", [ih, H], False)]
            moe = L >= cfg["first_k_dense_replace"] and \
                L % cfg["moe_layer_freq"] == 0
        m = p + "mlp."
        if not moe:
            mlp(m, cfg["intermediate_size"])
            continue
        E, Im = cfg.get("num_experts") or cfg["n_routed_experts"], \
            cfg["moe_intermediate_size"]
        out.append((m + "gate.weight", [E, H], False))
        if not qwen:
            out.append((m + "gate.e_score_correction_bias", [E], False))
        for e in range(E):
            mlp(m + "experts.%d." % e, Im)
        if cfg.get("n_shared_experts"):
            mlp(m + "shared_experts.", Im * cfg["n_shared_experts"])
    out.append(("model.norm.weight", [H], False))
    if not cfg.get("tie_word_embeddings"):
        out.append(("lm_head.weight", [V, H], False))
    return out


def tensor_specs(cfg, with_mtp=False):
    """[(name, dtype, shape)] for a full checkpoint of `cfg`."""
    fp8 = "quantization_config" in cfg
    bs = cfg.get("quantization_config", {}).get("weight_block_size", [128, 128])
    layers = cfg["num_hidden_layers"] + (
        cfg.get("num_nextn_predict_layers", 0) if with_mtp else 0)
    specs = []
    for name, shape, linear in expected_tensors(cfg, layers):
        if fp8 and linear:
            specs.append((name, "F8_E4M3", shape))
            specs.append((name + "_scale_inv", "F32",
                          [-(-shape[0] // bs[0]), -(-shape[1] // bs[1])]))
        elif name.endswith("e_score_correction_bias"):
            specs.append((name, "F32", shape))
        else:
            specs.append((name, "BF16", shape))
    return specs


def write_model(path, cfg, specs=None, layout="single", shards=2):
    """A model directory: config.json and the weights in `layout`
    ("none", "single", "index" or "loose")."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if layout == "none":
        return
    if specs is None:
        specs = tensor_specs(cfg)
    if layout == "single":
        write_tensors(os.path.join(path, "model.safetensors"), specs)
        return
    per = -(-len(specs) // shards)
    weight_map = {}
    for i in range(shards):
        part = specs[i * per:(i + 1) * per]
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        write_tensors(os.path.join(path, fname), part)
        for name, _, _ in part:
            weight_map[name] = fname
    if layout == "index":
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0},
                       "weight_map": weight_map}, f)


def replace(specs, name, dtype=None, shape=None):
    """`specs` with tensor `name` given a new dtype and/or shape."""
    out = []
    for n, d, s in specs:
        if n == name:
            d = dtype or d
            s = shape if shape is not None else s
        out.append((n, d, s))
    return out


def drop(specs, name):
    return [t for t in specs if t[0] != name]
