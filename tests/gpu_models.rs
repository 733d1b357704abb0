//! Model parity on the GPU backend against the HF transformers fp32 reference (tests/golden):
//! greedy generation under the near-tie rule, and teacher-forced top-5 logits within 0.02; and
//! greedy SD and SSD with the target on the GPU reproducing its AR tokens. Software Vulkan
//! (lavapipe) is slow, so each model runs one short golden case. Skips (and says so) only where
//! no GPU adapter exists at all, or for the f16 tests one without `shader-f16`, and
//! `SAGUARO_REQUIRE_GPU=1` is not set (tests/util/gpu.rs).

mod common;
mod util;

use futures::executor::block_on;
use saguaro::backend::gpu::{GpuBackend, GpuOptions};
use saguaro::backend::Batch;
use saguaro::backend::cpu::CpuBackend;
use saguaro::decode::{generate_ar, generate_sd, generate_ssd, Backup, DraftWorker, Request, SpecConfig};
use saguaro::model::runner::{Lm, Runner};
use saguaro::model::transformer::Transformer;
use saguaro::sampling::SamplingParams;
use common::distribution::{assert_unbiased, seeded, tiny, top4_sampling, Counts, Exact, K, SEQ, TINY_CAPACITY, VOCAB};
use util::*;

/// The GPU computes in f32 throughout (weights decoded exactly, activations never quantized).
const TOP5_TOL: f32 = 0.02;

/// The same with f16 arithmetic in the decode matmul, whose decoded weights, activations and
/// products round to 2^-11 where f32 rounds to 2^-24 (measured: 0.050 for SmolLM2 and 0.024 for
/// the Qwen 0.5B, where f32 gives 0.010 for each; most of it from decoding `d q + m` in f16).
const TOP5_TOL_F16: f32 = 0.1;

/// Greedy tokens generated step by step (the decode path: M = 1 and a growing KV cache); the
/// rest of each reference continuation is checked from the teacher-forced logits.
const DECODED: usize = 4;

/// Positions of a whole continuation that must be compared: the cases run here have at least 25
/// before a near tie of the reference's, where either token may continue it.
const GREEDY_COMPARED: usize = 16;

fn gpu() -> GpuBackend {
    block_on(GpuBackend::new(GpuOptions::default())).expect("opening the GPU")
}

fn check_model(name: &str, case_ids: &[usize]) {
    if !gpu_available() {
        return;
    }
    check_against(name, name, case_ids, gpu(), TOP5_TOL);
}

/// `name`'s cases `case_ids` of the golden file `file` on `gpu`, top-5 logits within `tol`.
fn check_against(name: &str, file: &str, case_ids: &[usize], gpu: GpuBackend, tol: f32) {
    let m = model(name);
    let g = golden(file);
    let cases: Vec<&Case> = case_ids.iter().map(|&i| &g.cases[i]).collect();
    let capacity = cases.iter().map(|c| c.prompt_ids.len() + c.greedy_ids.len() + 1).max().unwrap();
    let mut lm = Runner::new(Transformer::new(gpu, &m.weights).unwrap(), capacity).unwrap();
    let vocab = m.weights.config.vocab_size;
    for (&i, case) in case_ids.iter().zip(cases) {
        let what = format!("{name} case {i} on {}", lm.backend_name());
        let req = Request {
            prompt: case.prompt_ids.clone(),
            max_tokens: DECODED,
            sampling: SamplingParams::default(),
            stop: m.tokenizer.eos_ids().to_vec(),
            ..Request::default()
        };
        let gen = block_on(generate_ar(&mut lm, &req, &mut |_| true)).unwrap();
        let head = Case {
            prompt: case.prompt.clone(),
            prompt_ids: case.prompt_ids.clone(),
            greedy_ids: case.greedy_ids[..DECODED].to_vec(),
            top5: case.top5[..DECODED].to_vec(),
        };
        check_greedy(&head, &gen.tokens, DECODED, &what);

        // Teacher forcing: row p of the full sequence predicts token p + 1. Its argmax is the
        // greedy choice after the reference prefix, so the whole continuation is checked too.
        let seq: Vec<u32> = case.prompt_ids.iter().chain(&case.greedy_ids).copied().collect();
        let first = case.prompt_ids.len() as u32 - 1;
        let rows: Vec<u32> = (first..first + case.top5.len() as u32).collect();
        lm.truncate(0);
        let logits = block_on(lm.logits(&Batch::causal(&seq, 0), &rows)).unwrap();
        check_top5(case, &logits, vocab, tol, &what);
        let argmax: Vec<u32> = logits.chunks_exact(vocab).map(saguaro::sampling::argmax).collect();
        check_greedy(case, &argmax, GREEDY_COMPARED, &format!("{what}, teacher-forced"));
    }
}

// Each model's shortest golden case: lavapipe runs a forward of these models in seconds.
#[test]
fn smollm2_matches_reference_on_gpu() {
    check_model(SMOLLM2, &[1]);
}

#[test]
fn qwen_05b_matches_reference_on_gpu() {
    check_model(QWEN_05B, &[1]);
}

/// Against the float64 reference: its 262,144-token head makes this the slowest on lavapipe.
#[test]
fn gemma3_270m_matches_reference_on_gpu() {
    if gpu_available() {
        check_against(GEMMA3, &format!("f64-{GEMMA3}"), &[1], gpu(), TOP5_TOL);
    }
}

/// f16 arithmetic in the decode matmul (`GpuOptions::shader_f16`), where the adapter offers it:
/// the golden greedy tokens, and top-5 logits within [`TOP5_TOL_F16`].
#[test]
fn f16_arithmetic_matches_reference_on_gpu() {
    for name in [SMOLLM2, QWEN_05B] {
        let Some(gpu) = open_gpu_f16() else { return };
        check_against(name, name, &[1], gpu, TOP5_TOL_F16);
    }
}

/// SmolLM2 on the GPU as the target, drafted on CPU threads by its own first two layers (often
/// wrong, so rollback of the GPU KV cache is exercised): SD and SSD give the AR tokens exactly.
/// The target's attention walks are split every 64 slots (a GPU splits every 128, lavapipe not
/// at all) and the prompt is longer than that, so verifications and tree steps merge parts
/// that their rows' decodes also merge.
const SPLIT_PROMPT: &str = "import math\n\n\
def mean(xs):\n    return sum(xs) / len(xs)\n\n\
def variance(xs):\n    m = mean(xs)\n    return sum((x - m) ** 2 for x in xs) / len(xs)\n\n\
def stdev(xs):\n    return math.sqrt(variance(xs))\n\n\
def fibonacci(n):";

#[test]
fn greedy_sd_and_ssd_with_the_target_on_gpu_match_ar() {
    if gpu_available() {
        greedy_sd_and_ssd_match_ar(block_on(GpuBackend::new(GpuOptions { attention_split: Some(64), ..Default::default() })).unwrap());
    }
}

/// The same with f16 arithmetic in the target's decode matmul, where the adapter offers it: a
/// verification's rows round as its decodes do, so speculation still gives AR's tokens exactly.
#[test]
fn greedy_sd_and_ssd_with_f16_arithmetic_match_ar() {
    if let Some(gpu) = open_gpu_f16() {
        greedy_sd_and_ssd_match_ar(gpu);
    }
}

fn greedy_sd_and_ssd_match_ar(gpu: GpuBackend) {
    let m = model(SMOLLM2);
    let draft_weights = truncated(&m.weights);
    let cpu = || CpuBackend::new(0).unwrap();
    const CAPACITY: usize = 128;
    let mut target = Runner::new(Transformer::new(gpu, &m.weights).unwrap(), CAPACITY).unwrap();
    let mut draft = Runner::new(Transformer::new(cpu(), &draft_weights).unwrap(), CAPACITY).unwrap();
    let worker_lm = Runner::new(Transformer::new(cpu(), &draft_weights).unwrap(), CAPACITY).unwrap();
    let mut worker = DraftWorker::new(Box::new(worker_lm)).unwrap();
    let req = Request {
        prompt: m.tokenizer.encode(SPLIT_PROMPT).unwrap(),
        max_tokens: 12,
        sampling: SamplingParams::default(),
        stop: vec![],
        ..Request::default()
    };
    assert!((64..CAPACITY - 20).contains(&req.prompt.len()), "the prompt takes {} tokens", req.prompt.len());
    let want = block_on(generate_ar(&mut target, &req, &mut |_| true)).unwrap().tokens;
    let spec = SpecConfig::new(3, "uniform:2".parse().unwrap(), 1.0, Backup::Jit);
    let sd = block_on(generate_sd(&mut target, &mut draft, &req, &spec, &mut |_| true)).unwrap();
    assert_eq!(sd.tokens, want, "SD with the target on {}", target.backend_name());
    let ssd = block_on(generate_ssd(&mut target, &mut worker, &req, &spec, &mut |_| true)).unwrap();
    assert_eq!(ssd.tokens, want, "SSD with the target on {}", target.backend_name());
    assert!(sd.stats.acceptance_rate.unwrap() < 1.0, "the two-layer draft should be rejected sometimes: {:?}", sd.stats);
}

/// Both models on the GPU: the draft's glue pass finds its fan-out candidates there
/// (`Backend::top_k`, with the log-sum-exp that `top-p` weighs them by), and greedy SSD gives
/// AR's tokens under either kind of fan-out.
#[test]
fn ssd_with_the_draft_on_gpu_matches_ar() {
    if !gpu_available() {
        return;
    }
    let m = model(SMOLLM2);
    let draft_weights = truncated(&m.weights);
    const CAPACITY: usize = 128;
    let mut target = Runner::new(Transformer::new(gpu(), &m.weights).unwrap(), CAPACITY).unwrap();
    let worker_lm = Runner::new(Transformer::new(gpu(), &draft_weights).unwrap(), CAPACITY).unwrap();
    let mut worker = DraftWorker::new(Box::new(worker_lm)).unwrap();
    let req = Request { prompt: m.tokenizer.encode("def fibonacci(n):").unwrap(), max_tokens: 10, ..Request::default() };
    let want = block_on(generate_ar(&mut target, &req, &mut |_| true)).unwrap().tokens;
    for fanout in ["geometric", "top-p:0.8"] {
        let spec = SpecConfig::new(3, fanout.parse().unwrap(), 1.0, Backup::Jit);
        let ssd = block_on(generate_ssd(&mut target, &mut worker, &req, &spec, &mut |_| true)).unwrap();
        assert_eq!(ssd.tokens, want, "greedy SSD, {fanout}, with both models on {}", target.backend_name());
    }
}

/// Sampling over the whole vocabulary with the target on the GPU: every token is drawn there
/// (`Backend::draw`), so AR, SD and SSD read back a token and a probability per row where a row
/// of 49,152 logits came back before. A nucleus reads each row's 512 largest logits, from which
/// it is found on the host, and rows whole only where a flat row's nucleus reaches past them.
/// Prints the bytes read back per round.
#[test]
fn sampled_rounds_read_back_no_rows_from_the_gpu() {
    if !gpu_available() {
        return;
    }
    let m = model(SMOLLM2);
    let draft_weights = truncated(&m.weights);
    const CAPACITY: usize = 96;
    let row = (4 * m.weights.config.vocab_size) as f64;
    let mut target = Runner::new(Transformer::new(gpu(), &m.weights).unwrap(), CAPACITY).unwrap();
    let mut draft = Runner::new(Transformer::new(CpuBackend::new(0).unwrap(), &draft_weights).unwrap(), CAPACITY).unwrap();
    let worker_lm = Runner::new(Transformer::new(CpuBackend::new(0).unwrap(), &draft_weights).unwrap(), CAPACITY).unwrap();
    let mut worker = DraftWorker::new(Box::new(worker_lm)).unwrap();
    let spec = SpecConfig::new(3, "uniform:2".parse().unwrap(), 1.0, Backup::Jit);
    let whole = SamplingParams { temperature: 0.8, seed: 3, ..SamplingParams::default() };
    let nucleus = SamplingParams { top_p: 0.95, ..whole };
    let flat = SamplingParams { temperature: 20.0, ..nucleus };
    let cases = [(SamplingParams::default(), "greedy"), (whole, "sampled"), (nucleus, "sampled top-p"), (flat, "flat top-p")];
    for (sampling, what) in cases {
        let req = Request { prompt: m.tokenizer.encode("def fibonacci(n):").unwrap(), max_tokens: 10, sampling, ..Request::default() };
        for mode in ["ar", "sd", "ssd"] {
            let before = target.backend().bytes_read_back();
            let g = match mode {
                "ar" => block_on(generate_ar(&mut target, &req, &mut |_| true)),
                "sd" => block_on(generate_sd(&mut target, &mut draft, &req, &spec, &mut |_| true)),
                _ => block_on(generate_ssd(&mut target, &mut worker, &req, &spec, &mut |_| true)),
            }
            .unwrap();
            assert_eq!(g.tokens.len(), 10, "{what} {mode}");
            // The prefill's read-back counts as one more round.
            let per_round = (target.backend().bytes_read_back() - before) as f64 / (g.stats.rounds + 1) as f64;
            eprintln!("{what} {mode}: {per_round:.0} bytes read back per round ({} rounds)", g.stats.rounds);
            match what {
                "flat top-p" => assert!(per_round >= row, "{what} {mode}: {per_round} bytes a round, under one row"),
                "sampled top-p" => assert!(per_round < row / 8.0, "{what} {mode}: {per_round} bytes a round"),
                _ => assert!(per_round < 256.0, "{what} {mode}: {per_round} bytes a round"),
            }
        }
    }
}

/// Sampling that reads each row's top-k from the target on the GPU (`Backend::top_k`: the
/// largest logits and the log-sum-exp) has the target's exact distribution
/// (tests/common/distribution.rs), where a CPU target hands its rows over whole:
/// - a nucleus without a top-k, AR and SD. At this temperature the tiny model's nucleus reaches
///   its least likely token in most rows, so those rows come whole and the rest are told from the
///   top-k; the test requires both;
/// - a top-k of 4, SD.
///
/// Half the samples of the CPU tests (lavapipe runs a tiny forward far slower than the CPU): a
/// bias of 3% of the mass stands out.
#[test]
fn sampling_from_the_gpus_top_k_has_the_targets_distribution() {
    if !gpu_available() {
        return;
    }
    let params = SamplingParams { temperature: 2.0, top_k: 0, top_p: 0.99, seed: 0 };
    let exact = Exact::of(&tiny().target, &params);
    let mut target = Runner::new(Transformer::new(gpu(), &tiny().target).unwrap(), TINY_CAPACITY).unwrap();
    let mut draft = Runner::new(Transformer::new(CpuBackend::new(1).unwrap(), &tiny().draft).unwrap(), TINY_CAPACITY).unwrap();
    let row = 4 * VOCAB as u64;
    let mut reads = Vec::new();
    const SAMPLES: u64 = common::distribution::SAMPLES / 2;
    let counts = Counts::of(SAMPLES, |seed| {
        let before = target.backend().bytes_read_back();
        let g = block_on(generate_ar(&mut target, &seeded(params, seed), &mut |_| true)).unwrap();
        reads.push(target.backend().bytes_read_back() - before);
        g.tokens
    });
    assert_unbiased("gpu ar top-p", &counts, &exact);
    // Every token's row sends its top-k (the 16 tokens, 8 bytes each, and 8 more), and its
    // logits after it where they do not tell the nucleus.
    let top_k = (SEQ * (8 * VOCAB + 8)) as u64;
    let whole: u64 = reads.iter().map(|&b| (b - top_k) / row).sum();
    let rows = SEQ as u64 * SAMPLES;
    eprintln!("{whole} of {rows} rows read whole");
    assert!(whole > 0 && whole < rows, "both paths ran: {whole} of {rows} rows read whole");
    let spec = SpecConfig::new(K, "uniform:1".parse().unwrap(), 1.0, Backup::Jit);
    let counts = Counts::of(SAMPLES, |seed| {
        block_on(generate_sd(&mut target, &mut draft, &seeded(params, seed), &spec, &mut |_| true)).unwrap().tokens
    });
    assert_unbiased("gpu sd top-p", &counts, &exact);
    let params = top4_sampling();
    let counts = Counts::of(SAMPLES, |seed| {
        block_on(generate_sd(&mut target, &mut draft, &seeded(params, seed), &spec, &mut |_| true)).unwrap().tokens
    });
    assert_unbiased("gpu sd top-4", &counts, &Exact::of(&tiny().target, &params));
}

/// A grammar's masks applied on the GPU (`Backend::mask` before argmax and draws): greedy AR, SD
/// and SSD with the target there give the same schema-valid object, and sampled AR and SD, drawn
/// on the device, stay inside the schema.
#[test]
fn output_under_a_schema_on_the_gpu_is_valid_and_the_same_in_every_mode() {
    if !gpu_available() {
        return;
    }
    use saguaro::grammar::{GrammarSpec, Vocabulary};
    let m = model(SMOLLM2);
    let draft_weights = truncated(&m.weights);
    const CAPACITY: usize = 160;
    let mut target = Runner::new(Transformer::new(gpu(), &m.weights).unwrap(), CAPACITY).unwrap();
    let mut draft = Runner::new(Transformer::new(CpuBackend::new(0).unwrap(), &draft_weights).unwrap(), CAPACITY).unwrap();
    let worker_lm = Runner::new(Transformer::new(CpuBackend::new(0).unwrap(), &draft_weights).unwrap(), CAPACITY).unwrap();
    let mut worker = DraftWorker::new(Box::new(worker_lm)).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": { "name": { "type": "string", "maxLength": 10 }, "legs": { "type": "integer", "minimum": 0, "maximum": 8 } },
        "required": ["name", "legs"],
        "additionalProperties": false
    });
    let grammar = Vocabulary::new(&m.tokenizer, m.weights.config.vocab_size).unwrap().compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let req = Request {
        prompt: m.tokenizer.encode("An animal as JSON: ").unwrap(),
        max_tokens: 40,
        stop: m.tokenizer.eos_ids().to_vec(),
        grammar: Some(std::sync::Arc::new(grammar)),
        ..Request::default()
    };
    let valid = |tokens: &[u32], what: &str| {
        let text = m.tokenizer.decode(tokens).unwrap();
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{what}: {e}: {text:?}"));
        assert!(v["name"].is_string() && v["legs"].as_u64().is_some_and(|l| l <= 8), "{what}: {v}");
    };
    let ar = block_on(generate_ar(&mut target, &req, &mut |_| true)).unwrap();
    valid(&ar.tokens, "greedy AR");
    let spec = SpecConfig::new(3, "uniform:2".parse().unwrap(), 1.0, Backup::Jit);
    let sd = block_on(generate_sd(&mut target, &mut draft, &req, &spec, &mut |_| true)).unwrap();
    assert_eq!(sd.tokens, ar.tokens, "greedy SD under the schema with the target on the GPU");
    let ssd = block_on(generate_ssd(&mut target, &mut worker, &req, &spec, &mut |_| true)).unwrap();
    assert_eq!(ssd.tokens, ar.tokens, "greedy SSD under the schema with the target on the GPU");
    for seed in 0..2 {
        let sampled = Request { sampling: SamplingParams { temperature: 1.0, seed, ..SamplingParams::default() }, ..req.clone() };
        valid(&block_on(generate_ar(&mut target, &sampled, &mut |_| true)).unwrap().tokens, "sampled AR");
        valid(&block_on(generate_sd(&mut target, &mut draft, &sampled, &spec, &mut |_| true)).unwrap().tokens, "sampled SD");
    }
}

/// Several sequences in one forward with the target on the GPU (`model::shared`): each
/// sequence's greedy tokens (AR, SD with the draft on the CPU, a prompt prefilled in chunks beside
/// the others) and tokens drawn on the device equal its tokens alone on the same GPU.
#[test]
fn sequences_batched_on_the_gpu_equal_their_output_alone() {
    use saguaro::decode::{Batcher, Mode};
    use saguaro::model::runner::BoxedLm;
    use saguaro::model::shared::{Shared, PREFILL_CHUNK};
    if !gpu_available() {
        return;
    }
    let m = model(SMOLLM2);
    let draft_weights = truncated(&m.weights);
    // Regions far apart, so that a block of queries from two sequences spans a long stretch
    // of the cache that neither attends.
    const CONTEXT: usize = 2048;
    // Attention split into parts of 64 slots, as on a GPU that is not the CPU: a decode's walk
    // is split alone and beside the others alike.
    let split = || block_on(GpuBackend::new(GpuOptions { attention_split: Some(64), ..Default::default() })).unwrap();
    let gpu_runner = |slots| Runner::with_slots(Transformer::new(split(), &m.weights).unwrap(), CONTEXT, slots).unwrap();
    let cpu_runner = |slots| Runner::with_slots(Transformer::new(CpuBackend::new(0).unwrap(), &draft_weights).unwrap(), CONTEXT, slots).unwrap();
    let long: Vec<u32> = m.tokenizer.encode(SPLIT_PROMPT).unwrap().into_iter().take(PREFILL_CHUNK + 9).collect();
    let sampled = SamplingParams { temperature: 0.8, top_k: 0, top_p: 1.0, seed: 5 };
    let jobs = [
        (m.tokenizer.encode("def fibonacci(n):").unwrap(), Mode::Ar, SamplingParams::default()),
        (m.tokenizer.encode("The capital of France is").unwrap(), Mode::Sd, SamplingParams::default()),
        (long, Mode::Ar, SamplingParams::default()),
        (m.tokenizer.encode("Once upon a time,").unwrap(), Mode::Ar, sampled),
    ];
    let spec = SpecConfig::new(3, "uniform:2".parse().unwrap(), 1.0, Backup::Jit);
    let slots = Shared::region(CONTEXT) * jobs.len();
    let target: BoxedLm = Box::new(gpu_runner(slots));
    let draft: BoxedLm = Box::new(cpu_runner(slots));
    let mut batcher = Batcher::new(Shared::new(target, CONTEXT, jobs.len()).unwrap(), Some(Shared::new(draft, CONTEXT, jobs.len()).unwrap()));
    let requests: Vec<Request> = jobs.iter().map(|(p, _, s)| Request { prompt: p.clone(), max_tokens: 8, sampling: *s, ..Request::default() }).collect();
    let ids: Vec<u64> = jobs.iter().zip(&requests).map(|((_, mode, _), req)| batcher.join(req.clone(), *mode, &spec, Box::new(|_| true)).unwrap()).collect();
    let done: std::collections::HashMap<u64, _> = block_on(batcher.finish()).into_iter().collect();
    let mut alone_target = gpu_runner(CONTEXT);
    let mut alone_draft = cpu_runner(CONTEXT);
    for ((id, req), (_, mode, _)) in ids.iter().zip(&requests).zip(&jobs) {
        alone_target.truncate(0);
        alone_draft.truncate(0);
        let want = match mode {
            Mode::Ar => block_on(generate_ar(&mut alone_target, req, &mut |_| true)).unwrap(),
            _ => block_on(generate_sd(&mut alone_target, &mut alone_draft, req, &spec, &mut |_| true)).unwrap(),
        };
        assert_eq!(done[id].as_ref().unwrap().tokens, want.tokens, "{mode:?} with {:?} on {}", req.sampling, alone_target.backend_name());
    }
}
