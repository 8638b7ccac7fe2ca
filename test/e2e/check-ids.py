# Checks generated token ids against the reference's: the same ids, and a
# continuation that is not degenerate (at least --min-distinct different
# ids), so that a greedy match means something. Exits 1 otherwise.
import argparse
import sys

p = argparse.ArgumentParser()
p.add_argument("got")
p.add_argument("ref")
p.add_argument("--min-distinct", type=int, default=1)
a = p.parse_args()
got = open(a.got).read().split()
ref = open(a.ref).read().split()
if got != ref:
    first = next((i for i, (x, y) in enumerate(zip(got, ref)) if x != y),
                 min(len(got), len(ref)))
    print("ids differ from token %d: got %s, reference %s"
          % (first, " ".join(got), " ".join(ref)))
    sys.exit(1)
distinct = len(set(ref))
print("ids same (%d tokens, %d distinct)" % (len(ref), distinct))
if distinct < a.min_distinct:
    print("degenerate continuation: %d distinct ids, want at least %d"
          % (distinct, a.min_distinct))
    sys.exit(1)
