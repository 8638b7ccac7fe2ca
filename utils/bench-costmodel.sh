#!/usr/bin/env bash
# The cost model against this machine: for each benchmark shape, one
# calibration run of duckrun measures the inputs the model takes (the duck's
# effective fp9 streaming rate in decode, the dispatch gap a step, the
# host's time a token), a
# cluster file carries them to `duckc compile --explain`, and a second run
# (another prompt) measures the TPOT the model predicts. Prints both and
# their ratio.
#
#   utils/bench-costmodel.sh [--build DIR] [--models q06,q30] [--tokens N]
#
# Needs the plans and checkpoints of duck-bench e2e (DIR/bench-e2e).
set -euo pipefail
BUILD=build; MODELS=q06,q30; TOKENS=32
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD="$2"; shift 2;;
    --models) MODELS="$2"; shift 2;;
    --tokens) TOKENS="$2"; shift 2;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
    *) echo "bench-costmodel: unknown argument $1" >&2; exit 2;;
  esac
done
BIN="$BUILD/bin"; DIR="$BUILD/bench-e2e"; WORK="$DIR/costmodel"
mkdir -p "$WORK"
ids() { python3 -c "import sys; print(','.join(str((int(sys.argv[1]) + 37 * i) % 1000 + 10) for i in range(64)))" "$1"; }

printf '| shape | predicted TPOT ms (ducks + dispatch + host) | measured TPOT ms | predicted / measured |\n|---|---|---|---|\n'
for m in ${MODELS//,/ }; do
  cores=$(nproc)
  ckpt="$DIR/$m"; [ "$m" = q30 ] && ckpt="$DIR/q30-l2-v1024"
  plan="$ckpt-1x$cores-plan"
  [ -d "$plan" ] && [ -d "$ckpt" ] || { echo "bench-costmodel: no $plan or $ckpt (run duck-bench e2e first)" >&2; exit 1; }
  "$BIN/duckrun" "$plan" --prompt-ids "$(ids 1)" --max-tokens "$TOKENS" --ignore-eos --print-ids --quiet --cores-per-duck "$cores" --summary-json "$WORK/$m-calib.json" > /dev/null
  python3 - "$WORK/$m-calib.json" "$WORK/$m-cluster.json" "$cores" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
b = s["decode_breakdown_ms"]
# The duck's effective streaming rate in decode: the busiest duck's fp9
# bytes a token over its kernel time a token.
gbs = s["duck_bytes_per_token_max"] / (b["duck_kernel"] / 1e3) / 1e9
json.dump({"ducks": [{"host": "127.0.0.1", "port": 7411, "cores": int(sys.argv[3])}],
           "bandwidth_gbs": gbs,
           "step_overhead_us": s["judge_gap_us_p50"],
           "host_ms_per_token": b["host_attention"] + b["host_norms_router"] + b["lm_head"] + b["other"]},
          open(sys.argv[2], "w"))
EOF
  mo=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['multiple_of'])" <("$BIN/duck-plan-dump" "$plan" 2>/dev/null) 2>/dev/null || echo auto)
  predicted=$("$BIN/duckc" compile "$ckpt" --cluster "$WORK/$m-cluster.json" --tp 1 --multiple-of "$mo" --explain --dry-run | sed -nE 's/.*TPOT ([0-9.]+) ms: fp9 stream ([0-9.]+) \+ dispatch ([0-9.]+) \+ host ([0-9.]+).*/\1 (\2 + \3 + \4)/p')
  "$BIN/duckrun" "$plan" --prompt-ids "$(ids 2)" --max-tokens "$TOKENS" --ignore-eos --print-ids --quiet --cores-per-duck "$cores" --summary-json "$WORK/$m-run.json" > /dev/null
  measured=$(python3 -c "import json,sys; print('%.3f' % json.load(open(sys.argv[1]))['tpot_ms'])" "$WORK/$m-run.json")
  ratio=$(python3 -c "import sys; print('%.3f' % (float(sys.argv[1].split()[0]) / float(sys.argv[2])))" "$predicted" "$measured")
  printf '| %s | %s | %s | %s |\n' "$m" "$predicted" "$measured" "$ratio"
done
