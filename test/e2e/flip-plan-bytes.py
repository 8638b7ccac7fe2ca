# Flips one byte at each of N positions spread over a plan file (fixed
# seed) and runs `duckrun` on each damaged copy: every run must fail with
# exit status 1 and one "duckrun: error:" line, never a signal and never a
# generation. Prints one line per outcome kind.
import os
import random
import shutil
import subprocess
import sys

duckrun, plan_dir, work, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
plan = os.path.join(plan_dir, "model.duckplan")
data = open(plan, "rb").read()
rng = random.Random(1)
positions = sorted(rng.sample(range(len(data)), n))
os.makedirs(work, exist_ok=True)
bad = 0
for pos in positions:
    d = os.path.join(work, "flip-%d" % pos)
    shutil.copytree(plan_dir, d, symlinks=True)
    b = bytearray(data)
    b[pos] ^= 1 << rng.randrange(8)
    open(os.path.join(d, "model.duckplan"), "wb").write(bytes(b))
    r = subprocess.run([duckrun, d, "--prompt-ids", "1,2", "--max-tokens", "1",
                        "--quiet", "--print-ids"], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 1 or "duckrun: error:" not in r.stderr:
        bad += 1
        print("byte %d: exit %d, stdout %r, stderr %r"
              % (pos, r.returncode, r.stdout[-80:], r.stderr[-200:]))
    shutil.rmtree(d)
print("%d of %d flipped plans refused with an error" % (n - bad, n))
sys.exit(1 if bad else 0)
