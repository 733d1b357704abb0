//! The model families on their small random-weight files (tests/util/families.rs), against
//! llama.cpp's references (tests/golden/families): teacher-forced top-5 logits at every generated
//! position and greedy generation, on the CPU and the GPU (lavapipe in CI); and greedy SD and
//! SSD, their trees attending through Gemma 3's sliding window and Phi-3's partial long RoPE,
//! reproducing AR token for token.

mod util;

use std::sync::Arc;

use futures::executor::block_on;
use saguaro::backend::cpu::CpuBackend;
use saguaro::backend::{Backend, Batch};
use saguaro::decode::{generate_ar, generate_sd, generate_ssd, Backup, DraftWorker, Request, SpecConfig};
use saguaro::model::load::{from_gguf, ModelFile};
use saguaro::model::runner::{Lm, Runner};
use saguaro::model::transformer::Transformer;
use saguaro::sampling::SamplingParams;
use util::families::{family_gguf, FAMILIES};
use util::{check_greedy, check_top5, golden, truncated, Golden};

/// The references compute in f32, as this engine does on F32 weights: they agree to rounding.
const TOP5_TOL: f32 = 1e-3;
/// llama.cpp's CPU GELU reads a table of f16 inputs, 4e-3 from the exact tanh GELU on these
/// logits (measured against a float64 forward, scripts/reference/check-families.py).
const GELU_TABLE_TOL: f32 = 1e-2;

fn family(name: &str) -> ModelFile {
    from_gguf(Arc::new(family_gguf(name))).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn reference(name: &str) -> Golden {
    golden(&format!("families/{name}"))
}

/// What the GPU's default f16 KV cache adds: each cached K and V value rounded by up to 2^-11 of
/// itself (measured on lavapipe: up to 0.0066 with Qwen 3, 0.0032 Llama 3, 0.0041 Phi-3, and Gemma 3
/// at 0.0111 against its own 0.0042 with an f32 cache).
const KV_F16_TOL: f32 = 1e-2;

fn tol(name: &str) -> f32 {
    if name == "gemma3" {
        GELU_TABLE_TOL
    } else {
        TOP5_TOL
    }
}

/// Every case of the family's reference on `backend`, its logits within `tol` beyond the family's
/// own tolerance: the whole sequence's logits in one batch, then greedy generation.
fn check_family<B: Backend>(name: &str, backend: B, tol_beyond: f32) {
    let m = family(name);
    let g = reference(name);
    let capacity = g.cases.iter().map(|c| c.prompt_ids.len() + c.greedy_ids.len() + 1).max().unwrap();
    let mut lm = Runner::new(Transformer::new(backend, &m.weights).unwrap(), capacity).unwrap();
    let vocab = m.weights.config.vocab_size;
    for (i, case) in g.cases.iter().enumerate() {
        let what = format!("{name} case {i} on {}", lm.backend_name());
        let seq: Vec<u32> = case.prompt_ids.iter().chain(&case.greedy_ids).copied().collect();
        let first = case.prompt_ids.len() - 1;
        let rows: Vec<u32> = (first as u32..(first + case.top5.len()) as u32).collect();
        lm.truncate(0);
        let logits = block_on(lm.logits(&Batch::causal(&seq, 0), &rows)).unwrap();
        check_top5(case, &logits, vocab, tol(name) + tol_beyond, &what);
        let req = Request {
            prompt: case.prompt_ids.clone(),
            max_tokens: case.greedy_ids.len(),
            sampling: SamplingParams::default(),
            ..Request::default()
        };
        let gen = block_on(generate_ar(&mut lm, &req, &mut |_| true)).unwrap();
        // The references have no near tie: every position is compared.
        check_greedy(case, &gen.tokens, case.greedy_ids.len(), &what);
    }
}

#[test]
fn families_match_llama_cpp_on_the_cpu() {
    for name in FAMILIES {
        check_family(name, CpuBackend::new(0).unwrap(), 0.0);
    }
}

#[cfg(feature = "gpu")]
#[test]
fn families_match_llama_cpp_on_the_gpu() {
    use saguaro::backend::gpu::GpuOptions;
    use saguaro::backend::KvCache;
    for name in FAMILIES {
        for (kv_cache, beyond) in [(KvCache::F32, 0.0), (KvCache::F16, KV_F16_TOL)] {
            if let Some(gpu) = util::open_gpu(GpuOptions { kv_cache, ..Default::default() }) {
                check_family(name, gpu, beyond);
            }
        }
    }
}

fn cpu_runner(m: &ModelFile, capacity: usize) -> Runner<CpuBackend> {
    Runner::new(Transformer::new(CpuBackend::new(1).unwrap(), &m.weights).unwrap(), capacity).unwrap()
}

/// Greedy SD and SSD with the family's first two layers as the draft give AR's tokens.
#[test]
fn greedy_speculation_is_lossless_on_every_family() {
    for name in FAMILIES {
        let m = family(name);
        let draft = ModelFile { weights: truncated(&m.weights), tokenizer: m.tokenizer.clone(), chat_template: None };
        let mut target = cpu_runner(&m, 256);
        let mut d = cpu_runner(&draft, 256);
        let mut worker = DraftWorker::new(Box::new(cpu_runner(&draft, 256))).unwrap();
        for case in &reference(name).cases {
            let req = Request { prompt: case.prompt_ids.clone(), max_tokens: 40, ..Request::default() };
            let want = block_on(generate_ar(&mut target, &req, &mut |_| true)).unwrap().tokens;
            for k in [2, 4] {
                let spec = SpecConfig::new(k, "uniform:2".parse().unwrap(), 1.0, Backup::Jit);
                let sd = block_on(generate_sd(&mut target, &mut d, &req, &spec, &mut |_| true)).unwrap();
                assert_eq!(sd.tokens, want, "{name}: SD with K={k}");
                let ssd = block_on(generate_ssd(&mut target, &mut worker, &req, &spec, &mut |_| true)).unwrap();
                assert_eq!(ssd.tokens, want, "{name}: SSD with K={k}");
            }
        }
    }
}

/// A tree row whose extra slots reach further back than Gemma 3's 6-position window would be
/// attended wrongly (extras are never cut by the window): it is refused, and a shallower one runs.
#[test]
fn a_tree_deeper_than_the_sliding_window_is_refused() {
    use saguaro::backend::{Mask, NO_SLOT};
    let m = family("gemma3");
    let mut lm = cpu_runner(&m, 64);
    let tree = |depth: u32| Batch {
        tokens: vec![5],
        positions: vec![10 + depth],
        slots: vec![40],
        mask: Mask { prefix: vec![10], extra_stride: 2, extra: vec![30, NO_SLOT], base: vec![] },
        allowed: None,
    };
    block_on(lm.logits(&Batch::causal(&[7; 10], 0), &[9])).unwrap();
    block_on(lm.logits(&Batch::causal(&[8], 30), &[0])).unwrap();
    block_on(lm.logits(&tree(5), &[0])).expect("a tree within the window");
    let err = block_on(lm.logits(&tree(6), &[0])).unwrap_err();
    assert!(err.to_string().contains("reaches past its 6-position sliding window"), "{err}");
}
