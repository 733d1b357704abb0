#!/usr/bin/env python3
"""An exact float64 reference of the real Gemma 3 270M (Q4_K_M): the forward pass of
check-families.py (`hidden`) on every tensor of the GGUF dequantized with gguf-py, greedy
continuations of the prompts of the llama.cpp golden file, written in the same format.

usage: PYTHONPATH=<llama.cpp>/gguf-py f64-reference.py MODEL.gguf LLAMA_GOLDEN.json OUT.json

For each case of LLAMA_GOLDEN.json it takes prompt_ids, generates its own n_tokens greedy tokens
(argmax of the float64 logits, lowest id on a tie; a case stops after <eos> or <end_of_turn>,
that token included) and records the five largest logits of the row that predicts each generated
token (largest first, equal logits in id order). Each step recomputes the whole sequence (no K/V
cache; the sequences are short). The tied output matrix is applied to the last row only, in
chunks of rows, so the 262144 x 640 matrix is held in float32 (whose values are the exact
dequantized ones) and never whole in float64. The "tokenizer" field is left empty. On stderr it
compares the result with LLAMA_GOLDEN.json: where the greedy tokens first differ (with the top-1
minus top-2 margins of both there) and the largest top-5 logit difference while they agree.

Why gguf-py's float32 dequantization is exact here: Q8_0 is d * q (f16 times an 8-bit integer),
Q5_0 d * q (5-bit), Q6_K (d * s) * q (f16 times 8-bit times 6-bit): at most 23 significant bits,
so float32 holds every value exactly. Q4_K is (d * s) * q - dmin * m, whose subtraction could
round in float32: the script recomputes it in float64 and stops if any value differs.
"""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import Q4_K, dequantize

_spec = importlib.util.spec_from_file_location("check_families", Path(__file__).with_name("check-families.py"))
cf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cf)

HEAD_CHUNK = 16384  # rows of the output matrix turned into float64 at a time (84 MB)


def q4_k_f64(data):
    """Q4_K dequantized in float64 (gguf-py's block layout and scale unpacking)."""
    b = data.reshape(-1, 144)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
    dmin = b[:, 2:4].copy().view(np.float16).astype(np.float64)
    sc, m = Q4_K.get_scale_min(b[:, 4:16].copy())
    q = b[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (q & np.uint8(15)).reshape(-1, 8, 32).astype(np.float64)
    x = (d * sc.astype(np.float64)).reshape(-1, 8, 1) * q - (dmin * m.astype(np.float64)).reshape(-1, 8, 1)
    return x.reshape(-1)


def load(r):
    """Every tensor as [n_out, n_in]: token_embd.weight float32 (exact), the rest float64."""
    W = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type)
        if t.tensor_type == QT.Q4_K:
            exact = q4_k_f64(t.data)
            if not np.array_equal(exact, w.reshape(-1).astype(np.float64)):
                sys.exit(f"{t.name}: gguf-py's float32 Q4_K values are not exact")
        elif t.tensor_type not in (QT.F32, QT.Q8_0, QT.Q5_0, QT.Q6_K):
            sys.exit(f"{t.name}: type {t.tensor_type.name} not covered by the exactness argument")
        W[t.name] = w if t.name == "token_embd.weight" else w.astype(np.float64)
    return W


def head(E, y):
    """E [n_vocab, d] (float32) times y [d] in float64, a chunk of rows at a time."""
    out = np.empty(E.shape[0])
    for i in range(0, E.shape[0], HEAD_CHUNK):
        out[i:i + HEAD_CHUNK] = E[i:i + HEAD_CHUNK].astype(np.float64) @ y
    return out


def top5(logits):
    """The five largest logits, largest first, equal logits in id order."""
    cand = np.argpartition(-logits, 16)[:16]  # keeps ties at the fifth place whatever the order
    cand = cand[np.lexsort((cand, -logits[cand]))]
    return [(int(i), float(logits[i])) for i in cand[:5]]


def detokenize(tokens, ids):
    out = bytearray()
    for i in ids:
        t = tokens[i]
        if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            out.append(int(t[3:5], 16))
        else:
            out += t.replace("\u2581", " ").encode("utf-8")
    return out.decode("utf-8", errors="replace")


def generate(r, W, prompt_ids, n_tokens, eog):
    E = W.get("output.weight", W["token_embd.weight"])
    seq = list(prompt_ids)
    ids, tops = [], []
    for _ in range(n_tokens):
        y = cf.hidden(r, W, seq)[-1]
        logits = head(E, y)
        top = top5(logits)
        tok = int(np.argmax(logits))  # the first maximum: lowest id on a tie
        assert tok == top[0][0]
        ids.append(tok)
        tops.append(top)
        seq.append(tok)
        if tok in eog:
            break
    return ids, tops


def js(v):
    return json.dumps(v, ensure_ascii=False)


def write(path, model, reference, n_tokens, cases):
    lines = ["{", f" \"model\": {js(model)},", f" \"reference\": {js(reference)},",
             f" \"n_tokens\": {n_tokens},", " \"tokenizer\": [],", " \"cases\": ["]
    for ci, c in enumerate(cases):
        lines += ["  {", f"   \"prompt\": {js(c['prompt'])},", f"   \"prompt_ids\": {js(c['prompt_ids'])},",
                  f"   \"greedy_ids\": {js(c['greedy_ids'])},", f"   \"greedy_text\": {js(c['greedy_text'])},",
                  "   \"top5\": ["]
        for j, top in enumerate(c["top5"]):
            row = ", ".join(f"[{i}, {v:.6f}]" for i, v in top)
            lines.append(f"    [{row}]" + ("," if j + 1 < len(c["top5"]) else ""))
        lines += ["   ]", "  }" + ("," if ci + 1 < len(cases) else "")]
    lines += [" ]", "}"]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def compare(ours, theirs):
    """Per case: agreement of the greedy tokens and the largest top-5 logit difference where both
    sequences still agree (tokens in both top-5 lists)."""
    for k, (a, b) in enumerate(zip(ours, theirs)):
        n = min(len(a["greedy_ids"]), len(b["greedy_ids"]))
        first = next((j for j in range(n) if a["greedy_ids"][j] != b["greedy_ids"][j]), None)
        if first is None and len(a["greedy_ids"]) != len(b["greedy_ids"]):
            first = n
        worst, at = 0.0, None
        for j in range(n if first is None else first + 1):  # row `first` still has the same prefix
            tb = dict(b["top5"][j])
            for i, v in a["top5"][j]:
                if i in tb and abs(v - tb[i]) > worst:
                    worst, at = abs(v - tb[i]), (j, i)
        if first is None:
            what = f"all {n} tokens equal"
        else:
            ma = a["top5"][first][0][1] - a["top5"][first][1][1]
            mb = b["top5"][first][0][1] - b["top5"][first][1][1]
            what = (f"first differs at generated token {first}: f64 {a['top5'][first][0][0]} "
                    f"(top1-top2 margin {ma:.4f}), llama.cpp {b['top5'][first][0][0]} (margin {mb:.4f})")
        print(f"case {k}: {what}; largest |f64 - llama.cpp| top-5 logit difference {worst:.4f} "
              f"(generated token {at[0]}, id {at[1]})", file=sys.stderr)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    model, golden, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    g = json.loads(golden.read_text(encoding="utf-8"))
    r = GGUFReader(str(model))
    if cf.meta(r, "general.architecture") != "gemma3":
        sys.exit("the reference rules are checked for gemma3 only")
    W = load(r)
    tokens = [str(t) for t in cf.meta(r, "tokenizer.ggml.tokens")]
    eog = {cf.meta(r, "tokenizer.ggml.eos_token_id"), tokens.index("<end_of_turn>")}
    n_tokens = g["n_tokens"]
    cases = []
    for c in g["cases"]:
        ids, tops = generate(r, W, c["prompt_ids"], n_tokens, eog)
        cases.append({"prompt": c["prompt"], "prompt_ids": c["prompt_ids"], "greedy_ids": ids,
                      "greedy_text": detokenize(tokens, ids), "top5": tops})
        print(f"case {len(cases) - 1}: {len(ids)} tokens", file=sys.stderr)
    reference = (
        "exact float64 reference (not llama.cpp): scripts/reference/f64-reference.py, run as "
        f"`PYTHONPATH=<llama.cpp>/gguf-py python3 scripts/reference/f64-reference.py models/{model.name} "
        f"tests/golden/{golden.name} tests/golden/{out.name}`; every tensor dequantized with gguf-py's "
        "gguf.quants.dequantize (its float32 values are the exact dequantized ones; Q4_K checked against "
        "a float64 recomputation) and used in float64; the forward pass is `hidden` of "
        "scripts/reference/check-families.py in float64 NumPy (Gemma 3 rules of scripts/reference/README.md: "
        "embeddings times sqrt(n_embd), post-attention and post-FFN norms, per-head q/k RMS norms, NEOX rope, "
        "base 10000 with window 512 on layers il % 6 < 5 and rope.freq_base on the others, scale 1/sqrt(256)) "
        "with an EXACT tanh GELU (not ggml's f16 table) and no rounding of activations; tied output matrix "
        "applied in float64; the whole sequence recomputed at every step; prompt_ids of "
        f"tests/golden/{golden.name}, own greedy continuation: argmax (lowest id on ties), a case stops after "
        "<eos> (1) or <end_of_turn> (106), included; top5 as in the llama.cpp file; tokenizer cases not included"
    )
    write(out, g["model"], reference, n_tokens, cases)
    compare(cases, g["cases"])


if __name__ == "__main__":
    main()
