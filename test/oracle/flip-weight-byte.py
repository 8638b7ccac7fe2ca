"""Damages one weight of a plan's fp9 image, for the oracle's negative tests.

  flip-weight-byte.py PLAN_DIR OUT_DIR --duck R --slot S --matrix M
      --row r --col c [--plane magnitude|sign|scale] [--plan-dump TOOL]

Copies PLAN_DIR to OUT_DIR and flips one bit of duck R's image: the
magnitude byte of local weight (r, c) of packed matrix M of slot S (its
lowest mantissa bit), or that weight's sign bit, or the lowest mantissa bit
of the scale of its (row tile, block). The place comes from the plan's
dump and docs/fp9.md's plane layout (fp9_np.plane_layout); the test then
checks that fp9_images.py names exactly that matrix, row and column.
"""
import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fp9_np  # noqa: E402
from fp9_images import (ffn_pieces, head_groups, head_pieces,  # noqa: E402
                        load_plan, scale_rows_of)
from safetensors_np import Checkpoint  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("plan")
p.add_argument("out")
p.add_argument("--model", help="checkpoint (its FP8 block sets the row "
               "tile; default: the plan's checkpoint_dir)")
p.add_argument("--duck", type=int, required=True)
p.add_argument("--slot", type=int, required=True)
p.add_argument("--matrix", type=int, required=True)
p.add_argument("--row", type=int, required=True)
p.add_argument("--col", type=int, required=True)
p.add_argument("--plane", choices=["magnitude", "sign", "scale"],
               default="magnitude")
p.add_argument("--plan-dump", default=shutil.which("duck-plan-dump")
               or "duck-plan-dump")
a = p.parse_args()

plan, _ = load_plan(a.plan, a.plan_dump)
duck = plan["ducks"][a.duck]
slot = duck["slots"][a.slot]
m = slot["matrices"][a.matrix]
ck = Checkpoint(a.model or plan["checkpoint_dir"])
sr = scale_rows_of(ck)
# The matrix's first source row sets its row phase: which scale row a
# local row uses (the scale plane comes last, so only a scale flip needs it).
if slot["head"]:
    pieces = head_pieces(slot, head_groups(plan)[a.slot], ck)
else:
    ops = {op["params"]["step"]["slot"]: op for op in plan["ops"]
           if op["params_type"] in ("DenseFfnOpDef", "MoeFfnOpDef")}
    pieces = ffn_pieces(slot, ops.get(a.slot), ck)
phase = [row0 for i, _, row0, _, _ in pieces if i == a.matrix][0] % sr
lay = fp9_np.plane_layout(m["rows"], m["k"], m["block"], sr, phase)
if a.plane == "magnitude":
    at, bit = m["offset"] + lay["mag"] + a.row * m["k"] + a.col, 0
elif a.plane == "sign":
    word = m["offset"] + lay["sign"] + (a.row * (m["k"] // 32) + a.col // 32) * 4
    at, bit = word + (a.col % 32) // 8, a.col % 8
else:
    t = (a.row + phase) // sr
    at = m["offset"] + lay["scale"] + (t * lay["blocks"] + a.col // m["block"]) * 4
    bit = 0  # lowest mantissa bit of the little-endian float
if os.path.exists(a.out):
    shutil.rmtree(a.out)
shutil.copytree(a.plan, a.out)
path = os.path.join(a.out, duck["image"])
data = bytearray(open(path, "rb").read())
data[at] ^= 1 << bit
open(path, "wb").write(bytes(data))
print("flipped bit %d of byte %d of %s (%s of duck %d slot %d matrix %d, "
      "row %d column %d)" % (bit, at, duck["image"], a.plane, a.duck, a.slot,
                             a.matrix, a.row, a.col))
