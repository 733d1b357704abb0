#!/usr/bin/env bash
# The test suite: every test natively (release mode: model tests do billions of float
# operations), then the browser package (Node, wasm tests in Chromium, the demo end to end).
set -euo pipefail
cd "$(dirname "$0")/.."

export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
chmod 700 "$XDG_RUNTIME_DIR"

echo "== tests"
cargo test --release
echo "== CPU kernel tests on the portable kernels"
SAGUARO_FORCE_SCALAR=1 cargo test --release --test cpu_kernels
echo "== the browser package: Node, wasm tests in Chromium, the demo end to end"
scripts/test-web.sh
