//! What of the target's output rows leaves its backend when it samples: each row's `top_k`
//! likeliest tokens where the sampling keeps no more than [`MAX_TOP_K`] (their ids and logits: on
//! a GPU 8 bytes a kept token, instead of 4 bytes for every token of the vocabulary), else the
//! whole row. Either way a row gives [`sampling::probs`]'s distribution: `probs_among` a row's
//! top-k is `probs` over the row when the sampling itself keeps only that top-k.

use crate::backend::{Batch, TopK, MAX_TOP_K, NO_SLOT};
use crate::error::Result;
use crate::model::runner::{Lm, Output, Want};
use crate::sampling::{self, SamplingParams};

pub(crate) enum Rows {
    Top(TopK),
    Logits(Vec<f32>),
}

/// The top-k the sampling keeps, where the backend can find it.
fn kept(params: &SamplingParams) -> Option<usize> {
    (1..=MAX_TOP_K).contains(&params.top_k).then_some(params.top_k)
}

impl Rows {
    /// What [`append`](crate::model::runner::append) reads back for its last row.
    pub fn want_last(params: &SamplingParams) -> Want {
        match kept(params) {
            Some(k) => Want::LastTopK { k, temperature: params.temperature },
            None => Want::LastLogits,
        }
    }

    /// The rows read back as [`Rows::want_last`] asked.
    pub fn from_output(out: Output) -> Rows {
        match out {
            Output::TopK(top) => Rows::Top(top),
            out => Rows::Logits(out.logits()),
        }
    }

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
