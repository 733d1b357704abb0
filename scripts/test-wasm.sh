#!/usr/bin/env bash
# The library's wasm tests in headless Chromium (wasm-bindgen-test, chromedriver): the CPU kernel
# tests on wasm32, checked against the portable kernels and the f64 reference, once for each build
# the package ships: simd128, whose best kernels are the simd128 ones, and simd128 with relaxed
# SIMD, which runs the relaxed-SIMD kernels beside the simd128 ones (they must agree to the bit).
# webdriver.json gives Chromium its flags.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner
export CHROMEDRIVER="${CHROMEDRIVER:-/usr/bin/chromedriver}"
export WASM_BINDGEN_TEST_TIMEOUT=600
# The package's features, flags and target dirs (build-web.sh), so the builds share dependencies.
for build in simd128 relaxed; do
  echo "== wasm kernel tests, $build build"
  features="+simd128"
  [ "$build" = relaxed ] && features="+simd128,+relaxed-simd"
  RUSTFLAGS="-C target-feature=$features" cargo test --release --target wasm32-unknown-unknown \
    --no-default-features --features wasm,gpu --test cpu_kernels --target-dir "target/wasm-$build"
done
