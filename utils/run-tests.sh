#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs every
# test (GoogleTest unit tests through CTest, the lit suite, then a short
# libFuzzer smoke run of every parser harness) and ends with one summary
# line "tests: N passed, M failed".
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DUCK_BUILD_DIR:-$ROOT/build}"
export DUCK_BUILD_DIR="$BUILD"

if ! bash "$ROOT/utils/build.sh"; then
  echo "tests: build failed"
  echo "tests: 0 passed, 1 failed"
  exit 1
fi

LOG="$BUILD/test-logs"
mkdir -p "$LOG"

# npm packages first, from this shell: lit runs its tests in a scrubbed
# environment (no proxy or CA variables), so a fetch from inside a test
# fails behind a TLS-intercepting proxy. A failed fetch counts as a failure
# here, and the tests that need the package fail too, naming the reason.
echo "== npm packages the tests need =="
deps_failed=0
bash "$ROOT/utils/fetch-test-deps.sh" 2>&1 | tee "$LOG/npm.log" || deps_failed=1

echo "== unit tests (ctest) =="
ctest --test-dir "$BUILD" -j"${DUCK_JOBS:-$(nproc)}" --output-on-failure \
  --timeout 600 2>&1 | tee "$LOG/ctest.log"
unit_total=$(sed -nE 's/.* tests passed, ([0-9]+) tests? failed out of ([0-9]+).*/\2/p' "$LOG/ctest.log" | tail -1)
unit_failed=$(sed -nE 's/.* tests passed, ([0-9]+) tests? failed out of ([0-9]+).*/\1/p' "$LOG/ctest.log" | tail -1)
unit_total=${unit_total:-0}; unit_failed=${unit_failed:-1}

echo "== lit tests =="
python3 /usr/lib/llvm-19/build/utils/lit/lit.py -sv "$BUILD/test" 2>&1 | tee "$LOG/lit.log"
lit_passed=$(grep -E '^ *Passed *:' "$LOG/lit.log" | grep -oE '[0-9]+' | head -1)
lit_failed=0
for kind in Failed Unresolved 'Timed Out' XPASS; do
  n=$(grep -E "^ *$kind *:" "$LOG/lit.log" | grep -oE '[0-9]+' | head -1)
  lit_failed=$((lit_failed + ${n:-0}))
done
lit_passed=${lit_passed:-0}
if [ "$lit_passed" -eq 0 ] && [ "$lit_failed" -eq 0 ]; then lit_failed=1; fi

echo "== fuzz smoke run (libFuzzer, ${DUCK_FUZZ_SECONDS:-5} s a harness) =="
bash "$ROOT/utils/run-fuzz.sh" 2>&1 | tee "$LOG/fuzz.log"
fuzz_passed=$(sed -nE 's/^fuzz: ([0-9]+) passed, ([0-9]+) failed$/\1/p' "$LOG/fuzz.log" | tail -1)
fuzz_failed=$(sed -nE 's/^fuzz: ([0-9]+) passed, ([0-9]+) failed$/\2/p' "$LOG/fuzz.log" | tail -1)
fuzz_passed=${fuzz_passed:-0}; fuzz_failed=${fuzz_failed:-1}

passed=$((unit_total - unit_failed + lit_passed + fuzz_passed))
failed=$((unit_failed + lit_failed + fuzz_failed + deps_failed))
echo "== summary =="
echo "unit: $((unit_total - unit_failed)) passed, $unit_failed failed"
echo "lit: $lit_passed passed, $lit_failed failed"
echo "fuzz: $fuzz_passed passed, $fuzz_failed failed"
[ "$deps_failed" -eq 0 ] || echo "npm: a package could not be fetched (see above)"
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
