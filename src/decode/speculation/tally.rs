//! What SD and SSD count across rounds, for [`Stats`] and its timeline.

use std::future::Future;

use web_time::Instant;

use super::adapt::{judged, AdaptiveK};
use super::verify::Outcome;
use crate::decode::generation::stats::{RoundTimes, Stats};
use crate::error::Result;
use crate::runtime::Span;

/// Await `work`, and the span it took.
pub(crate) async fn timed<T>(work: impl Future<Output = Result<T>>) -> Result<(T, Span)> {
    let start = Instant::now();
    let value = work.await?;
    Ok((value, Span::since(start)))
}

/// What SD and SSD count across rounds.
pub(crate) struct Tally {
    /// The start of decoding, which the timeline counts from.
    origin: Instant,
    rounds: usize,
    proposed: usize,
    accepted: usize,
    /// Draft tokens the target judged: each round's up to its first rejection.
    judged: usize,
    committed: usize,
    verify_ms: f64,
    timeline: Vec<RoundTimes>,
}

impl Tally {
    pub fn new(origin: Instant) -> Self {
        Tally { origin, rounds: 0, proposed: 0, accepted: 0, judged: 0, committed: 0, verify_ms: 0.0, timeline: Vec::new() }
    }

    fn times(&self, s: Span) -> [f64; 2] {
        let ms = |t: Instant| t.saturating_duration_since(self.origin).as_secs_f64() * 1000.0;
        [ms(s.start), ms(s.end)]
    }

    /// A round that proposed `proposed` tokens, had `outcome`, committed `committed` tokens to
    /// the output and whose verify forward took `verify`; `draft` is the draft's work on it, if
    /// known yet ([`Tally::drafted`] adds it later), `hit` whether SSD's cache held it.
    pub fn round(&mut self, proposed: usize, outcome: Outcome, committed: usize, verify: Span, draft: Option<Span>, hit: Option<bool>) {
        self.rounds += 1;
        self.proposed += proposed;
        self.accepted += outcome.accepted;
        self.judged += judged(proposed, outcome.accepted);
        self.committed += committed;
        self.verify_ms += verify.ms();
        let (verify, draft) = (self.times(verify), draft.map(|d| self.times(d)));
        self.timeline.push(RoundTimes { verify, draft, proposed, accepted: outcome.accepted, hit });
    }

    /// The K of the next round where `adapt` chooses it, from the rounds so far.
    pub fn next_k(&self, adapt: &AdaptiveK) -> usize {
        adapt.next(self.judged, self.accepted)
    }

    /// The draft's work on the last round, once it is known.
    pub fn drafted(&mut self, draft: Span) {
        let t = self.times(draft);
        if let Some(r) = self.timeline.last_mut() {
            r.draft = Some(t);
        }
    }

    pub fn write(&self, stats: &mut Stats) {
        let per = |x: f64, n: usize| (n > 0).then(|| x / n as f64);
        stats.rounds = self.rounds;
        stats.acceptance_rate = per(self.accepted as f64, self.proposed);
        stats.mean_accepted = per(self.committed as f64, self.rounds);
        stats.target_busy_ms = self.verify_ms;
        stats.verify_ms_mean = per(self.verify_ms, self.rounds);
        stats.timeline = Some(self.timeline.clone());
    }
}
