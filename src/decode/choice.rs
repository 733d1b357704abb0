//! Choosing the mode and K by measurement: a few target forwards (a decode and verifications of
//! several batch sizes) and draft steps, timed where the models were placed, turned into tokens
//! per unit of time by the speculation arithmetic. A round of K draft tokens yields on average
//! `(1 - a^(K+1)) / (1 - a)` tokens at per-token acceptance `a` and costs a verification of K + 1
//! tokens plus K draft steps (SD). SSD's draft runs on hardware of its own: a round costs the
//! verification or the draft's speculation for the next round (a glue pass and K tree steps over
//! all the branches), whichever is longer, plus K draft steps on a cache miss.

use super::generation::costs::{Choice, Costs, Observed, MAX_K};
use super::strategy::Mode;
use super::speculation::{AdaptiveK, Fanout};

/// SSD's cache hit rate on the code prompts (`saguaro bench`); a miss drafts K tokens first.
const SSD_HITS: f64 = 0.85;
/// How much faster than AR a speculative mode must be expected to run to be chosen, against the
/// noise of a short measurement.
const MARGIN: f64 = 1.05;

impl Choice {
    pub fn mode(&self) -> Mode {
        self.mode.parse().expect("a choice names a mode")
    }
}

impl Costs {
    /// Record that a generation in `mode` with `k` draft tokens took `round_ms` per round.
    pub fn observe(&mut self, mode: Mode, k: usize, round_ms: f64) {
        let name = mode.to_string();
        match self.observed.iter_mut().find(|o| o.mode == name && o.k == k) {
            Some(o) => o.round_ms = (o.round_ms + round_ms) / 2.0,
            None => self.observed.push(Observed { mode: name, k, round_ms }),
        }
    }

    fn observed(&self, mode: Mode, k: usize) -> Option<f64> {
        let name = mode.to_string();
        self.observed.iter().find(|o| o.mode == name && o.k == k).map(|o| o.round_ms)
    }

    /// A forward over `n` tokens, interpolated between the timed sizes.
    pub fn verify(&self, n: usize) -> f64 {
        let v = &self.verify_ms;
        let i = v.iter().position(|&(m, _)| m >= n).unwrap_or(v.len() - 1).max(1);
        let ((n0, t0), (n1, t1)) = (v[i - 1], v[i]);
        t0 + (t1 - t0) * (n as f64 - n0 as f64) / (n1 - n0) as f64
    }

    /// A draft forward over `n` rows, on the line through the timed step and tree step (`None`
    /// when the tree step was not timed).
    fn draft(&self, n: usize) -> Option<f64> {
        let (rows, ms) = self.tree_step?;
        Some(self.draft_step_ms + (ms - self.draft_step_ms) * (n as f64 - 1.0) / (rows as f64 - 1.0))
    }

    /// AR's observed pace against the decode timed at load: whatever slowed it (other work on the
    /// machine, a longer context) slows every mode, so the arithmetic's figure for a mode not yet
    /// observed is scaled alike. Else an AR run during a burst of other work would make an untried
    /// mode look faster than it is.
    fn slowdown(&self) -> f64 {
        self.observed(Mode::Ar, 1).map_or(1.0, |ms| ms / self.decode_ms)
    }

    /// What an SD round drafting `k` tokens costs: as observed, else by the arithmetic.
    pub fn sd_round_ms(&self, k: usize) -> f64 {
        let arithmetic = || (self.verify(k + 1) + k as f64 * self.draft_step_ms) * self.slowdown();
        self.observed(Mode::Sd, k).unwrap_or_else(arithmetic)
    }

    /// What an SSD round drafting `k` tokens costs, with its draft beside the target speculating
    /// over `fanout`'s branches: as observed, else by the arithmetic; `None` where the draft does
    /// not run beside the target or its speculation was not timed.
    pub fn ssd_round_ms(&self, k: usize, fanout: &Fanout) -> Option<f64> {
        if !self.parallel {
            return None;
        }
        let arithmetic = || {
            let speculation = self.draft(k + 1)? + k as f64 * self.draft(fanout.max_branches(k))?;
            Some((self.verify(k + 1).max(speculation) + (1.0 - SSD_HITS) * k as f64 * self.draft_step_ms) * self.slowdown())
        };
        self.observed(Mode::Ssd, k).or_else(arithmetic)
    }

    /// SD's K chosen again after every round from the acceptance seen (see [`AdaptiveK`]), at
    /// these costs and starting from acceptance `a`.
    pub fn adaptive_k(&self, a: f64) -> Option<AdaptiveK> {
        AdaptiveK::new((1..=MAX_K).map(|k| self.sd_round_ms(k)).collect(), a)
    }

    /// The fastest of AR and the `candidates` with K in 1..=[`MAX_K`], at per-token acceptance `a`.
    pub fn choose(&self, a: f64, candidates: &[Candidate<'_>]) -> Choice {
        let tokens = |k: usize| (0..=k).map(|i| a.powi(i as i32)).sum::<f64>();
        let speedup = |k: usize, round_ms: f64| tokens(k) * self.decode_ms / round_ms;
        let mut best = (Mode::Ar, 1, 1.0 / self.slowdown());
        for k in 1..=MAX_K {
            for c in candidates {
                let Some(ms) = (c.round_ms)(self, k) else { continue };
                let s = speedup(k, ms);
                let bar = if best.0 == Mode::Ar { best.2 * MARGIN } else { best.2 };
                if s > bar {
                    best = (c.mode, k, s);
                }
            }
        }
        Choice { mode: best.0.to_string(), k: best.1, expected_speedup: best.2, acceptance: a, costs: self.clone() }
    }
}

/// A speculative mode the measured choice weighs against AR: what its round drafting K tokens
/// costs (`None`: not a candidate at that K).
pub struct Candidate<'a> {
    pub mode: Mode,
    pub round_ms: Box<dyn Fn(&Costs, usize) -> Option<f64> + 'a>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::generation::costs::TIMED;

    /// A tree step over 15 rows costs twice a draft step where the draft runs beside the target.
    fn costs(verify_per_token: f64, draft_step_ms: f64, parallel: bool) -> Costs {
        let verify_ms = std::iter::once(1).chain(TIMED).map(|n| (n, 10.0 + verify_per_token * (n - 1) as f64)).collect();
        let tree_step = parallel.then_some((15, 2.0 * draft_step_ms));
        Costs { decode_ms: 10.0, verify_ms, draft_step_ms, tree_step, observed: Vec::new(), parallel }
    }

    const UNIFORM3: Fanout = Fanout::Uniform(3);

    fn sd() -> Candidate<'static> {
        Candidate { mode: Mode::Sd, round_ms: Box::new(|c, k| Some(c.sd_round_ms(k))) }
    }

    /// SD, and SSD up to K = 4 with a uniform fan-out of 3.
    fn both() -> [Candidate<'static>; 2] {
        let ssd = Candidate { mode: Mode::Ssd, round_ms: Box::new(|c, k| (k <= 4).then(|| c.ssd_round_ms(k, &UNIFORM3)).flatten()) };
        [sd(), ssd]
    }

    #[test]
    fn interpolates_between_timed_sizes() {
        let c = costs(5.0, 0.0, false);
        assert_eq!(c.verify(1), 10.0);
        assert_eq!(c.verify(3), 20.0);
        assert_eq!(c.verify(5), 30.0);
        assert_eq!(c.verify(8), 45.0);
    }

    #[test]
    fn picks_the_fastest_mode_and_never_a_losing_one() {
        // Verification as dear as K + 1 decodes: speculation cannot win.
        let ssd = &both();
        let c = costs(10.0, 2.0, false);
        assert_eq!(c.choose(0.8, ssd).mode(), Mode::Ar);
        // Cheap verification and a cheap draft: SD, with a K that balances the two.
        let choice = costs(2.0, 2.0, false).choose(0.8, ssd);
        assert_eq!(choice.mode(), Mode::Sd);
        assert!((2..=MAX_K).contains(&choice.k) && choice.expected_speedup > 1.3, "{choice:?}");
        // A dear draft on the same cores loses.
        assert_eq!(costs(2.0, 8.0, false).choose(0.8, ssd).mode(), Mode::Ar);
        // A cheap draft: SD on the same cores; beside the target SSD hides its speculation
        // behind the verification.
        assert_eq!(costs(2.0, 3.0, false).choose(0.8, ssd).mode(), Mode::Sd);
        let hidden = costs(2.0, 3.0, true).choose(0.8, ssd);
        assert_eq!(hidden.mode(), Mode::Ssd);
        assert!(hidden.k <= 4);
        // Poor acceptance makes speculation pointless.
        assert_eq!(costs(2.0, 2.0, false).choose(0.1, ssd).mode(), Mode::Ar);
    }

    #[test]
    fn ssd_is_not_chosen_when_its_speculation_outlasts_the_verification() {
        // A draft as dear as the target (a model drafting for itself beside a fast server):
        // the tree steps take longer than the verification they should hide behind.
        // A draft at half a decode whose 15-row tree step costs four of its steps, beside a cheap
        // verification (a small model on a fast server): SD beats AR, SSD does not.
        let c = Costs { tree_step: Some((15, 20.0)), ..costs(1.0, 5.0, true) };
        assert_eq!(c.choose(0.9, &both()).mode(), Mode::Sd);
        // SSD whose rounds turn out slower than the arithmetic said gives way to what is faster.
        let mut c = costs(2.0, 3.0, true);
        assert_eq!(c.choose(0.8, &both()).mode(), Mode::Ssd);
        for k in 1..=4 {
            c.observe(Mode::Ssd, k, 60.0);
        }
        assert_eq!(c.choose(0.8, &both()).mode(), Mode::Sd);
        // Speculation not timed: SSD cannot be judged, so it is not chosen.
        let untimed = Costs { tree_step: None, ..costs(2.0, 3.0, true) };
        assert_ne!(untimed.choose(0.8, &both()).mode(), Mode::Ssd);
    }

    #[test]
    fn k_chosen_round_by_round_follows_the_same_arithmetic() {
        // Where SD is chosen, the K each round would take at the choice's acceptance is its K,
        // observed rounds included; at a higher acceptance the rounds draft further.
        let mut c = costs(2.0, 2.0, false);
        for a in [0.6, 0.8, 0.9] {
            let choice = c.choose(a, &[sd()]);
            assert_eq!(choice.mode(), Mode::Sd, "{choice:?}");
            assert_eq!(c.adaptive_k(a).unwrap().best(a), choice.k, "a = {a}");
        }
        assert!(c.adaptive_k(0.8).unwrap().best(0.95) > c.choose(0.8, &[sd()]).k);
        let k = c.choose(0.8, &[sd()]).k;
        c.observe(Mode::Sd, k, 1000.0);
        assert_eq!(c.adaptive_k(0.8).unwrap().best(0.8), c.choose(0.8, &[sd()]).k, "a K observed slow is left");
        assert_ne!(c.adaptive_k(0.8).unwrap().best(0.8), k);
    }

    #[test]
    fn a_slowdown_seen_in_ar_weighs_on_untried_modes_alike() {
        // A dear draft: AR at load. AR then observed at three times its timed decode (other work
        // on the machine): SD, never observed, would look faster against it unscaled.
        let mut c = costs(2.0, 8.0, false);
        assert_eq!(c.choose(0.8, &[sd()]).mode(), Mode::Ar);
        c.observe(Mode::Ar, 1, 30.0);
        let choice = c.choose(0.8, &[sd()]);
        assert_eq!(choice.mode(), Mode::Ar, "{choice:?}");
        assert!((choice.expected_speedup - 1.0 / 3.0).abs() < 1e-9);
        // An observed round is taken as it is: SD observed fast beats the slowed AR.
        c.observe(Mode::Sd, 2, 20.0);
        assert_eq!(c.choose(0.8, &[sd()]).mode(), Mode::Sd);
    }
}
