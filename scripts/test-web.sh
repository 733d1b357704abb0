#!/usr/bin/env bash
# The browser package's tests: build pkg/, pack it, install the tarball into a fresh project and
# run the Node tests there (on the threads build); run the library's wasm tests (simd128 kernels
# against the portable ones) in headless Chromium; the engine and draft workers (abort, a dead
# draft) in Chromium; both models on WebGPU (tiny synthesized models), the draft on its own
# GPUDevice in its worker; a target over wasm32's 4 GiB streamed onto WebGPU; the threads build
# on a cross-origin isolated page (2 threads against the golden ids and the single-thread build);
# then the demo end to end in Chromium (WebGPU via SwiftShader).
# Needs models/ (scripts/fetch-models.sh) and Debian's chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

echo "== the demo server stays inside its root"
node tests/web/serve.test.mjs

scripts/build-web.sh
# The native server the package is tested against as a server target: the binary the native
# tests run (`cargo build` would build it again, without the features the dev-dependencies unify
# into its dependencies).
cargo test --release --no-run --test remote

echo "== npm package in Node (packed tarball in a fresh project)"
work=$(mktemp -d -t saguaro-web-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
tarball=$(npm pack ./pkg --pack-destination "$work" --silent | tail -n 1)
mkdir "$work/project"
cp tests/web/node.test.mjs tests/web/remote.test.mjs tests/web/golden.mjs tests/web/saguaro-serve.mjs "$work/project/"
(
  cd "$work/project"
  echo '{"name":"fresh","private":true,"type":"module"}' > package.json
  npm install --no-audit --no-fund --silent "$work/$tarball"
  SAGUARO_GOLDEN="$root/tests/golden" node node.test.mjs "$root/models"
  echo "== npm package in Node with the target on saguaro serve"
  SAGUARO_GOLDEN="$root/tests/golden" node remote.test.mjs "$root/models" "$root/target/release/saguaro"
)

echo "== wasm tests in headless Chromium"
scripts/test-wasm.sh

echo "== the two Web Workers in Chromium: abort, a dead draft worker"
node tests/web/worker.mjs

echo "== both models on WebGPU in Chromium: the draft worker on a GPUDevice of its own"
node tests/web/gpu.mjs

echo "== a 4.2 GiB target on WebGPU in Chromium: streamed to the GPU, never whole in wasm memory"
node tests/web/big.mjs

echo "== the threads build in Chromium: a cross-origin isolated page, a pool of 2 compute workers"
node tests/web/threads.mjs

echo "== a server target in Chromium: saguaro serve at another origin"
node tests/web/remote.browser.mjs

echo "== demo end to end in Chromium"
node tests/web/e2e.mjs
echo "== model stores, hf: names and split models in Chromium"; node --test tests/web/storage.mjs
