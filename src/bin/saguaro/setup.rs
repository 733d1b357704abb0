//! Turning command-line options into a ready engine: models loaded, backends built, the draft on
//! its worker.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use futures::executor::block_on;
use web_time::Instant;

use saguaro::backend::cpu::{CpuBackend, Precision};
use saguaro::backend::gpu::{GpuBackend, GpuOptions};
use saguaro::decode::{generate_ar, generate_sd, generate_ssd, Backup, DraftWorker, Fanout, Generation, Mode, Request, Sink, SpecConfig};
use saguaro::model::load::{open, ModelFile};
use saguaro::model::runner::{Lm, Runner};
use saguaro::model::tokenizer::{apply_chat_template, Tokenizer};
use saguaro::model::transformer::Transformer;
use saguaro::model::weights::ModelWeights;
use saguaro::sampling::SamplingParams;
use saguaro::{Error, Result};

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
}

impl DeviceArgs {
    pub fn open_gpu(&self) -> Result<GpuBackend> {
        block_on(GpuBackend::new(GpuOptions { adapter: self.adapter.clone(), ..Default::default() }))
    }
}

impl BackendKind {
    /// A runner for `w` on this backend, with a KV cache of `capacity` tokens.
    pub fn runner(self, w: &ModelWeights, threads: usize, precision: Precision, dev: &DeviceArgs, capacity: usize) -> Result<Box<dyn Lm + Send>> {
        Ok(match self {
            BackendKind::Cpu => {
                let cpu = CpuBackend::new(threads)?.with_precision(precision);
                Box::new(Runner::new(Transformer::new(cpu, w)?, capacity)?)
            }
            BackendKind::Gpu => {
                Box::new(Runner::new(Transformer::new(dev.open_gpu()?, w)?, capacity)?)
            }
        })
    }
}

#[derive(Args)]
pub struct EngineArgs {
    /// Target model: a .gguf file or a Hugging Face directory (config.json, *.safetensors, tokenizer.json).
    #[arg(long)]
    pub target: PathBuf,
    /// Draft model with the target's vocabulary (enables sd/ssd; without it the target drafts for itself).
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
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// CPU threads for the draft (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub draft_threads: usize,
    /// Activation precision of the target on the CPU: exact (two 8-bit parts, logits within 0.003
    /// of an f32 computation) or fast (one 8-bit part as llama.cpp uses: less work per token,
    /// logits off by up to about 0.5, so greedy output can differ from the exact one).
    #[arg(long, value_enum, default_value_t = PrecisionArg::Exact)]
    pub precision: PrecisionArg,
    /// Activation precision of the draft on the CPU: fast (the default: the target verifies every
    /// proposal, so output is unchanged) or exact.
    #[arg(long, value_enum, default_value_t = PrecisionArg::Fast)]
    pub draft_precision: PrecisionArg,
    /// Draft tokens per round (K).
    #[arg(long, default_value_t = 4)]
    pub spec_k: usize,
    /// SSD fan-out: uniform:F (F candidates per outcome), geometric (the paper's allocation from
    /// the measured acceptance rate), or top-p:P (candidate sets holding draft mass P, dynamic budget).
    #[arg(long, default_value = "uniform:2")]
    pub fanout: Fanout,
    /// Saguaro sampling factor C in [0, 1] (temperature > 0): the draft scales down its own top
    /// candidates so rejections land on cached bonus tokens more often. 1 = off.
    #[arg(long, default_value_t = 1.0)]
    pub saguaro_c: f32,
    /// SSD on a cache miss: jit (draft K tokens now) or fast (verify the bonus token alone).
    #[arg(long, default_value = "jit")]
    pub backup: Backup,
    /// KV-cache size in tokens (prompt + output), capped by the model's context length.
    #[arg(long, default_value_t = 4096)]
    pub context: usize,
}

#[derive(Args)]
pub struct SamplingArgs {
    /// Maximum number of tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 means greedy (deterministic).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Random seed: the same seed gives the same output.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams { temperature: self.temperature, top_k: self.top_k, top_p: self.top_p, seed: self.seed }
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

fn runner(w: &ModelWeights, kind: BackendKind, threads: usize, precision: Precision, dev: &DeviceArgs, capacity: usize, role: &str) -> Result<Box<dyn Lm + Send>> {
    let t = Instant::now();
    let lm = kind.runner(w, threads, precision, dev, capacity)?;
    eprintln!("{role} on {} ({:.0} ms)", lm.backend_name(), t.elapsed().as_secs_f64() * 1000.0);
    Ok(lm)
}

/// A draft must speak the target's vocabulary: token ids, not text, pass between them.
fn check_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<()> {
    let n = target.vocab_size();
    if draft.vocab_size() != n {
        return Err(Error::IncompatibleDraft(format!(
            "the target's tokenizer has {n} tokens, the draft's {}",
            draft.vocab_size()
        )));
    }
    if let Some(id) = (0..n as u32).find(|&id| target.id_to_token(id) != draft.id_to_token(id)) {
        return Err(Error::IncompatibleDraft(format!(
            "token {id} is {:?} for the target but {:?} for the draft",
            target.id_to_token(id),
            draft.id_to_token(id)
        )));
    }
    Ok(())
}

pub struct Engine {
    target_file: ModelFile,
    target: Box<dyn Lm + Send>,
    /// The draft for SD, on the caller's thread.
    sd_draft: Option<Box<dyn Lm + Send>>,
    /// The draft for SSD, on its own worker.
    ssd_draft: Option<DraftWorker>,
    pub spec: SpecConfig,
}

impl Engine {
    /// Load the models and build what `modes` need, with a KV cache for prompts plus
    /// `max_tokens` of output up to `--context`.
    pub fn load_modes(args: &EngineArgs, modes: &[Mode], max_tokens: usize) -> Result<Engine> {
        let spec = SpecConfig::new(args.spec_k, args.fanout.clone(), args.saguaro_c, args.backup);
        spec.validate()?;
        let target_file = load(&args.target, "target")?;
        let draft_file = args.draft.as_deref().map(|p| load(p, "draft")).transpose()?;
        if let Some(d) = &draft_file {
            check_vocab(&target_file.tokenizer, &d.tokenizer)?;
        }
        let context = args.context.min(target_file.weights.config.context_length);
        if max_tokens >= context {
            return Err(Error::InvalidArgument(format!("--max-tokens {max_tokens} does not fit the context of {context} tokens")));
        }
        let scratch = spec.draft_scratch();
        let capacity = context + scratch;
        let target = runner(&target_file.weights, args.backend, args.threads, args.precision.into(), &args.device, capacity, "target")?;
        let draft_weights = &draft_file.as_ref().unwrap_or(&target_file).weights;
        let draft = |role| runner(draft_weights, args.draft_backend, args.draft_threads, args.draft_precision.into(), &args.device, capacity, role);
        let sd_draft = modes.contains(&Mode::Sd).then(|| draft("SD draft")).transpose()?;
        let ssd_draft = if modes.contains(&Mode::Ssd) { Some(DraftWorker::new(draft("SSD draft")?)?) } else { None };
        Ok(Engine { target_file, target, sd_draft, ssd_draft, spec })
    }

    pub fn load(args: &EngineArgs, mode: Mode, max_tokens: usize) -> Result<Engine> {
        Engine::load_modes(args, &[mode], max_tokens)
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.target_file.tokenizer
    }

    /// Tokenize a prompt, wrapped as a user message in the model's chat template if `chat`.
    pub fn encode(&self, text: &str, chat: bool) -> Result<Vec<u32>> {
        let tok = self.tokenizer();
        if !chat {
            return tok.encode(text);
        }
        let template = self
            .target_file
            .chat_template
            .as_deref()
            .ok_or_else(|| Error::InvalidArgument("--chat: the model has no chat template".into()))?;
        tok.encode(&apply_chat_template(template, None, text, tok.bos_token().as_deref(), tok.eos_token().as_deref())?)
    }

    pub async fn generate(
        &mut self,
        mode: Mode,
        prompt: &[u32],
        sampling: &SamplingParams,
        max_tokens: usize,
        sink: Sink<'_>,
    ) -> Result<Generation> {
        let req = Request {
            prompt: prompt.to_vec(),
            max_tokens,
            sampling: *sampling,
            stop: self.target_file.tokenizer.eos_ids().to_vec(),
        };
        let target = self.target.as_mut();
        match mode {
            Mode::Ar => generate_ar(target, &req, sink).await,
            Mode::Sd => {
                let draft = self.sd_draft.as_deref_mut().ok_or_else(|| Error::InvalidArgument("SD draft not loaded".into()))?;
                generate_sd(target, draft, &req, &self.spec, sink).await
            }
            Mode::Ssd => {
                let draft = self.ssd_draft.as_mut().ok_or_else(|| Error::InvalidArgument("SSD draft not loaded".into()))?;
                generate_ssd(target, draft, &req, &self.spec, sink).await
            }
        }
    }
}
