//! What speculative decoding (SD) and speculative speculative decoding (SSD) share. It imports
//! neither of them; both build on it alone (and on the rest of `decode`: the request, the output,
//! the statistics).
//!
//! - `config`: the mode, [`SpecConfig`] with SSD's [`Fanout`] and [`Backup`], and the check that
//!   a draft speaks the target's vocabulary.
//! - `drafter`: a [`Proposal`], the [`Drafter`] interface SD takes proposals from, and how a
//!   draft token is drawn.
//! - `accept`: the acceptance math: the accept test, the residual distribution and Saguaro's
//!   rescaling of the draft's.
//! - `verify`: the target's judgement of a proposal, greedy or by the exact rejection sampling,
//!   into the outcome (k, t*).
//! - `kv`: the draft's KV cache, committed prefix against speculation scratch: its rules, stated
//!   once, and the one type that writes the draft model.
//! - `tree`: SSD's speculation [`Tree`], its batches and the slots it writes.
//! - `tally`: the per-round statistics both report.
//! - `adapt`: SD's K chosen again after every round from the acceptance seen so far.

pub mod accept;
mod adapt;
mod config;
mod drafter;
mod kv;
mod tally;
mod tree;
mod verify;

pub use adapt::{judged, AdaptiveK, BatchSize};
pub use config::{
    check_draft, Backup, Fanout, Fault, NgramConfig, SpecConfig, DEFAULT_CONFIDENCE, DEFAULT_DRAFT_CANDIDATES, DEFAULT_WIDTH,
};
pub(crate) use drafter::{draft_rng, Drafting};
pub use drafter::{DraftTiming, Drafter, Proposal, PRIOR_ACCEPTANCE};
pub(crate) use kv::DraftKv;
pub use kv::DraftLm;
pub(crate) use tally::{timed, Tally};
pub use tree::Tree;
pub(crate) use verify::verify;
pub use verify::Outcome;
