#!/usr/bin/env bash
# End-to-end decode benchmark (`duck-bench e2e` in docs/perf.md): a
# Qwen3-0.6B-shaped random FP8 model (28 layers, hidden 1024) and a
# Qwen3-30B-A3B-shaped MoE truncated to a few layers (hidden 2048, 128
# experts top-8, moe_intermediate 768), compiled and run with duckrun on a
# local cluster. Reports decode tok/s, TPOT, fp9 bytes touched per token and
# the implied bandwidth as a fraction of this machine's streaming read
# bandwidth measured in the same run (duck-bench kernels read-bw).
#
# --models ds adds a DeepSeek-V3.2-shaped model at real dims (one dense and
# one MoE layer, ~12 GB of FP8 weights; needs ~30 GB of disk).
#
#   utils/bench-e2e.sh [--tokens N] [--moe-layers L] [--tp N] [--cores C]
#                      [--models q06,q30,ds]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DUCK_BUILD_DIR:-$ROOT/build}"
BIN="$BUILD/bin"
TOKENS=32; MOE_LAYERS=4; TP=1; CORES=$(nproc); MODELS=q06,q30
while [ $# -gt 0 ]; do
  case "$1" in
    --tokens) TOKENS="$2"; shift 2;;
    --moe-layers) MOE_LAYERS="$2"; shift 2;;
    --tp) TP="$2"; shift 2;;
    --cores) CORES="$2"; shift 2;;
    --models) MODELS="$2"; shift 2;;
    -h|--help) sed -n 2,16p "$0"; exit 0;;
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
for m in ${MODELS//,/ }; do
  case "$m" in
    q06) echo "== Qwen3-0.6B shape ==" >&2
         run_model q06 --preset qwen3-0.6b-shape;;
    q30) echo "== Qwen3-30B-A3B shape, $MOE_LAYERS layers ==" >&2
         run_model q30 --preset qwen3-30b-a3b-shape --layers "$MOE_LAYERS";;
    # DeepSeek-V3.2 at real dims: one dense and one MoE layer (256 experts
    # + 1 shared at 2048), MLA and the indexer; vocab cut to 8192.
    # About 12 GB of FP8 weights (13.7 GB of fp9 on the ducks).
    ds)  echo "== DeepSeek-V3.2 shape, 1 dense + 1 MoE layer ==" >&2
         run_model ds --preset tiny-deepseek --family deepseek_v32 \
           --hidden 7168 --layers 2 --dense-layers 1 --heads 128 \
           --intermediate 18432 --moe-intermediate 2048 --experts 256 \
           --top-k 8 --shared-experts 1 --n-group 8 --topk-group 4 \
           --q-lora 1536 --kv-lora 512 --qk-nope 128 --qk-rope 64 \
           --v-head 128 --index-heads 64 --index-head-dim 128 \
           --index-topk 2048 --vocab 8192 --max-pos 163840;;
    *) echo "bench-e2e: unknown model $m (q06, q30, ds)" >&2; exit 2;;
  esac
done

python3 - "$WORK" "$CORES" "$BIN" "$MODELS" <<'PY'
import json, subprocess, sys
work, cores, bin_, models = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
bw = json.load(open(f"{work}/bw.json"))
read = None
for rec in bw.get("read_bw", []):
    if rec.get("cores") == cores:
        read = rec.get("read_bw_gb_s")
SIZE = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1.125}  # FP8 runs as fp9
def tensors(p):
    for v in p.values():
        if isinstance(v, dict) and "dtype" in v and "shape" in v:
            yield v
def bytes_per_token(name):
    """(host, ducks) weight bytes a decoded token streams: host tensors of
    every op but the embedding (one row), and the fp9 slices of the experts
    a token activates, summed over ducks."""
    dump = json.loads(subprocess.check_output([f"{bin_}/duck-plan-dump", f"{work}/{name}-plan"]))
    host, ffn = 0, {}
    for op in dump["ops"]:
        kind, p = op["params_type"], op.get("params", {})
        if kind in ("DenseFfnOpDef", "MoeFfnOpDef"):
            ffn[op["layer"]] = p
        if kind == "EmbeddingOpDef":
            continue
        for t in tensors(p):
            n = 1
            for d in t["shape"]:
                n *= d
            host += n * SIZE.get(t["dtype"], 4)
    ducks = 0
    for duck in dump["ducks"]:
        for s in duck["slots"]:
            p = ffn[s["layer"]]
            experts = s["expert_end"] - s["expert_begin"]
            per_expert = s["bytes"] / max(1, experts)
            active = 1 if not s["moe"] else min(experts, p["top_k"] + p.get("num_shared", 0))
            ducks += per_expert * active
    return host, ducks
LABEL = {"q06": "Qwen3-0.6B shape", "q30": "Qwen3-30B-A3B shape", "ds": "DeepSeek-V3.2 shape"}
print(f"{'model':<22}{'decode tok/s':>13}{'TPOT ms':>9}{'host MB/tok':>12}{'duck MB/tok':>12}{'eff GB/s':>10}{'read GB/s':>10}{'bound frac':>11}")
for name in models:
    s = json.load(open(f"{work}/{name}.json"))
    h, d = bytes_per_token(name)
    eff = (h + d) * s["decode_tok_s"] / 1e9
    frac = eff / read if read else float("nan")
    print(f"{LABEL[name]:<22}{s['decode_tok_s']:>13.2f}{s['tpot_ms']:>9.2f}{h/1e6:>12.1f}{d/1e6:>12.1f}{eff:>10.2f}{(read or 0):>10.2f}{frac:>11.3f}")
    ops = ", ".join(f"{k} {v:.2f}" for k, v in sorted(s.get("decode_ms_per_token_by_op", {}).items(), key=lambda kv: -kv[1]))
    print(f"  decode ms a token by op: {ops}")
    print(f"  KV cache {s.get('kv_bytes_per_token', 0)} bytes a token; judge_gap p50 {s['judge_gap_us_p50']:.1f} us, "
          f"judge_ratio p50 {s['judge_ratio_p50']:.3f}, kernel Gparam/s per duck {[round(x, 2) for x in s['duck_kernel_gparam_s']]}")
PY
