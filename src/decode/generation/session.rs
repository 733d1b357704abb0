//! The frame every strategy shares: the target's prefill and first token, then the output, the
//! clock and the statistics until the generation ends.

use web_time::Instant;

use std::sync::Arc;

use super::target_rows::pick_next;
use super::output::{Generation, Output, Sink};
use super::request::Request;
use super::stats::{elapsed_ms, Stats};
use crate::backend::Allowed;
use crate::decode::speculation::Proposal;
use crate::error::Result;
use crate::grammar::Constraint;
use crate::model::runner::Lm;
use crate::sampling::Rng;

/// A generation whose prompt the target has read.
pub(crate) struct Prefill {
    grammar: Option<Constraint>,
    rng: Rng,
    stats: Stats,
    first: u32,
    started: Instant,
}

/// Start generating `req` on `target` in `mode`: an empty cache, the prompt's prefill, and the
/// first token, the target's own pick.
pub(crate) async fn prefill(target: &mut dyn Lm, req: &Request, mode: &str) -> Result<Prefill> {
    target.truncate(0);
    let mut rng = Rng::new(req.sampling.seed);
    let stats = Stats { mode: mode.into(), prompt_tokens: req.prompt.len(), ..Stats::default() };
    let started = Instant::now();
    let mut grammar = req.grammar.as_ref().map(|g| g.start(&req.stop));
    let allowed = grammar.as_mut().map(|g| g.allowed().map(|row| Arc::new(Allowed::last_of(g.cols(), 1, &row)))).transpose()?;
    let first = pick_next(target, &req.prompt, &req.sampling, &mut rng, allowed).await?;
    Ok(Prefill { grammar, rng, stats, first, started })
}

impl Prefill {
    /// The prefill phase is over (with whatever draft work belongs to it): decoding begins, the
    /// first token committed, with `room` tokens of context after the prompt.
    pub fn decode<'a>(self, req: &'a Request, room: usize, sink: Sink<'a>) -> Result<Decoding<'a>> {
        let mut stats = self.stats;
        stats.prefill_ms = elapsed_ms(self.started);
        let mut out = Output::new(req, room, sink, self.grammar);
        out.push(&[self.first])?;
        Ok(Decoding { out, rng: self.rng, stats, started: Instant::now(), first: self.first })
    }
}

/// Under a grammar, cut `proposal` at the first token it refuses, and return the masks of the
/// rows that verify the rest.
pub(crate) fn constrain(run: &mut Decoding<'_>, proposal: &mut Proposal) -> Result<Option<Arc<Allowed>>> {
    let Some((valid, rows)) = run.out.masks_along(&proposal.tokens)? else { return Ok(None) };
    proposal.truncate(valid);
    Ok(Some(rows))
}

/// Masks for `rows` output rows of which only the last picks a token, where a grammar
/// constrains it: that row masked for the next position, the rows before it left whole.
pub(crate) fn next_mask(out: &mut Output<'_>, rows: usize) -> Result<Option<Arc<Allowed>>> {
    out.grammar.as_mut().map(|g| g.allowed().map(|row| Arc::new(Allowed::last_of(g.cols(), rows, &row)))).transpose()
}

/// A generation after its prefill.
pub(crate) struct Decoding<'a> {
    pub out: Output<'a>,
    /// The target's random stream.
    pub rng: Rng,
    pub stats: Stats,
    /// When decoding began.
    pub started: Instant,
    /// The token the prefill produced.
    pub first: u32,
}

impl Decoding<'_> {
    /// The finished generation; `strategy` adds its own statistics to the common ones.
    pub fn finish(mut self, strategy: impl FnOnce(&mut Stats)) -> Generation {
        self.stats.finish(self.out.tokens.len(), elapsed_ms(self.started));
        strategy(&mut self.stats);
        self.out.into_generation(self.stats)
    }
}
