//! Speculative speculative decoding (SSD): while the target verifies round t, the draft (on its
//! own worker) already speculates round t + 1 for the likeliest verification outcomes (k, t*),
//! so that when the target finishes, the next draft tokens are usually ready at once.
//!
//! One round (`round` on the target's side; the draft's side answers its jobs in `draft`):
//! 1. propose: the draft commits the last round's outcome and answers with the speculation it
//!    cached for that outcome (a hit) or, on a miss, with its backup;
//! 2. speculate: the draft starts its glue pass over [rec, proposal] and the tree over the
//!    likeliest outcomes of this round, into the speculation cache...
//! 3. verify: ...while the target judges the proposal, into the outcome (k, t*);
//! 4. commit: s1..sk and t* join the output, and t* is the next round's `rec`;
//! 5. the target waits for the speculation, the cache the next proposal comes from.
//!
//! The draft's KV cache follows the rules shared with SD (`speculation`'s `kv` module): the glue
//! pass and the tree are scratch until the outcome commits rec, s1..sk.
//!
//! This file is SSD's [`Strategy`]: the draft on its worker (shared with SD where one draft serves
//! both), prepared where a draft model can run beside the target.
//!
//! The overlap pays only if the glue pass and the tree steps take no longer than a verify:
//! `Stats` reports `glue_ms_mean`, `tree_step_ms_mean` and `verify_ms_mean` to choose K by.

pub mod cache;
mod draft;
pub mod fanout;
mod round;

pub use draft::{DraftHost, DraftWorker, Job, Reply, SharedWorker, WorkerDrafter};
pub use round::generate_ssd;

use futures::future::LocalBoxFuture;

use super::generation::costs::Costs;
use super::generation::output::Generation;
use super::strategy::Mode;
use super::speculation::SpecConfig;
use super::strategy::{Placement, Run, Strategy};
use crate::error::{Error, Result};
use crate::model::runner::{BoxedLm, Lm};

/// SSD as the engine holds it: the draft on its worker, and where the two share the CPU, a
/// target of its own on the cores the draft leaves.
pub struct SpeculativeSpeculative {
    worker: SharedWorker,
    target: Option<BoxedLm>,
}

impl SpeculativeSpeculative {
    /// SSD on `worker` (a draft in a browser Web Worker), verifying on the engine's target.
    pub fn on_worker(worker: SharedWorker) -> Self {
        SpeculativeSpeculative { worker, target: None }
    }

    /// SSD where it is asked for and a draft model can run beside the target. Prompt lookup
    /// leaves nothing to overlap: a lookup costs nothing, and SD with it is already what SSD
    /// would be.
    pub async fn prepare(p: &mut dyn Placement) -> Result<Option<Box<dyn Strategy>>> {
        if p.lookup().is_some() {
            return match p.modes().contains(&Mode::Ssd) {
                true => Err(Error::InvalidArgument(
                    "mode ssd needs a draft model; prompt lookup drafts at no cost, so use it with mode sd".into(),
                )),
                false => Ok(None),
            };
        }
        if !p.wants(Mode::Ssd) {
            return Ok(None);
        }
        let Some(lm) = p.draft_beside().await? else { return Ok(None) };
        let worker = if p.draft_thread() { DraftWorker::new(lm)? } else { DraftWorker::inline(lm) };
        let target = p.target_beside().await?;
        Ok(Some(Box::new(SpeculativeSpeculative { worker: SharedWorker::new(worker), target })))
    }
}

impl Strategy for SpeculativeSpeculative {
    fn mode(&self) -> Mode {
        Mode::Ssd
    }

    fn ready(&self) -> bool {
        self.worker.ready()
    }

    /// With its draft beside the target, SSD hides the speculation behind the verification;
    /// inline, its speculation would only add to every round.
    fn preference(&self) -> u8 {
        if self.worker.is_concurrent() {
            3
        } else {
            1
        }
    }

    /// Up to the engine's K and fan-out, which sized the draft's cache; not inline, where the
    /// draft speculates only once the verify is over and so adds its whole cost to every round.
    fn round_ms(&self, costs: &Costs, spec: &SpecConfig, k: usize) -> Option<f64> {
        (self.worker.is_concurrent() && k <= spec.k).then(|| costs.ssd_round_ms(k, &spec.fanout)).flatten()
    }

    fn generate<'a>(&'a mut self, run: Run<'a>) -> LocalBoxFuture<'a, Result<Generation>> {
        Box::pin(async move {
            let mut worker = self.worker.lock().await;
            let target = self.target.as_deref_mut().map_or(run.target, |t| t as &mut dyn Lm);
            generate_ssd(target, &mut worker, run.req, run.spec, run.sink).await
        })
    }
}
