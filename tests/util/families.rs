//! Small random-weight models of each supported family, in the exact GGUF layout llama.cpp reads
//! for the architecture (metadata keys, tensor names and shapes), all weights F32. They are the
//! inputs of the llama.cpp references in tests/golden/families/ (made by
//! scripts/reference/make-references.sh): a test loads `family_gguf(name)` and compares its
//! logits with `tests/golden/families/<name>.json`.
//!
//! Everything here is seeded ([`TestRng`]) and byte-identical on every run and machine; changing
//! anything changes the files and invalidates the references (tests/write_families.rs pins a hash
//! of each file).
//!
//! Family specifics exercised:
//! - qwen3: per-head RMS norm of q and k (`attn_q_norm`/`attn_k_norm`, head_dim long), no biases,
//!   NEOX rope, head_dim (`attention.key_length`) 64 with q width 4 x 64 != d_model 128, a separate
//!   `output.weight`.
//! - llama3: `rope_freqs.weight` (llama3 frequency factors: llama.cpp divides each pair's
//!   frequency by its factor), tied embeddings, NORM (interleaved pairs) rope.
//! - phi3: fused `attn_qkv` (q rows, then k, then v) and `ffn_up` (gate rows, then up), partial
//!   rotary (`rope.dimension_count` 24 of head_dim 32, 3/4 as Phi-4-mini's 96 of 128),
//!   `rope_factors_short`/`rope_factors_long` and `rope.scaling.attn_factor`, tied embeddings.
//! - gemma3: pre- and post-norms around attention and FFN, q/k norms, GeGLU (tanh GELU),
//!   embeddings scaled by sqrt(d_model), 6 layers of which 0-4 use a 6-token sliding window with
//!   rope base 10000 and layer 5 attends globally with `rope.freq_base`, head_dim 64 via
//!   `attention.key_length`, tied embeddings.
//!
//! The vocabulary is byte-level BPE ("gpt2", pre-tokenizer "gpt-2"): the 256 byte symbols (id =
//! byte value), a few merges, then the family's special tokens (control type).

use saguaro::model::gguf_writer::{GgufWriter, Val};
use super::rand::TestRng;

pub const FAMILIES: [&str; 4] = ["qwen3", "llama3", "phi3", "gemma3"];

/// Tokens generated per reference case.
pub const N_TOKENS: usize = 16;

/// The shape of a family's test model.
#[derive(Clone, Debug)]
pub struct Shape {
    /// `general.architecture`
    pub arch: &'static str,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Rotary dimensions per head (`rope.dimension_count`).
    pub n_rot: usize,
    pub d_ffn: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// `context_length`
    pub n_ctx_train: u32,
    /// Whether the output projection is the token embedding (no `output.weight`).
    pub tied: bool,
    /// The special tokens, appended after the byte symbols and merges.
    pub specials: &'static [&'static str],
    /// Indices into `specials`.
    pub bos: usize,
    pub eos: usize,
    /// `tokenizer.ggml.add_bos_token`: llama.cpp then puts BOS first, and so do the prompts here.
    pub add_bos: bool,
    /// Seed of the weights.
    pub seed: u64,
}

/// llama3 frequency factors (factor 8, low 1, high 4, original context 64).
pub const LLAMA3_ROPE: (f64, f64, f64, f64) = (8.0, 1.0, 4.0, 64.0);
/// Phi-3 long-rope: `rope.scaling.original_context_length`; llama.cpp takes the short factors
/// while its context (n_ctx per sequence) is at most this, the long ones beyond.
pub const PHI3_ORIG_CTX: u32 = 256;
/// The gemma3 sliding window (`attention.sliding_window`).
pub const GEMMA3_WINDOW: u32 = 6;

pub fn shape(name: &str) -> Shape {
    match name {
        "qwen3" => Shape {
            arch: "qwen3",
            d_model: 128,
            n_layers: 3,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
            n_rot: 64,
            d_ffn: 384,
            rope_base: 1_000_000.0,
            rms_eps: 1e-6,
            n_ctx_train: 4096,
            tied: false,
            specials: &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            bos: 0,
            eos: 2,
            add_bos: false,
            seed: 0x51_3e,
        },
        "llama3" => Shape {
            arch: "llama",
            d_model: 128,
            n_layers: 3,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 32,
            n_rot: 32,
            d_ffn: 320,
            rope_base: 500_000.0,
            rms_eps: 1e-5,
            n_ctx_train: 4096,
            tied: true,
            specials: &[
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
            ],
            bos: 0,
            eos: 4,
            add_bos: true,
            seed: 0x11a3,
        },
        "phi3" => Shape {
            arch: "phi3",
            d_model: 128,
            n_layers: 3,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 32,
            n_rot: 24,
            d_ffn: 384,
            rope_base: 10_000.0,
            rms_eps: 1e-5,
            n_ctx_train: 1024,
            tied: true,
            specials: &["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
            bos: 0,
            eos: 0,
            add_bos: false,
            seed: 0x9118,
        },
        "gemma3" => Shape {
            arch: "gemma3",
            d_model: 128,
            n_layers: 6,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
            n_rot: 64,
            d_ffn: 256,
            rope_base: 1_000_000.0,
            rms_eps: 1e-6,
            n_ctx_train: 4096,
            tied: true,
            specials: &["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
            bos: 2,
            eos: 1,
            add_bos: true,
            seed: 0x9e33,
        },
        _ => panic!("unknown family {name:?} (known: {FAMILIES:?})"),
    }
}

/// Merges of the test vocabulary, in rank order (each result is a token too).
const MERGES: [(&str, &str); 20] = [
    ("Ġ", "t"),
    ("h", "e"),
    ("i", "n"),
    ("e", "r"),
    ("a", "n"),
    ("o", "n"),
    ("Ġt", "he"),
    ("r", "e"),
    ("Ġ", "a"),
    ("e", "n"),
    ("Ġ", "s"),
    ("Ġ", "w"),
    ("o", "r"),
    ("i", "s"),
    ("a", "t"),
    ("Ġ", "f"),
    ("Ġ", "c"),
    ("i", "t"),
    ("e", "s"),
    ("Ġ", "o"),
];

const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;

/// GPT-2's byte-to-symbol map: printable bytes stand for themselves, the others for 256 + n.
pub fn byte_symbol(b: u8) -> char {
    let printable = |c: u32| (0x21..=0x7e).contains(&c) || (0xa1..=0xac).contains(&c) || (0xae..=0xff).contains(&c);
    if printable(b as u32) {
        return char::from(b);
    }
    let n = (0..b as u32).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

/// The vocabulary: tokens and their types.
pub fn vocab(s: &Shape) -> (Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_symbol(b).to_string()).collect();
    tokens.extend(MERGES.iter().map(|(a, b)| format!("{a}{b}")));
    let mut types = vec![TOKEN_NORMAL; tokens.len()];
    tokens.extend(s.specials.iter().map(|t| t.to_string()));
    types.resize(tokens.len(), TOKEN_CONTROL);
    (tokens, types)
}

pub fn vocab_size(s: &Shape) -> usize {
    256 + MERGES.len() + s.specials.len()
}

/// Id of `specials[i]`.
pub fn special_id(s: &Shape, i: usize) -> u32 {
    assert!(i < s.specials.len());
    (256 + MERGES.len() + i) as u32
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Uniform in [-scale, scale).
fn uniform(rng: &mut TestRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| scale * rng.uniform()).collect()
}

/// An RMS-norm weight, near 1 (as stored: for gemma3 the file holds 1 + w, llama.cpp multiplies
/// by the stored value as it is).
fn norm(rng: &mut TestRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| 1.0 + 0.25 * rng.uniform()).collect()
}

/// The gain of the projections into the residual stream (attention output, FFN down), and the
/// level of gemma3's post-norms. With tied embeddings a token's own row dominates its logits
/// (the residual stream holds its embedding) and random models repeat one token forever; layer
/// outputs well above the embedding's size keep generation varied.
const GAIN: f32 = 8.0;
const GEMMA3_POST_NORM: f32 = 10.0;

/// A gemma3 post-norm weight (as stored), around [`GEMMA3_POST_NORM`].
fn post_norm(rng: &mut TestRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| GEMMA3_POST_NORM * (1.0 + 0.25 * rng.uniform()))
        .collect()
}

/// A linear map of `n_in` inputs to `n_out` outputs (ggml dims [n_in, n_out], row-major rows of
/// n_in), scaled so that unit-RMS inputs give outputs of RMS about `gain`.
fn linear(rng: &mut TestRng, n_in: usize, n_out: usize, gain: f32) -> Vec<f32> {
    uniform(rng, n_in * n_out, gain * (3.0 / n_in as f32).sqrt())
}

/// Phi-3's `rope.scaling.attn_factor`, as llama.cpp's converter computes it for long-rope models.
pub fn phi3_attn_factor(s: &Shape) -> f32 {
    let scale = s.n_ctx_train as f64 / PHI3_ORIG_CTX as f64;
    (1.0 + scale.ln() / (PHI3_ORIG_CTX as f64).ln()).sqrt() as f32
}

/// The GGUF file of family `name`.
pub fn family_gguf(name: &str) -> Vec<u8> {
    let s = shape(name);
    let mut rng = TestRng::new(s.seed);
    let a = s.arch;
    let (d, hd) = (s.d_model, s.head_dim);
    let (q_dim, kv_dim) = (s.n_heads * hd, s.n_kv_heads * hd);
    let (tokens, types) = vocab(&s);
    let n_vocab = tokens.len();
    let key = |k: &str| format!("{a}.{k}");

    let mut w = GgufWriter::default()
        .kv("general.architecture", Val::Str(a.into()))
        // Not the family's name: llama.cpp's vocabulary loader special-cases names containing
        // "phi3" (it then requires the tokens "</s>", "<unk>" and "<s>").
        .kv("general.name", Val::Str("saguaro random-weight test model".into()))
        .kv(&key("context_length"), Val::U32(s.n_ctx_train))
        .kv(&key("embedding_length"), Val::U32(d as u32))
        .kv(&key("block_count"), Val::U32(s.n_layers as u32))
        .kv(&key("feed_forward_length"), Val::U32(s.d_ffn as u32))
        .kv(&key("attention.head_count"), Val::U32(s.n_heads as u32))
        .kv(&key("attention.head_count_kv"), Val::U32(s.n_kv_heads as u32))
        .kv(&key("attention.layer_norm_rms_epsilon"), Val::F32(s.rms_eps))
        .kv(&key("rope.freq_base"), Val::F32(s.rope_base))
        .kv(&key("rope.dimension_count"), Val::U32(s.n_rot as u32))
        .kv(&key("vocab_size"), Val::U32(n_vocab as u32));
    if q_dim != d {
        w = w
            .kv(&key("attention.key_length"), Val::U32(hd as u32))
            .kv(&key("attention.value_length"), Val::U32(hd as u32));
    }
    match name {
        "phi3" => {
            w = w
                .kv(&key("rope.scaling.original_context_length"), Val::U32(PHI3_ORIG_CTX))
                .kv(&key("rope.scaling.attn_factor"), Val::F32(phi3_attn_factor(&s)))
                .kv(&key("attention.sliding_window"), Val::U32(0));
        }
        "gemma3" => {
            w = w.kv(&key("attention.sliding_window"), Val::U32(GEMMA3_WINDOW));
        }
        _ => {}
    }
    w = w
        .kv("tokenizer.ggml.model", Val::Str("gpt2".into()))
        .kv("tokenizer.ggml.pre", Val::Str("gpt-2".into()))
        .kv("tokenizer.ggml.tokens", Val::Strs(tokens))
        .kv("tokenizer.ggml.token_type", Val::I32s(types))
        .kv(
            "tokenizer.ggml.merges",
            Val::Strs(MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect()),
        )
        .kv("tokenizer.ggml.bos_token_id", Val::U32(special_id(&s, s.bos)))
        .kv("tokenizer.ggml.eos_token_id", Val::U32(special_id(&s, s.eos)))
        .kv("tokenizer.ggml.add_bos_token", Val::Bool(s.add_bos))
        .kv("tokenizer.ggml.add_eos_token", Val::Bool(false));

    let t = |w: GgufWriter, name: &str, dims: &[usize], data: Vec<f32>| {
        assert_eq!(dims.iter().product::<usize>(), data.len(), "{name}");
        let dims: Vec<u64> = dims.iter().map(|&x| x as u64).collect();
        w.tensor(name, &dims, 0, f32_bytes(&data))
    };

    // Logits of spread ~2.5 from the unit-RMS final norm output: weights of std 2.5/sqrt(d).
    let out_scale = 2.5 * 3f32.sqrt() / (d as f32).sqrt();
    let n_special = s.specials.len();
    // The special tokens' rows are shrunk so that random generation does not stop on them.
    let shrink_specials = |mut m: Vec<f32>| {
        for x in &mut m[(n_vocab - n_special) * d..] {
            *x *= 0.25;
        }
        m
    };
    let embd = shrink_specials(uniform(&mut rng, n_vocab * d, out_scale));
    w = t(w, "token_embd.weight", &[d, n_vocab], embd);
    w = t(w, "output_norm.weight", &[d], norm(&mut rng, d));
    if !s.tied {
        let out = shrink_specials(uniform(&mut rng, n_vocab * d, out_scale));
        w = t(w, "output.weight", &[d, n_vocab], out);
    }
    match name {
        "llama3" => {
            w = t(
                w,
                "rope_freqs.weight",
                &[s.n_rot / 2],
                {
                    let (factor, low, high, orig) = LLAMA3_ROPE;
                    saguaro::model::arch::llama3_factors(s.n_rot, s.rope_base, factor, low, high, orig)
                },
            )
        }
        "phi3" => {
            let short: Vec<f32> = (0..s.n_rot / 2).map(|_| 1.5 + 0.5 * rng.uniform()).collect();
            let long: Vec<f32> = (0..s.n_rot / 2).map(|_| 5.0 + 3.0 * rng.uniform()).collect();
            w = t(w, "rope_factors_short.weight", &[s.n_rot / 2], short);
            w = t(w, "rope_factors_long.weight", &[s.n_rot / 2], long);
        }
        _ => {}
    }

    for l in 0..s.n_layers {
        let b = |n: &str| format!("blk.{l}.{n}.weight");
        w = t(w, &b("attn_norm"), &[d], norm(&mut rng, d));
        if name == "phi3" {
            w = t(
                w,
                &b("attn_qkv"),
                &[d, q_dim + 2 * kv_dim],
                linear(&mut rng, d, q_dim + 2 * kv_dim, 1.0),
            );
        } else {
            w = t(w, &b("attn_q"), &[d, q_dim], linear(&mut rng, d, q_dim, 1.0));
            w = t(w, &b("attn_k"), &[d, kv_dim], linear(&mut rng, d, kv_dim, 1.0));
            w = t(w, &b("attn_v"), &[d, kv_dim], linear(&mut rng, d, kv_dim, 1.0));
        }
        if name == "qwen3" || name == "gemma3" {
            // Above 1 on average: sharper attention than unit-RMS q and k give.
            let qk_norm = |rng: &mut TestRng| (0..hd).map(|_| 1.5 + 0.5 * rng.uniform()).collect::<Vec<f32>>();
            w = t(w, &b("attn_q_norm"), &[hd], qk_norm(&mut rng));
            w = t(w, &b("attn_k_norm"), &[hd], qk_norm(&mut rng));
        }
        w = t(w, &b("attn_output"), &[q_dim, d], linear(&mut rng, q_dim, d, GAIN));
        if name == "gemma3" {
            w = t(w, &b("post_attention_norm"), &[d], post_norm(&mut rng, d));
        }
        w = t(w, &b("ffn_norm"), &[d], norm(&mut rng, d));
        if name == "phi3" {
            w = t(
                w,
                &b("ffn_up"),
                &[d, 2 * s.d_ffn],
                linear(&mut rng, d, 2 * s.d_ffn, 1.0),
            );
        } else {
            w = t(w, &b("ffn_gate"), &[d, s.d_ffn], linear(&mut rng, d, s.d_ffn, 1.0));
            w = t(w, &b("ffn_up"), &[d, s.d_ffn], linear(&mut rng, d, s.d_ffn, 1.0));
        }
        w = t(w, &b("ffn_down"), &[s.d_ffn, d], linear(&mut rng, s.d_ffn, d, GAIN));
        if name == "gemma3" {
            w = t(w, &b("post_ffw_norm"), &[d], post_norm(&mut rng, d));
        }
    }
    w.build()
}

/// The reference prompts of family `name`: (label, ids). Random non-special ids, BOS first where
/// the vocabulary adds one; 4, 17 and 29 tokens (29 + 16 generated spans the gemma3 window
/// several times over).
pub fn family_prompts(name: &str) -> Vec<(String, Vec<u32>)> {
    let s = shape(name);
    let n_regular = (256 + MERGES.len()) as u32;
    [(4usize, 1u64), (17, 2), (29, 3)]
        .iter()
        .map(|&(len, case)| {
            let seed = s.seed * 100 + case;
            let mut rng = TestRng::new(seed);
            let mut ids = Vec::with_capacity(len);
            if s.add_bos {
                ids.push(special_id(&s, s.bos));
            }
            while ids.len() < len {
                ids.push(rng.below(n_regular));
            }
            let label = format!("{}{len} random ids, seed {seed}", if s.add_bos { "BOS + " } else { "" });
            (label, ids)
        })
        .collect()
}

/// Texts whose llama.cpp tokenization the references record (no BOS, special tokens parsed).
pub const TOKENIZER_TEXTS: [&str; 4] = [
    " the cat",
    "Hello, world!\n\nthe end is near",
    "naïve café 日本語 🚀",
    "  spaces\tand tabs ",
];

/// `s` with the escapes of llama-reference.c's spec files (spaces as \s, so none is lost).
fn spec_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '\\' => out += "\\\\",
            '\n' => out += "\\n",
            '\t' => out += "\\t",
            '\r' => out += "\\r",
            ' ' => out += "\\s",
            c if (c as u32) < 0x20 => out += &format!("\\x{:02x}", c as u32),
            c => out.push(c),
        }
    }
    out
}

/// The input of scripts/reference/llama-reference.c for family `name` (see that file).
pub fn family_spec(name: &str) -> String {
    let mut out = format!("# {name}: generated by tests/write_families.rs\n");
    for text in TOKENIZER_TEXTS {
        out += &format!("tokenize {}\n", spec_escape(text));
    }
    for (label, ids) in family_prompts(name) {
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        out += &format!("ids {} {}\n", spec_escape(&label), ids.join(" "));
    }
    out
}

/// FNV-1a, 64 bits: the pinned fingerprint of a generated file.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}
