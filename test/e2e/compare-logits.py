# Compares two raw float32 logits files: prints the max absolute difference,
# the relative L2 error and whether the argmax agrees; exits 1 when the
# error exceeds --rel-l2 or --max-abs (relative to the reference's max |x|).
import argparse
import struct
import sys

p = argparse.ArgumentParser()
p.add_argument("got")
p.add_argument("ref")
p.add_argument("--rel-l2", type=float, required=True)
p.add_argument("--max-abs", type=float, required=True)
a = p.parse_args()


def load(path):
    b = open(path, "rb").read()
    return struct.unpack("<%df" % (len(b) // 4), b)


g, r = load(a.got), load(a.ref)
if len(g) != len(r) or not g:
    print("length mismatch: %d vs %d" % (len(g), len(r)))
    sys.exit(1)
scale = max(abs(x) for x in r)
maxabs = max(abs(x - y) for x, y in zip(g, r)) / scale
num = sum((x - y) ** 2 for x, y in zip(g, r)) ** 0.5
den = sum(y * y for y in r) ** 0.5
rel = num / den
same = max(range(len(g)), key=g.__getitem__) == max(range(len(r)), key=r.__getitem__)
print("max_abs_rel %.3e rel_l2 %.3e argmax %s" % (maxabs, rel, "same" if same else "differs"))
sys.exit(0 if rel <= a.rel_l2 and maxabs <= a.max_abs else 1)
