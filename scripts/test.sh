#!/usr/bin/env bash
# The test suite: the library builds for the browser, and every test passes natively (release
# mode: model tests do billions of float operations).
set -euo pipefail
cd "$(dirname "$0")/.."

export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
chmod 700 "$XDG_RUNTIME_DIR"

echo "== wasm32 builds: CPU only, and with the WebGPU backend"
cargo build --release --target wasm32-unknown-unknown --lib --no-default-features
cargo build --release --target wasm32-unknown-unknown --lib --no-default-features --features gpu
echo "== tests"
cargo test --release
