//! Speculative decoding (SD): a drafter proposes up to K tokens, the target checks all of them in
//! one forward, and verification keeps the output exactly the target's (token for token when
//! greedy, in distribution when sampling). Everything but the loop is shared with SSD in
//! `speculation`. The engine's SD is [`Speculative`]: one [`Drafter`] (a draft model here, prompt
//! lookup, or the draft worker SSD also uses) serving generation after generation.
//!
//! One round, after the committed sequence whose newest token is `rec`: the drafter proposes
//! s1..sn -> the target verifies [rec, s1..sn] into the outcome (k, t*) -> the drafter keeps what
//! the target accepted -> s1..sk, t* join the output, and t* is the next round's `rec`.

use futures::future::LocalBoxFuture;

use super::generation::costs::{Choice, Costs};
use super::generation::output::{Generation, Sink};
use super::generation::request::Request;
use super::generation::session::{constrain, prefill, Decoding};
use super::strategy::Mode;
use super::model_drafter::ModelDrafter;
use super::ngram::PromptLookup;
use super::speculation::{check_draft, draft_rng, timed, verify, DraftTiming, Drafter, SpecConfig, Tally};
use super::strategy::{Placement, Run, Strategy};
use crate::error::Result;
use crate::model::runner::Lm;
use crate::sampling::Rng;

/// SD as the engine holds it: its drafter, serving generation after generation.
pub struct Speculative {
    drafter: Box<dyn Drafter>,
}

impl Speculative {
    pub fn new(drafter: Box<dyn Drafter>) -> Self {
        Speculative { drafter }
    }

    /// SD with prompt lookup where it replaces the draft model (whatever the modes asked for:
    /// it costs nothing to hold), else with a draft model here where SD is asked for.
    pub async fn prepare(p: &mut dyn Placement) -> Result<Option<Box<dyn Strategy>>> {
        if let Some(config) = p.lookup() {
            return Ok(Some(Box::new(Speculative::new(Box::new(PromptLookup::new(config, p.vocab())?)))));
        }
        if !p.wants(Mode::Sd) {
            return Ok(None);
        }
        let drafter = p.draft().await?.map(|lm| Box::new(ModelDrafter::new(lm)) as Box<dyn Drafter>);
        Ok(drafter.map(|d| Box::new(Speculative::new(d)) as Box<dyn Strategy>))
    }
}

impl Strategy for Speculative {
    fn mode(&self) -> Mode {
        Mode::Sd
    }

    fn ready(&self) -> bool {
        self.drafter.ready()
    }

    fn preference(&self) -> u8 {
        2
    }

    fn round_ms(&self, costs: &Costs, _: &SpecConfig, k: usize) -> Option<f64> {
        Some(costs.sd_round_ms(k))
    }

    fn time_draft(&mut self, tree_rows: usize) -> Option<LocalBoxFuture<'_, Result<DraftTiming>>> {
        Some(self.drafter.time(tree_rows))
    }

    /// K follows the acceptance the generation shows, round by round.
    fn tune(&self, spec: &mut SpecConfig, choice: &Choice) {
        spec.adapt = choice.costs.adaptive_k(choice.acceptance);
    }

    fn draft_backend(&self) -> Option<String> {
        self.drafter.backend_name()
    }

    fn generate<'a>(&'a mut self, run: Run<'a>) -> LocalBoxFuture<'a, Result<Generation>> {
        Box::pin(generate_sd_with(run.target, self.drafter.as_mut(), run.req, run.spec, run.sink))
    }
}

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
    generate_sd_with(target, &mut ModelDrafter::new(draft), req, spec, sink).await
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
    let first = prefill(target, req, Mode::Sd.name()).await?;
    drafter.start(req, spec).await?;
    let run = first.decode(req, room, sink)?;
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
        let proposing = match &mut self.run.out.grammar {
            Some(g) => self.drafter.propose_under(rec, n, params, &mut self.drng, g),
            None => self.drafter.propose(rec, n, params, &mut self.drng),
        };
        let (mut proposal, draft_span) = timed(proposing).await?;
        let allowed = constrain(&mut self.run, &mut proposal)?;
        let verifying = verify(&mut *self.target, rec, &proposal, params, &mut self.run.rng, self.spec.fault, allowed);
        let (outcome, verify_span) = timed(verifying).await?;
        self.drafter.accept(&proposal, outcome.accepted);
        let committed = self.run.out.push(&outcome.committed(&proposal))?;
        self.tally.round(proposal.tokens.len(), outcome, committed, verify_span, Some(draft_span), None);
        self.draft_ms += draft_span.ms();
        if let Some(adapt) = &self.spec.adapt {
            self.k = self.tally.next_k(adapt);
        }
        Ok(outcome.bonus)
    }
}
