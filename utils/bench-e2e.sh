#!/usr/bin/env bash
# End-to-end decode benchmark (`duck-bench e2e` in docs/perf.md): a
# Qwen3-0.6B-shaped random FP8 model (28 layers, hidden 1024) and a
# Qwen3-30B-A3B-shaped MoE truncated to a few layers (hidden 2048, 128
# experts top-8, moe_intermediate 768), compiled and run with duckrun on a
# local cluster. Reports decode tok/s, TPOT, fp9 bytes touched per token and
# the implied bandwidth as a fraction of this machine's streaming read
# bandwidth measured in the same run (duck-bench kernels read-bw).
#
#   utils/bench-e2e.sh [--tokens N] [--moe-layers L] [--tp N] [--cores C]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DUCK_BUILD_DIR:-$ROOT/build}"
BIN="$BUILD/bin"
TOKENS=32; MOE_LAYERS=4; TP=1; CORES=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --tokens) TOKENS="$2"; shift 2;;
    --moe-layers) MOE_LAYERS="$2"; shift 2;;
    --tp) TP="$2"; shift 2;;
    --cores) CORES="$2"; shift 2;;
    -h|--help) sed -n 2,12p "$0"; exit 0;;
    *) echo "bench-e2e: unknown option $1" >&2; exit 2;;
  esac
done
for t in duck-mkmodel duckc duckrun duck-bench; do
  [ -x "$BIN/$t" ] || { echo "bench-e2e: $BIN/$t is missing; build first (utils/build.sh)" >&2; exit 1; }
done
WORK="$BUILD/bench-e2e"
mkdir -p "$WORK"
export XDG_CACHE_HOME="$WORK/cache"

echo "== machine read bandwidth (duck-bench kernels, read-bw only) ==" >&2
"$BIN/duck-bench" kernels --cores "$CORES" --filter read-bw --json --json-file "$WORK/bw.json" >/dev/null

run_model() {
  local name="$1"; shift
  if [ ! -d "$WORK/$name" ]; then
    "$BIN/duck-mkmodel" "$@" --dtype fp8 -q -o "$WORK/$name"
  fi
  "$BIN/duckc" compile "$WORK/$name" --tp "$TP" --cores-per-duck "$CORES" \
    --force -o "$WORK/$name-plan" >/dev/null
  # Warm-up run (fills the weight cache), then the measured one.
  "$BIN/duckrun" "$WORK/$name-plan" --prompt-ids 1,2,3,4,5,6,7,8 --max-tokens 4 \
    --ignore-eos --print-ids --quiet --cores-per-duck "$CORES" >/dev/null
  "$BIN/duckrun" "$WORK/$name-plan" --prompt-ids 1,2,3,4,5,6,7,8 \
    --max-tokens "$TOKENS" --ignore-eos --print-ids --quiet \
    --cores-per-duck "$CORES" --summary-json "$WORK/$name.json" >/dev/null
}
echo "== Qwen3-0.6B shape ==" >&2
run_model q06 --preset qwen3-0.6b-shape
echo "== Qwen3-30B-A3B shape, $MOE_LAYERS layers ==" >&2
run_model q30 --preset qwen3-30b-a3b-shape --layers "$MOE_LAYERS"

python3 - "$WORK" "$CORES" "$BIN" <<'PY'
import json, subprocess, sys
work, cores, bin_ = sys.argv[1], int(sys.argv[2]), sys.argv[3]
bw = json.load(open(f"{work}/bw.json"))
read = None
for rec in bw.get("read_bw", []):
    if rec.get("cores") == cores:
        read = rec.get("read_bw_gb_s")
def plan_bytes_per_token(name):
    """fp9 bytes a decoded token streams, summed over ducks."""
    dump = json.loads(subprocess.check_output([f"{bin_}/duck-plan-dump", f"{work}/{name}-plan"]))
    ops = {op["layer"]: op for op in dump["ops"] if op["kind"] in ("DenseFfn", "MoeFfn")}
    total = 0
    for duck in dump["ducks"]:
        for s in duck["slots"]:
            op = ops[s["layer"]]
            experts = s["expert_end"] - s["expert_begin"]
            per_expert = (s["bytes"]) / max(1, experts)
            active = 1 if not s["moe"] else min(experts, op["top_k"] + op["num_shared"])
            total += per_expert * active
    return total
print(f"{'model':<22}{'decode tok/s':>13}{'TPOT ms':>9}{'fp9 MB/token':>14}{'eff GB/s':>10}{'read GB/s':>10}{'fraction':>9}")
for name, label in (("q06", "Qwen3-0.6B shape"), ("q30", "Qwen3-30B-A3B shape")):
    s = json.load(open(f"{work}/{name}.json"))
    b = plan_bytes_per_token(name)
    eff = b * s["decode_tok_s"] / 1e9
    frac = eff / read if read else float("nan")
    print(f"{label:<22}{s['decode_tok_s']:>13.2f}{s['tpot_ms']:>9.2f}{b/1e6:>14.1f}{eff:>10.2f}{(read or 0):>10.2f}{frac:>9.3f}")
    print(f"  judge_gap p50 {s['judge_gap_us_p50']:.1f} us, judge_ratio p50 {s['judge_ratio_p50']:.3f}, "
          f"kernel Gparam/s per duck {[round(x, 2) for x in s['duck_kernel_gparam_s']]}")
PY
