#!/usr/bin/env bash
# Makes the llama.cpp references of the tests (CI never runs this; the outputs are committed):
#   tests/golden/gemma-3-270m-q4_k_m.json   the real Gemma 3 270M (models/, scripts/fetch-models.sh)
#   tests/golden/families/<family>.json     the random-weight models of tests/util/families.rs
#   tests/golden/f64-gemma-3-270m-q4_k_m.json  not llama.cpp: the exact float64 reference of the
#                                           same model (f64-reference.py; needs numpy and gguf-py)
#
# usage: LLAMA_CPP=/path/to/llama.cpp scripts/reference/make-references.sh
#
# LLAMA_CPP is a llama.cpp source tree built with CMake for the CPU (build/bin holds libllama.so,
# libggml.so, libggml-base.so; LLAMA_LIB overrides that folder). Needs cc, cargo and python3;
# numpy and LLAMA_CPP/gguf-py for the optional cross-check at the end. WORK (default: a fresh
# temporary folder) keeps the tool, the generated GGUF files and the spec files.
#
# If tests/util/families.rs changed, the new files' hashes (printed by the write_families step)
# go into HASHES in tests/write_families.rs. See scripts/reference/README.md for what llama.cpp
# computes for each family.
set -euo pipefail

: "${LLAMA_CPP:?set LLAMA_CPP to a built llama.cpp source tree}"
LIB=${LLAMA_LIB:-$LLAMA_CPP/build/bin}
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/scripts/reference"
work=${WORK:-$(mktemp -d)}
mkdir -p "$work/families" "$root/tests/golden/families"

cc -O2 -std=c11 -Wall -I"$LLAMA_CPP/include" -I"$LLAMA_CPP/ggml/include" "$here/llama-reference.c" \
    -L"$LIB" -lllama -lggml -lggml-base -lm -Wl,-rpath,"$LIB" -o "$work/llama-reference"

commit=$(git -C "$LLAMA_CPP" rev-parse --short=7 HEAD 2>/dev/null ||
    sed -n 's/.*LLAMA_COMMIT = "\(.*\)".*/\1/p' "$LLAMA_CPP/build/common/build-info.cpp")
ref="llama.cpp $commit (x86_64, GGML_NATIVE build)"

# Gemma 3 270M: the four prompts (the chat one in Gemma's turn format), 32 tokens each; the
# tokenizer cases are the strings of tests/golden/prompts.json and the four prompts.
python3 - "$root/tests/golden/prompts.json" > "$work/gemma.spec" <<'EOF'
import json, sys

def esc(s):
    out = []
    for c in s:
        if c == "\\": out.append("\\\\")
        elif c == "\n": out.append("\\n")
        elif c == "\t": out.append("\\t")
        elif c == "\r": out.append("\\r")
        elif c == " ": out.append("\\s")
        elif ord(c) < 0x20: out.append("\\x%02x" % ord(c))
        else: out.append(c)
    return "".join(out)

p = json.load(open(sys.argv[1], encoding="utf-8"))
prompts = list(p["prompts"])
prompts[2] = ("<start_of_turn>user\nWrite a Python function that reverses a string.<end_of_turn>\n"
              "<start_of_turn>model\n")
for s in p["strings"] + prompts:
    print("tokenize " + esc(s))
for s in prompts:
    print("prompt " + esc(s))
EOF
"$work/llama-reference" "$root/models/gemma-3-270m-q4_k_m.gguf" "$work/gemma.spec" -n 32 -t 1 -c 512 --stop-eog \
    --reference "$ref" > "$root/tests/golden/gemma-3-270m-q4_k_m.json"

# The family models and their prompts (16 tokens each, context 128: Phi-3's short rope factors).
(cd "$root" && SAGUARO_WRITE_FAMILIES="$work/families" cargo test --test write_families -- --nocapture)
for f in qwen3 llama3 phi3 gemma3; do
    "$work/llama-reference" "$work/families/$f.gguf" "$work/families/$f.spec" -n 16 -t 1 -c 128 --stop-eog \
        --name "$f: family_gguf(\"$f\") of tests/util/families.rs" --reference "$ref" \
        > "$root/tests/golden/families/$f.json"
done

# The exact float64 reference of the real Gemma 3 270M (about 5 minutes), then an independent
# float64 forward pass of the family models against the references.
if [ -d "$LLAMA_CPP/gguf-py" ] && python3 -c "import numpy" 2>/dev/null; then
    (cd "$root" && PYTHONPATH="$LLAMA_CPP/gguf-py" python3 scripts/reference/f64-reference.py \
        models/gemma-3-270m-q4_k_m.gguf tests/golden/gemma-3-270m-q4_k_m.json tests/golden/f64-gemma-3-270m-q4_k_m.json)
    PYTHONPATH="$LLAMA_CPP/gguf-py" python3 "$here/check-families.py" "$work/families" "$root/tests/golden/families"
fi
echo "done; the generated files are in $work"
