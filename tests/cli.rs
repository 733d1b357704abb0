//! The command line refuses every bad value with an error that names the flag the user typed
//! and its valid range (before loading any model), and reports a full context window as
//! `finish: "context_full"`.

mod util;

use std::process::Command;

use saguaro::backend::cpu::KernelSet;

fn saguaro(args: &[&str]) -> (bool, String, String) {
    let model = util::root().join(format!("models/{}.gguf", util::SMOLLM2));
    let out = Command::new(env!("CARGO_BIN_EXE_saguaro"))
        .arg("generate")
        .arg("--target")
        .arg(&model)
        .args(args)
        .output()
        .expect("the saguaro binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn bad_values_are_refused_by_flag_and_range() {
    for (args, want) in [
        (&["--temperature", "-1"][..], "error: --temperature: must be a finite number >= 0 (0 means greedy), got -1"),
        (&["--temperature", "NaN"], "error: --temperature: must be a finite number >= 0 (0 means greedy), got NaN"),
        (&["--top-p", "0"], "error: --top-p: must be in (0, 1] (1 disables it), got 0"),
        (&["--top-p", "1.5"], "error: --top-p: must be in (0, 1] (1 disables it), got 1.5"),
        (&["--max-tokens", "0"], "error: --max-tokens: must be at least 1"),
        (&["--spec-k", "0"], "error: --spec-k: draft tokens per round must be in 1..=64, got 0"),
        (&["--spec-k", "65"], "error: --spec-k: draft tokens per round must be in 1..=64, got 65"),
        (&["--saguaro-c", "-0.5"], "error: --saguaro-c: must be in [0, 1] (1 disables it), got -0.5"),
        (&["--context", "0"], "error: --context: must be at least 1 token"),
        (&["--fanout", "uniform:0"], "'--fanout <FANOUT>': invalid fanout: uniform fan-out needs at least 1"),
        (&["--max-tokens", "-3"], "invalid value '-3' for '--max-tokens <MAX_TOKENS>'"),
        (&["--json-schema", "{not json"], "error: invalid grammar: JSON schema: not JSON"),
        (&["--json-schema", "no-such-schema.json"], "no-such-schema.json"),
        (&["--grammar", "no-such-grammar.lark"], "no-such-grammar.lark"),
        (&["--json-object", "--regex", "a"], "cannot be used with"),
    ] {
        let (ok, _, err) = saguaro(&[args, &["--prompt", "hi"]].concat());
        assert!(!ok, "{args:?} was accepted");
        assert!(err.contains(want), "{args:?}: {err}");
        // Refused before loading: no model was read.
        assert!(!err.contains("loading target"), "{args:?} loaded the model first: {err}");
    }
}

#[test]
fn bench_refuses_bad_values_before_loading() {
    let model = util::root().join(format!("models/{}.gguf", util::SMOLLM2));
    for (args, want) in [
        (&["--rounds", "0"][..], "--rounds: must be at least 1"),
        (&["--sweep-k", "0"], "--sweep-k: draft tokens per round must be in 1..=64, got 0"),
        (&["--llama-bench", "llama-bench", "--llama-reps", "0"], "--llama-reps: must be at least 1"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_saguaro"))
            .args(["bench", "--target"])
            .arg(&model)
            .args(args)
            .output()
            .expect("the saguaro binary runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("loading target"), "{args:?} loaded the model first: {err}");
    }
}

/// Kernel set names: an unknown one on the command line is refused with the names there are, one
/// for the GPU backend is refused as a CPU option, and an unknown one in `SAGUARO_KERNELS` is said
/// on stderr while the fastest set runs.
#[test]
fn kernel_set_names_are_checked() {
    for (args, want) in [
        (&["--backend", "cpu", "--kernels", "avx9"][..], "no kernel set \"avx9\" (one of scalar, simd128, relaxed-simd, avx2"),
        (&["--backend", "gpu", "--kernels", "scalar"], "--kernels names CPU kernel sets: use it with --backend cpu"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_saguaro")).arg("bench-kernels").args(args).output().expect("the saguaro binary runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{args:?}: {err}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_saguaro"))
        .arg("devices")
        .env("SAGUARO_KERNELS", "avx9")
        .output()
        .expect("the saguaro binary runs");
    let (stdout, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{err}");
    assert!(err.contains("SAGUARO_KERNELS=avx9: no such kernel set"), "{err}");
    let best = KernelSet::ALL.into_iter().rev().find(|s| s.supported()).unwrap();
    assert!(stdout.contains(&format!("kernels {} (this CPU runs:", best.name())), "{stdout}");
}

#[test]
fn bad_prompts_are_refused_by_name() {
    let (ok, _, err) = saguaro(&["--prompt", ""]);
    assert!(!ok && err.contains("error: --prompt: is empty"), "{err}");
    let long = "word ".repeat(40);
    let (ok, _, err) = saguaro(&["--context", "16", "--prompt", &long]);
    assert!(!ok && err.contains("leaves no room to generate in the context of 16 tokens"), "{err}");
}

#[test]
fn a_full_context_is_reported_for_every_mode() {
    for mode in ["ar", "sd", "ssd"] {
        let (ok, out, err) =
            saguaro(&["--mode", mode, "--context", "24", "--max-tokens", "100", "--prompt", "Once upon a time", "--json"]);
        assert!(ok, "{mode}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{mode}: {e}: {out}"));
        assert_eq!(v["finish"], "context_full", "{mode}: {out}");
        let used = v["prompt_tokens"].as_u64().unwrap() + v["tokens"].as_array().unwrap().len() as u64;
        assert_eq!(used, 24, "{mode}: prompt and output fill the window exactly: {out}");
    }
}

/// One `saguaro bench` on SmolLM2 (drafting for itself): every mode, a K sweep, two rounds, JSON
/// and a plot.
fn bench_run() -> &'static (serde_json::Value, String) {
    static RUN: std::sync::OnceLock<(serde_json::Value, String)> = std::sync::OnceLock::new();
    RUN.get_or_init(|| {
        let model = util::root().join(format!("models/{}.gguf", util::SMOLLM2));
        let plot = std::env::temp_dir().join(format!("saguaro-bench-{}.svg", std::process::id()));
        let out = Command::new(env!("CARGO_BIN_EXE_saguaro"))
            .args(["bench", "--target"])
            .arg(&model)
            .args(["--modes", "ar,sd,ssd", "--sweep-k", "2,3", "--max-tokens", "12", "--rounds", "2", "--json", "--plot"])
            .arg(&plot)
            .output()
            .expect("the saguaro binary runs");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "bench failed: {stderr}");
        let v = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        let svg = std::fs::read_to_string(&plot).expect("--plot wrote the file");
        let _ = std::fs::remove_file(&plot);
        (v, svg)
    })
}

#[test]
fn bench_json_reports_each_mode_at_each_k_with_costs_in_decodes() {
    let (v, _) = bench_run();
    assert_eq!(v["outputs_agree"], true, "{v}");
    assert_eq!(v["sweep_k"], serde_json::json!([2, 3]));
    assert_eq!(v["decode_measured_by"], "ar");
    let decode_ms = v["decode_ms"].as_f64().expect("decode_ms");
    assert!(decode_ms.is_finite() && decode_ms > 0.0, "{v}");
    let rows = v["modes"].as_array().unwrap();
    let runs: Vec<(String, Option<u64>)> = rows.iter().map(|r| (r["mode"].as_str().unwrap().to_owned(), r["k"].as_u64())).collect();
    let want: Vec<(String, Option<u64>)> = [("ar", None), ("sd", Some(2)), ("sd", Some(3)), ("ssd", Some(2)), ("ssd", Some(3))]
        .into_iter()
        .map(|(m, k)| (m.to_owned(), k))
        .collect();
    assert_eq!(runs, want, "AR once, every other mode at each K");
    // Every prompt ran in every mode once per round (these prompts all run to the token limit).
    assert_eq!(v["rounds"], 2);
    let prompts = v["prompts"].as_u64().unwrap();
    for r in rows {
        assert_eq!(r["generated"].as_u64(), Some(prompts * 2 * 12), "{r}");
    }
    let positive = |r: &serde_json::Value, f: &str| {
        let x = r[f].as_f64().unwrap_or_else(|| panic!("{f} missing in {r}"));
        assert!(x.is_finite() && x > 0.0, "{f} = {x} in {r}");
        x
    };
    // AR decodes one token per forward: its own speed-up is 1 and it has no rounds to cost.
    assert!((positive(&rows[0], "speedup_vs_ar") - 1.0).abs() < 1e-9);
    assert!(rows[0]["verify_over_decode"].is_null() && rows[0]["draft_step_over_decode"].is_null(), "{}", rows[0]);
    for r in &rows[1..] {
        positive(r, "tokens_per_s");
        positive(r, "speedup_vs_ar");
        // The ratios are the mean times over the run's decode (a unit slip would be off by 1000x).
        for (ratio, ms) in [("verify_over_decode", "verify_ms"), ("draft_step_over_decode", "draft_step_ms")] {
            let (x, t) = (positive(r, ratio), positive(r, ms));
            assert!((x - t / decode_ms).abs() < 1e-9 * x, "{r}");
            assert!(x < 50.0, "{ratio} {x}: a round of at most 4 tokens costs a few decodes, not more: {r}");
        }
    }
}

/// Check `svg` is well-formed XML (balanced, properly nested tags; quoted, unique attributes;
/// escaped text) and return each element's name and attributes in document order.
fn parse_xml(svg: &str) -> Vec<(String, Vec<(String, String)>)> {
    let entity_ok = |s: &str| {
        s.match_indices('&').all(|(i, _)| ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].iter().any(|e| s[i..].starts_with(e)))
    };
    let mut rest = svg.strip_prefix("<?xml ").and_then(|r| r.split_once("?>")).expect("an XML declaration").1;
    let (mut stack, mut elements, mut roots) = (Vec::<String>::new(), Vec::new(), 0);
    while let Some(open) = rest.find('<') {
        let text = &rest[..open];
        assert!(entity_ok(text), "bad text: {text}");
        assert!(!stack.is_empty() || text.trim().is_empty(), "text outside the root: {text}");
        let close = rest[open..].find('>').expect("an unclosed tag") + open;
        let tag = &rest[open + 1..close];
        rest = &rest[close + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name.trim()), "misnested </{name}>");
            continue;
        }
        let (body, empty) = tag.strip_suffix('/').map_or((tag, false), |b| (b, true));
        let (name, mut attrs_text) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
        assert!(!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == ':' || c == '-'), "bad name {name}");
        let mut attrs: Vec<(String, String)> = Vec::new();
        loop {
            attrs_text = attrs_text.trim_start();
            if attrs_text.is_empty() {
                break;
            }
            let (key, after) = attrs_text.split_once("=\"").unwrap_or_else(|| panic!("unquoted attribute in <{tag}>"));
            let (value, after) = after.split_once('"').unwrap_or_else(|| panic!("unterminated value in <{tag}>"));
            assert!(!key.contains(char::is_whitespace) && !attrs.iter().any(|a| a.0 == key), "bad attribute {key} in <{tag}>");
            assert!(!value.contains('<') && entity_ok(value), "bad value {value}");
            attrs.push((key.to_owned(), value.to_owned()));
            attrs_text = after;
        }
        if stack.is_empty() {
            roots += 1;
        }
        if !empty {
            stack.push(name.to_owned());
        }
        elements.push((name.to_owned(), attrs));
    }
    assert!(stack.is_empty() && rest.trim().is_empty(), "unclosed {stack:?} or trailing text {rest}");
    assert_eq!(roots, 1, "one root element");
    elements
}

#[test]
fn bench_plot_is_well_formed_svg_with_one_series_per_mode() {
    let (_, svg) = bench_run();
    let elements = parse_xml(svg);
    assert_eq!(elements[0].0, "svg");
    let attr = |e: &(String, Vec<(String, String)>), k: &str| e.1.iter().find(|a| a.0 == k).map(|a| a.1.clone());
    let series: Vec<usize> =
        elements.iter().enumerate().filter(|(_, e)| e.0 == "g" && attr(e, "class").as_deref() == Some("series")).map(|(i, _)| i).collect();
    let modes: Vec<String> = series.iter().map(|&i| attr(&elements[i], "data-mode").expect("a series names its mode")).collect();
    assert_eq!(modes, ["ar", "sd", "ssd"]);
    // SD and SSD: a line through a point per K; AR (no K): a level line.
    for (n, &i) in series.iter().enumerate() {
        let end = series.get(n + 1).copied().unwrap_or(elements.len());
        let mine = &elements[i + 1..end];
        let points = mine.iter().find(|e| e.0 == "polyline").and_then(|e| attr(e, "points"));
        if modes[n] == "ar" {
            assert!(points.is_none() && mine.iter().any(|e| e.0 == "line"), "AR is a level line");
        } else {
            let points = points.unwrap_or_else(|| panic!("{} has no polyline", modes[n]));
            assert_eq!(points.split_whitespace().count(), 2, "{}: one point per K", modes[n]);
        }
    }
}

/// `generate --n`: greedy samples in one batch are each the single generation's text; sampled
/// ones follow their seeds; a mode that does not batch is refused.
#[test]
fn n_samples_run_in_one_batch() {
    let base = ["--prompt", "def add(a, b):", "--max-tokens", "10", "--threads", "2", "--json"];
    let (ok, one, err) = saguaro(&[&base[..], &["--mode", "ar"]].concat());
    assert!(ok, "{err}");
    let one: serde_json::Value = serde_json::from_str(&one).unwrap();
    let (ok, three, err) = saguaro(&[&base[..], &["--n", "3"]].concat());
    assert!(ok, "{err}");
    let three: serde_json::Value = serde_json::from_str(&three).unwrap();
    for s in three.as_array().unwrap() {
        assert_eq!(s["tokens"], one["tokens"], "{three}");
    }
    let sampled = [&base[..], &["--n", "2", "--temperature", "1.5", "--seed", "9"]].concat();
    let tokens = || {
        let (ok, out, err) = saguaro(&sampled);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v.as_array().unwrap().iter().map(|s| s["tokens"].clone()).collect::<Vec<_>>()
    };
    let a = tokens();
    assert_eq!(tokens(), a, "seeded samples repeat");
    assert_ne!(a[0], a[1], "the samples differ: {a:?}");
    let (ok, _, err) = saguaro(&[&base[..], &["--n", "2", "--mode", "ssd"]].concat());
    assert!(!ok && err.contains("does not run in a batch"), "{err}");
}
