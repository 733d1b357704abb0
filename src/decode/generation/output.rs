//! What a generation produces: its tokens as they are committed (to a [`Sink`]), why it ended,
//! and the finished [`Generation`].

use std::sync::Arc;

use serde::Serialize;

use super::request::{CancelToken, Request};
use super::stats::Stats;
use crate::backend::Allowed;
use crate::error::Result;
use crate::grammar::Constraint;

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

/// Collects output tokens, stopping at a stop token, the token limit, a full context,
/// cancellation, or a grammar that is complete; walks the request's grammar along them.
pub(crate) struct Output<'a> {
    /// The request's grammar, walked along the tokens committed so far.
    pub grammar: Option<Constraint>,
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
    pub fn new(req: &'a Request, room: usize, sink: Sink<'a>, grammar: Option<Constraint>) -> Self {
        let (max, at_max) = if room < req.max_tokens {
            (room, FinishReason::ContextFull)
        } else {
            (req.max_tokens, FinishReason::MaxTokens)
        };
        Output { grammar, tokens: Vec::with_capacity(max), max, at_max, stop: &req.stop, cancel: &req.cancel, sink, finish: None }
    }

    /// Tokens that may still be committed.
    pub fn remaining(&self) -> usize {
        self.max - self.tokens.len()
    }

    /// Commit `tokens` in order, up to the first stop token or the limit; returns how many were
    /// taken. Sets `finish` when generation is over. A grammar that the tokens complete ends it
    /// as a stop token would.
    pub fn push(&mut self, tokens: &[u32]) -> Result<usize> {
        let mut n = 0;
        for &t in tokens {
            if self.finish.is_some() {
                break;
            }
            self.tokens.push(t);
            n += 1;
            if self.stop.contains(&t) {
                self.finish = Some(FinishReason::Eos);
                continue;
            }
            if let Some(g) = &mut self.grammar {
                g.consume(&[t])?;
                if g.complete() {
                    self.finish = Some(FinishReason::Eos);
                    continue;
                }
            }
            if self.tokens.len() >= self.max {
                self.finish = Some(self.at_max);
            }
        }
        let stopped = n > 0 && !(self.sink)(&tokens[..n]);
        if stopped || (self.finish.is_none() && self.cancel.is_cancelled()) {
            self.finish = Some(FinishReason::Cancelled);
        }
        Ok(n)
    }

    /// Where the grammar forces the next token, commit it (and return it); `None` without a
    /// grammar, where it forces nothing, or once the output is done.
    pub fn push_forced(&mut self) -> Result<Option<u32>> {
        let Some(t) = self.grammar.as_mut().filter(|_| self.finish.is_none()).and_then(Constraint::forced) else {
            return Ok(None);
        };
        self.push(&[t])?;
        self.grammar.as_mut().expect("a grammar forced the token").count_forced(1);
        Ok(Some(t))
    }

    /// The masks verifying `proposal` needs (one row per position, the first for the token after
    /// the output so far), and how many of its leading tokens the grammar allows: a proposal is
    /// cut there, as the target would reject the token after. `None` without a grammar.
    pub fn masks_along(&mut self, proposal: &[u32]) -> Result<Option<(usize, Arc<Allowed>)>> {
        let Some(g) = &mut self.grammar else { return Ok(None) };
        let (valid, rows) = g.along(proposal)?;
        Ok(Some((valid, Arc::new(rows))))
    }

    pub fn done(&self) -> bool {
        self.finish.is_some()
    }

    pub fn into_generation(self, mut stats: Stats) -> Generation {
        stats.grammar = self.grammar.as_ref().map(Constraint::stats);
        Generation { tokens: self.tokens, finish: self.finish.unwrap_or(self.at_max), stats }
    }
}
