//! A GGUF file streamed onto a backend tensor by tensor (`model::stream`, how the browser loads a
//! GPU target) gives the very model that loading the whole file gives: the same logits to the
//! bit, for every family (interleaved Q/K, tied and untied heads, fused matrices, RoPE factors
//! stored as tensors) and for pieces of any size; a short, long or corrupt stream is an error.

mod util;

use futures::executor::block_on;
use saguaro::backend::cpu::CpuBackend;
use saguaro::backend::gpu::{GpuBackend, GpuOptions};
use saguaro::backend::{Backend, Batch};
use saguaro::model::load::from_gguf;
use saguaro::model::runner::{Lm, Runner};
use saguaro::model::stream::GgufStream;
use saguaro::model::synth::{shape, Quant, Synth};
use saguaro::storage::quant::DType;
use saguaro::model::transformer::Transformer;
use std::sync::Arc;
use util::families::{family_gguf, FAMILIES};
use saguaro::sampling::Rng;
use util::*;

/// The file pushed in pieces of random sizes up to `max_piece`.
fn stream<B: Backend>(backend: B, bytes: &[u8], max_piece: u32, rng: &mut Rng) -> saguaro::model::stream::StreamedModel<B> {
    let mut s = GgufStream::new(backend, Some(bytes.len() as u64));
    let mut at = 0;
    while at < bytes.len() {
        let n = (1 + (rng.uniform() * max_piece as f32) as usize).min(bytes.len() - at);
        s.push(&bytes[at..at + n]).unwrap();
        at += n;
    }
    assert_eq!(s.received(), bytes.len() as u64);
    s.finish().unwrap()
}

fn logits<B: Backend + 'static>(model: Transformer<B>, tokens: &[u32]) -> Vec<f32> {
    let mut lm = Runner::new(model, tokens.len()).unwrap();
    let rows: Vec<u32> = (0..tokens.len() as u32).collect();
    block_on(lm.logits(&Batch::causal(tokens, 0), &rows)).unwrap()
}

fn same_model<B: Backend + 'static>(name: &str, bytes: Vec<u8>, backend: impl Fn() -> B, max_piece: u32) {
    let mut rng = Rng::new(7);
    let streamed = stream(backend(), &bytes, max_piece, &mut rng);
    let whole = from_gguf(Arc::new(bytes)).unwrap();
    let tokens = whole.tokenizer.encode("The cat sat on").unwrap();
    assert_eq!(streamed.tokenizer.encode("The cat sat on").unwrap(), tokens, "{name}: tokenizer");
    assert_eq!(streamed.chat_template, whole.chat_template, "{name}: chat template");
    assert_eq!(streamed.model.config, whole.weights.config, "{name}: config");
    let want = logits(Transformer::new(backend(), &whole.weights).unwrap(), &tokens);
    let got = logits(streamed.model, &tokens);
    assert!(got == want, "{name}: the streamed model's logits differ from the whole file's");
}

fn cpu() -> CpuBackend {
    CpuBackend::new(1).unwrap()
}

#[test]
fn every_family_streams_to_the_same_model_on_the_cpu() {
    for name in FAMILIES {
        same_model(name, family_gguf(name), cpu, 40_000);
    }
}

#[test]
fn real_files_stream_to_the_same_model_in_any_pieces() {
    // SmolLM2: llama's interleaved Q/K and a tied head; the Qwen 0.5B: biases, a 151k vocabulary
    // in the header, pieces as small as a network's.
    let read = |name: &str| std::fs::read(root().join("models").join(format!("{name}.gguf"))).unwrap();
    same_model("smollm2", read("smollm2-135m-instruct-q4_1"), cpu, 1 << 20);
    same_model("qwen 0.5b", read("qwen2.5-coder-0.5b-instruct"), cpu, 65_536);
}

#[test]
fn a_model_streams_onto_the_gpu() {
    if !gpu_available() {
        return;
    }
    let gpu = || block_on(GpuBackend::new(GpuOptions::default())).unwrap();
    same_model("llama3 on the gpu", family_gguf("llama3"), gpu, 10_000);
}

#[test]
fn short_long_and_corrupt_streams_are_errors() {
    let bytes = family_gguf("qwen3");
    let n = bytes.len();
    let finish = |upto: usize, announced: u64| {
        let mut s = GgufStream::new(cpu(), Some(announced));
        s.push(&bytes[..upto]).and_then(|()| s.finish().map(drop)).unwrap_err().to_string()
    };
    let e = finish(n - 100, n as u64);
    assert!(e.contains("truncated") && e.contains("before tensor"), "{e}");
    let e = finish(100, n as u64);
    assert!(e.contains("truncated") && e.contains("header"), "{e}");
    let e = finish(n, n as u64 - 1);
    assert!(e.contains("longer than its announced"), "{e}");
    let e = finish(n, 2 * n as u64);
    assert!(e.contains("truncated") && e.contains("after its last tensor"), "{e}");
    // Without an announced length the end is what arrived: a whole file smaller than the first
    // try of its header loads, a short one is refused.
    let mut s = GgufStream::new(cpu(), None);
    s.push(&bytes[..n - 1]).unwrap();
    assert!(s.finish().is_err());
    let tiny = Synth { shape: shape("tiny").unwrap(), quant: Quant::All(DType::Q4_0), layers: Some(1), seed: 1 };
    let small = tiny.model().unwrap().build();
    assert!(small.len() < 1 << 20, "{} bytes", small.len());
    let mut s = GgufStream::new(cpu(), None);
    s.push(&small).unwrap();
    s.finish().unwrap();

    let mut bad = bytes.clone();
    bad[0] = b'X';
    let e = finish_with(&bad);
    assert!(e.contains("bad magic"), "{e}");
    let mut huge_count = bytes.clone();
    huge_count[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = finish_with(&huge_count);
    assert!(e.contains("tensor_count"), "{e}");
}

fn finish_with(bytes: &[u8]) -> String {
    let mut s = GgufStream::new(cpu(), Some(bytes.len() as u64));
    s.push(bytes).and_then(|()| s.finish().map(drop)).unwrap_err().to_string()
}

#[test]
fn an_engine_on_a_streamed_target_speculates_as_one_on_the_file() {
    use saguaro::decode::Mode;
    use saguaro::engine::{Engine, EngineOptions, GenerateOptions, PlacedTarget, Prompt, Target};
    let path = root().join("models/smollm2-135m-instruct-q4_1.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let opts = EngineOptions { context: 256, auto: false, ..EngineOptions::default() };
    let streamed = stream(cpu(), &bytes, 1 << 20, &mut Rng::new(3));
    let placed = PlacedTarget::new(streamed, &opts, |r| Box::new(r)).unwrap();
    let prompt = Prompt::Text("The capital of France is".into());
    let run = |engine: &mut Engine, mode: Mode| {
        let g = GenerateOptions { mode: Some(mode), max_tokens: 12, ..GenerateOptions::default() };
        block_on(engine.generate(&prompt, &g, &mut |_, _| true)).unwrap().tokens
    };
    let mut on_file = block_on(Engine::new(model(SMOLLM2), None, &opts)).unwrap();
    let want = run(&mut on_file, Mode::Ar);
    let draft = Some(model(SMOLLM2));
    let mut engine = block_on(Engine::with_target_wrapper(Target::Placed(placed), draft, &opts, |lm| lm)).unwrap();
    for mode in [Mode::Ar, Mode::Sd, Mode::Ssd] {
        assert_eq!(run(&mut engine, mode), want, "{mode} with the streamed target");
    }

    // Without a draft model a placed target has nothing to speculate with: AR only, said clearly.
    let streamed = stream(cpu(), &bytes, 1 << 20, &mut Rng::new(4));
    let placed = PlacedTarget::new(streamed, &opts, |r| Box::new(r)).unwrap();
    let mut alone = block_on(Engine::with_target_wrapper(Target::Placed(placed), None, &opts, |lm| lm)).unwrap();
    assert_eq!(run(&mut alone, Mode::Ar), want);
    let g = GenerateOptions { mode: Some(Mode::Sd), max_tokens: 4, ..GenerateOptions::default() };
    let e = block_on(alone.generate(&prompt, &g, &mut |_, _| true)).unwrap_err().to_string();
    assert!(e.contains("without a draft"), "{e}");
}
