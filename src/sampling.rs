//! From logits to a token. (The acceptance math of speculation, which builds on these
//! distributions, is `crate::decode::speculation`'s `accept` module.)
//!
//! Everything here works on plain slices over the whole vocabulary so that the CPU path, the GPU
//! read-back path and the speculative verifier share one definition of "the distribution we
//! sample from". Losslessness of speculative decoding depends on the verifier seeing exactly the
//! distribution that plain sampling would have drawn from, so `probs` is the single source of it.
//!
//! These run once per generated or verified token over a ~150k vocabulary, so the full-vocabulary
//! passes are written as independent lanes the compiler can vectorise, and nothing sorts the whole
//! vocabulary.

use std::collections::BinaryHeap;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};

/// How to turn logits into a token.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy decoding.
    pub temperature: f32,
    /// Keep only the `top_k` highest logits; 0 turns the filter off.
    pub top_k: usize,
    /// Keep only the smallest nucleus holding at least this much probability; 1.0 turns it off.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<()> {
        let t = self.temperature;
        if !t.is_finite() || t < 0.0 {
            return Err(Error::option("temperature", format!("must be a finite number >= 0 (0 means greedy), got {t}")));
        }
        let p = self.top_p;
        // Written as a negated range test so that NaN is rejected too.
        if !(p > 0.0 && p <= 1.0) {
            return Err(Error::option("top_p", format!("must be in (0, 1] (1 disables it), got {p}")));
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// The seeded random source of a generation.
#[derive(Clone, Debug)]
pub struct Rng(ChaCha8Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(ChaCha8Rng::seed_from_u64(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1), with 24 bits of resolution (all an f32 mantissa holds).
    pub fn uniform(&mut self) -> f32 {
        (self.0.next_u32() >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Uniform in [0, 1) with 53 bits of resolution. Sampling uses this one: with 24 bits, each
    /// token's chance would be rounded to a multiple of 2^-24, which across a 150k-token tail adds
    /// up to a visible bias.
    pub fn uniform_f64(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

const LANES: usize = 8;

/// The largest non-NaN value; -inf when there is none.
fn max_value(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            // A comparison rather than f32::max, which the compiler will not vectorise; a NaN
            // compares false and is skipped.
            acc[j] = if c[j] > acc[j] { c[j] } else { acc[j] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in acc.iter().chain(rest) {
        if x > m {
            m = x;
        }
    }
    m
}

/// The sum of the positive entries, accumulated in f64. Zero, negative and NaN entries add nothing.
pub(crate) fn positive_sum(xs: &[f32]) -> f64 {
    let mut acc = [0.0f64; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            acc[j] += if c[j] > 0.0 { c[j] as f64 } else { 0.0 };
        }
    }
    let mut s: f64 = acc.iter().sum();
    for &x in rest {
        if x > 0.0 {
            s += x as f64;
        }
    }
    s
}

/// e^x for x <= 0 (and 0 for NaN), branch-free so the loop over the vocabulary vectorises; libm's
/// expf does not, and would otherwise dominate `probs`. Cephes' expf reduction and polynomial,
/// within about 1e-7 relative error; below -87, where e^x leaves the normal f32 range, it gives 0.
#[inline(always)]
fn exp_nonpos(x: f32) -> f32 {
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = if x > -87.0 { x } else { -87.0 };
    let shifted = xc * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    // The rounded exponent also sits in the low mantissa bits of `shifted`; reading it there
    // keeps the loop in integer lanes instead of a saturating float-to-int conversion.
    let e = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let z = r * r;
    let y = (((((1.987_569_1e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5)
        * z
        + r
        + 1.0;
    let scale = f32::from_bits((e.wrapping_add(127) as u32) << 23);
    if x > -87.0 { y * scale } else { 0.0 }
}

/// The first index of the largest value. NaN never wins; an empty or all-NaN slice gives 0.
pub fn argmax(logits: &[f32]) -> u32 {
    const BLOCK: usize = 64;
    let m = max_value(logits);
    // Locate the block first with a branch-free test, since an early-exit scan of the whole
    // vocabulary does not vectorise.
    for (b, block) in logits.chunks(BLOCK).enumerate() {
        if block.iter().fold(false, |hit, &x| hit | (x == m)) {
            let i = block.iter().position(|&x| x == m).unwrap_or(0);
            return (b * BLOCK + i) as u32;
        }
    }
    0
}

/// `ln Σ exp(x / temperature)` over the entries that are not NaN, with the max subtracted so
/// nothing overflows, summed in f64 lanes: the full-vocabulary pass vectorises. -inf when every
/// entry is -inf or NaN; +inf when one is +inf.
pub fn log_sum_exp(xs: &[f32], temperature: f32) -> f32 {
    let max = max_value(xs);
    if !max.is_finite() {
        return max;
    }
    let inv_t = 1.0 / temperature;
    let mut acc = [0.0f64; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            acc[j] += exp_nonpos((c[j] - max) * inv_t) as f64;
        }
    }
    let mut sum: f64 = acc.iter().sum();
    for &x in rest {
        sum += exp_nonpos((x - max) * inv_t) as f64;
    }
    (max as f64 * inv_t as f64 + sum.ln()) as f32
}

/// [`probs`] over a few candidate tokens, as if every other logit were -inf: `ids` with their
/// logits `values`, ordered as [`top_n`] orders them (larger first, the lower id on ties), so
/// that top-k and the nucleus break ties by token id as `probs` does over the whole vocabulary.
/// Full vocabulary length, zeros outside the candidates.
pub fn probs_among(ids: &[u32], values: &[f32], vocab: usize, p: &SamplingParams) -> Vec<f32> {
    debug_assert_eq!(ids.len(), values.len());
    let mut out = vec![0.0f32; vocab];
    for (&id, q) in ids.iter().zip(probs(values, p)) {
        if let Some(o) = out.get_mut(id as usize) {
            *o = q;
        }
    }
    out
}

/// [`probs`] of a nucleus without a top-k (`p.top_k` 0, `p.top_p` < 1) from a row's largest
/// logits alone: `ids` with their logits `values`, ordered as [`top_n`] orders them, and `lse`,
/// the whole row's [`log_sum_exp`] at the temperature, which gives the mass of the tokens left
/// out. `None` where they cannot tell ([`nucleus_told`]). Elsewhere the same nucleus as [`probs`]
/// over the whole row, whose total weight it takes from `lse`.
pub fn nucleus_among(ids: &[u32], values: &[f32], lse: f32, vocab: usize, p: &SamplingParams) -> Option<Vec<f32>> {
    let cand = nucleus_keys(ids, values, lse, vocab, p)?;
    let mut out = vec![0.0f32; vocab];
    write_normalised(&mut out, &cand);
    Some(out)
}

/// Whether [`nucleus_among`] can tell the nucleus from these logits: not where the nucleus reaches
/// the smallest weight among them (a token left out may weigh as much), or the row has no finite
/// largest logit.
pub fn nucleus_told(ids: &[u32], values: &[f32], lse: f32, vocab: usize, p: &SamplingParams) -> bool {
    nucleus_keys(ids, values, lse, vocab, p).is_some()
}

/// The `rank_key`s of [`nucleus_among`]'s nucleus, where the logits tell it and name tokens of a
/// `vocab`-token vocabulary.
fn nucleus_keys(ids: &[u32], values: &[f32], lse: f32, vocab: usize, p: &SamplingParams) -> Option<Vec<u64>> {
    debug_assert_eq!(ids.len(), values.len());
    if ids.iter().any(|&i| i as usize >= vocab) {
        return None;
    }
    let max = *values.first()?;
    let inv_t = 1.0 / p.temperature;
    if !(max.is_finite() && lse.is_finite() && p.temperature > 0.0 && inv_t.is_finite()) {
        return None;
    }
    let weights: Vec<f32> = values.iter().map(|&l| if l.is_nan() { 0.0 } else { exp_nonpos((l - max) * inv_t) }).collect();
    // Σ exp((x - max) / T) over the row, as `probs` weighs it.
    let total = (lse as f64 - max as f64 * inv_t as f64).exp();
    let least = *weights.last()?;
    let target = (p.top_p as f64 - 1e-6) * total;
    let mut cum = 0.0f64;
    if !weights.iter().take_while(|&&w| w > least).any(|&w| {
        cum += w as f64;
        cum >= target
    }) {
        return None;
    }
    let mut cand: Vec<u64> = ids.iter().zip(&weights).map(|(&i, &w)| rank_key(w, i)).collect();
    nucleus(&mut cand, p.top_p, total);
    Some(cand)
}

/// The distribution sampling actually draws from: softmax(logits / T) restricted to the top-k
/// logits, then to the top-p nucleus of what remains (the smallest set of highest-probability
/// tokens whose mass is >= top_p, ties at the boundary going to the lower index), renormalised.
/// Full vocabulary length, zeros elsewhere. Greedy parameters give a one-hot at `argmax`.
///
/// NaN logits get probability 0; +inf logits share all the mass. Parameters are expected to have
/// passed `validate`; a temperature that is not > 0 is treated as greedy.
pub fn probs(logits: &[f32], p: &SamplingParams) -> Vec<f32> {
    let v = logits.len();
    let mut out = vec![0.0f32; v];
    if v == 0 {
        return out;
    }
    let inv_t = 1.0 / p.temperature;
    // A temperature so small that 1/T overflows is greedy in the limit, and multiplying by an
    // infinite 1/T would turn the max logit's 0 * inf into NaN.
    if p.temperature.is_nan() || p.temperature <= 0.0 || !inv_t.is_finite() {
        out[argmax(logits) as usize] = 1.0;
        return out;
    }
    let max = max_value(logits);
    if max == f32::NEG_INFINITY {
        out[argmax(logits) as usize] = 1.0;
        return out;
    }
    // Weights relative to the max logit, so the max weighs exactly 1 and nothing overflows.
    let weight = |l: f32| -> f32 {
        if l.is_nan() {
            0.0
        } else if max == f32::INFINITY {
            if l == f32::INFINITY { 1.0 } else { 0.0 }
        } else {
            exp_nonpos((l - max) * inv_t)
        }
    };

    if p.top_k > 0 && p.top_k < v {
        let mut cand: Vec<u64> =
            top_n(logits, p.top_k, None).into_iter().map(|i| rank_key(weight(logits[i as usize]), i)).collect();
        if p.top_p < 1.0 {
            let total: f64 = cand.iter().map(|&k| key_value(k) as f64).sum();
            nucleus(&mut cand, p.top_p, total);
        }
        write_normalised(&mut out, &cand);
        return out;
    }

    if max == f32::INFINITY {
        for (o, &l) in out.iter_mut().zip(logits) {
            *o = weight(l);
        }
    } else {
        // The same arithmetic as `weight`, kept inline and branch-free for vectorisation.
        for (o, &l) in out.iter_mut().zip(logits) {
            let w = exp_nonpos((l - max) * inv_t);
            *o = if l.is_nan() { 0.0 } else { w };
        }
    }
    let total = positive_sum(&out);
    if p.top_p < 1.0 {
        // Every member of the nucleus has weight > (1 - top_p) * total / V: the nucleus's last
        // member outweighs each of the (at most V) tokens from it onward, which together hold
        // more than 1 - top_p of the mass. Filtering at half that bound is exact and usually
        // leaves a small fraction of the vocabulary to rank.
        let bound = (0.5 * (1.0 - p.top_p as f64) * total / v as f64) as f32;
        let mut cand: Vec<u64> =
            out.iter().enumerate().filter(|&(_, &w)| w > bound).map(|(i, &w)| rank_key(w, i as u32)).collect();
        nucleus(&mut cand, p.top_p, total);
        out.fill(0.0);
        write_normalised(&mut out, &cand);
    } else {
        let inv = (1.0 / total) as f32;
        for o in &mut out {
            *o *= inv;
        }
    }
    out
}

/// Cuts candidates (`rank_key`s of weights) to the top-p nucleus of a distribution whose total
/// weight is `total`. Only the set that remains is meaningful, not its order.
///
/// Rather than sort every candidate, it selects the heaviest 256, then the next 1024 and so on,
/// until the selected prefix reaches the target mass; only the block holding the cut is sorted.
fn nucleus(cand: &mut Vec<u64>, top_p: f32, total: f64) {
    // The weights carry f32 rounding, so a nucleus that reaches top_p exactly on paper (0.6 + 0.2
    // against 0.8) may fall a few ulps short; without the slack it would pull in one token too
    // many.
    let target = (top_p as f64 - 1e-6) * total;
    let mut start = 0;
    let mut block = 256;
    let mut cum = 0.0f64;
    while start < cand.len() {
        let rest = &mut cand[start..];
        let end = if rest.len() > block {
            rest.select_nth_unstable(block - 1);
            start + block
        } else {
            cand.len()
        };
        let mass: f64 = cand[start..end].iter().map(|&k| key_value(k) as f64).sum();
        if cum + mass < target && end < cand.len() {
            cum += mass;
            start = end;
            block *= 4;
            continue;
        }
        cand[start..end].sort_unstable();
        for j in start..end {
            cum += key_value(cand[j]) as f64;
            if cum >= target {
                cand.truncate(j + 1);
                return;
            }
        }
        // The token-by-token sum can land a few ulps below the block sum; carry on with the next
        // block. Past the last candidate, all of them are kept.
        start = end;
        block *= 4;
    }
}

/// Writes the candidates' weights, renormalised, into `out` (which is zero elsewhere).
fn write_normalised(out: &mut [f32], cand: &[u64]) {
    let total: f64 = cand.iter().map(|&k| key_value(k) as f64).sum();
    if total > 0.0 {
        for &k in cand {
            out[key_index(k) as usize] = (key_value(k) as f64 / total) as f32;
        }
    } else if let Some(&k) = cand.first() {
        out[key_index(k) as usize] = 1.0;
    }
}

/// Draws a token by inverse CDF from one uniform draw. The weights need not sum to exactly 1.
/// Tokens whose probability is zero (or negative, or NaN) are never returned. If nothing has
/// positive probability, returns 0 (the caller handed over no distribution at all).
pub fn sample(probs: &[f32], rng: &mut Rng) -> u32 {
    const BLOCK: usize = 1024;
    let u = rng.uniform_f64();
    let total = positive_sum(probs);
    if total <= 0.0 {
        return 0;
    }
    let target = u * total;
    let mut cum = 0.0f64;
    // Whole blocks are skipped on their (vectorised) sum; only the block holding the target is
    // walked token by token. Should rounding leave the walk short inside it, the next block
    // simply continues from the walked sum.
    for (b, block) in probs.chunks(BLOCK).enumerate() {
        let mass = positive_sum(block);
        if cum + mass <= target {
            cum += mass;
            continue;
        }
        for (i, &x) in block.iter().enumerate() {
            if x > 0.0 {
                cum += x as f64;
                if cum > target {
                    return (b * BLOCK + i) as u32;
                }
            }
        }
    }
    // Rounding can leave the running sum a hair below `target` when u is close to 1.
    probs.iter().rposition(|&x| x > 0.0).map_or(0, |i| i as u32)
}

/// A key whose ascending integer order is the ranking used throughout: higher value first, ties
/// to the lower index, NaN after everything. Selecting and sorting plain integers is several times
/// faster than a float comparator with a tie-break.
fn rank_key(x: f32, i: u32) -> u64 {
    // Map the float to bits that order like the value (flip negatives entirely, set the sign bit
    // of positives), with NaN below -inf. Adding 0 turns -0 into +0 so the two tie by index.
    let b = (x + 0.0).to_bits();
    let ordered = if x.is_nan() {
        0
    } else if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    };
    ((!ordered as u64) << 32) | i as u64
}

fn key_index(k: u64) -> u32 {
    k as u32
}

fn key_value(k: u64) -> f32 {
    let ordered = !((k >> 32) as u32);
    if ordered == 0 {
        f32::NAN
    } else if ordered >> 31 == 1 {
        f32::from_bits(ordered & 0x7fff_ffff)
    } else {
        f32::from_bits(!ordered)
    }
}

/// The `n` highest-valued token ids of a distribution (or of logits), highest first, ties to the
/// lower index, NaN last; `exclude` is never returned. Fewer than `n` when the vocabulary runs
/// out. Used for the SSD fan-out.
pub fn top_n(values: &[f32], n: usize, exclude: Option<u32>) -> Vec<u32> {
    const BLOCK: usize = 64;
    let excluded = |i: usize| exclude == Some(i as u32);
    if n == 0 {
        return Vec::new();
    }
    if n.saturating_mul(8) >= values.len() {
        // A large share of the vocabulary: partial selection beats a heap this big.
        let mut keys: Vec<u64> =
            values.iter().enumerate().filter(|&(i, _)| !excluded(i)).map(|(i, &x)| rank_key(x, i as u32)).collect();
        if n < keys.len() {
            keys.select_nth_unstable(n - 1);
            keys.truncate(n);
        }
        keys.sort_unstable();
        return keys.into_iter().map(key_index).collect();
    }
    // A bounded max-heap of keys: its top is the worst kept, the one a better newcomer evicts.
    let mut heap: BinaryHeap<u64> = BinaryHeap::with_capacity(n);
    for (b, block) in values.chunks(BLOCK).enumerate() {
        if heap.len() == n {
            // Whole blocks are turned away on their vectorised max. Their indices all come later
            // than anything kept, so a block whose best only ties the worst kept cannot enter.
            let worst = heap.peek().map_or(f32::NAN, |&k| key_value(k));
            if !worst.is_nan() && max_value(block) <= worst {
                continue;
            }
        }
        for (j, &x) in block.iter().enumerate() {
            let i = b * BLOCK + j;
            if excluded(i) {
                continue;
            }
            let key = rank_key(x, i as u32);
            if heap.len() < n {
                heap.push(key);
            } else if let Some(mut top) = heap.peek_mut() {
                if key < *top {
                    *top = key;
                }
            }
        }
    }
    heap.into_sorted_vec().into_iter().map(key_index).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p, seed: 0 }
    }

    fn support(p: &[f32]) -> Vec<u32> {
        p.iter().enumerate().filter(|&(_, &x)| x > 0.0).map(|(i, _)| i as u32).collect()
    }

    pub(crate) fn assert_close(got: &[f32], want: &[f32], tol: f32) {
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= tol, "index {i}: got {g}, want {w} (all: {got:?} vs {want:?})");
        }
    }

    /// Logits whose softmax at T = 1 is `p`.
    fn logits_of(p: &[f32]) -> Vec<f32> {
        p.iter().map(|&x| x.ln()).collect()
    }

    fn random_logits(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        (0..n).map(|_| rng.uniform() * 20.0 - 10.0).collect()
    }

    pub(crate) fn frequencies(n: usize, draws: usize, mut draw: impl FnMut() -> u32) -> Vec<f32> {
        let mut counts = vec![0usize; n];
        for _ in 0..draws {
            counts[draw() as usize] += 1;
        }
        counts.iter().map(|&c| c as f32 / draws as f32).collect()
    }

    /// The straightforward definition `probs` must agree with: softmax, full sort, cut.
    fn reference_probs(logits: &[f32], p: &SamplingParams) -> Vec<f32> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f64> = logits.iter().map(|&l| (((l - max) / p.temperature) as f64).exp()).collect();
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| w[b].partial_cmp(&w[a]).unwrap().then(a.cmp(&b)));
        if p.top_k > 0 {
            order.truncate(p.top_k);
        }
        let total: f64 = order.iter().map(|&i| w[i]).sum();
        let mut keep = order.len();
        let mut cum = 0.0;
        for (j, &i) in order.iter().enumerate() {
            cum += w[i] / total;
            if cum >= p.top_p as f64 - 1e-6 {
                keep = j + 1;
                break;
            }
        }
        order.truncate(keep);
        let kept: f64 = order.iter().map(|&i| w[i]).sum();
        let mut out = vec![0.0f32; logits.len()];
        for &i in &order {
            out[i] = (w[i] / kept) as f32;
        }
        out
    }

    #[test]
    fn seeded_rng_is_deterministic() {
        let seq = |seed| {
            let mut r = Rng::new(seed);
            (0..64).map(|_| r.uniform()).collect::<Vec<f32>>()
        };
        assert_eq!(seq(42), seq(42));
        assert_ne!(seq(42), seq(43));
        for x in seq(7) {
            assert!((0.0..1.0).contains(&x));
        }
        let mut a = Rng::new(9);
        let mut b = Rng::new(9);
        for _ in 0..64 {
            let x = a.uniform_f64();
            assert_eq!(x, b.uniform_f64());
            assert!((0.0..1.0).contains(&x));
        }

        let p = [0.1, 0.2, 0.3, 0.4];
        let tokens = |seed| {
            let mut r = Rng::new(seed);
            (0..64).map(|_| sample(&p, &mut r)).collect::<Vec<u32>>()
        };
        assert_eq!(tokens(1), tokens(1));
        assert_ne!(tokens(1), tokens(2));
    }

    #[test]
    fn validate_rejects_bad_values() {
        assert!(SamplingParams::default().validate().is_ok());
        assert!(SamplingParams::default().is_greedy());
        assert!(params(0.7, 40, 0.9).validate().is_ok());
        assert!(!params(0.7, 40, 0.9).is_greedy());
        for bad in [params(-0.1, 0, 1.0), params(f32::NAN, 0, 1.0), params(f32::INFINITY, 0, 1.0)] {
            match bad.validate() {
                Err(Error::InvalidOption { option, reason }) => assert_eq!(option, "temperature", "{reason}"),
                other => panic!("{bad:?} accepted: {other:?}"),
            }
        }
        for bad in [params(1.0, 0, 0.0), params(1.0, 0, 1.5), params(1.0, 0, -0.2), params(1.0, 0, f32::NAN)] {
            match bad.validate() {
                Err(Error::InvalidOption { option, reason }) => assert_eq!(option, "top_p", "{reason}"),
                other => panic!("{bad:?} accepted: {other:?}"),
            }
        }
    }

    #[test]
    fn argmax_takes_first_max_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 2.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 0.5]), 1);
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 1);
        assert_eq!(argmax(&[-5.0, f32::NAN, -1.0]), 2);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn probs_among_candidates_is_probs_with_the_rest_at_minus_infinity() {
        let mut rng = Rng::new(5);
        for trial in 0..200 {
            let vocab = 50 + trial % 7;
            // Coarse logits, so that ties at the cuts are common.
            let logits: Vec<f32> = (0..vocab).map(|_| (rng.uniform() * 12.0).floor() * 0.5).collect();
            let n = 1 + trial % 20;
            let ids = top_n(&logits, n, None);
            let values: Vec<f32> = ids.iter().map(|&i| logits[i as usize]).collect();
            let mut dense = vec![f32::NEG_INFINITY; vocab];
            for &i in &ids {
                dense[i as usize] = logits[i as usize];
            }
            let p = params([0.3, 0.8, 1.0, 2.0][trial % 4], [0, 1, 3, 8, 30][trial % 5], [1.0, 0.9, 0.5, 0.2][trial / 4 % 4]);
            let got = probs_among(&ids, &values, vocab, &p);
            assert_close(&got, &probs(&dense, &p), 1e-6);
            assert_eq!(support(&got), support(&probs(&dense, &p)), "trial {trial}: the same tokens kept");
        }
    }

    #[test]
    fn a_nucleus_from_the_largest_logits_is_the_whole_rows_or_none() {
        let mut rng = Rng::new(8);
        let (mut told, mut untold) = (0, 0);
        for trial in 0..300 {
            let vocab = 2_000;
            // Rows from peaked to flat, with coarse logits so that ties at the cuts are common.
            let spread = [2.0, 8.0, 20.0, 40.0][trial % 4];
            let mut logits: Vec<f32> = (0..vocab).map(|_| (rng.uniform() * spread).floor() * 0.5).collect();
            if trial % 10 == 0 {
                logits[trial] = f32::NAN;
            }
            let n = [64, 200, 512][trial % 3];
            let ids = top_n(&logits, n, None);
            let values: Vec<f32> = ids.iter().map(|&i| logits[i as usize]).collect();
            let p = params([0.3, 0.8, 1.0, 2.0][trial / 4 % 4], 0, [0.95, 0.9, 0.5, 0.2][trial / 16 % 4]);
            let lse = log_sum_exp(&logits, p.temperature);
            match nucleus_among(&ids, &values, lse, vocab, &p) {
                Some(got) => {
                    told += 1;
                    let want = probs(&logits, &p);
                    assert_eq!(support(&got), support(&want), "trial {trial}: the same tokens kept");
                    assert_close(&got, &want, 1e-6);
                }
                None => {
                    untold += 1;
                    // Only where the nucleus reaches the smallest logit read.
                    let least = *values.last().unwrap();
                    let reaches = support(&probs(&logits, &p)).iter().any(|&i| logits[i as usize] <= least);
                    assert!(reaches, "trial {trial}: the nucleus lies within the logits read, yet none came back");
                }
            }
        }
        assert!(told > 50 && untold > 50, "both outcomes covered: {told} told, {untold} not");
        let p = params(1.0, 0, 0.9);
        assert_eq!(nucleus_among(&[3], &[f32::INFINITY], 0.0, 10, &p), None, "an infinite logit");
        assert_eq!(nucleus_among(&[3], &[1.0], f32::NAN, 10, &p), None, "no log-sum-exp");
        assert_eq!(nucleus_among(&[], &[], 0.0, 10, &p), None, "no logits");
    }

    #[test]
    fn log_sum_exp_matches_f64() {
        let mut rng = Rng::new(6);
        for (n, t) in [(1, 1.0), (7, 0.5), (1000, 0.8), (151_936, 1.3)] {
            let mut xs: Vec<f32> = (0..n).map(|_| rng.uniform() * 40.0 - 20.0).collect();
            if n > 7 {
                xs[3] = f32::NAN;
                xs[5] = f32::NEG_INFINITY;
            }
            let numbers = || xs.iter().filter(|v| !v.is_nan()).map(|&v| v as f64 / t as f64);
            let max = numbers().fold(f64::NEG_INFINITY, f64::max);
            let want = max + numbers().map(|v| (v - max).exp()).sum::<f64>().ln();
            let got = log_sum_exp(&xs, t);
            assert!((got as f64 - want).abs() <= 1e-5 * want.abs().max(1.0), "{n} at {t}: {got} against {want}");
        }
        assert_eq!(log_sum_exp(&[f32::NEG_INFINITY, f32::NAN], 1.0), f32::NEG_INFINITY);
        assert_eq!(log_sum_exp(&[1.0, f32::INFINITY], 1.0), f32::INFINITY);
        assert_eq!(log_sum_exp(&[], 1.0), f32::NEG_INFINITY);
    }

    #[test]
    fn greedy_is_one_hot_at_argmax() {
        let logits = [0.5, 2.0, f32::NAN, 2.0, -1.0];
        for p in [SamplingParams::default(), params(0.0, 3, 0.5)] {
            assert_eq!(probs(&logits, &p), vec![0.0, 1.0, 0.0, 0.0, 0.0]);
        }
        let mut rng = Rng::new(3);
        let q = probs(&logits, &SamplingParams::default());
        for _ in 0..100 {
            assert_eq!(sample(&q, &mut rng), 1);
        }
    }

    #[test]
    fn temperature_scales_softmax() {
        let logits = [1.0, 2.0, 3.0];
        // softmax([2, 4, 6]) = [1, e^2, e^4] / (1 + e^2 + e^4)
        let s = 1.0 + 7.389_056 + 54.598_15;
        assert_close(&probs(&logits, &params(0.5, 0, 1.0)), &[1.0 / s, 7.389_056 / s, 54.598_15 / s], 1e-6);
        // softmax([0.5, 1, 1.5]) = [e^-1, e^-0.5, 1] / (e^-1 + e^-0.5 + 1)
        let s = 0.367_879_4 + 0.606_530_7 + 1.0;
        assert_close(&probs(&logits, &params(2.0, 0, 1.0)), &[0.367_879_4 / s, 0.606_530_7 / s, 1.0 / s], 1e-6);
        // softmax([1, 2, 3])
        let s = std::f32::consts::E + 7.389_056 + 20.085_537;
        assert_close(
            &probs(&logits, &params(1.0, 0, 1.0)),
            &[std::f32::consts::E / s, 7.389_056 / s, 20.085_537 / s],
            1e-6,
        );
        // Shifting every logit changes nothing; large logits do not overflow.
        let shifted: Vec<f32> = logits.iter().map(|l| l + 1000.0).collect();
        assert_close(&probs(&shifted, &params(1.0, 0, 1.0)), &probs(&logits, &params(1.0, 0, 1.0)), 1e-6);
    }

    #[test]
    fn masked_and_infinite_logits() {
        let p = probs(&[f32::NEG_INFINITY, 0.0, f32::NAN, 0.0], &params(1.0, 0, 1.0));
        assert_eq!(p, vec![0.0, 0.5, 0.0, 0.5]);
        let p = probs(&[1.0, f32::INFINITY, 2.0, f32::INFINITY], &params(1.0, 0, 1.0));
        assert_eq!(p, vec![0.0, 0.5, 0.0, 0.5]);
        let p = probs(&[f32::NEG_INFINITY, f32::NEG_INFINITY], &params(1.0, 0, 0.9));
        assert_eq!(p, vec![1.0, 0.0]);
        // A temperature whose inverse overflows behaves as greedy rather than producing NaN.
        let p = probs(&[1.0, 2.0, 1.5], &params(1e-40, 0, 1.0));
        assert_eq!(p, vec![0.0, 1.0, 0.0]);
    }

    #[test]
    fn top_k_keeps_exactly_the_k_highest() {
        let logits = [0.3, 2.0, -1.0, 1.5, 0.9, 4.0, 0.0];
        let p = probs(&logits, &params(1.0, 3, 1.0));
        assert_eq!(support(&p), vec![1, 3, 5]);
        // Renormalised softmax over the kept three.
        let w = [2.0f32.exp(), 1.5f32.exp(), 4.0f32.exp()];
        let s: f32 = w.iter().sum();
        assert_close(&p, &[0.0, w[0] / s, 0.0, w[1] / s, 0.0, w[2] / s, 0.0], 1e-6);

        // Ties at the boundary go to the lower index.
        assert_eq!(support(&probs(&[3.0, 1.0, 3.0, 3.0], &params(1.0, 2, 1.0))), vec![0, 2]);
        // k >= vocabulary size keeps everything.
        assert_eq!(support(&probs(&[1.0, 2.0], &params(1.0, 5, 1.0))), vec![0, 1]);

        // A real-sized vocabulary, both the running-buffer and the partial-select paths.
        let logits = random_logits(151_936, 11);
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| logits[b as usize].partial_cmp(&logits[a as usize]).unwrap().then(a.cmp(&b)));
        for k in [1, 10, 50, 100, 1000] {
            let p = probs(&logits, &params(0.8, k, 1.0));
            let mut want: Vec<u32> = order[..k].to_vec();
            want.sort();
            assert_eq!(support(&p), want, "k = {k}");
            assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-4);
            assert_close(&p, &reference_probs(&logits, &params(0.8, k, 1.0)), 1e-6);
        }
    }

    #[test]
    fn top_p_keeps_exactly_the_minimal_nucleus() {
        let logits = logits_of(&[0.5, 0.25, 0.125, 0.125]);
        let case = |top_p: f32| probs(&logits, &params(1.0, 0, top_p));
        // 0.5 < 0.7 <= 0.75: the first two.
        assert_close(&case(0.7), &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0], 1e-6);
        // Boundary: the first two hold exactly 0.75, which is enough.
        assert_close(&case(0.75), &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0], 1e-6);
        // Boundary: the top token alone holds exactly 0.5.
        assert_close(&case(0.5), &[1.0, 0.0, 0.0, 0.0], 1e-6);
        assert_close(&case(0.3), &[1.0, 0.0, 0.0, 0.0], 1e-6);
        // Just over 0.75 needs a third token; of the tied pair the lower index is taken.
        assert_close(&case(0.76), &[0.5 / 0.875, 0.25 / 0.875, 0.125 / 0.875, 0.0], 1e-6);
        assert_close(&case(1.0), &[0.5, 0.25, 0.125, 0.125], 1e-6);
        // Boundary where the computed weights land a few ulps short of 0.8: still two tokens.
        let p = probs(&logits_of(&[0.6, 0.2, 0.2]), &params(1.0, 0, 0.8));
        assert_close(&p, &[0.75, 0.25, 0.0], 1e-6);

        // Ties at the boundary resolved by index order, wherever the tied tokens sit.
        let p = probs(&logits_of(&[0.2, 0.2, 0.4, 0.2]), &params(1.0, 0, 0.5));
        assert_close(&p, &[1.0 / 3.0, 0.0, 2.0 / 3.0, 0.0], 1e-6);
        let p = probs(&logits_of(&[0.2, 0.2, 0.2, 0.4]), &params(1.0, 0, 0.7));
        assert_close(&p, &[0.25, 0.25, 0.0, 0.5], 1e-6);

        // top-k first, then top-p on the renormalised remainder: [0.4, 0.3] becomes [4/7, 3/7],
        // whose first token alone covers 0.5; without top-k, 0.4 alone would not.
        let logits = logits_of(&[0.4, 0.3, 0.2, 0.1]);
        assert_close(&probs(&logits, &params(1.0, 2, 0.5)), &[1.0, 0.0, 0.0, 0.0], 1e-6);
        assert_close(&probs(&logits, &params(1.0, 0, 0.5)), &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0], 1e-6);
        assert_close(&probs(&logits, &params(1.0, 3, 0.8)), &[4.0 / 9.0, 3.0 / 9.0, 2.0 / 9.0, 0.0], 1e-6);
    }

    #[test]
    fn top_p_matches_full_sort_on_a_real_vocabulary() {
        let logits = random_logits(151_936, 5);
        for (t, k, top_p) in [(1.0, 0, 0.9), (0.6, 0, 0.5), (2.0, 0, 0.95), (1.0, 200, 0.9), (0.7, 40, 0.3)] {
            let p = params(t, k, top_p);
            let got = probs(&logits, &p);
            let want = reference_probs(&logits, &p);
            assert_eq!(support(&got), support(&want), "{p:?}");
            assert_close(&got, &want, 1e-6);
        }
    }

    #[test]
    fn sample_frequencies_match_the_distribution() {
        let p = [0.1, 0.2, 0.3, 0.4];
        let mut rng = Rng::new(1234);
        let f = frequencies(4, 200_000, || sample(&p, &mut rng));
        assert_close(&f, &p, 0.01);

        let p = [0.0, 0.5, 0.0, 0.5, 0.0];
        let mut rng = Rng::new(5);
        let f = frequencies(5, 200_000, || sample(&p, &mut rng));
        assert_eq!((f[0], f[2], f[4]), (0.0, 0.0, 0.0));
        assert_close(&f, &p, 0.01);
        // Mass scattered across blocks of the skip-ahead walk.
        let mut p = vec![0.0f32; 8192];
        let hot = [(5, 0.1), (1023, 0.2), (1024, 0.3), (4000, 0.15), (8191, 0.25)];
        for (i, x) in hot {
            p[i] = x;
        }
        let mut rng = Rng::new(8);
        let f = frequencies(p.len(), 200_000, || sample(&p, &mut rng));
        assert_eq!(support(&f), hot.iter().map(|&(i, _)| i as u32).collect::<Vec<_>>());
        assert_close(&f, &p, 0.01);
        // Unnormalised weights are fine too.
        let mut rng = Rng::new(6);
        let f = frequencies(3, 200_000, || sample(&[2.0, 0.0, 6.0], &mut rng));
        assert_close(&f, &[0.25, 0.0, 0.75], 0.01);
    }

    #[test]
    fn rank_keys_order_and_round_trip() {
        let xs = [f32::INFINITY, 3.5, 1.0, 1e-30, 0.0, -0.0, -1e-30, -2.0, f32::NEG_INFINITY, f32::NAN];
        for (j, &x) in xs.iter().enumerate() {
            let k = rank_key(x, 7);
            assert_eq!(key_index(k), 7);
            let back = key_value(k);
            assert!(back == x || (back.is_nan() && x.is_nan()), "{x} came back as {back}");
            if let Some(&next) = xs.get(j + 1) {
                if x == next {
                    assert!(rank_key(x, 3) < rank_key(next, 4), "{x} and {next} should tie by index");
                    assert!(rank_key(next, 3) < rank_key(x, 4), "{next} and {x} should tie by index");
                } else {
                    assert!(k < rank_key(next, 7), "{x} should rank before {next}");
                }
            }
        }
    }

    #[test]
    fn exp_matches_libm() {
        let mut worst = 0.0f64;
        let mut x = -86.999f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let rel = ((exp_nonpos(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
            x += 0.000_37;
        }
        assert!(worst < 1.5e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(-100.0), 0.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn top_n_orders_and_excludes() {
        let v = [0.1, 0.5, 0.3, 0.5, 0.2];
        assert_eq!(top_n(&v, 3, None), vec![1, 3, 2]);
        assert_eq!(top_n(&v, 3, Some(1)), vec![3, 2, 4]);
        assert_eq!(top_n(&v, 10, Some(2)), vec![1, 3, 4, 0]);
        assert_eq!(top_n(&v, 0, None), Vec::<u32>::new());
        assert_eq!(top_n(&[], 3, None), Vec::<u32>::new());
        assert_eq!(top_n(&[f32::NAN, 1.0, f32::NEG_INFINITY, 2.0], 4, None), vec![3, 1, 2, 0]);
        assert_eq!(top_n(&[f32::NAN, 1.0, f32::NAN], 2, None), vec![1, 0]);

        // The heap path, with NaN at the front and too few real values to fill it.
        let mut v = vec![f32::NAN; 1000];
        v[500] = -1.0;
        v[900] = 2.0;
        v[999] = 2.0;
        assert_eq!(top_n(&v, 5, None), vec![900, 999, 500, 0, 1]);
        assert_eq!(top_n(&v, 5, Some(900)), vec![999, 500, 0, 1, 2]);

        // Both code paths agree with a full sort on a vocabulary full of ties.
        let mut rng = Rng::new(21);
        let values: Vec<f32> = (0..151_936).map(|_| (rng.uniform() * 500.0).floor()).collect();
        let mut order: Vec<u32> = (0..values.len() as u32).collect();
        order.sort_by(|&a, &b| values[b as usize].partial_cmp(&values[a as usize]).unwrap().then(a.cmp(&b)));
        for n in [1, 4, 8, 64, 65, 300, 20_000, 40_000] {
            assert_eq!(top_n(&values, n, None), order[..n].to_vec(), "n = {n}");
            let ex = order[0];
            let want: Vec<u32> = order.iter().copied().filter(|&i| i != ex).take(n).collect();
            assert_eq!(top_n(&values, n, Some(ex)), want, "n = {n}, excluding {ex}");
        }
    }
}
