//! Plain autoregressive decoding: one target forward per token. The baseline every speculative
//! strategy must reproduce exactly (greedy) or in distribution (sampling).

use web_time::Instant;

use super::{elapsed_ms, Generation, Output, Request, Sink, Stats};
use crate::error::Result;
use crate::model::runner::{append, Lm, Want};
use crate::sampling::{self, Rng};

pub async fn generate_ar(target: &mut dyn Lm, req: &Request, sink: Sink<'_>) -> Result<Generation> {
    let room = req.validate(target, 0)?;
    target.truncate(0);
    let mut rng = Rng::new(req.sampling.seed);
    let mut stats = Stats { mode: "ar".into(), prompt_tokens: req.prompt.len(), ..Stats::default() };
    let t0 = Instant::now();
    let logits = append(target, &req.prompt, Want::LastLogits).await?.logits();
    let mut next = pick(&logits, req, &mut rng);
    stats.prefill_ms = elapsed_ms(t0);

    let t1 = Instant::now();
    let mut out = Output::new(req, room, sink);
    out.push(&[next]);
    while !out.done() {
        next = if req.sampling.is_greedy() {
            append(target, &[next], Want::AllArgmax).await?.argmax()[0]
        } else {
            pick(&append(target, &[next], Want::LastLogits).await?.logits(), req, &mut rng)
        };
        stats.rounds += 1;
        out.push(&[next]);
    }
    let decode_ms = elapsed_ms(t1);
    stats.target_busy_ms = decode_ms;
    stats.finish(out.tokens.len(), decode_ms);
    Ok(out.into_generation(stats))
}

pub(crate) fn pick(logits: &[f32], req: &Request, rng: &mut Rng) -> u32 {
    if req.sampling.is_greedy() {
        sampling::argmax(logits)
    } else {
        sampling::sample(&sampling::probs(logits, &req.sampling), rng)
    }
}
