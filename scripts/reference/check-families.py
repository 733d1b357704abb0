#!/usr/bin/env python3
"""An independent float64 NumPy forward pass of the test-family models, checked against the
llama.cpp references: it confirms that the family rules written down in
scripts/reference/README.md (rope kind, bases, factors, windows, norms, scales) are the ones
llama.cpp applies. Not a test of the engine.

usage: PYTHONPATH=<llama.cpp>/gguf-py check-families.py DIR_WITH_GGUFS tests/golden/families

For gemma3 it also reports how far llama.cpp's CPU GELU (input and output rounded to f16 through
a lookup table) moves the logits from an exact tanh GELU.
"""

import json
import math
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader

N_CTX = 128  # the context the references were made with (-c): picks Phi-3's short factors


def meta(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def tensors(r):
    # gguf-py gives numpy arrays in row-major order of the reversed ggml dims: [n_out, n_in].
    return {t.name: np.array(t.data, dtype=np.float64) for t in r.tensors}


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, n_rot, base, neox, factors=None, mscale=1.0):
    """x: [T, H, hd]. Pair i turns by pos * base^(-2i/n_rot) / factors[i]; dims past n_rot pass."""
    half = n_rot // 2
    i = np.arange(half)
    freq = base ** (-2.0 * i / n_rot)
    if factors is not None:
        freq = freq / factors[:half]
    theta = pos[:, None] * freq[None, :]
    cos = (np.cos(theta) * mscale)[:, None, :]
    sin = (np.sin(theta) * mscale)[:, None, :]
    out = x.copy()
    if neox:
        x0, x1 = x[..., :half], x[..., half:n_rot]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_rot] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    return out


def attention(q, k, v, scale, window=None):
    """q: [T, H, hd], k/v: [T, KV, hd]; query head h reads kv head h // (H / KV). A query at p sees
    keys p0 <= p, and with a window only p - p0 < window."""
    T, H, hd = q.shape
    KV = k.shape[1]
    g = H // KV
    out = np.zeros((T, H, v.shape[2]))
    p = np.arange(T)
    allowed = p[None, :] <= p[:, None]
    if window is not None:
        allowed &= (p[:, None] - p[None, :]) < window
    for h in range(H):
        s = q[:, h, :] @ k[:, h // g, :].T * scale
        s = np.where(allowed, s, -np.inf)
        s = s - s.max(axis=1, keepdims=True)
        a = np.exp(s)
        a /= a.sum(axis=1, keepdims=True)
        out[:, h, :] = a @ v[:, h // g, :]
    return out.reshape(T, -1)


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * x * (1.0 + 0.044715 * x * x)))


def gelu_ggml_cpu(x):
    """ggml's CPU GELU for f32 (GGML_GELU_FP16): |x| >= 10 exact limits, else an f16 table."""
    xh = x.astype(np.float16).astype(np.float64)
    y = gelu_tanh(xh.astype(np.float32).astype(np.float64)).astype(np.float32).astype(np.float16).astype(np.float64)
    return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, y))


def forward(r, ids, gelu=gelu_tanh):
    """The logits [T, n_vocab] of the F32 model in reader r for the token ids."""
    W = tensors(r)
    return hidden(r, W, ids, gelu) @ W.get("output.weight", W["token_embd.weight"]).T


def hidden(r, W, ids, gelu=gelu_tanh):
    """The forward pass up to the output norm: [T, n_embd] in float64, the rows the output matrix
    (output.weight, else the tied token_embd.weight) turns into logits. W maps tensor names to
    arrays [n_out, n_in] (any float dtype whose values float64 holds exactly; every product and
    sum is done in float64). f64-reference.py uses it on the dequantized real Gemma 3 270M."""
    arch = meta(r, "general.architecture")
    a = lambda k, d=None: meta(r, f"{arch}.{k}", d)
    d = a("embedding_length")
    L = a("block_count")
    H = a("attention.head_count")
    KV = a("attention.head_count_kv", H)
    hd = a("attention.key_length", d // H)
    n_rot = a("rope.dimension_count", hd)
    eps = a("attention.layer_norm_rms_epsilon")
    base = a("rope.freq_base", 10000.0)
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)

    x = np.array(W["token_embd.weight"][ids], dtype=np.float64)
    if arch == "gemma3":
        x *= float(np.sqrt(np.float32(d)))

    factors = None
    mscale = 1.0
    if arch == "llama":
        factors = W.get("rope_freqs.weight")
    if arch == "phi3" and "rope_factors_short.weight" in W:
        orig = a("rope.scaling.original_context_length", a("context_length"))
        factors = W["rope_factors_long.weight"] if N_CTX > orig else W["rope_factors_short.weight"]
        mscale = a("rope.scaling.attn_factor", 1.0)

    for l in range(L):
        b = lambda n: W[f"blk.{l}.{n}.weight"]
        h = rms(x, b("attn_norm"), eps)
        if arch == "phi3":
            qkv = h @ b("attn_qkv").T
            q, k, v = qkv[:, :H * hd], qkv[:, H * hd:(H + KV) * hd], qkv[:, (H + KV) * hd:]
        else:
            q, k, v = h @ b("attn_q").T, h @ b("attn_k").T, h @ b("attn_v").T
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
        window = None
        layer_base = base
        if arch in ("qwen3", "gemma3"):
            q = rms(q, b("attn_q_norm"), eps)
            k = rms(k, b("attn_k_norm"), eps)
        if arch == "gemma3" and l % 6 < 5:  # llama.cpp: set_swa_pattern(6), layers 6n+5 global
            window = a("attention.sliding_window")
            layer_base = 10000.0
        neox = arch != "llama"
        q = rope(q, pos, n_rot, layer_base, neox, factors, mscale)
        k = rope(k, pos, n_rot, layer_base, neox, factors, mscale)
        o = attention(q, k, v, 1.0 / math.sqrt(hd), window) @ b("attn_output").T
        if arch == "gemma3":
            o = rms(o, b("post_attention_norm"), eps)
        x = x + o
        h = rms(x, b("ffn_norm"), eps)
        if arch == "phi3":
            gu = h @ b("ffn_up").T
            n_ff = gu.shape[1] // 2
            f = silu(gu[:, :n_ff]) * gu[:, n_ff:]
        elif arch == "gemma3":
            f = gelu(h @ b("ffn_gate").T) * (h @ b("ffn_up").T)
        else:
            f = silu(h @ b("ffn_gate").T) * (h @ b("ffn_up").T)
        f = f @ b("ffn_down").T
        if arch == "gemma3":
            f = rms(f, b("post_ffw_norm"), eps)
        x = x + f
    return rms(x, W["output_norm.weight"], eps)


def check(gguf_path, golden_path):
    r = GGUFReader(str(gguf_path))
    g = json.loads(Path(golden_path).read_text())
    arch = meta(r, "general.architecture")
    worst = 0.0
    worst_exact = 0.0
    argmax_ok = True
    for case in g["cases"]:
        seq = case["prompt_ids"] + case["greedy_ids"]
        first = len(case["prompt_ids"]) - 1
        logits = forward(r, seq, gelu_ggml_cpu if arch == "gemma3" else gelu_tanh)
        exact = forward(r, seq) if arch == "gemma3" else logits
        for j, top in enumerate(case["top5"]):
            row = logits[first + j]
            argmax_ok &= int(np.argmax(row)) == top[0][0]
            for tid, want in top:
                worst = max(worst, abs(row[tid] - want))
                worst_exact = max(worst_exact, abs(exact[first + j][tid] - want))
    line = f"{gguf_path.stem}: largest top-5 logit difference {worst:.2e}, argmax {'agrees' if argmax_ok else 'DIFFERS'}"
    if arch == "gemma3":
        line += f" (with an exact tanh GELU instead of ggml's f16 table: {worst_exact:.2e})"
    print(line)
    return worst


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    d, gold = Path(sys.argv[1]), Path(sys.argv[2])
    bad = False
    # gemma3's GELU table is emulated only to within 1.3e-3 of ggml's.
    for name, tol in [("qwen3", 1e-3), ("llama3", 1e-3), ("phi3", 1e-3), ("gemma3", 2e-3)]:
        bad |= check(d / f"{name}.gguf", gold / f"{name}.json") > tol
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
