//! The `saguaro` command line: generate text and benchmark decoding strategies.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use futures::executor::block_on;
use serde_json::json;
use web_time::Instant;

use saguaro::backend::cpu::CpuBackend;
use saguaro::decode::{generate_ar, Generation, Request};
use saguaro::model::load::{open, ModelFile};
use saguaro::model::runner::{Lm, Runner};
use saguaro::model::tokenizer::{apply_chat_template, StreamDecoder, Tokenizer};
use saguaro::model::transformer::Transformer;
use saguaro::sampling::SamplingParams;
use saguaro::{Error, Result};

#[derive(Parser)]
#[command(name = "saguaro", version, about = "Run LLMs on the CPU or GPU, fast, with speculative speculative decoding")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming tokens to stdout.
    Generate(GenerateArgs),
}

#[derive(Args)]
struct ModelArgs {
    /// Target model: a .gguf file or a Hugging Face directory (config.json, *.safetensors, tokenizer.json).
    #[arg(long)]
    target: PathBuf,
    /// CPU threads for the target (default: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

#[derive(Args)]
struct SamplingArgs {
    /// Maximum number of tokens to generate.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature; 0 means greedy (deterministic).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Random seed: the same seed gives the same output.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl SamplingArgs {
    fn params(&self) -> SamplingParams {
        SamplingParams { temperature: self.temperature, top_k: self.top_k, top_p: self.top_p, seed: self.seed }
    }
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
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
    /// Print one JSON object {text, tokens, prompt_tokens, stats} instead of streaming text.
    #[arg(long)]
    json: bool,
}

fn load(path: &Path, role: &str) -> Result<ModelFile> {
    let t = Instant::now();
    eprint!("loading {role} {} ... ", path.display());
    let m = open(path)?;
    let c = &m.weights.config;
    eprintln!(
        "{:?}, {} layers, d={}, vocab {} ({:.0} ms)",
        c.arch,
        c.n_layers,
        c.d_model,
        c.vocab_size,
        t.elapsed().as_secs_f64() * 1000.0
    );
    Ok(m)
}

fn cpu_runner(m: &ModelFile, threads: usize, capacity: usize) -> Result<Box<dyn Lm + Send>> {
    let model = Transformer::new(CpuBackend::new(threads)?, &m.weights)?;
    Ok(Box::new(Runner::new(model, capacity)?))
}

fn prompt_text(args: &GenerateArgs) -> Result<String> {
    match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => Ok(p.clone()),
        (None, Some(f)) => std::fs::read_to_string(f).map_err(|source| Error::Io { path: f.display().to_string(), source }),
        (None, None) => Err(Error::InvalidArgument("give a prompt with --prompt or --prompt-file".into())),
    }
}

fn encode_prompt(m: &ModelFile, text: &str, chat: bool) -> Result<Vec<u32>> {
    let tok: &Tokenizer = &m.tokenizer;
    if !chat {
        return tok.encode(text);
    }
    let template = m
        .chat_template
        .as_deref()
        .ok_or_else(|| Error::InvalidArgument("--chat: the model has no chat template".into()))?;
    let rendered =
        apply_chat_template(template, None, text, tok.bos_token().as_deref(), tok.eos_token().as_deref())?;
    tok.encode(&rendered)
}

fn generate(args: &GenerateArgs) -> Result<()> {
    let text = prompt_text(args)?;
    let target = load(&args.model.target, "target")?;
    let prompt = encode_prompt(&target, &text, args.chat)?;
    let req = Request {
        prompt: prompt.clone(),
        max_tokens: args.sampling.max_tokens,
        sampling: args.sampling.params(),
        stop: target.tokenizer.eos_ids().to_vec(),
    };
    let capacity = prompt.len() + req.max_tokens;
    let mut lm = cpu_runner(&target, args.model.threads, capacity)?;
    let mut stream = StreamDecoder::new(&target.tokenizer);
    let mut stdout = std::io::stdout().lock();
    let json = args.json;
    let mut stream_err = None;
    let mut sink = |toks: &[u32]| {
        if json {
            return true;
        }
        for &t in toks {
            match stream.push(t) {
                Ok(s) => {
                    let _ = stdout.write_all(s.as_bytes());
                }
                Err(e) => {
                    stream_err = Some(e);
                    return false;
                }
            }
        }
        let _ = stdout.flush();
        true
    };
    let g = block_on(generate_ar(lm.as_mut(), &req, &mut sink))?;
    if let Some(e) = stream_err {
        return Err(e);
    }
    report(&target.tokenizer, &g, json)
}

fn report(tok: &Tokenizer, g: &Generation, json: bool) -> Result<()> {
    let s = &g.stats;
    if json {
        let text = tok.decode(&g.tokens)?;
        let obj = json!({"text": text, "tokens": g.tokens, "prompt_tokens": s.prompt_tokens, "finish": g.finish, "stats": s});
        println!("{obj}");
    } else {
        println!();
        eprintln!(
            "[{}] {} tokens, {:.1} tok/s, prefill {} tokens in {:.0} ms, finish: {:?}",
            s.mode, s.generated, s.tokens_per_s, s.prompt_tokens, s.prefill_ms, g.finish
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match &cli.command {
        Command::Generate(a) => generate(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
