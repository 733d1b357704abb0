#!/usr/bin/env bash
# Build the npm package pkg/ (saguaro-web) from scratch: the library for wasm32 with the simd128
# CPU kernels and the WebGPU backend, again with relaxed SIMD, and a threads build (CPU only,
# atomics and shared memory, on the nightly toolchain); JS bindings from wasm-bindgen (the CLI
# pinned to the version in Cargo.lock, installed if missing), wasm-opt from npm binaryen, then
# the package template (pkg-config/: JS API, workers, TypeScript types, README).
# Usage: scripts/build-web.sh   then: npm pack ./pkg
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
if ! wasm-bindgen --version 2>/dev/null | grep -qx "wasm-bindgen $version"; then
  echo "== installing wasm-bindgen-cli $version"
  cargo install wasm-bindgen-cli --version "$version"
fi
[ -x node_modules/.bin/wasm-opt ] || npm ci --no-audit --no-fund
# The threads build rebuilds std with atomics: nightly with its sources and the wasm32 target.
cargo +nightly --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
rustup +nightly component list --installed | grep -q '^rust-src' || rustup +nightly component add rust-src
rustup +nightly target list --installed | grep -qx wasm32-unknown-unknown || rustup +nightly target add wasm32-unknown-unknown

rm -rf pkg
mkdir -p pkg
# Three builds of the library: simd128, which every current browser runs; simd128 with relaxed
# SIMD, whose byte dot products speed up 8-bit activations (a CPU draft's), which core.js loads
# where WebAssembly.validate accepts a relaxed-SIMD instruction; and the threads build, simd128
# with atomics on shared memory (4 GiB at most) and no WebGPU, whose CPU backend computes on a
# pool of workers (src/wasm/threads.rs), which core.js loads for an engine with nothing on WebGPU
# where memory can be shared (Node, a cross-origin isolated page) and more than one thread asked.
for build in simd128 relaxed threads; do
  features="+simd128"
  name=saguaro
  toolchain=()
  cargo_extra=(--features wasm,gpu)
  link=""
  wasm_opt_extra=()
  if [ "$build" = relaxed ]; then
    features="+simd128,+relaxed-simd"
    name=saguaro_relaxed
    wasm_opt_extra=(--enable-relaxed-simd)
  elif [ "$build" = threads ]; then
    features="+simd128,+atomics,+bulk-memory,+mutable-globals"
    name=saguaro_threads
    toolchain=(+nightly)
    cargo_extra=(--features wasm,threads -Z build-std=panic_abort,std)
    # A shared memory the JS side creates (imported), and the TLS symbols wasm-bindgen's thread
    # start-up needs.
    link=" -C link-arg=--shared-memory -C link-arg=--import-memory -C link-arg=--max-memory=4294967296"
    for sym in __wasm_init_tls __tls_size __tls_align __tls_base; do link+=" -C link-arg=--export=$sym"; done
    wasm_opt_extra=(--enable-threads)
  fi
  echo "== cargo build (wasm32, $features$([ "$build" = threads ] && echo ', nightly, CPU only' || echo ', WebGPU'))"
  start=$SECONDS
  RUSTFLAGS="-C target-feature=$features$link" cargo "${toolchain[@]}" build --release --target wasm32-unknown-unknown --lib \
    --no-default-features "${cargo_extra[@]}" --target-dir "target/wasm-$build"
  echo "cargo build ($build): $((SECONDS - start)) s"
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
