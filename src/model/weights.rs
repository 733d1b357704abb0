//! A model's weights by role: as stored ([`Weight`], the default), as a backend holds them, or
//! as references to tensors of a file still arriving (see [`crate::model::stream`]).

use crate::error::Result;
use crate::model::config::ModelConfig;
use crate::storage::Weight;

#[derive(Clone, Debug)]
pub struct LayerWeights<W = Weight> {
    pub attn_norm: W,
    pub wq: W,
    pub wk: W,
    pub wv: W,
    pub bq: Option<W>,
    pub bk: Option<W>,
    pub bv: Option<W>,
    pub wo: W,
    /// Per-head RMSNorm weights of Q and K (`head_dim` values each), in families with Q/K norms.
    pub q_norm: Option<W>,
    pub k_norm: Option<W>,
    /// RMSNorm of the attention output before the residual add, in families with post-norms.
    pub post_attn_norm: Option<W>,
    pub ffn_norm: W,
    pub w_gate: W,
    pub w_up: W,
    pub w_down: W,
    /// RMSNorm of the feed-forward output before the residual add, in families with post-norms.
    pub post_ffn_norm: Option<W>,
}

#[derive(Clone, Debug)]
pub struct ModelWeights<W = Weight> {
    pub config: ModelConfig,
    pub embed: W,
    pub layers: Vec<LayerWeights<W>>,
    pub norm: W,
    /// The output head; the embedding table itself when the model ties them.
    pub output: W,
    /// The tokens whose logits the output head's rows compute, when it has fewer rows than the
    /// vocabulary (a pruned draft head): every other token's logit is -inf. `None`: row i is
    /// token i.
    pub head_tokens: Option<Vec<u32>>,
    /// RoPE's per-frequency divisors (Llama 3's scaling, Phi-3's long RoPE), one per rotated
    /// pair; `None`: all 1.
    pub rope_factors: Option<Vec<f32>>,
    /// Long RoPE (Phi-3): the factors that replace [`Self::rope_factors`] when the model runs
    /// with a context longer than `from_context` positions.
    pub long_rope: Option<LongRope>,
}

#[derive(Clone, Debug)]
pub struct LongRope {
    pub factors: Vec<f32>,
    pub from_context: usize,
}

impl<W> LayerWeights<W> {
    fn try_map<V>(&self, f: &mut impl FnMut(&W) -> Result<V>) -> Result<LayerWeights<V>> {
        let mut opt = |w: &Option<W>| w.as_ref().map(&mut *f).transpose();
        Ok(LayerWeights {
            bq: opt(&self.bq)?,
            bk: opt(&self.bk)?,
            bv: opt(&self.bv)?,
            q_norm: opt(&self.q_norm)?,
            k_norm: opt(&self.k_norm)?,
            post_attn_norm: opt(&self.post_attn_norm)?,
            post_ffn_norm: opt(&self.post_ffn_norm)?,
            attn_norm: f(&self.attn_norm)?,
            wq: f(&self.wq)?,
            wk: f(&self.wk)?,
            wv: f(&self.wv)?,
            wo: f(&self.wo)?,
            ffn_norm: f(&self.ffn_norm)?,
            w_gate: f(&self.w_gate)?,
            w_up: f(&self.w_up)?,
            w_down: f(&self.w_down)?,
        })
    }
}

impl<W> ModelWeights<W> {
    /// The same model with every weight passed through `f` (onto a backend, say).
    pub fn try_map<V>(&self, mut f: impl FnMut(&W) -> Result<V>) -> Result<ModelWeights<V>> {
        Ok(ModelWeights {
            config: self.config.clone(),
            embed: f(&self.embed)?,
            layers: self.layers.iter().map(|l| l.try_map(&mut f)).collect::<Result<_>>()?,
            norm: f(&self.norm)?,
            output: f(&self.output)?,
            head_tokens: self.head_tokens.clone(),
            rope_factors: self.rope_factors.clone(),
            long_rope: self.long_rope.clone(),
        })
    }
}
