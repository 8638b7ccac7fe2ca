#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, makes a tiny
# Qwen3-MoE checkpoint (FP8 with 128x128 block scales), describes it, prints
# its fp9 conversion report, compiles it for a 2-duck cluster and checks the
# compiled weight images against the checkpoint.
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

step "compile for 2 ducks x 2 cores"
"$BIN/duckc" compile "$WORK/tiny-qwen3-moe" --tp 2 --cores-per-duck 2 \
  -o "$WORK/plan" --progress
"$BIN/duck-plan-dump" "$WORK/plan" --summary

step "check the weight images against the checkpoint"
"$BIN/duckc" verify-plan "$WORK/plan" "$WORK/tiny-qwen3-moe"

step "the same model in bf16: quantisation error of fp9"
"$BIN/duck-mkmodel" --preset tiny-qwen3-moe --dtype bf16 --seed 1 -q -o "$WORK/tiny-qwen3-moe-bf16"
"$BIN/duckc" fp9-report "$WORK/tiny-qwen3-moe-bf16" --block 64

printf '\nmain job: done (outputs in %s)\n' "$WORK"
