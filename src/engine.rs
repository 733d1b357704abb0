//! The engine: a target model and an optional draft, placed on backends, with the tokenizer and
//! chat template, ready to generate text in any mode. The CLI and the JS API are thin front-ends
//! over it; neither loads, places or detokenizes anything itself.
//!
//! Models arrive as [`ModelFile`]s, however they were read (a memory map natively, bytes or
//! downloaded pieces in the browser), or, for the target, already placed on its device
//! ([`Target::Placed`]: streamed to the GPU as it downloaded). Once the runners are built the
//! engine keeps only what it still needs: a model bound for the GPU has been uploaded, so its host
//! copy is freed here.

use futures::future::LocalBoxFuture;
use std::sync::Arc;

use crate::backend::cpu::{CpuBackend, Precision};
use crate::backend::{Backend, KvCache};
use crate::decode::speculation::judged;
use crate::decode::{
    Candidate, Choice, Costs, DraftWorker, FinishReason, Mode, NgramConfig, Placement, Request, RoundTimes, Run,
    SelfGenerating, SpecConfig, Stats, Strategy,
};
use crate::error::{Error, Result};
use crate::grammar::tools::{self, Tool, ToolCall, ToolChoice};
use crate::grammar::{Grammar, GrammarSpec, Vocabulary};
use crate::model::config::ModelConfig;
use crate::model::load::ModelFile;
use crate::model::runner::{BoxedLm, Lm, Runner};
use crate::model::slim::{check_quant, frequent_tokens, Slimming};
use crate::model::stream::StreamedModel;
use crate::model::tokenizer::{apply_chat_template_with_tools, ChatMessage, StreamDecoder, Tokenizer};
use crate::model::transformer::Transformer;
use crate::model::weights::ModelWeights;
use crate::sampling::SamplingParams;
use crate::storage::quant::DType;

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
        self.runner_with_slots(w, capacity, capacity).await
    }

    /// A model instance for `w` on this device whose sequences hold up to `context` tokens each,
    /// in a KV cache of `slots` (see `Runner::with_slots`).
    pub async fn runner_with_slots(&self, w: &ModelWeights, context: usize, slots: usize) -> Result<BoxedLm> {
        match self {
            Device::Cpu { threads, precision } => {
                let cpu = CpuBackend::new(*threads)?.with_precision(*precision);
                Ok(Box::new(Runner::with_slots(Transformer::new(cpu, w)?, context, slots)?))
            }
            #[cfg(feature = "gpu")]
            Device::Gpu { .. } => {
                let gpu = crate::backend::gpu::GpuBackend::new(self.gpu_options().unwrap_or_default()).await?;
                Ok(Box::new(Runner::with_slots(Transformer::new(gpu, w)?, context, slots)?))
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
pub(crate) fn target_context(config: &ModelConfig, opts: &EngineOptions) -> usize {
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
    /// Default: [`Engine::default_mode`].
    pub mode: Option<Mode>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// SD/SSD settings for this call (K, fan-out, ...); default: the engine's. A K whose
    /// speculation needs more draft KV room than the engine was built for is refused.
    pub spec: Option<SpecConfig>,
    /// What the output must match (a JSON schema, any JSON object, a regex, a Lark grammar).
    pub grammar: Option<GrammarSpec>,
    /// Functions the model may call (a chat prompt, a model whose template lists tools): the
    /// template lists them and the output is held to calls of them (or text, as `choice` says);
    /// [`Completion::tool_calls`] holds the calls made. Not with `grammar`.
    pub tools: Option<ToolUse>,
}

/// The tools of a generation and whether it must call one.
#[derive(Clone, Debug, Default)]
pub struct ToolUse {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
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
        GenerateOptions {
            mode: None,
            max_tokens: DEFAULT_MAX_TOKENS,
            sampling: SamplingParams::default(),
            spec: None,
            grammar: None,
            tools: None,
        }
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
    /// With tools: the calls the output made (none where it answered in text, or was cut short).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(test, ts(optional = nullable))]
    pub tool_calls: Vec<ToolCall>,
}

/// The loaded models, ready to generate. Reusable across generations, also after an error or a
/// cancelled generation.
pub struct Engine {
    tokenizer: Tokenizer,
    /// The vocabulary as grammars see it, built by the first generation that asks for one.
    vocabulary: Option<Vocabulary>,
    chat_template: Option<String>,
    target: BoxedLm,
    /// The prepared modes, AR first.
    strategies: Vec<Box<dyn Strategy>>,
    /// The modes a draft attached later serves ([`Engine::attach_draft`]): another replaces them.
    attached: Vec<Mode>,
    /// Whether a draft other than the target was given (a model, prompt lookup, or a worker).
    has_draft: bool,
    spec: SpecConfig,
    /// The measured choice of mode and K, refined by the acceptance later generations see.
    choice: Option<Choice>,
    /// A target on a server: its request counters, and the server for timing its decode.
    remote: Option<Remote>,
    /// Whether the target computes on the CPU (for a draft attached later: does it run beside?).
    target_cpu: bool,
    /// [`EngineOptions::auto`].
    auto: bool,
}

struct Remote {
    link: crate::remote::RemoteLink,
    server: crate::remote::RemoteTarget,
}

/// Rounds a generation must run for its pace to count in the choice of mode.
const MIN_OBSERVED_ROUNDS: usize = 4;

/// Tokens remote AR generates at load to time the server's decode: enough that the one round
/// trip weighs little.
const AR_PROBE_TOKENS: usize = 16;

/// KV-cache size in tokens (prompt + output) without the option, for every front-end (CLI, JS API):
/// room for a long code prompt and its answer, at a cost of at most 224 MiB of f32 K and V for
/// Qwen2.5-1.5B's 28 layers (half that as the GPU's f16), which wasm32's 4 GiB holds beside the model.
pub const DEFAULT_CONTEXT: usize = 4096;
/// Upper bound on generated tokens without the option, for every front-end.
pub const DEFAULT_MAX_TOKENS: usize = 256;
/// The draft model's defaults, measured with the Qwen 2.5 Coder pair on a 2-core CPU
/// (docs/measurements.md: "A cheaper draft"): Q4_K (its 896-value rows padded to 1,024 on the
/// CPU, Q4_1 elsewhere) and the 65,536 lowest token ids keep the 0.5B draft's acceptance on code
/// (0.85 as stored, 0.87 requantized) and read about 255 MB of weights per step instead of 392 MB.
pub const DEFAULT_DRAFT_QUANT: Option<DType> = Some(DType::Q4K);
pub const DEFAULT_DRAFT_HEAD: Option<usize> = Some(65_536);

/// The per-token acceptance of a generation's rounds (accepted over judged draft tokens, see
/// [`judged`]) and the K most of them drafted (the longer of two as common), if it ran any.
pub(crate) fn rounds_seen(rounds: &[RoundTimes]) -> Option<(f64, usize)> {
    let judged_tokens: usize = rounds.iter().map(|r| judged(r.proposed, r.accepted)).sum();
    let accepted: usize = rounds.iter().map(|r| r.accepted).sum();
    let mut drafted = [0usize; 65];
    for r in rounds {
        drafted[r.proposed.min(64)] += 1;
    }
    let usual = (1..drafted.len()).max_by_key(|&k| drafted[k])?;
    (judged_tokens > 0).then(|| (accepted as f64 / judged_tokens as f64, usual))
}

/// The threads (target, draft) when both models run on all the CPU's cores by default (0
/// threads each) and a draft runs beside the target on a thread of its own (SSD): they run at
/// once, so they split the cores rather than oversubscribe them. Models that run one at a time
/// (AR, SD) use all cores. Thread counts given explicitly are left as they are.
fn cpu_split(opts: &EngineOptions) -> Option<(usize, usize)> {
    let all = |d: &Device| matches!(d, Device::Cpu { threads: 0, .. });
    if !(opts.ssd_thread && all(&opts.target) && all(&opts.draft)) {
        return None;
    }
    let n = std::thread::available_parallelism().ok()?.get();
    (n >= 2).then(|| (n - n / 2, n / 2))
}

/// What makes the draft model `d` cheaper under `opts`.
pub(crate) fn slimming(d: &ModelFile, opts: &EngineOptions) -> Slimming {
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

/// The engine's placement as the strategies prepare themselves from it.
struct Placer<'a> {
    opts: &'a EngineOptions,
    vocab: usize,
    /// The weights a draft drafts with: the draft model's, made cheaper, or the target's.
    draft: Option<&'a ModelWeights>,
    /// The target's weights, where the engine holds them (not for a placed or server target).
    target: Option<&'a ModelWeights>,
    /// The draft's KV slots.
    capacity: usize,
    /// (target, draft) threads when a draft beside the target shares the CPU with it.
    split: Option<(usize, usize)>,
    server: Option<crate::remote::RemoteTarget>,
}

impl Placer<'_> {
    async fn draft_on(&self, device: &Device) -> Result<Option<BoxedLm>> {
        match self.draft {
            Some(w) => Ok(Some(device.runner(w, self.capacity).await?)),
            None => Ok(None),
        }
    }
}

/// `device` on `threads` of the CPU's cores, where it is the CPU and `threads` are given.
fn on_threads(device: &Device, threads: Option<usize>) -> Option<Device> {
    match (device, threads) {
        (Device::Cpu { precision, .. }, Some(threads)) => Some(Device::Cpu { threads, precision: *precision }),
        _ => None,
    }
}

impl Placement for Placer<'_> {
    fn modes(&self) -> &[Mode] {
        &self.opts.modes
    }

    fn vocab(&self) -> usize {
        self.vocab
    }

    fn lookup(&self) -> Option<NgramConfig> {
        self.opts.lookup
    }

    fn draft(&mut self) -> LocalBoxFuture<'_, Result<Option<BoxedLm>>> {
        Box::pin(self.draft_on(&self.opts.draft))
    }

    fn draft_beside(&mut self) -> LocalBoxFuture<'_, Result<Option<BoxedLm>>> {
        Box::pin(async move {
            let device = on_threads(&self.opts.draft, self.split.map(|s| s.1)).unwrap_or_else(|| self.opts.draft.clone());
            self.draft_on(&device).await
        })
    }

    fn draft_thread(&self) -> bool {
        self.opts.ssd_thread
    }

    fn target_beside(&mut self) -> LocalBoxFuture<'_, Result<Option<BoxedLm>>> {
        Box::pin(async move {
            match (on_threads(&self.opts.target, self.split.map(|s| s.0)), self.target) {
                (Some(device), Some(w)) => Ok(Some(device.runner(w, target_context(&w.config, self.opts)).await?)),
                _ => Ok(None),
            }
        })
    }

    fn server(&mut self) -> Option<Box<dyn SelfGenerating>> {
        self.server.take().map(|s| Box::new(s) as Box<dyn SelfGenerating>)
    }
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
        }
        let mut target_lm = wrap(match (placed, &target_weights) {
            (Some(lm), _) => lm,
            (None, Some(w)) => opts.target.runner(w, target_context(&w.config, opts)).await?,
            (None, None) => unreachable!("a target is a file or placed"),
        });
        // A draft model made cheaper, once for all its runners; the target drafting for itself
        // stays as it is (a placed target has no weights here to draft with). Prompt lookup
        // replaces the draft model.
        let slimmed = match &draft {
            Some(d) => Some(slimming(d, opts).apply(&d.weights)?),
            None => None,
        };
        let mut placer = Placer {
            opts,
            vocab: target_lm.config().vocab_size,
            draft: slimmed.as_ref().or(target_weights.as_ref()).filter(|_| opts.lookup.is_none()),
            target: target_weights.as_ref(),
            capacity: Self::capacity(target_lm.config(), opts),
            split: cpu_split(opts),
            server: None,
        };
        let mut strategies = crate::decode::prepare(&mut placer).await?;
        let has_draft = draft.is_some() || opts.lookup.is_some();
        let cpu = |d: &Device| matches!(d, Device::Cpu { .. });
        let choice = match has_draft && opts.auto && opts.modes.len() != 1 {
            true => {
                let beside = !(cpu(&opts.target) && cpu(&opts.draft));
                measure_choice(target_lm.as_mut(), None, &mut strategies, &opts.spec, beside).await?
            }
            false => None,
        };
        Ok(Engine {
            vocabulary: None,
            tokenizer,
            chat_template,
            target: target_lm,
            strategies,
            attached: Vec::new(),
            has_draft,
            spec: opts.spec.clone(),
            choice,
            remote: None,
            target_cpu: cpu(&opts.target),
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
        let mut remote = Remote { link: target.link(), server: target.fork() };
        let slimmed = slimming(&draft, opts).apply(&draft.weights)?;
        let mut placer = Placer {
            opts,
            vocab: target.config().vocab_size,
            draft: Some(&slimmed),
            target: None,
            capacity: Self::capacity(target.config(), opts),
            split: None,
            server: Some(target.fork()),
        };
        let mut strategies = crate::decode::prepare(&mut placer).await?;
        let mut target_lm: BoxedLm = Box::new(target);
        // The server computes beside the draft, so SSD's overlap is real wherever the draft
        // answers on a worker of its own.
        let choice = match opts.auto && opts.modes.len() != 1 {
            true => measure_choice(target_lm.as_mut(), Some(&mut remote), &mut strategies, &opts.spec, true).await?,
            false => None,
        };
        Ok(Engine {
            vocabulary: None,
            tokenizer: draft.tokenizer,
            chat_template: draft.chat_template,
            target: target_lm,
            strategies,
            attached: Vec::new(),
            has_draft: true,
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
    fn check_remote_sampling(&self, strategy: &dyn Strategy, sampling: &SamplingParams) -> Result<()> {
        let Some(n) = self.remote.as_ref().map(|r| r.server.options().top_n) else { return Ok(()) };
        if !strategy.verifies() || sampling.is_greedy() || (1..=n).contains(&sampling.top_k) {
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
    /// too (through [`WorkerDrafter`](crate::decode::WorkerDrafter): the engine then holds no
    /// draft model of its own, one copy serving both modes); `vocab_fingerprint` is its
    /// tokenizer's [`Tokenizer::vocab_fingerprint`], `draft_cpu` whether it computes on the CPU.
    /// A measured choice of mode is made again with SSD among the candidates; where SD comes
    /// with this draft and none was made yet, the target is timed here and the draft in its
    /// worker, and the choice made from those times (as [`Engine::new`] makes it with a local
    /// draft).
    pub async fn attach_draft(&mut self, draft: DraftWorker, vocab_fingerprint: &str, sd: bool, draft_cpu: bool) -> Result<()> {
        let ours = self.tokenizer.vocab_fingerprint();
        if ours != vocab_fingerprint {
            return Err(Error::IncompatibleDraft(format!(
                "the draft's vocabulary (fingerprint {vocab_fingerprint}) differs from the target's ({ours})"
            )));
        }
        crate::decode::check_draft(self.target.config(), draft.config())?;
        // A draft attached before gives way; SD with a draft of the engine's own keeps it.
        let attached = std::mem::take(&mut self.attached);
        self.strategies.retain(|s| !attached.contains(&s.mode()));
        let sd = sd && !self.strategies.iter().any(|s| s.mode() == Mode::Sd);
        // A draft that computes beside the target has its speculation timed too.
        let beside = !(self.target_cpu && draft_cpu) && draft.is_concurrent();
        let fresh = crate::decode::on_worker(draft, sd);
        self.attached = fresh.iter().map(|s| s.mode()).collect();
        self.strategies.retain(|s| !self.attached.contains(&s.mode()));
        self.strategies.extend(fresh);
        self.has_draft = true;
        self.choice = match self.choice.take() {
            Some(c) => Some(c.costs.choose(c.acceptance, &candidates(&self.strategies, &self.spec))),
            None if sd && self.auto => {
                let target = self.target.as_mut();
                measure_choice(target, self.remote.as_mut(), &mut self.strategies, &self.spec, beside).await?
            }
            None => None,
        };
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
        self.strategies.iter().find_map(|s| s.draft_backend())
    }

    /// Whether a draft other than the target was given (a model or prompt lookup).
    pub fn has_draft(&self) -> bool {
        self.has_draft
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
        crate::decode::time_forwards(self.target.as_mut(), sizes, rounds).await
    }

    /// The measured choice of mode and K, when the engine made one.
    pub fn choice(&self) -> Option<&Choice> {
        self.choice.as_ref()
    }

    /// The mode a generation runs in when none is asked for: the measured choice (mode auto), else
    /// AR without a draft of its own, else the prepared mode that prefers itself most (SSD when
    /// its draft computes beside the target; SD, with prompt lookup or where SSD's draft runs
    /// inline, whose speculation would only add to every round). A mode whose draft worker has
    /// stopped gives way to AR until another is attached.
    pub fn default_mode(&self) -> Mode {
        let preferred = match &self.choice {
            Some(c) => c.mode(),
            None if !self.has_draft => Mode::Ar,
            None => self.strategies.iter().max_by_key(|s| s.preference()).map_or(Mode::Ar, |s| s.mode()),
        };
        match self.strategy(preferred) {
            Some(s) if !s.ready() => Mode::Ar,
            _ => preferred,
        }
    }

    fn strategy(&self, mode: Mode) -> Option<&dyn Strategy> {
        self.strategies.iter().find(|s| s.mode() == mode).map(|s| s.as_ref())
    }

    /// The prompt's token ids.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        self.encode_with_tools(prompt, &[])
    }

    /// The prompt's token ids, a chat listing `tools` where there are any.
    fn encode_with_tools(&self, prompt: &Prompt, tools: &[Tool]) -> Result<Vec<u32>> {
        encode(&self.tokenizer, self.chat_template.as_deref(), prompt, tools)
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
        let at = self.strategies.iter().position(|s| s.mode() == mode).ok_or_else(|| not_prepared(mode))?;
        self.check_remote_sampling(self.strategies[at].as_ref(), &opts.sampling)?;
        let ids = self.encode_with_tools(prompt, opts.tools.as_ref().map_or(&[], |t| &t.tools))?;
        let auto = self.choice.as_ref().filter(|_| opts.mode.is_none() && opts.spec.is_none());
        let spec = match &opts.spec {
            None => match auto {
                Some(c) => {
                    let mut spec = SpecConfig { k: c.k, ..self.spec.clone() };
                    self.strategies[at].tune(&mut spec, c);
                    spec
                }
                None => self.spec.clone(),
            },
            Some(s) if s.draft_scratch() > self.spec.draft_scratch() => {
                return Err(Error::InvalidArgument(format!(
                    "spec_k {} with fan-out {} needs more draft cache than this engine was built for (spec_k {}, fan-out {}); load it with the larger setting",
                    s.k, s.fanout, self.spec.k, self.spec.fanout
                )))
            }
            Some(s) => s.clone(),
        };
        let auto = auto.is_some();
        let wanted = match (&opts.tools, &opts.grammar) {
            (Some(_), Some(_)) => return Err(Error::option("grammar", "cannot be given with tools, which hold the output to their calls")),
            (Some(t), None) => tools::grammar(&t.tools, &t.choice, self.vocabulary()?.is_special("<tool_call>"))?,
            (None, g) => g.clone(),
        };
        let grammar = wanted.as_ref().map(|g| self.compile(g)).transpose()?;
        let req = Request {
            prompt: ids,
            max_tokens: opts.max_tokens,
            sampling: opts.sampling,
            stop: self.tokenizer.eos_ids().to_vec(),
            grammar,
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
            match stream.push_all(toks) {
                Ok(text) => on_text(&text, toks.len()),
                Err(e) => {
                    stream_err = Some(e);
                    false
                }
            }
        };
        let run = Run { target: self.target.as_mut(), req: &req, spec: &spec, sink: &mut sink };
        let g = match self.strategies[at].generate(run).await {
            Err(Error::Server { message, .. }) => return Err(Error::Server { message, partial }),
            g => g?,
        };
        if let Some(e) = stream_err {
            return Err(e);
        }
        let mut g = g;
        if auto {
            g.stats.auto = self.choice.clone();
        }
        if let Some(r) = &self.remote {
            g.stats.remote = Some(r.link.take());
        }
        let rest = stream.finish()?;
        if !rest.is_empty() {
            on_text(&rest, 0);
        }
        self.learn(at, &spec, &g.stats);
        let text = self.tokenizer.decode(&g.tokens)?;
        // A call cut short by max_tokens is no call.
        let tool_calls = match (&opts.tools, g.finish) {
            (Some(_), FinishReason::Eos) => tools::parse(&text)?,
            _ => Vec::new(),
        };
        Ok(Completion {
            tool_calls,
            text,
            tokens: g.tokens,
            prompt_tokens: req.prompt.len(),
            finish: g.finish,
            stats: g.stats,
        })
    }

    /// Compile `spec` against the target's vocabulary.
    pub fn compile(&mut self, spec: &GrammarSpec) -> Result<Arc<Grammar>> {
        Ok(Arc::new(self.vocabulary()?.compile(spec)?))
    }

    /// The target's vocabulary as grammars see it, built on first use.
    fn vocabulary(&mut self) -> Result<&Vocabulary> {
        Ok(match &mut self.vocabulary {
            Some(v) => v,
            v => v.insert(Vocabulary::new(&self.tokenizer, self.target.config().vocab_size)?),
        })
    }

    /// Refine the choice of mode with what a generation by strategy `at` measured: its pace per
    /// round, and for speculation the acceptance.
    fn learn(&mut self, at: usize, spec: &SpecConfig, stats: &Stats) {
        let Some(choice) = &self.choice else { return };
        let strategy = &self.strategies[at];
        let mut costs = choice.costs.clone();
        let seen = stats.timeline.as_deref().and_then(rounds_seen);
        // Where K was chosen again round by round, the pace is the K most rounds drafted.
        let k = match seen {
            _ if !strategy.verifies() => 1,
            Some((_, usual)) if spec.adapt.is_some() => usual,
            _ => spec.k,
        };
        // A few rounds say little about a mode's pace.
        if stats.rounds >= MIN_OBSERVED_ROUNDS && stats.decode_ms > 0.0 {
            costs.observe(strategy.mode(), k, stats.decode_ms / stats.rounds as f64);
        }
        let a = seen.map_or(choice.acceptance, |(a, _)| (choice.acceptance + a) / 2.0);
        self.choice = Some(costs.choose(a, &candidates(&self.strategies, &self.spec)));
    }
}

/// The strategies as candidates of the measured choice, under the engine's `spec`.
/// `prompt`'s token ids under `tok` and the chat `template`, a chat listing `tools` where there
/// are any.
pub(crate) fn encode(tok: &Tokenizer, template: Option<&str>, prompt: &Prompt, tools: &[Tool]) -> Result<Vec<u32>> {
    let tools: Vec<serde_json::Value> = tools.iter().map(serde_json::to_value).collect::<std::result::Result<_, _>>().map_err(|e| Error::InvalidArgument(format!("tools: {e}")))?;
    if !tools.is_empty() && !matches!(prompt, Prompt::Chat(_)) {
        return Err(Error::InvalidArgument("tools: the prompt must be a chat, whose template lists them".into()));
    }
    match prompt {
        Prompt::Text(text) => tok.encode_prompt(text),
        Prompt::Tokens(ids) => Ok(ids.clone()),
        Prompt::Chat(messages) => {
            let template = template.ok_or_else(|| Error::InvalidArgument("chat: the model has no chat template".into()))?;
            if !tools.is_empty() && !template.contains("tools") {
                return Err(Error::InvalidArgument("tools: this model's chat template does not list tools".into()));
            }
            let text = apply_chat_template_with_tools(template, messages, &tools, tok.bos_token().as_deref(), tok.eos_token().as_deref())?;
            tok.encode_prompt(&text)
        }
    }
}

fn candidates<'a>(strategies: &'a [Box<dyn Strategy>], spec: &'a SpecConfig) -> Vec<Candidate<'a>> {
    strategies
        .iter()
        .map(|s| Candidate { mode: s.mode(), round_ms: Box::new(move |costs, k| s.round_ms(costs, spec, k)) })
        .collect()
}

/// The measured choice of mode and K: the target timed (a server's forwards from here, and its
/// own decode as AR's cost per token), then the first drafter a strategy offers, where it runs
/// (a tree step as wide as SSD's where it runs `beside` the target); `None` where no strategy
/// drafts. The choice assumes the drafter's prior acceptance until generations show theirs.
async fn measure_choice(
    target: &mut dyn Lm,
    remote: Option<&mut Remote>,
    strategies: &mut [Box<dyn Strategy>],
    spec: &SpecConfig,
    beside: bool,
) -> Result<Option<Choice>> {
    let rows = if beside { spec.fanout.max_branches(spec.k) } else { 0 };
    let Some(at) = strategies.iter_mut().position(|s| s.time_draft(0).is_some()) else { return Ok(None) };
    let mut costs = Costs::measure_target(target, beside).await?;
    if let Some(remote) = remote {
        costs.decode_ms = remote.server.server_decode_ms(AR_PROBE_TOKENS).await?;
    }
    let timing = strategies[at].time_draft(rows).expect("the strategy offered its drafter").await?;
    let costs = costs.with_draft(timing.costs);
    Ok(Some(costs.choose(timing.prior, &candidates(strategies, spec))))
}

fn not_prepared(mode: Mode) -> Error {
    Error::InvalidArgument(format!("mode {mode}: this engine was built without a draft for it"))
}
