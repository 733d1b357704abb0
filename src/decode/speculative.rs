//! Speculative decoding (SD): a drafter proposes up to K tokens, the target checks all of them in
//! one forward, and verification keeps the output exactly the target's (token for token when
//! greedy, in distribution when sampling). Everything but the loop is shared with SSD in `spec`.
//!
//! One round, after the committed sequence whose newest token is `rec`: the drafter proposes
//! s1..sn -> the target verifies [rec, s1..sn] into the outcome (k, t*) -> the drafter keeps what
//! the target accepted -> s1..sk, t* join the output, and t* is the next round's `rec`.

use super::model_drafter::ModelDrafter;
use super::session::{prefill, Decoding};
use super::spec::{check_draft, draft_rng, timed, verify, Drafter, SpecConfig, Tally};
use super::{Generation, Request, Sink};
use crate::error::Result;
use crate::model::runner::Lm;
use crate::sampling::Rng;

/// Speculative decoding of `req` on `target` with proposals from `draft` (same vocabulary).
/// Uses `spec.k`; the fan-out, Saguaro factor and backup concern SSD only.
pub async fn generate_sd(
    target: &mut dyn Lm,
    draft: &mut dyn Lm,
    req: &Request,
    spec: &SpecConfig,
    sink: Sink<'_>,
) -> Result<Generation> {
    check_draft(target.config(), draft.config())?;
    req.validate(draft, 0)?;
    generate_sd_with(target, &mut ModelDrafter::new(draft, spec), req, spec, sink).await
}

/// Speculative decoding of `req` on `target` with proposals of up to `spec.k` tokens from
/// `drafter`.
pub async fn generate_sd_with(
    target: &mut dyn Lm,
    drafter: &mut dyn Drafter,
    req: &Request,
    spec: &SpecConfig,
    sink: Sink<'_>,
) -> Result<Generation> {
    spec.validate()?;
    let target_room = req.validate(target, 0)?;
    let room = req.speculative_room(target_room, drafter.room(req))?;
    let first = prefill(target, req, "sd").await?;
    drafter.start(&req.prompt).await?;
    let run = first.decode(req, room, sink);
    let mut sd = Sd {
        target,
        drafter,
        req,
        spec,
        drng: draft_rng(req.sampling.seed),
        tally: Tally::new(run.started),
        run,
        draft_ms: 0.0,
        k: spec.k,
    };
    let mut rec = sd.run.first;
    while !sd.run.out.done() {
        rec = sd.round(rec).await?;
    }
    let (tally, draft_ms) = (sd.tally, sd.drafter.busy_ms().unwrap_or(sd.draft_ms));
    Ok(sd.run.finish(|stats| {
        tally.write(stats);
        stats.draft_busy_ms = Some(draft_ms);
    }))
}

/// An SD generation after its prefill.
struct Sd<'a> {
    target: &'a mut dyn Lm,
    drafter: &'a mut dyn Drafter,
    req: &'a Request,
    spec: &'a SpecConfig,
    run: Decoding<'a>,
    /// The drafter's random stream.
    drng: Rng,
    tally: Tally,
    draft_ms: f64,
    /// The next round's K: `spec.k`, or as `spec.adapt` chooses it.
    k: usize,
}

impl Sd<'_> {
    /// One round after `rec`; returns the next round's `rec`.
    async fn round(&mut self, rec: u32) -> Result<u32> {
        // The bonus token always follows the proposal, so it may take one token less than remains.
        let n = self.k.min(self.run.out.remaining() - 1);
        let params = &self.req.sampling;
        let (proposal, draft_span) = timed(self.drafter.propose(rec, n, params, &mut self.drng)).await?;
        let verifying = verify(&mut *self.target, rec, &proposal, params, &mut self.run.rng, self.spec.fault);
        let (outcome, verify_span) = timed(verifying).await?;
        self.drafter.accept(&proposal, outcome.accepted);
        let committed = self.run.out.push(&outcome.committed(&proposal));
        self.tally.round(proposal.tokens.len(), outcome, committed, verify_span, Some(draft_span), None);
        self.draft_ms += draft_span.ms();
        if let Some(adapt) = &self.spec.adapt {
            self.k = self.tally.next_k(adapt);
        }
        Ok(outcome.bonus)
    }
}
