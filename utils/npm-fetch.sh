# Sourced by the utils/fetch-*.sh scripts: the pinned npm installs they
# share. The caller defines `is_present` (true when its pinned packages are
# installed) before calling npm_fetch.

# npm_installed_version PREFIX PKG: the version of PKG installed under
# PREFIX, or nothing.
npm_installed_version() {
  local json="$1/node_modules/$2/package.json"
  [ -f "$json" ] || return 0
  sed -nE 's/^  "version": "([^"]+)".*/\1/p' "$json" | head -1
}

# npm_fetch NAME PREFIX NEEDED_BY PKG@VERSION...: installs the packages into
# PREFIX unless is_present says they are there. Concurrent callers (ctest
# -j) serialise on a lock; the second one finds what the first installed.
# Errors go to stderr as "NAME: ..." and exit 1.
npm_fetch() {
  local name="$1" prefix="$2" needed_by="$3"
  shift 3
  is_present && return 0
  command -v npm >/dev/null 2>&1 ||
    { echo "$name: npm is not installed (needed once to fetch $1)" >&2; exit 1; }
  mkdir -p "$prefix" || { echo "$name: cannot create $prefix" >&2; exit 1; }
  exec 9>"$prefix/.fetch.lock"
  flock 9
  if ! is_present; then
    echo "$name: npm install $* into $prefix" >&2
    # Bounded: a registry that stops answering fails the fetch (and the
    # tests that need it) with a message instead of hanging the run.
    # A failed install is tried once more after a pause: npm does not retry
    # some transient failures itself (a TLS error on the way to the
    # registry, seen here once as SELF_SIGNED_CERT_IN_CHAIN). A failure
    # that stays names npm's error code, and for a certificate error the
    # variable that fixes it.
    local limit="${DUCK_NPM_TIMEOUT:-300}" rc=0 attempt out code
    out="$(mktemp)"
    for attempt in 1 2; do
      rc=0
      # --update-notifier=false: npm's own version check is one more request
      # that, when the registry's certificate is not trusted, hangs npm
      # until the time limit after the install itself has failed.
      timeout "$limit" npm install --prefix "$prefix" --no-audit --no-fund --no-save \
        --update-notifier=false --loglevel=error --fetch-timeout=60000 \
        --fetch-retries=2 "$@" >"$out" 2>&1 || rc=$?
      cat "$out" >&2
      code="$(sed -nE 's/^npm (error|ERR!) code (.*)$/\2/p' "$out" | head -1)"
      if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$attempt" -eq 2 ]; then
        break
      fi
      echo "$name: npm install failed (exit $rc); trying once more in 10 s" >&2
      sleep 10
    done
    rm -f "$out"
    if [ "$rc" -eq 124 ]; then
      echo "$name: npm install did not finish within $limit s (DUCK_NPM_TIMEOUT); $needed_by need it once" >&2
      exit 1
    elif [ "$rc" -ne 0 ]; then
      case "$code" in
        *CERT*|*SSL*|*TLS*)
          echo "$name: npm install failed: $code: the registry's TLS certificate is not trusted (behind a TLS-intercepting proxy, give its CA in NODE_EXTRA_CA_CERTS); $needed_by need it once" >&2 ;;
        "")
          echo "$name: npm install failed (exit $rc; no network or no npm registry?); $needed_by need it once" >&2 ;;
        *)
          echo "$name: npm install failed: $code; $needed_by need it once" >&2 ;;
      esac
      exit 1
    fi
    is_present ||
      { echo "$name: npm install finished but $* is not in $prefix" >&2; exit 1; }
  fi
  flock -u 9
}
