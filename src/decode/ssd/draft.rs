//! The draft side of SSD: the draft model, its speculation cache and its fan-out policy, living
//! on a worker. Jobs arrive in round order:
//! `Start` (prefill), then per round `Propose` (take the previous round's outcome, answer with
//! this round's draft tokens from the cache or the backup) and `Speculate` (glue pass and tree
//! over this round's tokens, while the target verifies them).
//!
//! Jobs and replies are plain data (serde), so the draft can live in another Web Worker:
//! [`DraftHost`] is its end there, [`DraftWorker::remote`] the target's end.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use futures::future::LocalBoxFuture;
use web_time::Instant;

use super::cache::SpecCache;
use super::fanout::{self, FanoutPolicy};
use crate::backend::TopK;
use crate::decode::spec::{draft_rng, timed, Backup, DraftKv, DraftLm, Drafting, Outcome, Proposal, SpecConfig};
use crate::decode::{context_of, CancelToken, Request};
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::runner::{BoxedLm, Lm};
use crate::runtime::{Channel, RelSpan, Service, Span, Worker};
use crate::sampling::{Rng, SamplingParams};

#[derive(Serialize, Deserialize)]
pub enum Job {
    /// A new generation: reset the cache and prefill the prompt.
    Start { req: Request, spec: SpecConfig },
    /// Commit the outcome of the round last speculated on (none before the first round) and
    /// propose up to `depth` draft tokens to follow `rec`.
    Propose { outcome: Option<Outcome>, rec: u32, depth: usize },
    /// The target is verifying [rec, s1..sn] = `tokens`: speculate on its outcomes, `depth`
    /// draft tokens per branch.
    Speculate { tokens: Vec<u32>, depth: usize },
}

/// A reply, with its times as spans on the caller's clock (`S = Span`) or relative to the job's
/// start as the worker measured them (`S = RelSpan`).
#[derive(Serialize, Deserialize)]
pub enum Reply<S = Span> {
    Started,
    Proposal {
        proposal: Proposal,
        /// Whether the cache held the outcome; `None` when there was no cache to ask.
        hit: Option<bool>,
        /// Time spent drafting on a miss.
        backup: Option<S>,
    },
    Speculated {
        glue: S,
        tree: Vec<S>,
    },
}

impl<S> Reply<S> {
    fn map_spans<T>(self, f: impl Fn(S) -> T) -> Reply<T> {
        match self {
            Reply::Started => Reply::Started,
            Reply::Proposal { proposal, hit, backup } => Reply::Proposal { proposal, hit, backup: backup.map(&f) },
            Reply::Speculated { glue, tree } => Reply::Speculated { glue: f(glue), tree: tree.into_iter().map(f).collect() },
        }
    }
}

/// The draft model on its worker, reusable across generations (and after errors).
pub struct DraftWorker {
    worker: Worker<Job, Reply<RelSpan>>,
    config: ModelConfig,
    /// KV slots of the draft model.
    capacity: usize,
    abandon: Arc<AtomicBool>,
    /// When each job in flight was sent, to place its reply's spans on our clock.
    sent: VecDeque<Instant>,
    last_reply: Option<Instant>,
}

impl DraftWorker {
    /// The draft on its own thread, so it computes while the target verifies. On wasm32 without
    /// threads it runs inline instead (see [`DraftWorker::inline`]).
    pub fn new(lm: BoxedLm) -> Result<Self> {
        let (config, capacity) = (lm.config().clone(), lm.capacity());
        let abandon = Arc::new(AtomicBool::new(false));
        let speculator = Speculator::new(lm, abandon.clone());
        #[cfg(not(target_arch = "wasm32"))]
        let worker = Worker::thread("saguaro-draft", speculator)?;
        #[cfg(target_arch = "wasm32")]
        let worker = Worker::inline(speculator);
        Ok(DraftWorker::on(worker, config, capacity, abandon))
    }

    /// A draft running elsewhere (a browser Web Worker holding a [`DraftHost`]) with model
    /// `config`, reached through `channel`.
    pub fn remote(channel: Box<dyn Channel<Job, Reply<RelSpan>>>, config: ModelConfig) -> Self {
        // Its KV capacity is not known here; the host checks the prompt against it at the start
        // of each generation, and an engine sizes both models' caches alike.
        DraftWorker::on(Worker::remote(channel), config, usize::MAX, Arc::new(AtomicBool::new(false)))
    }

    fn on(worker: Worker<Job, Reply<RelSpan>>, config: ModelConfig, capacity: usize, abandon: Arc<AtomicBool>) -> Self {
        DraftWorker { worker, config, capacity, abandon, sent: VecDeque::new(), last_reply: None }
    }

    /// The draft on the caller's thread: its work runs when the target awaits it, so nothing
    /// overlaps, but the tokens are the same.
    pub fn inline(lm: Box<dyn Lm>) -> Self {
        let (config, capacity) = (lm.config().clone(), lm.capacity());
        let abandon = Arc::new(AtomicBool::new(false));
        let speculator = Speculator::new(lm, abandon.clone());
        DraftWorker::on(Worker::inline(speculator), config, capacity, abandon)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Tokens the draft can follow after `req`'s prompt, keeping the KV slots `spec`'s
    /// speculation needs.
    pub(crate) fn room(&self, req: &Request, spec: &SpecConfig) -> usize {
        req.room(context_of(&self.config, self.capacity, spec.draft_scratch()))
    }

    /// Whether the draft computes at the same time as the target.
    pub fn is_concurrent(&self) -> bool {
        self.worker.is_concurrent()
    }

    pub(crate) fn send(&mut self, job: Job) -> Result<()> {
        if matches!(job, Job::Start { .. }) {
            self.abandon.store(false, Ordering::Relaxed);
        }
        self.worker.send(job)?;
        self.sent.push_back(Instant::now());
        Ok(())
    }

    pub(crate) async fn recv(&mut self) -> Result<Reply> {
        let reply = self.worker.recv().await;
        let now = Instant::now();
        // The worker takes jobs in order: this one began when it was sent or when the previous
        // one ended, whichever was later.
        let sent = self.sent.pop_front().unwrap_or(now);
        let began = self.last_reply.map_or(sent, |r| r.max(sent)).min(now);
        self.last_reply = Some(now);
        Ok(reply?.map_spans(|s| s.at(began)))
    }

    /// End the generation in progress: cut short any tree being built for it and discard
    /// replies nobody will read.
    pub(crate) async fn finish(&mut self) {
        self.abandon.store(true, Ordering::Relaxed);
        // A draft in another Web Worker does not share this flag: tell it.
        self.worker.interrupt();
        self.worker.drain().await;
        self.sent.clear();
        self.last_reply = None;
    }
}

impl Drop for DraftWorker {
    fn drop(&mut self) {
        // The worker joins its thread on drop; a tree nobody will read need not finish first.
        self.abandon.store(true, Ordering::Relaxed);
    }
}

/// The draft model on its worker, answering the target's jobs.
struct Speculator<M> {
    abandon: Arc<AtomicBool>,
    session: Option<Session>,
    kv: DraftKv<M>,
}

/// One generation's draft-side state.
struct Session {
    params: SamplingParams,
    cancel: CancelToken,
    spec: SpecConfig,
    rng: Rng,
    policy: FanoutPolicy,
    /// The speculation over the round being verified, until its outcome arrives.
    round: Option<Round>,
}

struct Round {
    /// s1..sn of the round.
    drafted: Vec<u32>,
    /// The glue pass's likeliest draft tokens, n + 1 rows.
    glue: TopK,
    cache: SpecCache,
}

impl Round {
    /// The round ended with `o`: the fan-out learns from it, and the cache yields what it holds
    /// for it, cut to `depth` tokens.
    fn settle(mut self, o: Outcome, depth: usize, policy: &mut FanoutPolicy) -> Option<Proposal> {
        let rank = fanout::rank(&self.glue, o.accepted, o.bonus, self.drafted.get(o.accepted).copied());
        let cached = self.cache.take(o.accepted, o.bonus, depth);
        policy.observe(self.drafted.len(), o.accepted, cached.is_some(), rank);
        cached
    }
}

impl<M: DraftLm + 'static> Service for Speculator<M> {
    type Job = Job;
    type Reply = Reply<RelSpan>;

    fn handle(&mut self, job: Job) -> LocalBoxFuture<'_, Result<Reply<RelSpan>>> {
        Box::pin(async move {
            let began = Instant::now();
            let reply = match job {
                Job::Start { req, spec } => self.start(req, spec).await,
                Job::Propose { outcome, rec, depth } => self.propose(outcome, rec, depth).await,
                Job::Speculate { tokens, depth } => self.speculate(tokens, depth).await,
            }?;
            Ok(reply.map_spans(|s| RelSpan::from_span(s, began)))
        })
    }
}

/// The draft's end of a remote [`DraftWorker`]: the draft model and its speculation cache in
/// another Web Worker, answering jobs in the order they arrive.
pub struct DraftHost {
    speculator: Speculator<Box<dyn Lm>>,
    config: ModelConfig,
}

impl DraftHost {
    pub fn new(lm: Box<dyn Lm>) -> Self {
        let config = lm.config().clone();
        DraftHost { speculator: Speculator::new(lm, Arc::new(AtomicBool::new(false))), config }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The flag that cuts the running speculation short, for the engine's interrupt to set while
    /// a job runs: it is answered at once, not queued behind the job. A new generation clears it.
    pub fn abandon_flag(&self) -> Arc<AtomicBool> {
        self.speculator.abandon.clone()
    }

    pub async fn handle(&mut self, job: Job) -> Result<Reply<RelSpan>> {
        if matches!(job, Job::Start { .. }) {
            self.speculator.abandon.store(false, Ordering::Relaxed);
        }
        self.speculator.handle(job).await
    }
}

impl<M: DraftLm> Speculator<M> {
    fn new(lm: M, abandon: Arc<AtomicBool>) -> Self {
        Speculator { abandon, session: None, kv: DraftKv::new(lm) }
    }

    async fn start(&mut self, req: Request, spec: SpecConfig) -> Result<Reply> {
        self.session = None;
        req.validate(self.kv.model(), spec.draft_scratch())?;
        self.kv.prefill(&req.prompt).await?;
        self.session = Some(Session {
            params: req.sampling,
            cancel: req.cancel,
            rng: draft_rng(req.sampling.seed),
            policy: FanoutPolicy::new(spec.fanout.clone(), spec.k),
            spec,
            round: None,
        });
        Ok(Reply::Started)
    }

    /// Step 1 of a round: commit the `outcome` of the round last speculated on (none before the
    /// first round), then propose up to `depth` tokens after `rec`: the speculation cached for
    /// the outcome, or on a miss the backup's.
    async fn propose(&mut self, outcome: Option<Outcome>, rec: u32, depth: usize) -> Result<Reply> {
        let s = self.session.as_mut().ok_or_else(|| Error::Worker("no generation started".into()))?;
        let mut hit = None;
        if let Some(o) = outcome {
            let round =
                s.round.take().ok_or_else(|| Error::Worker("an outcome for a round never speculated".into()))?;
            if o.accepted > round.drafted.len() {
                return Err(Error::Worker(format!(
                    "an outcome accepting {} of {} draft tokens",
                    o.accepted,
                    round.drafted.len()
                )));
            }
            // The glue pass wrote rec, s1..sn; the outcome commits rec, s1..sk.
            self.kv.resolve(o.accepted);
            if let Some(proposal) = round.settle(o, depth, &mut s.policy) {
                return Ok(Reply::Proposal { proposal, hit: Some(true), backup: None });
            }
            hit = Some(false);
        }
        let (proposal, backup) = match s.spec.backup {
            Backup::Fast => (Proposal::default(), None),
            Backup::Jit => {
                let widths = s.policy.widths(depth);
                let mut drafting =
                    Drafting { params: &s.params, rng: &mut s.rng, saguaro: Some((s.spec.saguaro_c, &widths)) };
                let (p, span) = timed(self.kv.draft(rec, depth, 0.0, &mut drafting)).await?;
                // This round's glue pass rewrites these slots.
                self.kv.discard();
                (p, Some(span))
            }
        };
        Ok(Reply::Proposal { proposal, hit, backup })
    }

    /// Step 2 of a round, while the target verifies [rec, s1..sn] = `tokens`: the glue pass over
    /// them, the fan-out over its logits, and the tree of `depth` steps into the cache.
    async fn speculate(&mut self, tokens: Vec<u32>, depth: usize) -> Result<Reply> {
        let s = self.session.as_mut().ok_or_else(|| Error::Worker("no generation started".into()))?;
        let (entries, temperature) = (s.policy.glue_entries(), fanout::ranking_temperature(&s.params));
        let (glue, glue_span) = timed(self.kv.glue(&tokens, entries, temperature)).await?;

        let drafted = tokens[1..].to_vec();
        let branches = s.policy.candidates(&glue, &drafted, &s.params);
        let widths = s.policy.widths(depth);
        let mut drafting = Drafting { params: &s.params, rng: &mut s.rng, saguaro: Some((s.spec.saguaro_c, &widths)) };
        // Both the target's end of the generation and a cancel cut the tree short.
        let abandon = &self.abandon;
        let stop = || abandon.load(Ordering::Relaxed) || s.cancel.is_cancelled();
        let (speculated, spans) = self.kv.tree(&branches, depth, &mut drafting, &stop).await?;
        s.round = Some(Round { drafted, glue, cache: SpecCache::new(&branches, speculated) });
        Ok(Reply::Speculated { glue: glue_span, tree: spans })
    }
}
