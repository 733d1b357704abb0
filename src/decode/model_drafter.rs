//! SD's draft model: it drafts autoregressively, and its KV cache follows the draft's rules in
//! `speculation`'s `kv` module (the committed sequence in front, the round's drafting as scratch
//! until the target's outcome).

use futures::future::LocalBoxFuture;

use super::generation::costs::DraftCosts;
use super::generation::request::{context_of, Request};
use super::speculation::{DraftKv, DraftLm, DraftTiming, Drafter, Drafting, Proposal, SpecConfig, PRIOR_ACCEPTANCE};
use crate::error::Result;
use crate::grammar::Constraint;
use crate::sampling::{Rng, SamplingParams};

/// A draft model drafting autoregressively for SD: borrowed for one generation
/// ([`generate_sd`](super::speculative::generate_sd)), or owned by the engine's SD.
pub struct ModelDrafter<M: DraftLm> {
    kv: DraftKv<M>,
    /// See [`SpecConfig::confidence`].
    confidence: f32,
    /// See [`SpecConfig::draft_candidates`].
    candidates: usize,
}

impl<M: DraftLm> ModelDrafter<M> {
    /// A drafter on `lm`; each generation's [`SpecConfig`] sets how it drafts.
    pub fn new(lm: M) -> Self {
        let spec = SpecConfig::default();
        ModelDrafter { kv: DraftKv::new(lm), confidence: spec.confidence, candidates: spec.draft_candidates }
    }
}

impl<M: DraftLm> Drafter for ModelDrafter<M> {
    fn name(&self) -> String {
        "model".into()
    }

    fn start<'a>(&'a mut self, req: &'a Request, spec: &'a SpecConfig) -> LocalBoxFuture<'a, Result<()>> {
        (self.confidence, self.candidates) = (spec.confidence, spec.draft_candidates);
        Box::pin(self.kv.prefill(&req.prompt))
    }

    fn propose<'a>(
        &'a mut self,
        rec: u32,
        n: usize,
        params: &'a SamplingParams,
        rng: &'a mut Rng,
    ) -> LocalBoxFuture<'a, Result<Proposal>> {
        Box::pin(async move {
            let mut drafting = Drafting { params, rng, saguaro: None, candidates: self.candidates };
            self.kv.draft(rec, n, self.confidence, &mut drafting, None).await
        })
    }

    fn propose_under<'a>(
        &'a mut self,
        rec: u32,
        n: usize,
        params: &'a SamplingParams,
        rng: &'a mut Rng,
        grammar: &'a mut Constraint,
    ) -> LocalBoxFuture<'a, Result<Proposal>> {
        Box::pin(async move {
            let mut drafting = Drafting { params, rng, saguaro: None, candidates: self.candidates };
            self.kv.draft(rec, n, self.confidence, &mut drafting, Some(grammar)).await
        })
    }

    fn room(&self, req: &Request) -> usize {
        let lm = self.kv.model();
        req.room(context_of(lm.config(), lm.capacity(), 0))
    }

    fn accept(&mut self, _: &Proposal, accepted: usize) {
        self.kv.resolve(accepted);
    }

    fn time(&mut self, tree_rows: usize) -> LocalBoxFuture<'_, Result<DraftTiming>> {
        Box::pin(async move {
            let costs: DraftCosts = self.kv.measure(tree_rows).await?;
            Ok(DraftTiming { costs, prior: PRIOR_ACCEPTANCE })
        })
    }

    fn backend_name(&self) -> Option<String> {
        Some(self.kv.model().backend_name())
    }
}
