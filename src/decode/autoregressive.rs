//! Plain autoregressive decoding: one target forward per token. The baseline every speculative
//! strategy must reproduce exactly (greedy) or in distribution (sampling).

use super::session::prefill;
use super::target_rows::Rows;
use super::{Generation, Request, Sink};
use crate::error::Result;
use crate::model::runner::{append, Lm, Want};
use crate::sampling;

pub async fn generate_ar(target: &mut dyn Lm, req: &Request, sink: Sink<'_>) -> Result<Generation> {
    let room = req.validate(target, 0)?;
    let mut run = prefill(target, req, "ar").await?.decode(req, room, sink);
    let mut next = run.first;
    while !run.out.done() {
        next = if req.sampling.is_greedy() {
            append(target, &[next], Want::AllArgmax).await?.argmax()[0]
        } else {
            let rows = Rows::from_output(append(target, &[next], Rows::want_last(&req.sampling)).await?);
            sampling::sample(&rows.probs(0, target.config().vocab_size, &req.sampling), &mut run.rng)
        };
        run.stats.rounds += 1;
        run.out.push(&[next]);
    }
    Ok(run.finish(|stats| stats.target_busy_ms = stats.decode_ms))
}
