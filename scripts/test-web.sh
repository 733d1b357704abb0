#!/usr/bin/env bash
# The browser package's tests: build pkg/, pack it, install the tarball into a fresh project and
# run the Node tests there (on the threads build); run the library's wasm tests (simd128 kernels
# against the portable ones) in headless Chromium; the engine and draft workers (abort, a dead
# draft) in Chromium; both models on WebGPU (tiny synthesized models), the draft on its own
# GPUDevice in its worker; a target over wasm32's 4 GiB streamed onto WebGPU; the threads build
# on a cross-origin isolated page (2 threads against the golden ids and the single-thread build);
# then the demo end to end in Chromium (WebGPU via SwiftShader).
# Needs models/ (scripts/fetch-models.sh) and Debian's chromium.
# The JavaScript tests run under Node's test runner, each check a test of its own: every check
# runs even where one before it failed, the runner prints the counts, and this script goes on to
# the next group and fails at the end if any test failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
failed=()
# Run the test files $@ with Node's test runner, one at a time; a failure is noted, not fatal.
node_tests() {
  node --test --test-reporter=spec --test-concurrency=1 "$@" || failed+=("node --test $*")
}

echo "== the demo server stays inside its root"
node_tests tests/web/serve.test.mjs

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
cp tests/web/node.test.mjs tests/web/remote.test.mjs tests/web/golden.mjs tests/web/native.mjs tests/web/saguaro-serve.mjs "$work/project/"
(
  cd "$work/project"
  echo '{"name":"fresh","private":true,"type":"module"}' > package.json
  npm install --no-audit --no-fund --silent "$work/$tarball"
)
# The native engine the Node and browser tests compare sampled runs with, and the server target.
export SAGUARO_GOLDEN="$root/tests/golden" SAGUARO_MODELS="$root/models" SAGUARO_BIN="$root/target/release/saguaro"
echo "== npm package in Node, and with the target on saguaro serve"
pushd "$work/project" >/dev/null
node_tests node.test.mjs remote.test.mjs
popd >/dev/null

echo "== wasm tests in headless Chromium"
scripts/test-wasm.sh || failed+=(scripts/test-wasm.sh)

# In Chromium: the two Web Workers (abort, a dead draft worker); both models on WebGPU (the draft
# worker on a GPUDevice of its own); a 4.2 GiB target on WebGPU (streamed to the GPU, never whole
# in wasm memory); the threads build (a cross-origin isolated page, a pool of 2 compute workers);
# a server target (saguaro serve at another origin); the demo end to end; model stores, hf: names
# and split models.
echo "== the browser tests in Chromium"
node_tests tests/web/worker.mjs tests/web/gpu.mjs tests/web/big.mjs tests/web/threads.mjs tests/web/remote.browser.mjs tests/web/e2e.mjs \
  tests/web/storage.mjs

if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
