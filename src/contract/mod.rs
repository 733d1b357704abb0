//! The JS API's contract, said once in Rust: the option objects the npm package takes (and their
//! checks), what it reports, its defaults, limits and error codes
//! ([`ErrorCode`](crate::error::ErrorCode)). Plain Rust built everywhere: the wasm bindings
//! (src/wasm) read their options through it and export [`defaults`] and [`limits`], and a native
//! test generates the package's TypeScript declarations and constants from it
//! (pkg-config/contract.generated.d.ts and .js; see `generated`).

mod options;
#[cfg(test)]
mod generated;

use serde::Serialize;
use serde_json::Value;

use crate::decode::{Mode, SpecConfig, BATCHED};
use crate::engine::{EngineOptions, GenerateOptions};
use crate::remote::client::{DEFAULT_BACKOFF, DEFAULT_RETRIES, DEFAULT_TIMEOUT, DEFAULT_TOP_N};
use crate::sampling::SamplingParams;

pub use options::{Backend, EngineInfo, GenerateOpts, Invalid, LoadOpts, ServerTarget};

/// The most threads the `threads` option takes.
pub const MAX_THREADS: usize = 64;
/// `threads` without the option is one per logical core, at most this many: beyond a few threads
/// a decode step gains little (memory bandwidth, a synchronization per matmul).
pub const DEFAULT_THREAD_CAP: usize = 8;
/// The most sequences the `parallel` option takes: each holds a KV cache of `context` tokens.
pub const MAX_PARALLEL: usize = 16;
/// One sequence at a time: every mode, SSD's included.
pub const DEFAULT_PARALLEL: usize = 1;
/// The largest model file a model in wasm memory is read from: wasm32's memory is 4 GiB in all.
pub const MAX_MODEL_BYTES: f64 = 3.5 * (1u64 << 30) as f64;

/// What an option left out means (the package's `DEFAULTS`).
#[derive(Debug, PartialEq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
#[serde(rename_all = "camelCase")]
pub struct Defaults {
    /// KV-cache size in tokens (prompt + output), capped by the model.
    pub context: usize,
    /// Upper bound on generated tokens.
    pub max_tokens: usize,
    /// `threads` is one per logical core, at most this many.
    pub thread_cap: usize,
    /// The modes a load with a draft prepares (without one: 'ar' alone).
    #[cfg_attr(test, ts(as = "Vec<Mode>"))]
    pub modes: Vec<String>,
    /// The modes a load with a draft and `parallel` above 1 prepares: those that run in a batch.
    #[cfg_attr(test, ts(as = "Vec<Mode>"))]
    pub batch_modes: Vec<String>,
    /// Sequences that generate at once.
    pub parallel: usize,
    /// Draft tokens per round for SD and SSD.
    pub spec_k: usize,
    /// SSD's fan-out.
    pub fanout: String,
    /// SSD on a cache miss.
    #[cfg_attr(test, ts(as = "crate::decode::Backup"))]
    pub backup: String,
    /// 0 is greedy decoding.
    pub temperature: f32,
    /// 0 is off.
    pub top_k: usize,
    /// 1 is off.
    pub top_p: f32,
    pub seed: u64,
    /// A server target's likeliest tokens returned per verified position.
    pub server_top_n: usize,
    /// A server target's limit on one request, in ms.
    pub server_timeout_ms: f64,
    /// A server target's further attempts after a failed request.
    pub server_retries: u32,
    /// The wait before a server target's first retry, in ms; doubled before each further one.
    pub server_backoff_ms: f64,
}

/// The bounds of what the package takes (its `LIMITS`).
#[derive(Debug, PartialEq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// The most threads the `threads` option takes.
    pub max_threads: usize,
    /// The largest model (a CPU model, a draft: one computed on in wasm memory), in bytes.
    pub max_model_bytes: f64,
    /// The most sequences the `parallel` option takes.
    pub max_parallel: usize,
}

/// The defaults, from where the engine keeps them.
pub fn defaults() -> Defaults {
    let spec = SpecConfig::default();
    let sampling = SamplingParams::default();
    Defaults {
        context: EngineOptions::default().context,
        max_tokens: GenerateOptions::default().max_tokens,
        thread_cap: DEFAULT_THREAD_CAP,
        modes: Mode::ALL.iter().map(Mode::to_string).collect(),
        batch_modes: BATCHED.iter().map(Mode::to_string).collect(),
        parallel: DEFAULT_PARALLEL,
        spec_k: spec.k,
        fanout: spec.fanout.to_string(),
        backup: spec.backup.to_string(),
        temperature: sampling.temperature,
        top_k: sampling.top_k,
        top_p: sampling.top_p,
        seed: sampling.seed,
        server_top_n: DEFAULT_TOP_N,
        server_timeout_ms: DEFAULT_TIMEOUT.as_secs_f64() * 1000.0,
        server_retries: DEFAULT_RETRIES,
        server_backoff_ms: DEFAULT_BACKOFF.as_secs_f64() * 1000.0,
    }
}

pub fn limits() -> Limits {
    Limits { max_threads: MAX_THREADS, max_model_bytes: MAX_MODEL_BYTES, max_parallel: MAX_PARALLEL }
}

/// A result as JS sees it: the Rust side's snake_case keys (the CLI's JSON) in camelCase, at
/// every depth. The generated TypeScript types of results say the same (`rename_all`).
pub fn camel(v: Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, x)| (camel_key(&k), camel(x))).collect()),
        Value::Array(items) => Value::Array(items.into_iter().map(camel).collect()),
        other => other,
    }
}

fn camel_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut upper = false;
    for c in key.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_renames_keys_at_every_depth_and_leaves_values() {
        let v = serde_json::json!({"prompt_tokens": 3, "finish": "max_tokens", "stats": {"remote": {"round_trip_ms": 1.5}}, "timeline": [{"hit": null}]});
        let want = serde_json::json!({"promptTokens": 3, "finish": "max_tokens", "stats": {"remote": {"roundTripMs": 1.5}}, "timeline": [{"hit": null}]});
        assert_eq!(camel(v), want);
    }
}
