//! Speculative speculative decoding (SSD): while the target verifies round t, the draft (on its
//! own worker) already speculates round t + 1 for the likeliest verification outcomes (k, t*),
//! so that when the target finishes, the next draft tokens are usually ready at once.
//!
//! One round, on the target's side (the draft's side is in `draft`):
//! proposal (from the cache, or the backup on a miss) -> [draft: glue pass + tree decode into
//! the speculation cache] || [target: verify rec + proposal] -> outcome (k, t*) -> commit ->
//! the draft looks the outcome up for the next proposal.
//!
//! The overlap pays only if the glue pass and the tree steps take no longer than a verify:
//! `Stats` reports `glue_ms_mean`, `tree_step_ms_mean` and `verify_ms_mean` to choose K by.

pub mod cache;
mod draft;
pub mod fanout;
pub mod tree;

use web_time::Instant;

pub use draft::{DraftHost, DraftWorker, Job, Reply};

use super::autoregressive::pick;
use super::speculative::{check_draft, verify, Outcome, SpecConfig, Tally};
use super::{elapsed_ms, Generation, Output, Request, Sink, Stats};
use crate::error::{Error, Result};
use crate::model::runner::{append, Lm, Want};
use crate::runtime::Span;
use crate::sampling::Rng;

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
    req.validate(target, 0)?;
    // Replies a cancelled earlier generation left behind.
    draft.finish().await;
    let generation = run(target, draft, req, spec, sink).await;
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
    sink: Sink<'_>,
) -> Result<Generation> {
    target.truncate(0);
    let mut rng = Rng::new(req.sampling.seed);
    let mut stats = Stats { mode: "ssd".into(), prompt_tokens: req.prompt.len(), ..Stats::default() };
    let t0 = Instant::now();
    draft.send(Job::Start { req: req.clone(), spec: spec.clone() })?;
    let logits = append(target, &req.prompt, Want::LastLogits).await?.logits();
    let mut rec = pick(&logits, req, &mut rng);
    expect_started(draft.recv().await?)?;
    stats.prefill_ms = elapsed_ms(t0);

    let t1 = Instant::now();
    let mut out = Output::new(req, sink);
    out.push(&[rec]);
    let mut tally = Tally::new(t1);
    let mut time = DraftTime::default();
    let (mut lookups, mut hits) = (0usize, 0usize);
    let mut outcome: Option<Outcome> = None;
    while !out.done() {
        let remaining = req.max_tokens - out.tokens.len();
        draft.send(Job::Propose { outcome, rec, depth: spec.k.min(remaining - 1) })?;
        let (proposal, hit, backup) = match draft.recv().await? {
            Reply::Proposal { proposal, hit, backup } => (proposal, hit, backup),
            _ => return Err(out_of_step()),
        };
        lookups += usize::from(hit.is_some());
        hits += usize::from(hit == Some(true));
        time.busy_ms += backup.map_or(0.0, |s| s.ms());

        // This round commits at least the bonus token, so the next one proposes at most
        // `remaining - 2` tokens.
        let tokens = std::iter::once(rec).chain(proposal.tokens.iter().copied()).collect();
        draft.send(Job::Speculate { tokens, depth: spec.k.min(remaining.saturating_sub(2)) })?;
        let tv = Instant::now();
        let o = verify(target, rec, &proposal, &req.sampling, &mut rng, spec.fault).await?;
        let verify_span = Span::since(tv);
        let mut toks = proposal.tokens[..o.accepted].to_vec();
        toks.push(o.bonus);
        let committed = out.push(&toks);
        tally.round(proposal.tokens.len(), o, committed, verify_span, None, hit);
        if out.done() {
            break;
        }
        match draft.recv().await? {
            Reply::Speculated { glue, tree } => tally.drafted(time.speculated(glue, &tree, verify_span)),
            _ => return Err(out_of_step()),
        }
        rec = o.bonus;
        outcome = Some(o);
    }
    let decode_ms = elapsed_ms(t1);
    tally.write(&mut stats);
    time.write(&mut stats);
    stats.cache_hit_rate = (lookups > 0).then(|| hits as f64 / lookups as f64);
    stats.finish(out.tokens.len(), decode_ms);
    Ok(out.into_generation(stats))
}

fn expect_started(reply: Reply) -> Result<()> {
    match reply {
        Reply::Started => Ok(()),
        _ => Err(out_of_step()),
    }
}

fn out_of_step() -> Error {
    Error::Worker("the draft worker answered out of step".into())
}
