//! K chosen again after every round of an SD generation, from the acceptance its rounds have
//! shown. A measured choice of K made before a generation rests on an assumed per-token
//! acceptance (a prior, or what earlier generations saw); a generation's own rounds correct it,
//! and follow it where it changes (code against prose). The output does not depend on K: each
//! round's verification keeps it the target's whatever the proposal's length.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// How many judged draft tokens the assumed acceptance weighs as, against the generation's own:
/// a few rounds move the estimate, a few dozen settle it.
const PRIOR_TRIES: f64 = 8.0;

/// The K of each SD round, chosen among those with a known cost.
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptiveK {
    /// Expected milliseconds of a round that drafts K tokens and verifies them, K = `first_k`,
    /// `first_k` + 1, ...; in a batch, one such list per batch size.
    round_ms: Vec<Vec<f64>>,
    /// 1, or 0 in a batch: a round of K = 0 drafts nothing and decodes the target's next token
    /// alone, as AR would (the draft catches up on those tokens in its next round that drafts).
    first_k: usize,
    /// In a batch, the sequences in it now (set by whoever steps it): `round_ms[size - 1]` holds.
    batch: Option<BatchSize>,
    /// Per-token acceptance assumed before any round.
    prior: f64,
}

/// The size of a batch, shared by its sequences and its scheduler, which updates it each step: a
/// round's cost depends on how many sequences verify beside it.
#[derive(Clone, Debug, Default)]
pub struct BatchSize(Arc<AtomicUsize>);

impl BatchSize {
    pub fn set(&self, n: usize) {
        self.0.store(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

impl PartialEq for BatchSize {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl AdaptiveK {
    /// `round_ms[K - 1]`: what a round drafting K tokens costs; `prior`: the acceptance assumed.
    /// `None` without a round cost.
    pub fn new(round_ms: Vec<f64>, prior: f64) -> Option<AdaptiveK> {
        (!round_ms.is_empty()).then_some(AdaptiveK { round_ms: vec![round_ms], first_k: 1, batch: None, prior: prior.clamp(0.0, 1.0) })
    }

    /// K for a sequence in a batch whose size `batch` follows: `round_ms[b - 1][K]`, what a
    /// round drafting K tokens (K = 0: none, an AR step) costs in a batch of b sequences. Where
    /// the batch is large enough that speculation stops paying, K is 0. `None` without a round
    /// cost.
    pub fn in_batch(round_ms: Vec<Vec<f64>>, batch: BatchSize, prior: f64) -> Option<AdaptiveK> {
        (!round_ms.is_empty() && round_ms.iter().all(|r| !r.is_empty()))
            .then_some(AdaptiveK { round_ms, first_k: 0, batch: Some(batch), prior: prior.clamp(0.0, 1.0) })
    }

    /// The round costs at the batch's size now.
    fn costs(&self) -> &[f64] {
        let size = self.batch.as_ref().map_or(1, BatchSize::get);
        &self.round_ms[size.clamp(1, self.round_ms.len()) - 1]
    }

    /// The K with the most tokens per millisecond at per-token acceptance `a`: a round drafting
    /// K tokens commits `1 + a + ... + a^K` on average.
    pub fn best(&self, a: f64) -> usize {
        let mut best = (self.first_k, f64::MIN);
        for (i, &ms) in self.costs().iter().enumerate() {
            let k = self.first_k + i;
            let tokens: f64 = (0..=k).map(|j| a.powi(j as i32)).sum();
            if tokens / ms > best.1 {
                best = (k, tokens / ms);
            }
        }
        best.0
    }

    /// The K of the next round, after rounds that judged `tries` draft tokens and accepted
    /// `accepted` of them (see [`acceptance`]).
    pub fn next(&self, tries: usize, accepted: usize) -> usize {
        self.best(acceptance(tries, accepted, self.prior))
    }
}

/// The per-token acceptance (the chance that a draft token is accepted once those before it
/// were) of rounds that judged `tries` draft tokens and accepted `accepted`, counting `prior` as
/// [`PRIOR_TRIES`] judged tokens. A round judges its tokens up to its first rejection, so each
/// judged token is one trial of that chance whatever the rounds' K.
fn acceptance(tries: usize, accepted: usize, prior: f64) -> f64 {
    (accepted as f64 + PRIOR_TRIES * prior) / (tries as f64 + PRIOR_TRIES)
}

/// Draft tokens a round that proposed `proposed` and had `accepted` of them accepted judged.
pub fn judged(proposed: usize, accepted: usize) -> usize {
    if accepted < proposed {
        accepted + 1
    } else {
        proposed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A verification of n tokens costing 10 + 4 (n - 1) ms and a 2 ms draft step.
    fn costs() -> AdaptiveK {
        AdaptiveK::new((1..=7).map(|k| 10.0 + 4.0 * k as f64 + 2.0 * k as f64).collect(), 0.8).unwrap()
    }

    #[test]
    fn higher_acceptance_drafts_further() {
        let c = costs();
        let ks: Vec<usize> = [0.3, 0.6, 0.8, 0.9, 0.97].iter().map(|&a| c.best(a)).collect();
        assert!(ks.windows(2).all(|w| w[0] <= w[1]), "{ks:?}");
        assert_eq!(ks[0], 1);
        assert!(ks[4] >= 5, "{ks:?}");
        // The chosen K is the arithmetic's best: no other K yields more tokens per ms.
        for a in [0.5f64, 0.85] {
            let rate = |k: usize| (0..=k).map(|i| a.powi(i as i32)).sum::<f64>() / c.costs()[k - 1];
            let k = c.best(a);
            assert!((1..=7).all(|j| rate(j) <= rate(k)), "a = {a}: K = {k}");
        }
    }

    #[test]
    fn the_rounds_outweigh_the_prior() {
        let c = costs();
        // No rounds yet: the prior.
        assert_eq!(acceptance(0, 0, 0.8), 0.8);
        assert_eq!(c.next(0, 0), c.best(0.8));
        // Many rounds accepting 19 of 20 judged tokens: near 0.95, and a longer K than the prior's.
        let a = acceptance(2000, 1900, 0.8);
        assert!((a - 0.95).abs() < 0.001, "{a}");
        assert!(c.next(2000, 1900) > c.best(0.8));
        // Every proposal rejected at its first token: K = 1.
        assert_eq!(c.next(200, 0), 1);
    }

    /// A sequence's rounds shorten as the batch grows, down to AR steps where speculation stops
    /// paying, and lengthen again as it shrinks.
    #[test]
    fn in_a_batch_k_follows_its_size() {
        // A 2 ms draft step and a 20 ms verification, plus 0.5 ms for each row verified, and
        // past 16 rows 4 ms more for each (the forward no longer bound by the weights' reads).
        let verify = |rows: usize| 20.0 + 0.5 * rows as f64 + 4.0 * rows.saturating_sub(16) as f64;
        let round = |b: usize, k: usize| 2.0 * k as f64 + verify(b * (k + 1));
        let table: Vec<Vec<f64>> = (1..=16).map(|b| (0..=6).map(|k| round(b, k)).collect()).collect();
        let size = BatchSize::default();
        let adapt = AdaptiveK::in_batch(table, size.clone(), 0.8).unwrap();
        let at = |n| {
            size.set(n);
            adapt.next(0, 0)
        };
        let (alone, four, sixteen) = (at(1), at(4), at(16));
        assert!(alone > four && four > 0, "K alone {alone}, in a batch of 4 {four}");
        // At 16 sequences any speculation verifies past 16 rows: the rounds decode by AR.
        assert_eq!(sixteen, 0);
        assert_eq!(at(1), alone);
        // A size past the table's costs as its largest.
        assert_eq!(at(17), 0);
    }

    #[test]
    fn a_round_judges_up_to_its_first_rejection() {
        assert_eq!(judged(4, 4), 4);
        assert_eq!(judged(4, 2), 3);
        assert_eq!(judged(4, 0), 1);
        assert_eq!(judged(0, 0), 0);
    }
}
