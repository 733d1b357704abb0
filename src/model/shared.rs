//! One model instance serving several sequences at once. Each sequence holds a region of one
//! KV cache, bounded when the instance is made, and sees the model as an [`Lm`] of its own
//! ([`SeqLm`]), so every decoding strategy runs on it unchanged. The forwards the sequences ask
//! for wait until [`Shared::round`], which runs them all as one batch: one matmul over all their
//! rows (the weights read once), attention over each row's own sequence ([`Mask`]'s `base`).
//! A row's result does not depend on the rows beside it (every backend computes a row, and each
//! head of it, as it would alone), so a sequence's tokens are the ones it would get alone.
//!
//! A [`SeqLm`]'s forward completes only when something calls [`Shared::round`]: it is driven by
//! a scheduler (`decode::batch`), never awaited on its own.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures::future::LocalBoxFuture;

use crate::backend::{Allowed, Batch, Draw, Drawn, Mask, TopK, NO_SLOT};
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::config::ModelConfig;
use crate::model::runner::{BoxedLm, Lm, Readout, Reply};

/// Regions start at multiples of this many slots: the GPU's attention walks the cache in chunks
/// of 64 slots from a multiple of 64, so a sequence's chunks fall where they would alone.
const REGION_ALIGN: usize = 64;

/// Rows of a prompt's prefill that run in one round beside other sequences' forwards; the rest
/// wait for the next rounds, so that a long prompt joining does not stall the others for its
/// whole prefill. (A prefill alone runs whole.)
pub const PREFILL_CHUNK: usize = 32;

/// A model whose KV cache is cut into regions of `context` slots, one per sequence.
#[derive(Clone)]
pub struct Shared {
    inner: Rc<RefCell<Inner>>,
}

struct Inner {
    /// `None` while a round runs.
    lm: Option<BoxedLm>,
    config: ModelConfig,
    backend: String,
    context: usize,
    region: usize,
    free: Vec<u32>,
    asks: Vec<Ask>,
    forwards: u64,
}

/// One sequence's forward, waiting for the round.
struct Ask {
    base: u32,
    batch: Batch,
    rows: Vec<u32>,
    readout: Readout,
    reply: Rc<RefCell<Option<Result<Reply>>>>,
}

impl Shared {
    /// Share `lm`, whose cache holds `sequences` regions of [`Shared::region`]`(context)` slots,
    /// among up to `sequences` sequences of up to `context` tokens each.
    pub fn new(lm: BoxedLm, context: usize, sequences: usize) -> Result<Shared> {
        let region = Self::region(context);
        if context == 0 || sequences == 0 || lm.capacity() < region * sequences {
            return Err(Error::InvalidArgument(format!(
                "a cache of {} slots holds no {sequences} sequences of {context} tokens",
                lm.capacity()
            )));
        }
        let inner = Inner {
            config: lm.config().clone(),
            backend: lm.backend_name(),
            lm: Some(lm),
            context,
            region,
            free: (0..sequences as u32).rev().collect(),
            asks: Vec::new(),
            forwards: 0,
        };
        Ok(Shared { inner: Rc::new(RefCell::new(inner)) })
    }

    /// The slots one sequence of `context` tokens takes in the cache.
    pub fn region(context: usize) -> usize {
        context.next_multiple_of(REGION_ALIGN)
    }

    /// A new sequence in a free region; `None` when every region is taken.
    pub fn sequence(&self) -> Option<SeqLm> {
        let mut inner = self.inner.borrow_mut();
        let region = inner.free.pop()?;
        Some(SeqLm {
            base: region * inner.region as u32,
            region,
            kv: KvCache::new((), inner.context),
            config: inner.config.clone(),
            backend: inner.backend.clone(),
            shared: self.inner.clone(),
        })
    }

    /// Regions free for new sequences.
    pub fn free(&self) -> usize {
        self.inner.borrow().free.len()
    }

    /// Where the model computes (its backend's name).
    pub fn backend_name(&self) -> String {
        self.inner.borrow().backend.clone()
    }

    pub fn config(&self) -> ModelConfig {
        self.inner.borrow().config.clone()
    }

    /// Forwards run so far.
    pub fn forwards(&self) -> u64 {
        self.inner.borrow().forwards
    }

    /// Whether a sequence waits for a forward.
    pub fn asked(&self) -> bool {
        !self.inner.borrow().asks.is_empty()
    }

    /// Run every forward the sequences asked for since the last round as one batch and hand each
    /// its readout; returns how many sequences it served. Where the forward fails, every
    /// sequence in it gets the error.
    pub async fn round(&self) -> usize {
        let (mut asks, mut lm) = {
            let mut inner = self.inner.borrow_mut();
            if inner.asks.is_empty() {
                return 0;
            }
            let Some(lm) = inner.lm.take() else { return 0 };
            inner.forwards += 1;
            (std::mem::take(&mut inner.asks), lm)
        };
        let later: Vec<Ask> = if asks.len() > 1 { asks.iter_mut().filter_map(split_prefill).collect() } else { Vec::new() };
        let (batch, parts) = combine(&asks, lm.config().vocab_size);
        let result = lm.readouts(&batch, &parts).await;
        let mut inner = self.inner.borrow_mut();
        inner.lm = Some(lm);
        inner.asks.extend(later);
        // A prefill's first chunk reads nothing back: only the asks with rows have a reply.
        let answered = asks.iter().filter(|a| !a.rows.is_empty());
        match result {
            Ok(replies) => {
                for (ask, reply) in answered.zip(replies) {
                    *ask.reply.borrow_mut() = Some(Ok(reply));
                }
            }
            Err(e) => {
                let message = e.to_string();
                for ask in answered {
                    *ask.reply.borrow_mut() = Some(Err(Error::Worker(format!("a shared forward failed: {message}"))));
                }
            }
        }
        asks.len()
    }
}

/// Cut a causal prefill longer than [`PREFILL_CHUNK`] whose output rows all lie past its first
/// chunk: `ask` becomes the first chunk (no output), the rest is returned to ask again next
/// round. A row's K and V do not depend on the rows run beside it, so the prefill's result is
/// the one it gets whole.
fn split_prefill(ask: &mut Ask) -> Option<Ask> {
    let b = &ask.batch;
    let start = *b.slots.first()? as usize;
    let causal = Batch { allowed: b.allowed.clone(), ..Batch::causal(&b.tokens, start) };
    if b.len() <= PREFILL_CHUNK || *b != causal || ask.rows.iter().any(|&r| (r as usize) < PREFILL_CHUNK) {
        return None;
    }
    let rest = Ask {
        base: ask.base,
        batch: Batch { allowed: b.allowed.clone(), ..Batch::causal(&b.tokens[PREFILL_CHUNK..], start + PREFILL_CHUNK) },
        rows: ask.rows.iter().map(|r| r - PREFILL_CHUNK as u32).collect(),
        readout: ask.readout.clone(),
        reply: ask.reply.clone(),
    };
    ask.batch = Batch::causal(&b.tokens[..PREFILL_CHUNK], start);
    ask.rows.clear();
    ask.reply = Rc::default();
    Some(rest)
}

/// The asks as one batch: their rows one after another, each sequence's slots moved to its
/// region; and each ask's output rows, renumbered, with its readout.
fn combine(asks: &[Ask], vocab: usize) -> (Batch, Vec<(Vec<u32>, Readout)>) {
    let stride = asks.iter().map(|a| a.batch.mask.extra_stride).max().unwrap_or(0);
    let mut batch = Batch {
        tokens: Vec::new(),
        positions: Vec::new(),
        slots: Vec::new(),
        mask: Mask { prefix: Vec::new(), extra_stride: stride, extra: Vec::new(), base: Vec::new() },
        allowed: None,
    };
    let masked = asks.iter().any(|a| a.batch.allowed.is_some());
    let mut allowed = Allowed::new(vocab);
    let mut parts = Vec::with_capacity(asks.len());
    for ask in asks {
        let (b, at) = (&ask.batch, batch.len() as u32);
        let moved = |s: &u32| if *s == NO_SLOT { NO_SLOT } else { s + ask.base };
        batch.tokens.extend_from_slice(&b.tokens);
        batch.positions.extend_from_slice(&b.positions);
        batch.slots.extend(b.slots.iter().map(moved));
        batch.mask.prefix.extend(b.mask.prefix.iter().map(|p| p + ask.base));
        batch.mask.base.extend(std::iter::repeat_n(ask.base, b.len()));
        for r in 0..b.len() {
            let row = &b.mask.extra[r * b.mask.extra_stride..(r + 1) * b.mask.extra_stride];
            batch.mask.extra.extend(row.iter().map(moved));
            batch.mask.extra.extend(std::iter::repeat_n(NO_SLOT, stride - row.len()));
        }
        if ask.rows.is_empty() {
            continue;
        }
        if masked {
            for r in 0..ask.rows.len() {
                match &b.allowed {
                    Some(a) => allowed.push(a.row(r)),
                    None => allowed.push_all(),
                }
            }
        }
        parts.push((ask.rows.iter().map(|r| r + at).collect(), ask.readout.clone()));
    }
    if masked {
        batch.allowed = Some(std::sync::Arc::new(allowed));
    }
    (batch, parts)
}

/// One sequence of a [`Shared`] model: its region of the cache, its committed length. Dropping
/// it frees the region.
pub struct SeqLm {
    shared: Rc<RefCell<Inner>>,
    region: u32,
    base: u32,
    kv: KvCache<()>,
    config: ModelConfig,
    backend: String,
}

impl Drop for SeqLm {
    fn drop(&mut self) {
        // An ask left behind would write into the region after its next owner took it.
        let mut inner = self.shared.borrow_mut();
        inner.asks.retain(|a| a.base != self.base);
        inner.free.push(self.region);
    }
}

impl SeqLm {
    /// Ask for `batch`'s forward in the next round. What would fail the shared forward for
    /// everyone is refused here, for this sequence alone.
    fn ask<'a>(&'a mut self, batch: &'a Batch, rows: &'a [u32], readout: Readout) -> LocalBoxFuture<'a, Result<Reply>> {
        Box::pin(async move {
            self.check(batch, rows)?;
            let reply = Rc::new(RefCell::new(None));
            let ask = Ask { base: self.base, batch: batch.clone(), rows: rows.to_vec(), readout, reply: reply.clone() };
            self.shared.borrow_mut().asks.push(ask);
            Answered(reply).await
        })
    }

    fn check(&self, batch: &Batch, rows: &[u32]) -> Result<()> {
        let m = batch.len();
        let mask = &batch.mask;
        let shaped = m > 0
            && batch.positions.len() == m
            && batch.slots.len() == m
            && mask.prefix.len() == m
            && mask.extra.len() == m * mask.extra_stride
            && mask.base.is_empty()
            && !rows.is_empty()
            && rows.iter().all(|&r| (r as usize) < m)
            && batch.allowed.as_ref().is_none_or(|a| a.rows() == rows.len() && a.cols() == self.config.vocab_size);
        if !shaped {
            return Err(Error::InvalidArgument(format!("malformed batch of {m} tokens for a shared model")));
        }
        if let Some(t) = batch.tokens.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(Error::InvalidArgument(format!("token {t} is outside the vocabulary of {}", self.config.vocab_size)));
        }
        if batch.slot_extent() > self.kv.capacity() {
            return Err(Error::ContextOverflow { prompt: self.kv.len(), requested: m, context: self.kv.capacity() });
        }
        Ok(())
    }
}

/// Ready once the round has put the reply in.
struct Answered(Rc<RefCell<Option<Result<Reply>>>>);

impl Future for Answered {
    type Output = Result<Reply>;
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        match self.0.borrow_mut().take() {
            Some(reply) => Poll::Ready(reply),
            None => Poll::Pending,
        }
    }
}

impl Lm for SeqLm {
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn backend_name(&self) -> String {
        self.backend.clone()
    }
    fn len(&self) -> usize {
        self.kv.len()
    }
    fn capacity(&self) -> usize {
        self.kv.capacity()
    }
    fn truncate(&mut self, len: usize) {
        self.kv.truncate(len)
    }
    fn advance(&mut self, n: usize) -> Result<()> {
        self.kv.advance(n)
    }
    fn logits<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<f32>>> {
        Box::pin(async move { self.ask(batch, out_rows, Readout::Logits).await?.logits() })
    }
    fn argmax<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<u32>>> {
        Box::pin(async move { self.ask(batch, out_rows, Readout::Argmax).await?.argmax() })
    }
    fn top_k<'a>(
        &'a mut self,
        batch: &'a Batch,
        out_rows: &'a [u32],
        k: usize,
        temperature: f32,
        at: &'a [u32],
    ) -> LocalBoxFuture<'a, Result<TopK>> {
        Box::pin(async move {
            crate::backend::check_top_k(out_rows.len(), k, temperature, at)?;
            self.ask(batch, out_rows, Readout::TopK { k, temperature, at: at.to_vec() }).await?.top_k()
        })
    }
    fn draw<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32], draw: &'a Draw) -> LocalBoxFuture<'a, Result<Vec<Drawn>>> {
        Box::pin(async move {
            draw.check(out_rows.len(), self.config.vocab_size)?;
            self.ask(batch, out_rows, Readout::Draw(draw.clone())).await?.drawn()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(batch: Batch, rows: Vec<u32>) -> Ask {
        Ask { base: 128, batch, rows, readout: Readout::Argmax, reply: Rc::default() }
    }

    #[test]
    fn a_long_prefill_is_cut_into_a_chunk_and_the_rest() {
        let tokens: Vec<u32> = (0..70).collect();
        let mut first = ask(Batch::causal(&tokens, 5), vec![69]);
        let reply = first.reply.clone();
        let rest = split_prefill(&mut first).expect("cut");
        assert_eq!(first.batch, Batch::causal(&tokens[..PREFILL_CHUNK], 5));
        assert!(first.rows.is_empty());
        assert_eq!(rest.batch, Batch::causal(&tokens[PREFILL_CHUNK..], 5 + PREFILL_CHUNK));
        assert_eq!(rest.rows, [69 - PREFILL_CHUNK as u32]);
        assert!(Rc::ptr_eq(&rest.reply, &reply), "the rest answers the sequence");
        // Not cut: short, reading a row of the first chunk, or not causal (a tree step).
        assert!(split_prefill(&mut ask(Batch::causal(&tokens[..PREFILL_CHUNK], 0), vec![3])).is_none());
        assert!(split_prefill(&mut ask(Batch::causal(&tokens, 0), vec![3, 69])).is_none());
        let mut tree = Batch::causal(&tokens, 0);
        tree.mask.prefix[40] = 10;
        assert!(split_prefill(&mut ask(tree, vec![69])).is_none());
    }
}
