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
}

impl<B: Backend> Transformer<B> {
    pub fn new(backend: B, w: &ModelWeights) -> Result<Self> {
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
            layers,
            backend,
        })
    }

    pub fn new_cache(&self, capacity: usize) -> Result<B::Cache> {
        self.backend.new_cache(self.config.n_layers, capacity, self.config.kv_dim())
    }

    /// Run `batch` through the model, writing its K/V into `cache`; returns the logits
    /// `[out_rows.len(), vocab]` of the requested batch rows only (the output head is the most
    /// expensive matmul, and a prefill needs just its last row).
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
