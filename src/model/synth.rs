//! Models of real shapes with random weights, for timing where no model file can be fetched
//! (`saguaro synth`): a GGUF file with a known model's hyperparameters, tensor layout, storage
//! types and vocabulary size, whose weights are drawn at random at scales that keep a forward's
//! values in the range of real ones (projections of unit-RMS inputs with unit-RMS outputs, norms
//! near 1), so generation runs as long as asked for without overflowing, and with varied tokens
//! where the head is not the embedding.
//!
//! The vocabulary is byte-level BPE (Qwen 2's pre-tokenizer) of made-up tokens: the 256 byte
//! symbols, then pairs and triples of them, each with the merge that makes it, and Qwen's chat
//! tokens at Qwen's ids with a ChatML template, so prompts and chats encode as they do with the
//! real model, at two to three bytes per token.
//!
//! Each tensor's values come from a seed of its own (its layer and kind) and the file's seed, and
//! its types from the whole model's layer count, so a file of fewer layers holds exactly the
//! embedding, head and first layers of the full one.

use std::fmt;
use std::str::FromStr;

use rayon::prelude::*;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

use crate::error::{Error, Result};
use crate::model::gguf_writer::{GgufWriter, Val};
use crate::sampling::Rng;
use crate::storage::quant::DType;
use crate::storage::quantize::{quantize, QUANTIZERS};

/// A model's shape: everything of it but its weights' values.
#[derive(Clone, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub d_ffn: usize,
    /// Rows of the embedding and of the output head; tokens of the vocabulary.
    pub vocab: usize,
    /// The id of `<|endoftext|>`, followed by `<|im_start|>` and `<|im_end|>`.
    pub first_special: usize,
    pub rope_base: f32,
    pub context: u32,
    /// Whether the output head is the embedding (no `output.weight`) when one type is asked for
    /// every matrix. The Q4_K_M mix always writes a Q6_K head of its own, as llama.cpp's files of
    /// these models hold.
    pub tied: bool,
}

/// Qwen 2.5's shapes (head dimension 128, but 64 for the 0.5B), and a tiny one for tests.
pub const SHAPES: [Shape; 5] = [
    Shape { name: "qwen2.5-0.5b", d_model: 896, n_layers: 24, n_heads: 14, n_kv_heads: 2, d_ffn: 4864, ..QWEN },
    Shape { name: "qwen2.5-1.5b", d_model: 1536, n_layers: 28, n_heads: 12, n_kv_heads: 2, d_ffn: 8960, ..QWEN },
    Shape { name: "qwen2.5-3b", d_model: 2048, n_layers: 36, n_heads: 16, n_kv_heads: 2, d_ffn: 11008, ..QWEN },
    Shape {
        name: "qwen2.5-7b",
        d_model: 3584,
        n_layers: 28,
        n_heads: 28,
        n_kv_heads: 4,
        d_ffn: 18944,
        vocab: 152_064,
        tied: false,
        ..QWEN
    },
    Shape {
        name: "tiny",
        d_model: 256,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        d_ffn: 512,
        vocab: 1024,
        first_special: 1021,
        context: 4096,
        ..QWEN
    },
];

const QWEN: Shape = Shape {
    name: "",
    d_model: 0,
    n_layers: 0,
    n_heads: 0,
    n_kv_heads: 0,
    d_ffn: 0,
    vocab: 151_936,
    first_special: 151_643,
    rope_base: 1e6,
    context: 32_768,
    tied: true,
};

/// The shape called `name`.
pub fn shape(name: &str) -> Result<&'static Shape> {
    SHAPES.iter().find(|s| s.name.eq_ignore_ascii_case(name)).ok_or_else(|| {
        let names: Vec<_> = SHAPES.iter().map(|s| s.name).collect();
        Error::InvalidArgument(format!("unknown shape '{name}' (one of {})", names.join(", ")))
    })
}

/// The storage types of a model's matrices; norms and biases are F32 in every case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    /// Every matrix in this type.
    All(DType),
    /// llama.cpp's Q4_K_M mix: Q4_K, and Q6_K for the output head and for `attn_v` and `ffn_down`
    /// in the first and last eighth of the layers and every third layer between.
    Q4KM,
}

/// The float types a model can be written in; the others are [`QUANTIZERS`].
const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

impl FromStr for Quant {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let writable = || {
            let names: Vec<_> = FLOATS.iter().chain(&QUANTIZERS).map(|d| d.name()).collect();
            format!("one of {}, q4_k_m", names.join(", "))
        };
        if s.eq_ignore_ascii_case("q4_k_m") {
            return Ok(Quant::Q4KM);
        }
        match s.parse::<DType>() {
            Ok(d) if FLOATS.contains(&d) || QUANTIZERS.contains(&d) => Ok(Quant::All(d)),
            Ok(d) => Err(Error::InvalidArgument(format!("weights cannot be written in {} ({})", d.name(), writable()))),
            Err(_) => Err(Error::InvalidArgument(format!("unknown weight type '{s}' ({})", writable()))),
        }
    }
}

impl fmt::Display for Quant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quant::All(d) => f.write_str(d.name()),
            Quant::Q4KM => f.write_str("q4_k_m"),
        }
    }
}

/// llama.cpp's layers that take more bits in its `_M` mixes, of `n`.
fn more_bits(layer: usize, n: usize) -> bool {
    layer < n / 8 || layer >= 7 * n / 8 || (layer - n / 8) % 3 == 2
}

impl Quant {
    /// The type of matrix `kind` (a GGUF tensor's base name) of `layer` of `n_layers`, with rows of
    /// `cols` values: K-quants fall back to their 32-value counterparts, as llama.cpp's do, where a
    /// row is not whole 256-value blocks (Qwen 0.5B's 896).
    fn dtype_of(self, kind: &str, layer: Option<usize>, n_layers: usize, cols: usize) -> DType {
        let want = match self {
            Quant::All(d) => d,
            Quant::Q4KM => match (kind, layer) {
                ("output", _) => DType::Q6K,
                ("attn_v" | "ffn_down", Some(l)) if more_bits(l, n_layers) => DType::Q6K,
                _ => DType::Q4K,
            },
        };
        match want {
            _ if cols.is_multiple_of(want.block_size()) => want,
            DType::Q6K => DType::Q8_0,
            _ => DType::Q4_1,
        }
    }

    fn tied(self, shape: &Shape) -> bool {
        shape.tied && self != Quant::Q4KM
    }
}

/// What to synthesize.
#[derive(Clone, Debug)]
pub struct Synth {
    pub shape: &'static Shape,
    pub quant: Quant,
    /// Layers to write (the shape's own count when `None`).
    pub layers: Option<usize>,
    pub seed: u64,
}

/// A projection's gain into the residual stream (attention output, FFN down): with tied
/// embeddings a token's own row dominates its logits while the stream holds its embedding, and
/// random models repeat one token; layer outputs well above the embedding's size keep a shallow
/// model's output varied.
const GAIN: f32 = 8.0;
/// The spread of the logits: the head's rows dotted with the unit-RMS final norm's output.
const LOGIT_RMS: f32 = 2.5;
const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + \
    message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}\
    {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;

/// SplitMix64's finalizer over `a` and `b`: a seed per tensor and per chunk of rows.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = (a ^ b.rotate_left(32)).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The amplitude of uniform weights that map unit-RMS inputs of `n_in` values to outputs of RMS
/// `gain`.
fn amplitude(n_in: usize, gain: f32) -> f32 {
    gain * (3.0 / n_in as f32).sqrt()
}

/// `values` into `out` in `dtype`.
fn encode(dtype: DType, values: &[f32], out: &mut [u8]) -> Result<()> {
    fn put<const N: usize>(out: &mut [u8], values: &[f32], bytes: impl Fn(f32) -> [u8; N]) {
        for (o, &v) in out.chunks_exact_mut(N).zip(values) {
            o.copy_from_slice(&bytes(v));
        }
    }
    match dtype {
        DType::F32 => put(out, values, f32::to_le_bytes),
        DType::F16 => put(out, values, |v| half::f16::from_f32(v).to_le_bytes()),
        DType::BF16 => put(out, values, |v| half::bf16::from_f32(v).to_le_bytes()),
        _ => return quantize(dtype, values, out),
    }
    Ok(())
}

/// `rows` rows of `cols` uniform values in `dtype`, row `r` within +-`amp(r)`, drawn and encoded in
/// chunks of rows in parallel, each chunk from its own seed.
fn random_matrix(
    dtype: DType,
    (rows, cols): (usize, usize),
    seed: u64,
    amp: impl Fn(usize) -> f32 + Sync,
) -> Result<Vec<u8>> {
    const ROWS: usize = 16;
    let row_bytes = dtype.bytes_for(cols)?;
    let mut out = vec![0u8; rows * row_bytes];
    out.par_chunks_mut(ROWS * row_bytes).enumerate().try_for_each(|(i, chunk)| {
        let mut rng = Rng::new(mix(seed, i as u64));
        let n = chunk.len() / row_bytes * cols;
        let values: Vec<f32> = (0..n).map(|j| amp(i * ROWS + j / cols) * (2.0 * rng.uniform() - 1.0)).collect();
        encode(dtype, &values, chunk)
    })?;
    Ok(out)
}

/// `n` F32 values uniform in `center` +- `amp`.
fn vector(n: usize, seed: u64, center: f32, amp: f32) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..n).flat_map(|_| (center + amp * (2.0 * rng.uniform() - 1.0)).to_le_bytes()).collect()
}

/// The vocabulary of `shape` (see the module's comment): tokens, their types and the merges.
fn vocabulary(shape: &Shape) -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut symbols: Vec<String> = ByteLevel::alphabet().into_iter().map(String::from).collect();
    symbols.sort();
    let n = symbols.len();
    let mut tokens = symbols.clone();
    let mut types = vec![TOKEN_NORMAL; n];
    let mut merges = Vec::new();
    // Merge k: the pairs of symbols, then each pair with a symbol after it.
    let merge = |k: usize| match k.checked_sub(n * n) {
        None => (symbols[k / n].clone(), symbols[k % n].clone()),
        Some(t) => (format!("{}{}", symbols[t / n / n % n], symbols[t / n % n]), symbols[t % n].clone()),
    };
    while tokens.len() < shape.vocab {
        let id = tokens.len();
        if (shape.first_special..shape.first_special + SPECIALS.len()).contains(&id) {
            tokens.push(SPECIALS[id - shape.first_special].into());
            types.push(TOKEN_CONTROL);
            continue;
        }
        let (a, b) = merge(merges.len());
        tokens.push(format!("{a}{b}"));
        types.push(TOKEN_NORMAL);
        merges.push(format!("{a} {b}"));
    }
    (tokens, types, merges)
}

impl Synth {
    pub fn layers(&self) -> usize {
        self.layers.unwrap_or(self.shape.n_layers)
    }

    /// The model as a GGUF file to write.
    pub fn model(&self) -> Result<GgufWriter> {
        let s = self.shape;
        if !(1..=s.n_layers).contains(&self.layers()) {
            let reason = format!("must be in 1..={} for {}, got {}", s.n_layers, s.name, self.layers());
            return Err(Error::option("layers", reason));
        }
        if s.first_special + SPECIALS.len() > s.vocab {
            return Err(Error::InvalidArgument(format!("shape {}: the chat tokens are past its vocabulary", s.name)));
        }
        let (d, f, v) = (s.d_model, s.d_ffn, s.vocab);
        let kv = s.n_kv_heads * (d / s.n_heads);
        let a = "qwen2";
        let key = |k: &str| format!("{a}.{k}");
        let (tokens, types, merges) = vocabulary(s);
        let mut w = GgufWriter::default()
            .kv("general.architecture", Val::Str(a.into()))
            .kv("general.name", Val::Str(format!("saguaro synth {} {} (random weights)", s.name, self.quant)))
            .kv(&key("context_length"), Val::U32(s.context))
            .kv(&key("embedding_length"), Val::U32(d as u32))
            .kv(&key("block_count"), Val::U32(self.layers() as u32))
            .kv(&key("feed_forward_length"), Val::U32(f as u32))
            .kv(&key("attention.head_count"), Val::U32(s.n_heads as u32))
            .kv(&key("attention.head_count_kv"), Val::U32(s.n_kv_heads as u32))
            .kv(&key("rope.freq_base"), Val::F32(s.rope_base))
            .kv(&key("attention.layer_norm_rms_epsilon"), Val::F32(1e-6))
            .kv("tokenizer.ggml.model", Val::Str("gpt2".into()))
            .kv("tokenizer.ggml.pre", Val::Str("qwen2".into()))
            .kv("tokenizer.ggml.tokens", Val::Strs(tokens))
            .kv("tokenizer.ggml.token_type", Val::I32s(types))
            .kv("tokenizer.ggml.merges", Val::Strs(merges))
            .kv("tokenizer.ggml.bos_token_id", Val::U32(s.first_special as u32))
            .kv("tokenizer.ggml.eos_token_id", Val::U32(s.first_special as u32 + 2))
            .kv("tokenizer.ggml.add_bos_token", Val::Bool(false))
            .kv("tokenizer.chat_template", Val::Str(CHAT_TEMPLATE.into()));

        // Seed of tensor `kind` (its index in the layer's list) of `layer` (None: outside the layers).
        let seed = |layer: Option<usize>, kind: u64| mix(mix(self.seed, layer.map_or(0, |l| l as u64 + 1)), kind);
        let out_amp = amplitude(d, LOGIT_RMS);
        // The chat tokens' rows are shrunk, so that random generation does not stop on them.
        let specials = s.first_special..s.first_special + SPECIALS.len();
        let head_amp = |r: usize| if specials.contains(&r) { 0.25 * out_amp } else { out_amp };
        // Without a tied head, an embedding as large as what the layers add to it: a deep random
        // model's residual stream otherwise converges to one state whatever the token, and it
        // repeats one token (a tied head keeps the small embedding, or it would repeat the last).
        let tied = self.quant.tied(s);
        let embed_amp = amplitude(1, GAIN * (2.0 * s.n_layers as f32).sqrt());
        let embed_amp = |r: usize| if tied { head_amp(r) } else { embed_amp };
        type Amp<'a> = &'a (dyn Fn(usize) -> f32 + Sync);
        let mat = |w: GgufWriter, kind: &str, layer: Option<usize>, (rows, cols): (usize, usize), k: u64, amp: Amp| {
            let dtype = self.quant.dtype_of(kind, layer, s.n_layers, cols);
            let name = layer.map_or(format!("{kind}.weight"), |l| format!("blk.{l}.{kind}.weight"));
            let data = random_matrix(dtype, (rows, cols), seed(layer, k), amp)?;
            Ok::<_, Error>(w.tensor(&name, &[cols as u64, rows as u64], dtype.ggml_id(), data))
        };
        let f32_id = DType::F32.ggml_id();
        w = mat(w, "token_embd", None, (v, d), 0, &embed_amp)?;
        w = w.tensor("output_norm.weight", &[d as u64], f32_id, vector(d, seed(None, 1), 1.0, 0.25));
        if !tied {
            w = mat(w, "output", None, (v, d), 2, &head_amp)?;
        }
        for l in 0..self.layers() {
            let layer = Some(l);
            let vec = |w: GgufWriter, name: String, n: usize, k: u64, (center, amp): (f32, f32)| {
                w.tensor(&name, &[n as u64], f32_id, vector(n, seed(layer, k), center, amp))
            };
            let unit_in = |n_in: usize, gain: f32| move |_: usize| amplitude(n_in, gain);
            w = vec(w, format!("blk.{l}.attn_norm.weight"), d, 0, (1.0, 0.25));
            for (k, kind, rows) in [(1, "attn_q", d), (2, "attn_k", kv), (3, "attn_v", kv)] {
                w = mat(w, kind, layer, (rows, d), k, &unit_in(d, 1.0))?;
                w = vec(w, format!("blk.{l}.{kind}.bias"), rows, k + 10, (0.0, 0.1));
            }
            w = mat(w, "attn_output", layer, (d, d), 4, &unit_in(d, GAIN))?;
            w = vec(w, format!("blk.{l}.ffn_norm.weight"), d, 5, (1.0, 0.25));
            w = mat(w, "ffn_gate", layer, (f, d), 6, &unit_in(d, 1.0))?;
            w = mat(w, "ffn_up", layer, (f, d), 7, &unit_in(d, 1.0))?;
            w = mat(w, "ffn_down", layer, (d, f), 8, &unit_in(f, GAIN))?;
        }
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_gives_the_real_files_types() {
        // Qwen2.5-Coder 1.5B's Q4_K_M file: Q6_K in 14 of its 28 layers.
        let q = Quant::Q4KM;
        let six: Vec<usize> = (0..28).filter(|&l| q.dtype_of("ffn_down", Some(l), 28, 8960) == DType::Q6K).collect();
        assert_eq!(six, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]);
        assert_eq!(q.dtype_of("attn_q", Some(0), 28, 1536), DType::Q4K);
        assert_eq!(q.dtype_of("output", None, 28, 1536), DType::Q6K);
        assert_eq!(q.dtype_of("token_embd", None, 28, 1536), DType::Q4K);
        // Qwen 0.5B's rows of 896 values are not whole 256-value blocks.
        assert_eq!(q.dtype_of("attn_q", Some(3), 24, 896), DType::Q4_1);
        assert_eq!(q.dtype_of("output", None, 24, 896), DType::Q8_0);
        assert_eq!(Quant::All(DType::F16).dtype_of("attn_q", Some(3), 24, 896), DType::F16);
    }

    #[test]
    fn names_parse() {
        assert_eq!("Q4_K_M".parse::<Quant>().unwrap(), Quant::Q4KM);
        assert_eq!("q6_k".parse::<Quant>().unwrap(), Quant::All(DType::Q6K));
        let err = "q5_0".parse::<Quant>().unwrap_err().to_string();
        assert!(err.contains("cannot be written in q5_0") && err.contains("q4_k_m"), "{err}");
        let err = "q9".parse::<Quant>().unwrap_err().to_string();
        assert!(err.contains("unknown weight type 'q9'"), "{err}");
        let err = shape("qwen9").unwrap_err().to_string();
        assert!(err.contains("qwen2.5-1.5b") && err.contains("tiny"), "{err}");
    }

    #[test]
    fn vocabulary_is_unique_with_the_chat_tokens_in_place() {
        let s = shape("tiny").unwrap();
        let (tokens, types, merges) = vocabulary(s);
        assert_eq!((tokens.len(), types.len()), (s.vocab, s.vocab));
        assert_eq!(tokens[s.first_special + 2], "<|im_end|>");
        assert_eq!(types.iter().filter(|&&t| t == TOKEN_CONTROL).count(), 3);
        assert_eq!(merges.len(), s.vocab - 256 - 3);
        let mut sorted = tokens.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), tokens.len(), "tokens repeat");
        // Past the pairs, triples are made of a pair and a symbol.
        let (_, _, merges) = vocabulary(&Shape { vocab: 256 * 256 + 300, first_special: 256 * 256 + 297, ..s.clone() });
        assert_eq!(merges[256 * 256].split(' ').map(|p| p.chars().count()).collect::<Vec<_>>(), [2, 1]);
    }
}
