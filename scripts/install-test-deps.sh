#!/usr/bin/env bash
# What scripts/test.sh and scripts/fetch-models.sh need beyond Rust and Node, installed where it
# is missing: Mesa lavapipe (a software Vulkan adapter, so the GPU backend's tests run without a
# GPU), Debian's Chromium and chromedriver (the browser tests), python3 with pip and unzip (the
# models), the wasm32 target, wasm-bindgen-cli at the version in Cargo.lock, and the npm tools of
# package-lock.json (binaryen's wasm-opt, playwright-core). Each step checks first and does nothing when its part is already there, so a
# second run takes seconds. apt-get runs through sudo unless we are root. .ci/run calls it too.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages (Debian 12 names; the browser tests use /usr/bin/chromium and chromedriver;
# scripts/fetch-models.sh uses python3's pip and unzip).
packages=(mesa-vulkan-drivers libvulkan1 libegl1 libegl-mesa0 libgl1-mesa-dri unzip ca-certificates
  python3 python3-pip chromium chromium-driver)
missing=()
for p in "${packages[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Node >= 20 runs the package tests; Debian 12's own nodejs is older, so it is not installed here.
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$node_major" -lt 20 ]; then
  echo "error: the browser package's tests need Node >= 20 and npm (found: ${node_major/#0/none})" >&2
  exit 1
fi

rustup target list --installed | grep -x wasm32-unknown-unknown >/dev/null || rustup target add wasm32-unknown-unknown

# wasm-bindgen-cli at exactly the version in Cargo.lock (no --locked: its lockfile pins a crate
# the registry lacks). The checks read their input to the end (no grep -q): under pipefail a
# command cut off by an early exit would count as a failed check.
version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
wasm-bindgen --version 2>/dev/null | grep -x "wasm-bindgen $version" >/dev/null || cargo install wasm-bindgen-cli --version "$version"

# npm's record of what it installed (node_modules/.package-lock.json) is older than the lockfile
# or package.json when they changed since the last install.
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ] \
  || [ package.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
