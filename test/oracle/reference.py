"""Float64 reference forward pass for Qwen3, Qwen3-MoE, DeepSeek-V3 and
DeepSeek-V3.2, with numpy.

Independent of Duck's code: it reads config.json and the safetensors itself
(safetensors_np.py), takes the FP8 block size from
quantization_config.weight_block_size, and follows
shared/reference/MATH.md. No fp9, no ducks, unless --fp9-ducks asks.

  reference.py MODEL --prompt-ids 1,2,3 [--generate N] [--logits-out F]
      [--teacher-ids FILE] [--fp9-ducks PLAN_DIR] [--mtp-logits-out F]

prints the greedy continuation's ids; --logits-out writes the logits of
every prompt position and then of every generated token but the last
(raw float32, vocab floats a row), the rows `duckrun --logits-out` writes.

--teacher-ids FILE (the ids duckrun printed) forces that continuation: the
rows are the logits over the prompt plus those ids (all but the last), and
the printed ids are the reference's own argmax at each of those positions,
so one flipped argmax is reported as such and cannot derail the rows after
it. --fp9-ducks PLAN_DIR replaces every float (bf16/f16/f32) matrix the plan
puts on the ducks with its fp9 quantisation (docs/fp9.md's rule, computed
here by fp9_np.py on the slice each duck holds: the plan gives only the
slices and K-blocks); FP8 matrices convert exactly and are left as they are.

--mtp-logits-out F (DeepSeek with num_nextn_predict_layers 1) writes the
MTP module's logits (docs/mtp.md) at every position whose next token is
known, i.e. over the prompt plus the generated (or forced) ids: the same
rows, in the same format, as --logits-out.
"""
import argparse
import sys

import numpy as np

from safetensors_np import Checkpoint


def rmsnorm(x, w, eps):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope_neox(x, pos, theta, inv=None, scale=1.0):
    """x: [T, heads, D]; rotates pairs (i, i + D/2) by pos * inv[i] (plain
    RoPE's inverse frequencies unless given), cos and sin times `scale`."""
    D = x.shape[-1]
    if inv is None:
        inv = theta ** (-2.0 * np.arange(D // 2) / D)
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :] * scale, np.sin(ang)[:, None, :] * scale
    x0, x1 = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1)


def qwen3_rope(c, D):
    """Qwen3's inverse frequencies and cos/sin factor for config.json's
    rope_scaling: none or "default" is plain RoPE; "yarn" follows HF's
    _compute_yarn_parameters (modeling_rope_utils.py) with the factor the
    config gives (what vLLM and the Qwen3 model cards mean by it)."""
    base = c.get("rope_theta", 1e6)
    pos_freqs = base ** (np.arange(0, D, 2) / D)
    inv = 1.0 / pos_freqs
    rs = c.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv, 1.0
    if kind != "yarn":
        sys.exit("reference.py: rope_scaling %r is not supported" % kind)
    factor = rs["factor"]
    orig = rs.get("original_max_position_embeddings") \
        or c["max_position_embeddings"]

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * np.log(scale) + 1.0
    attention_factor = rs.get("attention_factor")
    if attention_factor is None:
        ms, msa = rs.get("mscale"), rs.get("mscale_all_dim")
        attention_factor = get_mscale(factor, ms) / get_mscale(factor, msa) \
            if ms and msa else get_mscale(factor)
    beta_fast = rs.get("beta_fast") or 32
    beta_slow = rs.get("beta_slow") or 1

    def correction_dim(rotations):
        return D * np.log(orig / (rotations * 2 * np.pi)) / (2 * np.log(base))
    low = max(np.floor(correction_dim(beta_fast)), 0)
    high = min(np.ceil(correction_dim(beta_slow)), D - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(D // 2) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # 1: the pretrained frequency, 0: divided
    inv = inv / factor * (1 - extrapolation) + inv * extrapolation
    return inv, attention_factor


def bf16(x):
    """x rounded to bf16 (from fp32, to nearest even) and widened back."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) \
        & np.uint32(0xFFFF0000)
    return u.view(np.float32).astype(np.float64)


def q8(x):
    """x as the q8 wire carries it (duck_rt/abi.h, duck_q8_encode_row),
    widened back: from fp32, each row (the last axis) in blocks of 32, a
    block's scale its largest magnitude over 127 rounded up to bf16, each
    value the nearest (ties to even) multiple of it."""
    rows = np.ascontiguousarray(x, dtype=np.float32)
    shape, n = rows.shape, rows.shape[-1]
    rows = rows.reshape(-1, n)
    out = np.empty(rows.shape, dtype=np.float32)
    for b in range(0, n, 32):
        blk = rows[:, b:b + 32]
        s = (np.abs(blk).max(axis=1) / np.float32(127)).astype(np.float32)
        u = s.view(np.uint32)
        u = np.where(u & np.uint32(0xFFFF) != 0, u + np.uint32(0x10000), u)
        s = (u & np.uint32(0xFFFF0000)).view(np.float32)[:, None]
        t = np.divide(blk, s, out=np.zeros_like(blk), where=s > 0)
        out[:, b:b + 32] = np.rint(np.clip(t, -127, 127)) * s
    return out.reshape(shape).astype(np.float64)


def e4m3(x):
    """x rounded to FP8 e4m3 (to nearest even; 3 mantissa bits, normal
    from 2^-6, subnormal steps of 2^-9, largest 448)."""
    x = np.clip(x, -448.0, 448.0)
    _, e = np.frexp(x)
    step = np.ldexp(1.0, np.maximum(e - 1, -6) - 3)
    return np.rint(x / step) * step


def act_quant_fp8(x, c):
    """x as an FP8 checkpoint's own linears take it (quantization_config
    activation_scheme "dynamic"; MATH.md 6, DeepSeek's act_quant): each
    token's values in blocks of 128, a block's scale its largest magnitude
    over 448 (that magnitude at least 1e-4, as DeepSeek-V3.2 clamps it,
    which keeps an all-zero block defined; with scale_fmt "ue8m0" the
    scale rounded up to a power of two), each value the nearest e4m3
    multiple of it."""
    q = c.get("quantization_config") or {}
    rows = np.array(x, dtype=np.float64)
    shape, n = rows.shape, rows.shape[-1]
    rows = rows.reshape(-1, n)
    for b in range(0, n, 128):
        blk = rows[:, b:b + 128]
        amax = np.maximum(np.abs(blk).max(axis=1, keepdims=True), 1e-4)
        s = amax / 448.0
        if q.get("scale_fmt") == "ue8m0":
            s = np.exp2(np.ceil(np.log2(s)))
        rows[:, b:b + 128] = e4m3(blk / s) * s
    return rows.reshape(shape)


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

    ffn_in_bf16 = False  # --ffn-input-bf16: what the ducks get on the wire
    ffn_in_q8 = False    # --ffn-input-q8: the same for the q8 wire
    act_fp8 = False      # --act-quant-fp8: the checkpoint's own rounding
    act_bf16 = False     # --act-bf16: a bf16 checkpoint's own rounding

    def lin(self, x, name):
        """x @ W(name).T; with act_fp8, x first rounded as the checkpoint's
        own FP8 linears round their input (act_quant_fp8) when `name` is
        stored in FP8 (it has a weight_scale_inv); with act_bf16, x and the
        product rounded to bf16, as a bf16 inference's matrices take and
        give them (layer() rounds the residual stream and the norms'
        outputs too; attention's softmax and sums stay exact: the least of
        a bf16 inference's roundings)."""
        if self.act_fp8 and self.ck.has(name + "_scale_inv"):
            x = act_quant_fp8(x, self.c)
        if self.act_bf16:
            return bf16(bf16(x) @ self.W(name).T)
        return x @ self.W(name).T

    def mlp(self, pre, x):
        if self.ffn_in_bf16:
            x = bf16(x)
        if self.ffn_in_q8:
            x = q8(x)
        g = self.lin(x, pre + "gate_proj.weight")
        u = self.lin(x, pre + "up_proj.weight")
        return self.lin(silu(g) * u, pre + "down_proj.weight")

    def is_moe(self, L):
        c = self.c
        return (c["model_type"] == "qwen3_moe" and c.get("num_experts", 0) > 0
                and L not in c.get("mlp_only_layers", [])
                and (L + 1) % c.get("decoder_sparse_step", 1) == 0)

    def moe(self, pre, x):
        c = self.c
        logits = self.lin(x, pre + "gate.weight")
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
        q = self.lin(x, pre + "q_proj.weight").reshape(T, Hq, D)
        k = self.lin(x, pre + "k_proj.weight").reshape(T, Hkv, D)
        v = self.lin(x, pre + "v_proj.weight").reshape(T, Hkv, D)
        inv, scale = qwen3_rope(c, D)
        q = rope_neox(rmsnorm(q, self.W(pre + "q_norm.weight"), eps), pos,
                      theta, inv, scale)
        k = rope_neox(rmsnorm(k, self.W(pre + "k_norm.weight"), eps), pos,
                      theta, inv, scale)
        rep = Hq // Hkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        qh, kh, vh = (np.ascontiguousarray(a.transpose(1, 0, 2))
                      for a in (q, k, v))
        # Query rows in chunks: [heads, T, T] float64 is 128 MiB a head at
        # 4096 positions.
        o = np.empty((T, Hq, D))
        for t0 in range(0, T, 512):
            t1 = min(T, t0 + 512)
            s = qh[:, t0:t1] @ kh[:, :t1].transpose(0, 2, 1) / np.sqrt(D)
            s = s + np.triu(np.full((t1 - t0, t1), -np.inf), t0 + 1)[None]
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            o[t0:t1] = (s @ vh[:, :t1]).transpose(1, 0, 2)
        return self.lin(o.reshape(T, Hq * D), pre + "o_proj.weight")

    def layer(self, L, x, pos):
        """Decoder layer L (model.layers.L.*) on x at positions pos."""
        pre, eps = "model.layers.%d." % L, self.c.get("rms_norm_eps", 1e-6)
        # --act-bf16: the residual stream and the norms' outputs in bf16 too,
        # as a bf16 inference holds them.
        r = bf16 if self.act_bf16 else (lambda v: v)
        h = r(rmsnorm(x, self.W(pre + "input_layernorm.weight"), eps))
        x = r(x + self.attention(pre + "self_attn.", h, pos))
        h = r(rmsnorm(x, self.W(pre + "post_attention_layernorm.weight"), eps))
        return r(x + (self.moe(pre + "mlp.", h) if self.is_moe(L)
                      else self.mlp(pre + "mlp.", h)))

    def hidden(self, ids):
        """The final hidden state of every position of `ids`, after
        model.norm: the vector the LM head multiplies ([T, hidden])."""
        c = self.c
        x = self.W("model.embed_tokens.weight")[np.array(ids)]
        pos = np.arange(len(ids), dtype=np.float64)
        for L in range(c["num_hidden_layers"]):
            x = self.layer(L, x, pos)
        return rmsnorm(x, self.W("model.norm.weight"),
                       c.get("rms_norm_eps", 1e-6))

    def logits(self, ids):
        """Logits of every position of `ids` (no cache: [T, vocab])."""
        head = "lm_head.weight"
        if not self.ck.has(head) and self.c.get("tie_word_embeddings", False):
            head = "model.embed_tokens.weight"
        return self.hidden(ids) @ self.W(head).T


def yarn_mscale(factor, m):
    return 1.0 if factor <= 1 else 0.1 * m * np.log(factor) + 1.0


def rope_freqs(c):
    """DeepSeek's rope frequencies (YaRN-corrected at every length, as HF
    and vLLM apply them), the cos/sin factor and the softmax mscale^2."""
    dim, base = c["qk_rope_head_dim"], c.get("rope_theta", 10000.0)
    f = base ** (-np.arange(0, dim, 2) / dim)
    rs = c.get("rope_scaling") or {}
    factor = rs.get("factor", 1.0)
    if factor <= 1:
        return f, 1.0, 1.0
    orig = rs["original_max_position_embeddings"]

    def corr(rot):
        return dim * np.log(orig / (rot * 2 * np.pi)) / (2 * np.log(base))
    lo = max(np.floor(corr(rs.get("beta_fast", 32))), 0)
    hi = min(np.ceil(corr(rs.get("beta_slow", 1))), dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dim // 2) - lo) / (hi - lo), 0, 1)
    f = f / factor * ramp + f * (1 - ramp)
    ms, msa = rs.get("mscale", 1.0), rs.get("mscale_all_dim", 0.0)
    cs = yarn_mscale(factor, ms) / yarn_mscale(factor, msa)
    m2 = yarn_mscale(factor, msa) ** 2 if msa else 1.0
    return f, cs, m2


def rope_pairs(x, pos, f, cs):
    """Interleaved RoPE: adjacent pairs (x[2i], x[2i+1]); x: [T, ..., dim]."""
    ang = pos[:, None] * f[None, :]
    shape = (len(pos),) + (1,) * (x.ndim - 2) + (len(f),)
    c, s = (np.cos(ang) * cs).reshape(shape), (np.sin(ang) * cs).reshape(shape)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def rope_half(x, pos, f, cs):
    """NeoX RoPE (half split) with DeepSeek's frequencies (the indexer's)."""
    D = x.shape[-1]
    ang = pos[:, None] * f[None, :]
    shape = (len(pos),) + (1,) * (x.ndim - 2) + (len(f),)
    c, s = (np.cos(ang) * cs).reshape(shape), (np.sin(ang) * cs).reshape(shape)
    x0, x1 = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1)


class DeepSeek(Qwen3):
    """DeepSeek-V3 / V3.2: MLA (MATH.md 4), the V3.2 indexer (5), the
    sigmoid group-limited router with shared experts (3)."""

    def is_moe(self, L):
        c = self.c
        return (c.get("n_routed_experts") and L >= c.get("first_k_dense_replace", 0)
                and L % c.get("moe_layer_freq", 1) == 0)

    def moe(self, pre, x):
        c = self.c
        E, K = c["n_routed_experts"], c["num_experts_per_tok"]
        G, TG = c.get("n_group", 1), c.get("topk_group", 1)
        s = 1.0 / (1.0 + np.exp(-(self.lin(x, pre + "gate.weight"))))
        bias = self.W(pre + "gate.e_score_correction_bias") \
            if self.ck.has(pre + "gate.e_score_correction_bias") else 0.0
        sel = s + bias
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            g = sel[t].reshape(G, E // G)
            gscore = np.sort(g, axis=1)[:, ::-1][:, :2].sum(axis=1) \
                if E // G > 1 else g[:, 0]
            keep = np.argsort(-gscore, kind="stable")[:TG]
            masked = np.full(E, -np.inf)
            for k in keep:
                masked[k * (E // G):(k + 1) * (E // G)] = sel[t, k * (E // G):(k + 1) * (E // G)]
            idx = np.argsort(-masked, kind="stable")[:K]
            w = s[t, idx]
            if c.get("norm_topk_prob", False):
                w = w / (w.sum() + 1e-20)
            w = w * c.get("routed_scaling_factor", 1.0)
            for e, we in zip(idx, w):
                out[t] += we * self.mlp(pre + "experts.%d." % e, x[t:t + 1])[0]
        if c.get("n_shared_experts", 0):
            out += self.mlp(pre + "shared_experts.", x)
        return out

    def indexer_mask(self, pre, x, cq, pos, f, cs):
        """[T, T] additive mask: 0 for the index_topk causal tokens with the
        largest index scores of each query, -inf elsewhere."""
        c = self.c
        T, nh, d = x.shape[0], c["index_n_heads"], c["index_head_dim"]
        rope = c["qk_rope_head_dim"]
        q = self.lin(cq, pre + "indexer.wq_b.weight").reshape(T, nh, d)
        k = self.lin(x, pre + "indexer.wk.weight")
        mu = k.mean(axis=-1, keepdims=True)
        var = ((k - mu) ** 2).mean(axis=-1, keepdims=True)
        k = (k - mu) / np.sqrt(var + 1e-6) * self.W(pre + "indexer.k_norm.weight") \
            + self.W(pre + "indexer.k_norm.bias")
        q = np.concatenate([rope_half(q[..., :rope], pos, f, cs), q[..., rope:]], -1)
        k = np.concatenate([rope_half(k[:, None, :rope], pos, f, cs)[:, 0],
                            k[:, rope:]], -1)
        w = self.lin(x, pre + "indexer.weights_proj.weight") * nh ** -0.5
        score = np.einsum("shd,td->sht", q, k)
        I = np.einsum("sh,sht->st", w * d ** -0.5, np.maximum(score, 0))
        I = I + np.triu(np.full((T, T), -np.inf), 1)
        mask = np.full((T, T), -np.inf)
        for s_ in range(T):
            top = np.argsort(-I[s_], kind="stable")[:min(c["index_topk"], s_ + 1)]
            mask[s_, top] = 0.0
        return mask

    def attention(self, pre, x, pos):
        c = self.c
        T, H = x.shape[0], c["num_attention_heads"]
        nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        R, eps = c["kv_lora_rank"], c.get("rms_norm_eps", 1e-6)
        f, cs, m2 = rope_freqs(c)
        cq = None
        if c.get("q_lora_rank"):
            cq = rmsnorm(self.lin(x, pre + "q_a_proj.weight"),
                         self.W(pre + "q_a_layernorm.weight"), eps)
            q = self.lin(cq, pre + "q_b_proj.weight")
        else:
            q = self.lin(x, pre + "q_proj.weight")
        q = q.reshape(T, H, nope + rope)
        qn, qpe = q[..., :nope], rope_pairs(q[..., nope:], pos, f, cs)
        kva = self.lin(x, pre + "kv_a_proj_with_mqa.weight")
        ckv = rmsnorm(kva[:, :R], self.W(pre + "kv_a_layernorm.weight"), eps)
        kpe = rope_pairs(kva[:, None, R:], pos, f, cs)[:, 0]
        kv = self.lin(ckv, pre + "kv_b_proj.weight").reshape(T, H, nope + vd)
        kn, v = kv[..., :nope], kv[..., nope:]
        sc = (np.einsum("thd,shd->hts", qn, kn) +
              np.einsum("thd,sd->hts", qpe, kpe)) * (nope + rope) ** -0.5 * m2
        sc = sc + np.triu(np.full((T, T), -np.inf), 1)[None]
        if c.get("index_topk") and self.ck.has(pre + "indexer.wk.weight"):
            sc = sc + self.indexer_mask(pre, x, cq, pos, f, cs)[None]
        sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
        sc /= sc.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", sc, v).reshape(T, H * vd)
        return self.lin(o, pre + "o_proj.weight")

    def mtp_logits(self, seq):
        """docs/mtp.md: the MTP module's logits at every position i of
        seq but the last (it needs t_{i+1}): h_i the main model's final
        hidden state (after model.norm), x_i = eh_proj(concat(enorm(
        embed(t_{i+1})), hnorm(h_i))), the MTP decoder layer at RoPE
        positions 0.. (its own attention over its own keys), then
        shared_head.norm and shared_head.head: logits for t_{i+2}."""
        c = self.c
        L, eps = c["num_hidden_layers"], c.get("rms_norm_eps", 1e-6)
        if c.get("num_nextn_predict_layers", 0) < 1:
            sys.exit("reference.py: the checkpoint has no MTP module "
                     "(num_nextn_predict_layers 0)")
        pre = "model.layers.%d." % L
        h = self.hidden(seq[:-1])
        e = self.W(pre + "embed_tokens.weight")[np.array(seq[1:])]
        x = np.concatenate([rmsnorm(e, self.W(pre + "enorm.weight"), eps),
                            rmsnorm(h, self.W(pre + "hnorm.weight"), eps)],
                           axis=-1) @ self.W(pre + "eh_proj.weight").T
        x = self.layer(L, x, np.arange(len(seq) - 1, dtype=np.float64))
        x = rmsnorm(x, self.W(pre + "shared_head.norm.weight"), eps)
        return x @ self.W(pre + "shared_head.head.weight").T


def fp9_duck_weights(ck, plan_dir, plan_dump=None):
    """{tensor name: float64 matrix} for every float matrix the plan puts
    on the ducks, each duck's slice quantised to fp9 by docs/fp9.md's rule
    (fp9_np.quantised_values): the values the ducks multiply. Which slice
    of which tensor a duck holds comes from the plan (fp9_images.py's
    reading of duck-plan-dump); the quantisation is this oracle's own."""
    import shutil
    import fp9_images
    import fp9_np
    from safetensors_np import bf16_to_f32
    plan, _ = fp9_images.load_plan(
        plan_dir, plan_dump or shutil.which("duck-plan-dump")
        or "duck-plan-dump")
    sr = fp9_images.scale_rows_of(ck)
    ffn_ops = {op["params"]["step"]["slot"]: op for op in plan["ops"]
               if op["params_type"] in ("DenseFfnOpDef", "MoeFfnOpDef")}
    heads = fp9_images.head_groups(plan)
    out, done = {}, {}
    for duck in plan["ducks"]:
        for si, slot in enumerate(duck["slots"]):
            pieces = (fp9_images.head_pieces(slot, heads[si], ck)
                      if slot["head"] else
                      fp9_images.ffn_pieces(slot, ffn_ops.get(si), ck))
            for i, name, row0, col0, _ in pieces:
                dtype, arr = ck.tensors[name]
                if dtype == "F8_E4M3":
                    continue  # exact: ck.get(name) is what the ducks hold
                m = slot["matrices"][i]
                rows, k = m["rows"], m["k"]
                src = arr[row0:row0 + rows, col0:col0 + k]
                w = bf16_to_f32(src) if dtype == "BF16" \
                    else src.astype(np.float32)
                if name not in out:
                    out[name] = ck.get(name).copy()
                    done[name] = np.zeros(arr.shape, bool)
                out[name][row0:row0 + rows, col0:col0 + k] = \
                    fp9_np.quantised_values(w, m["block"], sr, row0 % sr)
                done[name][row0:row0 + rows, col0:col0 + k] = True
    for name, d in done.items():
        if not d.all():
            sys.exit("reference.py: the plan's ducks hold only part of %s"
                     % name)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--prompt-ids", required=True)
    p.add_argument("--generate", type=int, default=0)
    p.add_argument("--logits-out")
    p.add_argument("--ffn-input-bf16", action="store_true",
                   help="round every FFN's and expert's input to bf16 "
                   "(duckc --wire-activations bf16; the routers keep fp32)")
    p.add_argument("--ffn-input-q8", action="store_true",
                   help="round every FFN's and expert's input as the q8 "
                   "wire does (duckc --wire-activations q8; the routers "
                   "keep fp32)")
    p.add_argument("--act-quant-fp8", action="store_true",
                   help="round the input of every matrix the checkpoint "
                   "stores in FP8 as its own activation scheme does (per "
                   "token, blocks of 128 values in e4m3 with a scale each: "
                   "MATH.md 6): what the checkpoint's published inference "
                   "multiplies, to set the wire's drift beside")
    p.add_argument("--act-bf16", action="store_true",
                   help="round every matrix's input and product, the "
                   "residual stream and the layers' norms to bf16, as a "
                   "bf16 checkpoint's own inference at least does")
    p.add_argument("--teacher-ids",
                   help="a file of generated ids (duckrun --print-ids): "
                   "force them, print the reference's argmax at each")
    p.add_argument("--fp9-ducks", metavar="PLAN_DIR",
                   help="quantise the float matrices this plan puts on "
                   "the ducks to fp9 as docs/fp9.md says")
    p.add_argument("--plan-dump", help="duck-plan-dump (default: on PATH)")
    p.add_argument("--mtp-logits-out", metavar="FILE",
                   help="DeepSeek with an MTP module: its logits (the "
                   "guess for t_{i+2}) at every position i whose next "
                   "token is known, the rows --logits-out has (docs/mtp.md)")
    a = p.parse_args()
    ck = Checkpoint(a.model)
    mt = ck.config.get("model_type")
    if mt in ("qwen3", "qwen3_moe"):
        m = Qwen3(ck)
    elif mt in ("deepseek_v3", "deepseek_v32"):
        m = DeepSeek(ck)
    else:
        sys.exit("reference.py: model_type %r is not supported" % mt)
    m.ffn_in_bf16 = a.ffn_input_bf16
    m.ffn_in_q8 = a.ffn_input_q8
    m.act_fp8 = a.act_quant_fp8
    m.act_bf16 = a.act_bf16
    if a.mtp_logits_out and not isinstance(m, DeepSeek):
        sys.exit("reference.py: --mtp-logits-out: only DeepSeek has an "
                 "MTP module")
    ids = [int(t) for t in a.prompt_ids.split(",")]
    if a.fp9_ducks:
        m.w.update(fp9_duck_weights(ck, a.fp9_ducks, a.plan_dump))
    if a.teacher_ids:
        forced = [int(t) for t in open(a.teacher_ids).read().split()]
        if not forced:
            sys.exit("reference.py: no ids in %s" % a.teacher_ids)
        rows = m.logits(ids + forced[:-1])
        if a.logits_out:
            rows.astype("<f4").tofile(a.logits_out)
        if a.mtp_logits_out:
            m.mtp_logits(ids + forced).astype("<f4").tofile(a.mtp_logits_out)
        own = np.argmax(rows[len(ids) - 1:], axis=1)
        print(" ".join(str(int(t)) for t in own))
        return
    gen = []
    rows = m.logits(ids)
    for i in range(a.generate):
        gen.append(int(np.argmax(rows[-1])))
        if i + 1 < a.generate:
            rows = m.logits(ids + gen)
    if a.logits_out:
        rows.astype("<f4").tofile(a.logits_out)
    if a.mtp_logits_out:
        if not gen and len(ids) < 2:
            sys.exit("reference.py: --mtp-logits-out needs two tokens")
        m.mtp_logits(ids + gen).astype("<f4").tofile(a.mtp_logits_out)
    print(" ".join(str(t) for t in gen))


if __name__ == "__main__":
    main()
