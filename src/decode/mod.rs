//! Generation strategies over (target, draft): plain autoregressive decoding, speculative
//! decoding (SD) and speculative speculative decoding (SSD). Strategies see models only through
//! [`Lm`]; they never touch kernels.

pub mod autoregressive;
pub mod choice;
pub mod drafter;
pub mod ngram;
pub mod speculative;
pub mod ssd;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::model::runner::Lm;
use crate::sampling::SamplingParams;

pub use autoregressive::generate_ar;
pub use choice::{Choice, Costs};
pub use drafter::{Drafter, ModelDrafter};
pub use ngram::{NgramConfig, PromptLookup};
pub use speculative::{generate_sd, generate_sd_with, Backup, Fanout, Mode, SpecConfig};
pub use ssd::{generate_ssd, DraftHost, DraftWorker};

/// What to generate.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Tokens that end generation (they are emitted, then generation stops).
    pub stop: Vec<u32>,
}

impl Request {
    /// Check the request against the model before anything runs; `scratch` is the extra cache
    /// room a strategy needs beyond prompt + output (speculation).
    pub fn validate(&self, lm: &dyn Lm, scratch: usize) -> Result<()> {
        self.sampling.validate()?;
        if self.prompt.is_empty() {
            return Err(Error::InvalidArgument("the prompt is empty".into()));
        }
        if self.max_tokens == 0 {
            return Err(Error::InvalidArgument("max_tokens must be at least 1".into()));
        }
        let vocab = lm.config().vocab_size;
        if let Some(&t) = self.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::InvalidArgument(format!("prompt token {t} is outside the vocabulary of {vocab}")));
        }
        let context = lm.config().context_length.min(lm.capacity().saturating_sub(scratch));
        if self.prompt.len() + self.max_tokens > context {
            return Err(Error::ContextOverflow { prompt: self.prompt.len(), requested: self.max_tokens, context });
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Eos,
    MaxTokens,
    Cancelled,
}

/// Statistics of one generation (the `stats` object of the CLI's `--json` output).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
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
}

/// One SD/SSD round, in ms from the start of decoding (after the prefill).
#[derive(Clone, Debug, Serialize)]
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

/// Collects output tokens, stopping at a stop token, the token limit or cancellation.
pub(crate) struct Output<'a> {
    pub tokens: Vec<u32>,
    max: usize,
    stop: &'a [u32],
    sink: Sink<'a>,
    pub finish: Option<FinishReason>,
}

impl<'a> Output<'a> {
    pub fn new(req: &'a Request, sink: Sink<'a>) -> Self {
        Output { tokens: Vec::with_capacity(req.max_tokens), max: req.max_tokens, stop: &req.stop, sink, finish: None }
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
                self.finish = Some(FinishReason::MaxTokens);
            }
        }
        if n > 0 && !(self.sink)(&tokens[..n]) {
            self.finish = Some(FinishReason::Cancelled);
        }
        n
    }

    pub fn done(&self) -> bool {
        self.finish.is_some()
    }

    pub fn into_generation(self, stats: Stats) -> Generation {
        Generation { tokens: self.tokens, finish: self.finish.unwrap_or(FinishReason::MaxTokens), stats }
    }
}

pub(crate) fn elapsed_ms(since: web_time::Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}
