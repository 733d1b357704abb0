//! `saguaro bench`: every mode on every prompt (at each K of a sweep), outputs checked against
//! each other, one table of speed and of what a round costs in target decodes; optionally a plot
//! and llama.cpp's own benchmark alternated with ours. Each prompt takes every mode in turn
//! before the next prompt, so that a shared machine's drift falls on all modes alike.

mod concurrency;
mod llama;
mod llama_server;
mod plot;
mod report;
mod server;

use std::path::PathBuf;

use clap::Args;
use futures::executor::block_on;
use serde_json::json;

use saguaro::decode::Mode;
use saguaro::engine::{Completion, Engine, GenerateOptions, Prompt};
use saguaro::model::tokenizer::ChatMessage;
use saguaro::{Error, Result};

use crate::setup::{BackendKind, EngineArgs, GrammarArgs, ModeArg};
use saguaro::grammar::GrammarSpec;

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
    /// Comma-separated modes to compare (auto: the engine's measured choice); default: every mode.
    #[arg(long, value_delimiter = ',', default_values_t = Mode::ALL.map(|m| ModeArg(Some(m))))]
    modes: Vec<ModeArg>,
    /// Run every speculative mode at each of these K (comma-separated); AR runs once.
    #[arg(long, value_delimiter = ',', conflicts_with = "spec_k")]
    sweep_k: Vec<usize>,
    /// A JSON file of prompts: an array of strings, or {"prompts": [...]}; used raw (no chat template).
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Run every prompt in every mode this many times over (each prompt takes every mode in turn
    /// each time): more rounds average out more of a shared machine's noise.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Write an SVG plot of tokens/s by mode and K to this file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// A llama.cpp `llama-bench` binary: run it on the same target file and threads, on the
    /// CPU or every layer on the GPU as --backend says, alternated with our AR decoding, and report
    /// its decode speed beside ours.
    #[arg(long)]
    llama_bench: Option<PathBuf>,
    /// How many times to alternate our AR decoding with llama-bench.
    #[arg(long, default_value_t = 3)]
    llama_reps: usize,
    /// Every mode generates under this constraint.
    #[command(flatten)]
    grammar: GrammarArgs,
    /// Run this many streams at once (comma-separated, e.g. 1,2,4,8) in one batch each, in the
    /// modes that batch (ar, sd, auto; ssd is skipped): aggregate and per-stream tokens/s and
    /// time to first token, instead of the table of one stream at a time.
    #[arg(long, value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// With --concurrency: a llama.cpp `llama-server` binary, run with N slots (-np N) on the same
    /// files and threads, without and with --model-draft, alternated with ours.
    #[arg(long, requires = "concurrency")]
    llama_server: Option<PathBuf>,
}

/// One mode at one K over every prompt.
pub struct Run {
    pub mode: ModeArg,
    /// The K it ran at; `None` for AR, and for auto choosing its own.
    pub k: Option<usize>,
    pub gens: Vec<Completion>,
}

fn load_prompts(args: &BenchArgs) -> Result<Vec<Prompt>> {
    let raw: Vec<(String, bool)> = match &args.prompts {
        None => PROMPTS.iter().map(|&(p, chat)| (p.to_owned(), chat)).collect(),
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| Error::InvalidArgument(format!("{}: {e}", path.display())))?;
            let list = v.get("prompts").unwrap_or(&v);
            list.as_array()
                .and_then(|a| a.iter().map(|p| p.as_str().map(|s| (s.to_owned(), false))).collect::<Option<Vec<_>>>())
                .filter(|p| !p.is_empty())
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("{}: expected a non-empty array of prompt strings", path.display()))
                })?
        }
    };
    Ok(raw
        .into_iter()
        .map(|(p, chat)| if chat { Prompt::Chat(vec![ChatMessage::new("user", &p)]) } else { Prompt::Text(p) })
        .collect())
}

/// Refuse bad options before any model loads.
fn check(args: &BenchArgs) -> Result<()> {
    if args.modes.is_empty() {
        return Err(Error::InvalidArgument("--modes is empty".into()));
    }
    if let Some(&k) = args.sweep_k.iter().find(|&&k| !(1..=64).contains(&k)) {
        return Err(Error::InvalidArgument(format!("--sweep-k: draft tokens per round must be in 1..=64, got {k}")));
    }
    if args.rounds == 0 {
        return Err(Error::InvalidArgument("--rounds: must be at least 1".into()));
    }
    if args.concurrency.contains(&0) {
        return Err(Error::InvalidArgument("--concurrency: streams must be at least 1".into()));
    }
    if let Some(path) = &args.llama_server {
        concurrency::check_binary(path)?;
    }
    if args.llama_bench.is_some() && args.llama_reps == 0 {
        return Err(Error::InvalidArgument("--llama-reps: must be at least 1".into()));
    }
    Ok(())
}

/// The (mode, K) pairs to run: AR once (K does not concern it), every other mode at each K.
fn plan(args: &BenchArgs) -> Vec<(ModeArg, Option<usize>)> {
    let ks: Vec<Option<usize>> =
        if args.sweep_k.is_empty() { vec![args.engine.spec_k] } else { args.sweep_k.iter().map(|&k| Some(k)).collect() };
    let mut runs = Vec::new();
    for &mode in &args.modes {
        if mode.0 == Some(Mode::Ar) {
            runs.push((mode, None));
        } else {
            runs.extend(ks.iter().map(|&k| (mode, k)));
        }
    }
    runs
}

/// One generation of `prompt` in `run`'s mode and K.
fn generate(engine: &mut Engine, prompt: &Prompt, i: usize, run: &mut Run, max_tokens: usize, grammar: &Option<GrammarSpec>) -> Result<()> {
    let spec = run.k.map(|k| saguaro::decode::SpecConfig { k, ..engine.spec().clone() });
    let opts = GenerateOptions { mode: run.mode.0, max_tokens, spec, grammar: grammar.clone(), ..GenerateOptions::default() };
    let g = block_on(engine.generate(prompt, &opts, &mut |_, _| true))?;
    let at = run.k.map_or(String::new(), |k| format!(" k={k}"));
    eprintln!("{}{at} prompt {i}: {} tokens, {:.1} tok/s", run.mode, g.stats.generated, g.stats.tokens_per_s);
    run.gens.push(g);
    Ok(())
}

pub fn run(args: &BenchArgs) -> Result<()> {
    check(args)?;
    let grammar = args.grammar.spec()?;
    let prompts = load_prompts(args)?;
    if !args.concurrency.is_empty() {
        return run_concurrency(args, &prompts, &grammar);
    }
    let mut engine = if let Some(&largest) = args.sweep_k.iter().max() {
        // Built for the largest K, so the draft cache holds every K of the sweep.
        args.engine.engine_with_k(&args.modes, largest)?
    } else {
        args.engine.engine(&args.modes)?
    };
    let speculative = |mode: ModeArg| mode.0 != Some(Mode::Ar) && mode.0.is_some();
    let mut runs: Vec<Run> = plan(args)
        .into_iter()
        // SD and SSD without a K of their own run at the engine's.
        .map(|(mode, k)| Run { mode, k: k.or(speculative(mode).then(|| engine.spec().k)), gens: Vec::new() })
        .collect();
    for _ in 0..args.rounds {
        for (i, prompt) in prompts.iter().enumerate() {
            for run in &mut runs {
                generate(&mut engine, prompt, i, run, args.max_tokens, &grammar)?;
            }
        }
    }
    // Greedy decoding is lossless: every mode at every K must produce the same tokens.
    let mut agree = true;
    for r in &runs[1..] {
        for (i, g) in r.gens.iter().enumerate() {
            if g.tokens != runs[0].gens[i].tokens {
                agree = false;
                eprintln!("MISMATCH: {} and {} differ on prompt {}", report::label(&runs[0]), report::label(r), i % prompts.len());
            }
        }
    }
    let llama = match &args.llama_bench {
        Some(path) => {
            let ks: Vec<usize> = if args.sweep_k.is_empty() { vec![engine.spec().k] } else { args.sweep_k.clone() };
            let setup = llama::Setup {
                binary: path,
                model: &args.engine.target,
                threads: args.engine.threads,
                tokens: args.max_tokens,
                reps: args.llama_reps,
                ks: &ks,
                gpu: args.engine.backend == BackendKind::Gpu,
            };
            Some(llama::compare(&setup, &mut engine, &prompts[0])?)
        }
        None => None,
    };
    let unit = report::DecodeUnit::of(&runs, &engine);
    let rows = report::rows(&runs, unit.as_ref());
    let server = server::rows(&runs);
    if let Some(path) = &args.plot {
        let svg = plot::svg(&rows, llama.as_ref().map(|l| l.decode_tokens_per_s.median));
        std::fs::write(path, svg).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    }
    if args.json {
        let spec = engine.spec();
        println!(
            "{}",
            json!({"prompts": prompts.len(), "rounds": args.rounds, "max_tokens": args.max_tokens, "spec_k": spec.k,
                   "sweep_k": args.sweep_k, "fanout": spec.fanout.to_string(), "outputs_agree": agree,
                   "decode_ms": unit.as_ref().map(|u| u.ms), "decode_measured_by": unit.as_ref().map(|u| u.source),
                   "modes": rows, "server": server, "llama_cpp": llama})
        );
    } else {
        report::print_table(&rows, unit.as_ref(), agree);
        if !server.is_empty() {
            server::print(&server);
        }
        if let Some(l) = &llama {
            llama::print(l);
        }
    }
    if agree {
        Ok(())
    } else {
        Err(Error::InvalidArgument("greedy outputs of the modes differ: decoding is not lossless".into()))
    }
}

/// `--concurrency`: streams at once on one pool, in the modes that batch.
fn run_concurrency(args: &BenchArgs, prompts: &[Prompt], grammar: &Option<GrammarSpec>) -> Result<()> {
    let batched = |m: &ModeArg| match m.0 {
        Some(Mode::Ar) => true,
        Some(Mode::Sd) | None => args.engine.draft.is_some(),
        Some(_) => false,
    };
    let modes: Vec<ModeArg> = args.modes.iter().copied().filter(batched).collect();
    for m in args.modes.iter().filter(|m| !batched(m)) {
        eprintln!("{m}: skipped (it does not run in a batch here)");
    }
    let mut pool = args.engine.pool(args.concurrency.iter().copied().max().unwrap_or(1))?;
    let llama_server = args.llama_server.as_deref().map(|binary| llama_server::Setup {
        binary,
        target: &args.engine.target,
        draft: args.engine.draft.as_deref(),
        threads: args.engine.threads,
        context: args.engine.context,
        max_tokens: args.max_tokens,
    });
    let setup = concurrency::Setup {
        concurrency: &args.concurrency,
        modes: &modes,
        prompts,
        max_tokens: args.max_tokens,
        rounds: args.rounds,
        grammar,
        llama_server,
    };
    let rows = concurrency::run(&mut pool, &setup)?;
    if args.json {
        println!("{}", json!({"prompts": prompts.len(), "rounds": args.rounds, "max_tokens": args.max_tokens, "concurrency": rows}));
    } else {
        concurrency::print(&rows);
    }
    Ok(())
}
