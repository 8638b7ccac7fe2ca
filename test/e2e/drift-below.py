"""Reads two compare-logits.py reports on the same rows: the wire's drift
(a plan with a coarser wire against the float64 reference) and the
checkpoint's own (the reference rounding its activations as the
checkpoint's inference does, reference.py --act-quant-fp8 / --act-bf16,
against the plain reference). Exits 1 unless the wire's worst relative L2
is below the checkpoint's own and it changes no more rows' argmax: the
premise of duckc's automatic wire (ChoosePlan.h, checkpointWire).
"""
import re
import sys


def parse(path):
    text = open(path).read()
    rel = re.search(r"rel_l2 ([0-9.e+-]+)", text)
    if not rel:
        sys.exit("drift-below.py: no rel_l2 in %s: %r" % (path, text))
    flips = re.search(r"argmax differs in (\d+) rows", text)
    return float(rel.group(1)), int(flips.group(1)) if flips else 0


if len(sys.argv) != 3:
    sys.exit("usage: drift-below.py WIRE_REPORT OWN_REPORT")
(wr, wf), (orl, of) = parse(sys.argv[1]), parse(sys.argv[2])
print("wire rel_l2 %.3e (%d argmax changed) against the checkpoint's own "
      "%.3e (%d)" % (wr, wf, orl, of))
sys.exit(0 if wr < orl and wf <= of else 1)
