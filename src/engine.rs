//! The engine: a target model and an optional draft, placed on backends, with the tokenizer and
//! chat template, ready to generate text in any mode. The CLI and the JS API are thin front-ends
//! over it; neither loads, places or detokenizes anything itself.
//!
//! Models arrive as [`ModelFile`]s, however they were read (a memory map natively, bytes or
//! downloaded pieces in the browser), or, for the target, already placed on its device
//! ([`Target::Placed`]: streamed to the GPU as it downloaded). Once the runners are built the
//! engine keeps only what it still needs: a model bound for the GPU has been uploaded, so its host
//! copy is freed here.

use crate::backend::cpu::{CpuBackend, Precision};
use crate::backend::{Backend, KvCache};
use crate::decode::{
    generate_ar, generate_sd, generate_sd_with, generate_ssd, Choice, Costs, DraftCosts, DraftWorker, Fanout, FinishReason,
    Mode, NgramConfig, PromptLookup, Request, RoundTimes, SpecConfig, Stats, WorkerDrafter,
};
use crate::decode::spec::judged;
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::load::ModelFile;
use crate::storage::quant::DType;
use crate::model::slim::{check_quant, frequent_tokens, Slimming};
use crate::model::stream::StreamedModel;
use crate::model::runner::{BoxedLm, Lm, Runner};
use crate::model::tokenizer::{apply_chat_template, ChatMessage, StreamDecoder, Tokenizer};
use crate::model::transformer::Transformer;
use crate::model::weights::ModelWeights;
use crate::sampling::SamplingParams;

/// Where a model runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Device {
    /// CPU threads (0 = all cores; in wasm the calling thread only).
    Cpu { threads: usize, precision: Precision },
    /// The GPU through wgpu (WebGPU in the browser): the adapter whose name contains `adapter`,
    /// or the preferred one; `attention_split` and `matvec_threads` as in `GpuOptions` (`None`: by
    /// adapter); the KV cache stored as `kv_cache` says; f16 arithmetic in the decode matmul where
    /// `shader_f16`.
    Gpu { adapter: Option<String>, attention_split: Option<usize>, matvec_threads: Option<u32>, kv_cache: KvCache, shader_f16: bool },
}

impl Device {
    /// The CPU with all cores at the given precision.
    pub fn cpu(precision: Precision) -> Self {
        Device::Cpu { threads: 0, precision }
    }

    /// The options that open this GPU; `None` for the CPU.
    #[cfg(feature = "gpu")]
    pub fn gpu_options(&self) -> Option<crate::backend::gpu::GpuOptions> {
        match self {
            Device::Cpu { .. } => None,
            Device::Gpu { adapter, attention_split, matvec_threads, kv_cache, shader_f16 } => Some(crate::backend::gpu::GpuOptions {
                adapter: adapter.clone(),
                attention_split: *attention_split,
                matvec_threads: *matvec_threads,
                kv_cache: *kv_cache,
                shader_f16: *shader_f16,
                ..Default::default()
            }),
        }
    }

    /// A model instance for `w` on this device with a KV cache of `capacity` tokens.
    pub async fn runner(&self, w: &ModelWeights, capacity: usize) -> Result<BoxedLm> {
        match self {
            Device::Cpu { threads, precision } => {
                let cpu = CpuBackend::new(*threads)?.with_precision(*precision);
                Ok(Box::new(Runner::new(Transformer::new(cpu, w)?, capacity)?))
            }
            #[cfg(feature = "gpu")]
            Device::Gpu { .. } => {
                let gpu = crate::backend::gpu::GpuBackend::new(self.gpu_options().unwrap_or_default()).await?;
                Ok(Box::new(Runner::new(Transformer::new(gpu, w)?, capacity)?))
            }
            #[cfg(not(feature = "gpu"))]
            Device::Gpu { .. } => Err(Error::Unsupported("this build has no GPU backend (feature `gpu`)".into())),
        }
    }
}

/// The target as an engine takes it: a model file to place as the options say, or a model
/// already on its device.
#[allow(clippy::large_enum_variant, reason = "made once per engine and taken apart at once")]
pub enum Target {
    File(ModelFile),
    Placed(PlacedTarget),
}

/// A target already on its device (one streamed there as it downloaded, see
/// [`crate::model::stream`]), with its tokenizer. It cannot draft for itself: SD and SSD take a
/// draft model.
pub struct PlacedTarget {
    pub lm: BoxedLm,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<String>,
}

impl PlacedTarget {
    /// `m` as the target of an engine built with `opts`; `boxed` boxes its runner (whether that
    /// is `Send` depends on the backend, so the caller, who knows it, does).
    pub fn new<B: Backend>(m: StreamedModel<B>, opts: &EngineOptions, boxed: impl FnOnce(Runner<B>) -> BoxedLm) -> Result<PlacedTarget> {
        let context = target_context(&m.model.config, opts);
        let lm = boxed(Runner::new(m.model, context)?);
        Ok(PlacedTarget { lm, tokenizer: m.tokenizer, chat_template: m.chat_template })
    }
}

/// The target's KV slots: exactly the context window (it needs no speculation scratch).
fn target_context(config: &ModelConfig, opts: &EngineOptions) -> usize {
    opts.context.min(config.context_length)
}

/// How to build an engine.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub target: Device,
    pub draft: Device,
    pub spec: SpecConfig,
    /// KV-cache size in tokens (prompt + output), capped by the target's context length.
    pub context: usize,
    /// The modes to prepare a draft for (an SD draft runs on the caller's thread, an SSD draft
    /// on its own worker). Empty: every mode the models allow.
    pub modes: Vec<Mode>,
    /// Where the SSD draft runs: its own thread natively; `false` runs it inline (the same
    /// tokens, no overlap). The browser supplies a Web Worker instead ([`Engine::attach_draft`]).
    pub ssd_thread: bool,
    /// Draft by prompt lookup (no draft model; SD only) instead of with a model.
    pub lookup: Option<NgramConfig>,
    /// With a draft and more than one mode prepared: time a few target and draft steps at load
    /// (about a second) and make the fastest mode and K for this placement the default.
    pub auto: bool,
    /// Requantize the draft model's matrices at load to this format (q8_0, q4_0, q4_1 or q4_k)
    /// where it is smaller than theirs; `None`: as stored. A faster draft that proposes a little
    /// worse; the output is the target's either way. See [`crate::model::slim`].
    pub draft_quant: Option<DType>,
    /// Cut the draft model's output head to its `n` most frequent tokens (plus the added and
    /// end-of-generation tokens); the draft never proposes the others. `None`: the whole vocabulary.
    pub draft_head: Option<usize>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            target: Device::cpu(Precision::Exact),
            draft: Device::cpu(Precision::Fast),
            spec: SpecConfig::default(),
            context: DEFAULT_CONTEXT,
            modes: Vec::new(),
            ssd_thread: cfg!(not(target_arch = "wasm32")),
            lookup: None,
            auto: true,
            draft_quant: DEFAULT_DRAFT_QUANT,
            draft_head: DEFAULT_DRAFT_HEAD,
        }
    }
}

/// What to generate from; the mode, limits and sampling are in [`GenerateOptions`].
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Plain text, tokenized as is.
    Text(String),
    /// A conversation rendered with the model's chat template.
    Chat(Vec<ChatMessage>),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Default: SSD when the engine has a draft, AR otherwise.
    pub mode: Option<Mode>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// SD/SSD settings for this call (K, fan-out, ...); default: the engine's. A K whose
    /// speculation needs more draft KV room than the engine was built for is refused.
    pub spec: Option<SpecConfig>,
}

impl GenerateOptions {
    /// Every value in its range, or an [`Error::InvalidOption`] naming the first that is not.
    pub fn validate(&self) -> Result<()> {
        if self.max_tokens == 0 {
            return Err(Error::option("max_tokens", "must be at least 1"));
        }
        self.sampling.validate()?;
        self.spec.as_ref().map_or(Ok(()), SpecConfig::validate)
    }
}

impl EngineOptions {
    /// Every value in its range, or an [`Error::InvalidOption`] naming the first that is not.
    pub fn validate(&self) -> Result<()> {
        if self.context == 0 {
            return Err(Error::option("context", "must be at least 1 token"));
        }
        self.draft_quant.map_or(Ok(()), check_quant)?;
        if self.draft_head == Some(0) {
            return Err(Error::option("draft_head", "must keep at least 1 token"));
        }
        self.spec.validate()
    }
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions { mode: None, max_tokens: DEFAULT_MAX_TOKENS, sampling: SamplingParams::default(), spec: None }
    }
}

/// The result of one generation (the CLI's `--json` object and the JS API's result).
#[derive(Clone, Debug, serde::Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename = "GenerateResult", rename_all = "camelCase"))]
pub struct Completion {
    pub text: String,
    /// Generated ids, including the stop token that ended generation.
    pub tokens: Vec<u32>,
    pub prompt_tokens: usize,
    pub finish: FinishReason,
    pub stats: Stats,
}

/// The loaded models, ready to generate. Reusable across generations, also after an error or a
/// cancelled generation.
pub struct Engine {
    tokenizer: Tokenizer,
    chat_template: Option<String>,
    target: BoxedLm,
    /// Whether a separate draft model was given (otherwise the target drafts for itself).
    separate_draft: bool,
    sd_draft: Option<BoxedLm>,
    ssd_draft: Option<DraftWorker>,
    /// SD drafts through `ssd_draft`'s worker (a draft in a browser Web Worker serving both
    /// modes), the engine holding no draft model of its own.
    sd_on_worker: bool,
    /// The target for SSD when it shares the CPU with its draft: on its part of the cores.
    ssd_target: Option<BoxedLm>,
    lookup: Option<NgramConfig>,
    spec: SpecConfig,
    /// The measured choice of mode and K, refined by the acceptance later generations see.
    choice: Option<Choice>,
    /// A target on a server: its request counters, and a handle for mode AR.
    remote: Option<Remote>,
    /// Whether the target computes on the CPU (for a draft attached later: does it run beside?).
    target_cpu: bool,
    /// [`EngineOptions::auto`].
    auto: bool,
}

struct Remote {
    link: crate::remote::RemoteLink,
    /// The server again, for mode AR: it generates on its own there.
    server: crate::remote::RemoteTarget,
}

/// Rounds a generation must run for its pace to count in the choice of mode.
const MIN_OBSERVED_ROUNDS: usize = 4;

/// Tokens remote AR generates at load to time the server's decode: enough that the one round
/// trip weighs little.
const AR_PROBE_TOKENS: usize = 16;

/// The draft model's defaults, measured with the Qwen 2.5 Coder pair on a 2-core CPU
/// (docs/measurements.md: "A cheaper draft"): Q4_K (its 896-value rows padded to 1,024 on the
/// CPU, Q4_1 elsewhere) and the 65,536 lowest token ids keep the 0.5B draft's acceptance on code
/// (0.85 as stored, 0.87 requantized) and read about 255 MB of weights per step instead of 392 MB.
/// KV-cache size in tokens (prompt + output) without the option, for every front-end (CLI, JS API):
/// room for a long code prompt and its answer, at a cost of at most 224 MiB of f32 K and V for
/// Qwen2.5-1.5B's 28 layers (half that as the GPU's f16), which wasm32's 4 GiB holds beside the model.
pub const DEFAULT_CONTEXT: usize = 4096;
/// Upper bound on generated tokens without the option, for every front-end.
pub const DEFAULT_MAX_TOKENS: usize = 256;
pub const DEFAULT_DRAFT_QUANT: Option<DType> = Some(DType::Q4K);
pub const DEFAULT_DRAFT_HEAD: Option<usize> = Some(65_536);

/// Per-token acceptance assumed before any generation has measured it: a model draft of the
/// target's family on code (measured 0.8-0.9), prompt lookup on text that partly copies its input.
const PRIOR_ACCEPTANCE: f64 = 0.8;
const PRIOR_LOOKUP_ACCEPTANCE: f64 = 0.6;

/// The per-token acceptance of a generation's rounds (accepted over judged draft tokens, see
/// [`judged`]) and the K most of them drafted (the longer of two as common), if it ran any.
fn rounds_seen(rounds: &[RoundTimes]) -> Option<(f64, usize)> {
    let judged_tokens: usize = rounds.iter().map(|r| judged(r.proposed, r.accepted)).sum();
    let accepted: usize = rounds.iter().map(|r| r.accepted).sum();
    let mut drafted = [0usize; 65];
    for r in rounds {
        drafted[r.proposed.min(64)] += 1;
    }
    let usual = (1..drafted.len()).max_by_key(|&k| drafted[k])?;
    (judged_tokens > 0).then(|| (accepted as f64 / judged_tokens as f64, usual))
}

/// SSD's threads (target, draft) when both models run on all the CPU's cores by default (0
/// threads each) and the draft on a thread of its own: SSD runs them at once, so they split the
/// cores rather than oversubscribe them. SD and AR run one model at a time, on all cores.
/// Thread counts given explicitly are left as they are.
fn cpu_split(opts: &EngineOptions) -> Option<(usize, usize)> {
    let all = |d: &Device| matches!(d, Device::Cpu { threads: 0, .. });
    if !(opts.ssd_thread && all(&opts.target) && all(&opts.draft)) {
        return None;
    }
    let n = std::thread::available_parallelism().ok()?.get();
    (n >= 2).then(|| (n - n / 2, n / 2))
}

/// What makes the draft model `d` cheaper under `opts`.
fn slimming(d: &ModelFile, opts: &EngineOptions) -> Slimming {
    let vocab = d.weights.config.vocab_size;
    let head = opts.draft_head.map(|n| frequent_tokens(&d.tokenizer, n, vocab)).filter(|t| t.len() < vocab);
    Slimming { quant: opts.draft_quant, head, pad_rows: matches!(opts.draft, Device::Cpu { .. }) }
}

/// A draft must speak the target's vocabulary: token ids, not text, pass between them.
pub fn check_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<()> {
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

/// The draft's runners for the modes `wants` names: one on `opts.draft` for SD, one on
/// `ssd_device` for SSD (on a thread of its own where `opts.ssd_thread`).
async fn draft_runners(
    weights: &ModelWeights,
    capacity: usize,
    opts: &EngineOptions,
    ssd_device: &Device,
    wants: impl Fn(Mode) -> bool,
) -> Result<(Option<BoxedLm>, Option<DraftWorker>)> {
    let sd = match wants(Mode::Sd) {
        true => Some(opts.draft.runner(weights, capacity).await?),
        false => None,
    };
    let ssd = match wants(Mode::Ssd) {
        true => {
            let lm = ssd_device.runner(weights, capacity).await?;
            Some(if opts.ssd_thread { DraftWorker::new(lm)? } else { DraftWorker::inline(lm) })
        }
        false => None,
    };
    Ok((sd, ssd))
}

impl Engine {
    /// Place `target` (and `draft`, if any) as `opts` say. Without a draft, SD and SSD draft with
    /// a second instance of the target.
    pub async fn new(target: ModelFile, draft: Option<ModelFile>, opts: &EngineOptions) -> Result<Engine> {
        Self::with_target_wrapper(Target::File(target), draft, opts, |lm| lm).await
    }

    /// Like [`Engine::new`], with the target model wrapped by `wrap` (the browser's wraps it to
    /// let the event loop run between forwards).
    pub async fn with_target_wrapper(
        target: Target,
        draft: Option<ModelFile>,
        opts: &EngineOptions,
        wrap: impl FnOnce(BoxedLm) -> BoxedLm,
    ) -> Result<Engine> {
        opts.validate()?;
        let (placed, target_weights, tokenizer, chat_template) = match target {
            Target::File(f) => (None, Some(f.weights), f.tokenizer, f.chat_template),
            Target::Placed(p) => (Some(p.lm), None, p.tokenizer, p.chat_template),
        };
        if let Some(d) = &draft {
            check_vocab(&tokenizer, &d.tokenizer)?;
        }
        if let Some(lookup) = &opts.lookup {
            lookup.validate()?;
            if draft.is_some() {
                return Err(Error::InvalidArgument("prompt lookup drafts without a draft model: give one or the other".into()));
            }
            if opts.modes.contains(&Mode::Ssd) {
                return Err(Error::InvalidArgument(lookup_ssd()));
            }
        }
        // Prompt lookup replaces the draft model.
        let wants = |m: Mode| opts.lookup.is_none() && (opts.modes.is_empty() || opts.modes.contains(&m));
        let mut target_lm = wrap(match (placed, &target_weights) {
            (Some(lm), _) => lm,
            (None, Some(w)) => opts.target.runner(w, target_context(&w.config, opts)).await?,
            (None, None) => unreachable!("a target is a file or placed"),
        });
        let capacity = Self::capacity(target_lm.config(), opts);
        let separate_draft = draft.is_some();
        // A draft model made cheaper, once for both its runners; the target drafting for itself
        // stays as it is (a placed target has no weights here to draft with).
        let slimmed = match &draft {
            Some(d) => Some(slimming(d, opts).apply(&d.weights)?),
            None => None,
        };
        let split = cpu_split(opts);
        let ssd_device = match (split, &opts.draft) {
            (Some((_, threads)), Device::Cpu { precision, .. }) => Device::Cpu { threads, precision: *precision },
            _ => opts.draft.clone(),
        };
        let (mut sd_draft, ssd_draft) = match slimmed.as_ref().or(target_weights.as_ref()) {
            Some(w) => draft_runners(w, capacity, opts, &ssd_device, wants).await?,
            None => (None, None),
        };
        let ssd_target = match (split, &opts.target, &target_weights) {
            (Some((threads, _)), Device::Cpu { precision, .. }, Some(w)) if ssd_draft.is_some() => {
                Some(Device::Cpu { threads, precision: *precision }.runner(w, target_context(&w.config, opts)).await?)
            }
            _ => None,
        };
        let several_modes = opts.modes.len() != 1;
        let choice = match (draft.is_some() || opts.lookup.is_some()) && opts.auto && several_modes {
            true if opts.lookup.is_some() => {
                let costs = Costs::measure(target_lm.as_mut(), None, false, 0).await?;
                Some(costs.choose(PRIOR_LOOKUP_ACCEPTANCE, None))
            }
            true if sd_draft.is_some() => {
                let cpu = |d: &Device| matches!(d, Device::Cpu { .. });
                let parallel = !(cpu(&opts.target) && cpu(&opts.draft));
                let draft_lm = sd_draft.as_deref_mut().map(|d| d as &mut dyn Lm);
                let costs = Costs::measure(target_lm.as_mut(), draft_lm, parallel, tree_rows(&opts.spec)).await?;
                Some(costs.choose(PRIOR_ACCEPTANCE, ssd_candidate(&ssd_draft, &opts.spec)))
            }
            _ => None,
        };
        Ok(Engine {
            tokenizer,
            chat_template,
            target: target_lm,
            separate_draft,
            sd_draft,
            ssd_draft,
            sd_on_worker: false,
            ssd_target,
            lookup: opts.lookup,
            spec: opts.spec.clone(),
            choice,
            remote: None,
            target_cpu: matches!(opts.target, Device::Cpu { .. }),
            auto: opts.auto,
        })
    }

    /// An engine whose target is on a server and whose `draft` runs here; the tokenizer and
    /// chat template are the draft's, so its vocabulary must be the server's.
    pub async fn with_remote_target(target: crate::remote::RemoteTarget, draft: ModelFile, opts: &EngineOptions) -> Result<Engine> {
        opts.validate()?;
        if opts.lookup.is_some() {
            return Err(Error::InvalidArgument("a server target takes a draft model, not prompt lookup".into()));
        }
        target.check_vocab(draft.weights.config.vocab_size, &draft.tokenizer.vocab_fingerprint())?;
        crate::decode::check_draft(target.config(), &draft.weights.config)?;
        let capacity = Self::capacity(target.config(), opts);
        let mut remote = Remote { link: target.link(), server: target.fork() };
        let mut target_lm: BoxedLm = Box::new(target);
        let wants = |m: Mode| opts.modes.is_empty() || opts.modes.contains(&m);
        let slimmed = slimming(&draft, opts).apply(&draft.weights)?;
        let (mut sd_draft, ssd_draft) = draft_runners(&slimmed, capacity, opts, &opts.draft, wants).await?;
        // The server computes beside the draft, so SSD's overlap is real wherever the draft
        // answers on a worker of its own.
        let choice = match (opts.auto && opts.modes.len() != 1, sd_draft.as_deref_mut()) {
            (true, Some(d)) => {
                let costs = remote_target_costs(target_lm.as_mut(), &mut remote).await?;
                let costs = costs.with_draft(DraftCosts::measure(d, tree_rows(&opts.spec)).await?);
                Some(costs.choose(PRIOR_ACCEPTANCE, ssd_candidate(&ssd_draft, &opts.spec)))
            }
            _ => None,
        };
        Ok(Engine {
            tokenizer: draft.tokenizer,
            chat_template: draft.chat_template,
            target: target_lm,
            separate_draft: true,
            sd_draft,
            ssd_draft,
            sd_on_worker: false,
            ssd_target: None,
            lookup: None,
            spec: opts.spec.clone(),
            choice,
            remote: Some(remote),
            target_cpu: false,
            auto: opts.auto,
        })
    }

    /// A server target returns its `top_n` likeliest tokens per position: sampling from them is
    /// the target's own sampling only when top-k keeps no more than those. (In mode AR the
    /// server samples on its own, from the whole distribution.)
    fn check_remote_sampling(&self, mode: Mode, sampling: &SamplingParams) -> Result<()> {
        let Some(n) = self.remote.as_ref().map(|r| r.server.options().top_n) else { return Ok(()) };
        if mode == Mode::Ar || sampling.is_greedy() || (1..=n).contains(&sampling.top_k) {
            return Ok(());
        }
        Err(Error::option(
            "top_k",
            format!(
                "a server target returns its {n} likeliest tokens per position, so sampling from it is exact only \
                 with top_k between 1 and {n}; got {}",
                sampling.top_k
            ),
        ))
    }

    /// KV slots a draft needs for `opts`: the context plus the speculation scratch.
    pub fn capacity(config: &ModelConfig, opts: &EngineOptions) -> usize {
        opts.context.min(config.context_length) + opts.spec.draft_scratch()
    }

    /// Use `draft` (a draft in a browser Web Worker) for SSD from now on, and with `sd` for SD
    /// too (through [`WorkerDrafter`]: the engine then holds no draft model, one copy serving both
    /// modes); `vocab_fingerprint` is its tokenizer's [`Tokenizer::vocab_fingerprint`], `draft_cpu`
    /// whether it computes on the CPU. A measured choice of mode is made again with SSD among the
    /// candidates; where SD comes with this draft and none was made yet, the target is timed here
    /// and the draft in its worker, and the choice made from those times (as
    /// [`Engine::new`] makes it with a local draft).
    pub async fn attach_draft(
        &mut self,
        mut draft: DraftWorker,
        vocab_fingerprint: &str,
        sd: bool,
        draft_cpu: bool,
    ) -> Result<()> {
        let ours = self.tokenizer.vocab_fingerprint();
        if ours != vocab_fingerprint {
            return Err(Error::IncompatibleDraft(format!(
                "the draft's vocabulary (fingerprint {vocab_fingerprint}) differs from the target's ({ours})"
            )));
        }
        crate::decode::check_draft(self.target.config(), draft.config())?;
        let sd = sd && self.sd_draft.is_none() && self.lookup.is_none();
        let costs = match &self.choice {
            Some(c) => Some(c.costs.clone()),
            None if sd && self.auto => {
                // A draft that computes beside the target has its speculation timed too.
                let parallel = !(self.target_cpu && draft_cpu) && draft.is_concurrent();
                let costs = match &mut self.remote {
                    Some(remote) => remote_target_costs(self.target.as_mut(), remote).await?,
                    None => Costs::measure_target(self.target.as_mut(), parallel).await?,
                };
                let rows = if parallel { tree_rows(&self.spec) } else { 0 };
                Some(costs.with_draft(draft.measure(rows).await?))
            }
            None => None,
        };
        self.ssd_draft = Some(draft);
        self.sd_on_worker = sd;
        if let Some(costs) = costs {
            let acceptance = self.choice.as_ref().map_or(PRIOR_ACCEPTANCE, |c| c.acceptance);
            self.choice = Some(costs.choose(acceptance, ssd_candidate(&self.ssd_draft, &self.spec)));
        }
        self.separate_draft = true;
        Ok(())
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn spec(&self) -> &SpecConfig {
        &self.spec
    }

    pub fn target_config(&self) -> &ModelConfig {
        self.target.config()
    }

    /// Where the target runs, in words.
    pub fn target_backend(&self) -> String {
        self.target.backend_name()
    }

    /// Where the engine's own draft model runs, in words; `None` where it holds none (no draft,
    /// prompt lookup, or a draft held by a worker elsewhere, which reports its own).
    pub fn draft_backend(&self) -> Option<String> {
        self.sd_draft.as_ref().map(|d| d.backend_name())
    }

    /// Whether a draft other than the target was given (a model or prompt lookup).
    pub fn has_draft(&self) -> bool {
        self.separate_draft || self.lookup.is_some()
    }

    /// Milliseconds of a target forward over each of `sizes` tokens from an empty context, every
    /// position's argmax read back as a verification reads it; the best of `rounds` (other work on
    /// the machine only ever adds time). Every generation starts its target afresh, so what the
    /// timing leaves in the cache does not matter. Not for a server target, whose forwards run on
    /// the server.
    pub async fn time_target_forwards(&mut self, sizes: &[usize], rounds: usize) -> Result<Vec<f64>> {
        if self.remote.is_some() {
            return Err(Error::InvalidArgument("a server target's forwards are not timed here".into()));
        }
        if rounds == 0 || sizes.iter().any(|&n| n == 0 || n > self.target.capacity()) {
            return Err(Error::InvalidArgument(format!(
                "time_target_forwards: sizes {sizes:?} must be within 1..={} and rounds ({rounds}) at least 1",
                self.target.capacity()
            )));
        }
        self.target.truncate(0);
        crate::decode::choice::time_forwards(self.target.as_mut(), sizes, rounds).await
    }

    /// The measured choice of mode and K, when the engine made one.
    pub fn choice(&self) -> Option<&Choice> {
        self.choice.as_ref()
    }

    /// The mode a generation runs in when none is asked for: the measured choice (mode auto), SD
    /// for prompt lookup, SSD when its draft computes beside the target; with the SSD draft
    /// inline, its speculation would only add to every round, so SD. A mode whose draft worker
    /// has stopped gives way to AR until another is attached.
    pub fn default_mode(&self) -> Mode {
        let mode = self.preferred_mode();
        let on_worker = mode == Mode::Ssd || (mode == Mode::Sd && self.sd_draft.is_none() && self.lookup.is_none());
        match &self.ssd_draft {
            Some(w) if on_worker && w.has_stopped() => Mode::Ar,
            _ => mode,
        }
    }

    fn preferred_mode(&self) -> Mode {
        if let Some(c) = &self.choice {
            return c.mode();
        }
        if self.lookup.is_some() {
            return Mode::Sd;
        }
        if !self.separate_draft {
            return Mode::Ar;
        }
        match (&self.ssd_draft, &self.sd_draft) {
            (Some(ssd), _) if ssd.is_concurrent() => Mode::Ssd,
            (_, Some(_)) => Mode::Sd,
            (Some(_), None) if self.sd_on_worker => Mode::Sd,
            (Some(_), None) => Mode::Ssd,
            (None, None) => Mode::Ar,
        }
    }

    /// The prompt's token ids.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        let tok = &self.tokenizer;
        match prompt {
            Prompt::Text(text) => tok.encode_prompt(text),
            Prompt::Tokens(ids) => Ok(ids.clone()),
            Prompt::Chat(messages) => {
                let template = self
                    .chat_template
                    .as_deref()
                    .ok_or_else(|| Error::InvalidArgument("chat: the model has no chat template".into()))?;
                let text = apply_chat_template(template, messages, tok.bos_token().as_deref(), tok.eos_token().as_deref())?;
                tok.encode_prompt(&text)
            }
        }
    }

    /// Generate from `prompt`, streaming text to `on_text(piece, tokens)` once per committed
    /// round (whole characters only, so a piece may be empty; `tokens` is how many tokens the
    /// round committed). `on_text` returning `false` cancels: generation stops within one round with
    /// `finish: cancelled`, and the engine is ready for the next call.
    pub async fn generate(
        &mut self,
        prompt: &Prompt,
        opts: &GenerateOptions,
        on_text: &mut dyn FnMut(&str, usize) -> bool,
    ) -> Result<Completion> {
        opts.validate()?;
        let mode = opts.mode.unwrap_or_else(|| self.default_mode());
        self.check_remote_sampling(mode, &opts.sampling)?;
        let ids = self.encode(prompt)?;
        let auto = self.choice.as_ref().filter(|_| opts.mode.is_none() && opts.spec.is_none());
        let spec = match &opts.spec {
            // SD's K then follows the acceptance the generation shows, round by round.
            None if auto.is_some() => SpecConfig {
                k: auto.map_or(self.spec.k, |c| c.k),
                adapt: auto.filter(|_| mode == Mode::Sd).and_then(|c| c.costs.adaptive_k(c.acceptance)),
                ..self.spec.clone()
            },
            Some(s) if s.draft_scratch() > self.spec.draft_scratch() => {
                return Err(Error::InvalidArgument(format!(
                    "spec_k {} with fan-out {} needs more draft cache than this engine was built for (spec_k {}, fan-out {}); load it with the larger setting",
                    s.k, s.fanout, self.spec.k, self.spec.fanout
                )))
            }
            Some(s) => s.clone(),
            None => self.spec.clone(),
        };
        let req = Request {
            prompt: ids,
            max_tokens: opts.max_tokens,
            sampling: opts.sampling,
            stop: self.tokenizer.eos_ids().to_vec(),
            ..Request::default()
        };
        let mut stream = StreamDecoder::new(&self.tokenizer);
        let mut stream_err = None;
        // What a generation that fails midway has committed (and streamed) before it failed.
        let mut partial = Vec::new();
        if let Some(r) = &self.remote {
            r.link.take();
        }
        let mut sink = |toks: &[u32]| {
            partial.extend_from_slice(toks);
            let mut text = String::new();
            for &t in toks {
                match stream.push(t) {
                    Ok(s) => text += &s,
                    Err(e) => {
                        stream_err = Some(e);
                        return false;
                    }
                }
            }
            on_text(&text, toks.len())
        };
        let target: &mut dyn Lm = self.target.as_mut();
        let g = match mode {
            Mode::Ar if self.remote.is_some() => {
                let remote = self.remote.as_mut().ok_or_else(|| not_prepared(mode))?;
                remote.server.generate_on_server(&req, &mut sink).await
            }
            Mode::Ar => generate_ar(target, &req, &mut sink).await,
            Mode::Sd if self.lookup.is_some() => {
                let vocab = target.config().vocab_size;
                let mut lookup = PromptLookup::new(self.lookup.unwrap_or_default(), vocab)?;
                generate_sd_with(target, &mut lookup, &req, &spec, &mut sink).await
            }
            Mode::Sd => match (self.sd_draft.as_deref_mut(), self.ssd_draft.as_mut()) {
                (Some(draft), _) => generate_sd(target, draft, &req, &spec, &mut sink).await,
                (None, Some(worker)) if self.sd_on_worker => {
                    let mut drafter = WorkerDrafter::new(worker, &req, &spec);
                    generate_sd_with(target, &mut drafter, &req, &spec, &mut sink).await
                }
                _ => Err(not_prepared(mode)),
            },
            Mode::Ssd if self.lookup.is_some() => Err(Error::InvalidArgument(lookup_ssd())),
            Mode::Ssd => {
                let draft = self.ssd_draft.as_mut().ok_or_else(|| not_prepared(mode))?;
                let target = self.ssd_target.as_deref_mut().map_or(target, |t| t as &mut dyn Lm);
                generate_ssd(target, draft, &req, &spec, &mut sink).await
            }
        };
        let g = match g {
            Err(Error::Server { message, .. }) => return Err(Error::Server { message, partial }),
            g => g?,
        };
        if let Some(e) = stream_err {
            return Err(e);
        }
        let mut g = g;
        if auto.is_some() {
            g.stats.auto = self.choice.clone();
        }
        if let Some(r) = &self.remote {
            g.stats.remote = Some(r.link.take());
        }
        let rest = stream.finish()?;
        if !rest.is_empty() {
            on_text(&rest, 0);
        }
        self.learn(mode, &spec, &g.stats);
        Ok(Completion {
            text: self.tokenizer.decode(&g.tokens)?,
            tokens: g.tokens,
            prompt_tokens: req.prompt.len(),
            finish: g.finish,
            stats: g.stats,
        })
    }
}

impl Engine {
    /// Refine the choice of mode with what a generation measured: its pace per round, and for
    /// speculation the acceptance.
    fn learn(&mut self, mode: Mode, spec: &SpecConfig, stats: &Stats) {
        let Some(choice) = &self.choice else { return };
        let mut costs = choice.costs.clone();
        let seen = match mode {
            Mode::Ar => None,
            _ => stats.timeline.as_deref().and_then(rounds_seen),
        };
        // Where K was chosen again round by round, the pace is the K most rounds drafted.
        let k = match (mode, seen) {
            (Mode::Ar, _) => 1,
            (_, Some((_, usual))) if spec.adapt.is_some() => usual,
            _ => spec.k,
        };
        // A few rounds say little about a mode's pace.
        if stats.rounds >= MIN_OBSERVED_ROUNDS && stats.decode_ms > 0.0 {
            costs.observe(mode, k, stats.decode_ms / stats.rounds as f64);
        }
        let a = seen.map_or(choice.acceptance, |(a, _)| (choice.acceptance + a) / 2.0);
        self.choice = Some(costs.choose(a, ssd_candidate(&self.ssd_draft, &self.spec)));
    }
}

/// What a target on a server costs: its forwards as timed from here (a verification pays the
/// round trip), and as AR's cost per token the server's own decode.
async fn remote_target_costs(target: &mut dyn Lm, remote: &mut Remote) -> Result<Costs> {
    let mut costs = Costs::measure_target(target, true).await?;
    costs.decode_ms = remote.server.server_decode_ms(AR_PROBE_TOKENS).await?;
    Ok(costs)
}

/// SSD as a measured choice considers it (its largest K and fan-out): not without an SSD draft,
/// nor with an inline one, which speculates only once the verify is over and so adds its whole
/// cost to every round.
fn ssd_candidate<'a>(ssd_draft: &Option<DraftWorker>, spec: &'a SpecConfig) -> Option<(usize, &'a Fanout)> {
    ssd_draft.as_ref().filter(|d| d.is_concurrent()).map(|_| (spec.k, &spec.fanout))
}

/// The widest tree step SSD runs under `spec`, which the measurement at load times.
fn tree_rows(spec: &SpecConfig) -> usize {
    spec.fanout.max_branches(spec.k)
}

/// Why SSD does not take prompt lookup: a lookup costs nothing, so there is no drafting to
/// overlap with verification, and SD with it is already what SSD would be.
fn lookup_ssd() -> String {
    "mode ssd needs a draft model; prompt lookup drafts at no cost, so use it with mode sd".into()
}

fn not_prepared(mode: Mode) -> Error {
    Error::InvalidArgument(format!("mode {mode}: this engine was built without a draft for it"))
}
