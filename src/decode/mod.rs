//! Generation strategies over (target, draft): plain autoregressive decoding, speculative
//! decoding (SD) and speculative speculative decoding (SSD). Strategies see models only through
//! [`Lm`](crate::model::runner::Lm); they never touch kernels.
//!
//! # One seam
//!
//! A mode is a [`Strategy`] (`strategy`): it knows its [`Mode`], whether it can run now, what its
//! rounds cost for the measured choice of mode and K (`choice`), and how to run a generation
//! ([`Run`]). Whatever it runs with beside the target is its own: SD's [`Drafter`] (a draft model
//! here, prompt lookup, or the draft worker), SSD's draft worker (and its own target on a share
//! of the CPU), a server that generates on its own for AR. The engine asks [`prepare`] (the
//! registration, below) for the strategies its placement allows ([`Placement`]) and holds them as
//! trait objects: it neither matches on modes nor keeps a field per mode.
//!
//! Adding a mode touches three files: the mode's own file (its `Strategy` and a `prepare` that
//! builds it from a `Placement`), `mode.rs` (its [`Mode`] variant and name, which the CLI and the
//! JS API list from [`Mode::ALL`]), and this file (its `mod` line and one line in [`prepare`]).
//!
//! # Layout, without import circles
//!
//! - `generation`: the frame every strategy shares (request, output, statistics with a server
//!   target's, the prefill, the target's rows, what a placement costs). It imports no strategy.
//! - `speculation`: what SD and SSD share (configuration, the drafter interface, the acceptance
//!   math, verification, the draft's KV-cache rules, the speculation tree); it imports
//!   `generation` only. SD (`speculative`, with its drafters `model_drafter` and `ngram`) and SSD
//!   (`ssd`) import neither each other; what composes them (SD drafting on SSD's worker) is
//!   registered here.
//! - `mode`, `strategy`, `choice`: the names, the seam, the arithmetic of the measured choice.
//!
//! This file declares and registers; no module of `decode` imports it, and `decode` imports
//! neither `crate::remote` (which builds on it: a server target implements [`SelfGenerating`])
//! nor `crate::engine`.
//!
//! # Many sequences
//!
//! `batch` runs several generations at once without a strategy knowing: each runs on its own
//! sequence of a shared target (and draft) (`model::shared`), whose forwards wait for the step
//! that runs them all as one batch; a generation's tokens are the ones it gets alone. AR and SD
//! run there; SSD's draft worker serves one sequence, so SSD does not batch.
//!
//! # Constrained decoding
//!
//! The constraint travels in the [`Request`], which every place that draws or judges a token
//! reads: the target's sampling (`generation::session`, `generation::target_rows`), the
//! drafter's draw (`speculation::Drafting`) and the verifier (`speculation::verify`), which masks
//! p and q alike so acceptance stays exact.

pub mod autoregressive;
pub mod batch;
pub mod choice;
pub mod generation;
pub mod model_drafter;
pub mod ngram;
pub mod speculation;
pub mod speculative;
pub mod ssd;
pub mod strategy;

pub use autoregressive::{generate_ar, Autoregressive};
pub use batch::{Batcher, BoxedSink, BATCHED};
pub use choice::Candidate;
pub(crate) use generation::costs::{probe, time_forwards};
pub(crate) use generation::{elapsed_ms, Output};
pub use generation::{
    CancelToken, Choice, Costs, DraftCosts, FinishReason, Generation, Observed, RemoteStats, Request, RoundTimes, Sink,
    Stats, MAX_K,
};
pub use model_drafter::ModelDrafter;
pub use ngram::PromptLookup;
pub use speculation::{
    check_draft, Backup, DraftTiming, Drafter, Fanout, NgramConfig, SpecConfig, DEFAULT_CONFIDENCE, DEFAULT_DRAFT_CANDIDATES,
};
pub use speculative::{generate_sd, generate_sd_with, Speculative};
pub use ssd::{generate_ssd, DraftHost, DraftWorker, SharedWorker, SpeculativeSpeculative, WorkerDrafter};
pub use strategy::{Mode, Placement, Run, SelfGenerating, Strategy};

use crate::error::Result;

/// The registration: every mode's strategy that `p` allows, AR first.
pub async fn prepare(p: &mut dyn Placement) -> Result<Vec<Box<dyn Strategy>>> {
    let mut strategies = Vec::new();
    strategies.extend(Autoregressive::prepare(p).await?);
    strategies.extend(Speculative::prepare(p).await?);
    strategies.extend(SpeculativeSpeculative::prepare(p).await?);
    Ok(strategies)
}

/// The strategies a draft worker attached later serves (in the browser, a draft in its own Web
/// Worker): SSD, and with `sd` SD too, one copy of the draft serving both.
pub fn on_worker(worker: DraftWorker, sd: bool) -> Vec<Box<dyn Strategy>> {
    let worker = SharedWorker::new(worker);
    let mut strategies: Vec<Box<dyn Strategy>> = Vec::new();
    if sd {
        strategies.push(Box::new(Speculative::new(Box::new(WorkerDrafter::shared(worker.clone())))));
    }
    strategies.push(Box::new(SpeculativeSpeculative::on_worker(worker)));
    strategies
}
