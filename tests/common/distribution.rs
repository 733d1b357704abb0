//! Checking a sampler's output against the exact distribution of a tiny model: a target and a
//! draft over `VOCAB` tokens, the target's exact distribution of each position of a `SEQ`-token
//! continuation of `PROMPT` (and of some pairs of positions), counts of sampled sequences in the
//! same shape, and a chi-square test between them. Shared by the local (tests/lossless.rs) and
//! the remote (tests/remote.rs) checks that speculative sampling gives the target's distribution.

use std::sync::OnceLock;

use futures::executor::block_on;

use saguaro::decode::Request;
use saguaro::model::runner::{append, Lm, Want};
use saguaro::model::weights::ModelWeights;
use saguaro::sampling::{self, SamplingParams};

use super::{runner, tiny_weights};

pub const VOCAB: usize = 16;
pub const PROMPT: [u32; 3] = [1, 5, 9];
/// Tokens per sampled sequence; the statistics look at all of them. Six tokens let the first
/// round speculate two tokens deep, so later rounds take multi-token proposals from the cache.
pub const SEQ: usize = 6;
/// Sequences per strategy: enough for a bias of 2% of probability mass in one position's
/// distribution to stand out (see `a_two_percent_bias_is_detected` in tests/lossless.rs).
pub const SAMPLES: u64 = 20_000;
/// Draft tokens per round.
pub const K: usize = 2;
pub const TINY_CAPACITY: usize = 128;

/// A small top-k keeps the exact walk over every sequence cheap (about 4^5 forwards).
pub fn top4_sampling() -> SamplingParams {
    SamplingParams { temperature: 1.0, top_k: 4, ..SamplingParams::default() }
}

pub struct Tiny {
    pub target: ModelWeights,
    /// Different random weights over the same vocabulary.
    pub draft: ModelWeights,
}

pub fn tiny() -> &'static Tiny {
    static TINY: OnceLock<Tiny> = OnceLock::new();
    TINY.get_or_init(|| Tiny { target: tiny_weights(11, VOCAB, 2, 0.6), draft: tiny_weights(12, VOCAB, 1, 0.6) })
}

/// Positions i whose joint distribution with position i + 1 is checked: one pair early, one
/// where tokens from multi-token cache hits land.
pub const PAIRS: [usize; 2] = [1, 3];

/// The target's exact sampling distribution: the marginal of each position, and the joints of
/// the `PAIRS`.
pub struct Exact {
    pub marginal: Vec<Vec<f64>>,
    pub pairs: Vec<Vec<f64>>,
}

impl Exact {
    pub fn of(weights: &ModelWeights, params: &SamplingParams) -> Exact {
        let mut lm = runner(weights, TINY_CAPACITY);
        let mut e = Exact { marginal: vec![vec![0.0; VOCAB]; SEQ], pairs: vec![vec![0.0; VOCAB * VOCAB]; PAIRS.len()] };
        let logits = block_on(append(&mut lm, &PROMPT, Want::LastLogits)).unwrap().logits();
        e.walk(&mut lm, &logits, params, &mut Vec::new(), 1.0);
        e
    }

    /// Spread `prob`, the probability of `prefix`, over its continuations.
    fn walk(&mut self, lm: &mut dyn Lm, logits: &[f32], params: &SamplingParams, prefix: &mut Vec<u32>, prob: f64) {
        let p = sampling::probs(logits, params);
        let pos = prefix.len();
        for (t, &pt) in p.iter().enumerate() {
            let q = prob * pt as f64;
            if q == 0.0 {
                continue;
            }
            self.marginal[pos][t] += q;
            if let Some(i) = PAIRS.iter().position(|&i| i + 1 == pos) {
                self.pairs[i][prefix[pos - 1] as usize * VOCAB + t] += q;
            }
            if pos + 1 < SEQ {
                let len = lm.len();
                let next = block_on(append(lm, &[t as u32], Want::LastLogits)).unwrap().logits();
                prefix.push(t as u32);
                self.walk(lm, &next, params, prefix, q);
                prefix.pop();
                lm.truncate(len);
            }
        }
    }
}

/// Observed counts, in the shape of `Exact`.
pub struct Counts {
    marginal: Vec<Vec<u64>>,
    pairs: Vec<Vec<u64>>,
    n: u64,
}

impl Counts {
    pub fn of(samples: u64, mut generate: impl FnMut(u64) -> Vec<u32>) -> Counts {
        let mut c =
            Counts { marginal: vec![vec![0; VOCAB]; SEQ], pairs: vec![vec![0; VOCAB * VOCAB]; PAIRS.len()], n: samples };
        for seed in 0..samples {
            let toks = generate(seed);
            assert_eq!(toks.len(), SEQ, "seed {seed}");
            for (pos, &t) in toks.iter().enumerate() {
                c.marginal[pos][t as usize] += 1;
            }
            for (pair, &i) in c.pairs.iter_mut().zip(&PAIRS) {
                pair[toks[i] as usize * VOCAB + toks[i + 1] as usize] += 1;
            }
        }
        c
    }

    /// The z-scores of each statistic against the exact distribution.
    pub fn z_scores(&self, exact: &Exact) -> Vec<f64> {
        let marginals = self.marginal.iter().zip(&exact.marginal);
        let pairs = self.pairs.iter().zip(&exact.pairs);
        marginals.chain(pairs).map(|(c, p)| chi_square_z(c, p, self.n)).collect()
    }
}

/// Pearson's chi-square of `counts` against probabilities `probs` (cells expecting fewer than 5
/// pooled), as a standard normal z-score by the Wilson-Hilferty transform: large means the
/// counts were not drawn from `probs`.
pub fn chi_square_z(counts: &[u64], probs: &[f64], n: u64) -> f64 {
    let n = n as f64;
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pooled_count, mut pooled_expected) = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        let e = p * n;
        if e < 5.0 {
            pooled_count += c as f64;
            pooled_expected += e;
        } else {
            stat += (c as f64 - e).powi(2) / e;
            cells += 1;
        }
    }
    if pooled_expected > 0.0 {
        stat += (pooled_count - pooled_expected).powi(2) / pooled_expected.max(1.0);
        cells += 1;
    }
    let df = (cells - 1).max(1) as f64;
    let h = 2.0 / (9.0 * df);
    ((stat / df).cbrt() - (1.0 - h)) / h.sqrt()
}

/// Beyond this z-score (one-sided p ~ 2e-4) a strategy's output is declared biased.
pub const Z_BIASED: f64 = 3.5;

/// A `SEQ`-token continuation of `PROMPT`, sampled with `params` and `seed`.
pub fn seeded(params: SamplingParams, seed: u64) -> Request {
    let sampling = SamplingParams { seed, ..params };
    Request { prompt: PROMPT.to_vec(), max_tokens: SEQ, sampling, ..Request::default() }
}

pub fn assert_unbiased(what: &str, counts: &Counts, exact: &Exact) {
    let z = counts.z_scores(exact);
    eprintln!("{what}: z = {z:.2?}");
    assert!(z.iter().all(|&z| z < Z_BIASED), "{what}: output differs from the target's distribution, z = {z:.2?}");
}
