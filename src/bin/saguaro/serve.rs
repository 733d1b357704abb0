//! `saguaro serve`: a target model behind OpenAI's `/v1/completions` and `/v1/chat/completions`
//! (several clients in one batch, with speculation where a draft is given), and behind SGLang's
//! `/generate` API, for drafts on other machines (or in browsers) to verify against.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use saguaro::grammar::Vocabulary;
use saguaro::backend::cpu::CpuBackend;
use saguaro::model::load::open;
use saguaro::model::transformer::Transformer;
use saguaro::remote::generate::Limits;
use futures::executor::block_on;
use saguaro::backend::cpu::Precision;
use saguaro::engine::{Device, EngineOptions};
use saguaro::openai::{OpenAi, OpenAiOptions};
use saguaro::pool::Pool;
use saguaro::remote::protocol::ModelInfo;
use saguaro::remote::{bind, session_bytes, PrefixCaches, PrefixModel, ServeOptions};
use saguaro::{Error, Result};

use crate::setup::{BackendKind, DeviceArgs, PrecisionArg};

#[derive(Args)]
pub struct ServeArgs {
    /// The model to serve: a .gguf file or a Hugging Face directory.
    #[arg(long)]
    target: PathBuf,
    #[arg(long, value_enum, default_value_t = BackendKind::Cpu)]
    backend: BackendKind,
    #[command(flatten)]
    device: DeviceArgs,
    /// CPU threads (0 = all cores).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    threads: usize,
    #[arg(long, value_enum, default_value_t = PrecisionArg::Exact)]
    precision: PrecisionArg,
    /// Address to listen on; port 0 picks a free one (the address is printed on stdout).
    #[arg(long, default_value = "127.0.0.1:30000")]
    listen: String,
    /// Tokens one session (one client's sequence) may hold, capped by the model's context.
    #[arg(long, default_value_t = 4096, allow_negative_numbers = true)]
    context: usize,
    /// Sessions kept at once (each a KV cache); the least recently used is evicted.
    #[arg(long, default_value_t = 8, allow_negative_numbers = true)]
    max_sessions: usize,
    /// Memory for the sessions' KV caches, in MiB: lowers --max-sessions to what fits.
    #[arg(long, default_value_t = 2048, allow_negative_numbers = true)]
    cache_mib: usize,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 4 << 20, allow_negative_numbers = true)]
    max_body: usize,
    /// Seconds a request may wait for the model and run.
    #[arg(long, default_value_t = 60.0, allow_negative_numbers = true)]
    timeout: f64,
    /// Most tokens one request may generate.
    #[arg(long, default_value_t = 4096, allow_negative_numbers = true)]
    max_new_tokens: usize,
    /// A draft model (same vocabulary) for the OpenAI endpoints: each request then runs SD or
    /// AR, whichever its batch size makes faster.
    #[arg(long)]
    draft: Option<PathBuf>,
    /// Sequences the OpenAI endpoints run at once in one batch (a request with `n` takes n);
    /// each holds a KV cache of --context tokens.
    #[arg(long, default_value_t = 4, allow_negative_numbers = true)]
    parallel: usize,
    /// OpenAI requests waiting for a sequence (and SGLang requests for the model); beyond it, 503.
    #[arg(long, default_value_t = 32, allow_negative_numbers = true)]
    queue: usize,
}

pub fn serve(args: &ServeArgs) -> Result<()> {
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        return Err(Error::InvalidOption { option: "timeout", reason: format!("must be a positive number of seconds, got {}", args.timeout) });
    }
    if args.parallel == 0 || args.queue == 0 {
        return Err(Error::InvalidOption { option: "parallel", reason: "--parallel and --queue must be at least 1".into() });
    }
    if args.context == 0 {
        return Err(Error::InvalidOption { option: "context", reason: "must be at least 1 token".into() });
    }
    let file = open(&args.target)?;
    let config = file.weights.config.clone();
    let context = args.context.min(config.context_length);
    let fit = (args.cache_mib << 20) / session_bytes(&config, context).max(1);
    let sessions = args.max_sessions.min(fit);
    if sessions == 0 {
        return Err(Error::InvalidOption { option: "cache_mib", reason: format!("{} MiB hold no session of {context} tokens", args.cache_mib) });
    }
    let info = ModelInfo {
        model_path: args.target.display().to_string(),
        is_generation: true,
        vocab_size: Some(config.vocab_size),
        vocab_fingerprint: Some(file.tokenizer.vocab_fingerprint()),
        context_length: Some(context),
    };
    let timeout = Duration::from_secs_f64(args.timeout);
    let opts = ServeOptions {
        max_body: args.max_body,
        timeout,
        queue: args.queue,
        limits: Limits { max_new_tokens: args.max_new_tokens, time: timeout, ..ServeOptions::default().limits },
        ..ServeOptions::default()
    };
    let mut model: Box<dyn PrefixModel> = match args.backend {
        BackendKind::Cpu => {
            let cpu = CpuBackend::new(args.threads)?.with_precision(args.precision.into());
            Box::new(PrefixCaches::new(Transformer::new(cpu, &file.weights)?, context, sessions)?)
        }
        BackendKind::Gpu => Box::new(PrefixCaches::new(Transformer::new(args.device.open_gpu()?, &file.weights)?, context, sessions)?),
    };
    // `/generate`'s json_schema, regex and ebnf compile against this.
    let vocabulary = Vocabulary::new(&file.tokenizer, config.vocab_size)?;
    let draft = args.draft.as_deref().map(open).transpose()?;
    let pool_opts = EngineOptions {
        target: args.device.device(args.backend, args.threads, args.precision),
        draft: Device::Cpu { threads: args.threads, precision: Precision::Fast },
        context,
        ..EngineOptions::default()
    };
    let parallel = args.parallel;
    let openai = OpenAi::start(
        move || block_on(Pool::load(file, draft, &pool_opts, parallel)),
        OpenAiOptions { model: model_name(&args.target), queue: args.queue, max_body: args.max_body, timeout, max_tokens: args.max_new_tokens },
    )?;
    let bound = bind(&args.listen)?;
    eprintln!(
        "serving {} on {}: OpenAI endpoints {parallel} sequences at once{}, /generate {sessions} sessions, of {context} tokens each",
        args.target.display(),
        model.backend_name(),
        if args.draft.is_some() { " with a draft" } else { "" },
    );
    // The one line on stdout, for scripts and tests that start the server on port 0.
    println!("listening on http://{}", bound.addr());
    let _ = std::io::stdout().flush();
    bound.serve(model.as_mut(), info, &opts, Some(&vocabulary), Some(openai))
}

/// The model's name in OpenAI answers: its file or directory name.
fn model_name(path: &std::path::Path) -> String {
    path.file_stem().map_or_else(|| path.display().to_string(), |s| s.to_string_lossy().into_owned())
}
