//! A token drawn from each row of logits where the rows were computed ([`Backend::draw`]):
//! sampling that keeps the whole vocabulary reads back a token and a probability per row, not
//! the row.
//!
//! The GPU draws a row by an exponential race. Every column c whose probability r_c is positive
//! gets a time E_c ~ Exp(1); the column with the largest `ln r_c - ln E_c` (the smallest
//! E_c / r_c) wins, which it does with probability exactly r_c / Σ r. The times come from a hash
//! of (seed, row, column) ([`race_bits`]), so each column is drawn on its own, by any thread.
//! The host, whose rows are in memory, draws from the same distribution by inverse CDF.
//!
//! r is the row's softmax at a temperature, or where the row comes with a distribution q (the
//! one a rejected draft token was drawn from), the residual `max(0, p - q)`, which is what
//! speculative verification draws its bonus token from after a rejection; where that is zero
//! everywhere, p itself, as the residual of speculation's acceptance math does.
//!
//! [`Backend::draw`]: super::Backend::draw

use crate::error::{Error, Result};
use crate::sampling::{self, Rng, SamplingParams};

use super::NO_SLOT;

/// A distribution given by its positive entries, columns ascending.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SparseDist {
    ids: Vec<u32>,
    probs: Vec<f32>,
}

impl SparseDist {
    /// The positive entries of a distribution over the whole vocabulary.
    pub fn of(dense: &[f32]) -> SparseDist {
        let (ids, probs) = dense.iter().enumerate().filter(|&(_, &p)| p > 0.0).map(|(i, &p)| (i as u32, p)).unzip();
        SparseDist { ids, probs }
    }

    /// `q`'s probability at `col`; 0 where it has no entry.
    pub fn at(&self, col: u32) -> f32 {
        self.ids.binary_search(&col).map_or(0.0, |j| self.probs[j])
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The same entries under the columns `map` gives them (dropped where it gives none),
    /// ascending again: a pruned head's rows are tokens in another order.
    pub fn mapped(&self, map: impl Fn(u32) -> Option<u32>) -> SparseDist {
        let mut pairs: Vec<(u32, f32)> =
            self.ids.iter().zip(&self.probs).filter_map(|(&c, &p)| map(c).map(|m| (m, p))).collect();
        pairs.sort_unstable_by_key(|&(c, _)| c);
        let (ids, probs) = pairs.into_iter().unzip();
        SparseDist { ids, probs }
    }
}

/// What [`super::Backend::draw`] draws: one row per entry of `at`.
#[derive(Clone, Debug, PartialEq)]
pub struct Draw {
    pub temperature: f32,
    /// What the draw's randomness comes from: with the row and the column, the GPU race's
    /// times; with the row, the host's random streams.
    pub seed: u64,
    /// Each row's column whose probability comes back ([`NO_SLOT`]: none).
    pub at: Vec<u32>,
    /// Each row's q, drawn from the residual `max(0, p - q)` where not empty. Empty: none for
    /// any row.
    pub minus: Vec<SparseDist>,
}

/// One row's draw.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Drawn {
    pub token: u32,
    /// The row's probability (the softmax at the temperature, not the residual) at its asked-for
    /// column; 0 for none.
    pub p_at: f32,
}

impl Draw {
    pub fn rows(&self) -> usize {
        self.at.len()
    }

    /// The arguments for a tensor of `rows` rows of `cols` columns.
    pub(crate) fn check(&self, rows: usize, cols: usize) -> Result<()> {
        let t = self.temperature;
        let ok = rows == self.at.len()
            && (self.minus.is_empty() || self.minus.len() == rows)
            && cols > 0
            && t.is_finite()
            && t > 0.0
            && (1.0 / t).is_finite();
        if !ok {
            return Err(Error::InvalidArgument(format!(
                "a draw at temperature {t} for {} rows with {} residuals from {rows} rows of {cols}",
                self.at.len(),
                self.minus.len()
            )));
        }
        Ok(())
    }

    /// The same draw from a pruned head's rows, whose column j is token `tokens[j]`: the draws
    /// come back as columns, which `tokens` turns into token ids.
    pub(crate) fn for_head(&self, tokens: &[u32]) -> Draw {
        let column = |t: u32| tokens.iter().position(|&x| x == t).map(|j| j as u32);
        Draw {
            at: self.at.iter().map(|&a| column(a).unwrap_or(NO_SLOT)).collect(),
            minus: self.minus.iter().map(|q| q.mapped(column)).collect(),
            ..self.clone()
        }
    }

    /// The bytes a backend needs besides the rows, as u32 words: each row's asked-for column,
    /// `rows + 1` offsets into the q entries, their columns, then their probabilities' bits.
    #[cfg(any(test, feature = "gpu"))]
    pub(crate) fn packed(&self) -> Vec<u32> {
        let rows = self.rows();
        let total: usize = self.minus.iter().map(SparseDist::len).sum();
        let mut words = Vec::with_capacity(2 * rows + 1 + 2 * total);
        words.extend_from_slice(&self.at);
        let mut offset = 0;
        words.push(0);
        for r in 0..rows {
            offset += self.minus.get(r).map_or(0, SparseDist::len);
            words.push(offset as u32);
        }
        for q in &self.minus {
            words.extend_from_slice(&q.ids);
        }
        for q in &self.minus {
            words.extend(q.probs.iter().map(|p| p.to_bits()));
        }
        words
    }
}

/// The bits that give column `col` of row `row` its time in the GPU's race (`shaders/draw.wgsl`
/// hashes the same way): murmur3's 32-bit finalizer, a bijection, chained over the inputs, so
/// that within a row each column gets different bits. The time is -ln(1 - v) for v uniform in
/// (0, 1) at the bits' midpoint.
pub fn race_bits(seed: u64, row: u32, col: u32) -> u32 {
    let row_key = mix(mix(mix((seed >> 32) as u32 ^ 0x9e37_79b9) ^ seed as u32).wrapping_add(row));
    mix(mix(col.wrapping_add(row_key)) ^ row_key)
}

fn mix(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// [`super::Backend::draw`] on the host, over `rows` of `cols` values. Where the rows are in
/// memory already a race is no cheaper than [`sampling::probs`] and an inverse-CDF draw, which
/// vectorise: this draws that way, one random stream per row from the seed, so it draws from the
/// same distribution as the GPU's race though not the same token for a seed.
pub fn on_host(x: &[f32], cols: usize, draw: &Draw) -> Result<Vec<Drawn>> {
    let rows = draw.rows();
    draw.check(rows, cols)?;
    if x.len() != rows * cols {
        return Err(Error::InvalidArgument(format!("a draw from {} values as {rows} rows of {cols}", x.len())));
    }
    let params = SamplingParams { temperature: draw.temperature, ..SamplingParams::default() };
    let drawn = x.chunks_exact(cols).enumerate().map(|(r, row)| {
        let p = sampling::probs(row, &params);
        let p_at = p.get(draw.at[r] as usize).copied().unwrap_or(0.0);
        let mut rng = Rng::new(draw.seed ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let token = match draw.minus.get(r).filter(|q| !q.is_empty()) {
            Some(q) => {
                let mut residual = p.clone();
                for (&c, &qc) in q.ids.iter().zip(&q.probs) {
                    if let Some(w) = residual.get_mut(c as usize) {
                        *w = (*w - qc).max(0.0);
                    }
                }
                // Zero everywhere only where p == q, where no rejection happens: p, as
                // speculation's residual gives.
                let weighs = residual.iter().any(|&w| w > 0.0);
                sampling::sample(if weighs { &residual } else { &p }, &mut rng)
            }
            None => sampling::sample(&p, &mut rng),
        };
        Drawn { token, p_at }
    });
    Ok(drawn.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn race_bits_differ_by_column_row_and_seed() {
        let row: std::collections::HashSet<u32> = (0..10_000).map(|c| race_bits(7, 3, c)).collect();
        assert_eq!(row.len(), 10_000);
        assert_ne!(race_bits(7, 3, 0), race_bits(7, 4, 0));
        assert_ne!(race_bits(7, 3, 0), race_bits(8, 3, 0));
        assert_ne!(race_bits(7 << 32, 3, 0), race_bits(8 << 32, 3, 0));
    }

    #[test]
    fn packed_lays_out_columns_offsets_and_entries() {
        let draw = Draw {
            temperature: 1.0,
            seed: 0,
            at: vec![4, NO_SLOT],
            minus: vec![SparseDist::of(&[0.0, 0.25, 0.0, 0.75]), SparseDist::of(&[1.0])],
        };
        let (a, b, c) = (0.25f32.to_bits(), 0.75f32.to_bits(), 1.0f32.to_bits());
        assert_eq!(draw.packed(), vec![4, NO_SLOT, 0, 2, 3, 1, 3, 0, a, b, c]);
    }

    #[test]
    fn a_pruned_head_maps_columns() {
        let draw = Draw { temperature: 1.0, seed: 0, at: vec![9], minus: vec![SparseDist::of(&[0.5, 0.0, 0.25, 0.25])] };
        let head = draw.for_head(&[3, 2, 9]);
        assert_eq!(head.at, vec![2]);
        assert_eq!(head.minus[0], SparseDist { ids: vec![0, 1], probs: vec![0.25, 0.25] });
    }
}
