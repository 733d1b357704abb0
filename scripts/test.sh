#!/usr/bin/env bash
# The test suite: every test natively (release mode: model tests do billions of float
# operations), then the browser package (Node, wasm tests in Chromium, the demo end to end).
set -euo pipefail
cd "$(dirname "$0")/.."

export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
chmod 700 "$XDG_RUNTIME_DIR"

echo "== docs: every relative link resolves, the README stays short"
scripts/check-docs.sh

echo "== tests"
cargo test --release
echo "== CPU kernel tests with the portable kernels as the best set"
SAGUARO_KERNELS=scalar cargo test --release --test cpu_kernels
echo "== lossless decoding on the AVX2 kernels (the best set of many x86 machines)"
# The real models' pair and a poor draft of Q4_1 SmolLM2 (every set's bit-identity to the others is
# tests/cpu_kernels.rs's, which ran above); exact names, so a rename fails here rather than
# running nothing.
avx2_lossless=(greedy_qwen_pair greedy_smollm2_with_a_poor_draft sampling_sd_is_lossless)
SAGUARO_KERNELS=avx2 cargo test --release --test lossless -- --exact "${avx2_lossless[@]}" | tee /dev/stderr |
  grep "test result: ok. ${#avx2_lossless[@]} passed" >/dev/null
echo "== the browser package: Node, wasm tests in Chromium, the demo end to end"
scripts/test-web.sh
