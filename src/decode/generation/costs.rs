//! What a placement costs, timed where the models were placed: a few target forwards (a decode
//! and verifications of several batch sizes) and draft steps, the best of a few rounds. The
//! measured choice of mode and K (`crate::decode::choice`) turns these into tokens per unit of
//! time; the figures travel in the statistics ([`Choice`]) and from a draft worker ([`DraftCosts`]).

use serde::Serialize;
use web_time::Instant;

use crate::backend::Batch;
use crate::error::Result;
use crate::model::runner::Lm;

/// The largest K tried: a verification of up to 8 tokens reads the weights once on the CPU.
pub const MAX_K: usize = 7;
/// The verification batch sizes timed; the others are interpolated. A forward's cost grows about
/// linearly with its tokens once it is compute-bound, and two sizes (with the decode) keep the
/// whole measurement near a second for the 1.5B target on two cores.
pub(crate) const TIMED: [usize; 2] = [3, 8];
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
    /// Time `target` alone, over an empty context, which it is left with; the draft's figures
    /// (none: prompt lookup) come with [`Costs::with_draft`]. The matmuls, which read every weight
    /// whatever the context, dominate a short generation's steps.
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
}
