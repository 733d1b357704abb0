//! A model's weights as stored, by role.

use crate::model::config::ModelConfig;
use crate::storage::Weight;

#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Weight,
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    pub bq: Option<Weight>,
    pub bk: Option<Weight>,
    pub bv: Option<Weight>,
    pub wo: Weight,
    /// Per-head RMSNorm weights of Q and K (`head_dim` values each), in families with Q/K norms.
    pub q_norm: Option<Weight>,
    pub k_norm: Option<Weight>,
    /// RMSNorm of the attention output before the residual add, in families with post-norms.
    pub post_attn_norm: Option<Weight>,
    pub ffn_norm: Weight,
    pub w_gate: Weight,
    pub w_up: Weight,
    pub w_down: Weight,
    /// RMSNorm of the feed-forward output before the residual add, in families with post-norms.
    pub post_ffn_norm: Option<Weight>,
}

#[derive(Clone, Debug)]
pub struct ModelWeights {
    pub config: ModelConfig,
    pub embed: Weight,
    pub layers: Vec<LayerWeights>,
    pub norm: Weight,
    /// The output head; the embedding table itself when the model ties them.
    pub output: Weight,
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
