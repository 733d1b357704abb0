//! Generation at its limits: a full context window ends AR, SD and SSD cleanly with
//! `ContextFull`, and a cancel handle stops each within one round (also while the SSD draft
//! speculates), leaving the engine to give exactly what a fresh one gives next.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use futures::executor::block_on;

use saguaro::backend::Batch;
use saguaro::decode::{
    generate_ar, generate_sd, generate_ssd, Backup, CancelToken, DraftWorker, FinishReason, Generation, Request,
    SpecConfig,
};
use saguaro::model::runner::{Hooked, Lm};
use saguaro::model::weights::ModelWeights;
use saguaro::sampling::SamplingParams;
use saguaro::Error;

use common::{runner, tiny_weights};

const VOCAB: usize = 32;
const PROMPT: [u32; 3] = [1, 5, 9];

struct Models {
    target: ModelWeights,
    draft: ModelWeights,
}

fn models() -> &'static Models {
    static M: OnceLock<Models> = OnceLock::new();
    M.get_or_init(|| Models { target: tiny_weights(21, VOCAB, 2, 0.6), draft: tiny_weights(22, VOCAB, 1, 0.6) })
}

fn request(max_tokens: usize, sampling: SamplingParams) -> Request {
    Request { prompt: PROMPT.to_vec(), max_tokens, sampling, ..Request::default() }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 1.0, seed, ..SamplingParams::default() }
}

/// K = 6 with a wide fan-out: near the end of the window a full speculation would run past it.
fn spec() -> SpecConfig {
    SpecConfig::new(6, "uniform:3".parse().unwrap(), 1.0, Backup::Jit)
}

fn ar(lm: &mut dyn Lm, req: &Request) -> saguaro::Result<Generation> {
    block_on(generate_ar(lm, req, &mut |_| true))
}

fn sd(t: &mut dyn Lm, d: &mut dyn Lm, req: &Request) -> saguaro::Result<Generation> {
    block_on(generate_sd(t, d, req, &spec(), &mut |_| true))
}

fn ssd(t: &mut dyn Lm, w: &mut DraftWorker, req: &Request) -> saguaro::Result<Generation> {
    block_on(generate_ssd(t, w, req, &spec(), &mut |_| true))
}

/// A draft worker whose model has room for `context` tokens besides the speculation scratch.
fn worker(context: usize) -> DraftWorker {
    DraftWorker::new(Box::new(runner(&models().draft, context + spec().draft_scratch()))).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Context exhaustion.

#[test]
fn a_full_context_ends_every_strategy_cleanly() {
    const CONTEXT: usize = 40;
    let room = CONTEXT - PROMPT.len();
    let m = models();
    let mut t = runner(&m.target, CONTEXT);
    let mut d = runner(&m.draft, CONTEXT);
    let mut w = worker(CONTEXT);
    // The same tokens, asked for exactly, from a model with room to spare.
    let mut roomy = runner(&m.target, 4 * CONTEXT);
    for sampling in [SamplingParams::default(), sampled(3), sampled(4)] {
        let greedy = sampling.is_greedy();
        let want = ar(&mut roomy, &request(room, sampling)).unwrap();
        assert_eq!(want.finish, FinishReason::MaxTokens);
        let req = request(1000, sampling);
        for (what, g) in [
            ("ar", ar(&mut t, &req).unwrap()),
            ("sd", sd(&mut t, &mut d, &req).unwrap()),
            ("ssd", ssd(&mut t, &mut w, &req).unwrap()),
        ] {
            assert_eq!(g.finish, FinishReason::ContextFull, "{what} {sampling:?}");
            assert_eq!(g.tokens.len(), room, "{what} fills the window {sampling:?}");
            // Greedy speculation reproduces AR exactly; sampled speculation uses its random
            // stream differently, so only its length is compared.
            if greedy || what == "ar" {
                assert_eq!(g.tokens, want.tokens, "{what} {sampling:?}");
            }
        }
    }
}

#[test]
fn the_model_context_length_bounds_generation_too() {
    let mut w = models().target.clone();
    w.config.context_length = 20;
    let g = ar(&mut runner(&w, 64), &request(100, SamplingParams::default())).unwrap();
    assert_eq!((g.finish, g.tokens.len()), (FinishReason::ContextFull, 20 - PROMPT.len()));
}

#[test]
fn a_prompt_that_leaves_no_room_is_refused_and_one_that_leaves_one_token_is_not() {
    let mut t = runner(&models().target, PROMPT.len());
    let err = ar(&mut t, &request(5, SamplingParams::default())).unwrap_err();
    assert!(matches!(err, Error::PromptTooLong { prompt: 3, context: 3 }), "{err}");
    assert!(err.to_string().contains("prompt of 3 tokens"), "{err}");
    let mut t = runner(&models().target, PROMPT.len() + 1);
    let g = ar(&mut t, &request(5, SamplingParams::default())).unwrap();
    assert_eq!((g.finish, g.tokens.len()), (FinishReason::ContextFull, 1));
}

#[test]
fn a_draft_with_a_shorter_context_than_the_request_needs_is_refused() {
    let m = models();
    let mut t = runner(&m.target, 64);
    let mut d = runner(&m.draft, 20);
    let mut w = worker(20);
    let long = request(30, SamplingParams::default());
    for err in [sd(&mut t, &mut d, &long).unwrap_err(), ssd(&mut t, &mut w, &long).unwrap_err()] {
        assert!(matches!(err, Error::IncompatibleDraft(_)), "{err}");
        assert!(err.to_string().contains("draft's context has room for 17 tokens"), "{err}");
    }
    // Within the draft's window the same models are fine.
    let short = request(17, SamplingParams::default());
    let want = ar(&mut t, &short).unwrap().tokens;
    assert_eq!(sd(&mut t, &mut d, &short).unwrap().tokens, want);
    assert_eq!(ssd(&mut t, &mut w, &short).unwrap().tokens, want);
}

// ---------------------------------------------------------------------------------------------
// Cancellation.

const CAPACITY: usize = 256;
const TOKENS: usize = 40;

/// Cancel `req` once `after` tokens have been committed, then generate `req` again with a fresh
/// token on the same models; returns (the cancelled generation, the next one).
fn cancel_then_again(
    after: usize,
    req: &Request,
    mut generate: impl FnMut(&Request, &mut dyn FnMut(&[u32]) -> bool) -> Generation,
) -> (Generation, Generation) {
    let cancelled = Request { cancel: CancelToken::new(), ..req.clone() };
    let mut seen = 0;
    let g = generate(&cancelled, &mut |toks: &[u32]| {
        seen += toks.len();
        if seen >= after {
            cancelled.cancel.cancel();
        }
        // The sink keeps accepting: only the token stops the generation.
        true
    });
    let again = generate(req, &mut |_| true);
    (g, again)
}

fn assert_cancelled_within_a_round(g: &Generation, after: usize, per_round: usize, what: &str) {
    assert_eq!(g.finish, FinishReason::Cancelled, "{what}");
    assert!(
        (after..after + per_round).contains(&g.tokens.len()),
        "{what}: {} tokens after a cancel at {after} (at most {per_round} per round)",
        g.tokens.len()
    );
}

#[test]
fn a_cancel_stops_each_strategy_within_a_round_and_the_next_generation_is_fresh() {
    let m = models();
    let per_round = spec().k + 1;
    for sampling in [SamplingParams::default(), sampled(7)] {
        let req = request(TOKENS, sampling);
        let fresh_ar = ar(&mut runner(&m.target, CAPACITY), &req).unwrap();
        let fresh_sd = sd(&mut runner(&m.target, CAPACITY), &mut runner(&m.draft, CAPACITY), &req).unwrap();
        let fresh_ssd = ssd(&mut runner(&m.target, CAPACITY), &mut worker(CAPACITY), &req).unwrap();

        let mut t = runner(&m.target, CAPACITY);
        let (g, again) = cancel_then_again(5, &req, |r, sink| block_on(generate_ar(&mut t, r, sink)).unwrap());
        assert_cancelled_within_a_round(&g, 5, 1, "ar");
        assert_eq!(g.tokens[..], fresh_ar.tokens[..g.tokens.len()], "ar before the cancel");
        assert_eq!(again.tokens, fresh_ar.tokens, "ar after a cancel {sampling:?}");

        let mut d = runner(&m.draft, CAPACITY);
        let (g, again) =
            cancel_then_again(5, &req, |r, sink| block_on(generate_sd(&mut t, &mut d, r, &spec(), sink)).unwrap());
        assert_cancelled_within_a_round(&g, 5, per_round, "sd");
        assert_eq!(again.tokens, fresh_sd.tokens, "sd after a cancel {sampling:?}");

        let mut w = worker(CAPACITY);
        let (g, again) =
            cancel_then_again(5, &req, |r, sink| block_on(generate_ssd(&mut t, &mut w, r, &spec(), sink)).unwrap());
        assert_cancelled_within_a_round(&g, 5, per_round, "ssd");
        assert_eq!(again.tokens, fresh_ssd.tokens, "ssd after a cancel {sampling:?}");
    }
}

#[test]
fn a_cancel_before_the_first_round_keeps_only_the_prefill_token() {
    let req = request(TOKENS, SamplingParams::default());
    req.cancel.cancel();
    let g = ar(&mut runner(&models().target, CAPACITY), &req).unwrap();
    assert_eq!((g.finish, g.tokens.len()), (FinishReason::Cancelled, 1));
}

/// A cancel that arrives while the draft worker is in the middle of a speculation tree (set by
/// the draft itself, on its worker, at its third tree step) stops the tree at once, ends the
/// generation within the round, and the next generation is exactly a fresh engine's.
#[test]
fn a_cancel_during_ssd_speculation_stops_the_tree() {
    let m = models();
    for inline in [false, true] {
        let req = request(TOKENS, sampled(11));
        let want = ssd(&mut runner(&m.target, CAPACITY), &mut worker(CAPACITY), &req).unwrap().tokens;

        let cancelled = Request { cancel: CancelToken::new(), ..req.clone() };
        let tree_steps = Arc::new(AtomicUsize::new(0));
        let hook = {
            let (cancel, tree_steps) = (cancelled.cancel.clone(), tree_steps.clone());
            move |batch: &Batch| {
                // Tree steps are the only batches that attend to extra (tree) slots.
                if !batch.mask.extra.is_empty() && tree_steps.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                    cancel.cancel();
                }
                None
            }
        };
        let lm = Hooked::new(runner(&m.draft, CAPACITY + spec().draft_scratch()), hook);
        let mut w = if inline { DraftWorker::inline(Box::new(lm)) } else { DraftWorker::new(Box::new(lm)).unwrap() };
        let mut t = runner(&m.target, CAPACITY);
        let g = block_on(generate_ssd(&mut t, &mut w, &cancelled, &spec(), &mut |_| true)).unwrap();
        let what = if inline { "inline draft" } else { "threaded draft" };
        assert_eq!(g.finish, FinishReason::Cancelled, "{what}");
        assert_eq!(tree_steps.load(Ordering::SeqCst), 3, "{what}: no tree step runs after the cancel");
        assert!(g.tokens.len() < TOKENS, "{what}: stopped early");
        let again = block_on(generate_ssd(&mut t, &mut w, &req, &spec(), &mut |_| true)).unwrap();
        assert_eq!(again.tokens, want, "{what}: after a cancel, a fresh engine's tokens");
    }
}
