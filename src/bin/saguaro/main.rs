//! The `saguaro` command line: generate text, benchmark decoding strategies and kernels.

mod bench;
mod kernels;
mod serve;
mod setup;
mod synth;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use futures::executor::block_on;
use saguaro::decode::BoxedSink;
use saguaro::engine::{Completion, GenerateOptions, Prompt};
use saguaro::model::tokenizer::ChatMessage;
use saguaro::{Error, Result};
use setup::{EngineArgs, GrammarArgs, ModeArg, SamplingArgs};

#[derive(Parser)]
#[command(
    name = "saguaro",
    version,
    about = "Run LLMs on the CPU or GPU, fast, with speculative speculative decoding (SSD)",
    long_about = "Run LLMs on the CPU or GPU, fast, with speculative speculative decoding (SSD).\n\n\
        Give a target model (a .gguf file or a Hugging Face directory) and optionally a small draft \
        model with the same vocabulary, or `--draft ngram` (prompt lookup). With a draft, `generate` \
        times the models at load and runs the fastest mode for where they were placed: SD (the \
        draft proposes, the target verifies), SSD (while the target verifies one speculation, the \
        draft speculates the next round for the most likely verification outcomes) or plain AR. \
        Output is lossless: greedy SD/SSD equals the target's own greedy output token for token."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming tokens to stdout.
    Generate(GenerateArgs),
    /// Run each decoding mode on each prompt, check greedy outputs agree, and compare speed.
    Bench(bench::BenchArgs),
    /// Time each kernel (matmul per weight type, norm, RoPE, attention, ...) at model shapes:
    /// ms per call, GB/s and GFLOP/s.
    BenchKernels(kernels::BenchKernelsArgs),
    /// List the GPU adapters with their limits and features.
    Devices,
    /// Serve a target model over HTTP with SGLang's `/generate` API, for drafts elsewhere
    /// (`generate --target http://HOST:PORT --draft ...`) to verify against.
    Serve(serve::ServeArgs),
    /// Write a GGUF model of a real model's shape (Qwen 2.5 0.5B to 7B) with random weights in a
    /// given storage type, for timing where no model file can be fetched.
    Synth(synth::SynthArgs),
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Decoding mode: auto (with a --draft: the fastest of the others and its K, measured at
    /// load), ar (plain), sd (speculative) or ssd (speculative speculative).
    #[arg(long, default_value = "auto")]
    mode: ModeArg,
    /// The prompt text.
    #[arg(long, conflicts_with = "prompt_file")]
    prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Print one JSON object {text, tokens, prompt_tokens, finish, stats} instead of streaming text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    grammar: GrammarArgs,
    /// Generate this many samples of the prompt at once, in one batch (seeds --seed, --seed + 1,
    /// ...; the same text each when greedy); printed once all are done. Modes: auto, ar, sd.
    #[arg(long, default_value_t = 1)]
    n: usize,
}

fn prompt_text(args: &GenerateArgs) -> Result<String> {
    match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => Ok(p.clone()),
        (None, Some(f)) => std::fs::read_to_string(f).map_err(|source| Error::Io { path: f.display().to_string(), source }),
        (None, None) => Err(Error::InvalidArgument("give a prompt with --prompt or --prompt-file".into())),
    }
}

fn generate(args: &GenerateArgs) -> Result<()> {
    let text = prompt_text(args)?;
    let opts = GenerateOptions {
        mode: args.mode.0,
        max_tokens: args.sampling.max_tokens,
        sampling: args.sampling.params(),
        spec: args.engine.fixed_spec(),
        grammar: args.grammar.spec()?,
        tools: None,
    };
    // Checked before the models load, so a bad value is reported at once.
    opts.validate()?;
    if args.n == 0 {
        return Err(Error::InvalidOption { option: "n", reason: "must be at least 1".into() });
    }
    let prompt = if args.chat { Prompt::Chat(vec![ChatMessage::new("user", &text)]) } else { Prompt::Text(text) };
    if args.n > 1 {
        return samples(args, &prompt, &opts);
    }
    let mut engine = args.engine.engine(&[args.mode])?;
    let mut stdout = std::io::stdout().lock();
    let json = args.json;
    let c = block_on(engine.generate(&prompt, &opts, &mut |piece, _| {
        if !json {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
        true
    }))?;
    drop(stdout);
    report(&c, json);
    Ok(())
}

/// `--n`: the samples of one prompt in one batch, printed once all are done.
fn samples(args: &GenerateArgs, prompt: &Prompt, opts: &GenerateOptions) -> Result<()> {
    let mut pool = args.engine.pool(args.n)?;
    let arrivals = (0..args.n)
        .map(|i| {
            let mut opts = opts.clone();
            opts.sampling.seed = opts.sampling.seed.wrapping_add(i as u64);
            (prompt.clone(), opts, Box::new(|_: &[u32]| true) as BoxedSink<'static>)
        })
        .collect();
    let ids = pool.join_all(arrivals).into_iter().map(|j| j.map(|j| j.id)).collect::<Result<Vec<u64>>>()?;
    let mut done = std::collections::HashMap::new();
    while pool.running() > 0 {
        for (id, g) in block_on(pool.step()) {
            done.insert(id, g?);
        }
    }
    let mut out = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let g = &done[id];
        let text = pool.tokenizer().decode(&g.tokens)?;
        if args.json {
            out.push(serde_json::json!({"text": text, "tokens": g.tokens, "finish": g.finish, "stats": g.stats}));
        } else {
            println!("--- sample {i} ({} tokens, {:?}, {}) ---\n{text}", g.tokens.len(), g.finish, g.stats.mode);
        }
    }
    if args.json {
        println!("{}", serde_json::Value::Array(out));
    }
    Ok(())
}

fn report(c: &Completion, json: bool) {
    let s = &c.stats;
    if json {
        println!("{}", serde_json::to_string(c).expect("a completion serializes"));
        return;
    }
    println!();
    // A rate of no decode steps (a single token comes from the prefill) would read as 0 tok/s.
    let decode = if s.generated > 1 { format!(", {:.1} tok/s", s.tokens_per_s) } else { String::new() };
    let prefill_rate = if s.prefill_ms > 0.0 { s.prompt_tokens as f64 * 1000.0 / s.prefill_ms } else { 0.0 };
    let mut line = format!(
        "[{}] {} tokens{decode}, prefill {} tokens in {:.0} ms ({prefill_rate:.1} tok/s), finish: {:?}",
        s.mode, s.generated, s.prompt_tokens, s.prefill_ms, c.finish
    );
    if let (Some(a), Some(m)) = (s.acceptance_rate, s.mean_accepted) {
        line += &format!(", acceptance {a:.2}, {m:.2} tokens/round");
    }
    if let Some(h) = s.cache_hit_rate {
        line += &format!(", cache hits {h:.2}");
    }
    eprintln!("{line}");
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match &cli.command {
        Command::Generate(a) => generate(a),
        Command::Bench(a) => bench::run(a),
        Command::BenchKernels(a) => kernels::bench(a),
        Command::Devices => kernels::devices(),
        Command::Serve(a) => serve::serve(a),
        Command::Synth(a) => synth::synth(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        // The library names options in snake_case; here they are the flags the user typed.
        Err(Error::InvalidOption { option, reason }) => {
            eprintln!("error: --{}: {reason}", option.replace('_', "-"));
            ExitCode::FAILURE
        }
        Err(Error::Server { message, partial }) => {
            eprintln!("\nerror: server error: {message} (after {} generated tokens, kept above)", partial.len());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
