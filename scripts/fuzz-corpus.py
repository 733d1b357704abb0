#!/usr/bin/env python3
"""Write the fuzzers' seed corpus: small synthetic model files, and seeds made from the real
models' headers (their metadata with the tokenizer cut down to a few hundred tokens), so that the
fuzzers start from inputs that reach deep into the loaders. Nothing here is committed: run it
again to recreate the corpus (scripts/fuzz.sh does so when it is missing).

usage: scripts/fuzz-corpus.py [MODELS_DIR] [CORPUS_DIR]   (defaults: models, fuzz/corpus)
"""

import json
import os
import struct
import sys

# GGUF metadata value types (the spec's numbering).
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
          U64: "<Q", I64: "<q", F64: "<d"}
# ggml tensor types: (type id, values per block, bytes per block). The K-quants' 256-value rows
# are too long for the tiny seeds; the fuzzer reaches them by mutating the type field.
GGML = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_1": (3, 32, 20), "Q8_0": (8, 32, 34)}
ALIGN = 32
# The hf_dir fuzz target's file separator and file order (fuzz/fuzz_targets/hf_dir.rs).
HF_SEPARATOR = b"\n@@saguaro-file@@\n"
HF_FILES = ["config.json", "tokenizer.json", "model.safetensors", "tokenizer_config.json",
            "generation_config.json", "model.safetensors.index.json"]
# Tokens kept when a real vocabulary is cut down for a seed.
SEED_VOCAB = 400


class Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def scalar(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.scalar("<Q")
        s = self.buf[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def value(self, ty):
        if ty == STRING:
            return self.string()
        if ty == ARRAY:
            elem, n = self.scalar("<I"), self.scalar("<Q")
            return (elem, [self.value(elem) for _ in range(n)])
        return self.scalar(SCALAR[ty])


def read_header(path):
    """The metadata of a GGUF file as [(key, type, value)], reading only as far as needed."""
    with open(path, "rb") as f:
        buf = f.read(16 << 20)  # Real headers (vocabulary included) are a few MB.
    r = Reader(buf)
    assert buf[:4] == b"GGUF", path
    r.pos = 8
    r.scalar("<Q")  # tensor count
    n_kv = r.scalar("<Q")
    kv = []
    for _ in range(n_kv):
        key = r.string()
        ty = r.scalar("<I")
        kv.append((key, ty, r.value(ty)))
    return kv, buf


def put_str(out, s):
    b = s.encode("utf-8")
    out += struct.pack("<Q", len(b)) + b


def put_value(out, ty, v):
    if ty == STRING:
        put_str(out, v)
    elif ty == ARRAY:
        elem, items = v
        out += struct.pack("<IQ", elem, len(items))
        for x in items:
            put_value(out, elem, x)
    else:
        out += struct.pack(SCALAR[ty], v)


def gguf(kv, tensors):
    """A GGUF v3 file: kv = [(key, type, value)], tensors = [(name, dims, ggml type name, data)]."""
    out = bytearray(b"GGUF") + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, ty, v in kv:
        put_str(out, key)
        out += struct.pack("<I", ty)
        put_value(out, ty, v)
    offset = 0
    for name, dims, ty, data in tensors:
        put_str(out, name)
        out += struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", GGML[ty][0], offset)
        offset += -(-len(data) // ALIGN) * ALIGN
    out += bytes(-len(out) % ALIGN)
    for _, _, _, data in tensors:
        out += data + bytes(-len(data) % ALIGN)
    return bytes(out)


def tensor_bytes(ty, n, seed):
    """Deterministic bytes for n values of type ty (any bytes are valid quantized blocks, but
    f16/f32 scales are kept finite so the weights look like weights)."""
    _, block, size = GGML[ty]
    if ty == "F32":
        return b"".join(struct.pack("<f", ((i * 7919 + seed) % 200 - 100) / 400) for i in range(n))
    raw = bytes(((i * 131 + seed * 17) % 251) for i in range(n // block * size))
    if ty == "F16":
        return b"".join(struct.pack("<e", ((i * 7919 + seed) % 200 - 100) / 400) for i in range(n))
    return raw


def byte_level_vocab():
    """GPT-2's byte-to-unicode map: the 256 single-byte tokens of a byte-level BPE."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def synthetic_tokenizer():
    """A byte-level BPE: 256 byte tokens, a few merges, and ChatML control tokens."""
    tokens = byte_level_vocab()
    merges = []
    for a, b in [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("d", "e"), ("Ġ", "f")]:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * len(tokens) + [3] * len(specials)
    return tokens + specials, merges, types


def cut_tokenizer(kv):
    """Replace a real tokenizer's arrays by their first SEED_VOCAB tokens (all single bytes and
    the commonest merges), the merges among them, and its control tokens renumbered after them."""
    meta = {k: (t, v) for k, t, v in kv}
    tokens = meta["tokenizer.ggml.tokens"][1][1]
    types = meta.get("tokenizer.ggml.token_type", (ARRAY, (I32, [1] * len(tokens))))[1][1]
    keep = list(range(min(SEED_VOCAB, len(tokens))))
    specials = [i for i, t in enumerate(types) if t == 3][:8]
    keep += [i for i in specials if i not in keep]
    new_id = {old: new for new, old in enumerate(keep)}
    kept = {tokens[i] for i in keep}
    merges = [m for m in meta.get("tokenizer.ggml.merges", (ARRAY, (STRING, [])))[1][1]
              if all(p in kept for p in m.split(" ", 1)) and m.replace(" ", "", 1) in kept]
    out = []
    for k, t, v in kv:
        if k == "tokenizer.ggml.tokens":
            v = (STRING, [tokens[i] for i in keep])
        elif k == "tokenizer.ggml.token_type":
            v = (v[0], [types[i] for i in keep])
        elif k == "tokenizer.ggml.merges":
            v = (STRING, merges)
        elif k == "tokenizer.ggml.scores":
            continue
        elif k.startswith("tokenizer.ggml.") and k.endswith("_token_id"):
            if v not in new_id:
                continue
            v = new_id[v]
        out.append((k, t, v))
    return out, len(keep)


def tiny_dims(arch):
    return {"block_count": 1, "embedding_length": 32, "feed_forward_length": 64,
            "attention.head_count": 2, "attention.head_count_kv": 1, "context_length": 256}


def tiny_tensors(arch, vocab, types):
    """The tensors of a one-layer model with tiny_dims, in the given weight types."""
    d = tiny_dims(arch)
    e, f = d["embedding_length"], d["feed_forward_length"]
    kv_dim = e // d["attention.head_count"] * d["attention.head_count_kv"]
    shapes = [("token_embd.weight", [e, vocab], types[0]), ("output_norm.weight", [e], "F32"),
              ("blk.0.attn_norm.weight", [e], "F32"), ("blk.0.ffn_norm.weight", [e], "F32"),
              ("blk.0.attn_q.weight", [e, e], types[1]), ("blk.0.attn_k.weight", [e, kv_dim], types[1]),
              ("blk.0.attn_v.weight", [e, kv_dim], types[1]), ("blk.0.attn_output.weight", [e, e], types[1]),
              ("blk.0.ffn_gate.weight", [e, f], types[2]), ("blk.0.ffn_up.weight", [e, f], types[2]),
              ("blk.0.ffn_down.weight", [f, e], types[1])]
    if arch == "qwen2":
        shapes += [("blk.0.attn_q.bias", [e], "F32"), ("blk.0.attn_k.bias", [kv_dim], "F32"),
                   ("blk.0.attn_v.bias", [kv_dim], "F32"), ("output.weight", [e, vocab], types[0])]
    return [(n, dims, ty, tensor_bytes(ty, dims[0] * (dims[1] if len(dims) > 1 else 1), i))
            for i, (n, dims, ty) in enumerate(shapes)]


def with_dims(kv, arch):
    """kv with the model's dimensions replaced by tiny_dims."""
    dims = {f"{arch}.{k}": v for k, v in tiny_dims(arch).items()}
    out = [(k, t, v) for k, t, v in kv if k not in dims and not k.startswith(f"{arch}.attention.key")]
    return out + [(k, U32, v) for k, v in dims.items()]


def synthetic_kv(arch, pre):
    tokens, merges, types = synthetic_tokenizer()
    kv = [("general.architecture", STRING, arch), ("general.alignment", U32, ALIGN),
          ("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.pre", STRING, pre),
          ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)), ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
          ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
          ("tokenizer.ggml.eos_token_id", U32, len(tokens) - 1), ("tokenizer.ggml.bos_token_id", U32, len(tokens) - 3),
          ("tokenizer.chat_template", STRING, "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"),
          (f"{arch}.rope.freq_base", F32, 10000.0), (f"{arch}.attention.layer_norm_rms_epsilon", F32, 1e-6)]
    return with_dims(kv, arch), len(tokens)


def safetensors(tensors):
    """A safetensors file: tensors = [(name, shape, F32 values as bytes)]."""
    header, offset = {}, 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(d for _, _, d in tensors)


def hf_tokenizer_json(tokens, merges, specials):
    return json.dumps({
        "version": "1.0",
        "added_tokens": [{"id": tokens.index(s), "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True} for s in specials],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }).encode()


def hf_seed(model_type, tokens, merges, specials, tie):
    e, f, layers, heads, kv_heads = 16, 32, 1, 2, 1
    kv_dim = e // heads * kv_heads
    vocab = len(tokens)
    f32 = lambda n, s: b"".join(struct.pack("<f", ((i * 7919 + s) % 200 - 100) / 400) for i in range(n))
    shapes = [("model.embed_tokens.weight", [vocab, e]), ("model.norm.weight", [e])]
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes += [(f"{p}.input_layernorm.weight", [e]), (f"{p}.post_attention_layernorm.weight", [e]),
                   (f"{p}.self_attn.q_proj.weight", [e, e]), (f"{p}.self_attn.k_proj.weight", [kv_dim, e]),
                   (f"{p}.self_attn.v_proj.weight", [kv_dim, e]), (f"{p}.self_attn.o_proj.weight", [e, e]),
                   (f"{p}.mlp.gate_proj.weight", [f, e]), (f"{p}.mlp.up_proj.weight", [f, e]),
                   (f"{p}.mlp.down_proj.weight", [e, f])]
        if model_type == "qwen2":
            shapes += [(f"{p}.self_attn.q_proj.bias", [e]), (f"{p}.self_attn.k_proj.bias", [kv_dim]),
                       (f"{p}.self_attn.v_proj.bias", [kv_dim])]
    if not tie:
        shapes.append(("lm_head.weight", [vocab, e]))
    st = safetensors([(n, s, f32(s[0] * (s[1] if len(s) > 1 else 1), i)) for i, (n, s) in enumerate(shapes)])
    config = json.dumps({"model_type": model_type, "hidden_size": e, "intermediate_size": f,
                         "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                         "num_hidden_layers": layers, "vocab_size": vocab, "rms_norm_eps": 1e-6,
                         "rope_theta": 10000.0, "max_position_embeddings": 128, "tie_word_embeddings": tie,
                         "eos_token_id": tokens.index(specials[-1])}).encode()
    tok_config = json.dumps({"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}).encode()
    gen_config = json.dumps({"eos_token_id": [tokens.index(s) for s in specials]}).encode()
    return HF_SEPARATOR.join([config, hf_tokenizer_json(tokens, merges, specials), st, tok_config, gen_config])


def write(corpus, target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    models = sys.argv[1] if len(sys.argv) > 1 else "models"
    corpus = sys.argv[2] if len(sys.argv) > 2 else os.path.join("fuzz", "corpus")
    for arch, pre, types in [("llama", "smollm", ("Q8_0", "Q4_1", "F32")), ("qwen2", "qwen2", ("F16", "Q8_0", "F32"))]:
        kv, vocab = synthetic_kv(arch, pre)
        full = gguf(kv, tiny_tensors(arch, vocab, types))
        write(corpus, "gguf", f"synthetic-{arch}", full)
        write(corpus, "gguf_tokenizer", f"synthetic-{arch}", gguf(kv, []))
        write(corpus, "gguf", f"synthetic-{arch}-truncated", full[: len(full) * 3 // 4])
    tokens, merges, _ = synthetic_tokenizer()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    for model_type, tie in [("llama", True), ("qwen2", False)]:
        write(corpus, "hf_dir", f"synthetic-{model_type}", hf_seed(model_type, tokens, merges, specials, tie))

    for name in sorted(os.listdir(models)) if os.path.isdir(models) else []:
        if not name.endswith(".gguf"):
            continue
        kv, head = read_header(os.path.join(models, name))
        stem = name[: -len(".gguf")]
        arch = next(v for k, _, v in kv if k == "general.architecture")
        cut, vocab = cut_tokenizer(kv)
        # Real metadata, a small vocabulary, no tensors: parsing and the tokenizer succeed.
        write(corpus, "gguf_tokenizer", f"{stem}-header", gguf(cut, []))
        write(corpus, "gguf", f"{stem}-header", gguf(cut, []))
        # Real metadata with tiny dimensions and tensors of the model's own types: loads fully.
        types = ("Q8_0", "Q4_1", "F32")
        write(corpus, "gguf", f"{stem}-tiny", gguf(with_dims(cut, arch), tiny_tensors(arch, vocab, types)))
        # The file's own first bytes: a truncated real header.
        write(corpus, "gguf", f"{stem}-prefix", head[:16384])
        # Its vocabulary as an HF directory, where it is a byte-level BPE (SentencePiece
        # vocabularies, Gemma's, carry scores instead of merges).
        meta = {k: v for k, _, v in cut}
        if "tokenizer.ggml.merges" not in meta:
            continue
        cut_tokens, cut_merges = meta["tokenizer.ggml.tokens"][1], meta["tokenizer.ggml.merges"][1]
        types_ = meta["tokenizer.ggml.token_type"][1]
        cut_specials = [t for t, ty in zip(cut_tokens, types_) if ty == 3] or [cut_tokens[-1]]
        write(corpus, "hf_dir", f"{stem}-vocab", hf_seed(arch, cut_tokens, cut_merges, cut_specials, arch == "llama"))
    for target in ("gguf", "gguf_tokenizer", "hf_dir"):
        d = os.path.join(corpus, target)
        print(f"{d}: {len(os.listdir(d))} seeds, {sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))} bytes")


if __name__ == "__main__":
    main()
