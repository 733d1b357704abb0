//! The decoder-only transformer forward (llama / qwen2), written once over [`Backend`].

use crate::backend::{AttnShape, Backend, Batch};
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::weights::ModelWeights;

struct Layer<W> {
    attn_norm: W,
    wq: W,
    wk: W,
    wv: W,
    bq: Option<W>,
    bk: Option<W>,
    bv: Option<W>,
    wo: W,
    ffn_norm: W,
    w_gate: W,
    w_up: W,
    w_down: W,
}

pub struct Transformer<B: Backend> {
    pub config: ModelConfig,
    pub backend: B,
    embed: B::Weight,
    layers: Vec<Layer<B::Weight>>,
    norm: B::Weight,
    output: B::Weight,
    head_tokens: Option<Vec<u32>>,
}

impl<B: Backend> Transformer<B> {
    pub fn new(backend: B, w: &ModelWeights) -> Result<Self> {
        check_head(w)?;
        let load = |x| backend.load_weight(x);
        let opt = |x: &Option<_>| x.as_ref().map(|x| backend.load_weight(x)).transpose();
        let layers = w
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    attn_norm: load(&l.attn_norm)?,
                    wq: load(&l.wq)?,
                    wk: load(&l.wk)?,
                    wv: load(&l.wv)?,
                    bq: opt(&l.bq)?,
                    bk: opt(&l.bk)?,
                    bv: opt(&l.bv)?,
                    wo: load(&l.wo)?,
                    ffn_norm: load(&l.ffn_norm)?,
                    w_gate: load(&l.w_gate)?,
                    w_up: load(&l.w_up)?,
                    w_down: load(&l.w_down)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Transformer {
            config: w.config.clone(),
            embed: load(&w.embed)?,
            norm: load(&w.norm)?,
            output: load(&w.output)?,
            head_tokens: w.head_tokens.clone(),
            layers,
            backend,
        })
    }

    pub fn new_cache(&self, capacity: usize) -> Result<B::Cache> {
        self.backend.new_cache(self.config.n_layers, capacity, self.config.kv_dim())
    }

    /// The tokens the output head's rows score, when it scores fewer than the vocabulary.
    pub fn head_tokens(&self) -> Option<&[u32]> {
        self.head_tokens.as_deref()
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
        let shape = AttnShape { n_heads: c.n_heads, n_kv_heads: c.n_kv_heads, head_dim: c.head_dim };
        let mut x = b.embed(&self.embed, &batch.tokens)?;
        for (i, l) in self.layers.iter().enumerate() {
            let h = b.rms_norm(&x, &l.attn_norm, c.rms_eps)?;
            let mut q = b.matmul(&h, &l.wq, l.bq.as_ref())?;
            let mut k = b.matmul(&h, &l.wk, l.bk.as_ref())?;
            let v = b.matmul(&h, &l.wv, l.bv.as_ref())?;
            b.rope(&mut q, &batch.positions, c.head_dim, c.rope_theta)?;
            b.rope(&mut k, &batch.positions, c.head_dim, c.rope_theta)?;
            let att = b.attention(&q, &k, &v, cache, i, batch, shape)?;
            b.add_assign(&mut x, &b.matmul(&att, &l.wo, None)?)?;
            let h = b.rms_norm(&x, &l.ffn_norm, c.rms_eps)?;
            let act = b.swiglu(&b.matmul(&h, &l.w_gate, None)?, &b.matmul(&h, &l.w_up, None)?)?;
            b.add_assign(&mut x, &b.matmul(&act, &l.w_down, None)?)?;
        }
        let x = if out_rows.len() == m && out_rows.iter().enumerate().all(|(i, &r)| r as usize == i) {
            x
        } else {
            b.select_rows(&x, out_rows)?
        };
        let x = b.rms_norm(&x, &self.norm, c.rms_eps)?;
        b.matmul(&x, &self.output, None)
    }
}

/// The output head has a row per token of the vocabulary, or per token of its `head_tokens`.
fn check_head(w: &ModelWeights) -> Result<()> {
    let vocab = w.config.vocab_size;
    let ok = match &w.head_tokens {
        None => w.output.rows == vocab,
        Some(t) => !t.is_empty() && w.output.rows == t.len() && t.iter().all(|&id| (id as usize) < vocab),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_model(format!(
            "the output head has {} rows for a vocabulary of {vocab} tokens ({} head tokens)",
            w.output.rows,
            w.head_tokens.as_ref().map_or("no".into(), |t| t.len().to_string())
        )))
    }
}
