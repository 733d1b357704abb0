//! The decoder-only transformer forward of every family, written once over [`Backend`]; what
//! differs between families comes from the config's [`crate::model::arch::Family`].

use std::collections::HashMap;

use crate::backend::{Backend, Batch, NO_SLOT};
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::load::Tensor;
use crate::model::weights::ModelWeights;
use crate::storage::Weight;

pub struct Transformer<B: Backend> {
    pub config: ModelConfig,
    pub backend: B,
    weights: ModelWeights<B::Weight>,
    /// The RoPE factors in use, chosen for the context by [`Self::use_context`].
    rope_factors: Option<Vec<f32>>,
}

/// `w` on `backend`, each layer's Q, K and V projections (and their biases), and its gate and up
/// projections, loaded together, so that the backend may run each group as one matmul
/// ([`Backend::load_together`]).
fn load<B: Backend>(backend: &B, w: &ModelWeights) -> Result<ModelWeights<B::Weight>> {
    // By address: the weights loaded together are found again as `try_map` walks the model.
    let mut together: HashMap<*const Weight, B::Weight> = HashMap::new();
    for l in &w.layers {
        let mut groups = vec![vec![&l.wq, &l.wk, &l.wv], vec![&l.w_gate, &l.w_up]];
        if let (Some(bq), Some(bk), Some(bv)) = (&l.bq, &l.bk, &l.bv) {
            groups.push(vec![bq, bk, bv]);
        }
        for group in groups {
            for (host, loaded) in group.iter().zip(backend.load_together(&group)?) {
                together.insert(*host as *const Weight, loaded);
            }
        }
    }
    w.try_map(|x| match together.remove(&(x as *const Weight)) {
        Some(loaded) => Ok(loaded),
        None => backend.load_weight(x),
    })
}

impl<B: Backend> Transformer<B> {
    pub fn new(backend: B, w: &ModelWeights) -> Result<Self> {
        check_head(w)?;
        let weights = load(&backend, w)?;
        Ok(Self::from_loaded(backend, weights))
    }

    /// The model from weights already on `backend` (checked with [`check_head`] before they
    /// were loaded).
    pub fn from_loaded(backend: B, weights: ModelWeights<B::Weight>) -> Self {
        Transformer { config: weights.config.clone(), rope_factors: weights.rope_factors.clone(), backend, weights }
    }

    /// Run with a context of `capacity` positions: a model with long RoPE takes its long factors
    /// when the context exceeds the one its short factors were trained for (the whole generation
    /// rotates alike, so a cache never mixes the two).
    pub fn use_context(&mut self, capacity: usize) {
        self.rope_factors = match &self.weights.long_rope {
            Some(long) if capacity > long.from_context => Some(long.factors.clone()),
            _ => self.weights.rope_factors.clone(),
        };
    }

    pub fn new_cache(&self, capacity: usize) -> Result<B::Cache> {
        self.backend.new_cache(self.config.n_layers, capacity, self.config.kv_dim())
    }

    /// The tokens the output head's rows score, when it scores fewer than the vocabulary.
    pub fn head_tokens(&self) -> Option<&[u32]> {
        self.weights.head_tokens.as_deref()
    }

    /// Run `batch` through the model, writing its K/V into `cache`; returns the logits
    /// `[out_rows.len(), head rows]` of the requested batch rows only (the output head is the most
    /// expensive matmul, and a prefill needs just its last row). The head rows are the vocabulary,
    /// or the [`Self::head_tokens`] of a pruned head.
    pub fn forward(&self, cache: &mut B::Cache, batch: &Batch, out_rows: &[u32]) -> Result<B::Tensor> {
        let c = &self.config;
        let m = batch.len();
        if m == 0 || batch.positions.len() != m || batch.slots.len() != m || batch.mask.prefix.len() != m {
            return Err(Error::InvalidArgument(format!("malformed batch of {m} tokens")));
        }
        if out_rows.iter().any(|&r| r as usize >= m) {
            return Err(Error::InvalidArgument("output row outside the batch".into()));
        }
        let b = &self.backend;
        let eps = c.rms_eps;
        let norm = |x: B::Tensor, w: &Option<B::Weight>| match w {
            Some(w) => b.rms_norm(&x, w, eps),
            None => Ok(x),
        };
        // x += its sublayer's projection of `h`, normed first where the family norms it (Gemma).
        let residual = |x: &mut B::Tensor, h: &B::Tensor, w: &B::Weight, post_norm: &Option<B::Weight>| match post_norm {
            Some(n) => b.add_assign(x, &b.rms_norm(&b.matmul(h, w, None)?, n, eps)?),
            None => b.matmul_add(h, w, x),
        };
        // Every windowed layer has the same window: the batch is checked against it once.
        check_window(batch, (0..c.n_layers).find_map(|i| c.attn_shape(i).window))?;
        let mut x = b.embed(&self.weights.embed, &batch.tokens, c.embed_scale())?;
        for (i, l) in self.weights.layers.iter().enumerate() {
            let shape = c.attn_shape(i);
            let rope = c.rope(i, self.rope_factors.as_deref());
            let h = b.rms_norm(&x, &l.attn_norm, eps)?;
            let [q, k, v] = b.matmuls(&h, [(&l.wq, l.bq.as_ref()), (&l.wk, l.bk.as_ref()), (&l.wv, l.bv.as_ref())])?;
            let (mut q, mut k) = (norm(q, &l.q_norm)?, norm(k, &l.k_norm)?);
            b.rope_pair(&mut q, &mut k, &batch.positions, &rope)?;
            let att = b.attention(&q, &k, &v, cache, i, batch, shape)?;
            residual(&mut x, &att, &l.wo, &l.post_attn_norm)?;
            let h = b.rms_norm(&x, &l.ffn_norm, eps)?;
            let act = b.gated_matmul(&h, &l.w_gate, &l.w_up, c.family().activation)?;
            residual(&mut x, &act, &l.w_down, &l.post_ffn_norm)?;
        }
        let x = if out_rows.len() == m && out_rows.iter().enumerate().all(|(i, &r)| r as usize == i) {
            x
        } else {
            b.select_rows(&x, out_rows)?
        };
        let x = b.rms_norm(&x, &self.weights.norm, c.rms_eps)?;
        b.matmul(&x, &self.weights.output, None)
    }
}

/// Under a sliding window a row keeps its extra (tree) slots, which is exact only while they lie
/// within its window: a tree deeper than the window is refused rather than attended wrongly.
fn check_window(batch: &Batch, window: Option<u32>) -> Result<()> {
    let Some(w) = window else { return Ok(()) };
    let stride = batch.mask.extra_stride;
    for r in 0..batch.len() {
        let has_extras = batch.mask.extra[r * stride..(r + 1) * stride].iter().any(|&s| s != NO_SLOT);
        // The extras' positions lie between the prefix's end and the row's own.
        if has_extras && batch.positions[r] as usize + 1 + batch.base(r) > batch.mask.prefix[r] as usize + w as usize {
            return Err(Error::InvalidArgument(format!(
                "a tree row at position {} reaches past its {w}-position sliding window",
                batch.positions[r]
            )));
        }
    }
    Ok(())
}

/// The output head has a row per token of the vocabulary, or per token of its `head_tokens`.
pub(crate) fn check_head<T: Tensor>(w: &ModelWeights<T>) -> Result<()> {
    let vocab = w.config.vocab_size;
    let rows = w.output.shape().0;
    let ok = match &w.head_tokens {
        None => rows == vocab,
        Some(t) => !t.is_empty() && rows == t.len() && t.iter().all(|&id| (id as usize) < vocab),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_model(format!(
            "the output head has {rows} rows for a vocabulary of {vocab} tokens ({} head tokens)",
            w.head_tokens.as_ref().map_or("no".into(), |t| t.len().to_string())
        )))
    }
}
