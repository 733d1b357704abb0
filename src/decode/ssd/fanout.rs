//! Fan-out: which verification outcomes (k, t*) the draft speculates on while the target
//! verifies. For each k in 0..=n (n = draft tokens in the round) it picks candidate bonus tokens
//! from the draft's glue logits g_k; every candidate is one branch of the speculation tree, so
//! the total is the tree's batch width. Only each g_k's likeliest [`FanoutPolicy::glue_entries`]
//! tokens leave the device: as many as any strategy can pick, and enough that every rank the
//! policy tells apart is among them, so the choice is the same as over the whole row.
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

use crate::backend::{TopK, MAX_TOP_K};
use crate::decode::speculation::{Fanout, DEFAULT_WIDTH};
use crate::sampling::SamplingParams;

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

    /// How many of each glue row's likeliest tokens the fan-out reads: a row's candidates, its
    /// drafted token (never a candidate) and a rank past `RANK_CAP` all fit.
    pub fn glue_entries(&self) -> usize {
        (self.fanout.max_branches(self.k) + 1).clamp(RANK_CAP + 2, MAX_TOP_K)
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

    /// The branches (k, candidate bonus token) for a round whose glue pass gave `glue`
    /// (`drafted.len() + 1` rows, at [`ranking_temperature`], each with its drafted token's
    /// value) over the draft tokens `drafted`. A rejected draft token can never be the bonus, so
    /// `drafted[k]` is never a candidate for k.
    pub fn candidates(&mut self, glue: &TopK, drafted: &[u32], params: &SamplingParams) -> Vec<(usize, u32)> {
        let n = drafted.len();
        match self.fanout {
            Fanout::Uniform(_) | Fanout::Geometric(_) => {
                let widths = self.widths(n);
                (0..=n).flat_map(|k| ranked(glue, k, drafted.get(k).copied()).take(widths[k]).map(move |t| (k, t))).collect()
            }
            Fanout::TopP(p) => {
                let a = self.acceptance();
                let outcome = |k: usize| if k < n { a.powi(k as i32) * (1.0 - a) } else { a.powi(n as i32) };
                let temperature = ranking_temperature(params);
                let mut scored = Vec::new();
                for k in 0..=n {
                    for (t, mass) in top_p_set(glue, k, temperature, p, self.budget, drafted.get(k).copied()) {
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

/// Row `k`'s tokens, likeliest first, without `exclude`.
fn ranked(glue: &TopK, k: usize, exclude: Option<u32>) -> impl Iterator<Item = u32> + '_ {
    glue.row(k).0.iter().copied().filter(move |&t| Some(t) != exclude)
}

/// The smallest set of row `k`'s likeliest tokens (never `exclude`) whose probability at
/// `temperature`, renormalised without `exclude`, reaches `p`, at most `cap` of them: (token,
/// renormalised probability), most likely first.
pub fn top_p_set(glue: &TopK, k: usize, temperature: f32, p: f32, cap: usize, exclude: Option<u32>) -> Vec<(u32, f32)> {
    let prob = |value: f32| ((value / temperature - glue.lse[k]) as f64).exp() as f32;
    let (ids, values) = glue.row(k);
    let rest = 1.0 - exclude.map_or(0.0, |_| prob(glue.at[k]));
    let mut mass = 0.0;
    let mut set = Vec::new();
    for (&t, &v) in ids.iter().zip(values).filter(|&(&t, _)| Some(t) != exclude).take(cap) {
        let pt = prob(v);
        if mass >= p || pt <= 0.0 {
            break;
        }
        let share = if rest > 0.0 { pt / rest } else { 0.0 };
        mass += share;
        set.push((t, share));
    }
    set
}

/// Where `token` falls among row `k`'s candidates (`exclude` left out): 0 for the top one; past
/// the row's entries, their number, which is beyond `RANK_CAP`.
pub fn rank(glue: &TopK, k: usize, token: u32, exclude: Option<u32>) -> usize {
    ranked(glue, k, exclude).position(|t| t == token).unwrap_or(glue.k)
}

/// The temperature of the draft's plain distribution used to rank and weigh candidates: the
/// request's (1 when greedy), without top-k/top-p truncation, since the target's bonus token may
/// lie outside the draft's nucleus.
pub fn ranking_temperature(params: &SamplingParams) -> f32 {
    if params.is_greedy() {
        1.0
    } else {
        params.temperature
    }
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

    /// The glue pass's summary of `rows`, each row's value at its drafted token `drafted[r]`.
    fn summary(rows: &[f32], vocab: usize, drafted: &[u32], params: &SamplingParams) -> TopK {
        let at: Vec<u32> = (0..rows.len() / vocab).map(|r| drafted.get(r).copied().unwrap_or(crate::backend::NO_SLOT)).collect();
        TopK::of(rows, vocab, 66, ranking_temperature(params), &at)
    }

    #[test]
    fn uniform_and_geometric_candidates_exclude_the_drafted_token() {
        let vocab = 6;
        let rows: Vec<f32> = [[5.0, 4.0, 3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]].concat();
        let params = SamplingParams::default();
        let mut u = FanoutPolicy::new(Fanout::Uniform(2), 1);
        assert_eq!(u.candidates(&summary(&rows, vocab, &[0], &params), &[0], &params), vec![(0, 1), (0, 2), (1, 5), (1, 4)]);
        let mut g = FanoutPolicy::new(Fanout::Geometric(Some(3)), 1);
        let c = g.candidates(&summary(&rows, vocab, &[1], &params), &[1], &params);
        assert_eq!(c.len(), 3);
        assert!(!c.contains(&(0, 1)), "a rejected token is never the bonus: {c:?}");
    }

    #[test]
    fn top_p_sets_are_minimal_and_renormalised() {
        let probs: [f32; 6] = [0.5, 0.2, 0.15, 0.1, 0.05, 0.0];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let glue = |exclude: Option<u32>| TopK::of(&logits, 6, 6, 1.0, &[exclude.unwrap_or(crate::backend::NO_SLOT)]);
        let set = |p: f32, cap: usize, exclude: Option<u32>| top_p_set(&glue(exclude), 0, 1.0, p, cap, exclude);
        let toks = |s: Vec<(u32, f32)>| s.into_iter().map(|x| x.0).collect::<Vec<_>>();
        assert_eq!(toks(set(0.6, 10, None)), vec![0, 1]);
        assert_eq!(toks(set(0.5, 10, None)), vec![0]);
        // Without token 0 the rest renormalise to 0.4, 0.3, 0.2, 0.1.
        let s = set(0.65, 10, Some(0));
        assert_eq!(toks(s.clone()), vec![1, 2]);
        assert!((s[0].1 - 0.4).abs() < 1e-6);
        assert_eq!(toks(set(0.99, 2, None)), vec![0, 1], "capped");
        assert_eq!(toks(set(1.0, 10, None)), vec![0, 1, 2, 3, 4], "never a zero-probability token");
    }

    #[test]
    fn glue_entries_cover_every_candidate_and_every_told_apart_rank() {
        for fanout in ["uniform:3", "geometric", "geometric:40", "top-p:0.9"] {
            for k in [1, 4, 8] {
                let p = FanoutPolicy::new(fanout.parse().unwrap(), k);
                let e = p.glue_entries();
                assert!(e > p.fanout.max_branches(k) && e >= RANK_CAP + 2, "{fanout} K={k}: {e}");
            }
        }
    }

    #[test]
    fn top_p_candidates_respect_the_budget_by_outcome_likelihood() {
        let vocab = 8;
        let flat = vec![0.0f32; vocab];
        let rows: Vec<f32> = [flat.clone(), flat.clone(), flat].concat();
        let params = SamplingParams { temperature: 1.0, ..SamplingParams::default() };
        let mut p = FanoutPolicy::new(Fanout::TopP(0.9), 2);
        assert_eq!(p.budget(), 9);
        let c = p.candidates(&summary(&rows, vocab, &[0, 1], &params), &[0, 1], &params);
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
        let v = [1.0, 3.0, 3.0, 2.0, 0.0];
        let glue = TopK::of(&v, 5, 4, 1.0, &[0]);
        assert_eq!(rank(&glue, 0, 1, None), 0);
        assert_eq!(rank(&glue, 0, 2, None), 1, "ties go to the lower index");
        assert_eq!(rank(&glue, 0, 2, Some(1)), 0);
        assert_eq!(rank(&glue, 0, 0, None), 3);
        assert_eq!(rank(&glue, 0, 4, None), 4, "past the row's entries");
    }
}
