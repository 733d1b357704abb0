//! The draft side of SSD: the draft model, its speculation cache and its fan-out policy, living
//! on a worker. Jobs arrive in round order:
//! `Start` (prefill), then per round `Propose` (take the previous round's outcome, answer with
//! this round's draft tokens from the cache or the backup) and `Speculate` (glue pass and tree
//! over this round's tokens, while the target verifies them).
//!
//! The same worker drafts for SD, so that one copy of the draft model serves both modes
//! ([`WorkerDrafter`]): `StartSd` (prefill), then per round `Draft` (take the previous round's
//! outcome, draft up to K tokens autoregressively). `Measure` times the draft where it runs, for
//! the engine's choice of mode.
//!
//! Jobs and replies are plain data (serde), so the draft can live in another Web Worker:
//! [`DraftHost`] is its end there, [`DraftWorker::remote`] the target's end.

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use futures::future::LocalBoxFuture;
use futures::lock::{Mutex, MutexGuard};
use web_time::Instant;

use super::cache::SpecCache;
use super::fanout::{self, FanoutPolicy};
use crate::backend::TopK;
use crate::decode::generation::costs::DraftCosts;
use crate::decode::generation::request::{context_of, CancelToken, Request};
use crate::decode::speculation::{
    draft_rng, timed, Backup, DraftKv, DraftLm, DraftTiming, Drafter, Drafting, Outcome, Proposal, SpecConfig,
    PRIOR_ACCEPTANCE,
};
use crate::error::{Error, Result};
use crate::backend::Allowed;
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
    /// draft tokens per branch. Under a grammar, `allowed` holds the n + 1 positions' masks,
    /// and only allowed tokens are candidate bonus tokens.
    Speculate { tokens: Vec<u32>, depth: usize, allowed: Option<Allowed> },
    /// A new SD generation, drafting as SD's model drafter does (stopping where the draft's
    /// likeliest token has less than `confidence` probability): prefill the prompt.
    StartSd { req: Request, confidence: f32, candidates: usize },
    /// SD: the target accepted `accepted` tokens of the last draft (none before the first round);
    /// draft up to `n` tokens after `rec`.
    Draft { accepted: Option<usize>, rec: u32, n: usize },
    /// Time the draft model, with a tree step `tree_rows` wide (none for 1 or less), for the
    /// engine's choice of mode. It ends the generation in progress.
    Measure { tree_rows: usize },
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
    /// SD's draft tokens (and, when sampling, their distributions), and the time drafting them.
    Drafted { proposal: Proposal, span: S },
    Measured { costs: DraftCosts },
}

impl<S> Reply<S> {
    fn map_spans<T>(self, f: impl Fn(S) -> T) -> Reply<T> {
        match self {
            Reply::Started => Reply::Started,
            Reply::Proposal { proposal, hit, backup } => Reply::Proposal { proposal, hit, backup: backup.map(&f) },
            Reply::Speculated { glue, tree } => Reply::Speculated { glue: f(glue), tree: tree.into_iter().map(f).collect() },
            Reply::Drafted { proposal, span } => Reply::Drafted { proposal, span: f(span) },
            Reply::Measured { costs } => Reply::Measured { costs },
        }
    }

    /// The draft tokens this reply carries, if any: a sampled proposal's distributions cross
    /// between Web Workers as typed arrays, apart from the rest.
    pub fn proposal_mut(&mut self) -> Option<&mut Proposal> {
        match self {
            Reply::Proposal { proposal, .. } | Reply::Drafted { proposal, .. } => Some(proposal),
            _ => None,
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

    /// Tokens the draft can follow after `req`'s prompt, keeping `scratch` KV slots free for
    /// speculation.
    pub(crate) fn room(&self, req: &Request, scratch: usize) -> usize {
        req.room(context_of(&self.config, self.capacity, scratch))
    }

    /// Time the draft where it runs (a step, and a tree step `tree_rows` wide), for the engine's
    /// choice of mode.
    pub async fn measure(&mut self, tree_rows: usize) -> Result<DraftCosts> {
        self.finish().await;
        self.send(Job::Measure { tree_rows })?;
        match self.recv().await? {
            Reply::Measured { costs } => Ok(costs),
            _ => Err(out_of_step()),
        }
    }

    /// Whether the draft computes at the same time as the target.
    pub fn is_concurrent(&self) -> bool {
        self.worker.is_concurrent()
    }

    /// Whether the draft's worker is known to have stopped: every job sent to it fails.
    pub fn has_stopped(&self) -> bool {
        self.worker.has_stopped()
    }

    pub(crate) fn send(&mut self, job: Job) -> Result<()> {
        if matches!(job, Job::Start { .. } | Job::StartSd { .. }) {
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
    sd: Option<SdSession>,
    kv: DraftKv<M>,
}

/// One SD generation's draft-side state.
struct SdSession {
    params: SamplingParams,
    rng: Rng,
    confidence: f32,
    candidates: usize,
    /// How many tokens the last draft proposed, until its outcome arrives (none before the first
    /// round).
    proposed: Option<usize>,
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

impl Session {
    /// How the draft draws its tokens, with Saguaro sampling over the fan-out's `widths`.
    fn drafting<'a>(&'a mut self, widths: &'a [usize]) -> Drafting<'a> {
        let saguaro = Some((self.spec.saguaro_c, widths));
        Drafting { params: &self.params, rng: &mut self.rng, saguaro, candidates: self.spec.draft_candidates }
    }
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
                Job::Speculate { tokens, depth, allowed } => self.speculate(tokens, depth, allowed).await,
                Job::StartSd { req, confidence, candidates } => self.start_sd(req, confidence, candidates).await,
                Job::Draft { accepted, rec, n } => self.draft(accepted, rec, n).await,
                Job::Measure { tree_rows } => self.measure(tree_rows).await,
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
        if matches!(job, Job::Start { .. } | Job::StartSd { .. }) {
            self.speculator.abandon.store(false, Ordering::Relaxed);
        }
        self.speculator.handle(job).await
    }
}

impl<M: DraftLm> Speculator<M> {
    fn new(lm: M, abandon: Arc<AtomicBool>) -> Self {
        Speculator { abandon, session: None, sd: None, kv: DraftKv::new(lm) }
    }

    async fn start(&mut self, req: Request, spec: SpecConfig) -> Result<Reply> {
        self.session = None;
        self.sd = None;
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
                let mut drafting = s.drafting(&widths);
                let (p, span) = timed(self.kv.draft(rec, depth, 0.0, &mut drafting, None)).await?;
                // This round's glue pass rewrites these slots.
                self.kv.discard();
                (p, Some(span))
            }
        };
        Ok(Reply::Proposal { proposal, hit, backup })
    }

    /// Step 2 of a round, while the target verifies [rec, s1..sn] = `tokens`: the glue pass over
    /// them, the fan-out over its logits, and the tree of `depth` steps into the cache.
    async fn speculate(&mut self, tokens: Vec<u32>, depth: usize, allowed: Option<Allowed>) -> Result<Reply> {
        let s = self.session.as_mut().ok_or_else(|| Error::Worker("no generation started".into()))?;
        let (entries, temperature) = (s.policy.glue_entries(), fanout::ranking_temperature(&s.params));
        let (mut glue, glue_span) = timed(self.kv.glue(&tokens, entries, temperature)).await?;

        let drafted = tokens[1..].to_vec();
        if let Some(a) = &allowed {
            glue.keep_allowed(a);
        }
        let mut branches = s.policy.candidates(&glue, &drafted, &s.params);
        // A row with fewer allowed tokens than its width leaves the rest to tokens that can never
        // be the bonus: no branch for them.
        branches.retain(|&(k, t)| allowed.as_ref().is_none_or(|a| a.allows(k, t)));
        let widths = s.policy.widths(depth);
        // Both the target's end of the generation and a cancel cut the tree short.
        let (abandon, cancel) = (&self.abandon, s.cancel.clone());
        let stop = || abandon.load(Ordering::Relaxed) || cancel.is_cancelled();
        let mut drafting = s.drafting(&widths);
        let (speculated, spans) = self.kv.tree(&branches, depth, &mut drafting, &stop).await?;
        s.round = Some(Round { drafted, glue, cache: SpecCache::new(&branches, speculated) });
        Ok(Reply::Speculated { glue: glue_span, tree: spans })
    }

    /// A new SD generation: the prompt's prefill, and the draft's random stream seeded as SD
    /// seeds its own drafter's, so that the proposals are the ones it would make.
    async fn start_sd(&mut self, req: Request, confidence: f32, candidates: usize) -> Result<Reply> {
        self.session = None;
        self.sd = None;
        req.validate(self.kv.model(), 0)?;
        self.kv.prefill(&req.prompt).await?;
        let rng = draft_rng(req.sampling.seed);
        self.sd = Some(SdSession { params: req.sampling, rng, confidence, candidates, proposed: None });
        Ok(Reply::Started)
    }

    /// One SD round: commit the target's outcome for the last draft (`accepted` of its tokens),
    /// then draft up to `n` tokens after `rec`, as SD's model drafter does.
    async fn draft(&mut self, accepted: Option<usize>, rec: u32, n: usize) -> Result<Reply> {
        let s = self.sd.as_mut().ok_or_else(|| Error::Worker("no SD generation started".into()))?;
        match (s.proposed, accepted) {
            (None, None) => {}
            (Some(proposed), Some(k)) if k <= proposed => self.kv.resolve(k),
            (proposed, accepted) => {
                return Err(Error::Worker(format!("an SD outcome accepting {accepted:?} of {proposed:?} draft tokens")))
            }
        }
        let mut drafting = Drafting { params: &s.params, rng: &mut s.rng, saguaro: None, candidates: s.candidates };
        let (proposal, span) = timed(self.kv.draft(rec, n, s.confidence, &mut drafting, None)).await?;
        s.proposed = Some(proposal.tokens.len());
        Ok(Reply::Drafted { proposal, span })
    }

    async fn measure(&mut self, tree_rows: usize) -> Result<Reply> {
        self.session = None;
        self.sd = None;
        Ok(Reply::Measured { costs: self.kv.measure(tree_rows).await? })
    }
}

pub(crate) fn out_of_step() -> Error {
    Error::Worker("the draft worker answered out of step".into())
}

/// One draft worker serving SD and SSD alike (in the browser, one copy of the draft model in its
/// Web Worker): SSD holds it for a whole generation, SD for each job and its reply.
#[derive(Clone)]
pub struct SharedWorker {
    worker: Rc<Mutex<DraftWorker>>,
    config: ModelConfig,
    capacity: usize,
    concurrent: bool,
}

impl SharedWorker {
    pub fn new(worker: DraftWorker) -> Self {
        let (config, capacity, concurrent) = (worker.config.clone(), worker.capacity, worker.is_concurrent());
        SharedWorker { worker: Rc::new(Mutex::new(worker)), config, capacity, concurrent }
    }

    pub async fn lock(&self) -> MutexGuard<'_, DraftWorker> {
        self.worker.lock().await
    }

    /// See [`DraftWorker::is_concurrent`].
    pub fn is_concurrent(&self) -> bool {
        self.concurrent
    }

    /// Whether it can take jobs: not once its worker has stopped (a worker in use has not).
    pub fn ready(&self) -> bool {
        self.worker.try_lock().is_none_or(|w| !w.has_stopped())
    }

    /// See [`DraftWorker::room`].
    fn room(&self, req: &Request, scratch: usize) -> usize {
        req.room(context_of(&self.config, self.capacity, scratch))
    }
}

/// A draft worker as a [`WorkerDrafter`] holds it: borrowed for one generation, or shared.
enum Held<'a> {
    Borrowed(&'a mut DraftWorker),
    Shared(SharedWorker),
}

/// The worker a [`Held`] gives access to for one job and its reply.
enum Access<'b> {
    Borrowed(&'b mut DraftWorker),
    Locked(MutexGuard<'b, DraftWorker>),
}

impl Held<'_> {
    async fn get(&mut self) -> Access<'_> {
        match self {
            Held::Borrowed(w) => Access::Borrowed(w),
            Held::Shared(w) => Access::Locked(w.lock().await),
        }
    }
}

impl std::ops::Deref for Access<'_> {
    type Target = DraftWorker;
    fn deref(&self) -> &DraftWorker {
        match self {
            Access::Borrowed(w) => w,
            Access::Locked(w) => w,
        }
    }
}

impl std::ops::DerefMut for Access<'_> {
    fn deref_mut(&mut self) -> &mut DraftWorker {
        match self {
            Access::Borrowed(w) => w,
            Access::Locked(w) => w,
        }
    }
}

/// SD's drafter when the draft model lives on SSD's worker (in the browser, its own Web Worker),
/// so that one copy of the draft serves both modes. A round is one job and its reply: the last
/// round's outcome and up to K tokens asked for, the tokens (with their distributions when
/// sampling) sent back. The worker draws with a random stream of its own, seeded as SD seeds its
/// drafter's and used for nothing else (the `rng` SD passes goes unused), and drafts as
/// [`ModelDrafter`](crate::decode::ModelDrafter) does: the proposals are the ones that drafter
/// would make on the same model.
pub struct WorkerDrafter<'a> {
    worker: Held<'a>,
    /// How many tokens the target accepted of the last proposal: sent with the next round's job.
    accepted: Option<usize>,
    /// Milliseconds the worker spent drafting in this generation.
    busy_ms: f64,
}

impl<'a> WorkerDrafter<'a> {
    /// A drafter on `worker` for as long as it is borrowed.
    pub fn new(worker: &'a mut DraftWorker) -> Self {
        WorkerDrafter { worker: Held::Borrowed(worker), accepted: None, busy_ms: 0.0 }
    }
}

impl WorkerDrafter<'static> {
    /// A drafter on a worker shared with SSD, for generation after generation.
    pub fn shared(worker: SharedWorker) -> Self {
        WorkerDrafter { worker: Held::Shared(worker), accepted: None, busy_ms: 0.0 }
    }
}

impl Drafter for WorkerDrafter<'_> {
    fn name(&self) -> String {
        "model".into()
    }

    fn start<'a>(&'a mut self, req: &'a Request, spec: &'a SpecConfig) -> LocalBoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let mut worker = self.worker.get().await;
            // Replies a cancelled earlier generation left behind.
            worker.finish().await;
            self.accepted = None;
            self.busy_ms = 0.0;
            let (confidence, candidates) = (spec.confidence, spec.draft_candidates);
            worker.send(Job::StartSd { req: req.clone(), confidence, candidates })?;
            match worker.recv().await? {
                Reply::Started => Ok(()),
                _ => Err(out_of_step()),
            }
        })
    }

    fn propose<'a>(
        &'a mut self,
        rec: u32,
        n: usize,
        _params: &'a SamplingParams,
        _rng: &'a mut Rng,
    ) -> LocalBoxFuture<'a, Result<Proposal>> {
        Box::pin(async move {
            let mut worker = self.worker.get().await;
            worker.send(Job::Draft { accepted: self.accepted.take(), rec, n })?;
            match worker.recv().await? {
                Reply::Drafted { proposal, span } => {
                    self.busy_ms += span.ms();
                    Ok(proposal)
                }
                _ => Err(out_of_step()),
            }
        })
    }

    fn room(&self, req: &Request) -> usize {
        match &self.worker {
            Held::Borrowed(w) => w.room(req, 0),
            Held::Shared(w) => w.room(req, 0),
        }
    }

    fn accept(&mut self, _: &Proposal, accepted: usize) {
        self.accepted = Some(accepted);
    }

    fn busy_ms(&self) -> Option<f64> {
        Some(self.busy_ms)
    }

    fn ready(&self) -> bool {
        match &self.worker {
            Held::Borrowed(w) => !w.has_stopped(),
            Held::Shared(w) => w.ready(),
        }
    }

    fn time(&mut self, tree_rows: usize) -> LocalBoxFuture<'_, Result<DraftTiming>> {
        Box::pin(async move {
            let costs = self.worker.get().await.measure(tree_rows).await?;
            Ok(DraftTiming { costs, prior: PRIOR_ACCEPTANCE })
        })
    }
}
