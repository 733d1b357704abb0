//! What a generation produces: its tokens as they are committed (to a [`Sink`]), why it ended,
//! and the finished [`Generation`].

use serde::Serialize;

use super::request::{CancelToken, Request};
use super::stats::Stats;

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
