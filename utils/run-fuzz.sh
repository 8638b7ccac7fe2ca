#!/usr/bin/env bash
# Builds Duck's libFuzzer harnesses (test/fuzz, clang-19 with ASan and
# UBSan) into ${DUCK_BUILD_DIR:-build}/fuzz and runs each one for
# DUCK_FUZZ_SECONDS seconds (default 5; the test suite's smoke run) or, with
# DUCK_FUZZ_RUNS=N, for N executions (the long run of docs/reliability.md),
# starting from the seed corpus in test/fuzz/corpus plus seeds made from
# this build (a compiled plan, the duck ELF); DUCK_FUZZ_ONLY="plan elf"
# runs some harnesses only. Prints one line per harness
# and "fuzz: N passed, M failed"; a crash, leak or sanitizer report fails
# its harness and leaves the reproducer in the work directory.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DUCK_BUILD_DIR:-$ROOT/build}"
FUZZ_BUILD="$BUILD/fuzz"
WORK="$BUILD/fuzz-work"
SECONDS_EACH="${DUCK_FUZZ_SECONDS:-5}"
RUNS="${DUCK_FUZZ_RUNS:-}"

if ! command -v clang++-19 >/dev/null; then
  echo "fuzz: clang++-19 is missing (utils/bootstrap.sh installs clang-19)"
  echo "fuzz: 0 passed, 1 failed"
  exit 1
fi
if [ ! -f "$FUZZ_BUILD/build.ninja" ]; then
  CC=clang-19 CXX=clang++-19 cmake -G Ninja -S "$ROOT/test/fuzz" \
    -B "$FUZZ_BUILD" -DCMAKE_BUILD_TYPE=Release >"$BUILD/fuzz-configure.log" 2>&1 ||
    { cat "$BUILD/fuzz-configure.log"; echo "fuzz: 0 passed, 1 failed"; exit 1; }
fi
if ! ninja -C "$FUZZ_BUILD" -j"${DUCK_JOBS:-$(nproc)}"; then
  echo "fuzz: 0 passed, 1 failed"
  exit 1
fi

# Seeds from this build: a compiled plan and the duck ELF.
rm -rf "$WORK"
mkdir -p "$WORK/seeds/plan" "$WORK/seeds/elf"
if [ -x "$BUILD/bin/duck-mkmodel" ] && [ -x "$BUILD/bin/duckc" ]; then
  "$BUILD/bin/duck-mkmodel" --preset tiny-qwen3 --dtype fp8 -q -o "$WORK/model" &&
    "$BUILD/bin/duckc" compile "$WORK/model" --tp 2 -o "$WORK/plan" >/dev/null &&
    # Without its 16-byte trailer: fuzz-plan reseals every input, so
    # mutations reach the semantic checks (fuzz_plan.cpp).
    head -c -16 "$WORK/plan/model.duckplan" > "$WORK/seeds/plan/model.duckplan"
  export DUCK_FUZZ_PLAN_SEED="$WORK/plan" DUCK_FUZZ_PLAN_MODEL="$WORK/model"
fi
[ -f "$BUILD/lib/duck.elf" ] && cp "$BUILD/lib/duck.elf" "$WORK/seeds/elf/"

passed=0
failed=0
for h in ${DUCK_FUZZ_ONLY:-safetensors config tokenizer chat-template plan wire cast elf}; do
  corpus="$WORK/corpus-$h"
  mkdir -p "$corpus"
  cp "$ROOT/test/fuzz/corpus/$h/"* "$corpus/" 2>/dev/null
  cp "$WORK/seeds/$h/"* "$corpus/" 2>/dev/null
  if [ -n "$RUNS" ]; then limit="-runs=$RUNS"; else limit="-max_total_time=$SECONDS_EACH"; fi
  log="$WORK/$h.log"
  (cd "$WORK" && "$FUZZ_BUILD/fuzz-$h" "$limit" -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 "$corpus" >"$log" 2>&1)
  status=$?
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
  if [ $status -eq 0 ]; then
    passed=$((passed + 1))
    echo "fuzz-$h: ok, ${execs:-?} executions, ${cov:-cov: ?}"
  else
    failed=$((failed + 1))
    echo "fuzz-$h: FAILED (exit $status), log $log:"
    grep -E "ERROR|SUMMARY|crash-|leak-|timeout-" "$log" | head -20
  fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
