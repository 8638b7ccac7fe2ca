"""Compares the DeepSeek-V3.2 indexer's selections in a duckrun debug dump
(DUCK_DEBUG_INDEXER_DUMP=PREFIX: PREFIX.L<layer>, see
runtime/src/engine/ops/Indexer.cpp) with the float64 reference's, as sets.

  check-indexer.py MODEL --prompt-ids 1,2,3 --gen-ids FILE --dump PREFIX
      [--ulps N]

The reference runs once over the prompt and the generated ids but the last
(the positions duckrun attended). For every dumped row, the positions the
reference keeps and Duck drops (A) and those Duck keeps and the reference
drops (B) must be near-ties: every a in A scores at most N fp32 ulps of
the row's largest |score| above every b in B (float64 scores); fp32
scores cannot order positions closer than that. Prints the rows compared,
the rows and positions swapped and the largest swapped gap in ulps; exits
1 on a swap beyond N ulps, a dumped row the reference does not have, or a
layer without rows.
"""
import argparse
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as R  # noqa: E402
from safetensors_np import Checkpoint  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--prompt-ids", required=True)
p.add_argument("--gen-ids", required=True, help="the reference's ids file")
p.add_argument("--dump", required=True, help="DUCK_DEBUG_INDEXER_DUMP prefix")
p.add_argument("--ulps", type=float, default=16)
a = p.parse_args()


def read_dump(path):
    rows = {}
    with open(path, "rb") as f:
        data = f.read()
    off = 0
    while off < len(data):
        seq, pos, n = struct.unpack_from("<iii", data, off)
        off += 12
        nb = (n + 7) // 8
        bits = np.unpackbits(np.frombuffer(data, np.uint8, nb, off),
                             bitorder="little")[:n].astype(bool)
        off += nb
        rows[pos] = bits
    return rows


ck = Checkpoint(a.model)
c = ck.config
K = c["index_topk"]
ids = [int(t) for t in a.prompt_ids.split(",")]
ids += [int(t) for t in open(a.gen_ids).read().split()][:-1]
failed = []


def scores(self, pre, x, cq, pos, f, cs):
    """The reference's index scores I[s, t] (MATH.md section 5), computed
    as DeepSeek.indexer_mask does before it takes the top-k."""
    T, nh, d = x.shape[0], c["index_n_heads"], c["index_head_dim"]
    rope = c["qk_rope_head_dim"]
    q = (cq @ self.W(pre + "indexer.wq_b.weight").T).reshape(T, nh, d)
    k = x @ self.W(pre + "indexer.wk.weight").T
    mu = k.mean(axis=-1, keepdims=True)
    var = ((k - mu) ** 2).mean(axis=-1, keepdims=True)
    k = (k - mu) / np.sqrt(var + 1e-6) * self.W(pre + "indexer.k_norm.weight") \
        + self.W(pre + "indexer.k_norm.bias")
    q = np.concatenate([R.rope_half(q[..., :rope], pos, f, cs), q[..., rope:]], -1)
    k = np.concatenate([R.rope_half(k[:, None, :rope], pos, f, cs)[:, 0],
                        k[:, rope:]], -1)
    w = (x @ self.W(pre + "indexer.weights_proj.weight").T) * nh ** -0.5
    score = np.einsum("shd,td->sht", q, k)
    return np.einsum("sh,sht->st", w * d ** -0.5, np.maximum(score, 0))


reference_mask = R.DeepSeek.indexer_mask


def checked_mask(self, pre, x, cq, pos, f, cs):
    mask = reference_mask(self, pre, x, cq, pos, f, cs)
    layer = int(pre.split(".")[2])
    I = scores(self, pre, x, cq, pos, f, cs)
    dump = read_dump("%s.L%d" % (a.dump, layer))
    if not dump:
        failed.append("layer %d: no rows in the dump" % layer)
    swapped_rows = swapped = 0
    worst = 0.0
    for s_, duck in sorted(dump.items()):
        if s_ >= x.shape[0]:
            failed.append("layer %d: dumped row %d beyond the %d positions"
                          % (layer, s_, x.shape[0]))
            break
        ref = mask[s_, :s_ + 1] == 0
        # The scores are the reference's own: its selection from them.
        top = np.zeros(s_ + 1, bool)
        top[np.argsort(-I[s_, :s_ + 1], kind="stable")[:K]] = True
        if not np.array_equal(top, ref):
            failed.append("layer %d row %d: scores disagree with the "
                          "reference's selection" % (layer, s_))
            break
        A, B = np.flatnonzero(ref & ~duck), np.flatnonzero(duck & ~ref)
        if len(A) != len(B):
            failed.append("layer %d row %d: Duck keeps %d positions, the "
                          "reference %d" % (layer, s_, duck.sum(), ref.sum()))
            break
        if not len(A):
            continue
        ulp = np.abs(I[s_, :s_ + 1]).max() * 2.0 ** -23
        gap = (I[s_, A].max() - I[s_, B].min()) / ulp
        swapped_rows += 1
        swapped += len(A)
        worst = max(worst, gap)
        if gap > a.ulps:
            failed.append("layer %d row %d: Duck drops position %d for %d, "
                          "%.1f ulps apart" % (layer, s_, A[0], B[0], gap))
    print("layer %d: rows %d swapped rows %d positions %d worst gap %.2f ulps"
          % (layer, len(dump), swapped_rows, swapped, worst))
    return mask


R.DeepSeek.indexer_mask = checked_mask
R.DeepSeek(ck).logits(ids)
for msg in failed[:10]:
    print(msg)
if len(failed) > 10:
    print("... and %d more" % (len(failed) - 10))
sys.exit(1 if failed else 0)
