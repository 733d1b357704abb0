//! Speculative decoding must not change what the target generates: SD and SSD reproduce
//! autoregressive greedy decoding token for token, and autoregressive sampling in distribution;
//! so does SD drafting through SSD's draft worker (the one copy of the draft in the browser).

mod common;
mod util;

use std::cell::Cell;
use std::collections::VecDeque;
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use futures::executor::block_on;
use futures::future::LocalBoxFuture;

use saguaro::backend::cpu::{CpuBackend, Precision};
use saguaro::backend::Batch;
use saguaro::decode::speculation::{AdaptiveK, Fault, Tree};
use saguaro::decode::ssd::{Job, Reply};
use saguaro::decode::{
    generate_ar, generate_sd, generate_sd_with, generate_ssd, Backup, DraftHost, DraftWorker, Drafter, FinishReason,
    Generation, Mode, NgramConfig, PromptLookup, Request, SpecConfig, WorkerDrafter,
};
use saguaro::engine::{Engine, EngineOptions, GenerateOptions, Prompt};
use saguaro::model::load::ModelFile;
use saguaro::storage::quant::DType;
use saguaro::model::runner::{append, BoxedLm, Hooked, Lm, Runner, Want};
use saguaro::model::slim::{frequent_tokens, Slimming};
use saguaro::model::weights::ModelWeights;
use saguaro::runtime::{Channel, RelSpan};
use saguaro::sampling::{self, Rng, SamplingParams};
use saguaro::engine::{DEFAULT_DRAFT_HEAD, DEFAULT_DRAFT_QUANT};
use saguaro::Error;

use common::distribution::{
    assert_unbiased, chi_square_z, seeded, tiny, top4_sampling, Counts, Exact, K, PROMPT, SAMPLES, SEQ, TINY_CAPACITY,
    VOCAB, Z_BIASED,
};
use common::{runner, tiny_weights};

fn request(prompt: &[u32], max_tokens: usize, sampling: SamplingParams) -> Request {
    Request { prompt: prompt.to_vec(), max_tokens, sampling, ..Request::default() }
}

fn ar(target: &mut dyn Lm, req: &Request) -> Generation {
    block_on(generate_ar(target, req, &mut |_| true)).unwrap()
}

fn sd(target: &mut dyn Lm, draft: &mut dyn Lm, req: &Request, spec: &SpecConfig) -> Generation {
    block_on(generate_sd(target, draft, req, spec, &mut |_| true)).unwrap()
}

fn sd_lookup(target: &mut dyn Lm, req: &Request, spec: &SpecConfig, config: NgramConfig) -> Generation {
    let mut drafter = PromptLookup::new(config, target.config().vocab_size).unwrap();
    block_on(generate_sd_with(target, &mut drafter, req, spec, &mut |_| true)).unwrap()
}

fn ssd(target: &mut dyn Lm, draft: &mut DraftWorker, req: &Request, spec: &SpecConfig) -> Generation {
    block_on(generate_ssd(target, draft, req, spec, &mut |_| true)).unwrap()
}

/// SD drafting through SSD's draft worker.
fn sd_on(target: &mut dyn Lm, worker: &mut DraftWorker, req: &Request, spec: &SpecConfig) -> Generation {
    let mut drafter = WorkerDrafter::new(worker);
    block_on(generate_sd_with(target, &mut drafter, req, spec, &mut |_| true)).unwrap()
}

fn spec(k: usize, fanout: &str, c: f32, backup: Backup) -> SpecConfig {
    SpecConfig::new(k, fanout.parse().unwrap(), c, backup)
}

/// SD whose K is chosen again after every round from the acceptance so far (mode auto's), under
/// round costs of 10 + 3 K ms: K = 1 below a per-token acceptance of about 0.61, longer above.
/// Assumed 0.6 at first, one accepted token moves the second round to K = 2, one rejected
/// keeps it at 1, so K depends on what was drawn.
fn adaptive() -> SpecConfig {
    let round_ms = (1..=7).map(|k| 10.0 + 3.0 * k as f64).collect();
    SpecConfig { adapt: AdaptiveK::new(round_ms, 0.6), ..spec(1, "uniform:1", 1.0, Backup::Jit) }
}

/// Whether a round of `g` drafted more than one token: with `adaptive`'s first K of 1, only a K
/// chosen again does.
fn drafted_further(g: &Generation) -> bool {
    g.stats.timeline.as_ref().unwrap().iter().any(|r| r.proposed > 1)
}

// ---------------------------------------------------------------------------------------------
// Greedy: token-for-token identity with AR on real models.

/// KV slots of the real-model runners: prompt + output + the largest tree scratch used here.
const CAPACITY: usize = 512;
const GREEDY_TOKENS: usize = 32;

fn real(name: &str) -> &'static ModelFile {
    static SMOL: OnceLock<ModelFile> = OnceLock::new();
    static QWEN_TARGET: OnceLock<ModelFile> = OnceLock::new();
    static QWEN_DRAFT: OnceLock<ModelFile> = OnceLock::new();
    let cell = match name {
        util::SMOLLM2 => &SMOL,
        util::QWEN_15B => &QWEN_TARGET,
        util::QWEN_05B => &QWEN_DRAFT,
        _ => unreachable!("unknown model {name}"),
    };
    cell.get_or_init(|| util::model(name))
}

fn cpu_runner(weights: &ModelWeights) -> Runner<CpuBackend> {
    precise_runner(weights, Precision::Exact)
}

fn precise_runner(weights: &ModelWeights, precision: Precision) -> Runner<CpuBackend> {
    let backend = CpuBackend::new(0).unwrap().with_precision(precision);
    Runner::new(saguaro::model::transformer::Transformer::new(backend, weights).unwrap(), CAPACITY).unwrap()
}

fn golden_prompts(model: &ModelFile) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(util::root().join("tests/golden/prompts.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["prompts"].as_array().unwrap().iter().map(|p| model.tokenizer.encode(p.as_str().unwrap()).unwrap()).collect()
}

/// Each golden prompt is generated by AR, then by SD (K = `sd_k`) with the draft computing at
/// `draft_precision`, which must give the AR tokens exactly; `ssd_runs` SSD generations are spread
/// over the prompts and the configurations in turn (run j: prompt j mod #prompts, configuration
/// j mod #configurations), covering each without the full product, and must give them too.
/// Returns the SSD generations.
fn assert_greedy_lossless(
    target: &ModelWeights,
    draft: &ModelWeights,
    draft_precision: Precision,
    prompts: &[Vec<u32>],
    sd_k: usize,
    ssd_specs: &[SpecConfig],
    ssd_runs: usize,
) -> Vec<Generation> {
    let mut t = cpu_runner(target);
    let mut d = precise_runner(draft, draft_precision);
    let mut worker = DraftWorker::new(Box::new(precise_runner(draft, draft_precision))).unwrap();
    let mut generations = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let req = request(prompt, GREEDY_TOKENS, SamplingParams::default());
        let want = ar(&mut t, &req).tokens;
        let got = sd(&mut t, &mut d, &req, &spec(sd_k, "uniform:1", 1.0, Backup::Jit)).tokens;
        assert_eq!(got, want, "prompt {i}: SD with K={sd_k}");
        let unsure = SpecConfig { confidence: 0.6, ..spec(sd_k + 2, "uniform:1", 1.0, Backup::Jit) };
        assert_eq!(sd(&mut t, &mut d, &req, &unsure).tokens, want, "prompt {i}: SD stopping below confidence 0.6");
        let adapted = sd(&mut t, &mut d, &req, &adaptive());
        assert_eq!(adapted.tokens, want, "prompt {i}: SD with K chosen round by round");
        let through = sd_on(&mut t, &mut worker, &req, &spec(sd_k, "uniform:1", 1.0, Backup::Jit)).tokens;
        assert_eq!(through, want, "prompt {i}: SD with K={sd_k} drafting on the SSD draft's worker");
        for s in (i..ssd_runs).step_by(prompts.len()).map(|j| &ssd_specs[j % ssd_specs.len()]) {
            let got = ssd(&mut t, &mut worker, &req, s);
            assert_eq!(got.tokens, want, "prompt {i}: SSD {s:?}");
            generations.push(got);
        }
    }
    generations
}

/// All fan-out strategies, both backups and both Saguaro factors (which greedy decoding must
/// ignore).
fn smol_specs() -> Vec<SpecConfig> {
    vec![
        spec(3, "uniform:2", 1.0, Backup::Jit),
        spec(4, "geometric:6", 0.5, Backup::Fast),
        spec(3, "top-p:0.9", 0.5, Backup::Jit),
        spec(2, "top-p:0.8", 1.0, Backup::Fast),
        spec(4, "geometric", 1.0, Backup::Jit),
    ]
}

#[test]
fn greedy_smollm2_as_its_own_draft_accepts_everything() {
    let m = real(util::SMOLLM2);
    let prompts = golden_prompts(m);
    let runs = assert_greedy_lossless(&m.weights, &m.weights, Precision::Exact, &prompts, 4, &smol_specs(), 8);
    for g in &runs {
        let s = &g.stats;
        assert_eq!(s.acceptance_rate, Some(1.0), "a perfect draft is always accepted: {s:?}");
        assert!(s.cache_hit_rate.unwrap() >= 0.9, "a perfect draft predicts every outcome: {s:?}");
    }
    // Every token accepted: a K chosen round by round grows from its first of 1.
    let mut t = cpu_runner(&m.weights);
    let mut d = cpu_runner(&m.weights);
    let g = sd(&mut t, &mut d, &request(&prompts[0], GREEDY_TOKENS, SamplingParams::default()), &adaptive());
    let ks: Vec<usize> = g.stats.timeline.as_ref().unwrap().iter().map(|r| r.proposed).collect();
    assert!(ks[0] == 1 && ks.iter().max() >= Some(&4), "K drafted round by round: {ks:?}");
}

#[test]
fn greedy_smollm2_with_a_poor_draft() {
    let m = real(util::SMOLLM2);
    let runs = assert_greedy_lossless(&m.weights, &util::truncated(&m.weights), Precision::Exact, &golden_prompts(m), 2, &smol_specs(), 8);
    let rate = runs.iter().map(|g| g.stats.acceptance_rate.unwrap()).sum::<f64>() / runs.len() as f64;
    assert!(rate < 0.5, "a two-layer draft should be wrong often (acceptance {rate}), or this test proves little");
}

#[test]
fn greedy_qwen_pair() {
    let (t, d) = (real(util::QWEN_15B), real(util::QWEN_05B));
    let prompts = golden_prompts(t);
    assert_eq!(prompts, golden_prompts(d), "the pair shares a tokenizer");
    let specs = [spec(3, "geometric:4", 1.0, Backup::Jit), spec(3, "top-p:0.8", 0.5, Backup::Fast)];
    // The draft as the CLI runs it on the CPU: at fast precision, requantized to Q4_K with its rows
    // of 896 values padded to 1,024, its head cut to 65,536 tokens. Its numerics differ, the
    // output must not.
    let vocab = d.weights.config.vocab_size;
    let head = frequent_tokens(&d.tokenizer, DEFAULT_DRAFT_HEAD.unwrap(), vocab);
    let slimming = Slimming { quant: DEFAULT_DRAFT_QUANT, head: Some(head), pad_rows: true };
    let draft = slimming.apply(&d.weights).unwrap();
    let l = &draft.layers[0];
    assert_eq!((l.wq.dtype, l.wq.cols, l.w_up.cols, l.w_down.cols), (DType::Q4K, 1024, 1024, 4864));
    assert_eq!((draft.output.dtype, draft.output.cols), (DType::Q4K, 1024));
    let runs = assert_greedy_lossless(&t.weights, &draft, Precision::Fast, &prompts, 4, &specs, 2);
    let rate = runs.iter().map(|g| g.stats.acceptance_rate.unwrap()).sum::<f64>() / runs.len() as f64;
    eprintln!("Qwen 1.5B with the slimmed 0.5B draft: acceptance {rate:.2}");
    // 0.56 measured on these prompts; a draft whose padded matmuls were wrong would propose noise.
    assert!(rate > 0.3, "the 0.5B draft should often propose what the 1.5B picks (acceptance {rate:.2})");
}

/// A draft made cheaper (matrices requantized from Q4_1 to Q4_0, the output head cut to 8,192 of
/// 49,152 tokens) still gives the target's tokens: greedy SD and SSD equal AR.
#[test]
fn greedy_smollm2_with_a_requantized_pruned_draft() {
    let m = real(util::SMOLLM2);
    let vocab = m.weights.config.vocab_size;
    let head = frequent_tokens(&m.tokenizer, 8192, vocab);
    let draft = Slimming { quant: Some(DType::Q4_0), head: Some(head.clone()), ..Slimming::default() }.apply(&m.weights).unwrap();
    assert_eq!((draft.output.rows, draft.output.dtype), (head.len(), DType::Q4_0));
    assert!(draft.layers.iter().all(|l| l.w_down.dtype == DType::Q4_0 && l.wq.dtype == DType::Q4_0));
    let runs = assert_greedy_lossless(&m.weights, &draft, Precision::Fast, &golden_prompts(m), 4, &smol_specs(), 5);
    let rate = runs.iter().map(|g| g.stats.acceptance_rate.unwrap()).sum::<f64>() / runs.len() as f64;
    eprintln!("requantized, pruned SmolLM2 drafting for itself: acceptance {rate:.2}");
    assert!(rate < 1.0, "the cheaper draft should differ from the target somewhere, or this test proves little");
}

/// An edit: the answer copies the prompt's code with one name changed, so prompt lookup proposes
/// long runs of it.
const EDIT_PROMPT: &str = "def total(items):\n    result = 0\n    for item in items:\n        result += item.price * item.count\n    return result\n\n# The same function with `result` renamed to `acc`:\ndef total(items):\n";

#[test]
fn greedy_prompt_lookup_equals_ar() {
    let m = real(util::SMOLLM2);
    let mut prompts = golden_prompts(m);
    prompts.push(m.tokenizer.encode(EDIT_PROMPT).unwrap());
    let mut t = cpu_runner(&m.weights);
    for (i, prompt) in prompts.iter().enumerate() {
        let req = request(prompt, GREEDY_TOKENS, SamplingParams::default());
        let want = ar(&mut t, &req).tokens;
        for (k, config) in [(1, NgramConfig::default()), (4, NgramConfig { min: 1, max: 2 }), (7, NgramConfig::default())] {
            let g = sd_lookup(&mut t, &req, &spec(k, "uniform:1", 1.0, Backup::Jit), config);
            assert_eq!(g.tokens, want, "prompt {i}: prompt lookup with K={k}, {config:?}");
        }
    }
    // The Qwen target on the edit, where most proposals are accepted.
    let q = real(util::QWEN_15B);
    let req = request(&q.tokenizer.encode(EDIT_PROMPT).unwrap(), GREEDY_TOKENS, SamplingParams::default());
    let mut t = cpu_runner(&q.weights);
    let g = sd_lookup(&mut t, &req, &spec(6, "uniform:1", 1.0, Backup::Jit), NgramConfig::default());
    assert_eq!(g.tokens, ar(&mut t, &req).tokens, "Qwen 1.5B, prompt lookup on the edit");
    let s = &g.stats;
    assert!(s.mean_accepted.unwrap() > 2.0, "the edit copies its input, so lookups should mostly be accepted: {s:?}");
}

// ---------------------------------------------------------------------------------------------
// Sampling: the output distribution is the target's, checked against the exact distribution of
// a tiny model (the machinery is in tests/common/distribution.rs, shared with tests/remote.rs).

fn truncated_sampling() -> SamplingParams {
    SamplingParams { temperature: 0.8, top_k: 3, top_p: 0.9, seed: 0 }
}

/// At least one multi-token cache hit per this many sampled sequences (measured: 1,299 per 20,000
/// sequences with uniform:2 at C = 1, 2,976 with top-p:0.9, 21,139 with geometric at C = 0.5).
const MULTI_TOKEN_HITS_PER: u64 = 20;

/// A nucleus without a top-k, wide at this temperature (over 16 tokens it reaches every token in
/// most rows). The CPU target hands its rows over whole (`Backend::host_memory`); a GPU target's
/// largest logits tell the nucleus where it stops short of the least of them, which
/// tests/gpu_models.rs checks against the same exact distribution.
fn nucleus_sampling() -> SamplingParams {
    SamplingParams { temperature: 2.0, top_k: 0, top_p: 0.99, seed: 0 }
}

/// Neither a top-k nor a nucleus: the target's backend draws each token (`Lm::draw`), and only
/// the token and a probability per row come back.
fn whole_vocabulary_sampling() -> SamplingParams {
    SamplingParams { temperature: 1.0, ..SamplingParams::default() }
}

fn exact(params: SamplingParams) -> &'static Exact {
    static TOP4: OnceLock<Exact> = OnceLock::new();
    static TRUNCATED: OnceLock<Exact> = OnceLock::new();
    static NUCLEUS: OnceLock<Exact> = OnceLock::new();
    static WHOLE: OnceLock<Exact> = OnceLock::new();
    let cell = match params {
        p if p == top4_sampling() => &TOP4,
        p if p == nucleus_sampling() => &NUCLEUS,
        p if p == whole_vocabulary_sampling() => &WHOLE,
        _ => &TRUNCATED,
    };
    cell.get_or_init(|| Exact::of(&tiny().target, &params))
}

fn sd_counts(params: SamplingParams, spec: &SpecConfig, samples: u64) -> Counts {
    sd_counts_with(&tiny().draft, params, spec, samples)
}

fn sd_counts_with(draft: &ModelWeights, params: SamplingParams, spec: &SpecConfig, samples: u64) -> Counts {
    let mut t = runner(&tiny().target, TINY_CAPACITY);
    let mut d = runner(draft, TINY_CAPACITY);
    Counts::of(samples, |seed| sd(&mut t, &mut d, &seeded(params, seed), spec).tokens)
}

/// What SSD's cache did over a batch of generations.
struct CacheUse {
    hit_rate: f64,
    multi_token_hits: usize,
}

fn ssd_counts(params: SamplingParams, spec: &SpecConfig, samples: u64) -> (Counts, CacheUse) {
    ssd_counts_with(&tiny().draft, params, spec, samples)
}

fn ssd_counts_with(draft: &ModelWeights, params: SamplingParams, spec: &SpecConfig, samples: u64) -> (Counts, CacheUse) {
    let mut t = runner(&tiny().target, TINY_CAPACITY);
    let mut w = DraftWorker::new(Box::new(runner(draft, TINY_CAPACITY))).unwrap();
    let (mut hits, mut lookups, mut multi_token_hits) = (0.0, 0.0, 0);
    let counts = Counts::of(samples, |seed| {
        let g = ssd(&mut t, &mut w, &seeded(params, seed), spec);
        if let Some(h) = g.stats.cache_hit_rate {
            hits += h;
            lookups += 1.0;
        }
        multi_token_hits += g.stats.multi_token_hits.unwrap();
        g.tokens
    });
    (counts, CacheUse { hit_rate: hits / lookups, multi_token_hits })
}

/// Multi-token cache hits verify draft tokens against distributions from tree steps past the
/// first; a test that never reaches them cannot notice a wrong q there.
fn assert_multi_token_hits(what: &str, cache: &CacheUse) {
    eprintln!("{what}: hit rate {:.2}, {} multi-token hits", cache.hit_rate, cache.multi_token_hits);
    assert!(
        cache.multi_token_hits as u64 >= SAMPLES / MULTI_TOKEN_HITS_PER,
        "{what}: only {} multi-token cache hits in {SAMPLES} sequences",
        cache.multi_token_hits
    );
}

fn assert_biased(what: &str, counts: &Counts, exact: &Exact) {
    let z = counts.z_scores(exact);
    eprintln!("{what}: z = {z:.2?}");
    assert!(z.iter().any(|&z| z > Z_BIASED), "{what}: a broken verifier went unnoticed, z = {z:.2?}");
}

#[test]
fn a_two_percent_bias_is_detected() {
    let e = exact(top4_sampling());
    let p = &e.marginal[1];
    let by_prob = sampling::top_n(&p.iter().map(|&x| x as f32).collect::<Vec<_>>(), 2, None);
    let mut biased = p.clone();
    biased[by_prob[0] as usize] -= 0.02;
    biased[by_prob[1] as usize] += 0.02;
    let draw = |dist: &[f64], seed: u64| {
        let f: Vec<f32> = dist.iter().map(|&x| x as f32).collect();
        let mut rng = Rng::new(seed);
        let mut counts = vec![0u64; VOCAB];
        for _ in 0..SAMPLES {
            counts[sampling::sample(&f, &mut rng) as usize] += 1;
        }
        chi_square_z(&counts, p, SAMPLES)
    };
    for seed in 0..5 {
        assert!(draw(p, seed) < Z_BIASED, "exact draws pass");
        assert!(draw(&biased, seed) > Z_BIASED, "2% of the mass moved between two tokens is caught");
    }
}

#[test]
fn sampling_ar_matches_the_exact_distribution() {
    let mut t = runner(&tiny().target, TINY_CAPACITY);
    for (what, params) in [
        ("ar", top4_sampling()),
        ("ar top-p", nucleus_sampling()),
        ("ar, drawn on the backend", whole_vocabulary_sampling()),
    ] {
        let counts = Counts::of(SAMPLES, |seed| ar(&mut t, &seeded(params, seed)).tokens);
        assert_unbiased(what, &counts, exact(params));
    }
}

#[test]
fn sampling_sd_is_lossless() {
    assert_unbiased(
        "sd",
        &sd_counts(top4_sampling(), &spec(K, "uniform:1", 1.0, Backup::Jit), SAMPLES),
        exact(top4_sampling()),
    );
    let params = truncated_sampling();
    assert_unbiased(
        "sd top-k/top-p",
        &sd_counts(params, &spec(3, "uniform:1", 1.0, Backup::Jit), SAMPLES),
        exact(params),
    );
    let params = nucleus_sampling();
    assert_unbiased("sd top-p", &sd_counts(params, &spec(K, "uniform:1", 1.0, Backup::Jit), SAMPLES), exact(params));
    let params = whole_vocabulary_sampling();
    assert_unbiased("sd, drawn on the backend", &sd_counts(params, &spec(K, "uniform:1", 1.0, Backup::Jit), SAMPLES), exact(params));
    // Stopping where the draft is unsure (the token drawn there dropped) must not bias either.
    let unsure = SpecConfig { confidence: 0.6, ..spec(K, "uniform:1", 1.0, Backup::Jit) };
    assert_unbiased("sd, confidence stop", &sd_counts(top4_sampling(), &unsure, SAMPLES), exact(top4_sampling()));
}

#[test]
fn sampling_sd_with_k_chosen_round_by_round_is_lossless() {
    // A K that depends on the tokens drawn before must not bias what is drawn after.
    let mut t = runner(&tiny().target, TINY_CAPACITY);
    let mut d = runner(&tiny().draft, TINY_CAPACITY);
    let (mut further, mut runs) = (0, 0);
    let counts = Counts::of(SAMPLES, |seed| {
        let g = sd(&mut t, &mut d, &seeded(top4_sampling(), seed), &adaptive());
        further += drafted_further(&g) as u64;
        runs += 1;
        g.tokens
    });
    eprintln!("{further} of {runs} generations drafted past K = 1");
    assert!(further > runs / 10 && further < runs, "K must follow what was drawn: {further} of {runs} drafted further");
    assert_unbiased("sd, K chosen round by round", &counts, exact(top4_sampling()));
}

#[test]
fn sampling_sd_with_prompt_lookup_is_lossless() {
    // One-token matches, so that the short sequences get proposals often.
    let config = NgramConfig { min: 1, max: 2 };
    let mut t = runner(&tiny().target, TINY_CAPACITY);
    let mut proposed = 0;
    let counts = Counts::of(SAMPLES, |seed| {
        let g = sd_lookup(&mut t, &seeded(top4_sampling(), seed), &spec(K, "uniform:1", 1.0, Backup::Jit), config);
        proposed += g.stats.acceptance_rate.is_some() as u64;
        g.tokens
    });
    assert!(proposed > SAMPLES / 10, "only {proposed} of {SAMPLES} generations had a proposal: the test proves little");
    assert_unbiased("sd prompt lookup", &counts, exact(top4_sampling()));
}

#[test]
fn sampling_ssd_is_lossless_without_saguaro() {
    let (c, cache) = ssd_counts(top4_sampling(), &spec(K, "uniform:2", 1.0, Backup::Jit), SAMPLES);
    let what = "ssd uniform:2 jit C=1";
    assert_multi_token_hits(what, &cache);
    assert_unbiased(what, &c, exact(top4_sampling()));
    let params = whole_vocabulary_sampling();
    let (c, cache) = ssd_counts(params, &spec(K, "uniform:2", 1.0, Backup::Jit), SAMPLES);
    let what = "ssd uniform:2 jit C=1, drawn on the backend";
    assert_multi_token_hits(what, &cache);
    assert_unbiased(what, &c, exact(params));
}

#[test]
fn sampling_ssd_is_lossless_with_saguaro() {
    let e = exact(top4_sampling());
    let (c, cache) = ssd_counts(top4_sampling(), &spec(K, "geometric", 0.5, Backup::Fast), SAMPLES);
    let what = "ssd geometric fast C=0.5";
    assert_multi_token_hits(what, &cache);
    assert_unbiased(what, &c, e);
    let params = truncated_sampling();
    let (c, cache) = ssd_counts(params, &spec(3, "top-p:0.9", 0.5, Backup::Jit), SAMPLES);
    let what = "ssd top-p:0.9 jit C=0.5, top-k/top-p sampling";
    assert_multi_token_hits(what, &cache);
    assert_unbiased(what, &c, exact(params));
}

/// A draft whose pruned head scores 10 of the 16 tokens proposes none of the other 6, which the
/// target's top 4 often hold: the verification must still give the target's distribution.
#[test]
fn sampling_with_a_pruned_draft_head_is_lossless() {
    let kept: Vec<u32> = (0..10).collect();
    let draft = Slimming { head: Some(kept), ..Slimming::default() }.apply(&tiny().draft).unwrap();
    let e = exact(top4_sampling());
    let outside: f64 = e.marginal.iter().map(|p| p[10..].iter().sum::<f64>()).sum::<f64>() / SEQ as f64;
    assert!(outside > 0.1, "the target should often pick a token the draft cannot propose ({outside:.3})");
    let sd = sd_counts_with(&draft, top4_sampling(), &spec(K, "uniform:1", 1.0, Backup::Jit), SAMPLES);
    assert_unbiased("sd, pruned draft head", &sd, e);
    let (ssd, _) = ssd_counts_with(&draft, top4_sampling(), &spec(K, "uniform:2", 0.5, Backup::Jit), SAMPLES);
    assert_unbiased("ssd uniform:2 C=0.5, pruned draft head", &ssd, e);
}

/// A draft that samples among its 2 likeliest tokens, where the target's top-4 sampling keeps 4:
/// its proposals never reach the target's third and fourth tokens, and verification must still
/// give the target's distribution, with the distribution each token was drawn from.
#[test]
fn sampling_with_few_draft_candidates_is_lossless() {
    let e = exact(top4_sampling());
    let few = |fanout: &str, c: f32| SpecConfig { draft_candidates: 2, ..spec(K, fanout, c, Backup::Jit) };
    let sd = sd_counts(top4_sampling(), &few("uniform:1", 1.0), SAMPLES);
    assert_unbiased("sd, 2 draft candidates", &sd, e);
    let (ssd, cache) = ssd_counts(top4_sampling(), &few("uniform:2", 0.5), SAMPLES);
    let what = "ssd uniform:2 C=0.5, 2 draft candidates";
    assert_multi_token_hits(what, &cache);
    assert_unbiased(what, &ssd, e);
}

#[test]
fn a_broken_verifier_is_detected() {
    let e = exact(top4_sampling());
    let broken =
        |fanout: &str, c: f32| SpecConfig { fault: Some(Fault::ResidualIsTarget), ..spec(K, fanout, c, Backup::Jit) };
    // The bias is large; a quarter of the samples shows it.
    let n = SAMPLES / 4;
    assert_biased("sd, bonus from p after a rejection", &sd_counts(top4_sampling(), &broken("uniform:1", 1.0), n), e);
    let (c, _) = ssd_counts(top4_sampling(), &broken("uniform:2", 0.5), n);
    assert_biased("ssd C=0.5, bonus from p after a rejection", &c, e);
    let params = whole_vocabulary_sampling();
    let c = sd_counts(params, &broken("uniform:1", 1.0), n);
    assert_biased("sd drawn on the backend, bonus from p after a rejection", &c, exact(params));
}

// ---------------------------------------------------------------------------------------------
// The tree, the cache and the worker, on the tiny model.

/// A tree step's logits for every branch equal those of decoding that branch on its own.
#[test]
fn tree_attention_equals_sequential_decoding() {
    let w = &tiny().target;
    let mut lm = runner(w, TINY_CAPACITY);
    let prompt = [1u32, 5, 9, 2];
    let glue = [3u32, 7, 11];
    block_on(append(&mut lm, &prompt, Want::LastLogits)).unwrap();
    let base = lm.len();
    let rows: Vec<u32> = (0..glue.len() as u32).collect();
    block_on(lm.logits(&Batch::causal(&glue, base), &rows)).unwrap();
    let branches = vec![(0, 4), (1, 6), (2, 8), (2, 9), (0, 13)];
    let tree = Tree::new(base, glue.len(), branches.clone());
    let all: Vec<u32> = (0..branches.len() as u32).collect();
    let mut inputs: Vec<u32> = branches.iter().map(|b| b.1).collect();
    let mut history: Vec<Vec<u32>> = inputs.iter().map(|&t| vec![t]).collect();
    for step in 0..3 {
        let logits = block_on(lm.logits(&tree.step(step, &inputs), &all)).unwrap();
        for (b, &(k, _)) in branches.iter().enumerate() {
            let mut alone = runner(w, TINY_CAPACITY);
            let seq: Vec<u32> = prompt.iter().chain(&glue[..=k]).chain(&history[b]).copied().collect();
            let want = block_on(append(&mut alone, &seq, Want::LastLogits)).unwrap().logits();
            let got = &logits[b * VOCAB..(b + 1) * VOCAB];
            let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(diff < 1e-5, "step {step} branch {b}: tree and sequential logits differ by {diff}");
            inputs[b] = sampling::argmax(got);
            history[b].push(inputs[b]);
        }
    }
    assert_eq!(lm.len(), base, "the tree never commits");
}

#[test]
fn greedy_tiny_models_match_for_every_configuration() {
    let t_w = &tiny().target;
    let mut t = runner(t_w, TINY_CAPACITY);
    // K = 6 with the widest fan-out needs 6 tree steps of 42 branches of scratch.
    let mut inline = DraftWorker::inline(Box::new(runner(&tiny().draft, 512)));
    let mut threaded = DraftWorker::new(Box::new(runner(&tiny().draft, 512))).unwrap();
    assert!(!inline.is_concurrent());
    for fanout in ["uniform:1", "uniform:3", "geometric", "geometric:2", "top-p:0.5", "top-p:0.95"] {
        for backup in [Backup::Jit, Backup::Fast] {
            for k in [1, 3, 6] {
                for prompt in [&PROMPT[..], &[4, 4, 4, 4, 4][..]] {
                    let req = request(prompt, 20, SamplingParams::default());
                    let want = ar(&mut t, &req).tokens;
                    let s = spec(k, fanout, 1.0, backup);
                    assert_eq!(ssd(&mut t, &mut inline, &req, &s).tokens, want, "inline {s:?}");
                    assert_eq!(ssd(&mut t, &mut threaded, &req, &s).tokens, want, "thread {s:?}");
                }
            }
        }
    }
}

#[test]
fn sampling_is_reproducible_and_worker_placement_does_not_matter() {
    let mut t = runner(&tiny().target, TINY_CAPACITY);
    let mut inline = DraftWorker::inline(Box::new(runner(&tiny().draft, TINY_CAPACITY)));
    let mut threaded = DraftWorker::new(Box::new(runner(&tiny().draft, TINY_CAPACITY))).unwrap();
    let s = spec(3, "top-p:0.9", 0.5, Backup::Jit);
    for seed in 0..20 {
        let req = seeded(top4_sampling(), seed);
        let req = Request { max_tokens: 24, ..req };
        let a = ssd(&mut t, &mut inline, &req, &s).tokens;
        assert_eq!(ssd(&mut t, &mut threaded, &req, &s).tokens, a, "seed {seed}");
        assert_eq!(ssd(&mut t, &mut threaded, &req, &s).tokens, a, "seed {seed}, again");
    }
}

#[test]
fn an_incompatible_draft_is_refused() {
    let mut t = runner(&tiny().target, TINY_CAPACITY);
    let other = tiny_weights(3, VOCAB + 1, 1, 0.6);
    let mut d = runner(&other, TINY_CAPACITY);
    let req = request(&PROMPT, 4, SamplingParams::default());
    let err = block_on(generate_sd(&mut t, &mut d, &req, &SpecConfig::default(), &mut |_| true)).unwrap_err();
    assert!(matches!(err, Error::IncompatibleDraft(_)), "{err}");
    let mut w = DraftWorker::new(Box::new(runner(&other, TINY_CAPACITY))).unwrap();
    let err = block_on(generate_ssd(&mut t, &mut w, &req, &SpecConfig::default(), &mut |_| true)).unwrap_err();
    assert!(matches!(err, Error::IncompatibleDraft(_)), "{err}");
}

#[test]
fn the_draft_worker_survives_errors_panics_and_cancellation() {
    let mut t = runner(&tiny().target, TINY_CAPACITY);
    // A draft that panics on its sixth forward, then behaves.
    let forwards = AtomicUsize::new(0);
    let hook = move |_: &Batch| {
        if forwards.fetch_add(1, Ordering::SeqCst) == 5 {
            panic!("injected draft failure");
        }
        None
    };
    let mut w = DraftWorker::new(Box::new(Hooked::new(runner(&tiny().draft, 40), hook))).unwrap();
    let s = spec(2, "uniform:2", 1.0, Backup::Jit);
    let req = request(&PROMPT, 12, SamplingParams::default());
    let want = ar(&mut t, &req).tokens;

    let err = block_on(generate_ssd(&mut t, &mut w, &req, &s, &mut |_| true)).unwrap_err();
    assert!(matches!(err, Error::Worker(ref m) if m.contains("injected")), "{err}");
    assert_eq!(ssd(&mut t, &mut w, &req, &s).tokens, want, "usable after a draft panic");

    // Prompt + output + tree scratch exceed the draft's 40 slots.
    let long = request(&[3; 30], 8, SamplingParams::default());
    let err = block_on(generate_ssd(&mut t, &mut w, &long, &s, &mut |_| true)).unwrap_err();
    assert!(matches!(err, Error::IncompatibleDraft(ref m) if m.contains("draft's context")), "{err}");
    assert_eq!(ssd(&mut t, &mut w, &req, &s).tokens, want, "usable after an error");

    let mut seen = 0;
    let g = block_on(generate_ssd(&mut t, &mut w, &req, &s, &mut |toks: &[u32]| {
        seen += toks.len();
        seen < 3
    }))
    .unwrap();
    assert_eq!(g.finish, FinishReason::Cancelled);
    assert_eq!(g.tokens[..], want[..g.tokens.len()]);
    assert_eq!(ssd(&mut t, &mut w, &req, &s).tokens, want, "usable after a cancellation");

    // An abandoned generation (its future dropped mid-way) leaves replies behind; the next one
    // must not read them.
    {
        let mut sink = |_: &[u32]| true;
        let mut fut = Box::pin(generate_ssd(&mut t, &mut w, &req, &s, &mut sink));
        let waker = futures::task::noop_waker();
        let _ = fut.as_mut().poll(&mut std::task::Context::from_waker(&waker));
    }
    assert_eq!(ssd(&mut t, &mut w, &req, &s).tokens, want, "usable after an abandoned generation");
}

// ---------------------------------------------------------------------------------------------
// SD through the draft's worker: the worker that serves SSD drafts SD's tokens too, so that the
// browser holds one copy of the draft (in its own Web Worker).

/// The draft in another Web Worker as the browser has it, in process: each job and reply crosses
/// as JSON text (plain data, as over `postMessage`), answered by a [`DraftHost`]. Setting
/// `stopped` makes it a worker that has died: every call fails from then on.
struct Wire {
    host: DraftHost,
    jobs: VecDeque<String>,
    stopped: Rc<Cell<bool>>,
}

impl Channel<Job, Reply<RelSpan>> for Wire {
    fn send(&mut self, job: Job) -> saguaro::Result<()> {
        if self.stopped.get() {
            return Err(Error::Worker("the draft worker stopped".into()));
        }
        self.jobs.push_back(serde_json::to_string(&job).expect("a job encodes"));
        Ok(())
    }

    fn recv(&mut self) -> LocalBoxFuture<'_, saguaro::Result<Reply<RelSpan>>> {
        Box::pin(async move {
            if self.stopped.get() {
                return Err(Error::Worker("the draft worker stopped".into()));
            }
            let job = self.jobs.pop_front().expect("a job in flight");
            let job: Job = serde_json::from_str(&job).expect("a job decodes");
            let reply = self.host.handle(job).await.map_err(|e| e.to_string());
            let text = serde_json::to_string(&reply).expect("a reply encodes");
            let reply: std::result::Result<Reply<RelSpan>, String> = serde_json::from_str(&text).expect("a reply decodes");
            reply.map_err(Error::Worker)
        })
    }

    fn interrupt(&mut self) {
        self.host.abandon_flag().store(true, Ordering::Relaxed);
    }

    fn has_stopped(&self) -> bool {
        self.stopped.get()
    }
}

/// `lm` as a draft behind a [`Wire`], and the switch that stops it.
fn wire(lm: BoxedLm) -> (DraftWorker, Rc<Cell<bool>>) {
    let config = lm.config().clone();
    let stopped = Rc::new(Cell::new(false));
    let channel = Wire { host: DraftHost::new(lm), jobs: VecDeque::new(), stopped: stopped.clone() };
    (DraftWorker::remote(Box::new(channel), config), stopped)
}

#[test]
fn greedy_sd_through_the_draft_worker_equals_ar() {
    let mut t = runner(&tiny().target, TINY_CAPACITY);
    // K = 6 with the widest fan-out here needs 6 tree steps of 12 branches of scratch.
    let draft = || Box::new(runner(&tiny().draft, 512));
    let mut workers = [
        ("inline", DraftWorker::inline(draft())),
        ("thread", DraftWorker::new(draft()).unwrap()),
        ("wire", wire(draft()).0),
    ];
    for (name, w) in &mut workers {
        for k in [1, 3, 6] {
            for confidence in [0.0, 0.6] {
                for prompt in [&PROMPT[..], &[4, 4, 4, 4, 4][..]] {
                    let req = request(prompt, 20, SamplingParams::default());
                    let want = ar(&mut t, &req).tokens;
                    let s = SpecConfig { confidence, ..spec(k, "uniform:2", 1.0, Backup::Jit) };
                    let g = sd_on(&mut t, w, &req, &s);
                    assert_eq!(g.tokens, want, "{name}: SD {s:?}");
                    // The worker's drafting lies within the spans the engine waited for it.
                    let timeline = g.stats.timeline.unwrap();
                    let waited: f64 = timeline.iter().map(|r| r.draft.map_or(0.0, |d| d[1] - d[0])).sum();
                    let busy = g.stats.draft_busy_ms.unwrap();
                    assert!(busy > 0.0 && busy <= waited + 1e-3, "{name}: drafting {busy} ms, waited {waited} ms");
                    // The same worker serves SSD between SD generations, and SD after SSD.
                    assert_eq!(ssd(&mut t, w, &req, &s).tokens, want, "{name}: SSD after SD, {s:?}");
                }
            }
        }
        // The timing the engine's choice of mode takes from the worker.
        let costs = block_on(w.measure(12)).unwrap();
        let tree_timed = costs.tree_step.is_some_and(|(rows, ms)| rows == 12 && ms >= costs.step_ms);
        assert!(costs.step_ms > 0.0 && tree_timed, "{name}: {costs:?}");
        assert_eq!(block_on(w.measure(1)).unwrap().tree_step, None, "{name}: no tree step asked for");
        let req = request(&PROMPT, 12, SamplingParams::default());
        let s = spec(3, "uniform:1", 1.0, Backup::Jit);
        assert_eq!(sd_on(&mut t, w, &req, &s).tokens, ar(&mut t, &req).tokens, "{name}: SD after the timing");
    }
}

/// The worker draws SD's draft tokens with a stream seeded as SD seeds its in-process drafter's,
/// from the same distributions: proposals, their q and so the output are the in-process
/// drafter's, seed for seed (whose output `sampling_sd_is_lossless` checks against the target's
/// exact distribution). Through the wire, each q crosses as text and must arrive unchanged.
#[test]
fn sampled_sd_through_the_draft_worker_equals_the_in_process_drafter_seed_for_seed() {
    let mut t = runner(&tiny().target, TINY_CAPACITY);
    let mut d = runner(&tiny().draft, TINY_CAPACITY);
    let mut thread = DraftWorker::new(Box::new(runner(&tiny().draft, TINY_CAPACITY))).unwrap();
    let (mut wired, _) = wire(Box::new(runner(&tiny().draft, TINY_CAPACITY)));
    let unsure = SpecConfig { confidence: 0.6, ..spec(3, "uniform:1", 1.0, Backup::Jit) };
    let mut accepted = 0.0;
    for (params, s) in [(top4_sampling(), spec(K, "uniform:1", 1.0, Backup::Jit)), (truncated_sampling(), unsure)] {
        for seed in 0..100 {
            let req = Request { max_tokens: 24, ..seeded(params, seed) };
            let want = sd(&mut t, &mut d, &req, &s);
            for (name, w) in [("thread", &mut thread), ("wire", &mut wired)] {
                let got = sd_on(&mut t, w, &req, &s);
                assert_eq!(got.tokens, want.tokens, "{name}, seed {seed}, {params:?}");
                assert_eq!(got.stats.rounds, want.stats.rounds, "{name}, seed {seed}: the same proposals");
            }
            accepted += want.stats.acceptance_rate.unwrap_or(0.0);
        }
    }
    assert!(accepted > 20.0 && accepted < 180.0, "proposals accepted and rejected, or this proves little ({accepted})");
}

#[test]
fn the_draft_worker_refuses_sd_jobs_out_of_step() {
    let (mut w, _) = wire(Box::new(runner(&tiny().draft, TINY_CAPACITY)));
    let req = request(&PROMPT, 8, SamplingParams::default());
    let s = spec(3, "uniform:1", 1.0, Backup::Jit);
    let mut t = runner(&tiny().target, TINY_CAPACITY);
    let want = ar(&mut t, &req).tokens;
    // An SSD round's job where an SD generation runs, and the other way round.
    let mut drafter = WorkerDrafter::new(&mut w);
    block_on(drafter.start(&req, &s)).unwrap();
    let mut rng = Rng::new(0);
    let proposal = block_on(drafter.propose(PROMPT[2], 3, &req.sampling, &mut rng)).unwrap();
    assert_eq!(proposal.tokens.len(), 3);
    drafter.accept(&proposal, 4);
    let err = block_on(drafter.propose(7, 3, &req.sampling, &mut rng)).unwrap_err();
    assert!(matches!(err, Error::Worker(ref m) if m.contains("accepting")), "{err}");
    assert_eq!(sd_on(&mut t, &mut w, &req, &s).tokens, want, "usable after a job out of step");
    assert_eq!(ssd(&mut t, &mut w, &req, &s).tokens, want, "SSD too");
}

/// The browser's engine as it is placed with a draft worker: no draft model of its own, SD and
/// SSD both served by the worker, the modes timed at load through it; a worker that stops fails
/// the generations that need it, AR goes on, and the next worker attached takes over.
#[test]
fn an_engine_without_a_draft_of_its_own_drafts_sd_and_ssd_on_its_worker() {
    let opts = EngineOptions {
        modes: vec![Mode::Ar],
        ssd_thread: false,
        context: 256,
        draft_quant: None,
        draft_head: None,
        ..EngineOptions::default()
    };
    let draft_lm = || {
        let d = util::model(util::SMOLLM2);
        let capacity = Engine::capacity(&d.weights.config, &opts);
        let lm = block_on(opts.draft.runner(&d.weights, capacity)).unwrap();
        (lm, d.tokenizer.vocab_fingerprint())
    };
    let smol = || util::model(util::SMOLLM2);
    let mut engine = block_on(Engine::new(smol(), Some(smol()), &opts)).unwrap();
    assert!(engine.choice().is_none(), "with AR alone there is nothing to choose");
    let (lm, vocab) = draft_lm();
    let (worker, stopped) = wire(lm);
    block_on(engine.attach_draft(worker, &vocab, true, true)).unwrap();
    let choice = engine.choice().expect("SD on the worker: the engine times the modes and chooses").clone();
    assert!(choice.costs.draft_step_ms > 0.0 && choice.costs.decode_ms > 0.0, "{choice:?}");
    assert!(choice.costs.tree_step.is_none(), "target and draft share the CPU: SSD is not a candidate ({choice:?})");

    let prompt = Prompt::Text("The capital of France is".into());
    let run = |engine: &mut Engine, mode: Option<Mode>| {
        let opts = GenerateOptions { mode, max_tokens: 16, ..GenerateOptions::default() };
        block_on(engine.generate(&prompt, &opts, &mut |_, _| true))
    };
    let want = run(&mut engine, Some(Mode::Ar)).unwrap().tokens;
    for mode in [Mode::Sd, Mode::Ssd] {
        let g = run(&mut engine, Some(mode)).unwrap();
        assert_eq!((g.tokens, g.stats.mode), (want.clone(), mode.to_string()), "{mode} on the worker");
    }
    let chosen = run(&mut engine, None).unwrap();
    assert!(chosen.stats.auto.is_some() && chosen.tokens == want, "the measured choice runs ({})", chosen.stats.mode);

    stopped.set(true);
    for mode in [Mode::Sd, Mode::Ssd] {
        let err = run(&mut engine, Some(mode)).unwrap_err();
        assert!(matches!(err, Error::Worker(ref m) if m.contains("stopped")), "{mode} with the worker gone: {err}");
    }
    assert_eq!(engine.default_mode(), Mode::Ar, "the default mode gives way to AR while the worker is gone");
    assert_eq!(run(&mut engine, None).unwrap().tokens, want, "AR goes on");

    let (lm, vocab) = draft_lm();
    block_on(engine.attach_draft(wire(lm).0, &vocab, true, true)).unwrap();
    let again = engine.choice().unwrap().costs.draft_step_ms;
    assert_eq!(again, choice.costs.draft_step_ms, "a replacement is not timed again");
    for mode in [Mode::Sd, Mode::Ssd] {
        assert_eq!(run(&mut engine, Some(mode)).unwrap().tokens, want, "{mode} on the next worker");
    }
}
