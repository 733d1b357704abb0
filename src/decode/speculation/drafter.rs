//! What proposes draft tokens, and how a draft token is drawn. SD takes proposals from any
//! [`Drafter`] (a draft model, or a lookup in the text so far); SSD's draft worker draws its
//! tokens the same way ([`Drafting`]) but speculates on its own. The target verifies every
//! proposal, so a drafter decides speed only, never output.

use futures::future::LocalBoxFuture;

use super::accept::saguaro_rescale;
use super::config::SpecConfig;
use crate::decode::generation::costs::DraftCosts;
use crate::decode::generation::request::Request;
use crate::error::Result;
use crate::grammar::Constraint;
use crate::sampling::{self, Rng, SamplingParams};

/// Draft tokens and, when sampling, the distribution (over the whole vocabulary) each one was
/// drawn from: verification needs exactly that distribution.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// Empty when greedy.
    pub q: Vec<Vec<f32>>,
}

impl Proposal {
    /// Keep the first `n` tokens (and their distributions).
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.q.truncate(n);
    }
}

/// Per-token acceptance assumed for a draft model before any generation has measured it: a
/// draft of the target's family on code (measured 0.8-0.9).
pub const PRIOR_ACCEPTANCE: f64 = 0.8;

/// What a drafter costs where it runs, for the measured choice of mode, and the per-token
/// acceptance assumed for it until generations measure one.
#[derive(Clone, Copy, Debug)]
pub struct DraftTiming {
    pub costs: DraftCosts,
    pub prior: f64,
}

/// What SD takes its proposals from: a draft model (here, or on the draft worker), or a lookup
/// in the text so far. One drafter serves generation after generation, each begun with
/// [`Drafter::start`].
pub trait Drafter {
    /// What the statistics call it.
    fn name(&self) -> String;
    /// Take `req`'s prompt in, before the first round, to draft under `spec` (its confidence and
    /// draft candidates).
    fn start<'a>(&'a mut self, req: &'a Request, spec: &'a SpecConfig) -> LocalBoxFuture<'a, Result<()>>;
    /// Up to `n` tokens to follow the committed sequence, whose last token `rec` comes new.
    /// When sampling, each token comes with the distribution it was drawn from (`rng` draws).
    fn propose<'a>(
        &'a mut self,
        rec: u32,
        n: usize,
        params: &'a SamplingParams,
        rng: &'a mut Rng,
    ) -> LocalBoxFuture<'a, Result<Proposal>>;
    /// [`Drafter::propose`] under `grammar` (walked along the output so far, and left there):
    /// a drafter that runs here drafts only tokens it allows; by default the grammar is left to
    /// the caller, which cuts a proposal at the first token the grammar refuses.
    fn propose_under<'a>(
        &'a mut self,
        rec: u32,
        n: usize,
        params: &'a SamplingParams,
        rng: &'a mut Rng,
        _grammar: &'a mut Constraint,
    ) -> LocalBoxFuture<'a, Result<Proposal>> {
        self.propose(rec, n, params, rng)
    }
    /// The target accepted the first `accepted` tokens of the last proposal.
    fn accept(&mut self, proposal: &Proposal, accepted: usize);
    /// How many tokens this drafter can follow after `req`'s prompt.
    fn room(&self, req: &Request) -> usize;
    /// Milliseconds the drafter computed in this generation, where that differs from the time its
    /// proposals took to arrive (a drafter on another worker: the difference is their trips);
    /// `None`: the same.
    fn busy_ms(&self) -> Option<f64> {
        None
    }
    /// Whether it can draft now: one on a worker that stopped cannot.
    fn ready(&self) -> bool {
        true
    }
    /// Time it where it runs, with a tree step `tree_rows` wide where that is more than one.
    fn time(&mut self, tree_rows: usize) -> LocalBoxFuture<'_, Result<DraftTiming>>;
    /// Where its model runs, in words, when it holds one here.
    fn backend_name(&self) -> Option<String> {
        None
    }
}

/// Turns the draft's likeliest tokens into draft tokens when sampling.
///
/// The draft samples among its `candidates` likeliest tokens only: that many ids and logits per
/// row leave its backend instead of the whole vocabulary's logits (on a GPU, 64 x 8 bytes for a
/// row of 151,936 x 4). Verification is exact for any draft distribution, provided it is given
/// the one the token was drawn from, so this costs only the acceptance of the draft's tail mass
/// beyond its top `candidates`, never the output's distribution.
pub(crate) struct Drafting<'a> {
    pub params: &'a SamplingParams,
    pub rng: &'a mut Rng,
    /// Saguaro sampling: the factor C and, per draft position j, how many bonus candidates the
    /// fan-out takes for the outcome k = j. The draft scales that many of its top tokens, plus
    /// one for the token it is about to draft, which the fan-out will exclude.
    pub saguaro: Option<(f32, &'a [usize])>,
    /// How many of its likeliest tokens the draft samples among ([`SpecConfig::draft_candidates`]).
    ///
    /// [`SpecConfig::draft_candidates`]: super::SpecConfig::draft_candidates
    pub candidates: usize,
}

impl Drafting<'_> {
    /// How many of a row's likeliest tokens [`Drafting::draw`] needs: no more than the sampling's
    /// own top-k keeps.
    pub fn width(&self) -> usize {
        match self.params.top_k {
            0 => self.candidates,
            k => k.min(self.candidates),
        }
    }

    /// The draft token at position `j`, drawn among a row's likeliest tokens `ids` (ordered as
    /// [`TopK`](crate::backend::TopK) orders them) with their logits `values`, and the
    /// distribution over the `vocab` tokens it was drawn from.
    pub fn draw(&mut self, j: usize, ids: &[u32], values: &[f32], vocab: usize) -> (u32, Vec<f32>) {
        let mut q = sampling::probs_among(ids, values, vocab, self.params);
        if let Some((c, widths)) = self.saguaro {
            if c < 1.0 {
                let n = widths.get(j).copied().unwrap_or(0) + 1;
                let top = sampling::top_n(&q, n, None);
                saguaro_rescale(&mut q, &top, c);
            }
        }
        (sampling::sample(&q, self.rng), q)
    }
}

/// The draft's random stream: independent of the target's, or acceptance would correlate with
/// the draws it judges.
pub(crate) fn draft_rng(seed: u64) -> Rng {
    Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15)
}
