//! What proposes tokens for SD to verify: a draft model ([`ModelDrafter`]) or a lookup in the text
//! so far ([`PromptLookup`](super::ngram::PromptLookup)). The target verifies every proposal, so
//! a drafter decides speed only, never output.

use futures::future::LocalBoxFuture;

use super::speculative::{draft, Drafting, Proposal};
use super::{context_of, Request};
use crate::error::Result;
use crate::model::runner::{append, Lm, Want};
use crate::sampling::{Rng, SamplingParams};

pub trait Drafter {
    /// What the statistics call it.
    fn name(&self) -> String;
    /// Take the prompt in, before the first round.
    fn start<'a>(&'a mut self, prompt: &'a [u32]) -> LocalBoxFuture<'a, Result<()>>;
    /// Up to `n` tokens to follow the committed sequence, whose last token `rec` comes new.
    /// When sampling, each token comes with the distribution it was drawn from (`rng` draws).
    fn propose<'a>(
        &'a mut self,
        rec: u32,
        n: usize,
        params: &'a SamplingParams,
        rng: &'a mut Rng,
    ) -> LocalBoxFuture<'a, Result<Proposal>>;
    /// The target accepted the first `accepted` tokens of the last proposal.
    fn accept(&mut self, proposal: &Proposal, accepted: usize);
    /// How many tokens this drafter can follow after `req`'s prompt.
    fn room(&self, req: &Request) -> usize;
}

/// A draft model drafting autoregressively. Its KV cache holds the committed sequence, less what
/// it has not been fed yet; after a round it keeps what the target accepted.
pub struct ModelDrafter<'a> {
    lm: &'a mut dyn Lm,
    /// Committed tokens the draft's cache does not hold yet.
    pending: Vec<u32>,
    /// What the last proposal fed, and the cache length before it.
    feed: Vec<u32>,
    start: usize,
}

impl<'a> ModelDrafter<'a> {
    pub fn new(lm: &'a mut dyn Lm) -> Self {
        ModelDrafter { lm, pending: Vec::new(), feed: Vec::new(), start: 0 }
    }
}

impl Drafter for ModelDrafter<'_> {
    fn name(&self) -> String {
        "model".into()
    }

    fn start<'a>(&'a mut self, prompt: &'a [u32]) -> LocalBoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.lm.truncate(0);
            self.pending.clear();
            append(self.lm, prompt, Want::LastLogits).await?;
            Ok(())
        })
    }

    fn propose<'a>(
        &'a mut self,
        rec: u32,
        n: usize,
        params: &'a SamplingParams,
        rng: &'a mut Rng,
    ) -> LocalBoxFuture<'a, Result<Proposal>> {
        Box::pin(async move {
            self.start = self.lm.len();
            self.feed = std::mem::take(&mut self.pending);
            self.feed.push(rec);
            let mut drafting = Drafting { params, rng, saguaro: None };
            draft(self.lm, &self.feed, n, &mut drafting).await
        })
    }

    fn room(&self, req: &Request) -> usize {
        req.room(context_of(self.lm.config(), self.lm.capacity(), 0))
    }

    fn accept(&mut self, proposal: &Proposal, accepted: usize) {
        // The cache holds the feed and the first n - 1 draft tokens; keep what was committed.
        let n = proposal.tokens.len();
        if n == 0 {
            self.pending = std::mem::take(&mut self.feed);
            return;
        }
        self.lm.truncate(self.start + self.feed.len() + accepted.min(n - 1));
        if accepted == n {
            self.pending.push(proposal.tokens[n - 1]);
        }
    }
}
