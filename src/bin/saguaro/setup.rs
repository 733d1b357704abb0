//! Turning command-line options into a ready [`Engine`]: the options map onto the library's
//! [`EngineOptions`]; loading, placement and decoding are the library's.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, ValueEnum};
use futures::executor::block_on;
use web_time::Instant;

use saguaro::backend::cpu::Precision;
use saguaro::backend::KvCache;
use saguaro::backend::gpu::{GpuBackend, GpuOptions};
use saguaro::decode::{Backup, Fanout, Mode, NgramConfig, SpecConfig, DEFAULT_CONFIDENCE, DEFAULT_DRAFT_CANDIDATES};
use saguaro::grammar::GrammarSpec;
use saguaro::pool::Pool;
use saguaro::engine::{Device, Engine, EngineOptions, DEFAULT_CONTEXT, DEFAULT_DRAFT_HEAD, DEFAULT_DRAFT_QUANT, DEFAULT_MAX_TOKENS};
use saguaro::storage::quant::DType;
use saguaro::model::slim::check_quant;
use saguaro::model::load::{open, ModelFile};
use saguaro::remote::client::{DEFAULT_RETRIES, DEFAULT_TIMEOUT, DEFAULT_TOP_N};
use saguaro::remote::{RemoteOptions, RemoteTarget};
use saguaro::sampling::SamplingParams;
use saguaro::{Error, Result};

/// A decoding mode, or `auto`: the one the engine measured fastest at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeArg(pub Option<Mode>);

impl FromStr for ModeArg {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(ModeArg(None)),
            _ => s.parse().map(|m| ModeArg(Some(m))).map_err(|_| Error::InvalidArgument(format!("mode '{s}': expected auto, {}", Mode::names("or")))),
        }
    }
}

impl fmt::Display for ModeArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(m) => m.fmt(f),
            None => f.write_str("auto"),
        }
    }
}

/// A format to requantize the draft to, or `none`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftQuantArg(pub Option<DType>);

impl FromStr for DraftQuantArg {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s == "none" {
            return Ok(DraftQuantArg(None));
        }
        let q: DType = s.parse().map_err(|_| Error::InvalidArgument(format!("'{s}': expected none, q8_0, q4_0, q4_1 or q4_k")))?;
        check_quant(q)?;
        Ok(DraftQuantArg(Some(q)))
    }
}

impl fmt::Display for DraftQuantArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.map_or("none", DType::name))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// CPU threads.
    Cpu,
    /// The GPU through wgpu (Vulkan, Metal, DX12 or GL); see `saguaro devices`.
    Gpu,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    Fast,
    Exact,
}

impl From<PrecisionArg> for Precision {
    fn from(p: PrecisionArg) -> Precision {
        match p {
            PrecisionArg::Fast => Precision::Fast,
            PrecisionArg::Exact => Precision::Exact,
        }
    }
}

/// Which GPU a `--backend gpu` opens.
#[derive(Args, Clone)]
pub struct DeviceArgs {
    /// GPU adapter for `--backend gpu`: the first whose name contains this (case-insensitive);
    /// default: the one wgpu prefers for performance. `saguaro devices` lists them.
    #[arg(long)]
    pub adapter: Option<String>,
    /// Cached slots each GPU workgroup attends over when a decode, verification or tree step's
    /// attention is split into parts merged afterwards, so that a long context keeps a GPU's
    /// cores busy (0: never split); default: 128 on a GPU, unsplit on an adapter of type CPU
    /// (lavapipe). Rounded up to a multiple of 64, and longer where a full
    /// context would take more than 64 parts.
    #[arg(long)]
    pub attention_split: Option<usize>,
    /// Threads of each GPU workgroup in the matmul of a decode, verification or tree step (1-64);
    /// default: one subgroup on an adapter of type CPU whose subgroup size is fixed (lavapipe: 8),
    /// else 64.
    #[arg(long)]
    pub matvec_threads: Option<u32>,
    /// How a GPU model's KV cache stores K and V: f16 (half the memory and half the bytes
    /// attention reads; top-5 logits stay within 0.02 of the fp32 reference on the golden tests)
    /// or f32. A CPU model's cache is f32.
    #[arg(long, default_value = "f16")]
    pub kv_cache: KvCache,
    /// Decode weights and multiply them in f16 in the GPU matmul of a decode, verification or
    /// tree step, adding up in f32 (the adapter must offer `shader-f16`; `saguaro devices` lists
    /// its features). Off by default: its logits lie about 5x further from the fp32 reference,
    /// and it is slower on lavapipe; `bench-kernels --backend gpu` times both paths.
    #[arg(long)]
    pub shader_f16: bool,
}

impl DeviceArgs {
    /// The device `kind` names, with `threads` and `precision` on the CPU.
    pub fn device(&self, kind: BackendKind, threads: usize, precision: PrecisionArg) -> Device {
        match kind {
            BackendKind::Cpu => Device::Cpu { threads, precision: precision.into() },
            BackendKind::Gpu => Device::Gpu {
                adapter: self.adapter.clone(),
                attention_split: self.attention_split,
                matvec_threads: self.matvec_threads,
                kv_cache: self.kv_cache,
                shader_f16: self.shader_f16,
            },
        }
    }
}

impl DeviceArgs {
    pub fn open_gpu(&self) -> Result<GpuBackend> {
        self.open_gpu_with(GpuOptions::default())
    }

    /// The GPU with `opts`, on this adapter.
    pub fn open_gpu_with(&self, opts: GpuOptions) -> Result<GpuBackend> {
        block_on(GpuBackend::new(GpuOptions {
            adapter: self.adapter.clone(),
            attention_split: self.attention_split,
            matvec_threads: self.matvec_threads,
            kv_cache: self.kv_cache,
            shader_f16: self.shader_f16 || opts.shader_f16,
            ..opts
        }))
    }
}

#[derive(Args)]
pub struct EngineArgs {
    /// Target model: a .gguf file or a Hugging Face directory (config.json, *.safetensors, tokenizer.json),
    /// or a server, http://HOST:PORT, that speaks SGLang's /generate (`saguaro serve`, or SGLang);
    /// a server target needs a --draft model, whose tokenizer then encodes the prompt.
    #[arg(long)]
    pub target: PathBuf,
    /// Draft model with the target's vocabulary (enables sd/ssd; without it the target drafts for
    /// itself), or `ngram`: prompt lookup, proposing what followed the text's last few tokens where
    /// they occurred before (no draft model; sd only).
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// Where the target runs.
    #[arg(long, value_enum, default_value_t = BackendKind::Cpu)]
    pub backend: BackendKind,
    /// Where the draft runs. SSD gains most with the target on the GPU and the draft on the CPU.
    #[arg(long, value_enum, default_value_t = BackendKind::Cpu)]
    pub draft_backend: BackendKind,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// CPU threads for the target (0 = all cores).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub threads: usize,
    /// CPU threads for the draft (0 = all cores).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub draft_threads: usize,
    /// Activation precision of the target on the CPU: exact (16-bit activations, logits within
    /// 0.003 of an f32 computation) or fast (8-bit as llama.cpp uses: a little less work per
    /// token, logits off by up to about 0.5, so greedy output can differ from the exact one).
    #[arg(long, value_enum, default_value_t = PrecisionArg::Exact)]
    pub precision: PrecisionArg,
    /// Activation precision of the draft on the CPU: fast (the default: the target verifies every
    /// proposal, so output is unchanged) or exact.
    #[arg(long, value_enum, default_value_t = PrecisionArg::Fast)]
    pub draft_precision: PrecisionArg,
    /// Requantize the draft's matrices at load to none (as stored), q8_0, q4_0, q4_1 or q4_k,
    /// where that is smaller than their own format (q4_k rows that are not whole 256-value blocks
    /// are padded with zeros to whole blocks for a CPU draft and take q4_1 on the GPU; the
    /// embedding table is left as is, the output head is requantized too). A draft
    /// step reads every matrix, so a smaller draft steps faster; it also proposes a little worse.
    /// The output is the target's either way.
    #[arg(long, default_value_t = DraftQuantArg(DEFAULT_DRAFT_QUANT))]
    pub draft_quant: DraftQuantArg,
    /// Score only the draft's N most frequent tokens (the lowest ids of a byte-level BPE
    /// vocabulary, plus the chat and end-of-text tokens); 0 = the whole vocabulary. The output
    /// head is a large part of a small draft's bytes; the draft then never proposes the other
    /// tokens, and the output is the target's either way.
    #[arg(long, default_value_t = DEFAULT_DRAFT_HEAD.unwrap_or(0), allow_negative_numbers = true)]
    pub draft_head: usize,
    /// Draft tokens per round (K). Default: chosen by measurement in mode auto, else 4.
    #[arg(long, allow_negative_numbers = true)]
    pub spec_k: Option<usize>,
    /// SSD fan-out: uniform:F (F candidates per outcome), geometric (the paper's allocation from
    /// the measured acceptance rate), or top-p:P (candidate sets holding draft mass P, dynamic budget).
    #[arg(long, default_value = "uniform:2")]
    pub fanout: Fanout,
    /// Saguaro sampling factor C in [0, 1] (temperature > 0): the draft scales down its own top
    /// candidates so rejections land on cached bonus tokens more often. 1 = off.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub saguaro_c: f32,
    /// SD with a draft model: stop a round's drafting at a position where the draft's likeliest
    /// token has less than this probability (0 = always draft K). What it drew there would likely
    /// be rejected; stopping saves its verification and the draft steps after it. The output is
    /// the target's either way.
    #[arg(long, default_value_t = DEFAULT_CONFIDENCE, allow_negative_numbers = true)]
    pub draft_confidence: f32,
    /// When sampling: the draft draws each token among its N likeliest (1-512), so only their ids
    /// and logits leave its backend, not a row over the whole vocabulary. The output is the
    /// target's either way; more candidates keep more of the draft's tail for acceptance.
    #[arg(long, default_value_t = DEFAULT_DRAFT_CANDIDATES, value_name = "N")]
    pub draft_candidates: usize,
    /// SSD on a cache miss: jit (draft K tokens now) or fast (verify the bonus token alone).
    #[arg(long, default_value = "jit")]
    pub backup: Backup,
    /// KV-cache size in tokens (prompt + output), capped by the model's context length.
    #[arg(long, default_value_t = DEFAULT_CONTEXT, allow_negative_numbers = true)]
    pub context: usize,
    /// Server target: seconds one request may take before it counts as failed.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT.as_secs_f64(), allow_negative_numbers = true)]
    pub server_timeout: f64,
    /// Server target: further attempts after a failed request (with a doubling wait from 100 ms).
    #[arg(long, default_value_t = DEFAULT_RETRIES, allow_negative_numbers = true)]
    pub server_retries: u32,
    /// Server target: likeliest tokens returned per position for sampled verification; sampling
    /// is exact, and allowed, only with --top-k between 1 and this.
    #[arg(long, default_value_t = DEFAULT_TOP_N, allow_negative_numbers = true)]
    pub server_top_n: usize,
}

// Numeric options take `allow_negative_numbers`: clap would read `-1` as an unknown flag, while
// as a value it reaches the check that names the option and its range.
#[derive(Args)]
pub struct SamplingArgs {
    /// Maximum number of tokens to generate.
    #[arg(long, default_value_t = DEFAULT_MAX_TOKENS, allow_negative_numbers = true)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 means greedy (deterministic).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Random seed: the same seed gives the same output.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub seed: u64,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams { temperature: self.temperature, top_k: self.top_k, top_p: self.top_p, seed: self.seed }
    }
}

/// Structured output: at most one of these holds the output to a format (docs/structured-output.md).
#[derive(Args)]
pub struct GrammarArgs {
    /// Hold the output to a JSON Schema: a file holding it, or the schema itself as JSON.
    #[arg(long, value_name = "FILE_OR_JSON", group = "constraint")]
    pub json_schema: Option<String>,
    /// Hold the output to any JSON object (`--json` names the output's own format).
    #[arg(long, group = "constraint")]
    pub json_object: bool,
    /// Hold the whole output to a regular expression.
    #[arg(long, value_name = "R", group = "constraint")]
    pub regex: Option<String>,
    /// Hold the output to a Lark grammar (llguidance's dialect) read from FILE.
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub grammar: Option<PathBuf>,
}

impl GrammarArgs {
    pub fn spec(&self) -> Result<Option<GrammarSpec>> {
        let read = |path: &Path| std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.display().to_string(), source });
        if let Some(s) = &self.json_schema {
            let text = match s.trim_start().starts_with('{') {
                true => s.clone(),
                false => read(Path::new(s))?,
            };
            let schema = serde_json::from_str(&text).map_err(|e| Error::InvalidGrammar(format!("JSON schema: not JSON: {e}")))?;
            return Ok(Some(GrammarSpec::JsonSchema(schema)));
        }
        if self.json_object {
            return Ok(Some(GrammarSpec::JsonObject));
        }
        if let Some(r) = &self.regex {
            return Ok(Some(GrammarSpec::Regex(r.clone())));
        }
        self.grammar.as_deref().map(|p| read(p).map(GrammarSpec::Lark)).transpose()
    }
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

impl EngineArgs {
    pub fn spec(&self) -> SpecConfig {
        SpecConfig {
            confidence: self.draft_confidence,
            draft_candidates: self.draft_candidates,
            ..SpecConfig::new(self.spec_k.unwrap_or(4), self.fanout.clone(), self.saguaro_c, self.backup)
        }
    }

    /// The K a generation must use: the one given, else none (the engine's, or its choice).
    pub fn fixed_spec(&self) -> Option<SpecConfig> {
        self.spec_k.map(|_| self.spec())
    }

    /// Whether `--draft ngram` asks for prompt lookup.
    pub fn lookup(&self) -> bool {
        self.draft.as_deref() == Some(Path::new("ngram"))
    }

    fn device(&self, kind: BackendKind, threads: usize, precision: PrecisionArg) -> Device {
        self.device.device(kind, threads, precision)
    }

    /// The target's address when it is a server.
    pub fn server(&self) -> Option<&str> {
        self.target.to_str().filter(|t| t.starts_with("http://"))
    }

    /// An engine over the server target at `url`, with the draft loaded here.
    fn remote(&self, url: &str, opts: &EngineOptions) -> Result<Engine> {
        if !(self.server_timeout.is_finite() && self.server_timeout > 0.0) {
            return Err(Error::InvalidOption { option: "server_timeout", reason: format!("must be a positive number of seconds, got {}", self.server_timeout) });
        }
        let draft = match self.draft.as_deref().filter(|_| !self.lookup()) {
            Some(p) => load(p, "draft")?,
            None => return Err(Error::InvalidArgument("a server target (--target http://...) needs a --draft model".into())),
        };
        let remote = RemoteOptions {
            timeout: Duration::from_secs_f64(self.server_timeout),
            retries: self.server_retries,
            top_n: self.server_top_n,
            ..RemoteOptions::new(url)
        };
        let target = block_on(RemoteTarget::connect(remote, &draft.weights.config))?;
        eprintln!("target: {} at {url}", target.info().model_path);
        block_on(Engine::with_remote_target(target, draft, opts))
    }

    /// Load the models and build an engine ready for `modes` (`auto` among them: every mode).
    pub fn engine(&self, modes: &[ModeArg]) -> Result<Engine> {
        self.build(modes, self.spec())
    }

    /// As [`EngineArgs::engine`], with room for K draft tokens per round whatever `--spec-k` says.
    pub fn engine_with_k(&self, modes: &[ModeArg], k: usize) -> Result<Engine> {
        self.build(modes, SpecConfig { k, ..self.spec() })
    }

    /// A [`Pool`] of `parallel` sequences over the target and draft (no server target).
    pub fn pool(&self, parallel: usize) -> Result<Pool> {
        let opts = self.options(&[], self.spec())?;
        if self.server().is_some() {
            return Err(Error::InvalidArgument("several sequences at once run on a local target, not a server".into()));
        }
        let target = load(&self.target, "target")?;
        let draft = self.draft.as_deref().map(|p| load(p, "draft")).transpose()?;
        let t = Instant::now();
        let pool = block_on(Pool::load(target, draft, &opts, parallel))?;
        eprintln!("{parallel} sequences at once ({:.0} ms to place and time)", t.elapsed().as_secs_f64() * 1000.0);
        if let Some(c) = pool.costs() {
            let ms = |v: &[(usize, f64)]| v.iter().map(|(n, ms)| format!("{n}: {ms:.0}")).collect::<Vec<_>>().join(", ");
            eprintln!("forward ms by rows: target {}; draft {}", ms(&c.target), ms(&c.draft));
        }
        Ok(pool)
    }

    fn options(&self, modes: &[ModeArg], spec: SpecConfig) -> Result<EngineOptions> {
        let modes: Vec<Mode> = match modes.iter().map(|m| m.0).collect::<Option<Vec<_>>>() {
            Some(fixed) => fixed,
            None => Vec::new(),
        };
        let opts = EngineOptions {
            target: self.device(self.backend, self.threads, self.precision),
            draft: self.device(self.draft_backend, self.draft_threads, self.draft_precision),
            spec,
            context: self.context,
            modes,
            lookup: self.lookup().then(NgramConfig::default),
            draft_quant: self.draft_quant.0,
            draft_head: (self.draft_head > 0).then_some(self.draft_head),
            ..EngineOptions::default()
        };
        // Checked before the models load, so a bad value is reported at once.
        opts.validate()?;
        Ok(opts)
    }

    fn build(&self, modes: &[ModeArg], spec: SpecConfig) -> Result<Engine> {
        let opts = self.options(modes, spec)?;
        if let Some(url) = self.server() {
            return self.remote(url, &opts);
        }
        let target = load(&self.target, "target")?;
        let draft = self.draft.as_deref().filter(|_| !self.lookup()).map(|p| load(p, "draft")).transpose()?;
        let t = Instant::now();
        let engine = block_on(Engine::new(target, draft, &opts))?;
        eprintln!("target on {} ({:.0} ms to place)", engine.target_backend(), t.elapsed().as_secs_f64() * 1000.0);
        if let Some(c) = engine.choice() {
            let verify = c.costs.verify_ms.iter().map(|(n, ms)| format!("{n}: {ms:.0}")).collect::<Vec<_>>().join(", ");
            eprintln!(
                "mode auto: {} with K={} (expected {:.2}x AR at acceptance {:.2}; decode {:.0} ms, forward by tokens {verify} ms, draft step {:.0} ms)",
                c.mode, c.k, c.expected_speedup, c.acceptance, c.costs.decode_ms, c.costs.draft_step_ms
            );
        }
        Ok(engine)
    }
}
