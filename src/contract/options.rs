//! The JS API's option objects (camelCase, every field optional) and their checks: a wrong value
//! is an [`Invalid`] that names the option (in JS an `invalid_argument` error).

use crate::engine::ToolUse;
use crate::grammar::tools::{Tool, ToolChoice};
use crate::grammar::GrammarSpec;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{DEFAULT_PARALLEL, MAX_PARALLEL, MAX_THREADS};
use crate::backend::cpu::Precision;
use crate::backend::KvCache;
use crate::decode::{Backup, Fanout, Mode, NgramConfig, SpecConfig, BATCHED};
use crate::engine::{Device, EngineOptions, GenerateOptions};
use crate::remote::RemoteOptions;
use crate::sampling::SamplingParams;

/// Why an option object was refused: the message of its `invalid_argument` error, starting with
/// the option's JS name.
#[derive(Debug, PartialEq)]
pub struct Invalid(pub String);

/// Where a model computes, as the JS API names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename_all = "lowercase"))]
pub enum Backend {
    Gpu,
    Cpu,
}

impl FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "gpu" => Ok(Backend::Gpu),
            "cpu" => Ok(Backend::Cpu),
            other => Err(format!("'{other}' is not a backend (expected 'gpu' or 'cpu')")),
        }
    }
}

/// The engine's load options (those the package handles itself, such as `onProgress`, are added
/// in index.d.ts). Defaults are in `DEFAULTS`.
#[derive(Default, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename = "EngineLoadOptions", optional_fields))]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadOpts {
    /// Where the target runs. Default: 'gpu' when WebGPU has an adapter, else 'cpu' (with a
    /// warning). Node: 'cpu'.
    #[cfg_attr(test, ts(as = "Option<Backend>"))]
    backend: Option<String>,
    /// Where the draft runs. Default 'cpu'. With 'ssd' among the modes it runs in its own Web
    /// Worker ('gpu': on a GPUDevice that worker requests for itself), SSD's speculation
    /// overlapping the target, SD drafting there too; the engine's worker then holds no copy of
    /// the draft.
    #[cfg_attr(test, ts(as = "Option<Backend>"))]
    draft_backend: Option<String>,
    /// KV-cache size in tokens (prompt + output), capped by the model; default `DEFAULTS.context`.
    context: Option<usize>,
    /// Draft tokens per round for SD/SSD (default `DEFAULTS.specK`).
    spec_k: Option<usize>,
    /// SSD fan-out: 'uniform:F', 'geometric', 'geometric:B' or 'top-p:P' (default `DEFAULTS.fanout`).
    fanout: Option<String>,
    /// SSD on a cache miss: 'jit' (draft now) or 'fast' (verify the bonus token alone); default
    /// `DEFAULTS.backup`.
    #[cfg_attr(test, ts(as = "Option<crate::decode::Backup>"))]
    backup: Option<String>,
    /// Modes to prepare. Default: all three with a draft, ['ar'] without.
    #[cfg_attr(test, ts(as = "Option<Vec<crate::decode::Mode>>"))]
    modes: Option<Vec<String>>,
    /// Draft SD's tokens by looking the text so far up in the prompt, with no draft model (use
    /// mode 'sd'; not with a `draft`).
    prompt_lookup: Option<bool>,
    /// Threads the CPU backend computes on, 1 to `LIMITS.maxThreads`. Default: one per logical
    /// core (`navigator.hardwareConcurrency`, in Node `os.availableParallelism()`), at most
    /// `DEFAULTS.threadCap`. Above 1 the package loads its threads build (a pool of workers
    /// sharing wasm memory), which needs a cross-origin isolated page (served with
    /// `Cross-Origin-Opener-Policy: same-origin` and `Cross-Origin-Embedder-Policy:
    /// require-corp`); elsewhere, and when the target or the draft runs on WebGPU, the engine
    /// computes on one thread (`info.threads` says). The draft worker computes on as many where
    /// it drafts for SD, on one where it serves SSD alone. 1: the single-thread build. In Node
    /// the first load picks the build for the process.
    threads: Option<usize>,
    /// How a WebGPU model's KV cache stores K and V: 'f16' (default; half the GPU memory, so
    /// twice the context in the same memory, and half the bytes attention reads) or 'f32'. A CPU
    /// model's cache is f32.
    #[cfg_attr(test, ts(as = "Option<crate::backend::KvCache>"))]
    kv_cache: Option<String>,
    /// f16 arithmetic in a WebGPU model's matmul for decoding and verification: weights decoded
    /// and multiplied in f16, added up in f32. The adapter must offer 'shader-f16' (elsewhere the
    /// load fails with code 'gpu_error'). Off by default: logits move about 5x further from the
    /// fp32 reference than with f32 arithmetic (greedy speculation still gives exactly the
    /// target's tokens), and its speed on a GPU is not yet measured.
    shader_f16: Option<bool>,
    /// Sequences that generate at once, 1 to `LIMITS.maxParallel` (default `DEFAULTS.parallel`).
    /// Above 1, concurrent `generate`, `stream` and `chat.completions.create` calls (and a chat
    /// completion's `n` choices) run as one batch, each forward reading the weights once for all
    /// of them, and each call's output is what it would be alone. The engine then runs AR and SD
    /// (the draft in the engine's worker; SSD's speculation serves one sequence and is not
    /// offered), chooses between them for the batch size each call joins, and holds a KV cache of
    /// `context` tokens per sequence. Calls beyond `parallel` wait for a sequence to free up.
    parallel: Option<usize>,
}

/// How a model on the GPU runs, beside the adapter the browser picks.
#[derive(Clone, Copy)]
struct GpuChoices {
    kv_cache: KvCache,
    shader_f16: bool,
}

fn device(name: Option<&str>, option: &str, precision: Precision, threads: usize, gpu: GpuChoices) -> Result<Device, Invalid> {
    let GpuChoices { kv_cache, shader_f16 } = gpu;
    match name.map(str::parse).transpose().map_err(|e| Invalid(format!("{option}: {e}")))?.unwrap_or(Backend::Cpu) {
        Backend::Cpu => Ok(Device::Cpu { threads, precision }),
        Backend::Gpu => Ok(Device::Gpu { adapter: None, attention_split: None, matvec_threads: None, kv_cache, shader_f16 }),
    }
}

fn spec(k: Option<usize>, fanout: Option<&str>, backup: Option<&str>) -> Result<SpecConfig, Invalid> {
    let mut s = SpecConfig::default();
    if let Some(k) = k {
        s.k = k;
    }
    if let Some(f) = fanout {
        s.fanout = f.parse::<Fanout>().map_err(|e| Invalid(format!("fanout: {e}")))?;
    }
    if let Some(b) = backup {
        s.backup = b.parse::<Backup>().map_err(|e| Invalid(format!("backup: {e}")))?;
    }
    s.validate().map_err(|e| Invalid(format!("specK/fanout: {e}")))?;
    Ok(s)
}

impl LoadOpts {
    /// The `parallel` option, checked.
    pub fn parallel(&self) -> Result<usize, Invalid> {
        match self.parallel {
            None => Ok(DEFAULT_PARALLEL),
            Some(n) if (1..=MAX_PARALLEL).contains(&n) => Ok(n),
            Some(n) => Err(Invalid(format!("parallel: must be 1 to {MAX_PARALLEL}, got {n}"))),
        }
    }

    pub fn engine_options(&self) -> Result<EngineOptions, Invalid> {
        let modes = self
            .modes
            .iter()
            .flatten()
            .map(|m| m.parse::<Mode>().map_err(|e| Invalid(format!("modes: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        if self.parallel()? > 1 {
            if let Some(m) = modes.iter().find(|m| !BATCHED.contains(m)) {
                return Err(Invalid(format!("modes: {m} does not run with parallel above 1 (its speculation serves one sequence)")));
            }
        }
        let defaults = EngineOptions::default();
        let context = self.context.unwrap_or(defaults.context);
        if context == 0 {
            return Err(Invalid("context: must be at least 1 token".into()));
        }
        // Without the option: all the threads of the pool (none outside the threads build).
        let threads = match self.threads {
            None => 0,
            Some(t) if (1..=MAX_THREADS).contains(&t) => t,
            Some(t) => return Err(Invalid(format!("threads: must be 1 to {MAX_THREADS}, got {t}"))),
        };
        let kv_cache = match self.kv_cache.as_deref() {
            None => KvCache::default(),
            Some(name) => name.parse::<KvCache>().map_err(|e| Invalid(format!("kvCache: {e}")))?,
        };
        let gpu = GpuChoices { kv_cache, shader_f16: self.shader_f16.unwrap_or(false) };
        Ok(EngineOptions {
            target: device(self.backend.as_deref(), "backend", Precision::Exact, threads, gpu)?,
            draft: device(self.draft_backend.as_deref(), "draftBackend", Precision::Fast, threads, gpu)?,
            spec: spec(self.spec_k, self.fanout.as_deref(), self.backup.as_deref())?,
            context,
            // AR needs no draft and is always there: with it listed, a local SD draft makes the
            // engine measure and choose its default mode (again once SSD's draft worker attaches).
            // Ar alone prepares no local draft at all: the draft then lives in its worker.
            modes: std::iter::once(Mode::Ar).chain(modes.into_iter().filter(|&m| m != Mode::Ar)).collect(),
            ssd_thread: false,
            lookup: self.prompt_lookup.unwrap_or(false).then(NgramConfig::default),
            auto: true,
            // Drafts run as stored: requantizing at load would take the page's one thread, and
            // what a cheaper draft buys was measured natively only.
            draft_quant: None,
            draft_head: None,
        })
    }
}

/// A target on a server that speaks SGLang's `/generate` (`saguaro serve`, or SGLang): every
/// round sends the draft's tokens there for verification in one request. Needs a `draft`, which
/// runs here and whose tokenizer must be the server's. Greedy output equals the server model's
/// own; sampled output is exact with `topK` between 1 and `topN` (other sampling is refused).
#[derive(Default, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(optional_fields))]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerTarget {
    /// `http://HOST:PORT`. The server must allow this page's origin (`saguaro serve` does: CORS).
    #[cfg_attr(test, ts(optional = false))]
    server: String,
    /// Likeliest tokens the server returns per verified position (default `DEFAULTS.serverTopN`).
    top_n: Option<usize>,
    /// Limit on one request, in ms (default `DEFAULTS.serverTimeoutMs`).
    timeout_ms: Option<f64>,
    /// Further attempts after a failed request, with a doubling wait from
    /// `DEFAULTS.serverBackoffMs` (default `DEFAULTS.serverRetries`).
    retries: Option<u32>,
}

impl ServerTarget {
    pub fn remote_options(&self) -> Result<RemoteOptions, Invalid> {
        let mut o = RemoteOptions::new(&self.server);
        if !o.url.starts_with("http://") {
            return Err(Invalid(format!("target.server: '{}' is not a server address (http://HOST:PORT)", self.server)));
        }
        if let Some(n) = self.top_n {
            if n == 0 {
                return Err(Invalid("target.topN: must be at least 1".into()));
            }
            o.top_n = n;
        }
        if let Some(ms) = self.timeout_ms {
            if !(ms.is_finite() && ms > 0.0) {
                return Err(Invalid(format!("target.timeoutMs: must be a positive number of milliseconds, got {ms}")));
            }
            o.timeout = std::time::Duration::from_secs_f64(ms / 1000.0);
        }
        if let Some(r) = self.retries {
            o.retries = r;
        }
        Ok(o)
    }
}

/// The engine's generate options (those the package handles itself, such as `signal`, are
/// added in index.d.ts).
#[derive(Default, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename = "EngineGenerateOptions", optional_fields))]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct GenerateOpts {
    /// Default: the engine's own choice (`info.defaultMode`), made from the cost of each mode it
    /// measured at load and refined by the acceptance later generations see; with it the engine
    /// also picks K, and `stats.auto` says what it measured.
    #[cfg_attr(test, ts(as = "Option<crate::decode::Mode>"))]
    mode: Option<String>,
    /// Upper bound on generated tokens (default `DEFAULTS.maxTokens`).
    max_tokens: Option<usize>,
    /// 0 (the default) is greedy decoding.
    temperature: Option<f32>,
    /// Keep the K most likely tokens (0, the default: off).
    top_k: Option<usize>,
    /// Nucleus sampling, in (0, 1] (1, the default: off).
    top_p: Option<f32>,
    /// The same seed gives the same output.
    seed: Option<u64>,
    spec_k: Option<usize>,
    fanout: Option<String>,
    /// Wrap a string prompt as a user message in the model's chat template.
    #[cfg_attr(test, ts(optional = nullable))]
    pub chat: bool,
    /// The output's format, as OpenAI's API takes it: `{ type: 'json_object' }` (any JSON
    /// object), `{ type: 'json_schema', json_schema: { name, schema, strict } }`, or
    /// `{ type: 'text' }` (the default: free text).
    #[cfg_attr(test, ts(inline))]
    response_format: Option<ResponseFormat>,
    /// A Lark grammar (llguidance's dialect) the output matches.
    grammar: Option<String>,
    /// A regular expression the whole output matches.
    regex: Option<String>,
    /// Functions the model may call, OpenAI's `tools` (a chat prompt, a model whose chat template
    /// lists tools): the result's `toolCalls` holds the calls made.
    tools: Option<Vec<Tool>>,
    /// OpenAI's `tool_choice`: `'auto'` (the default: a call or text), `'required'`, `'none'`, or
    /// `{ type: 'function', function: { name } }`.
    #[cfg_attr(test, ts(optional, type = "'auto' | 'required' | 'none' | { type: 'function', function: { name: string } }"))]
    tool_choice: Option<serde_json::Value>,
}

/// OpenAI's `response_format`.
#[derive(Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema {
        #[cfg_attr(test, ts(inline))]
        json_schema: JsonSchemaFormat,
    },
}

/// A JSON schema as OpenAI's `response_format` names it.
#[derive(Deserialize)]
// `name` and `strict` are taken so that OpenAI's requests pass; neither changes what is generated.
#[allow(dead_code)]
#[cfg_attr(test, derive(ts_rs::TS), ts(optional_fields))]
pub struct JsonSchemaFormat {
    /// What the schema is called (OpenAI requires one; it is not used here).
    pub name: Option<String>,
    #[cfg_attr(test, ts(type = "Record<string, unknown>"))]
    pub schema: serde_json::Value,
    /// The output always follows the schema here: `false` is taken as `true`.
    pub strict: Option<bool>,
}

impl ResponseFormat {
    /// The grammar it asks for; `None` for free text.
    pub fn grammar(&self) -> Option<GrammarSpec> {
        match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(GrammarSpec::JsonObject),
            ResponseFormat::JsonSchema { json_schema } => Some(GrammarSpec::JsonSchema(json_schema.schema.clone())),
        }
    }
}

impl GenerateOpts {
    pub fn generate_options(&self) -> Result<GenerateOptions, Invalid> {
        let mode = self.mode.as_deref().map(str::parse::<Mode>).transpose().map_err(|e| Invalid(format!("mode: {e}")))?;
        let max_tokens = self.max_tokens.unwrap_or(GenerateOptions::default().max_tokens);
        if max_tokens == 0 {
            return Err(Invalid("maxTokens: must be at least 1".into()));
        }
        let d = SamplingParams::default();
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.unwrap_or(d.top_k),
            top_p: self.top_p.unwrap_or(d.top_p),
            seed: self.seed.unwrap_or(d.seed),
        };
        sampling.validate().map_err(|e| Invalid(e.to_string()))?;
        let spec = match (self.spec_k, &self.fanout) {
            (None, None) => None,
            (k, f) => Some(spec(k, f.as_deref(), None)?),
        };
        let grammars = [
            self.response_format.as_ref().and_then(ResponseFormat::grammar),
            self.grammar.clone().map(GrammarSpec::Lark),
            self.regex.clone().map(GrammarSpec::Regex),
        ];
        let mut given = grammars.into_iter().flatten();
        let grammar = given.next();
        if given.next().is_some() {
            return Err(Invalid("responseFormat, grammar, regex: give at most one".into()));
        }
        let tools = match (&self.tools, &self.tool_choice) {
            (None, None) => None,
            (None, Some(_)) => return Err(Invalid("toolChoice: give tools to choose among".into())),
            (Some(tools), choice) => {
                let choice = choice.as_ref().map(ToolChoice::from_openai).transpose().map_err(|e| Invalid(e.to_string()))?;
                Some(ToolUse { tools: tools.clone(), choice: choice.unwrap_or_default() })
            }
        };
        Ok(GenerateOptions { mode, max_tokens, sampling, spec, grammar, tools })
    }
}

/// What the engine says of what it loaded (the package adds where each model runs).
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename = "EngineInfoBase"))]
#[serde(rename_all = "camelCase")]
pub struct EngineInfo {
    /// The target's backend, e.g. 'cpu (2 threads, simd128)'.
    pub target_backend: String,
    /// Where the draft model computes, as its backend names itself, e.g. 'gpu (BrowserWebGpu)' (a
    /// browser may withhold the adapter's name) or 'cpu (1 threads, simd128)'; null without a
    /// draft model (or with prompt lookup).
    pub draft_device: Option<String>,
    /// Threads the engine's CPU work runs on (see `LoadOptions.threads`; 1 in the single-thread
    /// builds).
    pub threads: usize,
    pub has_draft: bool,
    #[cfg_attr(test, ts(as = "crate::decode::Mode"))]
    pub default_mode: String,
    pub vocab_size: usize,
    pub context_length: usize,
    /// The text of each token that ends generation (an OpenAI-style reply leaves it out).
    pub stop_texts: Vec<String>,
    /// The engine worker's wasm memory in bytes, its peak so far (wasm memory only grows). A
    /// target on WebGPU streams to the GPU tensor by tensor and is never held whole there.
    pub wasm_memory_bytes: f64,
    /// Sequences that generate at once (the `parallel` option).
    pub parallel: usize,
}
