#!/usr/bin/env bash
# Fetches ajv (npm, pinned), the JSON Schema validator the serve tests check
# constrained outputs with, into a cache directory and prints the path of
# the installed package directory on stdout (for require()). Idempotent: no
# network at all when the pinned version is already there.
#
#   utils/fetch-ajv.sh [cache-dir]
#
# cache-dir defaults to $DUCK_NPM_CACHE, else
# ${XDG_CACHE_HOME:-$HOME/.cache}/duck/npm; the package goes under its own
# prefix, cache-dir/ajv (see utils/fetch-openai-client.sh for why).
# Everything but the final path goes to stderr; the exit status is non-zero
# (with a message saying why) when the package cannot be had.
set -euo pipefail

AJV_PKG_VERSION=8.17.1

DIR="${1:-${DUCK_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/duck/npm}}"
PREFIX="$DIR/ajv"
PKG_DIR="$PREFIX/node_modules/ajv"

. "$(dirname "${BASH_SOURCE[0]}")/npm-fetch.sh"

is_present() {
  [ -f "$PKG_DIR/package.json" ] &&
    [ "$(npm_installed_version "$PREFIX" ajv)" = "$AJV_PKG_VERSION" ]
}

npm_fetch fetch-ajv "$PREFIX" "the serve tests" "ajv@$AJV_PKG_VERSION"
echo "$PKG_DIR"
