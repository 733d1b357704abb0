//! One generation's walk through a grammar: which tokens may come next, what it forces, and the
//! masks of a run of draft tokens, each walked and then rolled back.

use llguidance::Matcher;
use web_time::Instant;

use crate::backend::Allowed;
use crate::error::{Error, Result};

/// What a grammar cost and saved in one generation (the `grammar` object of a generation's stats).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename_all = "camelCase"))]
pub struct GrammarStats {
    /// Output tokens the grammar forced: committed without being sampled (AR runs them with the
    /// next token's forward).
    pub forced_tokens: usize,
    /// Masks computed (forced positions need none).
    pub masks: usize,
    /// Milliseconds per mask: the median and the 99th percentile.
    pub mask_ms_median: f64,
    pub mask_ms_p99: f64,
}

/// A grammar walked along the output so far.
pub struct Constraint {
    matcher: Matcher,
    stop: Vec<u32>,
    cols: usize,
    mask_ms: Vec<f64>,
    forced: usize,
}

impl Constraint {
    pub(super) fn new(matcher: Matcher, stop: &[u32], cols: usize) -> Self {
        Constraint { matcher, stop: stop.to_vec(), cols, mask_ms: Vec::new(), forced: 0 }
    }

    /// The next token where the grammar forces it: the first of the canonical tokenization of
    /// the bytes it forces.
    pub fn forced(&mut self) -> Option<u32> {
        if self.matcher.is_stopped() {
            return None;
        }
        self.matcher.compute_ff_tokens().first().copied()
    }

    /// The tokens its masks cover.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Whether the grammar is complete and admits nothing more: the output ends here.
    pub fn complete(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The tokens that may come next, as one mask row's words: the forced token alone where
    /// there is one, else the grammar's mask with the stop tokens exactly where it accepts.
    pub fn allowed(&mut self) -> Result<Vec<u32>> {
        let cols = self.cols;
        let mut row = vec![0u32; cols.div_ceil(32)];
        let set = |row: &mut [u32], t: u32| {
            if (t as usize) < cols {
                row[t as usize / 32] |= 1 << (t % 32);
            }
        };
        if let Some(t) = self.forced() {
            set(&mut row, t);
            return Ok(row);
        }
        if !self.matcher.is_stopped() {
            let started = Instant::now();
            let mask = self.matcher.compute_mask().map_err(|e| self.failed(e))?;
            self.mask_ms.push(started.elapsed().as_secs_f64() * 1e3);
            row.iter_mut().zip(mask.as_slice()).for_each(|(r, m)| *r = *m);
            // The grammar engine's own end-of-sequence tokens give way to this request's stops.
            for &t in self.matcher.tok_env().map_err(|e| self.failed(e))?.tok_trie().eos_tokens() {
                if (t as usize) < self.cols {
                    row[t as usize / 32] &= !(1 << (t % 32));
                }
            }
        }
        if self.matcher.is_stopped() || self.matcher.is_accepting().map_err(|e| self.failed(e))? {
            self.stop.iter().for_each(|&t| set(&mut row, t));
        }
        if row.iter().all(|&w| w == 0) {
            if self.matcher.is_stopped() {
                // Complete, and no stop token to end with: the output ends here whatever follows.
                row.fill(u32::MAX);
                return Ok(row);
            }
            return Err(Error::InvalidGrammar("no token of this model's vocabulary can continue the output here".into()));
        }
        Ok(row)
    }

    /// Commit `tokens` (a stop token ends them: the output ends there).
    pub fn consume(&mut self, tokens: &[u32]) -> Result<()> {
        let end = tokens.iter().position(|t| self.stop.contains(t)).unwrap_or(tokens.len());
        self.matcher.consume_tokens(&tokens[..end]).map_err(|e| self.failed(e))
    }

    /// Whether `token` ends the output.
    pub fn is_stop(&self, token: u32) -> bool {
        self.stop.contains(&token)
    }

    /// Undo the last `n` tokens consumed.
    pub fn rollback(&mut self, n: usize) -> Result<()> {
        self.matcher.rollback(n).map_err(|e| self.failed(e))
    }

    /// Count `n` committed tokens as forced.
    pub fn count_forced(&mut self, n: usize) {
        self.forced += n;
    }

    /// The masks of the positions after each of `tokens` in turn, from here: walks the longest
    /// prefix of `tokens` the grammar allows (up to and with a stop token it allows), then rolls
    /// back. Returns that prefix's length and one row per position, the first for the token
    /// after the output so far: what verifying the prefix needs.
    pub fn along(&mut self, tokens: &[u32]) -> Result<(usize, Allowed)> {
        let mut rows = Allowed::new(self.cols);
        let mut walked = 0;
        let mut valid = 0;
        for &t in tokens {
            let row = self.allowed()?;
            rows.push(&row);
            let allowed = row[t as usize / 32] >> (t % 32) & 1 == 1 && (t as usize) < self.cols;
            if !allowed {
                break;
            }
            valid += 1;
            if self.stop.contains(&t) {
                break;
            }
            self.matcher.consume_token(t).map_err(|e| self.failed(e))?;
            walked += 1;
        }
        // The row after the last allowed token, unless the walk stopped at a refused one (whose
        // row is the last already); after a stop token the output has ended: it decides nothing.
        if rows.rows() == valid {
            match tokens[..valid].last().is_some_and(|t| self.stop.contains(t)) {
                true => rows.push_all(),
                false => rows.push(&self.allowed()?),
            }
        }
        self.matcher.rollback(walked).map_err(|e| self.failed(e))?;
        Ok((valid, rows))
    }

    /// The walk's statistics so far.
    pub fn stats(&self) -> GrammarStats {
        let mut ms = self.mask_ms.clone();
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms.get(((ms.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
        GrammarStats { forced_tokens: self.forced, masks: ms.len(), mask_ms_median: at(0.5), mask_ms_p99: at(0.99) }
    }

    fn failed(&self, e: impl std::fmt::Display) -> Error {
        Error::InvalidGrammar(format!("the grammar failed on the output: {e}"))
    }
}
