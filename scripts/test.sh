#!/usr/bin/env bash
# The test suite: the library builds for the browser, and every test passes natively (release
# mode: model tests do billions of float operations).
set -euo pipefail
cd "$(dirname "$0")/.."

export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
chmod 700 "$XDG_RUNTIME_DIR"

echo "== wasm32 builds: CPU only, with the WebGPU backend, and with the simd128 CPU kernels"
cargo build --release --target wasm32-unknown-unknown --lib --no-default-features
cargo build --release --target wasm32-unknown-unknown --lib --no-default-features --features gpu
RUSTFLAGS="-C target-feature=+simd128" cargo build --release --target wasm32-unknown-unknown --lib \
    --no-default-features --target-dir target/wasm-simd128
echo "== tests"
cargo test --release
echo "== CPU kernel tests on the portable kernels"
SAGUARO_FORCE_SCALAR=1 cargo test --release --test cpu_kernels
