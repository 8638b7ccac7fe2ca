"""Checks reference.py's MTP logits on a make-checkpoint.py --mtp-identity
checkpoint against a few lines of numpy.

On such a checkpoint eh_proj is [0 | I], hnorm is ones, the MTP layer's
o_proj and down projections are zero (the layer passes its input through)
and shared_head.norm is model.norm, so by docs/mtp.md the MTP logits at
position i are lm_head(norm(rmsnorm_unit(h_i))), h_i the main model's final
hidden state after model.norm. Two wrong readings give other numbers and
must not match: the concat swapped (hidden half first: [0 | I] then picks
enorm(embed(t_{i+1}))) and h_i taken before model.norm.

  check-mtp-identity.py MODEL MTP_LOGITS --ids 1,2,3 [--generated FILE]

--ids is the prompt, --generated the ids reference.py printed (the file's
rows cover the prompt plus those). Exits 1 unless the documented reading
matches (relative max |d| <= 1e-5 a row) and both wrong ones miss by more
than 1e-2.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402
from safetensors_np import Checkpoint  # noqa: E402


def unit_rms(x, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def worst(got, want):
    return float((np.abs(got - want).max(axis=1)
                  / np.abs(want).max(axis=1)).max())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("mtp_logits")
    p.add_argument("--ids", required=True)
    p.add_argument("--generated")
    a = p.parse_args()
    seq = [int(t) for t in a.ids.split(",")]
    if a.generated:
        seq += [int(t) for t in open(a.generated).read().split()]
    ck = Checkpoint(a.model)
    c = ck.config
    eps, H = c.get("rms_norm_eps", 1e-6), c["hidden_size"]
    m = reference.DeepSeek(ck)
    h = m.hidden(seq[:-1])  # after model.norm
    norm = ck.get("model.norm.weight")
    head = ck.get("lm_head.weight")
    pre = "model.layers.%d." % c["num_hidden_layers"]
    e = ck.get(pre + "embed_tokens.weight")[np.array(seq[1:])]
    got = np.fromfile(a.mtp_logits, dtype="<f4").astype(np.float64)
    if got.size != h.shape[0] * head.shape[0]:
        print("rows: %d floats, want %d rows of %d" % (got.size, h.shape[0],
                                                       head.shape[0]))
        return 1
    got = got.reshape(h.shape[0], -1)
    readings = {
        "documented": unit_rms(h, eps),
        "swapped": unit_rms(e, eps) * ck.get(pre + "enorm.weight"),
        "before-norm": unit_rms(h / norm, eps),
    }
    errs = {k: worst(got, (unit_rms(x, eps) * norm) @ head.T)
            for k, x in readings.items()}
    print("rows %d hidden %d " % (h.shape[0], H)
          + " ".join("%s %.3e" % kv for kv in errs.items()))
    ok = (errs["documented"] <= 1e-5 and errs["swapped"] > 1e-2
          and errs["before-norm"] > 1e-2)
    print("identity check", "passes" if ok else "FAILS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
