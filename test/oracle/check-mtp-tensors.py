"""Checks a DeepSeek checkpoint's MTP module (docs/mtp.md) with this
oracle's own reader: config num_nextn_predict_layers 1, every tensor of
model.layers.{num_hidden_layers}.* under its published name with the shape
the config gives (FP8 Linears with a weight_scale_inv of the block grid),
shared_head.head equal to the LM head, embed_tokens to the model's. With
--base DIR (the same model written without the module) every tensor of
DIR is here, equal byte for byte, and nothing else but the module.

  check-mtp-tensors.py MODEL [--base DIR]

Prints "mtp tensors N" (what duckc describe's mtp_tensors counts)
and exits 1 at the first difference.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_np import Checkpoint  # noqa: E402


def attention_shapes(c):
    H, heads = c["hidden_size"], c["num_attention_heads"]
    nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], \
        c["v_head_dim"]
    R, Q = c["kv_lora_rank"], c.get("q_lora_rank")
    s = {"kv_a_proj_with_mqa.weight": [R + rope, H],
         "kv_a_layernorm.weight": [R],
         "kv_b_proj.weight": [heads * (nope + vd), R],
         "o_proj.weight": [H, heads * vd]}
    if Q:
        s.update({"q_a_proj.weight": [Q, H], "q_a_layernorm.weight": [Q],
                  "q_b_proj.weight": [heads * (nope + rope), Q]})
    else:
        s["q_proj.weight"] = [heads * (nope + rope), H]
    if c.get("index_topk"):
        ih, idim = c["index_n_heads"], c["index_head_dim"]
        s.update({"indexer.wq_b.weight": [ih * idim, Q],
                  "indexer.wk.weight": [idim, H],
                  "indexer.k_norm.weight": [idim],
                  "indexer.k_norm.bias": [idim],
                  "indexer.weights_proj.weight": [ih, H]})
    return {"self_attn." + k: v for k, v in s.items()}


def expected(c):
    """{name without the layer prefix: shape} of the MTP module."""
    H, V, E = c["hidden_size"], c["vocab_size"], c["n_routed_experts"]
    inter = c["moe_intermediate_size"]
    s = {"input_layernorm.weight": [H],
         "post_attention_layernorm.weight": [H],
         "mlp.gate.weight": [E, H], "mlp.gate.e_score_correction_bias": [E],
         "enorm.weight": [H], "hnorm.weight": [H], "eh_proj.weight": [H, 2 * H],
         "shared_head.norm.weight": [H], "shared_head.head.weight": [V, H],
         "embed_tokens.weight": [V, H]}
    s.update(attention_shapes(c))
    mlps = ["mlp.experts.%d." % e for e in range(E)]
    widths = [inter] * E
    if c.get("n_shared_experts"):
        mlps.append("mlp.shared_experts.")
        widths.append(c["n_shared_experts"] * inter)
    for m, w in zip(mlps, widths):
        s.update({m + "gate_proj.weight": [w, H], m + "up_proj.weight": [w, H],
                  m + "down_proj.weight": [H, w]})
    return s


def check_module(ck, fail):
    c = ck.config
    if c.get("num_nextn_predict_layers") != 1:
        fail("num_nextn_predict_layers %r" % c.get("num_nextn_predict_layers"))
    pre = "model.layers.%d." % c["num_hidden_layers"]
    want = expected(c)
    have = {n for n in ck.tensors if n.startswith(pre)}
    for name, shape in want.items():
        full = pre + name
        if full not in ck.tensors:
            fail("missing %s" % full)
        dtype, arr = ck.tensors[full]
        if list(arr.shape) != shape:
            fail("%s: shape %s, want %s" % (full, list(arr.shape), shape))
        if dtype == "F8_E4M3":
            br, bc = ck.block()
            grid = [-(-shape[0] // br), -(-shape[1] // bc)]
            sc = ck.tensors.get(full + "_scale_inv")
            if sc is None or list(sc[1].shape) != grid:
                fail("%s_scale_inv: want grid %s" % (full, grid))
            have.discard(full + "_scale_inv")
        have.discard(full)
    if have:
        fail("unexpected %s" % sorted(have)[0])
    head = "lm_head.weight" if ck.has("lm_head.weight") \
        else "model.embed_tokens.weight"
    for mine, theirs in (("shared_head.head.weight", head),
                         ("embed_tokens.weight", "model.embed_tokens.weight")):
        if not np.array_equal(ck.get(pre + mine), ck.get(theirs)):
            fail("%s%s differs from %s" % (pre, mine, theirs))
    return pre


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--base")
    a = p.parse_args()

    def fail(msg):
        print("check-mtp-tensors: " + msg)
        sys.exit(1)
    ck = Checkpoint(a.model)
    pre = check_module(ck, fail)
    mtp = [n for n in ck.tensors if n.startswith(pre)]
    if a.base:
        base = Checkpoint(a.base)
        for name, (dtype, arr) in base.tensors.items():
            got = ck.tensors.get(name)
            if got is None or got[0] != dtype or \
                    got[1].tobytes() != arr.tobytes():
                fail("%s differs from the base" % name)
        if len(ck.tensors) != len(base.tensors) + len(mtp):
            fail("tensors beside the base and the module")
    print("mtp tensors %d" % len(mtp))


if __name__ == "__main__":
    main()
