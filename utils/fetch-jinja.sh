#!/usr/bin/env bash
# Fetches @huggingface/jinja (npm, pinned), the Jinja renderer transformers.js
# uses, into a cache directory and prints the path of the installed package
# directory on stdout (for import()). The chat-template tests compare Duck's
# rendering of the checkpoints' chat templates against it. Idempotent: no
# network at all when the pinned version is already there.
#
#   utils/fetch-jinja.sh [cache-dir]
#
# cache-dir defaults to $DUCK_NPM_CACHE, else
# ${XDG_CACHE_HOME:-$HOME/.cache}/duck/npm; the package goes under its own
# prefix, cache-dir/hf-jinja. Everything but the final path goes to stderr;
# the exit status is non-zero (with a message saying why) when the package
# cannot be had.
set -euo pipefail

JINJA_PKG_VERSION=0.5.13

DIR="${1:-${DUCK_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/duck/npm}}"
PREFIX="$DIR/hf-jinja"
PKG_DIR="$PREFIX/node_modules/@huggingface/jinja"

. "$(dirname "${BASH_SOURCE[0]}")/npm-fetch.sh"

is_present() {
  [ -f "$PKG_DIR/package.json" ] &&
    [ "$(npm_installed_version "$PREFIX" @huggingface/jinja)" = "$JINJA_PKG_VERSION" ]
}

npm_fetch fetch-jinja "$PREFIX" "the chat-template tests" \
  "@huggingface/jinja@$JINJA_PKG_VERSION"
echo "$PKG_DIR"
