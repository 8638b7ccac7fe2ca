#!/usr/bin/env bash
# docs/serve-page.png: duckrun serve's page in Debian's chromium, headless,
# on the tests' tiny Qwen3-MoE (random weights, 2 local ducks) while four
# clients keep streaming for 110 s (test/serve/page.py screenshot).
#   utils/serve-page-screenshot.sh [OUT.png] [SECONDS]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${DUCK_BIN:-$ROOT/build/bin}
OUT=$(realpath -m "${1:-$ROOT/docs/serve-page.png}")
SECONDS_=${2:-110}
WORK=$(mktemp -d)
trap 'python3 "$ROOT/test/serve/serve.py" stop "$WORK" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
"$BIN/duck-mkmodel" --preset tiny-qwen3-moe --dtype fp8 --seed 1 -q -o "$WORK/m"
"$BIN/duckc" compile "$WORK/m" --tp 2 --multiple-of 32 -o "$WORK/plan" 2>/dev/null
XDG_CACHE_HOME=$WORK/cache python3 "$ROOT/test/serve/serve.py" start "$WORK" -- \
  "$BIN/duckrun" serve "$WORK/plan" --port 0 --parallel 2 --api-key local \
  --cores-per-duck 1 --quiet
python3 "$ROOT/test/serve/page.py" screenshot "$(cat "$WORK/url")" local "$OUT" "$SECONDS_"
echo "serve-page-screenshot: $OUT"
