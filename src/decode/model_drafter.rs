//! SD's draft model: it drafts autoregressively, and its KV cache follows the draft's rules in
//! `spec`'s `kv` module (the committed sequence in front, the round's drafting as scratch until
//! the target's outcome).

use futures::future::LocalBoxFuture;

use super::spec::{DraftKv, Drafter, Drafting, Proposal};
use super::{context_of, Request, SpecConfig};
use crate::error::Result;
use crate::model::runner::Lm;
use crate::sampling::{Rng, SamplingParams};

/// A draft model drafting autoregressively for SD.
pub struct ModelDrafter<'a> {
    kv: DraftKv<&'a mut dyn Lm>,
    /// See [`SpecConfig::confidence`].
    confidence: f32,
    /// See [`SpecConfig::draft_candidates`].
    candidates: usize,
}

impl<'a> ModelDrafter<'a> {
    /// A drafter on `lm` under `spec` (its confidence and draft candidates concern drafting).
    pub fn new(lm: &'a mut dyn Lm, spec: &SpecConfig) -> Self {
        ModelDrafter { kv: DraftKv::new(lm), confidence: spec.confidence, candidates: spec.draft_candidates }
    }
}

impl Drafter for ModelDrafter<'_> {
    fn name(&self) -> String {
        "model".into()
    }

    fn start<'a>(&'a mut self, prompt: &'a [u32]) -> LocalBoxFuture<'a, Result<()>> {
        Box::pin(self.kv.prefill(prompt))
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
            self.kv.draft(rec, n, self.confidence, &mut drafting).await
        })
    }

    fn room(&self, req: &Request) -> usize {
        let lm = self.kv.model();
        req.room(context_of(lm.config(), lm.capacity(), 0))
    }

    fn accept(&mut self, _: &Proposal, accepted: usize) {
        self.kv.resolve(accepted);
    }
}
