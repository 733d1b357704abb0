//! Turning model files into [`ModelFile`]: a GGUF file, or a Hugging Face directory
//! (config.json + safetensors + tokenizer.json).

use std::collections::HashMap;
use std::ops::Range;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::model::config::{Arch, ModelConfig, Windows};
use crate::model::arch::llama3_factors;
use crate::model::gguf::{Gguf, TensorInfo};
use crate::model::split;
use crate::storage::quant::DType;
use crate::model::tokenizer::{chat_template, Tokenizer};
use crate::model::weights::{LayerWeights, LongRope, ModelWeights};
use crate::storage::{Bytes, Storage, Weight};

/// Everything needed to run and talk to a model.
pub struct ModelFile {
    pub weights: ModelWeights,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<String>,
}

/// What assembling a model does to a tensor: to its bytes ([`Weight`]), or to a reference to
/// them that a streamed load resolves once they arrive ([`crate::model::stream`]).
pub(crate) trait Tensor: Clone {
    /// (rows, cols); a vector is 1 row.
    fn shape(&self) -> (usize, usize);
    /// Rows `rows` as a tensor of their own (a fused matrix's parts).
    fn rows_view(&self, rows: Range<usize>) -> Self;
    /// GGUF llama's Q or K rows, interleaved per head, in the order the forward wants (see
    /// [`unpermute_qk`]).
    fn unpermuted(&self, n_heads: usize) -> Self;
}

impl Tensor for Weight {
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }
    fn rows_view(&self, rows: Range<usize>) -> Self {
        Weight::rows_view(self, rows)
    }
    fn unpermuted(&self, n_heads: usize) -> Self {
        unpermute_qk(self, n_heads)
    }
}

/// Tensors by name, in their storage type and shape (rows, cols); a vector is 1 row.
type Tensors<T = Weight> = HashMap<String, T>;

fn take<T>(t: &mut Tensors<T>, name: &str) -> Result<T> {
    t.remove(name).ok_or_else(|| Error::invalid_model(format!("tensor {name} missing")))
}

fn expect_shape<T: Tensor>(w: &T, name: &str, rows: usize, cols: usize) -> Result<()> {
    let (r, c) = w.shape();
    if (r, c) == (rows, cols) {
        Ok(())
    } else {
        Err(Error::invalid_model(format!("tensor {name} is {r}x{c}, expected {rows}x{cols}")))
    }
}

/// GGUF llama files store Q/K rows interleaved per head (pairs adjacent); the forward uses the
/// rotate-half RoPE of HF, whose row order puts each pair's halves `head_dim / 2` apart. `w` must
/// already be checked to hold `n_heads` heads of an even, nonzero head dimension.
pub(crate) fn unpermute_qk(w: &Weight, n_heads: usize) -> Weight {
    let hd = w.rows / n_heads;
    let perm: Vec<usize> = (0..w.rows)
        .map(|i| {
            let (h, r) = (i / hd, i % hd);
            let (s, j) = (r / (hd / 2), r % (hd / 2));
            h * hd + 2 * j + s
        })
        .collect();
    w.permute_rows(&perm)
}

/// Tensors by role, taken by name in one naming scheme and checked against their shape.
struct Named<'a, T> {
    tensors: Tensors<T>,
    names: &'a dyn Fn(&str, Option<usize>) -> String,
}

impl<T: Tensor> Named<'_, T> {
    fn get(&mut self, key: &str, layer: Option<usize>, rows: usize, cols: usize) -> Result<T> {
        let name = (self.names)(key, layer);
        let w = take(&mut self.tensors, &name)?;
        expect_shape(&w, &name, rows, cols)?;
        Ok(w)
    }

    /// A vector the family has (`Some`) or lacks (`None`).
    fn vector_if(&mut self, has: bool, key: &str, layer: Option<usize>, n: usize) -> Result<Option<T>> {
        has.then(|| self.get(key, layer, 1, n)).transpose()
    }

    /// `parts` weights of `rows[i]` rows each, from one fused matrix under `key` or from one
    /// matrix each under `keys`.
    fn split(&mut self, fused: bool, key: &str, keys: &[&str], layer: Option<usize>, rows: &[usize], cols: usize) -> Result<Vec<T>> {
        if !fused {
            return keys.iter().zip(rows).map(|(k, &r)| self.get(k, layer, r, cols)).collect();
        }
        let all = self.get(key, layer, rows.iter().sum(), cols)?;
        let mut at = 0;
        Ok(rows
            .iter()
            .map(|&r| {
                at += r;
                all.rows_view(at - r..at)
            })
            .collect())
    }
}

/// An RMSNorm weight stored as `w - offset` (Gemma's checkpoints), as the forward uses it.
fn add_offset(w: Weight, offset: f32) -> Weight {
    if offset == 0.0 {
        return w;
    }
    let v: Vec<f32> = w.to_f32().iter().map(|x| x + offset).collect();
    Weight::from_f32(w.rows, w.cols, &v)
}

/// Assemble the model from named tensors, given names in one naming scheme; norm weights pass
/// through `fix_norm` (see [`add_offset`]).
fn assemble<T: Tensor>(
    config: ModelConfig,
    tensors: Tensors<T>,
    names: &dyn Fn(&str, Option<usize>) -> String,
    fix_norm: &dyn Fn(T) -> T,
) -> Result<ModelWeights<T>> {
    config.validate()?;
    let c = &config;
    let fam = c.family();
    let (d, q, kv, f, hd) = (c.d_model, c.q_dim(), c.kv_dim(), c.d_ffn, c.head_dim);
    let mut t = Named { tensors, names };
    let norm = |w: Option<T>| w.map(fix_norm);
    let embed = t.get("embed", None, c.vocab_size, d)?;
    let mut layers = Vec::with_capacity(c.n_layers);
    for i in 0..c.n_layers {
        let l = Some(i);
        let [wq, wk, wv] = <[T; 3]>::try_from(t.split(fam.fused, "qkv", &["wq", "wk", "wv"], l, &[q, kv, kv], d)?)
            .unwrap_or_else(|_| unreachable!("three parts"));
        let [w_gate, w_up] = <[T; 2]>::try_from(t.split(fam.fused, "gate_up", &["w_gate", "w_up"], l, &[f, f], d)?)
            .unwrap_or_else(|_| unreachable!("two parts"));
        layers.push(LayerWeights {
            attn_norm: fix_norm(t.get("attn_norm", l, 1, d)?),
            bq: t.vector_if(fam.qkv_bias, "bq", l, q)?,
            bk: t.vector_if(fam.qkv_bias, "bk", l, kv)?,
            bv: t.vector_if(fam.qkv_bias, "bv", l, kv)?,
            q_norm: norm(t.vector_if(fam.qk_norm, "q_norm", l, hd)?),
            k_norm: norm(t.vector_if(fam.qk_norm, "k_norm", l, hd)?),
            wq,
            wk,
            wv,
            wo: t.get("wo", l, d, q)?,
            post_attn_norm: norm(t.vector_if(fam.post_norms, "post_attn_norm", l, d)?),
            ffn_norm: fix_norm(t.get("ffn_norm", l, 1, d)?),
            w_gate,
            w_up,
            w_down: t.get("w_down", l, d, f)?,
            post_ffn_norm: norm(t.vector_if(fam.post_norms, "post_ffn_norm", l, d)?),
        });
    }
    let norm = fix_norm(t.get("norm", None, 1, d)?);
    let output = if c.tied_embeddings { embed.clone() } else { t.get("output", None, c.vocab_size, d)? };
    Ok(ModelWeights { config, embed, layers, norm, output, head_tokens: None, rope_factors: None, long_rope: None })
}

/// RoPE factors read from a file: one per rotated pair, each positive and finite.
fn rope_factors(w: &Weight, config: &ModelConfig, name: &str) -> Result<Vec<f32>> {
    let v = w.to_f32();
    if v.len() != config.rotary_dim / 2 || !v.iter().all(|x| x.is_finite() && *x > 0.0) {
        return Err(Error::invalid_model(format!(
            "{name} must hold {} positive factors (one per rotated pair), has {} values",
            config.rotary_dim / 2,
            v.len()
        )));
    }
    Ok(v)
}

fn gguf_name(key: &str, layer: Option<usize>) -> String {
    let base = match key {
        "embed" => "token_embd",
        "norm" => "output_norm",
        "output" => "output",
        "attn_norm" => "attn_norm",
        "wq" | "bq" => "attn_q",
        "wk" | "bk" => "attn_k",
        "wv" | "bv" => "attn_v",
        "qkv" => "attn_qkv",
        "q_norm" => "attn_q_norm",
        "k_norm" => "attn_k_norm",
        "wo" => "attn_output",
        "post_attn_norm" => "post_attention_norm",
        "ffn_norm" => "ffn_norm",
        "w_gate" => "ffn_gate",
        "w_up" | "gate_up" => "ffn_up",
        "w_down" => "ffn_down",
        "post_ffn_norm" => "post_ffw_norm",
        _ => unreachable!("unknown weight key {key}"),
    };
    let kind = if key.starts_with('b') && key.len() == 2 { "bias" } else { "weight" };
    match layer {
        Some(i) => format!("blk.{i}.{base}.{kind}"),
        None => format!("{base}.{kind}"),
    }
}

/// Hugging Face names; `post_norms` families name their four layer norms after where they sit.
fn hf_name(post_norms: bool) -> impl Fn(&str, Option<usize>) -> String {
    move |key, layer| {
        let base = match key {
            "embed" => return "model.embed_tokens.weight".into(),
            "norm" => return "model.norm.weight".into(),
            "output" => return "lm_head.weight".into(),
            "attn_norm" => "input_layernorm",
            "wq" | "bq" => "self_attn.q_proj",
            "wk" | "bk" => "self_attn.k_proj",
            "wv" | "bv" => "self_attn.v_proj",
            "qkv" => "self_attn.qkv_proj",
            "q_norm" => "self_attn.q_norm",
            "k_norm" => "self_attn.k_norm",
            "wo" => "self_attn.o_proj",
            "post_attn_norm" => "post_attention_layernorm",
            "ffn_norm" if post_norms => "pre_feedforward_layernorm",
            "ffn_norm" => "post_attention_layernorm",
            "w_gate" => "mlp.gate_proj",
            "w_up" => "mlp.up_proj",
            "gate_up" => "mlp.gate_up_proj",
            "w_down" => "mlp.down_proj",
            "post_ffn_norm" => "post_feedforward_layernorm",
            _ => unreachable!("unknown weight key {key}"),
        };
        let kind = if key.starts_with('b') && key.len() == 2 { "bias" } else { "weight" };
        format!("model.layers.{}.{base}.{kind}", layer.unwrap_or(0))
    }
}

/// A GGUF model's parts, its tensors taken as `T`, before the RoPE factors stored among them
/// are read.
pub(crate) struct GgufParts<T> {
    /// The weights, without RoPE factors.
    pub weights: ModelWeights<T>,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<String>,
    /// Llama 3's factors, or long RoPE's short ones.
    pub factors: Option<T>,
    /// Long RoPE's long factors, and the context beyond which they apply.
    pub long: Option<(T, usize)>,
}

/// The model described by the GGUF header `g`, tensor `i` of its index taken as `tensor(i, info)`.
pub(crate) fn gguf_parts<T: Tensor>(
    g: &Gguf,
    tensor: impl Fn(usize, &TensorInfo, (usize, usize)) -> Result<T>,
) -> Result<GgufParts<T>> {
    let arch_name = g
        .get_str("general.architecture")
        .ok_or_else(|| Error::invalid_model("GGUF metadata general.architecture missing"))?;
    let arch = Arch::from_gguf(arch_name)?;
    let key = |k: &str| format!("{arch_name}.{k}");
    let u = |k: &str| {
        let v = g.get_u64(&key(k))?;
        usize::try_from(v).map_err(|_| Error::invalid_model(format!("GGUF metadata {} = {v} is too large", key(k))))
    };
    let f = |k: &str, default: f64| g.get(&key(k)).and_then(|v| v.as_f64()).unwrap_or(default) as f32;
    let tokenizer = Tokenizer::from_gguf(g)?;

    let mut tensors = Tensors::new();
    for (i, ti) in g.tensors.iter().enumerate() {
        let shape = (ti.dims[1..].iter().product(), ti.dims[0]);
        tensors.insert(ti.name.clone(), tensor(i, ti, shape)?);
    }
    let (d_model, n_heads) = (u("embedding_length")?, u("attention.head_count")?);
    let vocab_size = tensors
        .get("token_embd.weight")
        .map(|w| w.shape().0)
        .ok_or_else(|| Error::invalid_model("tensor token_embd.weight missing"))?;
    let head_dim = u("attention.key_length").unwrap_or(d_model / n_heads.max(1));
    let family = arch.family();
    let linear_scaling = g.get_str(&key("rope.scaling.type")) == Some("linear");
    let config = ModelConfig {
        arch,
        n_layers: u("block_count")?,
        d_model,
        n_heads,
        n_kv_heads: u("attention.head_count_kv").unwrap_or(n_heads),
        head_dim,
        d_ffn: u("feed_forward_length")?,
        vocab_size,
        rope_theta: f("rope.freq_base", 10000.0),
        rms_eps: f("attention.layer_norm_rms_epsilon", 1e-6),
        context_length: u("context_length").unwrap_or(2048),
        tied_embeddings: !tensors.contains_key("output.weight"),
        rotary_dim: u("rope.dimension_count").unwrap_or(head_dim),
        rope_freq_scale: if linear_scaling { 1.0 / f("rope.scaling.factor", 1.0) } else { 1.0 },
        rope_attn_factor: f("rope.scaling.attn_factor", 1.0),
        sliding_window: match family.windows {
            Windows::Never => None,
            _ => u("attention.sliding_window").ok(),
        },
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
    };
    check_tokenizer(&tokenizer, &config)?;
    let chat_template = chat_template(g).map(str::to_owned);
    let factors = tensors.remove("rope_freqs.weight").or_else(|| tensors.remove("rope_factors_short.weight"));
    let long = match tensors.remove("rope_factors_long.weight") {
        Some(w) => Some((w, u("rope.scaling.original_context_length")?)),
        None => None,
    };
    let mut weights = assemble(config, tensors, &gguf_name, &|w| w)?;
    if family.gguf_interleaved_qk {
        let (q_heads, kv_heads) = (weights.config.n_heads, weights.config.n_kv_heads);
        for l in &mut weights.layers {
            l.wq = l.wq.unpermuted(q_heads);
            l.wk = l.wk.unpermuted(kv_heads);
        }
    }
    Ok(GgufParts { weights, tokenizer, chat_template, factors, long })
}

impl<T> GgufParts<T> {
    /// The model with its RoPE factors read, each factor tensor's bytes given by `host`.
    pub(crate) fn with_rope(self, host: impl Fn(&T) -> Result<Weight>) -> Result<(ModelWeights<T>, Tokenizer, Option<String>)> {
        let GgufParts { mut weights, tokenizer, chat_template, factors, long } = self;
        let c = &weights.config;
        weights.rope_factors = factors.map(|w| rope_factors(&host(&w)?, c, "RoPE factors")).transpose()?;
        weights.long_rope = long
            .map(|(w, from_context)| {
                Ok::<_, Error>(LongRope { factors: rope_factors(&host(&w)?, c, "rope_factors_long.weight")?, from_context })
            })
            .transpose()?;
        Ok((weights, tokenizer, chat_template))
    }
}

/// Load a GGUF model from its bytes.
pub fn from_gguf(storage: Storage) -> Result<ModelFile> {
    from_gguf_parts(vec![("the model file".into(), storage)])
}

/// Load a GGUF model from its files' bytes, each with its name (for errors): one file, or the
/// parts of a split model in order ([`split`]).
pub fn from_gguf_parts(files: Vec<(String, Storage)>) -> Result<ModelFile> {
    let headers = files
        .iter()
        .map(|(name, s)| Gguf::parse((**s).as_ref()).map(|g| (name.clone(), g)).map_err(|e| split::in_file(name, files.len(), e)))
        .collect::<Result<Vec<_>>>()?;
    let (g, part_of) = split::merge(headers)?;
    let parts = gguf_parts(&g, |i, ti, (rows, cols)| {
        // Inside its file, as the parser checked, so within usize.
        let range = ti.range.start as usize..ti.range.end as usize;
        Weight::new(ti.dtype, rows, cols, Bytes::new(files[part_of[i]].1.clone(), range))
    })?;
    let (weights, tokenizer, chat_template) = parts.with_rope(|w| Ok(w.clone()))?;
    Ok(ModelFile { weights, tokenizer, chat_template })
}

#[derive(Deserialize)]
struct HfConfig {
    model_type: String,
    hidden_size: usize,
    intermediate_size: usize,
    num_attention_heads: usize,
    num_hidden_layers: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    rope_theta: f32,
    max_position_embeddings: Option<usize>,
    #[serde(default)]
    tie_word_embeddings: bool,
    eos_token_id: Option<serde_json::Value>,
    partial_rotary_factor: Option<f32>,
    sliding_window: Option<usize>,
    /// Gemma: attention scores are scaled by its inverse square root.
    query_pre_attn_scalar: Option<f32>,
    rope_scaling: Option<serde_json::Value>,
    original_max_position_embeddings: Option<usize>,
}

/// config.json's `rope_scaling`, of the types this engine applies.
enum RopeScaling {
    None,
    Linear { factor: f32 },
    Llama3 { factor: f64, low: f64, high: f64, original_context: f64 },
    /// Phi-3's long RoPE: the long factors apply beyond `original_context`.
    Long { short: Vec<f32>, long: Vec<f32>, original_context: usize },
}

impl RopeScaling {
    /// The `rope_scaling` object (its type under `rope_type`, or `type` in older files) of a
    /// config whose `original_max_position_embeddings` is `original`.
    fn parse(v: Option<&serde_json::Value>, original: Option<usize>) -> Result<Self> {
        let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(RopeScaling::None) };
        let bad = |what: &str| Error::invalid_model(format!("config.json: rope_scaling: {what}"));
        let kind = v.get("rope_type").or_else(|| v.get("type")).and_then(|t| t.as_str()).unwrap_or("default");
        let num = |k: &str| v.get(k).and_then(|x| x.as_f64()).filter(|x| x.is_finite() && *x > 0.0).ok_or_else(|| bad(&format!("{k} must be a positive number")));
        let floats = |k: &str| -> Result<Vec<f32>> {
            v.get(k)
                .and_then(|x| x.as_array())
                .and_then(|a| a.iter().map(|x| x.as_f64().map(|f| f as f32)).collect())
                .ok_or_else(|| bad(&format!("{k} must be a list of numbers")))
        };
        Ok(match kind {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor: num("factor")? as f32 },
            "llama3" => RopeScaling::Llama3 {
                factor: num("factor")?,
                low: num("low_freq_factor")?,
                high: num("high_freq_factor")?,
                original_context: num("original_max_position_embeddings")?,
            },
            "longrope" | "su" => RopeScaling::Long {
                short: floats("short_factor")?,
                long: floats("long_factor")?,
                original_context: original.ok_or_else(|| bad("long RoPE needs original_max_position_embeddings"))?,
            },
            other => return Err(Error::Unsupported(format!("RoPE scaling type '{other}' (supported: linear, llama3, longrope)"))),
        })
    }
}

fn default_eps() -> f32 {
    1e-6
}
fn default_theta() -> f32 {
    10000.0
}

/// The `eos_token_id` of `file`: one id or a list, each a token of the `vocab`-token tokenizer.
fn eos_ids(v: &serde_json::Value, file: &str, vocab: usize) -> Result<Vec<u32>> {
    let ids = match v {
        serde_json::Value::Array(a) => a.iter().collect(),
        serde_json::Value::Null => vec![],
        one => vec![one],
    };
    ids.into_iter()
        .map(|id| {
            id.as_u64().filter(|&n| n < vocab as u64).map(|n| n as u32).ok_or_else(|| {
                Error::invalid_model(format!("{file}: eos_token_id {id} is not a token of the {vocab}-token vocabulary"))
            })
        })
        .collect()
}

/// Every id the tokenizer produces must have a row in the embedding.
fn check_tokenizer(tokenizer: &Tokenizer, config: &ModelConfig) -> Result<()> {
    let n = tokenizer.vocab_size();
    if n > config.vocab_size {
        return Err(Error::invalid_model(format!(
            "the tokenizer has {n} tokens but the model's vocabulary only {}",
            config.vocab_size
        )));
    }
    Ok(())
}

/// A shard named in model.safetensors.index.json: a file beside it, never a path elsewhere.
fn check_shard_name(name: &str) -> Result<()> {
    let plain = !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', ':', '\0']);
    if plain {
        Ok(())
    } else {
        Err(Error::invalid_model(format!(
            "model.safetensors.index.json: weight_map names {name:?}, which is not a file name in the model directory"
        )))
    }
}

/// The files of a Hugging Face model directory, by name (a filesystem directory natively, or
/// downloaded files in the browser). `None` = the file does not exist.
pub trait FileSource {
    fn read(&self, name: &str) -> Result<Option<Storage>>;
}

fn read_required(src: &dyn FileSource, name: &str) -> Result<Storage> {
    src.read(name)?.ok_or_else(|| Error::invalid_model(format!("{name} missing from the model directory")))
}

fn json<T: for<'de> Deserialize<'de>>(s: &Storage, name: &str) -> Result<T> {
    serde_json::from_slice((**s).as_ref()).map_err(|e| Error::invalid_model(format!("{name}: {e}")))
}

/// Load a Hugging Face model directory: config.json, model.safetensors or the shards listed in
/// model.safetensors.index.json, tokenizer.json, and tokenizer_config.json for the chat template.
pub fn from_hf(src: &dyn FileSource) -> Result<ModelFile> {
    let cfg: HfConfig = json(&read_required(src, "config.json")?, "config.json")?;
    let arch = Arch::from_hf(&cfg.model_type)?;
    // Before any weights are read: a bad config is refused without reading gigabytes.
    let scaling = RopeScaling::parse(cfg.rope_scaling.as_ref(), cfg.original_max_position_embeddings)?;
    let tok_bytes = src
        .read("tokenizer.json")?
        .ok_or_else(|| Error::Tokenizer("tokenizer.json missing from the model directory".into()))?;
    let mut tokenizer = Tokenizer::from_json((*tok_bytes).as_ref())?;
    let mut chat_template = None;
    // Whether prompts start with BOS: tokenizer_config.json's add_bos_token, else whether
    // tokenizer.json's post-processor puts a special token first (Llama 3 says it only there).
    let (mut bos, mut add_bos) = (None, None);
    if let Some(tc) = src.read("tokenizer_config.json")? {
        let tc: serde_json::Value = json(&tc, "tokenizer_config.json")?;
        chat_template = tc.get("chat_template").and_then(|v| v.as_str()).map(str::to_owned);
        let token = tc.get("bos_token").and_then(|b| b.as_str().or_else(|| b.get("content")?.as_str()));
        bos = token.map(str::to_owned);
        add_bos = tc.get("add_bos_token").and_then(|v| v.as_bool());
    }
    if add_bos.is_none() {
        let tj: serde_json::Value = json(&tok_bytes, "tokenizer.json")?;
        let leading = tj.pointer("/post_processor/single/0/SpecialToken/id").and_then(|v| v.as_str()).map(str::to_owned);
        add_bos = Some(leading.is_some());
        bos = bos.or(leading);
    }
    let add_bos = add_bos.unwrap_or(false);
    let bos_id = bos.and_then(|t| tokenizer.token_to_id(&t));
    tokenizer = tokenizer.with_bos(bos_id, add_bos);
    let vocab = tokenizer.vocab_size();
    let mut eos = cfg.eos_token_id.as_ref().map(|v| eos_ids(v, "config.json", vocab)).transpose()?.unwrap_or_default();
    if let Some(gc) = src.read("generation_config.json")? {
        let gc: serde_json::Value = json(&gc, "generation_config.json")?;
        if let Some(v) = gc.get("eos_token_id") {
            eos.extend(eos_ids(v, "generation_config.json", vocab)?);
        }
    }
    eos.sort_unstable();
    eos.dedup();
    if !eos.is_empty() {
        tokenizer = tokenizer.with_eos(eos);
    }

    let shards: Vec<String> = match src.read("model.safetensors.index.json")? {
        Some(idx) => {
            let idx: serde_json::Value = json(&idx, "model.safetensors.index.json")?;
            let map = idx
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::invalid_model("model.safetensors.index.json has no weight_map"))?;
            let mut files: Vec<String> = map.values().filter_map(|v| v.as_str().map(str::to_owned)).collect();
            files.sort();
            files.dedup();
            files.iter().try_for_each(|f| check_shard_name(f))?;
            files
        }
        None => vec!["model.safetensors".into()],
    };
    let mut tensors = Tensors::new();
    for shard in &shards {
        let storage = read_required(src, shard)?;
        let buf: &[u8] = (*storage).as_ref();
        let st = safetensors::SafeTensors::deserialize(buf)
            .map_err(|e| Error::invalid_model(format!("{shard}: {e}")))?;
        for (name, view) in st.tensors() {
            let dtype = match view.dtype() {
                safetensors::Dtype::F32 => DType::F32,
                safetensors::Dtype::F16 => DType::F16,
                safetensors::Dtype::BF16 => DType::BF16,
                other => return Err(Error::Unsupported(format!("tensor {name}: safetensors dtype {other:?}"))),
            };
            let shape = view.shape();
            let cols = *shape.last().unwrap_or(&1);
            let rows = shape[..shape.len().saturating_sub(1)].iter().product();
            let start = view.data().as_ptr() as usize - buf.as_ptr() as usize;
            let bytes = Bytes::new(storage.clone(), start..start + view.data().len());
            tensors.insert(name, Weight::new(dtype, rows, cols, bytes)?);
        }
    }
    let head_dim = cfg.head_dim.unwrap_or(cfg.hidden_size / cfg.num_attention_heads.max(1));
    let family = arch.family();
    let rotary_dim = cfg.partial_rotary_factor.map_or(head_dim, |p| (head_dim as f32 * p) as usize);
    let context_length = cfg.max_position_embeddings.unwrap_or(2048);
    let config = ModelConfig {
        arch,
        n_layers: cfg.num_hidden_layers,
        d_model: cfg.hidden_size,
        n_heads: cfg.num_attention_heads,
        n_kv_heads: cfg.num_key_value_heads.unwrap_or(cfg.num_attention_heads),
        head_dim,
        d_ffn: cfg.intermediate_size,
        vocab_size: cfg.vocab_size,
        rope_theta: cfg.rope_theta,
        rms_eps: cfg.rms_norm_eps,
        context_length,
        tied_embeddings: cfg.tie_word_embeddings || !tensors.contains_key("lm_head.weight"),
        rotary_dim,
        rope_freq_scale: match scaling {
            RopeScaling::Linear { factor } => 1.0 / factor,
            _ => 1.0,
        },
        rope_attn_factor: match scaling {
            // As Phi-3's reference implementation scales its long-RoPE attention.
            RopeScaling::Long { original_context, .. } if context_length > original_context => {
                let scale = context_length as f64 / original_context as f64;
                (1.0 + scale.ln() / (original_context as f64).ln()).sqrt() as f32
            }
            _ => 1.0,
        },
        sliding_window: cfg.sliding_window.filter(|_| family.windows != Windows::Never),
        attn_scale: 1.0 / cfg.query_pre_attn_scalar.unwrap_or(head_dim as f32).sqrt(),
    };
    config.validate()?;
    check_tokenizer(&tokenizer, &config)?;
    let offset = family.hf_norm_offset;
    let mut weights = assemble(config, tensors, &hf_name(family.post_norms), &|w| add_offset(w, offset))?;
    let c = &weights.config;
    match scaling {
        RopeScaling::Llama3 { factor, low, high, original_context } => {
            weights.rope_factors = Some(llama3_factors(c.rotary_dim, c.rope_theta, factor, low, high, original_context));
        }
        RopeScaling::Long { short, long, original_context } => {
            let check = |v: Vec<f32>, name: &str| rope_factors(&Weight::from_f32(1, v.len(), &v), c, name);
            weights.rope_factors = Some(check(short, "rope_scaling.short_factor")?);
            weights.long_rope =
                Some(LongRope { factors: check(long, "rope_scaling.long_factor")?, from_context: original_context });
        }
        RopeScaling::None | RopeScaling::Linear { .. } => {}
    }
    Ok(ModelFile { weights, tokenizer, chat_template })
}

#[cfg(feature = "native")]
mod native {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |source| Error::Io { path: path.display().to_string(), source }
    }

    /// Memory-map a file: weights stay in the page cache, in their stored size.
    pub fn map_file(path: &Path) -> Result<Storage> {
        let file = std::fs::File::open(path).map_err(io(path))?;
        // SAFETY: model files are not modified while mapped; a concurrent writer would be a
        // misuse outside this process's control, as with any mmap-based loader.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io(path))?;
        Ok(Arc::new(map))
    }

    struct Dir(PathBuf);

    impl FileSource for Dir {
        fn read(&self, name: &str) -> Result<Option<Storage>> {
            let p = self.0.join(name);
            if p.is_file() {
                map_file(&p).map(Some)
            } else {
                Ok(None)
            }
        }
    }

    /// Open a `.gguf` file (a split model by its first part) or a Hugging Face model directory.
    pub fn open(path: &Path) -> Result<ModelFile> {
        let parts = path.to_str().map(split::part_names).transpose()?.flatten();
        if path.is_dir() {
            from_hf(&Dir(path.to_path_buf()))
        } else if let Some(parts) = parts.filter(|_| path.exists()) {
            let files = parts
                .into_iter()
                .map(|p| {
                    let storage = match Path::new(&p).exists() {
                        true => map_file(Path::new(&p))?,
                        false => return Err(Error::invalid_model(format!("{p}: this part of the split model is missing"))),
                    };
                    Ok((p, storage))
                })
                .collect::<Result<_>>()?;
            from_gguf_parts(files)
        } else if path.exists() {
            from_gguf(map_file(path)?)
        } else {
            Err(Error::Io {
                path: path.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
            })
        }
    }
}

#[cfg(feature = "native")]
pub use native::{map_file, open};
