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
    pub ffn_norm: Weight,
    pub w_gate: Weight,
    pub w_up: Weight,
    pub w_down: Weight,
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
}
