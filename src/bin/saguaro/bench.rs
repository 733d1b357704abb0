//! `saguaro bench`: every mode on every prompt, outputs checked against each other, one table.

use std::path::PathBuf;

use clap::Args;
use futures::executor::block_on;
use serde::Serialize;
use serde_json::json;

use saguaro::decode::Mode;
use saguaro::engine::{Completion, GenerateOptions, Prompt};
use saguaro::model::tokenizer::ChatMessage;
use saguaro::{Error, Result};

use crate::setup::{EngineArgs, ModeArg};

/// Built-in prompts: code completion and chat, the workloads speculation is for.
const PROMPTS: &[(&str, bool)] = &[
    ("def quicksort(arr):\n    \"\"\"Sort a list with quicksort.\"\"\"\n", false),
    ("Write a Python function that checks whether a string is a palindrome.", true),
    ("fn main() {\n    let v: Vec<i32> = (1..=10).collect();\n", false),
    ("Explain what a hash map is in two sentences.", true),
];

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Comma-separated modes to compare (auto: the engine's measured choice).
    #[arg(long, value_delimiter = ',', default_value = "ar,sd,ssd")]
    modes: Vec<ModeArg>,
    /// A JSON file of prompts: an array of strings, or {"prompts": [...]}; used raw (no chat template).
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Default, Serialize)]
struct Row {
    mode: String,
    generated: usize,
    tokens_per_s: f64,
    speedup_vs_ar: Option<f64>,
    acceptance_rate: Option<f64>,
    mean_accepted: Option<f64>,
    cache_hit_rate: Option<f64>,
    overlap_ms: Option<f64>,
    verify_ms_mean: Option<f64>,
    glue_ms_mean: Option<f64>,
    tree_step_ms_mean: Option<f64>,
}

fn load_prompts(args: &BenchArgs) -> Result<Vec<(String, bool)>> {
    let Some(path) = &args.prompts else {
        return Ok(PROMPTS.iter().map(|&(p, chat)| (p.to_owned(), chat)).collect());
    };
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::InvalidArgument(format!("{}: {e}", path.display())))?;
    let list = v.get("prompts").unwrap_or(&v);
    list.as_array()
        .and_then(|a| a.iter().map(|p| p.as_str().map(|s| (s.to_owned(), false))).collect::<Option<Vec<_>>>())
        .filter(|p| !p.is_empty())
        .ok_or_else(|| Error::InvalidArgument(format!("{}: expected a non-empty array of prompt strings", path.display())))
}

/// Mean of `f` over the generations that have it, weighted by tokens generated.
fn weighted(gens: &[Completion], f: impl Fn(&Completion) -> Option<f64>) -> Option<f64> {
    let (mut sum, mut w) = (0.0, 0.0);
    for g in gens {
        if let Some(v) = f(g) {
            sum += v * g.stats.generated as f64;
            w += g.stats.generated as f64;
        }
    }
    (w > 0.0).then(|| sum / w)
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.modes.is_empty() {
        return Err(Error::InvalidArgument("--modes is empty".into()));
    }
    let prompts = load_prompts(args)?;
    let mut engine = args.engine.engine(&args.modes)?;
    let prompts: Vec<Prompt> = prompts
        .into_iter()
        .map(|(p, chat)| if chat { Prompt::Chat(vec![ChatMessage::new("user", &p)]) } else { Prompt::Text(p) })
        .collect();
    let mut by_mode: Vec<Vec<Completion>> = Vec::new();
    for &mode in &args.modes {
        let mut gens = Vec::new();
        let opts = GenerateOptions {
            mode: mode.0,
            max_tokens: args.max_tokens,
            spec: args.engine.fixed_spec(),
            ..GenerateOptions::default()
        };
        for (i, prompt) in prompts.iter().enumerate() {
            let g = block_on(engine.generate(prompt, &opts, &mut |_, _| true))?;
            eprintln!("{mode} prompt {i}: {} tokens, {:.1} tok/s", g.stats.generated, g.stats.tokens_per_s);
            gens.push(g);
        }
        by_mode.push(gens);
    }
    // Greedy decoding is lossless: every mode must produce the same tokens.
    let mut agree = true;
    for (m, gens) in by_mode.iter().enumerate().skip(1) {
        for (i, g) in gens.iter().enumerate() {
            if g.tokens != by_mode[0][i].tokens {
                agree = false;
                eprintln!("MISMATCH: {} and {} differ on prompt {i}", args.modes[0], args.modes[m]);
            }
        }
    }
    let tps = |gens: &[Completion]| {
        let decoded: usize = gens.iter().map(|g| g.stats.generated.saturating_sub(1)).sum();
        let ms: f64 = gens.iter().map(|g| g.stats.decode_ms).sum();
        decoded as f64 * 1000.0 / ms.max(1e-9)
    };
    let ar = args.modes.iter().position(|m| m.0 == Some(Mode::Ar)).map(|i| tps(&by_mode[i]));
    let rows: Vec<Row> = args
        .modes
        .iter()
        .zip(&by_mode)
        .map(|(mode, gens)| {
            let t = tps(gens);
            Row {
                mode: match mode.0 {
                    // The choice may change as the engine learns the acceptance: name each one made.
                    None => {
                        let mut chosen: Vec<String> =
                            gens.iter().filter_map(|g| g.stats.auto.as_ref()).map(|c| format!("{} k={}", c.mode, c.k)).collect();
                        chosen.dedup();
                        format!("auto: {}", chosen.join(", "))
                    }
                    Some(m) => m.to_string(),
                },
                generated: gens.iter().map(|g| g.stats.generated).sum(),
                tokens_per_s: t,
                speedup_vs_ar: ar.map(|a| t / a),
                acceptance_rate: weighted(gens, |g| g.stats.acceptance_rate),
                mean_accepted: weighted(gens, |g| g.stats.mean_accepted),
                cache_hit_rate: weighted(gens, |g| g.stats.cache_hit_rate),
                overlap_ms: weighted(gens, |g| g.stats.overlap_ms),
                verify_ms_mean: weighted(gens, |g| g.stats.verify_ms_mean),
                glue_ms_mean: weighted(gens, |g| g.stats.glue_ms_mean),
                tree_step_ms_mean: weighted(gens, |g| g.stats.tree_step_ms_mean),
            }
        })
        .collect();
    if args.json {
        let spec = engine.spec();
        println!(
            "{}",
            json!({"prompts": prompts.len(), "max_tokens": args.max_tokens, "spec_k": spec.k,
                   "fanout": spec.fanout.to_string(), "outputs_agree": agree, "modes": rows})
        );
    } else {
        let f = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |v| format!("{v:.p$}"));
        println!(
            "{:<22} {:>8} {:>8} {:>7} {:>10} {:>6} {:>9} {:>9} {:>8} {:>9}",
            "mode", "tok/s", "vs AR", "accept", "tok/round", "hits", "overlap", "verify", "glue", "tree step"
        );
        for r in &rows {
            println!(
                "{:<22} {:>8.2} {:>8} {:>7} {:>10} {:>6} {:>9} {:>9} {:>8} {:>9}",
                r.mode,
                r.tokens_per_s,
                f(r.speedup_vs_ar, 2),
                f(r.acceptance_rate, 2),
                f(r.mean_accepted, 2),
                f(r.cache_hit_rate, 2),
                f(r.overlap_ms, 0),
                f(r.verify_ms_mean, 1),
                f(r.glue_ms_mean, 1),
                f(r.tree_step_ms_mean, 1)
            );
        }
        println!("(ms columns: overlap per generation, others per round; greedy outputs agree: {agree})");
    }
    if agree {
        Ok(())
    } else {
        Err(Error::InvalidArgument("greedy outputs of the modes differ: decoding is not lossless".into()))
    }
}
