//! Many generations at once: one target (and draft) shared by up to `parallel` sequences, each
//! generation joining and leaving between steps (continuous batching, `decode::batch`). What
//! `saguaro serve`'s OpenAI endpoints, `saguaro bench --concurrency` and the JS API loaded with
//! `parallel` run; [`Engine`] is the engine of one sequence at a time, with every mode.
//!
//! A generation's mode is the one asked for, or chosen as it joins from forwards timed at load:
//! at the batch size it joins, SD at the K with the most tokens per second, or AR where
//! speculation stops paying (a batch of decodes already keeps the weights' reads busy). An SD
//! generation then chooses each round's K from the acceptance it shows, at the costs of the
//! batch's size that round: K = 0, an AR step, where the batch has grown past where speculation
//! pays.
//!
//! [`Engine`]: crate::Engine

use crate::decode::speculation::{AdaptiveK, BatchSize, PRIOR_ACCEPTANCE};
use crate::decode::{time_forwards, Batcher, BoxedSink, Generation, Mode, Request, SpecConfig, MAX_K};
use crate::engine::{check_vocab, encode, rounds_seen, slimming, target_context, Engine, EngineOptions, GenerateOptions, Prompt};
use crate::error::{Error, Result};
use crate::grammar::Vocabulary;
use crate::model::load::ModelFile;
use crate::model::shared::Shared;
use crate::model::tokenizer::Tokenizer;

/// How much faster than AR SD must be expected to run at a batch size to be chosen there.
const MARGIN: f64 = 1.05;
/// Rounds of timed forwards at load (the first also pages the weights in).
const ROUNDS: usize = 2;

/// A target (and draft) serving several generations at once.
pub struct Pool {
    tokenizer: Tokenizer,
    chat_template: Option<String>,
    vocabulary: Option<Vocabulary>,
    spec: SpecConfig,
    vocab: usize,
    parallel: usize,
    batcher: Batcher<'static>,
    has_draft: bool,
    costs: Option<BatchCosts>,
    /// The batch's size, by which SD's sequences choose each round's K.
    batch_size: BatchSize,
}

/// A generation that joined: its id, the mode and K it runs with, its prompt's length.
#[derive(Clone, Copy, Debug)]
pub struct Joined {
    pub id: u64,
    pub mode: Mode,
    pub k: usize,
    pub prompt_tokens: usize,
}

impl Pool {
    /// Load `target` (and `draft`) as `opts` places them, with room for `parallel` sequences of
    /// `opts.context` tokens; with a draft and `opts.auto`, time the forwards the choice of mode
    /// needs (a few seconds).
    pub async fn load(target: ModelFile, draft: Option<ModelFile>, opts: &EngineOptions, parallel: usize) -> Result<Pool> {
        opts.validate()?;
        if parallel == 0 {
            return Err(Error::option("parallel", "must be at least 1"));
        }
        if let Some(d) = &draft {
            check_vocab(&target.tokenizer, &d.tokenizer)?;
        }
        let context = target_context(&target.weights.config, opts);
        let mut target_lm = opts.target.runner_with_slots(&target.weights, context, Shared::region(context) * parallel).await?;
        let mut draft_lm = match &draft {
            Some(d) => {
                let weights = slimming(d, opts).apply(&d.weights)?;
                let room = Engine::capacity(&d.weights.config, opts);
                Some((opts.draft.runner_with_slots(&weights, room, Shared::region(room) * parallel).await?, room))
            }
            None => None,
        };
        let costs = match &mut draft_lm {
            Some((lm, _)) if opts.auto => {
                let most = (parallel * (opts.spec.k.min(MAX_K) + 1)).min(context);
                let target_rows = sizes(most);
                let draft_rows = sizes(parallel);
                Some(BatchCosts {
                    target: target_rows.iter().copied().zip(time_forwards(target_lm.as_mut(), &target_rows, ROUNDS).await?).collect(),
                    draft: draft_rows.iter().copied().zip(time_forwards(lm.as_mut(), &draft_rows, ROUNDS).await?).collect(),
                    acceptance: PRIOR_ACCEPTANCE,
                })
            }
            _ => None,
        };
        let draft_shared = draft_lm.map(|(lm, room)| Shared::new(lm, room, parallel)).transpose()?;
        Ok(Pool {
            tokenizer: target.tokenizer,
            chat_template: target.chat_template,
            vocabulary: None,
            spec: opts.spec.clone(),
            vocab: target.weights.config.vocab_size,
            parallel,
            has_draft: draft_shared.is_some(),
            batcher: Batcher::new(Shared::new(target_lm, context, parallel)?, draft_shared),
            costs,
            batch_size: BatchSize::default(),
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Sequences the pool holds at once.
    pub fn parallel(&self) -> usize {
        self.parallel
    }

    /// Generations running.
    pub fn running(&self) -> usize {
        self.batcher.len()
    }

    /// Generations that can join now.
    pub fn free(&self) -> usize {
        self.batcher.free()
    }

    /// The mode (and K) a generation that names none takes, joining a batch of `batch`.
    pub fn choose(&self, batch: usize) -> (Mode, usize) {
        match &self.costs {
            Some(c) => c.choose(batch.min(self.parallel), self.spec.k),
            None => (if self.has_draft { Mode::Sd } else { Mode::Ar }, self.spec.k),
        }
    }

    /// Where the target computes, and the draft (their backends' names).
    pub fn backends(&self) -> (String, Option<String>) {
        (self.batcher.target().backend_name(), self.batcher.draft().map(Shared::backend_name))
    }

    pub fn target_config(&self) -> crate::model::config::ModelConfig {
        self.batcher.target().config()
    }

    pub fn has_draft(&self) -> bool {
        self.has_draft
    }

    /// The forwards timed at load and the acceptance seen, where the mode is chosen.
    pub fn costs(&self) -> Option<&BatchCosts> {
        self.costs.as_ref()
    }

    /// Start generating from each prompt of `arrivals`, which join together (a mode is chosen
    /// for the batch they make with the running ones); each committed piece of a generation's
    /// tokens goes to its sink (`false` cancels). Modes other than AR and SD, and tools, are
    /// refused, each arrival alone.
    pub fn join_all(&mut self, arrivals: Vec<(Prompt, GenerateOptions, BoxedSink<'static>)>) -> Vec<Result<Joined>> {
        let batch = self.batcher.len() + arrivals.len();
        arrivals.into_iter().map(|(prompt, opts, sink)| self.join_as(batch, &prompt, &opts, sink)).collect()
    }

    /// [`Pool::join_all`] of one prompt.
    pub fn join(&mut self, prompt: &Prompt, opts: &GenerateOptions, sink: BoxedSink<'static>) -> Result<Joined> {
        self.join_as(self.batcher.len() + 1, prompt, opts, sink)
    }

    /// Join, choosing the mode for a batch of `batch` sequences.
    fn join_as(&mut self, batch: usize, prompt: &Prompt, opts: &GenerateOptions, sink: BoxedSink<'static>) -> Result<Joined> {
        opts.validate()?;
        if opts.tools.is_some() {
            return Err(Error::option("tools", "are not served to several sequences at once"));
        }
        let ids = encode(&self.tokenizer, self.chat_template.as_deref(), prompt, &[])?;
        let grammar = match &opts.grammar {
            Some(g) => {
                let v = match &mut self.vocabulary {
                    Some(v) => v,
                    v => v.insert(Vocabulary::new(&self.tokenizer, self.vocab)?),
                };
                Some(std::sync::Arc::new(v.compile(g)?))
            }
            None => None,
        };
        let batch = batch.min(self.parallel);
        let (mode, k) = match opts.mode {
            Some(m) => (m, opts.spec.as_ref().map_or(self.spec.k, |s| s.k)),
            None => self.choose(batch),
        };
        if self.batcher.free() == 0 {
            return Err(Error::InvalidArgument(format!("all {} sequences are taken", self.parallel)));
        }
        let mut spec = SpecConfig { k, ..opts.spec.clone().unwrap_or_else(|| self.spec.clone()) };
        // Chosen here, K follows the acceptance the generation shows, at the costs of the batch's
        // size each round.
        if let (None, None, Some(c)) = (opts.mode, &opts.spec, &self.costs) {
            let table = (1..=self.parallel).map(|b| (0..=self.spec.k).map(|k| c.round_ms(b, k)).collect()).collect();
            spec.adapt = AdaptiveK::in_batch(table, self.batch_size.clone(), c.acceptance);
        }
        if spec.draft_scratch() > self.spec.draft_scratch() {
            return Err(Error::option("spec", format!("K {k} needs more draft cache than this pool was built for (K {})", self.spec.k)));
        }
        let req = Request {
            prompt: ids,
            max_tokens: opts.max_tokens,
            sampling: opts.sampling,
            stop: self.tokenizer.eos_ids().to_vec(),
            grammar,
            ..Request::default()
        };
        let prompt_tokens = req.prompt.len();
        let id = self.batcher.join(req, mode, &spec, sink)?;
        Ok(Joined { id, mode, k, prompt_tokens })
    }

    /// Stop generation `id` now, freeing its sequence.
    pub fn cancel(&mut self, id: u64) {
        self.batcher.cancel(id);
    }

    /// One step of every running generation (see [`Batcher::step`]): the ones that ended.
    pub async fn step(&mut self) -> Vec<(u64, Result<Generation>)> {
        self.batch_size.set(self.batcher.len());
        let done = self.batcher.step().await;
        for (_, result) in &done {
            if let (Some(c), Ok(g)) = (&mut self.costs, result) {
                // The per-token acceptance the choice reckons with (accepted over judged draft
                // tokens), not the share of proposed tokens accepted, which a longer K lowers.
                if let Some((a, _)) = g.stats.timeline.as_deref().and_then(rounds_seen) {
                    c.acceptance = 0.8 * c.acceptance + 0.2 * a;
                }
            }
        }
        done
    }
}

/// 1, 2, 3, 4, 6, 8, 12, ... up to and with `most`: the forward sizes timed, between which the
/// others are interpolated.
fn sizes(most: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..32).flat_map(|s| [1 << s, 3 << s]).filter(|&n| n < most).collect();
    v.sort_unstable();
    v.push(most);
    v.dedup();
    v
}

/// Forwards timed at load, by rows, for the choice of mode at each batch size.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BatchCosts {
    /// (rows, ms) of target forwards.
    pub target: Vec<(usize, f64)>,
    /// (rows, ms) of draft forwards, one row per sequence.
    pub draft: Vec<(usize, f64)>,
    /// Per-token acceptance: the prior, then what SD generations showed.
    pub acceptance: f64,
}

impl BatchCosts {
    /// An SD round drafting `k` tokens for each of `b` sequences and verifying them all (`k` = 0:
    /// an AR step of the batch).
    pub fn round_ms(&self, b: usize, k: usize) -> f64 {
        k as f64 * at(&self.draft, b) + at(&self.target, b * (k + 1))
    }

    /// The mode and K with the most tokens per second for a batch of `b` sequences, K up to
    /// `max_k`: SD where it beats AR by [`MARGIN`].
    pub fn choose(&self, b: usize, max_k: usize) -> (Mode, usize) {
        let a = self.acceptance;
        let ar = b as f64 / at(&self.target, b);
        let mut best = (Mode::Ar, max_k, ar * MARGIN);
        for k in 1..=max_k {
            let tokens: f64 = (0..=k).map(|i| a.powi(i as i32)).sum();
            let rate = b as f64 * tokens / self.round_ms(b, k);
            if rate > best.2 {
                best = (Mode::Sd, k, rate);
            }
        }
        (best.0, best.1)
    }
}

/// `timed`'s milliseconds at `n` rows: on the line between the sizes around it, or past the
/// largest on the line through the last two.
fn at(timed: &[(usize, f64)], n: usize) -> f64 {
    if let [(_, ms)] = timed {
        return *ms;
    }
    let i = timed.iter().position(|&(m, _)| m >= n).unwrap_or(timed.len() - 1).max(1);
    let ((n0, t0), (n1, t1)) = (timed[i - 1], timed[i]);
    t0 + (t1 - t0) * (n as f64 - n0 as f64) / (n1 - n0) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_cover_one_to_most() {
        assert_eq!(sizes(1), [1]);
        assert_eq!(sizes(40), [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40]);
    }

    /// A target whose forward costs the same up to 8 rows, then grows with them: SD pays for one
    /// sequence and stops paying once the batch's decodes fill what a forward can take.
    #[test]
    fn speculation_stops_where_a_batch_of_decodes_fills_the_forward() {
        let costs = BatchCosts {
            target: vec![(1, 50.0), (8, 50.0), (64, 400.0)],
            draft: vec![(1, 5.0), (8, 6.0)],
            acceptance: 0.8,
        };
        let (mode, k) = costs.choose(1, 8);
        assert_eq!(mode, Mode::Sd);
        assert!(k >= 4, "{k}");
        assert_eq!(costs.choose(8, 8).0, Mode::Ar);
        let hopeless = BatchCosts { acceptance: 0.05, ..costs };
        assert_eq!(hopeless.choose(1, 8).0, Mode::Ar);
    }
}
