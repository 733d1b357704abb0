//! The one seam between the engine and the decoding modes. A mode is a [`Strategy`]: prepared
//! once from what the engine placed ([`Placement`]), holding whatever it runs with beside the
//! target (a draft model, prompt lookup, the draft worker, a server that generates on its own),
//! and run once per generation ([`Run`]). The engine keeps the prepared strategies as trait
//! objects and never matches on modes. [`Mode`] names the modes, once.

use futures::future::LocalBoxFuture;

mod mode;

pub use mode::Mode;

use crate::decode::generation::costs::{Choice, Costs};
use crate::decode::generation::output::{Generation, Sink};
use crate::decode::generation::request::Request;
use crate::decode::speculation::{DraftTiming, NgramConfig, SpecConfig};
use crate::error::Result;
use crate::model::runner::{BoxedLm, Lm};

/// One generation, as the engine hands it to a strategy.
pub struct Run<'a> {
    /// The engine's target (a strategy may run on a target of its own instead, see
    /// [`Placement::target_beside`]).
    pub target: &'a mut dyn Lm,
    pub req: &'a Request,
    pub spec: &'a SpecConfig,
    pub sink: Sink<'a>,
}

/// A decoding mode, prepared.
pub trait Strategy {
    /// The mode it runs.
    fn mode(&self) -> Mode;
    /// Whether it can run now: one whose draft worker stopped cannot, until another is attached.
    fn ready(&self) -> bool {
        true
    }
    /// Whether it verifies draft tokens with the target's rows (a server target's top-n then
    /// bounds the sampling it can keep exact); AR reads only the tokens the target picks.
    fn verifies(&self) -> bool {
        true
    }
    /// How strongly it is the default when no measured choice was made (the highest wins).
    fn preference(&self) -> u8;
    /// For the measured choice: what a round drafting `k` tokens costs at `costs` under the
    /// engine's `spec`; `None`: not a candidate at that K (AR is the baseline, never one).
    fn round_ms(&self, _costs: &Costs, _spec: &SpecConfig, _k: usize) -> Option<f64> {
        None
    }
    /// Time its drafter where it runs (a tree step `tree_rows` wide where that is more than
    /// one), for the measured choice; `None` where it has none to time.
    fn time_draft(&mut self, _tree_rows: usize) -> Option<LocalBoxFuture<'_, Result<DraftTiming>>> {
        None
    }
    /// Adjust a generation's `spec` that follows the measured `choice` (SD chooses K again
    /// round by round).
    fn tune(&self, _spec: &mut SpecConfig, _choice: &Choice) {}
    /// Where a draft model it holds here runs, in words.
    fn draft_backend(&self) -> Option<String> {
        None
    }
    /// Run one generation.
    fn generate<'a>(&'a mut self, run: Run<'a>) -> LocalBoxFuture<'a, Result<Generation>>;
}

/// What the engine placed, for the strategies to prepare themselves with.
pub trait Placement {
    /// The modes asked for; empty: every mode the models allow.
    fn modes(&self) -> &[Mode];
    /// The target's vocabulary size.
    fn vocab(&self) -> usize;
    /// Prompt lookup, where it replaces a draft model.
    fn lookup(&self) -> Option<NgramConfig>;
    /// A draft model instance on the draft's device, with room for the speculation scratch (the
    /// target's weights where no draft was given); `None` where there are no weights to draft with.
    fn draft(&mut self) -> LocalBoxFuture<'_, Result<Option<BoxedLm>>>;
    /// Like [`Placement::draft`], to run beside the target: on the cores left to it where both
    /// share the CPU.
    fn draft_beside(&mut self) -> LocalBoxFuture<'_, Result<Option<BoxedLm>>>;
    /// Whether a draft that runs beside the target gets a thread of its own (else it runs
    /// inline: the same tokens, no overlap).
    fn draft_thread(&self) -> bool;
    /// A target instance on the cores left to it where a draft runs beside it on the same CPU;
    /// `None` where the engine's target serves.
    fn target_beside(&mut self) -> LocalBoxFuture<'_, Result<Option<BoxedLm>>>;
    /// The target as a whole generator where it is one (a server); taken once.
    fn server(&mut self) -> Option<Box<dyn SelfGenerating>>;
}

impl dyn Placement + '_ {
    /// Whether `mode` is to be prepared.
    pub fn wants(&self, mode: Mode) -> bool {
        self.modes().is_empty() || self.modes().contains(&mode)
    }
}

/// A target that generates on its own (a server): AR hands it the whole generation.
pub trait SelfGenerating {
    fn generate<'a>(&'a mut self, req: &'a Request, sink: Sink<'a>) -> LocalBoxFuture<'a, Result<Generation>>;
}
