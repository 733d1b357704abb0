//! Turning command-line options into a ready [`Engine`]: the options map onto the library's
//! [`EngineOptions`]; loading, placement and decoding are the library's.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use futures::executor::block_on;
use web_time::Instant;

use saguaro::backend::cpu::Precision;
use saguaro::backend::gpu::{GpuBackend, GpuOptions};
use saguaro::decode::{Backup, Fanout, Mode, SpecConfig};
use saguaro::engine::{Device, Engine, EngineOptions};
use saguaro::model::load::{open, ModelFile};
use saguaro::sampling::SamplingParams;
use saguaro::Result;

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

impl EngineArgs {
    fn device(&self, kind: BackendKind, threads: usize, precision: PrecisionArg) -> Device {
        match kind {
            BackendKind::Cpu => Device::Cpu { threads, precision: precision.into() },
            BackendKind::Gpu => Device::Gpu { adapter: self.device.adapter.clone() },
        }
    }

    /// Load the models and build an engine ready for `modes`.
    pub fn engine(&self, modes: &[Mode]) -> Result<Engine> {
        let opts = EngineOptions {
            target: self.device(self.backend, self.threads, self.precision),
            draft: self.device(self.draft_backend, self.draft_threads, self.draft_precision),
            spec: SpecConfig::new(self.spec_k, self.fanout.clone(), self.saguaro_c, self.backup),
            context: self.context,
            modes: modes.to_vec(),
            ..EngineOptions::default()
        };
        opts.spec.validate()?;
        let target = load(&self.target, "target")?;
        let draft = self.draft.as_deref().map(|p| load(p, "draft")).transpose()?;
        let t = Instant::now();
        let engine = block_on(Engine::new(target, draft, &opts))?;
        eprintln!("target on {} ({:.0} ms to place)", engine.target_backend(), t.elapsed().as_secs_f64() * 1000.0);
        Ok(engine)
    }
}
