#!/usr/bin/env bash
# Fetches the official OpenAI Node client (npm package openai, pinned) into a
# cache directory and prints the path of the installed package directory on
# stdout (for require() by test/serve/openai-client.cjs). Idempotent: no
# network at all when the pinned version is already there.
#
#   utils/fetch-openai-client.sh [cache-dir]
#
# cache-dir defaults to $DUCK_NPM_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/duck/npm
# (shared with utils/fetch-qwen3-tokenizer.sh). The package goes under its own
# prefix, cache-dir/openai-client, because `npm install --no-save` removes
# every package of a prefix that it was not asked for: one prefix per script
# keeps the two from deleting each other's packages.
# Everything but the final path goes to stderr; the exit status is non-zero
# (with a message saying why) when the package cannot be had.
set -euo pipefail

# Pinned: the last 4.x release (works with Node 18 and 20).
OPENAI_PKG_VERSION=4.104.0

DIR="${1:-${DUCK_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/duck/npm}}"
PREFIX="$DIR/openai-client"
PKG_DIR="$PREFIX/node_modules/openai"

die() { echo "fetch-openai-client: $*" >&2; exit 1; }

installed_version() {
  [ -f "$PKG_DIR/package.json" ] || return 0
  sed -nE 's/^  "version": "([^"]+)".*/\1/p' "$PKG_DIR/package.json" | head -1
}

is_present() {
  [ -f "$PKG_DIR/index.js" ] &&
    [ "$(installed_version)" = "$OPENAI_PKG_VERSION" ]
}

if ! is_present; then
  command -v npm >/dev/null 2>&1 || die "npm is not installed (needed once to fetch openai)"
  mkdir -p "$PREFIX" || die "cannot create $PREFIX"
  # Concurrent callers (ctest -j) serialise on a lock; the second one finds
  # the package installed by the first.
  exec 9>"$PREFIX/.fetch.lock"
  flock 9
  if ! is_present; then
    echo "fetch-openai-client: npm install openai@$OPENAI_PKG_VERSION into $PREFIX" >&2
    npm install --prefix "$PREFIX" --no-audit --no-fund --no-save --loglevel=error \
      "openai@$OPENAI_PKG_VERSION" >&2 ||
      die "npm install failed (no network or no npm registry?); the serve tests need it once"
    is_present || die "npm install finished but $PKG_DIR (version $OPENAI_PKG_VERSION) is missing"
  fi
  flock -u 9
fi

echo "$PKG_DIR"
