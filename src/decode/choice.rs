//! Choosing the mode and K by measurement: a few target forwards (a decode and verifications of
//! several batch sizes) and draft steps, timed where the models were placed, turned into tokens
//! per unit of time by the speculation arithmetic. A round of K draft tokens yields on average
//! `(1 - a^(K+1)) / (1 - a)` tokens at per-token acceptance `a` and costs a verification of K + 1
//! tokens plus K draft steps (SD). SSD's draft runs on hardware of its own: a round costs the
//! verification or the draft's speculation for the next round (a glue pass and K tree steps over
//! all the branches), whichever is longer, plus K draft steps on a cache miss.

use serde::Serialize;
use web_time::Instant;

use super::spec::{AdaptiveK, Fanout};
use super::Mode;
use crate::backend::Batch;
use crate::error::Result;
use crate::model::runner::Lm;

/// The largest K tried: a verification of up to 8 tokens reads the weights once on the CPU.
pub const MAX_K: usize = 7;
/// The verification batch sizes timed; the others are interpolated. A forward's cost grows about
/// linearly with its tokens once it is compute-bound, and two sizes (with the decode) keep the
/// whole measurement near a second for the 1.5B target on two cores.
const TIMED: [usize; 2] = [3, 8];
/// SSD's cache hit rate on the code prompts (`saguaro bench`); a miss drafts K tokens first.
const SSD_HITS: f64 = 0.85;
/// How much faster than AR a speculative mode must be expected to run to be chosen, against the
/// noise of a short measurement.
const MARGIN: f64 = 1.05;

/// What one placement costs, in milliseconds.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename_all = "camelCase"))]
pub struct Costs {
    /// AR's time per token: a decode, or with a server target the server's own decode (remote AR
    /// pays the round trip once per generation, not per token).
    pub decode_ms: f64,
    /// (tokens, ms) of target forwards over a causal batch, a decode (1 token) first.
    pub verify_ms: Vec<(usize, f64)>,
    /// One draft token (0 for prompt lookup).
    pub draft_step_ms: f64,
    /// (rows, ms) of a draft forward as wide as SSD's tree steps: timed when the draft runs beside
    /// the target, else `None` (and SSD is not considered).
    pub tree_step: Option<(usize, f64)>,
    /// What rounds of generations really took, per mode and K: where the arithmetic's figure is
    /// off (models that slow each other down more than they did timed apart, other work on the
    /// machine), the observed one replaces it.
    pub observed: Vec<Observed>,
    /// Whether the draft runs beside the target rather than on the same cores (SSD can overlap).
    pub parallel: bool,
}

/// Milliseconds per round (AR: per token) of generations in `mode` with `k` draft tokens, averaged
/// over generations with the latest weighing half.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename_all = "camelCase"))]
pub struct Observed {
    #[cfg_attr(test, ts(as = "crate::decode::Mode"))]
    pub mode: String,
    pub k: usize,
    pub round_ms: f64,
}

/// The mode and K a generation runs with when none is asked for, and why.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename_all = "camelCase"))]
pub struct Choice {
    #[cfg_attr(test, ts(as = "crate::decode::Mode"))]
    pub mode: String,
    pub k: usize,
    /// Tokens per second over AR's, as the arithmetic expects them.
    pub expected_speedup: f64,
    /// The per-token acceptance the choice assumed.
    pub acceptance: f64,
    pub costs: Costs,
}

impl Choice {
    pub fn mode(&self) -> Mode {
        self.mode.parse().expect("a choice names a mode")
    }
}

/// Probe tokens: any ids of the vocabulary do, the costs hardly depend on them.
pub(crate) fn probe(vocab: usize, n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

/// Milliseconds of one forward of `lm` over each of `sizes` probe tokens after its committed
/// ones, the best of `rounds`, since other work on the machine only ever adds time. The sizes take
/// turns within a round: a burst of other work then slows one sample of each size rather than
/// every sample of one, which would skew the ratios the choice rests on.
pub(crate) async fn time_forwards(lm: &mut dyn Lm, sizes: &[usize], rounds: usize) -> Result<Vec<f64>> {
    let vocab = lm.config().vocab_size;
    let forwards: Vec<(Batch, Vec<u32>)> =
        sizes.iter().map(|&n| (Batch::causal(&probe(vocab, n), lm.len()), (0..n as u32).collect())).collect();
    let mut best = vec![f64::INFINITY; sizes.len()];
    for _ in 0..rounds {
        for (best, (batch, rows)) in best.iter_mut().zip(&forwards) {
            let t = Instant::now();
            lm.argmax(batch, rows).await?;
            *best = best.min(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    Ok(best)
}

/// Rounds of timed forwards: the first also pages the weights in, so two remain to compare.
const ROUNDS: usize = 3;

/// What the draft model costs where it runs, timed there (SSD's draft worker times its own model
/// and sends these to the engine).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct DraftCosts {
    /// One draft token.
    pub step_ms: f64,
    /// (rows, ms) of a forward as wide as SSD's tree steps, when one was asked for.
    pub tree_step: Option<(usize, f64)>,
}

impl DraftCosts {
    /// Time `draft` over an empty context, which it is left with: a step, and a tree step of
    /// `tree_rows` rows where that is more than one.
    pub async fn measure(draft: &mut dyn Lm, tree_rows: usize) -> Result<DraftCosts> {
        draft.truncate(0);
        let sizes: &[usize] = if tree_rows > 1 { &[1, tree_rows] } else { &[1] };
        let ms = time_forwards(draft, sizes, ROUNDS).await?;
        draft.truncate(0);
        let step_ms = ms[0];
        Ok(DraftCosts { step_ms, tree_step: ms.get(1).map(|&t| (tree_rows, t.max(step_ms))) })
    }
}

impl Costs {
    /// Time `target` (and `draft`, if a model drafts) over an empty context; both are left empty.
    /// The matmuls, which read every weight whatever the context, dominate a short generation's
    /// steps.
    /// `tree_rows`: the widest tree step SSD would run (its fan-out's branches at the largest K).
    pub async fn measure(target: &mut dyn Lm, draft: Option<&mut dyn Lm>, parallel: bool, tree_rows: usize) -> Result<Costs> {
        let costs = Costs::measure_target(target, parallel).await?;
        Ok(match draft {
            Some(d) => costs.with_draft(DraftCosts::measure(d, if parallel { tree_rows } else { 0 }).await?),
            None => costs,
        })
    }

    /// Time `target` alone, as [`Costs::measure`] does; the draft's figures (none: prompt lookup)
    /// come with [`Costs::with_draft`].
    pub async fn measure_target(target: &mut dyn Lm, parallel: bool) -> Result<Costs> {
        target.truncate(0);
        let sizes: Vec<usize> = std::iter::once(1).chain(TIMED).collect();
        let ms = time_forwards(target, &sizes, ROUNDS).await?;
        let decode_ms = ms[0];
        let mut verify_ms: Vec<(usize, f64)> = Vec::with_capacity(sizes.len());
        for (&n, &t) in sizes.iter().zip(&ms) {
            // More tokens never cost less: a smaller figure is noise from other work.
            let t = t.max(verify_ms.last().map_or(0.0, |v| v.1));
            verify_ms.push((n, t));
        }
        Ok(Costs { decode_ms, verify_ms, draft_step_ms: 0.0, tree_step: None, observed: Vec::new(), parallel })
    }

    /// These costs with the draft's, timed where it runs; a tree step counts only where the draft
    /// runs beside the target.
    pub fn with_draft(self, draft: DraftCosts) -> Costs {
        let tree_step = draft.tree_step.filter(|_| self.parallel);
        Costs { draft_step_ms: draft.step_ms, tree_step, ..self }
    }

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
    fn sd_round_ms(&self, k: usize) -> f64 {
        let arithmetic = || (self.verify(k + 1) + k as f64 * self.draft_step_ms) * self.slowdown();
        self.observed(Mode::Sd, k).unwrap_or_else(arithmetic)
    }

    /// SD's K chosen again after every round from the acceptance seen (see [`AdaptiveK`]), at
    /// these costs and starting from acceptance `a`.
    pub fn adaptive_k(&self, a: f64) -> Option<AdaptiveK> {
        AdaptiveK::new((1..=MAX_K).map(|k| self.sd_round_ms(k)).collect(), a)
    }

    /// The fastest of AR, SD with K in 1..=[`MAX_K`] and (when its draft runs beside the target,
    /// `ssd` = its largest K and fan-out) SSD, at per-token acceptance `a`.
    pub fn choose(&self, a: f64, ssd: Option<(usize, &Fanout)>) -> Choice {
        let tokens = |k: usize| (0..=k).map(|i| a.powi(i as i32)).sum::<f64>();
        let speedup = |k: usize, round_ms: f64| tokens(k) * self.decode_ms / round_ms;
        let slow = self.slowdown();
        let ar = 1.0 / slow;
        let ssd_round = |k: usize, fanout: &Fanout| {
            let speculation = self.draft(k + 1)? + k as f64 * self.draft(fanout.max_branches(k))?;
            Some((self.verify(k + 1).max(speculation) + (1.0 - SSD_HITS) * k as f64 * self.draft_step_ms) * slow)
        };
        let mut best = (Mode::Ar, 1, ar);
        let mut consider = |mode: Mode, k: usize, s: f64| {
            let bar = if best.0 == Mode::Ar { best.2 * MARGIN } else { best.2 };
            if s > bar {
                best = (mode, k, s);
            }
        };
        for k in 1..=MAX_K {
            consider(Mode::Sd, k, speedup(k, self.sd_round_ms(k)));
            match ssd {
                Some((max_k, fanout)) if self.parallel && k <= max_k => {
                    if let Some(ms) = self.observed(Mode::Ssd, k).or_else(|| ssd_round(k, fanout)) {
                        consider(Mode::Ssd, k, speedup(k, ms));
                    }
                }
                _ => {}
            }
        }
        Choice { mode: best.0.to_string(), k: best.1, expected_speedup: best.2, acceptance: a, costs: self.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::ModelConfig;
    use futures::executor::block_on;
    use futures::future::{ready, LocalBoxFuture};
    use std::time::Duration;

    /// A model whose forward over n tokens sleeps n milliseconds, and `BURST` more in `span`
    /// forwards from the `burst`-th on (other work on the machine).
    struct Busy {
        config: ModelConfig,
        calls: usize,
        burst: usize,
        span: usize,
    }

    const BURST: Duration = Duration::from_millis(200);

    impl Lm for Busy {
        fn config(&self) -> &ModelConfig {
            &self.config
        }
        fn backend_name(&self) -> String {
            "busy".into()
        }
        fn len(&self) -> usize {
            0
        }
        fn capacity(&self) -> usize {
            64
        }
        fn truncate(&mut self, _: usize) {}
        fn advance(&mut self, _: usize) -> Result<()> {
            Ok(())
        }
        fn logits<'a>(&'a mut self, _: &'a Batch, _: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<f32>>> {
            unreachable!("the timings ask for argmax only")
        }
        fn argmax<'a>(&'a mut self, batch: &'a Batch, rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<u32>>> {
            let burst = (self.burst..self.burst + self.span).contains(&self.calls);
            self.calls += 1;
            std::thread::sleep(Duration::from_millis(batch.len() as u64) + if burst { BURST } else { Duration::ZERO });
            Box::pin(ready(Ok(vec![0; rows.len()])))
        }
    }

    #[test]
    fn a_burst_of_other_work_does_not_skew_the_timed_sizes() {
        // A burst as long as a round, wherever it falls, leaves each size unslowed samples: it
        // slows one of each size rather than all of one.
        let span = 1 + TIMED.len();
        let forwards = ROUNDS * span;
        for burst in 0..=forwards - span {
            let mut lm = Busy { config: ModelConfig::tiny(), calls: 0, burst, span };
            let costs = block_on(Costs::measure_target(&mut lm, false)).unwrap();
            assert_eq!(lm.calls, forwards);
            for &(n, ms) in &costs.verify_ms {
                assert!(ms < BURST.as_millis() as f64 / 2.0, "burst at forward {burst}: {n} tokens timed at {ms} ms");
            }
        }
    }

    /// A tree step over 15 rows costs twice a draft step where the draft runs beside the target.
    fn costs(verify_per_token: f64, draft_step_ms: f64, parallel: bool) -> Costs {
        let verify_ms = std::iter::once(1).chain(TIMED).map(|n| (n, 10.0 + verify_per_token * (n - 1) as f64)).collect();
        let tree_step = parallel.then_some((15, 2.0 * draft_step_ms));
        Costs { decode_ms: 10.0, verify_ms, draft_step_ms, tree_step, observed: Vec::new(), parallel }
    }

    const UNIFORM3: Fanout = Fanout::Uniform(3);

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
        let ssd = Some((4, &UNIFORM3));
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
        assert_eq!(c.choose(0.9, Some((4, &UNIFORM3))).mode(), Mode::Sd);
        // SSD whose rounds turn out slower than the arithmetic said gives way to what is faster.
        let mut c = costs(2.0, 3.0, true);
        assert_eq!(c.choose(0.8, Some((4, &UNIFORM3))).mode(), Mode::Ssd);
        for k in 1..=4 {
            c.observe(Mode::Ssd, k, 60.0);
        }
        assert_eq!(c.choose(0.8, Some((4, &UNIFORM3))).mode(), Mode::Sd);
        // Speculation not timed: SSD cannot be judged, so it is not chosen.
        let untimed = Costs { tree_step: None, ..costs(2.0, 3.0, true) };
        assert_ne!(untimed.choose(0.8, Some((4, &UNIFORM3))).mode(), Mode::Ssd);
    }

    #[test]
    fn k_chosen_round_by_round_follows_the_same_arithmetic() {
        // Where SD is chosen, the K each round would take at the choice's acceptance is its K,
        // observed rounds included; at a higher acceptance the rounds draft further.
        let mut c = costs(2.0, 2.0, false);
        for a in [0.6, 0.8, 0.9] {
            let choice = c.choose(a, None);
            assert_eq!(choice.mode(), Mode::Sd, "{choice:?}");
            assert_eq!(c.adaptive_k(a).unwrap().best(a), choice.k, "a = {a}");
        }
        assert!(c.adaptive_k(0.8).unwrap().best(0.95) > c.choose(0.8, None).k);
        let k = c.choose(0.8, None).k;
        c.observe(Mode::Sd, k, 1000.0);
        assert_eq!(c.adaptive_k(0.8).unwrap().best(0.8), c.choose(0.8, None).k, "a K observed slow is left");
        assert_ne!(c.adaptive_k(0.8).unwrap().best(0.8), k);
    }

    #[test]
    fn a_slowdown_seen_in_ar_weighs_on_untried_modes_alike() {
        // A dear draft: AR at load. AR then observed at three times its timed decode (other work
        // on the machine): SD, never observed, would look faster against it unscaled.
        let mut c = costs(2.0, 8.0, false);
        assert_eq!(c.choose(0.8, None).mode(), Mode::Ar);
        c.observe(Mode::Ar, 1, 30.0);
        let choice = c.choose(0.8, None);
        assert_eq!(choice.mode(), Mode::Ar, "{choice:?}");
        assert!((choice.expected_speedup - 1.0 / 3.0).abs() < 1e-9);
        // An observed round is taken as it is: SD observed fast beats the slowed AR.
        c.observe(Mode::Sd, 2, 20.0);
        assert_eq!(c.choose(0.8, None).mode(), Mode::Sd);
    }
}
