//! Where tensors live and ops run. The transformer forward (`model::transformer`) is written once
//! over [`Backend`]; the CPU and GPU backends differ only in their kernels.

pub mod cpu;
#[cfg(feature = "gpu")]
pub mod gpu;
mod allowed;
mod bench;
pub mod draw;

pub use allowed::Allowed;
pub use draw::{Draw, Drawn, SparseDist};
pub use bench::{bench_kernels, random_weight, BenchOptions, KernelBench, WeightsIn};

use std::future::Future;

use crate::error::Result;
use crate::storage::Weight;

/// Marks a padding entry in [`Mask::extra`].
pub const NO_SLOT: u32 = u32::MAX;

/// Which KV-cache slots each query row attends to: every slot from `base[r]` below `prefix[r]`,
/// plus up to `extra_stride` explicit slots `extra[r * extra_stride..]` (padded with [`NO_SLOT`]).
/// `base[r]` is the first slot of the row's sequence where several sequences share one cache,
/// each in its own region (`model::shared`), its position `p` at slot `base[r] + p`; empty `base`
/// means every row's sequence starts at slot 0.
/// Causal attention is `prefix[r] = slot[r] + 1` with no extras; an SSD tree branch attends to the
/// committed prefix and the glue tokens up to its k, plus its own earlier tree tokens as extras.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mask {
    pub prefix: Vec<u32>,
    pub extra_stride: usize,
    pub extra: Vec<u32>,
    pub base: Vec<u32>,
}

/// One forward's input: `tokens[r]` at rope position `positions[r]`, writing its K/V to cache slot
/// `slots[r]`, attending as `mask` says. Prefill, decode, verification and SSD tree steps are all
/// one of these. Where `allowed` is given (a grammar's masks), it holds one row per output row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    pub slots: Vec<u32>,
    pub mask: Mask,
    pub allowed: Option<std::sync::Arc<Allowed>>,
}

impl Batch {
    /// `tokens` appended at slots/positions `start..`, each attending causally to all before it.
    pub fn causal(tokens: &[u32], start: usize) -> Batch {
        let idx: Vec<u32> = (start..start + tokens.len()).map(|i| i as u32).collect();
        Batch {
            tokens: tokens.to_vec(),
            mask: Mask { prefix: idx.iter().map(|s| s + 1).collect(), extra_stride: 0, extra: vec![], base: vec![] },
            positions: idx.clone(),
            slots: idx,
            allowed: None,
        }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The slots row `r` attends to, in increasing order of the prefix then the extras. A
    /// sliding `window` drops the prefix slots more than `window - 1` positions behind the row's
    /// (prefix slot `j` holds position `j`); the extras, the row's own tree ancestors, stay.
    pub fn attended(&self, r: usize, window: Option<u32>) -> impl Iterator<Item = usize> + '_ {
        let extra = &self.mask.extra[r * self.mask.extra_stride..(r + 1) * self.mask.extra_stride];
        (self.window_start(r, window)..self.mask.prefix[r] as usize)
            .chain(extra.iter().filter(|&&s| s != NO_SLOT).map(|&s| s as usize))
    }

    /// The first prefix slot row `r` attends to: its sequence's first, or under a sliding
    /// `window` the first within it (at most its prefix).
    pub fn window_start(&self, r: usize, window: Option<u32>) -> usize {
        let start = window.map_or(0, |w| (self.positions[r] as usize + 1).saturating_sub(w as usize));
        (self.base(r) + start).min(self.mask.prefix[r] as usize)
    }

    /// The first slot of row `r`'s sequence (see [`Mask`]).
    pub fn base(&self, r: usize) -> usize {
        self.mask.base.get(r).map_or(0, |&b| b as usize)
    }

    /// The largest slot the batch reads or writes, plus one.
    pub fn slot_extent(&self) -> usize {
        let w = self.slots.iter().map(|&s| s as usize + 1).max().unwrap_or(0);
        let p = self.mask.prefix.iter().map(|&p| p as usize).max().unwrap_or(0);
        let e = self.mask.extra.iter().filter(|&&s| s != NO_SLOT).map(|&s| s as usize + 1).max().unwrap_or(0);
        w.max(p).max(e)
    }
}

/// A gated feed-forward unit's activation: the unit computes `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Activation {
    /// SwiGLU (Llama, Qwen, Phi).
    Silu,
    /// GeGLU with the tanh approximation of GELU (Gemma).
    GeluTanh,
}

impl Activation {
    /// `(a, b)` such that `act(g) = g * sigmoid(g * (a + b * g^2))`, so that one kernel computes
    /// both: SiLU is `g * sigmoid(g)`, and tanh-GELU, `0.5 g (1 + tanh(z))` with
    /// `z = sqrt(2 / pi) (g + 0.044715 g^3)`, equals `g * sigmoid(2 z)`.
    pub fn sigmoid_coefficients(self) -> (f32, f32) {
        match self {
            Activation::Silu => (1.0, 0.0),
            Activation::GeluTanh => {
                let a = 2.0 * (2.0 / std::f64::consts::PI).sqrt();
                (a as f32, (a * 0.044715) as f32)
            }
        }
    }
}

/// How RoPE rotates each `head_dim`-wide head: its first `rotary_dim` values, in rotate-half
/// pairs `(i, i + rotary_dim / 2)`, by the angle `position * freq_scale / factors[i] *
/// theta^(-2i / rotary_dim)`, with cos and sin scaled by `attn_factor`. Plain RoPE rotates the
/// whole head with no factors and both scales 1; Llama 3's frequency scaling and Phi-3's long
/// RoPE give per-frequency `factors`, linear position scaling a `freq_scale` below 1, and partial
/// rotary embeddings (Phi-4-mini) a `rotary_dim` below `head_dim`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope<'a> {
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub theta: f32,
    pub freq_scale: f32,
    pub attn_factor: f32,
    pub factors: Option<&'a [f32]>,
}

impl<'a> Rope<'a> {
    pub fn plain(head_dim: usize, theta: f32) -> Self {
        Rope { head_dim, rotary_dim: head_dim, theta, freq_scale: 1.0, attn_factor: 1.0, factors: None }
    }

    /// Whether the shape is one every backend rotates: an even rotary width within the head and
    /// one factor per rotated pair.
    pub fn valid(&self) -> bool {
        self.rotary_dim > 0
            && self.rotary_dim.is_multiple_of(2)
            && self.rotary_dim <= self.head_dim
            && self.factors.is_none_or(|f| f.len() == self.rotary_dim / 2)
    }
}

/// `[row][i] = (cos, sin)` of row `row`'s angle for pair `i < rotary_dim / 2` (see [`Rope`]),
/// shared by every backend so that all rotate alike. The angle is computed in f64 and rounded
/// once: an angle computed in f32 (its frequency rounded, then the product) is off by a few
/// `position * 2^-24` radians, about 1e-3 at position 30,000.
pub(crate) fn rope_table(positions: &[u32], rope: &Rope) -> Vec<(f32, f32)> {
    let rot = rope.rotary_dim;
    let inv_freq: Vec<f64> = (0..rot / 2)
        .map(|i| {
            let factor = rope.factors.map_or(1.0, |f| f[i] as f64);
            (rope.theta as f64).powf(-2.0 * i as f64 / rot as f64) * rope.freq_scale as f64 / factor
        })
        .collect();
    let scale = rope.attn_factor as f64;
    positions
        .iter()
        .flat_map(|&pos| {
            inv_freq.iter().map(move |f| {
                let (sin, cos) = (pos as f64 * f).sin_cos();
                ((cos * scale) as f32, (sin * scale) as f32)
            })
        })
        .collect()
}

/// The largest entries of each row of a tensor, read back in their place (see [`Backend::top_k`]):
/// what choosing among a distribution's likeliest tokens needs, without reading whole rows.
#[derive(Clone, Debug, PartialEq)]
pub struct TopK {
    pub k: usize,
    /// `[rows * k]`: each row's k largest columns, largest first, the lower column first on ties
    /// (NaN last).
    pub ids: Vec<u32>,
    pub values: Vec<f32>,
    /// Each row's `ln Σ exp(x / temperature)` over its values that are not NaN, for
    /// probabilities `exp(x / temperature - lse)`.
    pub lse: Vec<f32>,
    /// Each row's value at the column asked for; -inf where none was ([`NO_SLOT`]).
    pub at: Vec<f32>,
}

impl TopK {
    /// Move each row's entries that `allowed` (one row per row) refuses behind the others, their
    /// values -inf: what ranks the row's candidates then ranks only allowed tokens first.
    pub fn keep_allowed(&mut self, allowed: &Allowed) {
        for r in 0..self.rows().min(allowed.rows()) {
            let span = r * self.k..(r + 1) * self.k;
            let mut entries: Vec<(u32, f32)> = self.ids[span.clone()].iter().copied().zip(self.values[span.clone()].iter().copied()).collect();
            entries.sort_by_key(|&(t, _)| !allowed.allows(r, t));
            for (i, (t, v)) in entries.into_iter().enumerate() {
                self.ids[span.start + i] = t;
                self.values[span.start + i] = if allowed.allows(r, t) { v } else { f32::NEG_INFINITY };
            }
        }
    }

    pub fn rows(&self) -> usize {
        self.lse.len()
    }

    /// The same without its first `n` rows.
    pub fn skip_rows(mut self, n: usize) -> TopK {
        self.ids.drain(..n * self.k);
        self.values.drain(..n * self.k);
        self.lse.drain(..n);
        self.at.drain(..n);
        self
    }

    /// Row `r`'s (ids, values).
    pub fn row(&self, r: usize) -> (&[u32], &[f32]) {
        (&self.ids[r * self.k..(r + 1) * self.k], &self.values[r * self.k..(r + 1) * self.k])
    }

    /// [`TopK`] of `rows` rows of `cols` values, computed on the host.
    pub fn of(x: &[f32], cols: usize, k: usize, temperature: f32, at: &[u32]) -> TopK {
        let rows: Vec<&[f32]> = x.chunks_exact(cols).collect();
        let k = k.min(cols);
        let ids: Vec<u32> = rows.iter().flat_map(|row| crate::sampling::top_n(row, k, None)).collect();
        let values = ids.iter().enumerate().map(|(i, &id)| rows[i / k.max(1)][id as usize]).collect();
        let lse = rows.iter().map(|row| crate::sampling::log_sum_exp(row, temperature)).collect();
        let at = rows.iter().zip(at).map(|(row, &c)| row.get(c as usize).copied().unwrap_or(f32::NEG_INFINITY)).collect();
        TopK { k, ids, values, lse, at }
    }
}

/// The most entries per row [`Backend::top_k`] finds on every backend.
pub const MAX_TOP_K: usize = 512;

/// [`Backend::top_k`]'s arguments for a tensor of `rows` rows.
pub(crate) fn check_top_k(rows: usize, k: usize, temperature: f32, at: &[u32]) -> Result<()> {
    if k == 0 || k > MAX_TOP_K || at.len() != rows || !(temperature.is_finite() && temperature > 0.0) {
        return Err(crate::Error::InvalidArgument(format!(
            "top_k of {k} at temperature {temperature} with {} columns for {rows} rows",
            at.len()
        )));
    }
    Ok(())
}

/// Shapes the attention op needs.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// What each query-key dot product is multiplied by before the softmax.
    pub scale: f32,
    /// A sliding window: a row attends the prefix slots of the last `window` positions only
    /// (see [`Batch::attended`]).
    pub window: Option<u32>,
}

impl AttnShape {
    /// Full causal attention scaled by `1 / sqrt(head_dim)`.
    pub fn new(n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        AttnShape { n_heads, n_kv_heads, head_dim, scale: 1.0 / (head_dim as f32).sqrt(), window: None }
    }
}

/// The sizes of a KV cache: `layers` layers of `capacity` slots of `kv_dim` values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CacheDims {
    pub layers: usize,
    pub capacity: usize,
    pub kv_dim: usize,
}

/// [`Backend::attention`]'s arguments, checked alike on every backend before it writes the cache:
/// `q`, `k` and `v` as `(rows, cols)`, to attend at `layer` of a cache of `cache`'s sizes.
pub(crate) fn check_attention(qkv: [(usize, usize); 3], cache: CacheDims, layer: usize, batch: &Batch, s: &AttnShape) -> Result<()> {
    let [(q_rows, q_cols), k, v] = qkv;
    let (m, mask, kv_dim) = (batch.len(), &batch.mask, cache.kv_dim);
    let shapes = q_rows == m
        && q_cols == s.n_heads * s.head_dim
        && k == (m, kv_dim)
        && v == (m, kv_dim)
        && s.n_kv_heads > 0
        && s.n_kv_heads * s.head_dim == kv_dim
        && s.n_heads.is_multiple_of(s.n_kv_heads)
        && batch.positions.len() == m
        && batch.slots.len() == m
        && mask.prefix.len() == m
        && mask.extra.len() == m * mask.extra_stride
        && (mask.base.is_empty() || mask.base.len() == m);
    shape_check(shapes, "attention")?;
    if layer >= cache.layers {
        return Err(crate::Error::InvalidArgument(format!("layer {layer} of a {}-layer cache", cache.layers)));
    }
    let extent = batch.slot_extent();
    if extent > cache.capacity {
        return Err(crate::Error::ContextOverflow { prompt: extent, requested: 0, context: cache.capacity });
    }
    Ok(())
}

/// How a GPU backend's KV cache stores K and V; the CPU's holds f32. Attention computes in f32
/// either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename_all = "lowercase"))]
pub enum KvCache {
    /// Rounded to f16, as llama.cpp and WebLLM cache by default: half the memory, so twice the
    /// context in the same GPU memory, and half the bytes a decode's attention reads. The golden
    /// tests hold with it (top-5 logits within 0.02 of the fp32 reference).
    #[default]
    F16,
    /// As computed, in f32.
    F32,
}

/// The names `--kv-cache` and the JS option `kvCache` take.
impl std::str::FromStr for KvCache {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> crate::error::Result<Self> {
        match s {
            "f16" => Ok(KvCache::F16),
            "f32" => Ok(KvCache::F32),
            _ => Err(crate::error::Error::option("kv_cache", format!("'{s}': expected f16 or f32"))),
        }
    }
}

impl KvCache {
    /// Bytes of one cached value.
    pub fn bytes(self) -> usize {
        match self {
            KvCache::F16 => 2,
            KvCache::F32 => 4,
        }
    }

    /// Cached values per slot for `kv_dim` values: whole 16-byte blocks, so that no block holds
    /// two slots' values and the GPU writes and reads the cache a block at a time.
    pub fn stride(self, kv_dim: usize) -> usize {
        kv_dim.next_multiple_of(self.block())
    }

    /// Values per 16-byte block of the cache.
    pub fn block(self) -> usize {
        16 / self.bytes()
    }
}

/// The ops of a decoder-only transformer. Tensors are row-major `[rows, cols]` f32 activations;
/// weights keep their storage type. Ops may be queued (the GPU records them into one command
/// encoder); only [`Backend::read`] and [`Backend::argmax`] wait for results, asynchronously so
/// that a browser never blocks.
#[allow(async_fn_in_trait)]
pub trait Backend {
    type Weight: Clone;
    type Tensor;
    /// The KV cache of all layers.
    type Cache;

    fn name(&self) -> String;
    /// Whether tensors live in host memory, where reading rows back is a copy: a sampler then
    /// reads them rather than ask for their top-k, which costs more to find there.
    fn host_memory(&self) -> bool {
        false
    }
    fn load_weight(&self, w: &Weight) -> Result<Self::Weight>;
    /// [`Backend::load_weight`] of weights that are multiplied by the same input (a layer's Q, K
    /// and V, or their biases; its gate and up projections), so that the backend may store them
    /// together and run them as one [`Backend::matmuls`] or [`Backend::gated_matmul`]: the GPU
    /// does, in one dispatch.
    fn load_together(&self, ws: &[&Weight]) -> Result<Vec<Self::Weight>> {
        ws.iter().map(|w| self.load_weight(w)).collect()
    }
    fn new_cache(&self, n_layers: usize, capacity: usize, kv_dim: usize) -> Result<Self::Cache>;
    /// A `[rows, cols]` tensor holding `data`.
    fn upload(&self, rows: usize, cols: usize, data: &[f32]) -> Result<Self::Tensor>;

    /// Rows `ids` of the embedding table, times `scale`.
    fn embed(&self, table: &Self::Weight, ids: &[u32], scale: f32) -> Result<Self::Tensor>;
    /// RMSNorm of each group of `w.len()` consecutive values of `x`, then times `w`: a whole row
    /// where `w` is as wide as `x`, each head where it is as wide as a head (Q/K norms).
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Weight, eps: f32) -> Result<Self::Tensor>;
    /// `x [m, k] @ w[n, k]^T (+ bias) -> [m, n]`.
    fn matmul(&self, x: &Self::Tensor, w: &Self::Weight, bias: Option<&Self::Weight>) -> Result<Self::Tensor>;
    /// [`Backend::matmul`] of one input by each of several weights (a layer's Q, K and V; its gate
    /// and up projections), equal to separate matmuls. A backend that can run them as one call
    /// does: the CPU spreads the rows of all of them over its threads at once.
    fn matmuls<const N: usize>(
        &self,
        x: &Self::Tensor,
        ws: [(&Self::Weight, Option<&Self::Weight>); N],
    ) -> Result<[Self::Tensor; N]> {
        all_ok(ws.map(|(w, bias)| self.matmul(x, w, bias)))
    }
    /// `into += x @ w^T`: a residual connection's projection, equal to [`Backend::add_assign`] of
    /// [`Backend::matmul`]. The GPU adds in the matmul's own pass.
    fn matmul_add(&self, x: &Self::Tensor, w: &Self::Weight, into: &mut Self::Tensor) -> Result<()> {
        let y = self.matmul(x, w, None)?;
        self.add_assign(into, &y)
    }
    /// `act(x @ gate^T) * (x @ up^T)`: a gated feed-forward unit's input side, equal to
    /// [`Backend::glu`] of the two [`Backend::matmuls`]. The GPU gates in the up projection's pass.
    fn gated_matmul(&self, x: &Self::Tensor, gate: &Self::Weight, up: &Self::Weight, act: Activation) -> Result<Self::Tensor> {
        let [g, u] = self.matmuls(x, [(gate, None), (up, None)])?;
        self.glu(&g, &u, act)
    }
    /// RoPE (see [`Rope`]) of each head of `x [m, heads * head_dim]` at `positions[m]`.
    fn rope(&self, x: &mut Self::Tensor, positions: &[u32], rope: &Rope) -> Result<()>;
    /// [`Backend::rope`] of a layer's queries and keys at the same positions, equal to one call
    /// each. The GPU rotates both in one pass.
    fn rope_pair(&self, q: &mut Self::Tensor, k: &mut Self::Tensor, positions: &[u32], rope: &Rope) -> Result<()> {
        self.rope(q, positions, rope)?;
        self.rope(k, positions, rope)
    }
    /// Write `k`, `v` of the batch into `cache` at layer `layer`, then attend `q` over the slots
    /// the batch's mask (and the shape's window) gives each row. Returns `[m, n_heads * head_dim]`.
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        cache: &mut Self::Cache,
        layer: usize,
        batch: &Batch,
        shape: AttnShape,
    ) -> Result<Self::Tensor>;
    /// `act(gate) * up`.
    fn glu(&self, gate: &Self::Tensor, up: &Self::Tensor, act: Activation) -> Result<Self::Tensor>;
    /// `x += y`.
    fn add_assign(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()>;
    /// The given rows of `x`, in order.
    fn select_rows(&self, x: &Self::Tensor, rows: &[u32]) -> Result<Self::Tensor>;
    /// Set each row's values at the columns `allowed` does not allow to -inf.
    fn mask(&self, x: &mut Self::Tensor, allowed: &Allowed) -> Result<()>;

    /// The tensor's values, row-major.
    fn read(&self, x: &Self::Tensor) -> impl Future<Output = Result<Vec<f32>>>;
    /// The index of the largest value of each row (first on ties).
    fn argmax(&self, x: &Self::Tensor) -> impl Future<Output = Result<Vec<u32>>>;
    /// The `k` (at most the row length) largest values of each row with their columns, each
    /// row's log-sum-exp at `temperature`, and its value at column `at[row]`: only these leave
    /// the backend.
    fn top_k(&self, x: &Self::Tensor, k: usize, temperature: f32, at: &[u32]) -> impl Future<Output = Result<TopK>>;
    /// A token drawn from each row of `x` as `draw` says (see [`draw`]), with the row's
    /// probability at its asked-for column: only these leave the backend.
    fn draw(&self, x: &Self::Tensor, draw: &Draw) -> impl Future<Output = Result<Vec<Drawn>>>;
    /// Resolves once every op issued so far has finished (for timing queued ops).
    fn sync(&self) -> impl Future<Output = Result<()>>;
}

/// An op's arguments whose shapes do not fit (`!ok`) fail alike on every backend.
pub(crate) fn shape_check(ok: bool, what: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(crate::Error::InvalidArgument(format!("tensor shape mismatch in {what}")))
    }
}

/// The values of `N` results, or the first error.
pub(crate) fn all_ok<T, const N: usize>(results: [Result<T>; N]) -> Result<[T; N]> {
    let values = results.into_iter().collect::<Result<Vec<T>>>()?;
    Ok(values.try_into().unwrap_or_else(|_| unreachable!("N results give N values")))
}

#[cfg(test)]
mod tests {
    use super::{check_attention, AttnShape, Batch, CacheDims};
    use crate::Error;

    /// Every backend's attention refuses these alike, before it writes the cache.
    #[test]
    fn attention_arguments_are_checked_for_every_backend() {
        let (shape, cache) = (AttnShape::new(4, 2, 8), CacheDims { layers: 2, capacity: 8, kv_dim: 16 });
        let batch = Batch::causal(&[1, 2, 3], 5);
        let qkv = [(3, 32), (3, 16), (3, 16)];
        let check = |qkv, layer, batch: &Batch, s| check_attention(qkv, cache, layer, batch, &s);
        assert!(check(qkv, 1, &batch, shape).is_ok());
        let invalid = |r: crate::Result<()>, what: &str| assert!(matches!(r, Err(Error::InvalidArgument(_))), "{what}: {r:?}");
        invalid(check(qkv, 2, &batch, shape), "a layer past the cache's");
        invalid(check([(2, 32), (3, 16), (3, 16)], 0, &batch, shape), "fewer queries than the batch's rows");
        invalid(check([(3, 32), (3, 8), (3, 16)], 0, &batch, shape), "keys narrower than the cache");
        invalid(check(qkv, 0, &batch, AttnShape::new(3, 2, 8)), "query heads not shared evenly by the KV heads");
        invalid(check(qkv, 0, &batch, AttnShape::new(4, 0, 8)), "no KV heads");
        for bad in [
            Batch { positions: vec![5, 6], ..batch.clone() },
            Batch { slots: vec![5], ..batch.clone() },
            Batch { mask: super::Mask { prefix: vec![6, 7], ..batch.mask.clone() }, ..batch.clone() },
            Batch { mask: super::Mask { extra_stride: 1, ..batch.mask.clone() }, ..batch.clone() },
        ] {
            invalid(check(qkv, 0, &bad, shape), &format!("a batch of three rows whose parts are not: {bad:?}"));
        }
        let past = Batch::causal(&[1, 2, 3], 6);
        let r = check(qkv, 0, &past, shape);
        assert!(matches!(r, Err(Error::ContextOverflow { prompt: 9, requested: 0, context: 8 })), "{r:?}");
    }
}
