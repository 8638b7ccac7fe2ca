"""Writes a random Qwen3, Qwen3-MoE or DeepSeek-V3/V3.2 checkpoint of any
shape with numpy.

An independent writer for the oracle tests (it shares no code with
duck-mkmodel): FP8 E4M3 weights with power-of-two ("ue8m0") block scales
over any block size, partial last tiles included, or bf16.

  make-checkpoint.py OUT --family qwen3 --hidden 320 --inter 864 ...
"""
import argparse
import json
import os

import numpy as np

from safetensors_np import f32_to_bf16, f32_to_e4m3, write_safetensors

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--family", choices=["qwen3", "qwen3_moe", "deepseek_v3",
                                     "deepseek_v32"], required=True)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--hidden", type=int, required=True)
p.add_argument("--inter", type=int, default=0, help="dense intermediate")
p.add_argument("--vocab", type=int, default=512)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--kv-heads", type=int, default=2)
p.add_argument("--head-dim", type=int, default=64)
p.add_argument("--experts", type=int, default=8)
p.add_argument("--top-k", type=int, default=2)
p.add_argument("--moe-inter", type=int, default=0)
p.add_argument("--dtype", choices=["fp8", "bf16"], default="fp8")
p.add_argument("--block", default="128,128", help="FP8 block rows,cols")
p.add_argument("--tie", action="store_true", help="tie the LM head")
p.add_argument("--seed", type=int, default=1)
p.add_argument("--max-position", type=int, default=0,
               help="max_position_embeddings (default 4096; DeepSeek "
               "163840)")
p.add_argument("--rope-scaling", default="",
               help="config.json's rope_scaling as JSON, e.g. "
               "'{\"rope_type\": \"yarn\", \"factor\": 4.0, "
               "\"original_max_position_embeddings\": 1024}' (DeepSeek: "
               "replaces its YaRN)")
# DeepSeek (MLA, sigmoid group router, shared experts, V3.2 indexer).
p.add_argument("--q-lora", type=int, default=96, help="0: q_proj, no LoRA")
p.add_argument("--kv-lora", type=int, default=64)
p.add_argument("--nope", type=int, default=32)
p.add_argument("--rope", type=int, default=16)
p.add_argument("--v-dim", type=int, default=32)
p.add_argument("--first-dense", type=int, default=1)
p.add_argument("--groups", type=int, default=4)
p.add_argument("--topk-groups", type=int, default=2)
p.add_argument("--shared", type=int, default=1,
               help="n_shared_experts: one MLP of shared * moe-inter")
p.add_argument("--mscale", default="1.0",
               help="DeepSeek rope_scaling.mscale ('none': left out)")
p.add_argument("--mscale-all-dim", default="1.0",
               help="DeepSeek rope_scaling.mscale_all_dim ('none': left out)")
p.add_argument("--no-norm-topk-prob", action="store_true",
               help="norm_topk_prob false (Qwen3-MoE, DeepSeek)")
p.add_argument("--shards", type=int, default=1,
               help="N > 1: model-0000i-of-0000N.safetensors (tensors dealt "
               "round-robin, a weight and its scale apart) and "
               "model.safetensors.index.json")
p.add_argument("--index-heads", type=int, default=4)
p.add_argument("--index-dim", type=int, default=32)
p.add_argument("--index-topk", type=int, default=16)
p.add_argument("--mtp", type=int, choices=[0, 1], default=0,
               help="DeepSeek: num_nextn_predict_layers; 1 writes the MTP "
               "module as model.layers.{layers}.* after the main model's "
               "tensors (which stay as without it), docs/mtp.md")
p.add_argument("--mtp-identity", action="store_true",
               help="with --mtp 1: eh_proj [0 | I], hnorm ones, the MTP "
               "layer's o_proj and down projections zero, shared_head.norm "
               "= model.norm, so its logits are "
               "lm_head(norm(rmsnorm_unit(h)))")
p.add_argument("--constant-token", type=int, default=None, metavar="X",
               help="a model whose every greedy token is X: the embedding's "
               "column 0 is 8 (the residual stream's dimension 0 stays large "
               "and positive), model.norm keeps only that dimension, and the "
               "LM head's column 0 is largest in row X; with --mtp-identity "
               "every MTP draft is X too (drafts that are always right)")
a = p.parse_args()
if a.constant_token is not None and (a.tie or not
                                     0 <= a.constant_token < a.vocab):
    p.error("--constant-token needs an untied head and a token id in the "
            "vocabulary")
if a.mtp and not a.family.startswith("deepseek"):
    p.error("--mtp: only the DeepSeek families carry an MTP module")
if a.mtp_identity and not a.mtp:
    p.error("--mtp-identity needs --mtp 1")

rng = np.random.default_rng(a.seed)
br, bc = (int(x) for x in a.block.split(","))
H, D = a.hidden, a.head_dim
moe = a.family == "qwen3_moe"
ds = a.family.startswith("deepseek")

cfg = {
    "architectures": ["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"],
    "model_type": a.family, "hidden_size": H, "num_hidden_layers": a.layers,
    "vocab_size": a.vocab, "num_attention_heads": a.heads,
    "num_key_value_heads": a.kv_heads, "head_dim": D,
    "intermediate_size": a.inter or 4 * H, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "max_position_embeddings": 4096,
    "tie_word_embeddings": a.tie, "torch_dtype": "bfloat16",
    "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu",
}
if moe:
    cfg.update({"num_experts": a.experts, "num_experts_per_tok": a.top_k,
                "moe_intermediate_size": a.moe_inter or H,
                "norm_topk_prob": True, "decoder_sparse_step": 1,
                "mlp_only_layers": []})
if ds:
    for k in ("head_dim", "num_key_value_heads"):
        cfg.pop(k)
    cfg.update({
        "architectures": ["DeepseekV32ForCausalLM" if a.family == "deepseek_v32"
                          else "DeepseekV3ForCausalLM"],
        "num_key_value_heads": a.heads, "rope_theta": 10000.0,
        "max_position_embeddings": 163840,
        "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32,
                         "beta_slow": 1,
                         "original_max_position_embeddings": 4096},
        "q_lora_rank": a.q_lora or None, "kv_lora_rank": a.kv_lora,
        "qk_nope_head_dim": a.nope, "qk_rope_head_dim": a.rope,
        "v_head_dim": a.v_dim, "n_routed_experts": a.experts,
        "num_experts_per_tok": a.top_k, "n_shared_experts": a.shared,
        "moe_intermediate_size": a.moe_inter or H,
        "first_k_dense_replace": a.first_dense, "moe_layer_freq": 1,
        "n_group": a.groups, "topk_group": a.topk_groups,
        "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
        "topk_method": "noaux_tc", "norm_topk_prob": True,
        "num_nextn_predict_layers": a.mtp})
    for key, v in (("mscale", a.mscale), ("mscale_all_dim", a.mscale_all_dim)):
        if v != "none":
            cfg["rope_scaling"][key] = float(v)
    if a.family == "deepseek_v32":
        cfg.update({"index_n_heads": a.index_heads,
                    "index_head_dim": a.index_dim,
                    "index_topk": a.index_topk})
if a.max_position:
    cfg["max_position_embeddings"] = a.max_position
if a.rope_scaling:
    cfg["rope_scaling"] = json.loads(a.rope_scaling)
if a.no_norm_topk_prob:
    cfg["norm_topk_prob"] = False
if a.dtype == "fp8":
    cfg["quantization_config"] = {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "scale_fmt": "ue8m0", "weight_block_size": [br, bc]}

tensors = []


def quantised(name, w):
    """[(name, dtype, array)] for the float32 matrix w as --dtype stores
    it: bf16, or FP8 with its power-of-two block scales (1 for a block of
    zeros)."""
    if a.dtype == "bf16":
        return [(name, "BF16", f32_to_bf16(w))]
    rows, cols = w.shape
    gr, gc = -(-rows // br), -(-cols // bc)
    scale = np.empty((gr, gc), np.float32)
    q = np.empty((rows, cols), np.uint8)
    for i in range(gr):
        for j in range(gc):
            t = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            amax = np.abs(t).max()
            s = np.float32(2.0 ** np.ceil(np.log2(amax / 448.0))
                           if amax > 0 else 1.0)
            scale[i, j] = s
            q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = f32_to_e4m3(t / s)
    return [(name, "F8_E4M3", q), (name + "_scale_inv", "F32", scale)]


def linear(name, rows, cols):
    w = rng.standard_normal((rows, cols)).astype(np.float32) / np.sqrt(cols)
    tensors.extend(quantised(name, w))


def vector(name, n, mean=1.0, spread=0.2):
    v = (mean + spread * rng.standard_normal(n)).astype(np.float32)
    tensors.append((name, "BF16", f32_to_bf16(v)))


def mlp(prefix, inter):
    linear(prefix + "gate_proj.weight", inter, H)
    linear(prefix + "up_proj.weight", inter, H)
    linear(prefix + "down_proj.weight", H, inter)


emb = rng.standard_normal((a.vocab, H)).astype(np.float32)
if a.tie:
    # As trained tied embeddings are: small beside the layers' outputs, so
    # the head does not just give back the current token (1/sqrt(hidden)).
    emb /= np.sqrt(H)
tensors.append(("model.embed_tokens.weight", "BF16", f32_to_bf16(emb)))
def f32(name, n, mean=0.0, spread=1.0):
    v = (mean + spread * rng.standard_normal(n)).astype(np.float32)
    tensors.append((name, "F32", v))


def mla(pre):
    qk = a.nope + a.rope
    if a.q_lora:
        linear(pre + "q_a_proj.weight", a.q_lora, H)
        vector(pre + "q_a_layernorm.weight", a.q_lora)
        linear(pre + "q_b_proj.weight", a.heads * qk, a.q_lora)
    else:
        linear(pre + "q_proj.weight", a.heads * qk, H)
    linear(pre + "kv_a_proj_with_mqa.weight", a.kv_lora + a.rope, H)
    vector(pre + "kv_a_layernorm.weight", a.kv_lora)
    linear(pre + "kv_b_proj.weight", a.heads * (a.nope + a.v_dim), a.kv_lora)
    linear(pre + "o_proj.weight", H, a.heads * a.v_dim)
    if a.family == "deepseek_v32":
        linear(pre + "indexer.wq_b.weight", a.index_heads * a.index_dim,
               a.q_lora)
        linear(pre + "indexer.wk.weight", a.index_dim, H)
        vector(pre + "indexer.k_norm.weight", a.index_dim)
        vector(pre + "indexer.k_norm.bias", a.index_dim, 0.0, 0.1)
        g = rng.standard_normal((a.index_heads, H)).astype(np.float32)
        tensors.append((pre + "indexer.weights_proj.weight", "BF16",
                        f32_to_bf16(g / np.sqrt(H))))


def deepseek_ffn(pre, L):
    if L < a.first_dense:
        mlp(pre + "mlp.", cfg["intermediate_size"])
        return
    g = rng.standard_normal((a.experts, H)).astype(np.float32) / np.sqrt(H)
    tensors.append((pre + "mlp.gate.weight", "BF16", f32_to_bf16(g)))
    f32(pre + "mlp.gate.e_score_correction_bias", a.experts, 0.0, 0.1)
    for e in range(a.experts):
        mlp(pre + "mlp.experts.%d." % e, cfg["moe_intermediate_size"])
    if a.shared:
        mlp(pre + "mlp.shared_experts.",
            a.shared * cfg["moe_intermediate_size"])


for L in range(a.layers):
    pre = "model.layers.%d." % L
    vector(pre + "input_layernorm.weight", H)
    vector(pre + "post_attention_layernorm.weight", H)
    if ds:
        mla(pre + "self_attn.")
        deepseek_ffn(pre, L)
        continue
    linear(pre + "self_attn.q_proj.weight", a.heads * D, H)
    linear(pre + "self_attn.k_proj.weight", a.kv_heads * D, H)
    linear(pre + "self_attn.v_proj.weight", a.kv_heads * D, H)
    linear(pre + "self_attn.o_proj.weight", H, a.heads * D)
    vector(pre + "self_attn.q_norm.weight", D)
    vector(pre + "self_attn.k_norm.weight", D)
    if moe:
        g = rng.standard_normal((a.experts, H)).astype(np.float32) / np.sqrt(H)
        tensors.append((pre + "mlp.gate.weight", "BF16", f32_to_bf16(g)))
        for e in range(a.experts):
            mlp(pre + "mlp.experts.%d." % e, cfg["moe_intermediate_size"])
    else:
        mlp(pre + "mlp.", cfg["intermediate_size"])
vector("model.norm.weight", H)
if not a.tie:
    head = rng.standard_normal((a.vocab, H)).astype(np.float32)
    tensors.append(("lm_head.weight", "BF16", f32_to_bf16(head)))



def replace(name, entries):
    """Puts `entries` where the tensor `name` (and its scale) was."""
    i = next(k for k, t in enumerate(tensors) if t[0] == name)
    n = 2 if i + 1 < len(tensors) and \
        tensors[i + 1][0] == name + "_scale_inv" else 1
    tensors[i:i + n] = entries


def mtp_module(L):
    """DeepSeek's MTP module, model.layers.L.* (TENSORS.md, docs/mtp.md):
    a decoder layer plus enorm, hnorm, eh_proj [H, 2H], shared_head.norm
    and copies of the embedding and the LM head."""
    pre = "model.layers.%d." % L
    vector(pre + "input_layernorm.weight", H)
    vector(pre + "post_attention_layernorm.weight", H)
    mla(pre + "self_attn.")
    deepseek_ffn(pre, L)
    vector(pre + "enorm.weight", H)
    vector(pre + "hnorm.weight", H)
    linear(pre + "eh_proj.weight", H, 2 * H)
    vector(pre + "shared_head.norm.weight", H)
    byname = {t[0]: t for t in tensors}
    head = byname["lm_head.weight" if not a.tie
                  else "model.embed_tokens.weight"]
    tensors.append((pre + "shared_head.head.weight", "BF16", head[2]))
    tensors.append((pre + "embed_tokens.weight", "BF16",
                    byname["model.embed_tokens.weight"][2]))
    if not a.mtp_identity:
        return
    eye = np.hstack([np.zeros((H, H), np.float32), np.eye(H, dtype=np.float32)])
    replace(pre + "eh_proj.weight", quantised(pre + "eh_proj.weight", eye))
    replace(pre + "hnorm.weight", [(pre + "hnorm.weight", "BF16",
                                    f32_to_bf16(np.ones(H, np.float32)))])
    replace(pre + "shared_head.norm.weight",
            [(pre + "shared_head.norm.weight", "BF16",
              byname["model.norm.weight"][2])])
    for t in list(tensors):
        if t[0].startswith(pre) and t[0].endswith(("self_attn.o_proj.weight",
                                                   "down_proj.weight")):
            replace(t[0], quantised(t[0], np.zeros(t[2].shape, np.float32)))


def constant_token(x):
    """--constant-token: every greedy token is x (see its help)."""
    e = emb.copy()
    e[:, 0] = 8.0
    replace("model.embed_tokens.weight",
            [("model.embed_tokens.weight", "BF16", f32_to_bf16(e))])
    n = np.zeros(H, np.float32)
    n[0] = 1.0
    replace("model.norm.weight",
            [("model.norm.weight", "BF16", f32_to_bf16(n))])
    h = head.copy()
    h[:, 0] = np.linspace(-0.5, 0.5, a.vocab, dtype=np.float32)
    h[x, 0] = 1.0
    replace("lm_head.weight", [("lm_head.weight", "BF16", f32_to_bf16(h))])


if a.constant_token is not None:
    constant_token(a.constant_token)
if a.mtp:
    mtp_module(a.layers)

os.makedirs(a.out, exist_ok=True)
with open(os.path.join(a.out, "config.json"), "w") as f:
    json.dump(cfg, f, indent=1)
if a.shards <= 1:
    write_safetensors(os.path.join(a.out, "model.safetensors"), tensors)
else:
    names = ["model-%05d-of-%05d.safetensors" % (i + 1, a.shards)
             for i in range(a.shards)]
    weight_map = {}
    for i, name in enumerate(names):
        part = tensors[i::a.shards]
        weight_map.update((t[0], name) for t in part)
        write_safetensors(os.path.join(a.out, name), part)
    total = sum(np.asarray(t[2]).nbytes for t in tensors)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": weight_map}, f, indent=1)
