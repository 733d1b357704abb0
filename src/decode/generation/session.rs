//! The frame every strategy shares: the target's prefill and first token, then the output, the
//! clock and the statistics until the generation ends.

use web_time::Instant;

use super::target_rows::sample_next;
use super::output::{Generation, Output, Sink};
use super::request::Request;
use super::stats::{elapsed_ms, Stats};
use crate::error::Result;
use crate::model::runner::{append, Lm, Want};
use crate::sampling::Rng;

/// A generation whose prompt the target has read.
pub(crate) struct Prefill {
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
    let first = if req.sampling.is_greedy() {
        append(target, &req.prompt, Want::LastTopK { k: 1, temperature: 1.0 }).await?.top_k().ids[0]
    } else {
        sample_next(target, &req.prompt, &req.sampling, &mut rng).await?
    };
    Ok(Prefill { rng, stats, first, started })
}

impl Prefill {
    /// The prefill phase is over (with whatever draft work belongs to it): decoding begins, the
    /// first token committed, with `room` tokens of context after the prompt.
    pub fn decode<'a>(self, req: &'a Request, room: usize, sink: Sink<'a>) -> Decoding<'a> {
        let mut stats = self.stats;
        stats.prefill_ms = elapsed_ms(self.started);
        let mut out = Output::new(req, room, sink);
        out.push(&[self.first]);
        Decoding { out, rng: self.rng, stats, started: Instant::now(), first: self.first }
    }
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
