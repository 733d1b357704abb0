//! Verification: the target judges a proposal in one forward and decides the outcome (k, t*).
//! Greedy, it accepts draft tokens while they equal the target's argmax; sampling, it accepts
//! each with probability min(1, p/q) and draws t* from the residual norm(max(0, p - q)) after a
//! rejection (from p after none), which keeps the output exactly the target's in distribution.
//!
//! The target's KV cache holds the committed sequence less its newest token `rec`; a verify
//! writes [rec, proposal] after it and commits rec and the accepted draft tokens. The bonus
//! token t* is the next round's `rec`.

use super::accept::{accept, accept_at, residual};
use super::config::Fault;
use super::drafter::Proposal;
use std::sync::Arc;

use crate::backend::{Allowed, Batch, Draw, Drawn, SparseDist, NO_SLOT};
use crate::decode::generation::target_rows::{drawn_on_backend, Rows};
use crate::error::Result;
use crate::model::runner::Lm;
use crate::sampling::{self, Rng, SamplingParams};

/// The verification outcome v = (k, t*).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    /// Draft tokens accepted (k).
    pub accepted: usize,
    /// The token the target adds after them (t*), the next round's first token.
    pub bonus: u32,
}

impl Outcome {
    /// What the round adds to the output: the accepted draft tokens, then the bonus token.
    pub fn committed(&self, proposal: &Proposal) -> Vec<u32> {
        let mut tokens = proposal.tokens[..self.accepted].to_vec();
        tokens.push(self.bonus);
        tokens
    }
}

/// Run the target once over [rec, proposal] at the end of its committed sequence, decide the
/// outcome, and commit rec and the accepted draft tokens (the bonus token is left for the next
/// round to feed). Under a grammar, `allowed` masks each of the n + 1 rows as the grammar
/// masks that position of the output, so the target judges with the masked, renormalized
/// distributions (exactly the constrained target's) and its bonus token is allowed too.
pub(crate) async fn verify(
    target: &mut dyn Lm,
    rec: u32,
    proposal: &Proposal,
    params: &SamplingParams,
    rng: &mut Rng,
    fault: Option<Fault>,
    allowed: Option<Arc<Allowed>>,
) -> Result<Outcome> {
    let n = proposal.tokens.len();
    let tokens: Vec<u32> = std::iter::once(rec).chain(proposal.tokens.iter().copied()).collect();
    let batch = Batch { allowed, ..Batch::causal(&tokens, target.len()) };
    let rows: Vec<u32> = (0..=n as u32).collect();
    let outcome = if params.is_greedy() {
        judge_greedy(&proposal.tokens, &target.argmax(&batch, &rows).await?)
    } else {
        // Pairing tokens with distributions below would silently pass a token that lacks its q.
        assert_eq!(proposal.q.len(), n, "every sampled draft token must come with the q it was drawn from");
        if drawn_on_backend(params) {
            // Each row draws from the residual it would be drawn from after a rejection there;
            // the last row, reached after none, from p.
            let minus = match fault {
                Some(Fault::ResidualIsTarget) => vec![],
                None => proposal.q.iter().map(|q| SparseDist::of(q)).chain([SparseDist::default()]).collect(),
            };
            let at = proposal.tokens.iter().copied().chain([NO_SLOT]).collect();
            let draw = Draw { temperature: params.temperature, seed: rng.next_u64(), at, minus };
            judge_drawn(proposal, &target.draw(&batch, &rows, &draw).await?, rng)
        } else {
            let vocab = target.config().vocab_size;
            let p_rows = Rows::of(target, &batch, &rows, params).await?;
            judge_sampled(proposal, |i| p_rows.probs(i, vocab, params), rng, fault)
        }
    };
    target.advance(outcome.accepted + 1)?;
    Ok(outcome)
}

/// Greedy: accept draft tokens while each equals the target's argmax `best[i]` at its position;
/// t* is the argmax after the last accepted one.
fn judge_greedy(drafted: &[u32], best: &[u32]) -> Outcome {
    let accepted = drafted.iter().zip(best).take_while(|(s, b)| s == b).count();
    Outcome { accepted, bonus: best[accepted] }
}

/// Sampling: accept draft token i with probability min(1, p_i/q_i); on the first rejection draw
/// t* from the residual of p_i and q_i, after all of them from p_n. `p(i)` is the target's
/// distribution after [rec, s1..si].
fn judge_sampled(proposal: &Proposal, p: impl Fn(usize) -> Vec<f32>, rng: &mut Rng, fault: Option<Fault>) -> Outcome {
    let n = proposal.tokens.len();
    let rejected = proposal.tokens.iter().zip(&proposal.q).enumerate().find_map(|(i, (&s, q))| {
        let p = p(i);
        (!accept(&p, q, s, rng)).then(|| {
            let r = match fault {
                Some(Fault::ResidualIsTarget) => p,
                None => residual(&p, q),
            };
            Outcome { accepted: i, bonus: sampling::sample(&r, rng) }
        })
    });
    rejected.unwrap_or_else(|| Outcome { accepted: n, bonus: sampling::sample(&p(n), rng) })
}

/// [`judge_sampled`] where the target's rows stayed on its backend: `drawn[i]` holds p_i at draft
/// token i and a token drawn from the residual of p_i and q_i, `drawn[n]` one drawn from p_n.
/// Each row's draw is independent of the acceptance tests, so taking the draw at the first
/// rejection is drawing from that residual.
fn judge_drawn(proposal: &Proposal, drawn: &[Drawn], rng: &mut Rng) -> Outcome {
    let n = proposal.tokens.len();
    let rejected = proposal.tokens.iter().zip(&proposal.q).zip(drawn).position(|((&s, q), d)| {
        !accept_at(d.p_at, q.get(s as usize).copied().unwrap_or(0.0), rng)
    });
    let accepted = rejected.unwrap_or(n);
    Outcome { accepted, bonus: drawn[accepted].token }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t: usize) -> Vec<f32> {
        let mut d = vec![0.0; 4];
        d[t] = 1.0;
        d
    }

    #[test]
    fn greedy_accepts_the_prefix_that_matches_the_argmax() {
        assert_eq!(judge_greedy(&[3, 1, 2], &[3, 1, 0, 2]), Outcome { accepted: 2, bonus: 0 });
        assert_eq!(judge_greedy(&[3, 1], &[3, 1, 2]), Outcome { accepted: 2, bonus: 2 });
        assert_eq!(judge_greedy(&[], &[1]), Outcome { accepted: 0, bonus: 1 });
        let prop = Proposal { tokens: vec![3, 1, 2], q: vec![] };
        assert_eq!(Outcome { accepted: 1, bonus: 0 }.committed(&prop), vec![3, 0]);
    }

    #[test]
    fn sampling_rejects_what_the_target_never_draws() {
        // The target puts all its mass on token 1 at position 0, on 2 after it.
        let target = |i: usize| point(i + 1);
        let mut rng = Rng::new(7);
        let agrees = Proposal { tokens: vec![1, 2], q: vec![point(1), point(2)] };
        assert_eq!(judge_sampled(&agrees, target, &mut rng, None), Outcome { accepted: 2, bonus: 3 });
        // Token 0 has no target mass: rejected, and t* comes from the residual, which is p here.
        let wrong = Proposal { tokens: vec![1, 0], q: vec![point(1), point(0)] };
        assert_eq!(judge_sampled(&wrong, target, &mut rng, None), Outcome { accepted: 1, bonus: 2 });
        // A residual that excludes the rejected token's mass, seen through a draft that spread q.
        let spread = Proposal { tokens: vec![0], q: vec![vec![0.5, 0.5, 0.0, 0.0]] };
        let half = |_: usize| vec![0.0, 0.5, 0.5, 0.0];
        for seed in 0..20 {
            let o = judge_sampled(&spread, half, &mut Rng::new(seed), None);
            assert_eq!(o, Outcome { accepted: 0, bonus: 2 }, "residual max(0, p - q) is all on token 2");
        }
    }
}
