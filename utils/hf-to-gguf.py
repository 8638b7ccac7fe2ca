#!/usr/bin/env python3
"""Write a Qwen3 / Qwen3-MoE Hugging Face checkpoint as an F16 GGUF file.

Used by `duck-bench e2e --llama-bench PATH` to give llama.cpp the very same
weights duckrun runs: FP8 tensors (F8_E4M3 with 128x128 F32 block scales,
`<name>_scale_inv`) are dequantised exactly to float32 and stored as F16 (the
norms and the MoE router stay F32); llama-quantize then makes the Q8_0 file
that is benchmarked. Only the GGUF container comes from llama.cpp: its
`gguf-py` package (give its directory with --gguf-py, or put it on
PYTHONPATH). Needs numpy (Debian: python3-numpy).

  hf-to-gguf.py MODEL_DIR OUT.gguf [--gguf-py LLAMA_CPP/gguf-py]

Tensors are read through a memory map; the output is written to
OUT.gguf.tmp-<pid> and renamed, so a failed run leaves no partial file.
"""
import argparse
import json
import os
import struct
import sys


def fail(msg):
    print(f"hf-to-gguf: {msg}", file=sys.stderr)
    sys.exit(1)


def fp8_e4m3_table(np):
    """float32 value of each of the 256 F8_E4M3 (fn) bytes."""
    t = np.zeros(256, dtype=np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = np.nan
        elif e == 0:
            t[b] = sign * (m / 8.0) * 2.0 ** -6
        else:
            t[b] = sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t


class SafeTensors:
    """The tensors of one checkpoint directory (one file or an index)."""

    def __init__(self, np, model_dir):
        self.np = np
        self.where = {}
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            files = sorted(set(json.load(open(index))["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        for f in files:
            path = os.path.join(model_dir, f)
            try:
                with open(path, "rb") as fh:
                    n = struct.unpack("<Q", fh.read(8))[0]
                    header = json.loads(fh.read(n))
            except (OSError, ValueError, struct.error) as e:
                fail(f"{path}: cannot read the safetensors header: {e}")
            mm = np.memmap(path, dtype=np.uint8, mode="r")
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                begin, end = info["data_offsets"]
                self.where[name] = (mm, 8 + n + begin, 8 + n + end, info["dtype"], info["shape"])
        self.fp8 = fp8_e4m3_table(np)

    def __contains__(self, name):
        return name in self.where

    def names(self):
        return self.where.keys()

    def get(self, name):
        """float32 array of a tensor (FP8 dequantised with its block scales)."""
        np = self.np
        if name not in self.where:
            fail(f"tensor {name} is missing from the checkpoint")
        mm, b, e, dtype, shape = self.where[name]
        raw = mm[b:e]
        if dtype == "F32":
            return raw.view(np.float32).reshape(shape)
        if dtype == "BF16":
            return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
        if dtype == "F16":
            return raw.view(np.float16).astype(np.float32).reshape(shape)
        if dtype == "F8_E4M3":
            w = self.fp8[raw].reshape(shape)
            scale = self.get(name + "_scale_inv")
            if len(shape) != 2:
                fail(f"{name}: F8_E4M3 tensor of rank {len(shape)} (2 expected)")
            rows, cols = shape
            block_r = -(-rows // scale.shape[0])
            block_c = -(-cols // scale.shape[1])
            full = np.repeat(np.repeat(scale, block_r, axis=0), block_c, axis=1)
            return w * full[:rows, :cols]
        fail(f"{name}: dtype {dtype} is not supported")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--gguf-py", help="llama.cpp's gguf-py directory")
    args = ap.parse_args()
    if args.gguf_py:
        sys.path.insert(0, args.gguf_py)
    try:
        import numpy as np
        import gguf
    except ImportError as e:
        fail(f"{e} (numpy: Debian's python3-numpy; gguf: --gguf-py LLAMA_CPP/gguf-py)")

    try:
        cfg = json.load(open(os.path.join(args.model_dir, "config.json")))
        tok = json.load(open(os.path.join(args.model_dir, "tokenizer.json")))
    except (OSError, ValueError) as e:
        fail(f"{args.model_dir}: {e}")
    model_type = cfg.get("model_type")
    arch = {"qwen3": gguf.MODEL_ARCH.QWEN3, "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE}.get(model_type)
    if arch is None:
        fail(f"{args.model_dir}/config.json: model_type {model_type!r} (qwen3 or qwen3_moe expected)")
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    st = SafeTensors(np, args.model_dir)

    tmp = f"{args.out}.tmp-{os.getpid()}"
    w = gguf.GGUFWriter(tmp, arch_name)
    L = cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_name(os.path.basename(os.path.normpath(args.model_dir)))
    w.add_block_count(L)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(cfg.get("rope_theta", 1e6))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if arch == gguf.MODEL_ARCH.QWEN3MOE:
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])

    # Tokenizer: byte-level BPE as tokenizer.json has it.
    vocab_size = cfg["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, i in tok["model"]["vocab"].items():
        if i < vocab_size:
            tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for added in tok.get("added_tokens", []):
        if added["id"] < vocab_size:
            tokens[added["id"]] = added["content"]
            types[added["id"]] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if cfg.get("bos_token_id") is not None:
        w.add_bos_token_id(cfg["bos_token_id"])
    if cfg.get("eos_token_id") is not None:
        w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(False)

    def f16(name):
        return st.get(name).astype(np.float16)

    def f32(name):
        return np.ascontiguousarray(st.get(name), dtype=np.float32)

    w.add_tensor("token_embd.weight", f16("model.embed_tokens.weight"))
    w.add_tensor("output_norm.weight", f32("model.norm.weight"))
    if not cfg.get("tie_word_embeddings", False):
        w.add_tensor("output.weight", f16("lm_head.weight"))
    attn = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
    ffn = {"gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    for l in range(L):
        p, q = f"model.layers.{l}.", f"blk.{l}."
        w.add_tensor(q + "attn_norm.weight", f32(p + "input_layernorm.weight"))
        w.add_tensor(q + "ffn_norm.weight", f32(p + "post_attention_layernorm.weight"))
        w.add_tensor(q + "attn_q_norm.weight", f32(p + "self_attn.q_norm.weight"))
        w.add_tensor(q + "attn_k_norm.weight", f32(p + "self_attn.k_norm.weight"))
        for hf, gg in attn.items():
            w.add_tensor(q + gg + ".weight", f16(p + f"self_attn.{hf}.weight"))
        if p + "mlp.gate.weight" in st:
            w.add_tensor(q + "ffn_gate_inp.weight", f32(p + "mlp.gate.weight"))
            E = cfg["num_experts"]
            for hf, gg in ffn.items():
                stacked = np.stack([f16(p + f"mlp.experts.{e}.{hf}.weight") for e in range(E)])
                w.add_tensor(q + gg + "_exps.weight", stacked)
        else:
            for hf, gg in ffn.items():
                w.add_tensor(q + gg + ".weight", f16(p + f"mlp.{hf}.weight"))
        print(f"hf-to-gguf: layer {l + 1}/{L}", file=sys.stderr, flush=True)

    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, args.out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    print(f"hf-to-gguf: wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
