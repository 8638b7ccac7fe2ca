#!/usr/bin/env bash
# Configures and builds Duck into ${DUCK_BUILD_DIR:-build} (Release, Ninja).
# Sourced by run-main.sh and run-tests.sh; usable alone.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DUCK_BUILD_DIR:-$ROOT/build}"
JOBS="${DUCK_JOBS:-$(nproc)}"
WERROR=OFF
if [ "${CI:-}" = "true" ] || [ "${DUCK_WERROR:-}" = "ON" ]; then WERROR=ON; fi

bash "$ROOT/utils/bootstrap.sh"
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -G Ninja -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DDUCK_WERROR="$WERROR"
fi
ninja -C "$BUILD" -j"$JOBS"
