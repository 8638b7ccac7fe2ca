#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, makes a tiny
# Qwen3-MoE checkpoint (FP8 with 128x128 block scales), prints its fp9
# conversion report, compiles it for a 2-duck cluster, checks the compiled
# weight images against the checkpoint, and generates text with duckrun on a
# local embedded cluster (2 duckd processes on 127.0.0.1); then the same for
# a tiny FP8 DeepSeek-V3.2 checkpoint.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DUCK_BUILD_DIR:-$ROOT/build}"
export DUCK_BUILD_DIR="$BUILD"
bash "$ROOT/utils/build.sh"

BIN="$BUILD/bin"
WORK="$BUILD/main-job"
rm -rf "$WORK"
mkdir -p "$WORK"

step() { printf '\n== %s ==\n' "$*"; }

step "make a tiny Qwen3-MoE checkpoint (FP8, block scales)"
"$BIN/duck-mkmodel" --preset tiny-qwen3-moe --dtype fp8 --seed 1 -o "$WORK/tiny-qwen3-moe"

step "duckc describe"
"$BIN/duckc" describe "$WORK/tiny-qwen3-moe"

step "fp9 conversion report (FP8 -> fp9 must be exact)"
"$BIN/duckc" fp9-report "$WORK/tiny-qwen3-moe"

CORES=$(( $(nproc) / 2 )); [ "$CORES" -ge 1 ] || CORES=1
step "compile for 2 ducks x $CORES core(s)"
"$BIN/duckc" compile "$WORK/tiny-qwen3-moe" --tp 2 --cores-per-duck "$CORES" \
  -o "$WORK/plan" --progress
"$BIN/duck-plan-dump" "$WORK/plan" --summary

step "check the weight images against the checkpoint"
"$BIN/duckc" verify-plan "$WORK/plan" "$WORK/tiny-qwen3-moe"

step "generate: duckrun on a local cluster of 2 ducks (random weights: the text is noise)"
export XDG_CACHE_HOME="$WORK/cache"
"$BIN/duckrun" "$WORK/plan" --cores-per-duck "$CORES" \
  --prompt "The duck compiler turns a model into" \
  --max-tokens 24 --summary-json "$WORK/summary.json"

step "again: the weights are now a cache hit on every duck"
"$BIN/duckrun" "$WORK/plan" --cores-per-duck "$CORES" --chat \
  --prompt "Hello, ducks!" --max-tokens 16 \
  --temperature 0.8 --top-p 0.95 --seed 7

step "DeepSeek-V3.2: a tiny FP8 checkpoint (MLA, lightning indexer, 16 experts + 1 shared)"
"$BIN/duck-mkmodel" --preset tiny-deepseek --dtype fp8 --seed 1 -o "$WORK/tiny-deepseek-v32"
"$BIN/duckc" describe "$WORK/tiny-deepseek-v32"
"$BIN/duckc" compile "$WORK/tiny-deepseek-v32" --tp 2 --cores-per-duck "$CORES" \
  -o "$WORK/plan-deepseek" --progress
"$BIN/duckc" verify-plan "$WORK/plan-deepseek" "$WORK/tiny-deepseek-v32"

step "generate with DeepSeek-V3.2 on 2 ducks, then again from the weight cache"
"$BIN/duckrun" "$WORK/plan-deepseek" --cores-per-duck "$CORES" \
  --prompt "The duck compiler turns a model into" --max-tokens 24
"$BIN/duckrun" "$WORK/plan-deepseek" --cores-per-duck "$CORES" \
  --prompt "Hello, ducks!" --max-tokens 16 --temperature 0.8 --seed 7

step "serve: duckrun serve on 127.0.0.1, one chat request with curl (OpenAI API)"
SERVE_LOG="$WORK/serve.log"
"$BIN/duckrun" serve "$WORK/plan" --cores-per-duck "$CORES" --port 0 \
  --parallel 4 --quiet > "$SERVE_LOG" 2>&1 &
SERVE_PID=$!
trap 'kill $SERVE_PID 2>/dev/null || true' EXIT
URL=""
for _ in $(seq 600); do
  URL=$(sed -nE 's/.*listening on (http:\/\/127\.0\.0\.1:[0-9]+).*/\1/p' "$SERVE_LOG")
  if [ -n "$URL" ] && curl -sf "$URL/health" > /dev/null; then break; fi
  kill -0 $SERVE_PID 2>/dev/null || { cat "$SERVE_LOG"; exit 1; }
  sleep 0.1
done
echo "curl $URL/v1/chat/completions"
curl -sf "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "Hello, ducks!"}], "max_tokens": 12}'
echo
kill -TERM $SERVE_PID
wait $SERVE_PID
trap - EXIT
tail -1 "$SERVE_LOG"

printf '\nmain job: done (outputs in %s)\n' "$WORK"
