//! Fan-out: which verification outcomes (k, t*) the draft speculates on while the target
//! verifies. For each k in 0..=n (n = draft tokens in the round) it picks candidate bonus tokens
//! from the draft's glue logits g_k; every candidate is one branch of the speculation tree, so
//! the total is the tree's batch width.
//!
//! Strategies:
//! - `uniform:F`: F candidates for every k.
//! - `geometric[:B]`: the paper's allocation of B branches. Outcome k has probability
//!   P(k) ~ a^k (1 - a) for k < n and a^n for k = n, where a is the measured per-token
//!   acceptance; the miss rate of F candidates follows a power law 1 - hit(F) ~ F^-r. Maximising
//!   the expected hit rate sum_k P(k) hit(F_k) subject to sum_k F_k = B gives
//!   F_k ~ P(k)^(1 / (1 + r)), i.e. a^(k / (1 + r)), with k = n weighted up by
//!   (1 - a)^(-1 / (1 + r)). r is fitted to the observed ranks of the real bonus token in the
//!   draft's candidate order (least squares of log miss(F) on log F); until 16 outcomes are seen
//!   it is 1 (doubling the candidates halves the misses).
//! - `top-p:P`: per k, the smallest set of draft tokens whose renormalised probability (the
//!   rejected draft token excluded) reaches P; when the sets exceed the budget, the candidates
//!   with the largest P(k) * probability win. The budget follows the recent hit rate: it grows
//!   while fewer than a fraction P of recent rounds hit and shrinks while more do, so the tree is
//!   as narrow as the target hit rate allows.

use std::collections::VecDeque;

use crate::decode::spec::{Fanout, DEFAULT_WIDTH};
use crate::sampling::{self, SamplingParams};

/// Rounds over which `top-p` measures its recent hit rate.
const HIT_WINDOW: usize = 16;
/// Outcomes observed before the power-law exponent is fitted rather than assumed.
const MIN_RANKS: u64 = 16;
const DEFAULT_EXPONENT: f64 = 1.0;
/// Ranks at or beyond this are counted together.
const RANK_CAP: usize = 64;

/// One generation's fan-out: the strategy plus what it has measured so far.
pub struct FanoutPolicy {
    fanout: Fanout,
    k: usize,
    accepted: u64,
    rejected: u64,
    /// `ranks[i]`: outcomes whose bonus token was the draft's i-th candidate (the last bucket
    /// holds every rank from `RANK_CAP` on).
    ranks: Vec<u64>,
    observed: u64,
    budget: usize,
    recent: VecDeque<bool>,
    /// Set sizes the last `top-p` selection chose, per k.
    chosen: Vec<usize>,
}

impl FanoutPolicy {
    pub fn new(fanout: Fanout, k: usize) -> Self {
        let budget = match fanout {
            Fanout::Uniform(f) => f * (k + 1),
            Fanout::Geometric(b) => b.unwrap_or(DEFAULT_WIDTH * (k + 1)),
            Fanout::TopP(_) => DEFAULT_WIDTH * (k + 1),
        };
        FanoutPolicy {
            fanout,
            k,
            accepted: 0,
            rejected: 0,
            ranks: vec![0; RANK_CAP + 1],
            observed: 0,
            budget,
            recent: VecDeque::with_capacity(HIT_WINDOW + 1),
            chosen: Vec::new(),
        }
    }

    /// Per-token acceptance a: accepted tokens over accepted tokens plus rejections (the
    /// estimate for a geometric number of acceptances), with one of each assumed up front.
    pub fn acceptance(&self) -> f64 {
        ((self.accepted as f64 + 1.0) / ((self.accepted + self.rejected) as f64 + 2.0)).clamp(0.01, 0.99)
    }

    /// The power-law exponent r of the miss rate, fitted to the observed candidate ranks.
    pub fn exponent(&self) -> f64 {
        if self.observed < MIN_RANKS {
            return DEFAULT_EXPONENT;
        }
        let n = self.observed as f64;
        let mut tail = self.observed - self.ranks[0];
        let mut points = Vec::new();
        for f in 1..=RANK_CAP {
            // A miss rate estimated from a single outcome is noise, not a point on the curve.
            if tail < 2 {
                break;
            }
            points.push(((f as f64).ln(), (tail as f64 / n).ln()));
            tail -= self.ranks[f];
        }
        if points.len() < 2 {
            return DEFAULT_EXPONENT;
        }
        let m = points.len() as f64;
        let (mx, my) = points.iter().fold((0.0, 0.0), |(a, b), &(x, y)| (a + x / m, b + y / m));
        let sxy: f64 = points.iter().map(|&(x, y)| (x - mx) * (y - my)).sum();
        let sxx: f64 = points.iter().map(|&(x, _)| (x - mx) * (x - mx)).sum();
        (-sxy / sxx).clamp(0.25, 4.0)
    }

    /// The current branch budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Expected candidates per k for a round of `n` draft tokens (Saguaro sampling scales the
    /// draft's top ones of these when it drafts position k).
    pub fn widths(&self, n: usize) -> Vec<usize> {
        match self.fanout {
            Fanout::Uniform(f) => vec![f; n + 1],
            Fanout::Geometric(_) => geometric(self.budget, n, self.acceptance(), self.exponent()),
            Fanout::TopP(_) => {
                let even = (self.budget / (n + 1)).max(1);
                (0..=n).map(|k| self.chosen.get(k).copied().unwrap_or(even)).collect()
            }
        }
    }

    /// The branches (k, candidate bonus token) for a round whose glue pass gave the draft logits
    /// `glue` (`drafted.len() + 1` rows) over the draft tokens `drafted`. A rejected draft token
    /// can never be the bonus, so `drafted[k]` is never a candidate for k.
    pub fn candidates(&mut self, glue: &[f32], drafted: &[u32], params: &SamplingParams) -> Vec<(usize, u32)> {
        let n = drafted.len();
        let vocab = glue.len() / (n + 1);
        let row = |k: usize| &glue[k * vocab..(k + 1) * vocab];
        match self.fanout {
            Fanout::Uniform(_) | Fanout::Geometric(_) => {
                let widths = self.widths(n);
                (0..=n)
                    .flat_map(|k| {
                        sampling::top_n(row(k), widths[k], drafted.get(k).copied()).into_iter().map(move |t| (k, t))
                    })
                    .collect()
            }
            Fanout::TopP(p) => {
                let a = self.acceptance();
                let outcome = |k: usize| if k < n { a.powi(k as i32) * (1.0 - a) } else { a.powi(n as i32) };
                let mut scored = Vec::new();
                for k in 0..=n {
                    let probs = ranking_probs(row(k), params);
                    for (t, mass) in top_p_set(&probs, p, self.budget, drafted.get(k).copied()) {
                        scored.push((outcome(k) * mass as f64, k, t));
                    }
                }
                if scored.len() > self.budget {
                    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
                    scored.truncate(self.budget);
                    scored.sort_by_key(|&(_, k, _)| k);
                }
                self.chosen = (0..=n).map(|k| scored.iter().filter(|s| s.1 == k).count()).collect();
                scored.into_iter().map(|(_, k, t)| (k, t)).collect()
            }
        }
    }

    /// Learn from a round of `proposed` draft tokens: `accepted` of them were, the cache did or
    /// did not hold the outcome, and the bonus token was the draft's `rank`-th candidate.
    pub fn observe(&mut self, proposed: usize, accepted: usize, hit: bool, rank: usize) {
        self.accepted += accepted as u64;
        self.rejected += u64::from(accepted < proposed);
        self.ranks[rank.min(RANK_CAP)] += 1;
        self.observed += 1;
        self.recent.push_back(hit);
        if self.recent.len() > HIT_WINDOW {
            self.recent.pop_front();
        }
        if let Fanout::TopP(p) = self.fanout {
            let rate = self.recent.iter().filter(|&&h| h).count() as f64 / self.recent.len() as f64;
            let (lo, hi) = (self.k + 1, self.fanout.max_branches(self.k));
            if rate < p as f64 {
                self.budget = (self.budget + 1).min(hi);
            } else if rate > p as f64 {
                self.budget = self.budget.saturating_sub(1).max(lo);
            }
        }
    }
}

/// The paper's allocation of `budget` branches over the outcomes k = 0..=n:
/// F_k ~ a^(k / (1 + r)), the all-accepted case weighted up by (1 - a)^(-1 / (1 + r)). Every k
/// keeps at least one candidate while the budget allows (the power law says nothing below F = 1,
/// where the top candidate alone already catches much of the mass).
pub fn geometric(budget: usize, n: usize, a: f64, r: f64) -> Vec<usize> {
    let e = 1.0 / (1.0 + r);
    let weights: Vec<f64> =
        (0..=n).map(|k| a.powf(k as f64 * e) * if k == n { (1.0 - a).powf(-e) } else { 1.0 }).collect();
    let mut f = apportion(budget, &weights);
    while let Some(zero) = f.iter().position(|&x| x == 0) {
        let (big, &most) = f.iter().enumerate().max_by_key(|&(i, &x)| (x, std::cmp::Reverse(i))).expect("n + 1 > 0");
        if most < 2 {
            break;
        }
        f[big] -= 1;
        f[zero] += 1;
    }
    f
}

/// Largest-remainder apportionment of `total` in proportion to `weights`.
fn apportion(total: usize, weights: &[f64]) -> Vec<usize> {
    let sum: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| w / sum * total as f64).collect();
    let mut f: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&i, &j| (exact[j] - f[j] as f64).total_cmp(&(exact[i] - f[i] as f64)).then(i.cmp(&j)));
    let short = total - f.iter().sum::<usize>();
    for &i in order.iter().take(short) {
        f[i] += 1;
    }
    f
}

/// The smallest set of the highest-probability tokens (never `exclude`) whose probability,
/// renormalised without `exclude`, reaches `p`, at most `cap` of them: (token, renormalised
/// probability), most likely first.
pub fn top_p_set(probs: &[f32], p: f32, cap: usize, exclude: Option<u32>) -> Vec<(u32, f32)> {
    let rest = 1.0 - exclude.map_or(0.0, |t| probs[t as usize]);
    let mut mass = 0.0;
    let mut set = Vec::new();
    for t in sampling::top_n(probs, cap, exclude) {
        if mass >= p || probs[t as usize] <= 0.0 {
            break;
        }
        let share = if rest > 0.0 { probs[t as usize] / rest } else { 0.0 };
        mass += share;
        set.push((t, share));
    }
    set
}

/// Where `token` falls in the candidate order of `values` (higher first, ties to the lower index),
/// `exclude` left out: 0 for the top candidate.
pub fn rank(values: &[f32], token: u32, exclude: Option<u32>) -> usize {
    let v = values[token as usize];
    values
        .iter()
        .enumerate()
        .filter(|&(i, &x)| {
            let i = i as u32;
            Some(i) != exclude && i != token && (x > v || (x == v && i < token) || (v.is_nan() && !x.is_nan()))
        })
        .count()
}

/// The draft's plain distribution used to rank and weigh candidates: at the request's
/// temperature (1 when greedy), without top-k/top-p truncation, since the target's bonus token
/// may lie outside the draft's nucleus.
fn ranking_probs(logits: &[f32], params: &SamplingParams) -> Vec<f32> {
    let temperature = if params.is_greedy() { 1.0 } else { params.temperature };
    sampling::probs(logits, &SamplingParams { temperature, top_k: 0, top_p: 1.0, seed: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometric_allocation_follows_the_paper() {
        let (a, r) = (0.7f64, 1.0f64);
        let f = geometric(30, 4, a, r);
        assert_eq!(f.iter().sum::<usize>(), 30);
        // The exact shares: a^(k/2) for k < 4, a^2 / sqrt(1 - a) for k = 4.
        let w: Vec<f64> =
            (0..=4).map(|k| a.powf(k as f64 / 2.0) * if k == 4 { (1.0 - a).powf(-0.5) } else { 1.0 }).collect();
        let s: f64 = w.iter().sum();
        for (k, (&got, wk)) in f.iter().zip(&w).enumerate() {
            assert!((got as f64 - 30.0 * wk / s).abs() < 1.0, "k={k}: {f:?}");
        }
        assert!(f[0] >= f[1] && f[1] >= f[2] && f[2] >= f[3], "decays with k below K: {f:?}");
        assert!(f[4] > f[3], "the all-accepted outcome is weighted up: {f:?}");
        // A better draft moves the budget toward the all-accepted outcome.
        assert!(geometric(30, 4, 0.95, r)[4] > f[4]);
        // With no draft tokens, every branch speculates on the next bonus token.
        assert_eq!(geometric(9, 0, a, r), vec![9]);
        // Every outcome keeps one candidate while the budget allows; below that, the likeliest win.
        assert!(geometric(5, 4, 0.99, 0.25).iter().all(|&x| x == 1));
        assert_eq!(geometric(2, 4, 0.5, 1.0).iter().sum::<usize>(), 2);
    }

    #[test]
    fn uniform_and_geometric_candidates_exclude_the_drafted_token() {
        let vocab = 6;
        let glue: Vec<f32> = [[5.0, 4.0, 3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]].concat();
        let params = SamplingParams::default();
        let mut u = FanoutPolicy::new(Fanout::Uniform(2), 1);
        assert_eq!(u.candidates(&glue, &[0], &params), vec![(0, 1), (0, 2), (1, 5), (1, 4)]);
        let mut g = FanoutPolicy::new(Fanout::Geometric(Some(3)), 1);
        let c = g.candidates(&glue, &[1], &params);
        assert_eq!(c.len(), 3);
        assert!(!c.contains(&(0, 1)), "a rejected token is never the bonus: {c:?}");
        assert_eq!(glue.len(), 2 * vocab);
    }

    #[test]
    fn top_p_sets_are_minimal_and_renormalised() {
        let probs = [0.5, 0.2, 0.15, 0.1, 0.05, 0.0];
        let toks = |s: Vec<(u32, f32)>| s.into_iter().map(|x| x.0).collect::<Vec<_>>();
        assert_eq!(toks(top_p_set(&probs, 0.6, 10, None)), vec![0, 1]);
        assert_eq!(toks(top_p_set(&probs, 0.5, 10, None)), vec![0]);
        // Without token 0 the rest renormalise to 0.4, 0.3, 0.2, 0.1.
        let s = top_p_set(&probs, 0.65, 10, Some(0));
        assert_eq!(toks(s.clone()), vec![1, 2]);
        assert!((s[0].1 - 0.4).abs() < 1e-6);
        assert_eq!(toks(top_p_set(&probs, 0.99, 2, None)), vec![0, 1], "capped");
        assert_eq!(toks(top_p_set(&probs, 1.0, 10, None)), vec![0, 1, 2, 3, 4], "never a zero-probability token");
    }

    #[test]
    fn top_p_candidates_respect_the_budget_by_outcome_likelihood() {
        let vocab = 8;
        let flat = vec![0.0f32; vocab];
        let glue: Vec<f32> = [flat.clone(), flat.clone(), flat].concat();
        let params = SamplingParams { temperature: 1.0, ..SamplingParams::default() };
        let mut p = FanoutPolicy::new(Fanout::TopP(0.9), 2);
        assert_eq!(p.budget(), 9);
        let c = p.candidates(&glue, &[0, 1], &params);
        assert_eq!(c.len(), 9, "flat rows need 7-8 tokens each; the budget caps them");
        // Acceptance starts at 1/2: P(0) = 1/2, P(1) = 1/4, P(2) = 1/4; k = 0 gets the most.
        let per_k = |k| c.iter().filter(|x| x.0 == k).count();
        assert!(per_k(0) >= per_k(1) && per_k(0) >= per_k(2), "{c:?}");
        assert!(!c.contains(&(0, 0)) && !c.contains(&(1, 1)));
        assert_eq!(p.widths(2), vec![per_k(0), per_k(1), per_k(2)]);
    }

    #[test]
    fn top_p_budget_follows_the_hit_rate() {
        let mut p = FanoutPolicy::new(Fanout::TopP(0.8), 3);
        let start = p.budget();
        for _ in 0..10 {
            p.observe(3, 1, false, 5);
        }
        assert_eq!(p.budget(), start + 10, "misses grow the tree");
        for _ in 0..200 {
            p.observe(3, 1, false, 5);
        }
        assert_eq!(p.budget(), Fanout::TopP(0.8).max_branches(3), "up to its cap");
        for _ in 0..200 {
            p.observe(3, 3, true, 0);
        }
        assert_eq!(p.budget(), 4, "hits shrink it, down to K + 1");
    }

    #[test]
    fn acceptance_and_exponent_are_measured() {
        let mut p = FanoutPolicy::new(Fanout::Geometric(None), 4);
        assert_eq!(p.exponent(), DEFAULT_EXPONENT);
        assert!((p.acceptance() - 0.5).abs() < 1e-9);
        // Ranks with P(rank >= F) = F^-2 for F = 1..7.
        let total = 6400u64;
        let tail = |f: u64| total / (f * f);
        for r in 1..8u64 {
            let count = tail(r) - if r < 7 { tail(r + 1) } else { 0 };
            for _ in 0..count {
                p.observe(4, 3, true, r as usize);
            }
        }
        assert!((p.exponent() - 2.0).abs() < 0.3, "r = {}", p.exponent());
        // 3 accepted and 1 rejection per round.
        assert!((p.acceptance() - 0.75).abs() < 0.01, "a = {}", p.acceptance());
    }

    #[test]
    fn rank_counts_better_candidates() {
        let v = [1.0, 3.0, 3.0, 2.0];
        assert_eq!(rank(&v, 1, None), 0);
        assert_eq!(rank(&v, 2, None), 1, "ties go to the lower index");
        assert_eq!(rank(&v, 2, Some(1)), 0);
        assert_eq!(rank(&v, 0, None), 3);
    }
}
