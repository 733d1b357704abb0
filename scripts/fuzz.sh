#!/usr/bin/env bash
# Fuzz the model loaders: each cargo-fuzz target in fuzz/ runs for SECONDS (default 60) from the
# seed corpus (written by scripts/fuzz-corpus.py when fuzz/corpus is missing). Needs the nightly
# toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Exits non-zero on the first crash, hang
# (an input running over 10 s) or allocation over 256 MB; the input is left in
# fuzz/artifacts/TARGET/. Keep each such input as a regression test in tests/bad_input.rs.
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

for target in "${targets[@]}"; do
    echo "== fuzz $target for ${seconds}s"
    # Seeds are tens of kB; longer inputs only slow the search. The allocation limit catches a
    # size field that makes the loader allocate far more than its input holds.
    cargo +nightly fuzz run "$target" -- \
        -max_total_time="$seconds" -timeout=10 -malloc_limit_mb=256 -rss_limit_mb=2048 \
        -max_len=131072 -print_final_stats=1
done
