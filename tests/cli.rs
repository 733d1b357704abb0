//! The command line refuses every bad value with an error that names the flag the user typed
//! and its valid range (before loading any model), and reports a full context window as
//! `finish: "context_full"`.

mod util;

use std::process::Command;

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
    ] {
        let (ok, _, err) = saguaro(&[args, &["--prompt", "hi"]].concat());
        assert!(!ok, "{args:?} was accepted");
        assert!(err.contains(want), "{args:?}: {err}");
        // Refused before loading: no model was read.
        assert!(!err.contains("loading target"), "{args:?} loaded the model first: {err}");
    }
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
