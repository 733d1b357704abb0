//! The JS API's option objects (camelCase, every field optional) and their checks: a wrong value
//! is an `invalid_argument` error that names the option.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;

use super::js_error_with;
use crate::backend::cpu::Precision;
use crate::backend::KvCache;
use crate::decode::{Backup, Fanout, Mode, NgramConfig, SpecConfig};
use crate::engine::{Device, EngineOptions, GenerateOptions, Prompt};
use crate::model::config::ModelConfig;
use crate::model::tokenizer::ChatMessage;
use crate::remote::RemoteOptions;
use crate::sampling::SamplingParams;

fn invalid(msg: String) -> JsValue {
    js_error_with("invalid_argument", &msg)
}

/// Read a JS value (`undefined` and `null` mean "all defaults"). It goes through JSON because
/// serde-wasm-bindgen reads a struct's fields by name and never sees the other keys of an
/// object: these structs' `deny_unknown_fields` is the one list of option names, for JS too.
pub fn parse<T: DeserializeOwned + Default>(v: JsValue) -> Result<T, JsValue> {
    parse_named(v, "options")
}

/// [`parse`], its errors starting with `what` (the object's name in the JS API).
pub fn parse_named<T: DeserializeOwned + Default>(v: JsValue, what: &str) -> Result<T, JsValue> {
    if v.is_undefined() || v.is_null() {
        return Ok(T::default());
    }
    let json = js_sys::JSON::stringify(&v)
        .ok()
        .and_then(|s| s.as_string())
        .ok_or_else(|| invalid(format!("{what}: expected a plain object")))?;
    serde_json::from_str(&json).map_err(|e| invalid(format!("{what}: {e}")))
}

#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadOpts {
    backend: Option<String>,
    draft_backend: Option<String>,
    context: Option<usize>,
    spec_k: Option<usize>,
    fanout: Option<String>,
    backup: Option<String>,
    /// Modes to prepare a local draft for ("sd", "ssd"); the JS side attaches a worker draft.
    modes: Option<Vec<String>>,
    /// Draft by prompt lookup (no draft model; mode "sd").
    prompt_lookup: Option<bool>,
    /// CPU threads: the JS side starts the threads build's pool with as many; the CPU backend uses
    /// at most those the pool has (1 in the single-thread builds).
    threads: Option<usize>,
    /// How a GPU model's KV cache stores K and V: "f16" (the default) or "f32".
    kv_cache: Option<String>,
    /// f16 arithmetic in a GPU model's decode matmul (the adapter must offer `shader-f16`).
    shader_f16: Option<bool>,
}

/// The most threads the `threads` option takes.
pub(crate) const MAX_THREADS: usize = 64;

/// How a model on the GPU runs, beside the adapter the browser picks.
#[derive(Clone, Copy)]
struct GpuChoices {
    kv_cache: KvCache,
    shader_f16: bool,
}

fn device(name: Option<&str>, option: &str, precision: Precision, threads: usize, gpu: GpuChoices) -> Result<Device, JsValue> {
    let GpuChoices { kv_cache, shader_f16 } = gpu;
    match name.unwrap_or("cpu") {
        "cpu" => Ok(Device::Cpu { threads, precision }),
        "gpu" => Ok(Device::Gpu { adapter: None, attention_split: None, matvec_threads: None, kv_cache, shader_f16 }),
        other => Err(invalid(format!("{option}: '{other}' is not a backend (expected 'gpu' or 'cpu')"))),
    }
}

fn spec(k: Option<usize>, fanout: Option<&str>, backup: Option<&str>) -> Result<SpecConfig, JsValue> {
    let mut s = SpecConfig::default();
    if let Some(k) = k {
        s.k = k;
    }
    if let Some(f) = fanout {
        s.fanout = f.parse::<Fanout>().map_err(|e| invalid(format!("fanout: {e}")))?;
    }
    if let Some(b) = backup {
        s.backup = b.parse::<Backup>().map_err(|e| invalid(format!("backup: {e}")))?;
    }
    s.validate().map_err(|e| invalid(format!("specK/fanout: {e}")))?;
    Ok(s)
}

impl LoadOpts {
    pub fn engine_options(&self) -> Result<EngineOptions, JsValue> {
        let modes = self
            .modes
            .iter()
            .flatten()
            .map(|m| m.parse::<Mode>().map_err(|e| invalid(format!("modes: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let context = self.context.unwrap_or(2048);
        if context == 0 {
            return Err(invalid("context: must be at least 1 token".into()));
        }
        // Without the option: all the threads of the pool (none outside the threads build).
        let threads = match self.threads {
            None => 0,
            Some(t) if (1..=MAX_THREADS).contains(&t) => t,
            Some(t) => return Err(invalid(format!("threads: must be 1 to {MAX_THREADS}, got {t}"))),
        };
        let kv_cache = match self.kv_cache.as_deref() {
            None => KvCache::default(),
            Some(name) => name.parse::<KvCache>().map_err(|e| invalid(format!("kvCache: {e}")))?,
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

/// A target on a server: `{server: 'http://HOST:PORT', topN, timeoutMs, retries}`.
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerTarget {
    server: String,
    top_n: Option<usize>,
    timeout_ms: Option<f64>,
    retries: Option<u32>,
}

impl ServerTarget {
    pub fn remote_options(&self) -> Result<RemoteOptions, JsValue> {
        let mut o = RemoteOptions::new(&self.server);
        if !o.url.starts_with("http://") {
            return Err(invalid(format!("target.server: '{}' is not a server address (http://HOST:PORT)", self.server)));
        }
        if let Some(n) = self.top_n {
            if n == 0 {
                return Err(invalid("target.topN: must be at least 1".into()));
            }
            o.top_n = n;
        }
        if let Some(ms) = self.timeout_ms {
            if !(ms.is_finite() && ms > 0.0) {
                return Err(invalid(format!("target.timeoutMs: must be a positive number of milliseconds, got {ms}")));
            }
            o.timeout = std::time::Duration::from_secs_f64(ms / 1000.0);
        }
        if let Some(r) = self.retries {
            o.retries = r;
        }
        Ok(o)
    }
}

#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct GenerateOpts {
    mode: Option<String>,
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    seed: Option<u64>,
    spec_k: Option<usize>,
    fanout: Option<String>,
    pub chat: bool,
}

impl GenerateOpts {
    pub fn generate_options(&self) -> Result<GenerateOptions, JsValue> {
        let mode = self.mode.as_deref().map(str::parse::<Mode>).transpose().map_err(|e| invalid(format!("mode: {e}")))?;
        let max_tokens = self.max_tokens.unwrap_or(256);
        if max_tokens == 0 {
            return Err(invalid("maxTokens: must be at least 1".into()));
        }
        let d = SamplingParams::default();
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.unwrap_or(d.top_k),
            top_p: self.top_p.unwrap_or(d.top_p),
            seed: self.seed.unwrap_or(d.seed),
        };
        sampling.validate().map_err(|e| invalid(e.to_string()))?;
        let spec = match (self.spec_k, &self.fanout) {
            (None, None) => None,
            (k, f) => Some(spec(k, f.as_deref(), None)?),
        };
        Ok(GenerateOptions { mode, max_tokens, sampling, spec })
    }
}

#[derive(Deserialize)]
struct Conversation {
    messages: Vec<ChatMessage>,
}

/// A string (wrapped as one user message when `chat`), or `{messages: [{role, content}]}`.
pub fn prompt(v: JsValue, chat: bool) -> Result<Prompt, JsValue> {
    if let Some(text) = v.as_string() {
        return Ok(if chat { Prompt::Chat(vec![ChatMessage::new("user", &text)]) } else { Prompt::Text(text) });
    }
    let c: Conversation = serde_wasm_bindgen::from_value(v)
        .map_err(|e| invalid(format!("prompt: expected a string or {{messages: [{{role, content}}]}} ({e})")))?;
    if c.messages.is_empty() {
        return Err(invalid("prompt: messages is empty".into()));
    }
    Ok(Prompt::Chat(c.messages))
}

/// What a draft worker tells the engine about its model.
#[derive(Default, Serialize, Deserialize)]
pub struct DraftInfo {
    pub config: Option<ModelConfig>,
    pub vocab: String,
    /// Where it computes: "cpu" (the default) or "gpu".
    #[serde(default)]
    pub backend: Option<String>,
    /// Its backend's name, e.g. "gpu (SwiftShader …)".
    #[serde(default)]
    pub device: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineInfo {
    pub target_backend: String,
    /// The draft model's backend, wherever it is held; `None` without one (or with prompt lookup).
    pub draft_device: Option<String>,
    /// Threads of the compute pool in this instance (1 in the single-thread builds).
    pub threads: usize,
    pub has_draft: bool,
    pub default_mode: String,
    pub vocab_size: usize,
    pub context_length: usize,
    /// The text of each token that ends generation (an OpenAI-style reply leaves it out).
    pub stop_texts: Vec<String>,
    /// This instance's wasm memory: it only grows, so this is its peak so far (a target streamed
    /// to the GPU never held whole in it).
    pub wasm_memory_bytes: f64,
}
