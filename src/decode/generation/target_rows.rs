//! What of the target's output rows leaves its backend when it samples:
//! - over the whole vocabulary at a temperature (no top-k, no nucleus), the token the backend
//!   drew and a probability ([`Lm::draw`]: 8 bytes a row);
//! - where the sampling keeps a top-k of no more than [`MAX_TOP_K`], each row's top-k (their ids
//!   and logits: 8 bytes a kept token), from which `probs_among` gives the distribution
//!   [`sampling::probs`] gives over the row;
//! - for a nucleus without a top-k, each row's [`MAX_TOP_K`] largest logits and its log-sum-exp,
//!   from which [`sampling::nucleus_among`] gives the nucleus, unless a row is so flat that its
//!   nucleus reaches past them: then the rows are read whole, from the same forward;
//! - else (a top-k past [`MAX_TOP_K`]) the whole row.
//!
//! A backend in host memory ([`crate::backend::Backend::host_memory`], the CPU's) hands its rows
//! over whole in place of a top-k: there the row costs less than finding its top-k.

use std::sync::Arc;

use crate::backend::{Allowed, Batch, TopK, MAX_TOP_K};
use crate::error::Result;
use crate::model::runner::{append_masked, Lm, Output, Want};
use crate::sampling::{self, Rng, SamplingParams};

pub(crate) enum Rows {
    Top(TopK),
    Logits(Vec<f32>),
}

/// How many of each row's largest logits the backend finds for sampling with `params`, where
/// they can serve.
fn kept(params: &SamplingParams) -> Option<usize> {
    if (1..=MAX_TOP_K).contains(&params.top_k) {
        Some(params.top_k)
    } else {
        nucleus_only(params).then_some(MAX_TOP_K)
    }
}

/// A nucleus without a top-k, sampled at a temperature.
fn nucleus_only(params: &SamplingParams) -> bool {
    params.top_k == 0 && params.top_p < 1.0 && sampled(params)
}

/// A temperature the backends sample at (neither greedy nor greedy in the limit).
fn sampled(params: &SamplingParams) -> bool {
    params.temperature > 0.0 && (1.0 / params.temperature).is_finite()
}

/// Whether the backend draws what sampling with `params` draws: from the softmax of the whole row
/// at a temperature ([`Lm::draw`]).
pub(crate) fn drawn_on_backend(params: &SamplingParams) -> bool {
    params.top_k == 0 && params.top_p >= 1.0 && sampled(params)
}

/// Whether `top` tells the distribution sampling with `params` draws from at every row.
fn tells(top: &TopK, vocab: usize, params: &SamplingParams) -> bool {
    !nucleus_only(params)
        || (0..top.rows()).all(|r| {
            let (ids, values) = top.row(r);
            sampling::nucleus_told(ids, values, top.lse[r], vocab, params)
        })
}

/// Append `tokens` to `lm` and pick the token that follows them (its argmax when greedy), among
/// the tokens `allowed` allows where a grammar constrains the pick.
pub(crate) async fn pick_next(
    lm: &mut dyn Lm,
    tokens: &[u32],
    params: &SamplingParams,
    rng: &mut Rng,
    allowed: Option<Arc<Allowed>>,
) -> Result<u32> {
    if params.is_greedy() {
        let want = Want::LastTopK { k: 1, temperature: 1.0 };
        return Ok(append_masked(lm, tokens, want, allowed).await?.top_k().ids[0]);
    }
    if drawn_on_backend(params) {
        let want = Want::LastDraw { temperature: params.temperature, seed: rng.next_u64() };
        return Ok(append_masked(lm, tokens, want, allowed).await?.drawn().token);
    }
    let vocab = lm.config().vocab_size;
    let enough = |top: &TopK| tells(top, vocab, params);
    let want = match kept(params) {
        Some(k) => Want::LastTopKOrLogits { k, temperature: params.temperature, enough: &enough },
        None => Want::LastLogits,
    };
    let rows = Rows::from(append_masked(lm, tokens, want, allowed).await?);
    Ok(sampling::sample(&rows.probs(0, vocab, params), rng))
}

impl From<Output> for Rows {
    fn from(out: Output) -> Rows {
        match out {
            Output::TopK(top) => Rows::Top(top),
            out => Rows::Logits(out.logits()),
        }
    }
}

impl Rows {
    /// Run `batch` on `lm` and read its `rows` back.
    pub async fn of(lm: &mut dyn Lm, batch: &Batch, rows: &[u32], params: &SamplingParams) -> Result<Rows> {
        let vocab = lm.config().vocab_size;
        Ok(match kept(params) {
            Some(k) => {
                let enough = |top: &TopK| tells(top, vocab, params);
                Rows::from(lm.top_k_or_logits(batch, rows, k, params.temperature, &enough).await?)
            }
            None => Rows::Logits(lm.logits(batch, rows).await?),
        })
    }

    /// The distribution sampling with `params` draws from at row `i`, over `vocab` tokens.
    pub fn probs(&self, i: usize, vocab: usize, params: &SamplingParams) -> Vec<f32> {
        match self {
            Rows::Top(top) => {
                let (ids, values) = top.row(i);
                match nucleus_only(params) {
                    true => sampling::nucleus_among(ids, values, top.lse[i], vocab, params)
                        .expect("rows whose top-k cannot tell their nucleus are read whole"),
                    false => sampling::probs_among(ids, values, vocab, params),
                }
            }
            Rows::Logits(logits) => sampling::probs(&logits[i * vocab..(i + 1) * vocab], params),
        }
    }
}
