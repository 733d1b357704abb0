//! What of the target's output rows leaves its backend when it samples:
//! - over the whole vocabulary at a temperature (no top-k, no nucleus), the token the backend
//!   drew and a probability ([`Lm::draw`]: 8 bytes a row);
//! - where the sampling keeps a top-k of no more than [`MAX_TOP_K`], each row's top-k (their ids
//!   and logits: 8 bytes a kept token), from which `probs_among` gives the distribution
//!   [`sampling::probs`] gives over the row;
//! - else (a nucleus without a top-k, or a top-k past [`MAX_TOP_K`]) the whole row.

use crate::backend::{Batch, TopK, MAX_TOP_K, NO_SLOT};
use crate::error::Result;
use crate::model::runner::{append, Lm, Output, Want};
use crate::sampling::{self, Rng, SamplingParams};

pub(crate) enum Rows {
    Top(TopK),
    Logits(Vec<f32>),
}

/// The top-k the sampling keeps, where the backend can find it.
fn kept(params: &SamplingParams) -> Option<usize> {
    (1..=MAX_TOP_K).contains(&params.top_k).then_some(params.top_k)
}

/// Whether the backend draws what sampling with `params` draws: from the softmax of the whole row
/// at a temperature ([`Lm::draw`]).
pub(crate) fn drawn_on_backend(params: &SamplingParams) -> bool {
    params.top_k == 0 && params.top_p >= 1.0 && params.temperature > 0.0 && (1.0 / params.temperature).is_finite()
}

/// Append `tokens` to `lm` and sample the token that follows them.
pub(crate) async fn sample_next(lm: &mut dyn Lm, tokens: &[u32], params: &SamplingParams, rng: &mut Rng) -> Result<u32> {
    if drawn_on_backend(params) {
        let want = Want::LastDraw { temperature: params.temperature, seed: rng.next_u64() };
        return Ok(append(lm, tokens, want).await?.drawn().token);
    }
    let want = match kept(params) {
        Some(k) => Want::LastTopK { k, temperature: params.temperature },
        None => Want::LastLogits,
    };
    let rows = match append(lm, tokens, want).await? {
        Output::TopK(top) => Rows::Top(top),
        out => Rows::Logits(out.logits()),
    };
    Ok(sampling::sample(&rows.probs(0, lm.config().vocab_size, params), rng))
}

impl Rows {
    /// Run `batch` on `lm` and read its `rows` back.
    pub async fn of(lm: &mut dyn Lm, batch: &Batch, rows: &[u32], params: &SamplingParams) -> Result<Rows> {
        Ok(match kept(params) {
            Some(k) => Rows::Top(lm.top_k(batch, rows, k, params.temperature, &vec![NO_SLOT; rows.len()]).await?),
            None => Rows::Logits(lm.logits(batch, rows).await?),
        })
    }

    /// The distribution sampling with `params` draws from at row `i`, over `vocab` tokens.
    pub fn probs(&self, i: usize, vocab: usize, params: &SamplingParams) -> Vec<f32> {
        match self {
            Rows::Top(top) => {
                let (ids, values) = top.row(i);
                sampling::probs_among(ids, values, vocab, params)
            }
            Rows::Logits(logits) => sampling::probs(&logits[i * vocab..(i + 1) * vocab], params),
        }
    }
}
