//! llama.cpp's server beside our batching: `llama-server -np N` (N parallel slots, continuous
//! batching) on the same target file and threads, with and without `--model-draft` where we
//! have a draft, each run as N concurrent requests of the bench's prompts through its OpenAI
//! endpoints. Time to first token is the server's own prompt time (`timings.prompt_ms`): the
//! requests are not streamed.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use web_time::Instant;

use saguaro::engine::Prompt;
use saguaro::{Error, Result};

use super::concurrency::Row;

pub struct Setup<'a> {
    pub binary: &'a Path,
    pub target: &'a Path,
    pub draft: Option<&'a Path>,
    /// 0: every core.
    pub threads: usize,
    /// Tokens per slot.
    pub context: usize,
    pub max_tokens: usize,
}

/// A running llama-server, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn threads(n: usize) -> usize {
    if n > 0 {
        n
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// Start the server with `slots` slots (and the draft where `draft`) and wait until it answers.
fn start(s: &Setup, slots: usize, draft: Option<&Path>) -> Result<Server> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| Error::InvalidArgument(format!("no free port for llama-server: {e}")))?
        .port();
    let t = threads(s.threads).to_string();
    let mut cmd = Command::new(s.binary);
    cmd.args(["-m", &s.target.display().to_string(), "-t", &t, "-tb", &t, "-np", &slots.to_string()])
        .args(["-c", &(s.context * slots).to_string(), "--port", &port.to_string(), "-dev", "none"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(d) = draft {
        cmd.args(["--model-draft", &d.display().to_string(), "--threads-draft", &t, "-devd", "none"]);
    }
    let mut child = cmd.spawn().map_err(|e| Error::InvalidArgument(format!("--llama-server: cannot run {}: {e}", s.binary.display())))?;
    // Its log is read (and dropped) so that a full pipe never stalls it.
    if let Some(err) = child.stderr.take() {
        std::thread::spawn(move || BufReader::new(err).lines().for_each(drop));
    }
    let server = Server { child, url: format!("http://127.0.0.1:{port}") };
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(120) {
        if ureq::get(&format!("{}/health", server.url)).call().is_ok() {
            return Ok(server);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(Error::InvalidArgument("llama-server did not answer /health within 120 s".into()))
}

/// One request: (completion tokens, prompt ms, seconds it took).
fn request(url: &str, prompt: &Prompt, max_tokens: usize) -> Result<(usize, f64, f64)> {
    let (path, mut body) = match prompt {
        Prompt::Text(t) => ("/v1/completions", json!({ "prompt": t })),
        Prompt::Chat(m) => ("/v1/chat/completions", json!({ "messages": m })),
        Prompt::Tokens(t) => ("/v1/completions", json!({ "prompt": t })),
    };
    body["max_tokens"] = json!(max_tokens);
    body["temperature"] = json!(0.0);
    body["cache_prompt"] = json!(false);
    let t0 = Instant::now();
    let fail = |e: String| Error::InvalidArgument(format!("llama-server {path}: {e}"));
    let bytes = serde_json::to_vec(&body).map_err(|e| fail(e.to_string()))?;
    let mut resp = ureq::post(&format!("{url}{path}"))
        .header("Content-Type", "application/json")
        .send(&bytes[..])
        .map_err(|e| fail(e.to_string()))?;
    let text = resp.body_mut().read_to_string().map_err(|e| fail(e.to_string()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
    let tokens = v["usage"]["completion_tokens"].as_u64().ok_or_else(|| fail(format!("no usage in {v}")))?;
    Ok((tokens as usize, v["timings"]["prompt_ms"].as_f64().unwrap_or(0.0), t0.elapsed().as_secs_f64()))
}

/// llama-server with `concurrency` slots, without and (where we have one) with the draft: a row each.
pub fn run(s: &Setup, concurrency: usize, prompts: &[Prompt]) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for draft in std::iter::once(None).chain(s.draft.map(Some)) {
        let server = start(s, concurrency, draft)?;
        // Once to warm it (weights paged in), then timed.
        request(&server.url, &prompts[0], 4)?;
        let t0 = Instant::now();
        let results: Vec<Result<(usize, f64, f64)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..concurrency)
                .map(|i| {
                    let (url, prompt) = (&server.url, &prompts[i % prompts.len()]);
                    scope.spawn(move || request(url, prompt, s.max_tokens))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::Worker("a request thread panicked".into())))).collect()
        });
        let wall = t0.elapsed().as_secs_f64();
        let results = results.into_iter().collect::<Result<Vec<_>>>()?;
        let n = concurrency as f64;
        let row = Row {
            who: if draft.is_some() { "llama-server+draft".into() } else { "llama-server".into() },
            concurrency,
            aggregate_tokens_per_s: results.iter().map(|r| r.0).sum::<usize>() as f64 / wall,
            stream_tokens_per_s: results.iter().map(|r| r.0 as f64 / r.2).sum::<f64>() / n,
            time_to_first_token_ms: results.iter().map(|r| r.1).sum::<f64>() / n,
            modes: String::new(),
        };
        eprintln!("{} x{concurrency}: {:.1} tok/s in all, {:.1} per stream", row.who, row.aggregate_tokens_per_s, row.stream_tokens_per_s);
        rows.push(row);
    }
    Ok(rows)
}
