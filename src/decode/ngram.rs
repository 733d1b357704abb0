//! Prompt-lookup drafting: propose what followed the last place where the text so far (prompt and
//! output) ended the same way. No draft model runs, so a proposal costs next to nothing; it is
//! accepted where the output copies its input (edits, refactors, summaries quoting the source).

use futures::future::{ready, LocalBoxFuture};

use super::generation::costs::DraftCosts;
use super::generation::request::Request;
use super::speculation::{DraftTiming, Drafter, NgramConfig, Proposal, SpecConfig};
use crate::error::Result;
use crate::sampling::{Rng, SamplingParams};

/// Per-token acceptance assumed for prompt lookup before any generation has measured it: on text
/// that partly copies its input.
const PRIOR_LOOKUP_ACCEPTANCE: f64 = 0.6;

pub struct PromptLookup {
    config: NgramConfig,
    vocab: usize,
    /// The committed sequence so far.
    history: Vec<u32>,
}

impl PromptLookup {
    /// A drafter for a target with `vocab` tokens.
    pub fn new(config: NgramConfig, vocab: usize) -> Result<Self> {
        config.validate()?;
        Ok(PromptLookup { config, vocab, history: Vec::new() })
    }

    /// Up to `n` tokens that followed the latest earlier occurrence of the longest suffix of the
    /// history (between `min` and `max` tokens) that occurred before.
    pub fn lookup(&self, n: usize) -> &[u32] {
        let h = &self.history;
        for len in (self.config.min..=self.config.max).rev() {
            let Some(at) = h.len().checked_sub(len) else { continue };
            let suffix = &h[at..];
            if let Some(i) = (0..at).rev().find(|&i| &h[i..i + len] == suffix) {
                let from = i + len;
                return &h[from..(from + n).min(h.len())];
            }
        }
        &[]
    }
}

impl Drafter for PromptLookup {
    fn name(&self) -> String {
        "ngram".into()
    }

    fn start<'a>(&'a mut self, req: &'a Request, _: &'a SpecConfig) -> LocalBoxFuture<'a, Result<()>> {
        self.history = req.prompt.to_vec();
        Box::pin(ready(Ok(())))
    }

    /// When sampling, each token was "drawn" from a point mass: verification then accepts it with
    /// the target's probability of it, and on a rejection samples from the target without it.
    fn propose<'a>(
        &'a mut self,
        rec: u32,
        n: usize,
        params: &'a SamplingParams,
        _rng: &'a mut Rng,
    ) -> LocalBoxFuture<'a, Result<Proposal>> {
        self.history.push(rec);
        let tokens = self.lookup(n).to_vec();
        let q = if params.is_greedy() {
            Vec::new()
        } else {
            let one_hot = |t: u32| {
                let mut q = vec![0.0; self.vocab];
                q[t as usize] = 1.0;
                q
            };
            tokens.iter().map(|&t| one_hot(t)).collect()
        };
        Box::pin(ready(Ok(Proposal { tokens, q })))
    }

    /// Lookups read the text itself, which has no window.
    fn room(&self, _: &Request) -> usize {
        usize::MAX
    }

    fn accept(&mut self, proposal: &Proposal, accepted: usize) {
        self.history.extend_from_slice(&proposal.tokens[..accepted]);
    }

    /// A lookup costs next to nothing and runs on no hardware of its own.
    fn time(&mut self, _: usize) -> LocalBoxFuture<'_, Result<DraftTiming>> {
        Box::pin(ready(Ok(DraftTiming { costs: DraftCosts { step_ms: 0.0, tree_step: None }, prior: PRIOR_LOOKUP_ACCEPTANCE })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(history: &[u32], n: usize, config: NgramConfig) -> Vec<u32> {
        let mut p = PromptLookup::new(config, 100).unwrap();
        p.history = history.to_vec();
        p.lookup(n).to_vec()
    }

    #[test]
    fn proposes_what_followed_the_latest_longest_match() {
        let c = NgramConfig { min: 1, max: 3 };
        // "1 2 3" occurred at 0 and 5 and ends the history: the latest occurrence wins.
        assert_eq!(lookup(&[1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 8, 1, 2, 3], 3, c), vec![6, 7, 8]);
        // The longest suffix decides before recency: "9 1 2" beats the later "2".
        assert_eq!(lookup(&[9, 1, 2, 5, 5, 2, 7, 9, 1, 2], 2, c), vec![5, 5]);
        // The continuation stops at the end of the history.
        assert_eq!(lookup(&[4, 5, 6, 4, 5], 4, c), vec![6, 4, 5]);
        assert_eq!(lookup(&[1, 2, 3], 4, c), Vec::<u32>::new());
        assert_eq!(lookup(&[], 4, c), Vec::<u32>::new());
        // Below the minimum length nothing matches.
        assert_eq!(lookup(&[1, 2, 3, 1], 4, NgramConfig { min: 2, max: 3 }), Vec::<u32>::new());
    }

    #[test]
    fn sampled_proposals_come_with_point_masses() {
        let mut p = PromptLookup::new(NgramConfig::default(), 10).unwrap();
        let req = Request { prompt: vec![1, 2, 3, 1], ..Request::default() };
        futures::executor::block_on(p.start(&req, &SpecConfig::default())).unwrap();
        let params = SamplingParams { temperature: 1.0, ..SamplingParams::default() };
        let prop = futures::executor::block_on(p.propose(2, 3, &params, &mut Rng::new(0))).unwrap();
        assert_eq!(prop.tokens, vec![3, 1, 2]);
        assert_eq!(prop.q.len(), 3);
        assert!(prop.q.iter().zip(&prop.tokens).all(|(q, &t)| q[t as usize] == 1.0 && q.iter().sum::<f32>() == 1.0));
        p.accept(&prop, 2);
        assert_eq!(p.history, vec![1, 2, 3, 1, 2, 3, 1]);
        assert!(NgramConfig { min: 0, max: 2 }.validate().is_err());
        assert!(NgramConfig { min: 3, max: 2 }.validate().is_err());
    }
}
