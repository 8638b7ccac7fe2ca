"""Float64 reference forward pass for Qwen3 and Qwen3-MoE, with numpy.

Independent of Duck's code: it reads config.json and the safetensors itself
(safetensors_np.py), takes the FP8 block size from
quantization_config.weight_block_size, and follows
shared/reference/MATH.md. No fp9, no ducks.

  reference.py MODEL --prompt-ids 1,2,3 [--generate N] [--logits-out F]

prints the greedy continuation's ids; --logits-out writes the logits of
every prompt position and then of every generated token but the last
(raw float32, vocab floats a row), the rows `duckrun --logits-out` writes.
"""
import argparse
import sys

import numpy as np

from safetensors_np import Checkpoint


def rmsnorm(x, w, eps):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope_neox(x, pos, theta):
    """x: [T, heads, D]; rotates pairs (i, i + D/2)."""
    D = x.shape[-1]
    inv = theta ** (-2.0 * np.arange(D // 2) / D)
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1)


def silu(x):
    return x / (1.0 + np.exp(-x))


class Qwen3:
    def __init__(self, ck):
        self.ck, self.c = ck, ck.config
        self.w = {}

    def W(self, name):
        if name not in self.w:
            self.w[name] = self.ck.get(name)
        return self.w[name]

    def mlp(self, pre, x):
        g = x @ self.W(pre + "gate_proj.weight").T
        u = x @ self.W(pre + "up_proj.weight").T
        return (silu(g) * u) @ self.W(pre + "down_proj.weight").T

    def is_moe(self, L):
        c = self.c
        return (c["model_type"] == "qwen3_moe" and c.get("num_experts", 0) > 0
                and L not in c.get("mlp_only_layers", [])
                and (L + 1) % c.get("decoder_sparse_step", 1) == 0)

    def moe(self, pre, x):
        c = self.c
        logits = x @ self.W(pre + "gate.weight").T
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        k = c["num_experts_per_tok"]
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            idx = np.argsort(-p[t], kind="stable")[:k]
            w = p[t, idx]
            if c.get("norm_topk_prob", False):
                w = w / w.sum()
            for e, we in zip(idx, w):
                out[t] += we * self.mlp(pre + "experts.%d." % e, x[t:t + 1])[0]
        return out

    def attention(self, pre, x, pos):
        c = self.c
        T = x.shape[0]
        Hq, Hkv, D = c["num_attention_heads"], c["num_key_value_heads"], \
            c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        eps = c.get("rms_norm_eps", 1e-6)
        theta = c.get("rope_theta", 1e6)
        q = (x @ self.W(pre + "q_proj.weight").T).reshape(T, Hq, D)
        k = (x @ self.W(pre + "k_proj.weight").T).reshape(T, Hkv, D)
        v = (x @ self.W(pre + "v_proj.weight").T).reshape(T, Hkv, D)
        q = rope_neox(rmsnorm(q, self.W(pre + "q_norm.weight"), eps), pos, theta)
        k = rope_neox(rmsnorm(k, self.W(pre + "k_norm.weight"), eps), pos, theta)
        rep = Hq // Hkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(D)
        s = s + np.triu(np.full((T, T), -np.inf), 1)[None]
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, Hq * D)
        return o @ self.W(pre + "o_proj.weight").T

    def logits(self, ids):
        """Logits of every position of `ids` (no cache: [T, vocab])."""
        c = self.c
        eps = c.get("rms_norm_eps", 1e-6)
        x = self.W("model.embed_tokens.weight")[np.array(ids)]
        pos = np.arange(len(ids), dtype=np.float64)
        for L in range(c["num_hidden_layers"]):
            pre = "model.layers.%d." % L
            h = rmsnorm(x, self.W(pre + "input_layernorm.weight"), eps)
            x = x + self.attention(pre + "self_attn.", h, pos)
            h = rmsnorm(x, self.W(pre + "post_attention_layernorm.weight"), eps)
            x = x + (self.moe(pre + "mlp.", h) if self.is_moe(L)
                     else self.mlp(pre + "mlp.", h))
        x = rmsnorm(x, self.W("model.norm.weight"), eps)
        head = "lm_head.weight"
        if not self.ck.has(head) and c.get("tie_word_embeddings", False):
            head = "model.embed_tokens.weight"
        return x @ self.W(head).T


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--prompt-ids", required=True)
    p.add_argument("--generate", type=int, default=0)
    p.add_argument("--logits-out")
    a = p.parse_args()
    ck = Checkpoint(a.model)
    mt = ck.config.get("model_type")
    if mt not in ("qwen3", "qwen3_moe"):
        sys.exit("reference.py: model_type %r is not supported" % mt)
    m = Qwen3(ck)
    ids = [int(t) for t in a.prompt_ids.split(",")]
    gen = []
    rows = m.logits(ids)
    for i in range(a.generate):
        gen.append(int(np.argmax(rows[-1])))
        if i + 1 < a.generate:
            rows = m.logits(ids + gen)
    if a.logits_out:
        rows.astype("<f4").tofile(a.logits_out)
    print(" ".join(str(t) for t in gen))


if __name__ == "__main__":
    main()
