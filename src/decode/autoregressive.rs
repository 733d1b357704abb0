//! Plain autoregressive decoding: one target forward per token. The baseline every speculative
//! strategy must reproduce exactly (greedy) or in distribution (sampling).

use super::session::prefill;
use super::target_rows::sample_next;
use super::{Generation, Request, Sink};
use crate::error::Result;
use crate::model::runner::{append, Lm, Want};

pub async fn generate_ar(target: &mut dyn Lm, req: &Request, sink: Sink<'_>) -> Result<Generation> {
    let room = req.validate(target, 0)?;
    let mut run = prefill(target, req, "ar").await?.decode(req, room, sink);
    let mut next = run.first;
    while !run.out.done() {
        next = if req.sampling.is_greedy() {
            append(target, &[next], Want::AllArgmax).await?.argmax()[0]
        } else {
            sample_next(target, &[next], &req.sampling, &mut run.rng).await?
        };
        run.stats.rounds += 1;
        run.out.push(&[next]);
    }
    Ok(run.finish(|stats| stats.target_busy_ms = stats.decode_ms))
}
