//! The acceptance math of speculation: whether the target accepts a draft token (min(1, p/q)),
//! the residual distribution norm(max(0, p - q)) the bonus token is drawn from after a rejection,
//! and Saguaro's rescaling of the draft distribution. Together with drawing from the draft's q
//! they keep speculative output exactly the target's in distribution; plain logits -> token
//! sampling is `crate::sampling`.

use crate::sampling::{positive_sum, Rng};

/// Saguaro sampling: scales the draft probability of `tokens` (the draft's own top-F, i.e. the
/// cached bonus candidates) by `c` in [0, 1], then renormalises. Pushing draft mass off those
/// tokens moves it into the residual max(0, p - q), so after a rejection the bonus token is more
/// likely to be one that the speculation cache already holds. Verification stays exact for any
/// q, as long as the same rescaled q is used for drafting and for `accept`/`residual`.
///
/// c = 1 leaves `q` untouched. If nothing would remain (c = 0 with all mass on `tokens`), `q` is
/// also left untouched, which is the limit of the rescaled distribution as c -> 0.
/// Repeated and out-of-range tokens are ignored.
pub fn saguaro_rescale(q: &mut [f32], tokens: &[u32], c: f32) {
    debug_assert!((0.0..=1.0).contains(&c), "saguaro scale {c} outside [0, 1]");
    let c = if c.is_nan() { 1.0 } else { c.clamp(0.0, 1.0) };
    if c == 1.0 {
        return;
    }
    let mut saved: Vec<(usize, f32)> = Vec::with_capacity(tokens.len());
    for &t in tokens {
        let t = t as usize;
        if t < q.len() && !saved.iter().any(|&(s, _)| s == t) {
            saved.push((t, q[t]));
            q[t] *= c;
        }
    }
    let total = positive_sum(q);
    if total <= 0.0 {
        for (t, x) in saved {
            q[t] = x;
        }
        return;
    }
    let inv = 1.0 / total;
    for x in q.iter_mut() {
        *x = (*x as f64 * inv) as f32;
    }
}

/// The rejection step of speculative decoding: accepts the draft token `s` with probability
/// min(1, p[s] / q[s]), where `p` is the target's and `q` the draft's distribution.
///
/// One uniform is drawn on every call, even when acceptance is certain, so the random stream
/// advances the same way whatever the outcome.
pub fn accept(p: &[f32], q: &[f32], s: u32, rng: &mut Rng) -> bool {
    accept_at(p.get(s as usize).copied().unwrap_or(0.0), q.get(s as usize).copied().unwrap_or(0.0), rng)
}

/// [`accept`] given the two probabilities at the draft token alone: `ps` the target's, `qs` the
/// draft's.
pub fn accept_at(ps: f32, qs: f32, rng: &mut Rng) -> bool {
    let u = rng.uniform_f64();
    // u * q < p is u < p / q without dividing, and handles q[s] = 0 (accept iff p[s] > 0).
    u * (qs as f64) < (ps as f64)
}

/// The residual distribution norm(max(0, p - q)) that the bonus token is drawn from after a
/// rejection. When it is all zero (p == q, where rejection cannot happen) it is `p` itself.
pub fn residual(p: &[f32], q: &[f32]) -> Vec<f32> {
    debug_assert_eq!(p.len(), q.len());
    let mut r = p.to_vec();
    for (x, &qi) in r.iter_mut().zip(q) {
        let d = *x - qi;
        *x = if d > 0.0 { d } else { 0.0 };
    }
    // Tokens past the end of a short q count as q = 0; clear any negative or NaN p there too.
    for x in r.iter_mut().skip(q.len()) {
        *x = if *x > 0.0 { *x } else { 0.0 };
    }
    let total = positive_sum(&r);
    if total <= 0.0 {
        return p.to_vec();
    }
    let inv = (1.0 / total) as f32;
    for x in &mut r {
        *x *= inv;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::tests::{assert_close, frequencies};
    use crate::sampling::{sample, top_n};

    /// One position of speculative decoding: draft s ~ q, accept with min(1, p/q), otherwise
    /// draw the bonus token from `resid(p, q)`.
    fn sd_step(p: &[f32], q: &[f32], rng: &mut Rng, resid: fn(&[f32], &[f32]) -> Vec<f32>) -> u32 {
        let s = sample(q, rng);
        if accept(p, q, s, rng) {
            s
        } else {
            sample(&resid(p, q), rng)
        }
    }

    #[test]
    fn speculative_step_is_lossless() {
        let p = [0.1, 0.2, 0.3, 0.4];
        let q = [0.4, 0.3, 0.2, 0.1];
        let mut rng = Rng::new(77);
        let f = frequencies(4, 200_000, || sd_step(&p, &q, &mut rng, residual));
        assert_close(&f, &p, 0.01);

        // The same check catches a residual built from q - p: this one lands on q, not p.
        fn swapped(p: &[f32], q: &[f32]) -> Vec<f32> {
            residual(q, p)
        }
        let mut rng = Rng::new(77);
        let f = frequencies(4, 200_000, || sd_step(&p, &q, &mut rng, swapped));
        let worst = f.iter().zip(&p).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(worst > 0.1, "buggy residual went unnoticed: {f:?}");

        // A draft that puts mass where the target has none, and vice versa.
        let p = [0.0, 0.5, 0.3, 0.2, 0.0];
        let q = [0.3, 0.1, 0.3, 0.0, 0.3];
        let mut rng = Rng::new(78);
        let f = frequencies(5, 200_000, || sd_step(&p, &q, &mut rng, residual));
        assert_close(&f, &p, 0.01);
        assert_eq!((f[0], f[4]), (0.0, 0.0));
    }

    #[test]
    fn residual_and_accept_basics() {
        let r = residual(&[0.1, 0.2, 0.3, 0.4], &[0.4, 0.3, 0.2, 0.1]);
        assert_close(&r, &[0.0, 0.0, 0.25, 0.75], 1e-6);
        let p = [0.25, 0.75];
        assert_eq!(residual(&p, &p), p.to_vec());

        let mut rng = Rng::new(0);
        // p >= q: always accepted; p = 0: never.
        for _ in 0..1000 {
            assert!(accept(&[0.5, 0.5], &[0.6, 0.4], 1, &mut rng));
            assert!(!accept(&[0.0, 1.0], &[0.6, 0.4], 0, &mut rng));
        }
        // Acceptance rate p/q = 0.25.
        let n = 200_000;
        let hits = (0..n).filter(|_| accept(&[0.1, 0.9], &[0.4, 0.6], 0, &mut rng)).count();
        assert!((hits as f32 / n as f32 - 0.25).abs() < 0.01);
    }

    #[test]
    fn saguaro_rescale_scales_then_renormalises() {
        let q0 = [0.4, 0.3, 0.2, 0.1];
        let mut q = q0;
        saguaro_rescale(&mut q, &[0, 1], 1.0);
        assert_eq!(q, q0);

        let mut q = q0;
        saguaro_rescale(&mut q, &[0, 1], 0.5);
        let s = 0.2 + 0.15 + 0.2 + 0.1;
        assert_close(&q, &[0.2 / s, 0.15 / s, 0.2 / s, 0.1 / s], 1e-6);
        // Listed tokens' mass relative to the rest is halved.
        assert!(((q[0] + q[1]) / (q[2] + q[3]) - 0.5 * 0.7 / 0.3).abs() < 1e-5);

        // A repeated token is scaled once; an out-of-range one is ignored.
        let mut r = q0;
        saguaro_rescale(&mut r, &[1, 0, 1, 99], 0.5);
        assert_eq!(r, q);

        let mut q = q0;
        saguaro_rescale(&mut q, &[3], 0.0);
        assert_close(&q, &[0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0.0], 1e-6);

        // Nothing would be left: unchanged, the c -> 0 limit.
        let mut q = [0.6, 0.4, 0.0];
        saguaro_rescale(&mut q, &[0, 1], 0.0);
        assert_eq!(q, [0.6, 0.4, 0.0]);
    }

    #[test]
    fn speculative_step_with_saguaro_draft_is_lossless() {
        let p = [0.35, 0.25, 0.2, 0.15, 0.05];
        let mut q = [0.5, 0.2, 0.1, 0.1, 0.1];
        let cached = top_n(&q, 2, None);
        assert_eq!(cached, vec![0, 1]);
        saguaro_rescale(&mut q, &cached, 0.3);
        let mut rng = Rng::new(99);
        let f = frequencies(5, 200_000, || sd_step(&p, &q, &mut rng, residual));
        assert_close(&f, &p, 0.01);
    }
}
