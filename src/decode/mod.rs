//! Generation strategies over (target, draft): plain autoregressive decoding, speculative
//! decoding (SD) and speculative speculative decoding (SSD). Strategies see models only through
//! [`Lm`]; they never touch kernels.
//!
//! SD (`speculative`, with its drafters `model_drafter` and `ngram`) and SSD (`ssd`) import
//! neither each other: what they share (configuration, the drafter interface, verification, the
//! draft's KV-cache rules, the speculation tree) is `spec`, which imports neither of them.

pub mod autoregressive;
pub mod choice;
pub mod model_drafter;
pub mod ngram;
mod session;
mod target_rows;
pub mod spec;
pub mod speculative;
pub mod ssd;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::runner::Lm;
use crate::sampling::SamplingParams;

pub use autoregressive::generate_ar;
pub use choice::{Choice, Costs, DraftCosts};
pub use model_drafter::ModelDrafter;
pub use ngram::{NgramConfig, PromptLookup};
pub use spec::{check_draft, Backup, Drafter, Fanout, Mode, SpecConfig, DEFAULT_CONFIDENCE, DEFAULT_DRAFT_CANDIDATES};
pub use speculative::{generate_sd, generate_sd_with};
pub use ssd::{generate_ssd, DraftHost, DraftWorker, WorkerDrafter};

/// What to generate.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Tokens that end generation (they are emitted, then generation stops).
    pub stop: Vec<u32>,
    /// Cancels this generation from elsewhere (another thread, a JS AbortSignal's handler).
    /// It cannot cross to a draft in another process or Web Worker: there the request arrives
    /// with a token of its own, and the target's side stops the generation within the round.
    #[serde(skip)]
    pub cancel: CancelToken,
}

/// A handle that stops a generation: checked once per round by every strategy, and by the SSD
/// draft worker between tree steps, so it takes effect within one round. Clones share one flag;
/// a cancelled generation ends with [`FinishReason::Cancelled`] and the tokens committed so far.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Tokens one sequence can occupy in a model with `config` and `capacity` KV slots, keeping
/// `scratch` slots free for speculation.
pub(crate) fn context_of(config: &ModelConfig, capacity: usize, scratch: usize) -> usize {
    config.context_length.min(capacity.saturating_sub(scratch))
}

impl Request {
    /// Check the request against the model before anything runs; `scratch` is the extra cache
    /// room a strategy needs beyond prompt + output (speculation). Returns how many tokens the
    /// model has room to generate after the prompt: `max_tokens` is an upper bound, and a
    /// generation that fills the context ends with [`FinishReason::ContextFull`].
    pub fn validate(&self, lm: &dyn Lm, scratch: usize) -> Result<usize> {
        self.sampling.validate()?;
        if self.prompt.is_empty() {
            return Err(Error::option("prompt", "is empty: there is nothing to continue"));
        }
        if self.max_tokens == 0 {
            return Err(Error::option("max_tokens", "must be at least 1"));
        }
        let vocab = lm.config().vocab_size;
        if let Some(&t) = self.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::InvalidArgument(format!("prompt token {t} is outside the vocabulary of {vocab}")));
        }
        let context = context_of(lm.config(), lm.capacity(), scratch);
        match self.room(context) {
            0 => Err(Error::PromptTooLong { prompt: self.prompt.len(), context }),
            room => Ok(room),
        }
    }

    /// Tokens that fit after the prompt in a context of `context` tokens.
    pub(crate) fn room(&self, context: usize) -> usize {
        context.saturating_sub(self.prompt.len())
    }

    /// How many tokens a speculative generation may produce: as many as the target has room
    /// for, up to `max_tokens`, which the draft (with `draft_room` after the prompt) must follow.
    pub(crate) fn speculative_room(&self, target_room: usize, draft_room: usize) -> Result<usize> {
        let need = self.max_tokens.min(target_room);
        if draft_room < need {
            return Err(Error::IncompatibleDraft(format!(
                "the draft's context has room for {draft_room} tokens after this {}-token prompt, but the request \
                 may generate {need}: give the draft a larger context or ask for fewer tokens",
                self.prompt.len()
            )));
        }
        Ok(target_room)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Eos,
    MaxTokens,
    /// The context window is full: the model cannot attend to another token.
    ContextFull,
    Cancelled,
}

/// Statistics of one generation (the `stats` object of the CLI's `--json` output).
#[derive(Clone, Debug, Default, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename_all = "camelCase", optional_fields))]
pub struct Stats {
    #[cfg_attr(test, ts(as = "crate::decode::Mode"))]
    pub mode: String,
    pub prompt_tokens: usize,
    pub generated: usize,
    pub tokens_per_s: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    /// Target forwards after prefill (one per token for AR, one per round for SD/SSD).
    pub rounds: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acceptance_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_accepted: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_hit_rate: Option<f64>,
    /// SSD: cache hits that supplied two or more draft tokens (their later tokens were drawn at
    /// tree steps past the first, so a sampled one is verified against a q from such a step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multi_token_hits: Option<usize>,
    pub target_busy_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_busy_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlap_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify_ms_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree_step_ms_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub glue_ms_mean: Option<f64>,
    /// SD/SSD: each round's times, for drawing how draft and target overlap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<RoundTimes>>,
    /// When the engine chose the mode and K: its choice and the costs it measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto: Option<Choice>,
    /// With a target on a server: what its requests cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<crate::remote::RemoteStats>,
}

/// One SD/SSD round, in ms from the start of decoding (after the prefill).
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename_all = "camelCase"))]
pub struct RoundTimes {
    /// The target's verification forward.
    pub verify: [f64; 2],
    /// The draft's work on this round: SD's drafting before the verify; SSD's glue pass and
    /// tree for the next round, which runs during the verify.
    pub draft: Option<[f64; 2]>,
    pub proposed: usize,
    pub accepted: usize,
    /// SSD: whether the proposal came from the speculation cache.
    pub hit: Option<bool>,
}

impl Stats {
    pub(crate) fn finish(&mut self, generated: usize, decode_ms: f64) {
        self.generated = generated;
        self.decode_ms = decode_ms;
        // The first token comes from the prefill, so the decode phase produced one fewer.
        let decoded = generated.saturating_sub(1) as f64;
        self.tokens_per_s = if decode_ms > 0.0 { decoded * 1000.0 / decode_ms } else { 0.0 };
    }
}

#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated tokens, including the stop token that ended generation.
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub stats: Stats,
}

/// Receives committed tokens as they are produced; returning `false` cancels generation.
pub type Sink<'a> = &'a mut dyn FnMut(&[u32]) -> bool;

/// Collects output tokens, stopping at a stop token, the token limit, a full context or
/// cancellation.
pub(crate) struct Output<'a> {
    pub tokens: Vec<u32>,
    max: usize,
    /// Why generation ends when `max` tokens are reached.
    at_max: FinishReason,
    stop: &'a [u32],
    cancel: &'a CancelToken,
    sink: Sink<'a>,
    pub finish: Option<FinishReason>,
}

impl<'a> Output<'a> {
    /// Output for `req` on models with `room` tokens of context left after the prompt.
    pub fn new(req: &'a Request, room: usize, sink: Sink<'a>) -> Self {
        let (max, at_max) = if room < req.max_tokens {
            (room, FinishReason::ContextFull)
        } else {
            (req.max_tokens, FinishReason::MaxTokens)
        };
        Output { tokens: Vec::with_capacity(max), max, at_max, stop: &req.stop, cancel: &req.cancel, sink, finish: None }
    }

    /// Tokens that may still be committed.
    pub fn remaining(&self) -> usize {
        self.max - self.tokens.len()
    }

    /// Commit `tokens` in order, up to the first stop token or the limit; returns how many were
    /// taken. Sets `finish` when generation is over.
    pub fn push(&mut self, tokens: &[u32]) -> usize {
        let mut n = 0;
        for &t in tokens {
            if self.finish.is_some() {
                break;
            }
            self.tokens.push(t);
            n += 1;
            if self.stop.contains(&t) {
                self.finish = Some(FinishReason::Eos);
            } else if self.tokens.len() >= self.max {
                self.finish = Some(self.at_max);
            }
        }
        let stopped = n > 0 && !(self.sink)(&tokens[..n]);
        if stopped || (self.finish.is_none() && self.cancel.is_cancelled()) {
            self.finish = Some(FinishReason::Cancelled);
        }
        n
    }

    pub fn done(&self) -> bool {
        self.finish.is_some()
    }

    pub fn into_generation(self, stats: Stats) -> Generation {
        Generation { tokens: self.tokens, finish: self.finish.unwrap_or(self.at_max), stats }
    }
}

pub(crate) fn elapsed_ms(since: web_time::Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}
