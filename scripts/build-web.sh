#!/usr/bin/env bash
# Build the npm package pkg/ (saguaro-web) from scratch: the library for wasm32 with the simd128
# CPU kernels and the WebGPU backend, and again with relaxed SIMD, JS bindings from wasm-bindgen (the CLI pinned to the
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

rm -rf pkg
mkdir -p pkg
# Two builds of the library: simd128, which every current browser runs, and simd128 with relaxed
# SIMD, whose byte dot products speed up 8-bit activations (a CPU draft's); core.js loads the
# second where WebAssembly.validate accepts a relaxed-SIMD instruction.
for build in simd128 relaxed; do
  features="+simd128"
  name=saguaro
  wasm_opt_extra=()
  if [ "$build" = relaxed ]; then
    features="+simd128,+relaxed-simd"
    name=saguaro_relaxed
    wasm_opt_extra=(--enable-relaxed-simd)
  fi
  echo "== cargo build (wasm32, $features, WebGPU)"
  RUSTFLAGS="-C target-feature=$features" cargo build --release --target wasm32-unknown-unknown --lib \
    --no-default-features --features wasm,gpu --target-dir "target/wasm-$build"
  wasm-bindgen --target web --out-dir pkg --out-name "$name" --no-typescript \
    "target/wasm-$build/wasm32-unknown-unknown/release/saguaro.wasm"
  raw=$(stat -c %s "pkg/${name}_bg.wasm")
  node_modules/.bin/wasm-opt -Os --strip-debug --enable-simd --enable-bulk-memory --enable-sign-ext \
    --enable-nontrapping-float-to-int --enable-mutable-globals --enable-reference-types --enable-multivalue \
    "${wasm_opt_extra[@]}" "pkg/${name}_bg.wasm" -o "pkg/${name}_bg.opt.wasm"
  mv "pkg/${name}_bg.opt.wasm" "pkg/${name}_bg.wasm"
  opt=$(stat -c %s "pkg/${name}_bg.wasm")
  gz=$(gzip -9 -c "pkg/${name}_bg.wasm" | wc -c)
  echo "pkg/${name}_bg.wasm: $raw bytes from wasm-bindgen, $opt after wasm-opt -Os, $gz gzipped"
done
cp pkg-config/* pkg/
