#!/usr/bin/env bash
# The library's wasm tests in headless Chromium (wasm-bindgen-test, chromedriver): the CPU kernel
# tests on wasm32, where the best kernels are the simd128 ones, checked against the portable
# kernels and the f64 reference. webdriver.json gives Chromium its flags.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner
export CHROMEDRIVER="${CHROMEDRIVER:-/usr/bin/chromedriver}"
export WASM_BINDGEN_TEST_TIMEOUT=600
# The package's features and flags, so the build shares its dependencies with build-web.sh.
RUSTFLAGS="-C target-feature=+simd128" cargo test --release --target wasm32-unknown-unknown \
  --no-default-features --features wasm,gpu --test cpu_kernels --target-dir target/wasm-simd128
