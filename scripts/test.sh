#!/usr/bin/env bash
# The test suite: every test natively (release mode: model tests do billions of float
# operations), then the browser package (Node, wasm tests in Chromium, the demo end to end).
set -euo pipefail
cd "$(dirname "$0")/.."

export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
chmod 700 "$XDG_RUNTIME_DIR"

echo "== tests"
cargo test --release
echo "== CPU kernel tests with the portable kernels as the best set"
SAGUARO_KERNELS=scalar cargo test --release --test cpu_kernels
echo "== lossless decoding on the AVX2 kernels (the best set of many x86 machines)"
SAGUARO_KERNELS=avx2 cargo test --release --test lossless
echo "== the browser package: Node, wasm tests in Chromium, the demo end to end"
scripts/test-web.sh
