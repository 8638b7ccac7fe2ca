"""Compares two raw float32 logits files (duckrun's, the reference's) row by row.

With --vocab each row is one position's logits. `duckrun --logits-out`
writes every prompt position's row, then one row for every generated token
that was fed back, i.e. all but the last generated token (runtime/src/
session/Generate.cpp); `reference.py --logits-out` writes the same rows, and with
--teacher-ids it computes them over the prompt plus duckrun's own ids, so
row i of both files always has the same context. Prints the worst row's max
absolute difference (absolute, and relative to that row's max |x| in the
reference), the worst relative L2 error and how many rows' argmax agree;
exits 1 when any row exceeds --rel-l2, --max-abs (relative) or --max-delta
(absolute), or when the files' sizes differ.
"""
import argparse
import sys

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("got")
p.add_argument("ref")
p.add_argument("--vocab", type=int, default=0, help="floats a row (0: one row)")
p.add_argument("--rel-l2", type=float, default=float("inf"))
p.add_argument("--max-abs", type=float, default=float("inf"))
p.add_argument("--max-delta", type=float, default=float("inf"))
a = p.parse_args()

g = np.fromfile(a.got, dtype="<f4").astype(np.float64)
r = np.fromfile(a.ref, dtype="<f4").astype(np.float64)
V = a.vocab or len(r)
if len(g) != len(r) or len(r) == 0 or len(r) % V:
    print("length mismatch: %d vs %d floats (vocab %d)" % (len(g), len(r), V))
    sys.exit(1)
g, r = g.reshape(-1, V), r.reshape(-1, V)
delta = np.abs(g - r).max(axis=1)
scale = np.abs(r).max(axis=1)
rel = np.linalg.norm(g - r, axis=1) / np.linalg.norm(r, axis=1)
same = int((g.argmax(axis=1) == r.argmax(axis=1)).sum())
print("rows %d max_delta %.3e max_abs_rel %.3e rel_l2 %.3e argmax %s"
      % (len(r), delta.max(), (delta / scale).max(), rel.max(),
         "same" if same == len(r) else "differs in %d rows" % (len(r) - same)))
ok = (rel.max() <= a.rel_l2 and (delta / scale).max() <= a.max_abs
      and delta.max() <= a.max_delta)
sys.exit(0 if ok else 1)
