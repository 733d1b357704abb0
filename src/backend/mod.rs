//! Where tensors live and ops run. The transformer forward (`model::transformer`) is written once
//! over [`Backend`]; the CPU and GPU backends differ only in their kernels.

pub mod cpu;
#[cfg(feature = "gpu")]
pub mod gpu;
mod bench;

pub use bench::{bench_kernels, random_weight, BenchOptions, KernelBench, WeightsIn};

use std::future::Future;

use crate::error::Result;
use crate::storage::Weight;

/// Marks a padding entry in [`Mask::extra`].
pub const NO_SLOT: u32 = u32::MAX;

/// Which KV-cache slots each query row attends to: every slot below `prefix[r]`, plus up to
/// `extra_stride` explicit slots `extra[r * extra_stride..]` (padded with [`NO_SLOT`]).
/// Causal attention is `prefix[r] = slot[r] + 1` with no extras; an SSD tree branch attends to the
/// committed prefix and the glue tokens up to its k, plus its own earlier tree tokens as extras.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mask {
    pub prefix: Vec<u32>,
    pub extra_stride: usize,
    pub extra: Vec<u32>,
}

/// One forward's input: `tokens[r]` at rope position `positions[r]`, writing its K/V to cache slot
/// `slots[r]`, attending as `mask` says. Prefill, decode, verification and SSD tree steps are all
/// one of these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    pub slots: Vec<u32>,
    pub mask: Mask,
}

impl Batch {
    /// `tokens` appended at slots/positions `start..`, each attending causally to all before it.
    pub fn causal(tokens: &[u32], start: usize) -> Batch {
        let idx: Vec<u32> = (start..start + tokens.len()).map(|i| i as u32).collect();
        Batch {
            tokens: tokens.to_vec(),
            mask: Mask { prefix: idx.iter().map(|s| s + 1).collect(), extra_stride: 0, extra: vec![] },
            positions: idx.clone(),
            slots: idx,
        }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The slots row `r` attends to, in increasing order of the prefix then the extras.
    pub fn attended(&self, r: usize) -> impl Iterator<Item = usize> + '_ {
        let extra = &self.mask.extra[r * self.mask.extra_stride..(r + 1) * self.mask.extra_stride];
        (0..self.mask.prefix[r] as usize)
            .chain(extra.iter().filter(|&&s| s != NO_SLOT).map(|&s| s as usize))
    }

    /// The largest slot the batch reads or writes, plus one.
    pub fn slot_extent(&self) -> usize {
        let w = self.slots.iter().map(|&s| s as usize + 1).max().unwrap_or(0);
        let p = self.mask.prefix.iter().map(|&p| p as usize).max().unwrap_or(0);
        let e = self.mask.extra.iter().filter(|&&s| s != NO_SLOT).map(|&s| s as usize + 1).max().unwrap_or(0);
        w.max(p).max(e)
    }
}

/// `[row][i] = (cos, sin)` of `positions[row] * theta^(-2i / head_dim)`, `i < head_dim / 2`: the
/// rotation angles of rotate-half RoPE, shared by every backend so that all rotate alike. The
/// angle is computed in f64 and rounded once: an angle computed in f32 (its frequency rounded,
/// then the product) is off by a few `position * 2^-24` radians, about 1e-3 at position 30,000.
pub(crate) fn rope_table(positions: &[u32], head_dim: usize, theta: f32) -> Vec<(f32, f32)> {
    let half = head_dim / 2;
    let inv_freq: Vec<f64> = (0..half).map(|i| (theta as f64).powf(-2.0 * i as f64 / head_dim as f64)).collect();
    positions
        .iter()
        .flat_map(|&pos| {
            inv_freq.iter().map(move |f| {
                let (sin, cos) = (pos as f64 * f).sin_cos();
                (cos as f32, sin as f32)
            })
        })
        .collect()
}

/// Shapes the attention op needs.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// The ops of a decoder-only transformer. Tensors are row-major `[rows, cols]` f32 activations;
/// weights keep their storage type. Ops may be queued (the GPU records them into one command
/// encoder); only [`Backend::read`] and [`Backend::argmax`] wait for results, asynchronously so
/// that a browser never blocks.
#[allow(async_fn_in_trait)]
pub trait Backend {
    type Weight;
    type Tensor;
    /// The KV cache of all layers.
    type Cache;

    fn name(&self) -> String;
    fn load_weight(&self, w: &Weight) -> Result<Self::Weight>;
    fn new_cache(&self, n_layers: usize, capacity: usize, kv_dim: usize) -> Result<Self::Cache>;
    /// A `[rows, cols]` tensor holding `data`.
    fn upload(&self, rows: usize, cols: usize, data: &[f32]) -> Result<Self::Tensor>;

    /// Rows `ids` of the embedding table.
    fn embed(&self, table: &Self::Weight, ids: &[u32]) -> Result<Self::Tensor>;
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Weight, eps: f32) -> Result<Self::Tensor>;
    /// `x [m, k] @ w[n, k]^T (+ bias) -> [m, n]`.
    fn matmul(&self, x: &Self::Tensor, w: &Self::Weight, bias: Option<&Self::Weight>) -> Result<Self::Tensor>;
    /// Rotate-half RoPE of each head of `x [m, heads * head_dim]` at `positions[m]`.
    fn rope(&self, x: &mut Self::Tensor, positions: &[u32], head_dim: usize, theta: f32) -> Result<()>;
    /// Write `k`, `v` of the batch into `cache` at layer `layer`, then attend `q` over the slots
    /// the batch's mask gives each row. Returns `[m, n_heads * head_dim]`.
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
    /// `silu(gate) * up`.
    fn swiglu(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor>;
    /// `x += y`.
    fn add_assign(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()>;
    /// The given rows of `x`, in order.
    fn select_rows(&self, x: &Self::Tensor, rows: &[u32]) -> Result<Self::Tensor>;

    /// The tensor's values, row-major.
    fn read(&self, x: &Self::Tensor) -> impl Future<Output = Result<Vec<f32>>>;
    /// The index of the largest value of each row (first on ties).
    fn argmax(&self, x: &Self::Tensor) -> impl Future<Output = Result<Vec<u32>>>;
    /// Resolves once every op issued so far has finished (for timing queued ops).
    fn sync(&self) -> impl Future<Output = Result<()>>;
}
