#!/usr/bin/env bash
# Fetches the official OpenAI Node client (npm package openai, pinned) into a
# cache directory and prints the path of the installed package directory on
# stdout (for require() by test/serve/openai-client.cjs). Idempotent: no
# network at all when the pinned version is already there.
#
#   utils/fetch-openai-client.sh [--v7] [cache-dir]
#
# cache-dir defaults to $DUCK_NPM_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/duck/npm
# (shared with utils/fetch-tokenizer.sh). The package goes under its own
# prefix, cache-dir/openai-client, because `npm install --no-save` removes
# every package of a prefix that it was not asked for: one prefix per script
# keeps the two from deleting each other's packages.
# Everything but the final path goes to stderr; the exit status is non-zero
# (with a message saying why) when the package cannot be had.
set -euo pipefail

# Pinned: the last 4.x release (works with Node 18 and 20); with --v7 the
# current 7.x (its own prefix, openai-client-7), which the serve tests run
# the structured-output and tool scenarios with too.
OPENAI_PKG_VERSION=4.104.0
SUBDIR=openai-client
if [ "${1:-}" = "--v7" ]; then
  OPENAI_PKG_VERSION=7.60.0
  SUBDIR=openai-client-7
  shift
fi

DIR="${1:-${DUCK_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/duck/npm}}"
PREFIX="$DIR/$SUBDIR"
PKG_DIR="$PREFIX/node_modules/openai"

. "$(dirname "${BASH_SOURCE[0]}")/npm-fetch.sh"

is_present() {
  [ -f "$PKG_DIR/package.json" ] &&
    [ "$(npm_installed_version "$PREFIX" openai)" = "$OPENAI_PKG_VERSION" ]
}

npm_fetch fetch-openai-client "$PREFIX" "the serve tests" "openai@$OPENAI_PKG_VERSION"
echo "$PKG_DIR"
