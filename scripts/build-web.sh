#!/usr/bin/env bash
# Build the npm package pkg/ (saguaro-web) from scratch: the library for wasm32 with the simd128
# CPU kernels and the WebGPU backend, JS bindings from wasm-bindgen (the CLI pinned to the
# version in Cargo.lock, installed if missing), wasm-opt from npm binaryen, then the package
# template (pkg-config/: JS API, workers, TypeScript types, README).
# Usage: scripts/build-web.sh   then: npm pack ./pkg
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
if ! wasm-bindgen --version 2>/dev/null | grep -qx "wasm-bindgen $version"; then
  echo "== installing wasm-bindgen-cli $version"
  cargo install wasm-bindgen-cli --version "$version"
fi
[ -x node_modules/.bin/wasm-opt ] || npm ci --no-audit --no-fund

echo "== cargo build (wasm32, simd128, WebGPU)"
RUSTFLAGS="-C target-feature=+simd128" cargo build --release --target wasm32-unknown-unknown --lib \
  --no-default-features --features wasm,gpu --target-dir target/wasm-simd128

rm -rf pkg
mkdir -p pkg
wasm-bindgen --target web --out-dir pkg --out-name saguaro --no-typescript \
  target/wasm-simd128/wasm32-unknown-unknown/release/saguaro.wasm
raw=$(stat -c %s pkg/saguaro_bg.wasm)
node_modules/.bin/wasm-opt -Os --strip-debug --enable-simd --enable-bulk-memory --enable-sign-ext \
  --enable-nontrapping-float-to-int --enable-mutable-globals --enable-reference-types --enable-multivalue \
  pkg/saguaro_bg.wasm -o pkg/saguaro_bg.opt.wasm
mv pkg/saguaro_bg.opt.wasm pkg/saguaro_bg.wasm
cp pkg-config/* pkg/
opt=$(stat -c %s pkg/saguaro_bg.wasm)
gz=$(gzip -9 -c pkg/saguaro_bg.wasm | wc -c)
echo "pkg/saguaro_bg.wasm: $raw bytes from wasm-bindgen, $opt after wasm-opt -Os, $gz gzipped"
