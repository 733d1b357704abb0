//! What to generate: the request, the handle that cancels it, and the room it has in a model's
//! context.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::grammar::Grammar;
use crate::model::config::ModelConfig;
use crate::model::runner::Lm;
use crate::sampling::SamplingParams;

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
    /// What the output must match: every mode masks each position with it. It stays on the
    /// target's side: a draft elsewhere (a Web Worker, a server) drafts without it, and its
    /// proposals are cut at the first token the grammar refuses.
    #[serde(skip)]
    pub grammar: Option<Arc<Grammar>>,
}

/// A handle that stops a generation: checked once per round by every strategy, and by the SSD
/// draft worker between tree steps, so it takes effect within one round. Clones share one flag;
/// a cancelled generation ends with [`FinishReason::Cancelled`](super::output::FinishReason::Cancelled) and the tokens committed so far.
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
    /// generation that fills the context ends with [`FinishReason::ContextFull`](super::output::FinishReason::ContextFull).
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
