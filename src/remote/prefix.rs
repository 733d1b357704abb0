//! The server's model: one set of weights and several KV caches, each holding one client's
//! sequence (a session), found again by the longest prefix a request shares with it. Requests
//! carry their whole sequence, as SGLang's API does, so a session needs no id, and an evicted
//! one is simply recomputed.

use futures::executor::block_on;

use crate::backend::{Backend, Batch};
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::config::ModelConfig;
use crate::model::transformer::Transformer;

/// A model behind prefix caches, whatever backend runs it.
pub trait PrefixModel {
    fn config(&self) -> &ModelConfig;
    /// Tokens one session holds at most.
    fn capacity(&self) -> usize;
    fn backend_name(&self) -> String;
    /// Run `input` on the session sharing its longest prefix (or a fresh or evicted one) and
    /// return the logits after each of the positions `after` (ascending, each below
    /// `input.len()`), `[after.len() * vocab]`, and how many leading tokens were already cached.
    fn run(&mut self, input: &[u32], after: &[usize]) -> Result<(Vec<f32>, usize)>;
    /// Sessions held now, and target forwards run since start.
    fn sessions(&self) -> usize;
    fn forwards(&self) -> u64;
}

struct Session<C> {
    kv: KvCache<C>,
    tokens: Vec<u32>,
    last_used: u64,
}

pub struct PrefixCaches<B: Backend> {
    model: Transformer<B>,
    sessions: Vec<Session<B::Cache>>,
    max_sessions: usize,
    capacity: usize,
    clock: u64,
    forwards: u64,
}

/// KV-cache bytes of one session of `capacity` tokens: keys and values of every layer, counted
/// at 4 bytes a value (the widest a backend stores them in).
pub fn session_bytes(config: &ModelConfig, capacity: usize) -> usize {
    2 * config.n_layers * config.kv_dim() * capacity * 4
}

impl<B: Backend> PrefixCaches<B> {
    /// `max_sessions` caches of `capacity` tokens at most, allocated as clients arrive.
    pub fn new(model: Transformer<B>, capacity: usize, max_sessions: usize) -> Result<Self> {
        if max_sessions == 0 {
            return Err(Error::option("max_sessions", "must be at least 1"));
        }
        if model.head_tokens().is_some() {
            return Err(Error::Unsupported("a served target needs its whole output head".into()));
        }
        let capacity = capacity.min(model.config.context_length);
        Ok(PrefixCaches { model, sessions: Vec::new(), max_sessions, capacity, clock: 0, forwards: 0 })
    }

    /// The session to run `input` on: the one sharing the longest prefix when it shares at least
    /// half of what it holds (a client's own sequence, rolled back by a rejection or two), else a
    /// new one while there is room, else the least recently used.
    fn pick(&mut self, input: &[u32]) -> Result<(usize, usize)> {
        let shared = |s: &Session<B::Cache>| s.tokens.iter().zip(input).take_while(|(a, b)| a == b).count();
        let best = self.sessions.iter().enumerate().map(|(i, s)| (shared(s), s.last_used, i)).max();
        if let Some((n, _, i)) = best {
            if n > 0 && (2 * n >= self.sessions[i].tokens.len() || self.sessions.len() >= self.max_sessions) {
                return Ok((i, n));
            }
        }
        if self.sessions.len() < self.max_sessions {
            let store = self.model.new_cache(self.capacity)?;
            self.sessions.push(Session { kv: KvCache::new(store, self.capacity), tokens: Vec::new(), last_used: 0 });
            return Ok((self.sessions.len() - 1, 0));
        }
        let lru = (0..self.sessions.len()).min_by_key(|&i| self.sessions[i].last_used).unwrap_or(0);
        Ok((lru, 0))
    }
}

impl<B: Backend> PrefixModel for PrefixCaches<B> {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn backend_name(&self) -> String {
        self.model.backend.name()
    }

    fn run(&mut self, input: &[u32], after: &[usize]) -> Result<(Vec<f32>, usize)> {
        let (Some(&first), Some(&last)) = (after.first(), after.last()) else {
            return Err(Error::InvalidArgument("no positions to score".into()));
        };
        if last >= input.len() || after.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::InvalidArgument("positions to score must ascend within the input".into()));
        }
        if input.len() > self.capacity {
            return Err(Error::ContextOverflow { prompt: input.len(), requested: 0, context: self.capacity });
        }
        let (i, shared) = self.pick(input)?;
        self.clock += 1;
        // The logits after position p come from running the token at p.
        let from = shared.min(first);
        let batch = Batch::causal(&input[from..], from);
        let rows: Vec<u32> = after.iter().map(|&p| (p - from) as u32).collect();
        let s = &mut self.sessions[i];
        s.last_used = self.clock;
        s.kv.truncate(from);
        s.tokens.truncate(from);
        let t = self.model.forward(&mut s.kv.store, &batch, &rows)?;
        let logits = block_on(self.model.backend.read(&t))?;
        self.forwards += 1;
        s.kv.advance(batch.len())?;
        s.tokens.extend_from_slice(&input[from..]);
        Ok((logits, shared))
    }

    fn sessions(&self) -> usize {
        self.sessions.len()
    }

    fn forwards(&self) -> u64 {
        self.forwards
    }
}
