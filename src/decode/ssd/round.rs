//! SSD's round on the target's side (see the module doc of `ssd`): propose, speculate while
//! verifying, commit, wait for the speculation.

use super::draft::{out_of_step, DraftWorker, Job, Reply};
use crate::backend::Allowed;
use crate::decode::generation::output::{Generation, Sink};
use crate::decode::generation::request::Request;
use crate::decode::generation::session::{constrain, prefill, Decoding};
use crate::decode::generation::stats::Stats;
use crate::decode::strategy::Mode;
use crate::decode::speculation::{check_draft, timed, verify, Outcome, Proposal, SpecConfig, Tally};
use crate::error::Result;
use crate::model::runner::Lm;
use crate::runtime::Span;

/// SSD of `req`: the target verifies on the caller's thread while `draft` speculates on its
/// worker. The worker stays usable for later generations, whatever this one ends with.
pub async fn generate_ssd(
    target: &mut dyn Lm,
    draft: &mut DraftWorker,
    req: &Request,
    spec: &SpecConfig,
    sink: Sink<'_>,
) -> Result<Generation> {
    check_draft(target.config(), draft.config())?;
    spec.validate()?;
    let target_room = req.validate(target, 0)?;
    let room = req.speculative_room(target_room, draft.room(req, spec.draft_scratch()))?;
    // Replies a cancelled earlier generation left behind.
    draft.finish().await;
    let generation = run(target, draft, req, spec, room, sink).await;
    draft.finish().await;
    generation
}

/// Draft-side time of one generation.
#[derive(Default)]
struct DraftTime {
    busy_ms: f64,
    overlap_ms: f64,
    glue_ms: f64,
    glues: usize,
    tree_ms: f64,
    tree_steps: usize,
}

impl DraftTime {
    /// A round's speculation, which ran while the target's verify took `verify`; returns the
    /// span of the whole speculation.
    fn speculated(&mut self, glue: Span, tree: &[Span], verify: Span) -> Span {
        let work = Span { start: glue.start, end: tree.last().map_or(glue.end, |s| s.end) };
        let tree_ms: f64 = tree.iter().map(Span::ms).sum();
        self.busy_ms += glue.ms() + tree_ms;
        self.overlap_ms += work.overlap_ms(&verify);
        self.glue_ms += glue.ms();
        self.glues += 1;
        self.tree_ms += tree_ms;
        self.tree_steps += tree.len();
        work
    }

    fn write(&self, stats: &mut Stats) {
        let per = |x: f64, n: usize| (n > 0).then(|| x / n as f64);
        stats.draft_busy_ms = Some(self.busy_ms);
        stats.overlap_ms = Some(self.overlap_ms);
        stats.glue_ms_mean = per(self.glue_ms, self.glues);
        stats.tree_step_ms_mean = per(self.tree_ms, self.tree_steps);
    }
}

async fn run(
    target: &mut dyn Lm,
    draft: &mut DraftWorker,
    req: &Request,
    spec: &SpecConfig,
    room: usize,
    sink: Sink<'_>,
) -> Result<Generation> {
    draft.send(Job::Start { req: req.clone(), spec: spec.clone() })?;
    let first = prefill(target, req, Mode::Ssd.name()).await?;
    expect_started(draft.recv().await?)?;
    let run = first.decode(req, room, sink)?;
    let mut ssd = Ssd {
        target,
        draft,
        req,
        spec,
        tally: Tally::new(run.started),
        run,
        time: DraftTime::default(),
        lookups: Lookups::default(),
    };
    let mut rec = ssd.run.first;
    let mut last = None;
    while !ssd.run.out.done() {
        let outcome = ssd.round(rec, last).await?;
        rec = outcome.bonus;
        last = Some(outcome);
    }
    let Ssd { tally, time, lookups, run, .. } = ssd;
    Ok(run.finish(|stats| {
        tally.write(stats);
        time.write(stats);
        lookups.write(stats);
    }))
}

/// An SSD generation after its prefill, seen from the target's side.
struct Ssd<'a> {
    target: &'a mut dyn Lm,
    draft: &'a mut DraftWorker,
    req: &'a Request,
    spec: &'a SpecConfig,
    run: Decoding<'a>,
    tally: Tally,
    time: DraftTime,
    lookups: Lookups,
}

impl Ssd<'_> {
    /// One round after `rec`, whose predecessor ended with `last` (none in the first round).
    async fn round(&mut self, rec: u32, last: Option<Outcome>) -> Result<Outcome> {
        let remaining = self.run.out.remaining();
        let (mut proposal, hit) = self.proposal(last, rec, self.spec.k.min(remaining - 1)).await?;
        let allowed = constrain(&mut self.run, &mut proposal)?;
        // This round commits at least the bonus token, so the next one proposes at most
        // `remaining - 2` tokens.
        self.speculate(rec, &proposal, self.spec.k.min(remaining.saturating_sub(2)), allowed.as_deref().cloned())?;
        let verifying =
            verify(&mut *self.target, rec, &proposal, &self.req.sampling, &mut self.run.rng, self.spec.fault, allowed);
        let (outcome, verify_span) = timed(verifying).await?;
        let committed = self.run.out.push(&outcome.committed(&proposal))?;
        self.tally.round(proposal.tokens.len(), outcome, committed, verify_span, None, hit);
        // A generation that just ended leaves the speculation to `generate_ssd`'s `finish`.
        if !self.run.out.done() {
            self.speculated(verify_span).await?;
        }
        Ok(outcome)
    }

    /// The draft commits `last` and answers with up to `depth` tokens after `rec`: the
    /// speculation it cached for `last`, or its backup's; and whether the cache held it (`None`:
    /// no cache was asked).
    async fn proposal(&mut self, last: Option<Outcome>, rec: u32, depth: usize) -> Result<(Proposal, Option<bool>)> {
        self.draft.send(Job::Propose { outcome: last, rec, depth })?;
        let Reply::Proposal { proposal, hit, backup } = self.draft.recv().await? else {
            return Err(out_of_step());
        };
        self.lookups.count(hit, &proposal);
        self.time.busy_ms += backup.map_or(0.0, |s| s.ms());
        Ok((proposal, hit))
    }

    /// Start the draft's glue pass and tree over [rec, proposal], `depth` tokens per branch,
    /// its candidate bonus tokens among those `allowed` (a grammar's masks of the verified rows);
    /// it runs while the target verifies.
    fn speculate(&mut self, rec: u32, proposal: &Proposal, depth: usize, allowed: Option<Allowed>) -> Result<()> {
        let tokens = std::iter::once(rec).chain(proposal.tokens.iter().copied()).collect();
        self.draft.send(Job::Speculate { tokens, depth, allowed })
    }

    /// Wait for the draft's speculation, which ran beside the verify of `verify_span`.
    async fn speculated(&mut self, verify_span: Span) -> Result<()> {
        let Reply::Speculated { glue, tree } = self.draft.recv().await? else {
            return Err(out_of_step());
        };
        self.tally.drafted(self.time.speculated(glue, &tree, verify_span));
        Ok(())
    }
}

/// How often the speculation cache held the outcome.
#[derive(Default)]
struct Lookups {
    lookups: usize,
    hits: usize,
    multi_token_hits: usize,
}

impl Lookups {
    fn count(&mut self, hit: Option<bool>, proposal: &Proposal) {
        self.lookups += usize::from(hit.is_some());
        self.hits += usize::from(hit == Some(true));
        self.multi_token_hits += usize::from(hit == Some(true) && proposal.tokens.len() >= 2);
    }

    fn write(&self, stats: &mut Stats) {
        stats.cache_hit_rate = (self.lookups > 0).then(|| self.hits as f64 / self.lookups as f64);
        stats.multi_token_hits = Some(self.multi_token_hits);
    }
}

fn expect_started(reply: Reply) -> Result<()> {
    match reply {
        Reply::Started => Ok(()),
        _ => Err(out_of_step()),
    }
}
