#!/usr/bin/env bash
# Fuzz the model loaders: each cargo-fuzz target in fuzz/ runs for SECONDS (default 60) from the
# seed corpus (written by scripts/fuzz-corpus.py when fuzz/corpus is missing). Needs the nightly
# toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Exits non-zero on the first crash (a
# panic, an abort, an overflow caught by debug assertions), hang (an input running over 10 s) or
# single allocation over 256 MB (fuzz/src/lib.rs); the input is left in fuzz/artifacts/TARGET/.
# Keep each such input as a regression test in tests/bad_input.rs.
#
# The targets are built without a sanitizer: the loaders have no unsafe code (the one memory map
# is in the native file opener, which the targets do not use), so AddressSanitizer would find
# little a panic does not, and without it the targets build and run several times faster.
#
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (default: every target)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(gguf gguf_tokenizer hf_dir)
fi

if [ ! -d fuzz/corpus ]; then
    scripts/fuzz-corpus.py models fuzz/corpus
fi

echo "== build the fuzz targets"
cargo +nightly fuzz build --sanitizer none

for target in "${targets[@]}"; do
    echo "== fuzz $target for ${seconds}s"
    # Seeds are tens of kB; longer inputs only slow the search.
    cargo +nightly fuzz run --sanitizer none "$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -max_len=131072 -print_final_stats=1
done
