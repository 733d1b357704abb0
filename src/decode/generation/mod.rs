//! The frame every strategy shares, whatever its mode: the [`Request`], the output as it is
//! committed ([`Output`], into a [`Sink`]), the target's prefill and first token (`session`),
//! the statistics ([`Stats`], with a server target's [`RemoteStats`]), what leaves the target's
//! backend when it samples (`target_rows`), and what a placement costs ([`Costs`]). It imports no
//! strategy.

pub mod costs;
pub mod output;
pub mod request;
pub(crate) mod session;
pub mod stats;
pub(crate) mod target_rows;

pub use costs::{Choice, Costs, DraftCosts, Observed, MAX_K};
pub use output::{FinishReason, Generation, Sink};
pub(crate) use output::Output;
pub use request::{CancelToken, Request};
pub(crate) use stats::elapsed_ms;
pub use stats::{RemoteStats, RoundTimes, Stats};
