//! Many generations at once: continuous batching over shared models ([`Shared`]). Each
//! generation is the strategy's own (AR's or SD's, unchanged) running on its sequence of the
//! shared target (and draft); [`Batcher::step`] lets every generation run until it waits for a
//! forward, then runs the waiting forwards as one batch. Generations join and leave between
//! steps; one that ends, fails or is cancelled frees its regions and leaves the others running.
//! Since a row's result does not depend on its batch, each generation's tokens are the ones it
//! would get alone, in every mode.
//!
//! A step runs the draft's forward for the sequences that draft, then the target's for those
//! that decode, prefill or verify: a sequence decoding by AR never waits for another's drafting,
//! and sequences of one K draft in step and verify together.

use std::task::{Context, Poll};

use futures::future::LocalBoxFuture;

use super::autoregressive::generate_ar;
use super::generation::output::Generation;
use super::generation::request::Request;
use super::speculation::SpecConfig;
use super::speculative::generate_sd;
use super::strategy::Mode;
use crate::error::{Error, Result};
use crate::model::shared::Shared;

/// The modes that run in a batch: SSD's speculation serves one sequence.
pub const BATCHED: [Mode; 2] = [Mode::Ar, Mode::Sd];

/// Where a joining generation's tokens go as they are committed; `false` cancels it.
pub type BoxedSink<'a> = Box<dyn FnMut(&[u32]) -> bool + 'a>;

/// The generations running on a shared target (and draft).
pub struct Batcher<'a> {
    target: Shared,
    draft: Option<Shared>,
    live: Vec<(u64, LocalBoxFuture<'a, Result<Generation>>)>,
    next: u64,
}

impl<'a> Batcher<'a> {
    pub fn new(target: Shared, draft: Option<Shared>) -> Self {
        Batcher { target, draft, live: Vec::new(), next: 0 }
    }

    pub fn target(&self) -> &Shared {
        &self.target
    }

    pub fn draft(&self) -> Option<&Shared> {
        self.draft.as_ref()
    }

    /// Generations that can join now: the target's free regions (a draft has as many regions,
    /// and only SD takes one of it beside one of the target's).
    pub fn free(&self) -> usize {
        self.target.free()
    }

    /// Generations running.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Start generating `req` in `mode` (AR, or SD with `spec`); returns its id. Refused when
    /// the mode does not run in a batch or no region is free.
    pub fn join(&mut self, req: Request, mode: Mode, spec: &SpecConfig, mut sink: BoxedSink<'a>) -> Result<u64> {
        let busy = || Error::InvalidArgument("every sequence of the batch is taken".into());
        let mut target = self.target.sequence().ok_or_else(busy)?;
        let run: LocalBoxFuture<'a, Result<Generation>> = match mode {
            Mode::Ar => Box::pin(async move { generate_ar(&mut target, &req, &mut *sink).await }),
            Mode::Sd => {
                let no_draft = || Error::InvalidArgument("sd in a batch needs a draft model".into());
                let mut draft = self.draft.as_ref().ok_or_else(no_draft)?.sequence().ok_or_else(busy)?;
                let spec = spec.clone();
                Box::pin(async move { generate_sd(&mut target, &mut draft, &req, &spec, &mut *sink).await })
            }
            other => {
                let batched: Vec<&str> = BATCHED.iter().map(|m| m.name()).collect();
                return Err(Error::InvalidArgument(format!("{} does not run in a batch ({} do)", other.name(), batched.join(" and "))));
            }
        };
        self.next += 1;
        self.live.push((self.next, run));
        Ok(self.next)
    }

    /// Stop generation `id` now (its client went away), freeing its regions.
    pub fn cancel(&mut self, id: u64) {
        self.live.retain(|(i, _)| *i != id);
    }

    /// Run every generation until it waits for a forward, then the draft's batch and the
    /// target's, each where a sequence asked for it. Returns the generations that ended, with
    /// their ids.
    pub async fn step(&mut self) -> Vec<(u64, Result<Generation>)> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut done = Vec::new();
        self.live.retain_mut(|(id, run)| match run.as_mut().poll(&mut cx) {
            Poll::Ready(result) => {
                done.push((*id, result));
                false
            }
            Poll::Pending => true,
        });
        let drafted = match &self.draft {
            Some(d) => d.round().await,
            None => 0,
        };
        let served = drafted + self.target.round().await;
        // Every generation here waits only for forwards: one that waits for nothing asked would
        // never wake.
        if served == 0 && done.is_empty() {
            for (id, _) in self.live.drain(..) {
                done.push((id, Err(Error::Worker("a batched generation waited without asking for a forward".into()))));
            }
        }
        done
    }

    /// Step until every generation has ended; their results in the order they ended.
    pub async fn finish(&mut self) -> Vec<(u64, Result<Generation>)> {
        let mut done = Vec::new();
        while !self.live.is_empty() {
            done.extend(self.step().await);
        }
        done
    }
}
