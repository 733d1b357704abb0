//! `saguaro synth`: models of real shapes with random weights load and generate (on the CPU) in
//! every type it writes, a file of fewer layers is the full one's first layers, and bad arguments
//! are clear errors that leave no file behind. Timing the target's forwards on such a model (what
//! `bench --llama-bench` sets beside llama.cpp) leaves its engine generating what it did before.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use futures::executor::block_on;

use saguaro::model::load::{from_gguf, open};
use saguaro::model::synth::{shape, Quant, Synth};
use saguaro::storage::quant::DType;
use saguaro::{Engine, EngineOptions, GenerateOptions, Prompt};

fn tiny(quant: Quant, layers: Option<usize>) -> Synth {
    Synth { shape: shape("tiny").unwrap(), quant, layers, seed: 0 }
}

fn saguaro(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_saguaro")).args(args).output().expect("the saguaro binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("saguaro-synth-{}-{name}", std::process::id()))
}

#[test]
fn every_written_type_loads_and_generates() {
    let types = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "q4_k_m"];
    for name in types {
        let quant: Quant = name.parse().unwrap();
        let file = from_gguf(Arc::new(tiny(quant, None).model().unwrap().build())).unwrap();
        let w = &file.weights;
        let c = &w.config;
        assert_eq!((c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_ffn, c.vocab_size), (256, 2, 4, 2, 512, 1024));
        assert_eq!(c.tied_embeddings, quant != Quant::Q4KM, "{name}: the Q4_K_M mix has a head of its own");
        let want = match quant {
            Quant::All(d) => d,
            Quant::Q4KM => DType::Q4K,
        };
        assert_eq!(w.layers[0].w_down.dtype, want, "{name}");
        if quant == Quant::Q4KM {
            // Layer 1 of 2 is in the last eighth: more bits, as llama.cpp's mix gives it.
            assert_eq!((w.layers[1].w_down.dtype, w.output.dtype), (DType::Q6K, DType::Q6K));
        }
        let mut engine = block_on(Engine::new(file, None, &EngineOptions::default())).unwrap();
        let opts = GenerateOptions { max_tokens: 12, ..GenerateOptions::default() };
        let prompt = Prompt::Text("def quicksort(arr):".into());
        let out = block_on(engine.generate(&prompt, &opts, &mut |_, _| true)).unwrap();
        assert_eq!(out.tokens.len(), 12, "{name}: {out:?}");
        let distinct = out.tokens.iter().collect::<std::collections::HashSet<_>>().len();
        assert!(distinct > 2, "{name}: random weights that repeat one token: {:?}", out.tokens);
    }
}

#[test]
fn timing_the_target_leaves_the_engine_as_it_was() {
    let file = from_gguf(Arc::new(tiny(Quant::Q4KM, None).model().unwrap().build())).unwrap();
    let mut engine = block_on(Engine::new(file, None, &EngineOptions::default())).unwrap();
    let opts = GenerateOptions { max_tokens: 12, ..GenerateOptions::default() };
    let prompt = Prompt::Text("def quicksort(arr):".into());
    let before = block_on(engine.generate(&prompt, &opts, &mut |_, _| true)).unwrap().tokens;
    let ms = block_on(engine.time_target_forwards(&[1, 3, 5], 2)).unwrap();
    assert_eq!(ms.len(), 3);
    assert!(ms.iter().all(|&t| t > 0.0 && t.is_finite()), "{ms:?}");
    for (sizes, rounds) in [(vec![0], 1), (vec![1, 1 << 30], 1), (vec![1], 0)] {
        let err = block_on(engine.time_target_forwards(&sizes, rounds)).unwrap_err().to_string();
        assert!(err.contains("time_target_forwards"), "{sizes:?} x {rounds}: {err}");
    }
    let after = block_on(engine.generate(&prompt, &opts, &mut |_, _| true)).unwrap().tokens;
    assert_eq!(after, before);
}

#[test]
fn fewer_layers_are_the_full_models_first_layers() {
    let full = from_gguf(Arc::new(tiny(Quant::Q4KM, None).model().unwrap().build())).unwrap().weights;
    let one = from_gguf(Arc::new(tiny(Quant::Q4KM, Some(1)).model().unwrap().build())).unwrap().weights;
    assert_eq!(one.config.n_layers, 1);
    assert_eq!(one.embed.data.as_slice(), full.embed.data.as_slice());
    assert_eq!(one.output.data.as_slice(), full.output.data.as_slice());
    let (a, b) = (&one.layers[0], &full.layers[0]);
    for (x, y) in [(&a.wq, &b.wq), (&a.wv, &b.wv), (&a.w_down, &b.w_down), (&a.attn_norm, &b.attn_norm)] {
        assert_eq!(x.data.as_slice(), y.data.as_slice());
    }
    let reseeded = from_gguf(Arc::new(Synth { seed: 1, ..tiny(Quant::Q4KM, None) }.model().unwrap().build())).unwrap();
    assert_ne!(reseeded.weights.embed.data.as_slice(), full.embed.data.as_slice(), "the seed changes the weights");
}

#[test]
fn the_command_writes_a_file_that_generates_and_chats() {
    let out = temp("tiny.gguf");
    let path = out.to_str().unwrap();
    let (ok, _, err) = saguaro(&["synth", "--shape", "tiny", "--dtype", "q4_k", "--out", path]);
    assert!(ok, "{err}");
    assert!(err.contains("tiny (2 of 2 layers, d_model 256, 4/2 heads, d_ffn 512, vocab 1024), q4_k"), "{err}");
    assert_eq!(open(&out).unwrap().weights.layers[1].wq.dtype, DType::Q4K);
    for chat in [false, true] {
        let mut args = vec!["generate", "--target", path, "--prompt", "Hello", "--max-tokens", "6", "--json"];
        args.extend(["--threads", "2"]);
        if chat {
            args.push("--chat");
        }
        let (ok, stdout, err) = saguaro(&args);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(v["tokens"].as_array().unwrap().len(), 6, "{stdout}");
        // ChatML around the prompt: <|im_start|> user \n H e l l o <|im_end|> ... assistant \n.
        let prompt = v["prompt_tokens"].as_u64().unwrap();
        assert!(if chat { prompt > 10 } else { prompt <= 5 }, "chat {chat}: {prompt} prompt tokens");
    }
    std::fs::remove_file(&out).unwrap();
}

#[test]
fn bad_arguments_are_clear_errors_that_leave_no_file() {
    let out = temp("bad.gguf");
    let path = out.to_str().unwrap();
    for (args, want) in [
        (&["--shape", "qwen9"][..], "unknown shape 'qwen9' (one of qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b, qwen2.5-7b"),
        (
            &["--shape", "tiny", "--dtype", "q5_k"],
            "weights cannot be written in q5_k (one of f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q6_k, q4_k_m)",
        ),
        (&["--shape", "tiny", "--dtype", "int3"], "unknown weight type 'int3'"),
        (&["--shape", "tiny", "--layers", "0"], "error: --layers: must be in 1..=2 for tiny, got 0"),
        (&["--shape", "qwen2.5-1.5b", "--layers", "29"], "error: --layers: must be in 1..=28 for qwen2.5-1.5b, got 29"),
        (&["--shape", "tiny", "--layers", "-1"], "invalid value '-1' for '--layers <LAYERS>'"),
    ] {
        let (ok, _, err) = saguaro(&[&["synth", "--out", path], args].concat());
        assert!(!ok && err.contains(want), "{args:?}: {err}");
    }
    let (ok, _, err) = saguaro(&["synth", "--shape", "tiny"]);
    assert!(!ok && err.contains("--out <OUT>"), "{err}");
    let missing = temp("no-such-dir").join("m.gguf");
    let (ok, _, err) = saguaro(&["synth", "--shape", "tiny", "--out", missing.to_str().unwrap()]);
    assert!(!ok && err.contains("I/O error on") && err.contains("No such file"), "{err}");
    assert!(!out.exists() && !PathBuf::from(format!("{path}.partial")).exists(), "a file was left behind");
}

/// `bench-kernels` takes its shapes from a synthesized file, times the output head with `--head`
/// and gives each bandwidth as a share of `--peak-gbs`.
#[test]
fn kernel_bench_times_the_head_against_the_peak() {
    let out = temp("kernels.gguf");
    let path = out.to_str().unwrap();
    assert!(saguaro(&["synth", "--shape", "tiny", "--dtype", "q8_0", "--out", path]).0);
    let args = ["bench-kernels", "--backend", "cpu", "--threads", "2", "--model", path, "--rows", "1"];
    let args = [&args[..], &["--dtypes", "q8_0"]].concat();
    let quick = ["--reps", "1", "--working-set-mb", "0", "--head", "--peak-gbs", "50"];
    let (ok, stdout, err) = saguaro(&[&args[..], &quick].concat());
    assert!(ok, "{err}");
    let head = stdout.lines().find(|l| l.starts_with("matmul q8_0") && l.contains("m=1 n=1024 k=256"));
    assert!(head.is_some_and(|l| l.ends_with("% of peak")), "{stdout}");
    assert!(stdout.lines().filter(|l| l.starts_with("matmul")).all(|l| l.ends_with("% of peak")), "{stdout}");
    let (ok, _, err) = saguaro(&[&args[..], &["--peak-gbs", "0"]].concat());
    assert!(!ok && err.contains("--peak-gbs must be a positive number of GB/s"), "{err}");
    std::fs::remove_file(&out).unwrap();
}
