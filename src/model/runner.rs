//! A model with its KV cache, behind one object-safe trait so decoding strategies need not know
//! which backend runs it.

use futures::future::LocalBoxFuture;

use std::sync::Arc;

use crate::backend::{check_top_k, draw, Allowed, Backend, Batch, Draw, Drawn, TopK, NO_SLOT};
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::config::ModelConfig;
use crate::model::transformer::Transformer;

/// A language model instance: weights on some backend plus its own KV cache.
pub trait Lm {
    fn config(&self) -> &ModelConfig;
    fn backend_name(&self) -> String;
    /// Committed tokens in the KV cache.
    fn len(&self) -> usize;
    /// Slots the KV cache can hold (committed tokens plus speculation scratch).
    fn capacity(&self) -> usize;
    /// Roll the committed sequence back to `len` tokens.
    fn truncate(&mut self, len: usize);
    /// Run `batch` (it does not change the committed length) and return the logits of `out_rows`,
    /// `[out_rows.len() * vocab]`.
    fn logits<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<f32>>>;
    /// Like [`Lm::logits`], but only the argmax of each row leaves the backend.
    fn argmax<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<u32>>>;
    /// Like [`Lm::logits`], but only each row's [`TopK`] (token ids; `at` are token ids too)
    /// leaves the backend where it can find them there.
    fn top_k<'a>(
        &'a mut self,
        batch: &'a Batch,
        out_rows: &'a [u32],
        k: usize,
        temperature: f32,
        at: &'a [u32],
    ) -> LocalBoxFuture<'a, Result<TopK>> {
        Box::pin(async move {
            check_top_k(out_rows.len(), k, temperature, at)?;
            let logits = self.logits(batch, out_rows).await?;
            Ok(TopK::of(&logits, self.config().vocab_size, k, temperature, at))
        })
    }
    /// Like [`Lm::top_k`] (no asked-for columns), then the rows' logits too where `enough` finds
    /// the top-k short of what the caller needs: [`Output::TopK`] or [`Output::Logits`]. The
    /// logits come from the same forward, not a second one. Where the rows come to the host
    /// anyway (this default, and a backend in host memory), the logits alone, which carry
    /// everything a top-k does.
    fn top_k_or_logits<'a>(
        &'a mut self,
        batch: &'a Batch,
        out_rows: &'a [u32],
        k: usize,
        temperature: f32,
        _enough: &'a dyn Fn(&TopK) -> bool,
    ) -> LocalBoxFuture<'a, Result<Output>> {
        Box::pin(async move {
            check_top_k(out_rows.len(), k, temperature, &vec![NO_SLOT; out_rows.len()])?;
            Ok(Output::Logits(self.logits(batch, out_rows).await?))
        })
    }
    /// Like [`Lm::logits`], but only a token drawn from each row and its probability at the
    /// row's asked-for token leave the backend, as [`Draw`] says.
    fn draw<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32], draw: &'a Draw) -> LocalBoxFuture<'a, Result<Vec<Drawn>>> {
        Box::pin(async move {
            draw.check(out_rows.len(), self.config().vocab_size)?;
            let logits = self.logits(batch, out_rows).await?;
            draw::on_host(&logits, self.config().vocab_size, draw)
        })
    }
    /// Mark `n` tokens just written by a causal batch at `len()` as committed.
    fn advance(&mut self, n: usize) -> Result<()>;
    /// Run `batch` once and read back each part's output rows (rows of `batch`) as its
    /// [`Readout`] says: several sequences' forwards as one (`model::shared`). The batch's
    /// `allowed` holds a row per output row, the parts' rows in order. This default reads every
    /// row's logits to the host and computes each readout there, as the other defaults do.
    fn readouts<'a>(&'a mut self, batch: &'a Batch, parts: &'a [(Vec<u32>, Readout)]) -> LocalBoxFuture<'a, Result<Vec<Reply>>> {
        Box::pin(async move {
            let rows: Vec<u32> = parts.iter().flat_map(|(r, _)| r.iter().copied()).collect();
            let logits = self.logits(batch, &rows).await?;
            let vocab = self.config().vocab_size;
            let mut at = 0;
            let mut replies = Vec::with_capacity(parts.len());
            for (r, readout) in parts {
                let part = &logits[at * vocab..(at + r.len()) * vocab];
                at += r.len();
                replies.push(match readout {
                    Readout::Logits => Reply::Logits(part.to_vec()),
                    Readout::Argmax => Reply::Argmax(part.chunks_exact(vocab).map(crate::sampling::argmax).collect()),
                    Readout::TopK { k, temperature, at } => {
                        check_top_k(r.len(), *k, *temperature, at)?;
                        Reply::TopK(TopK::of(part, vocab, *k, *temperature, at))
                    }
                    Readout::Draw(d) => {
                        d.check(r.len(), vocab)?;
                        Reply::Drawn(draw::on_host(part, vocab, d)?)
                    }
                });
            }
            Ok(replies)
        })
    }
}

/// What one part of a forward reads back ([`Lm::readouts`]), as [`Lm::logits`], [`Lm::argmax`],
/// [`Lm::top_k`] and [`Lm::draw`] do.
#[derive(Clone, Debug)]
pub enum Readout {
    Logits,
    Argmax,
    TopK { k: usize, temperature: f32, at: Vec<u32> },
    Draw(Draw),
}

/// A [`Readout`]'s answer.
pub enum Reply {
    Logits(Vec<f32>),
    Argmax(Vec<u32>),
    TopK(TopK),
    Drawn(Vec<Drawn>),
}

impl Reply {
    pub fn logits(self) -> Result<Vec<f32>> {
        match self {
            Reply::Logits(l) => Ok(l),
            _ => Err(Error::Worker("a forward answered logits with something else".into())),
        }
    }
    pub fn argmax(self) -> Result<Vec<u32>> {
        match self {
            Reply::Argmax(a) => Ok(a),
            _ => Err(Error::Worker("a forward answered argmax with something else".into())),
        }
    }
    pub fn top_k(self) -> Result<TopK> {
        match self {
            Reply::TopK(t) => Ok(t),
            _ => Err(Error::Worker("a forward answered top-k with something else".into())),
        }
    }
    pub fn drawn(self) -> Result<Vec<Drawn>> {
        match self {
            Reply::Drawn(d) => Ok(d),
            _ => Err(Error::Worker("a forward answered a draw with something else".into())),
        }
    }
}

/// A model instance as the engine owns it: `Send` natively, where SSD's draft moves to a thread of
/// its own; in wasm, where WebGPU objects never leave their thread, without that bound.
#[cfg(not(target_arch = "wasm32"))]
pub type BoxedLm = Box<dyn Lm + Send>;
#[cfg(target_arch = "wasm32")]
pub type BoxedLm = Box<dyn Lm>;

/// A boxed model is a model, so wrappers such as [`Hooked`] take one.
impl<L: Lm + ?Sized> Lm for Box<L> {
    fn config(&self) -> &ModelConfig {
        (**self).config()
    }
    fn backend_name(&self) -> String {
        (**self).backend_name()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
    fn capacity(&self) -> usize {
        (**self).capacity()
    }
    fn truncate(&mut self, len: usize) {
        (**self).truncate(len)
    }
    fn advance(&mut self, n: usize) -> Result<()> {
        (**self).advance(n)
    }
    fn logits<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<f32>>> {
        (**self).logits(batch, out_rows)
    }
    fn argmax<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<u32>>> {
        (**self).argmax(batch, out_rows)
    }
    fn top_k<'a>(
        &'a mut self,
        batch: &'a Batch,
        out_rows: &'a [u32],
        k: usize,
        temperature: f32,
        at: &'a [u32],
    ) -> LocalBoxFuture<'a, Result<TopK>> {
        (**self).top_k(batch, out_rows, k, temperature, at)
    }
    fn top_k_or_logits<'a>(
        &'a mut self,
        batch: &'a Batch,
        out_rows: &'a [u32],
        k: usize,
        temperature: f32,
        enough: &'a dyn Fn(&TopK) -> bool,
    ) -> LocalBoxFuture<'a, Result<Output>> {
        (**self).top_k_or_logits(batch, out_rows, k, temperature, enough)
    }
    fn draw<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32], draw: &'a Draw) -> LocalBoxFuture<'a, Result<Vec<Drawn>>> {
        (**self).draw(batch, out_rows, draw)
    }
    fn readouts<'a>(&'a mut self, batch: &'a Batch, parts: &'a [(Vec<u32>, Readout)]) -> LocalBoxFuture<'a, Result<Vec<Reply>>> {
        (**self).readouts(batch, parts)
    }
}

/// What to read back from an append.
pub enum Want<'a> {
    /// Logits of the last row.
    LastLogits,
    /// Logits of every row.
    AllLogits,
    /// Argmax of every row.
    AllArgmax,
    /// Every row's [`TopK`], row r's value at token `at[r]` among them.
    AllTopK { k: usize, temperature: f32, at: Vec<u32> },
    /// The last row's [`TopK`].
    LastTopK { k: usize, temperature: f32 },
    /// The last row's [`TopK`], or its logits where `enough` finds the top-k short
    /// ([`Lm::top_k_or_logits`]).
    LastTopKOrLogits { k: usize, temperature: f32, enough: &'a dyn Fn(&TopK) -> bool },
    /// A token drawn from the last row ([`Draw`] of one row).
    LastDraw { temperature: f32, seed: u64 },
}

pub enum Output {
    Logits(Vec<f32>),
    Argmax(Vec<u32>),
    TopK(TopK),
    Drawn(Drawn),
}

impl Output {
    pub fn logits(self) -> Vec<f32> {
        match self {
            Output::Logits(l) => l,
            _ => unreachable!("asked for logits"),
        }
    }
    pub fn argmax(self) -> Vec<u32> {
        match self {
            Output::Argmax(a) => a,
            _ => unreachable!("asked for argmax"),
        }
    }
    pub fn top_k(self) -> TopK {
        match self {
            Output::TopK(t) => t,
            _ => unreachable!("asked for top-k"),
        }
    }
    pub fn drawn(self) -> Drawn {
        match self {
            Output::Drawn(d) => d,
            _ => unreachable!("asked for a draw"),
        }
    }
}

/// Append `tokens` causally at the end of the committed sequence and commit them.
pub async fn append(lm: &mut dyn Lm, tokens: &[u32], want: Want<'_>) -> Result<Output> {
    append_masked(lm, tokens, want, None).await
}

/// [`append`], each output row masked by its row of `allowed` (a grammar's).
pub async fn append_masked(lm: &mut dyn Lm, tokens: &[u32], want: Want<'_>, allowed: Option<Arc<Allowed>>) -> Result<Output> {
    if tokens.is_empty() {
        return Err(Error::InvalidArgument("no tokens to run".into()));
    }
    let start = lm.len();
    if start + tokens.len() > lm.capacity() {
        return Err(Error::ContextOverflow { prompt: start, requested: tokens.len(), context: lm.capacity() });
    }
    let batch = Batch { allowed, ..Batch::causal(tokens, start) };
    let n = tokens.len() as u32;
    let out = match want {
        Want::LastLogits => Output::Logits(lm.logits(&batch, &[n - 1]).await?),
        Want::AllLogits => Output::Logits(lm.logits(&batch, &(0..n).collect::<Vec<_>>()).await?),
        Want::AllArgmax => Output::Argmax(lm.argmax(&batch, &(0..n).collect::<Vec<_>>()).await?),
        Want::AllTopK { k, temperature, at } => {
            Output::TopK(lm.top_k(&batch, &(0..n).collect::<Vec<_>>(), k, temperature, &at).await?)
        }
        Want::LastTopK { k, temperature } => Output::TopK(lm.top_k(&batch, &[n - 1], k, temperature, &[NO_SLOT]).await?),
        Want::LastTopKOrLogits { k, temperature, enough } => lm.top_k_or_logits(&batch, &[n - 1], k, temperature, enough).await?,
        Want::LastDraw { temperature, seed } => {
            let draw = Draw { temperature, seed, at: vec![NO_SLOT], minus: vec![] };
            Output::Drawn(lm.draw(&batch, &[n - 1], &draw).await?[0])
        }
    };
    lm.advance(tokens.len())?;
    Ok(out)
}

/// What a [`Hooked`] model's hook may ask to await before the forward runs.
pub type Pause = Option<LocalBoxFuture<'static, ()>>;

/// A model that shows each batch to `hook` before running it, and awaits the pause the hook
/// returns: the browser lets its event loop turn there, tests inject a failure or a cancellation
/// at a chosen forward.
pub struct Hooked<L, H> {
    inner: L,
    hook: H,
}

impl<L: Lm, H: FnMut(&Batch) -> Pause> Hooked<L, H> {
    pub fn new(inner: L, hook: H) -> Self {
        Hooked { inner, hook }
    }
}

impl<L: Lm, H: FnMut(&Batch) -> Pause> Lm for Hooked<L, H> {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn backend_name(&self) -> String {
        self.inner.backend_name()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    fn truncate(&mut self, len: usize) {
        self.inner.truncate(len)
    }
    fn advance(&mut self, n: usize) -> Result<()> {
        self.inner.advance(n)
    }
    fn logits<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<f32>>> {
        let pause = (self.hook)(batch);
        Box::pin(async move {
            if let Some(p) = pause {
                p.await;
            }
            self.inner.logits(batch, out_rows).await
        })
    }
    fn argmax<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<u32>>> {
        let pause = (self.hook)(batch);
        Box::pin(async move {
            if let Some(p) = pause {
                p.await;
            }
            self.inner.argmax(batch, out_rows).await
        })
    }
    fn top_k<'a>(
        &'a mut self,
        batch: &'a Batch,
        out_rows: &'a [u32],
        k: usize,
        temperature: f32,
        at: &'a [u32],
    ) -> LocalBoxFuture<'a, Result<TopK>> {
        let pause = (self.hook)(batch);
        Box::pin(async move {
            if let Some(p) = pause {
                p.await;
            }
            self.inner.top_k(batch, out_rows, k, temperature, at).await
        })
    }
    fn top_k_or_logits<'a>(
        &'a mut self,
        batch: &'a Batch,
        out_rows: &'a [u32],
        k: usize,
        temperature: f32,
        enough: &'a dyn Fn(&TopK) -> bool,
    ) -> LocalBoxFuture<'a, Result<Output>> {
        let pause = (self.hook)(batch);
        Box::pin(async move {
            if let Some(p) = pause {
                p.await;
            }
            self.inner.top_k_or_logits(batch, out_rows, k, temperature, enough).await
        })
    }
    fn draw<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32], draw: &'a Draw) -> LocalBoxFuture<'a, Result<Vec<Drawn>>> {
        let pause = (self.hook)(batch);
        Box::pin(async move {
            if let Some(p) = pause {
                p.await;
            }
            self.inner.draw(batch, out_rows, draw).await
        })
    }
}

pub struct Runner<B: Backend> {
    model: Transformer<B>,
    cache: KvCache<B::Cache>,
}

impl<B: Backend> Runner<B> {
    pub fn new(model: Transformer<B>, capacity: usize) -> Result<Self> {
        Self::with_slots(model, capacity, capacity)
    }

    /// A runner whose sequences hold up to `context` tokens each, in a cache of `slots` (several
    /// sequences' regions, see `model::shared`).
    pub fn with_slots(mut model: Transformer<B>, context: usize, slots: usize) -> Result<Self> {
        model.use_context(context);
        let store = model.new_cache(slots)?;
        Ok(Runner { model, cache: KvCache::new(store, slots) })
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &B {
        &self.model.backend
    }

    fn run(&mut self, batch: &Batch, out_rows: &[u32]) -> Result<B::Tensor> {
        if batch.slot_extent() > self.cache.capacity() {
            return Err(Error::ContextOverflow {
                prompt: self.cache.len(),
                requested: batch.len(),
                context: self.cache.capacity(),
            });
        }
        let mut logits = self.model.forward(&mut self.cache.store, batch, out_rows)?;
        if let Some(allowed) = &batch.allowed {
            if allowed.rows() != out_rows.len() || allowed.cols() != self.model.config.vocab_size {
                return Err(Error::InvalidArgument(format!(
                    "{} masks over {} tokens for {} output rows over {}",
                    allowed.rows(),
                    allowed.cols(),
                    out_rows.len(),
                    self.model.config.vocab_size
                )));
            }
            match self.model.head_tokens() {
                Some(tokens) => self.model.backend.mask(&mut logits, &allowed.for_head(tokens))?,
                None => self.model.backend.mask(&mut logits, allowed)?,
            }
        }
        Ok(logits)
    }

    /// A forward's logits, over the whole vocabulary.
    async fn logits_of(&self, t: &B::Tensor) -> Result<Vec<f32>> {
        let logits = self.model.backend.read(t).await?;
        Ok(match self.model.head_tokens() {
            Some(tokens) => scatter(&logits, tokens, self.model.config.vocab_size),
            None => logits,
        })
    }

    /// The readout of a forward's logits `t`.
    async fn read(&self, t: &B::Tensor, readout: &Readout) -> Result<Reply> {
        let tokens = self.model.head_tokens();
        Ok(match readout {
            Readout::Logits => Reply::Logits(self.logits_of(t).await?),
            Readout::Argmax => {
                let best = self.model.backend.argmax(t).await?;
                Reply::Argmax(match tokens {
                    Some(tokens) => best.into_iter().map(|i| tokens[i as usize]).collect(),
                    None => best,
                })
            }
            Readout::TopK { k, temperature, at } => Reply::TopK(self.top_k_of(t, *k, *temperature, at).await?),
            Readout::Draw(draw) => Reply::Drawn(match tokens {
                None => self.model.backend.draw(t, draw).await?,
                // A pruned head's rows are its tokens, which the draw then names by column.
                Some(tokens) => {
                    let drawn = self.model.backend.draw(t, &draw.for_head(tokens)).await?;
                    drawn.into_iter().map(|d| Drawn { token: tokens[d.token as usize], ..d }).collect()
                }
            }),
        })
    }

    /// A forward's [`TopK`], by token.
    async fn top_k_of(&self, t: &B::Tensor, k: usize, temperature: f32, at: &[u32]) -> Result<TopK> {
        let Some(tokens) = self.model.head_tokens() else {
            return self.model.backend.top_k(t, k, temperature, at).await;
        };
        // A pruned head's rows are its tokens; every other token's logit is -inf.
        let head_at: Vec<u32> = at.iter().map(|&a| tokens.iter().position(|&t| t == a).map_or(NO_SLOT, |i| i as u32)).collect();
        let mut top = self.model.backend.top_k(t, k, temperature, &head_at).await?;
        top.ids.iter_mut().for_each(|i| *i = tokens[*i as usize]);
        Ok(top)
    }
}

impl<B: Backend> Lm for Runner<B> {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }
    fn backend_name(&self) -> String {
        self.model.backend.name()
    }
    fn len(&self) -> usize {
        self.cache.len()
    }
    fn capacity(&self) -> usize {
        self.cache.capacity()
    }
    fn truncate(&mut self, len: usize) {
        self.cache.truncate(len)
    }
    fn advance(&mut self, n: usize) -> Result<()> {
        self.cache.advance(n)
    }
    fn logits<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<f32>>> {
        Box::pin(async move {
            let t = self.run(batch, out_rows)?;
            self.logits_of(&t).await
        })
    }
    fn argmax<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<u32>>> {
        Box::pin(async move {
            let t = self.run(batch, out_rows)?;
            self.read(&t, &Readout::Argmax).await?.argmax()
        })
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
            let t = self.run(batch, out_rows)?;
            self.top_k_of(&t, k, temperature, at).await
        })
    }
    fn top_k_or_logits<'a>(
        &'a mut self,
        batch: &'a Batch,
        out_rows: &'a [u32],
        k: usize,
        temperature: f32,
        enough: &'a dyn Fn(&TopK) -> bool,
    ) -> LocalBoxFuture<'a, Result<Output>> {
        Box::pin(async move {
            let none = vec![NO_SLOT; out_rows.len()];
            check_top_k(out_rows.len(), k, temperature, &none)?;
            let t = self.run(batch, out_rows)?;
            if self.model.backend.host_memory() {
                return Ok(Output::Logits(self.logits_of(&t).await?));
            }
            let top = self.top_k_of(&t, k, temperature, &none).await?;
            Ok(if enough(&top) { Output::TopK(top) } else { Output::Logits(self.logits_of(&t).await?) })
        })
    }
    fn draw<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32], draw: &'a Draw) -> LocalBoxFuture<'a, Result<Vec<Drawn>>> {
        Box::pin(async move {
            let t = self.run(batch, out_rows)?;
            self.read(&t, &Readout::Draw(draw.clone())).await?.drawn()
        })
    }
    fn readouts<'a>(&'a mut self, batch: &'a Batch, parts: &'a [(Vec<u32>, Readout)]) -> LocalBoxFuture<'a, Result<Vec<Reply>>> {
        Box::pin(async move {
            let rows: Vec<u32> = parts.iter().flat_map(|(r, _)| r.iter().copied()).collect();
            let t = self.run(batch, &rows)?;
            if let [(_, readout)] = parts {
                return Ok(vec![self.read(&t, readout).await?]);
            }
            let mut at = 0;
            let mut replies = Vec::with_capacity(parts.len());
            for (r, readout) in parts {
                let part: Vec<u32> = (at..at + r.len() as u32).collect();
                at += r.len() as u32;
                replies.push(self.read(&self.model.backend.select_rows(&t, &part)?, readout).await?);
            }
            Ok(replies)
        })
    }
}

/// Rows of logits over `tokens` spread into rows over the whole vocabulary, -inf elsewhere: the
/// tokens a pruned head does not score get probability 0, which sampling and the target's
/// verification handle like any unlikely token.
fn scatter(logits: &[f32], tokens: &[u32], vocab: usize) -> Vec<f32> {
    let mut out = vec![f32::NEG_INFINITY; logits.len() / tokens.len() * vocab];
    for (row, full) in logits.chunks_exact(tokens.len()).zip(out.chunks_exact_mut(vocab)) {
        for (&l, &t) in row.iter().zip(tokens) {
            full[t as usize] = l;
        }
    }
    out
}
