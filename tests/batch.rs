//! Many sequences in one forward (`model::shared`, `decode::batch`): each sequence's output in
//! any batch, joined at any round beside any others, is the output it gets alone, token for
//! token, greedy and sampled, AR and SD (an SD sequence also while its rounds follow the batch's
//! size down to AR steps); a sequence that fails, is cancelled or runs out of room
//! ends alone and the others run on; the cache's regions bound the batch.

mod common;
mod util;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use futures::executor::block_on;

use saguaro::backend::cpu::CpuBackend;
use saguaro::decode::speculation::{AdaptiveK, BatchSize};
use saguaro::decode::{generate_ar, generate_sd, Batcher, Backup, FinishReason, Generation, Mode, Request, SpecConfig};
use saguaro::model::runner::{BoxedLm, Lm, Runner};
use saguaro::model::shared::{Shared, PREFILL_CHUNK};
use saguaro::model::transformer::Transformer;
use saguaro::model::weights::ModelWeights;
use saguaro::sampling::SamplingParams;
use saguaro::Error;

const CONTEXT: usize = 96;

fn spec() -> SpecConfig {
    SpecConfig::new(3, "uniform:2".parse().unwrap(), 1.0, Backup::Jit)
}

fn shared(w: &ModelWeights, sequences: usize) -> Shared {
    let backend = CpuBackend::new(2).unwrap();
    let slots = Shared::region(CONTEXT) * sequences;
    let lm: BoxedLm = Box::new(Runner::with_slots(Transformer::new(backend, w).unwrap(), CONTEXT, slots).unwrap());
    Shared::new(lm, CONTEXT, sequences).unwrap()
}

/// What `req` gives alone in `mode` on fresh single-sequence runners.
fn alone(target: &ModelWeights, draft: &ModelWeights, req: &Request, mode: Mode) -> Generation {
    let runner = |w: &ModelWeights| Runner::new(Transformer::new(CpuBackend::new(1).unwrap(), w).unwrap(), CONTEXT).unwrap();
    let mut t = runner(target);
    match mode {
        Mode::Ar => block_on(generate_ar(&mut t, req, &mut |_| true)).unwrap(),
        _ => block_on(generate_sd(&mut t, &mut runner(draft), req, &spec(), &mut |_| true)).unwrap(),
    }
}

/// One generation to run in a batch: its request, its mode and the step it joins at.
struct Job {
    req: Request,
    mode: Mode,
    at: usize,
}

/// Run `jobs` on one batcher, each joining at its step; their results by job, and the tokens
/// each sink saw.
fn batched(mut batcher: Batcher<'_>, jobs: &[Job]) -> (Vec<saguaro::Result<Generation>>, Vec<Vec<u32>>) {
    let streamed: Vec<Rc<RefCell<Vec<u32>>>> = jobs.iter().map(|_| Rc::default()).collect();
    let mut ids = BTreeMap::new();
    let mut results: BTreeMap<usize, saguaro::Result<Generation>> = BTreeMap::new();
    let mut step = 0;
    while results.len() < jobs.len() {
        for (j, job) in jobs.iter().enumerate().filter(|(_, job)| job.at == step) {
            let seen = streamed[j].clone();
            let sink = Box::new(move |t: &[u32]| {
                seen.borrow_mut().extend_from_slice(t);
                true
            });
            match batcher.join(job.req.clone(), job.mode, &spec(), sink) {
                Ok(id) => drop(ids.insert(id, j)),
                Err(e) => drop(results.insert(j, Err(e))),
            }
        }
        for (id, result) in block_on(batcher.step()) {
            results.insert(ids[&id], result);
        }
        step += 1;
        assert!(step < 10_000, "the batch never finished");
    }
    (results.into_values().collect(), streamed.iter().map(|s| s.borrow().clone()).collect())
}

fn prompts(m: &saguaro::model::load::ModelFile) -> Vec<Vec<u32>> {
    ["def fibonacci(n):", "The capital of France is", "import numpy as np\nx = np.", "1, 2, 3, 4,"]
        .iter()
        .map(|p| m.tokenizer.encode(p).unwrap())
        .collect()
}

#[test]
fn greedy_and_sampled_sequences_in_a_batch_equal_their_output_alone() {
    let m = util::model(util::SMOLLM2);
    let draft = util::truncated(&m.weights);
    let prompts = prompts(&m);
    let sampled = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, seed: 7 };
    let mut jobs = Vec::new();
    // Mixed modes, prompt lengths, token limits and samplings; two join while the others run.
    for (i, p) in prompts.iter().enumerate() {
        for (mode, sampling) in [(Mode::Ar, SamplingParams::default()), (Mode::Sd, SamplingParams::default()), (Mode::Sd, SamplingParams { seed: i as u64, ..sampled })] {
            let req = Request { prompt: p.clone(), max_tokens: 10 + 3 * i, sampling, ..Request::default() };
            jobs.push(Job { req, mode, at: if jobs.len() % 5 == 4 { 3 + jobs.len() } else { 0 } });
        }
    }
    jobs.push(Job { req: Request { prompt: prompts[0].clone(), max_tokens: 12, sampling: sampled, ..Request::default() }, mode: Mode::Ar, at: 1 });
    // Prompts longer than a prefill chunk join while the others decode: they prefill a chunk a step.
    let long: Vec<u32> = prompts.iter().flatten().copied().cycle().take(2 * PREFILL_CHUNK + 7).collect();
    for (mode, at) in [(Mode::Ar, 2), (Mode::Sd, 4)] {
        jobs.push(Job { req: Request { prompt: long.clone(), max_tokens: 9, ..Request::default() }, mode, at });
    }
    let batcher = Batcher::new(shared(&m.weights, jobs.len()), Some(shared(&draft, jobs.len())));
    let (results, streamed) = batched(batcher, &jobs);
    let mut accepted_below_one = false;
    for ((job, got), seen) in jobs.iter().zip(results).zip(streamed) {
        let got = got.unwrap();
        let want = alone(&m.weights, &draft, &job.req, job.mode);
        assert_eq!(got.tokens, want.tokens, "{:?} joining at step {} with {:?}", job.mode, job.at, job.req.sampling);
        assert_eq!(got.finish, want.finish);
        assert_eq!(seen, got.tokens, "the sink saw every token once, in order");
        accepted_below_one |= got.stats.acceptance_rate.is_some_and(|a| a < 1.0);
    }
    assert!(accepted_below_one, "the two-layer draft should be rejected sometimes, so rollback runs in the batch");
}

/// An SD sequence choosing K by the batch's size (as the pool sets it each step): alone it
/// speculates; once two others join, its rounds are AR steps that draft nothing; when they have
/// left it speculates again, its draft catching up on the tokens of those steps. Its tokens stay
/// its greedy tokens alone throughout, and the others' theirs.
#[test]
fn an_sd_sequence_decodes_by_ar_steps_while_its_batch_is_large_and_stays_exact() {
    let m = util::model(util::SMOLLM2);
    let draft = util::truncated(&m.weights);
    let p = prompts(&m);
    // Round costs by batch size and K: alone K = 3 pays; in a batch of 2 or more, K = 0.
    let table = vec![vec![10.0, 10.5, 11.0, 11.5], vec![10.0, 40.0, 60.0, 80.0], vec![10.0, 40.0, 60.0, 80.0]];
    let size = BatchSize::default();
    let adaptive = SpecConfig { adapt: AdaptiveK::in_batch(table, size.clone(), 0.9), ..spec() };
    let mut batcher = Batcher::new(shared(&m.weights, 3), Some(shared(&draft, 3)));
    let req = |prompt: &[u32], max_tokens| Request { prompt: prompt.to_vec(), max_tokens, ..Request::default() };
    let sd = batcher.join(req(&p[0], 40), Mode::Sd, &adaptive, Box::new(|_| true)).unwrap();
    let mut done = BTreeMap::new();
    let mut others = Vec::new();
    for step in 0..200 {
        if step == 3 {
            others = [(1, 8), (2, 10)].iter().map(|&(i, n)| batcher.join(req(&p[i], n), Mode::Ar, &spec(), Box::new(|_| true)).unwrap()).collect();
        }
        size.set(batcher.len());
        done.extend(block_on(batcher.step()));
        if batcher.is_empty() {
            break;
        }
    }
    let got = done.remove(&sd).unwrap().unwrap();
    assert_eq!(got.tokens, alone(&m.weights, &draft, &req(&p[0], 40), Mode::Ar).tokens);
    let proposed: Vec<usize> = got.stats.timeline.as_ref().unwrap().iter().map(|r| r.proposed).collect();
    let first_ar = proposed.iter().position(|&k| k == 0).expect("AR steps while the batch was large");
    assert!(proposed[..first_ar].iter().any(|&k| k > 0), "speculation before the others joined: {proposed:?}");
    // The last round may be cut short by max_tokens: speculation resumes before it.
    assert!(proposed[first_ar..proposed.len() - 1].iter().any(|&k| k > 0), "speculation again once they left: {proposed:?}");
    for (id, (i, n)) in others.into_iter().zip([(1, 8), (2, 10)]) {
        assert_eq!(done[&id].as_ref().unwrap().tokens, alone(&m.weights, &draft, &req(&p[i], n), Mode::Ar).tokens);
    }
}

#[test]
fn a_failing_or_cancelled_sequence_ends_alone_and_the_regions_bound_the_batch() {
    let m = util::model(util::SMOLLM2);
    let p = prompts(&m);
    let mut batcher = Batcher::new(shared(&m.weights, 3), None);
    let req = |prompt: &[u32], max_tokens| Request { prompt: prompt.to_vec(), max_tokens, ..Request::default() };
    let keep = batcher.join(req(&p[0], 12), Mode::Ar, &spec(), Box::new(|_| true)).unwrap();
    // A prompt with a token outside the vocabulary fails at its first forward, alone.
    let bad = batcher.join(req(&[1, 2, 999_999], 5), Mode::Ar, &spec(), Box::new(|_| true)).unwrap();
    let mut given = 0;
    let cancelled = batcher.join(req(&p[1], 50), Mode::Ar, &spec(), Box::new(move |t| {
        given += t.len();
        given < 3
    }));
    let cancelled = cancelled.unwrap();
    let refused = batcher.join(req(&p[2], 5), Mode::Ar, &spec(), Box::new(|_| true));
    assert!(matches!(refused, Err(Error::InvalidArgument(ref m)) if m.contains("taken")), "{refused:?}");
    assert!(batcher.join(req(&p[2], 5), Mode::Ssd, &spec(), Box::new(|_| true)).is_err(), "SSD is refused in a batch");
    let done: BTreeMap<u64, _> = block_on(batcher.finish()).into_iter().collect();
    assert!(matches!(done[&bad], Err(Error::InvalidArgument(_))), "{:?}", done[&bad].as_ref().err());
    assert_eq!(done[&cancelled].as_ref().unwrap().finish, FinishReason::Cancelled);
    let kept = done[&keep].as_ref().unwrap();
    assert_eq!(kept.tokens, alone(&m.weights, &m.weights, &req(&p[0], 12), Mode::Ar).tokens);

    // Every region is free again; a sequence that reaches the end of its region ends
    // `ContextFull`, as it would alone, and the one beside it is untouched.
    let long: Vec<u32> = p.iter().flatten().copied().cycle().take(CONTEXT - 4).collect();
    let full = batcher.join(req(&long, 20), Mode::Ar, &spec(), Box::new(|_| true)).unwrap();
    let beside = batcher.join(req(&p[3], 8), Mode::Ar, &spec(), Box::new(|_| true)).unwrap();
    let stopped = batcher.join(req(&p[1], 40), Mode::Ar, &spec(), Box::new(|_| true)).unwrap();
    // A client that leaves mid-generation: dropped at once, its region taken by a newcomer.
    block_on(batcher.step());
    block_on(batcher.step());
    batcher.cancel(stopped);
    let newcomer = batcher.join(req(&p[2], 9), Mode::Ar, &spec(), Box::new(|_| true)).unwrap();
    let done: BTreeMap<u64, _> = block_on(batcher.finish()).into_iter().collect();
    assert!(!done.contains_key(&stopped));
    let full_alone = alone(&m.weights, &m.weights, &req(&long, 20), Mode::Ar);
    assert_eq!(full_alone.finish, FinishReason::ContextFull);
    assert_eq!(done[&full].as_ref().unwrap().tokens, full_alone.tokens);
    assert_eq!(done[&full].as_ref().unwrap().finish, FinishReason::ContextFull);
    for (id, r) in [(beside, req(&p[3], 8)), (newcomer, req(&p[2], 9))] {
        assert_eq!(done[&id].as_ref().unwrap().tokens, alone(&m.weights, &m.weights, &r, Mode::Ar).tokens);
    }
}

#[test]
fn a_shared_cache_too_small_for_its_sequences_is_refused() {
    let w = common::tiny_weights(1, 32, 1, 1.0);
    let lm: BoxedLm = Box::new(common::runner(&w, 100));
    assert!(Shared::new(lm, 64, 2).is_err(), "two regions of 64 slots do not fit 100");
    let lm: BoxedLm = Box::new(common::runner(&w, 128));
    let s = Shared::new(lm, 64, 2).unwrap();
    let (a, b) = (s.sequence().unwrap(), s.sequence().unwrap());
    assert!(s.sequence().is_none());
    assert_eq!((a.capacity(), b.capacity()), (64, 64));
    drop(a);
    assert_eq!(s.free(), 1);
}
