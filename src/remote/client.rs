//! The client side: a server that speaks SGLang's `/generate` as a target model. It implements
//! [`Lm`], so AR, SD and SSD verify through it unchanged and never learn about HTTP.
//!
//! The server holds the KV cache; this keeps the committed sequence and sends it whole with each
//! forward (as SGLang's API wants: it finds the shared prefix in its own cache). So a server that
//! restarted, or evicted our prefix, only recomputes it, and a failed request can simply be sent
//! again: it is idempotent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::LocalBoxFuture;
use serde::de::DeserializeOwned;
use web_time::Instant;

use super::protocol::{ErrorBody, GenerateRequest, GenerateResponse, MetaInfo, ModelInfo, TokenLogprob, WireSampling};
use super::transport::{HttpRequest, Transport};
use crate::backend::Batch;
use crate::decode::{elapsed_ms, Generation, Output, RemoteStats, Request, SelfGenerating, Sink, Stats};
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::runner::Lm;

/// How to reach the server and how hard to try.
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// `http://HOST:PORT` (plain HTTP).
    pub url: String,
    /// Limit on one request, from connecting to the last byte of the answer.
    pub timeout: Duration,
    /// Further attempts after a failed request (refused, reset, timed out, 5xx, unreadable).
    pub retries: u32,
    /// Wait before the first retry; doubled before each further one.
    pub backoff: Duration,
    /// Most likely tokens the server returns per position for sampled verification: sampling is
    /// exact only with top-k in 1..=top_n (the whole truncated distribution comes back).
    pub top_n: usize,
}

// [`RemoteOptions`]' defaults, for every front-end (the CLI's `--server-*`, the JS API's server target).
/// Limit on one request.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Further attempts after a failed request.
pub const DEFAULT_RETRIES: u32 = 3;
/// The first wait before a retry, doubled at each.
pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(100);
/// Likeliest tokens the server returns per verified position.
pub const DEFAULT_TOP_N: usize = 64;

impl RemoteOptions {
    pub fn new(url: &str) -> Self {
        RemoteOptions {
            url: url.trim_end_matches('/').to_string(),
            timeout: DEFAULT_TIMEOUT,
            retries: DEFAULT_RETRIES,
            backoff: DEFAULT_BACKOFF,
            top_n: DEFAULT_TOP_N,
        }
    }
}

/// A handle on a remote target's counters that stays with the engine when the target itself is
/// boxed away as an [`Lm`].
#[derive(Clone, Debug, Default)]
pub struct RemoteLink(Arc<Mutex<RemoteStats>>);

impl RemoteLink {
    /// The counters so far, and zero them.
    pub fn take(&self) -> RemoteStats {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn update(&self, f: impl FnOnce(&mut RemoteStats)) {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Largest answer read where a small one is expected: model info, error bodies (a line of JSON).
const SMALL_ANSWER: u64 = 64 * 1024;

/// A target model on a server.
pub struct RemoteTarget {
    transport: Arc<dyn Transport>,
    opts: RemoteOptions,
    info: ModelInfo,
    config: ModelConfig,
    /// The committed sequence: what the server's KV cache holds for us.
    committed: Vec<u32>,
    /// The tokens of the last forward, which `advance` commits.
    written: Vec<u32>,
    link: RemoteLink,
}

/// A failed attempt: worth sending again or not.
enum Attempt {
    Transient(String),
    Permanent(String),
}

/// An error answer, with the server's reason when it gave one. The server may recover from its
/// own failure (5xx) and from being busy (429).
fn refused(status: u16, body: &[u8]) -> Attempt {
    let text = String::from_utf8_lossy(body);
    let message = serde_json::from_str::<ErrorBody>(&text).map(|e| e.error.message).unwrap_or_else(|_| text.into());
    let m = format!("HTTP {status}: {message}");
    if status >= 500 || status == 429 {
        Attempt::Transient(m)
    } else {
        Attempt::Permanent(m)
    }
}

/// A request's bounded retries, with a wait that doubles before each.
struct Backoff {
    wait: Duration,
    retried: u32,
}

impl Backoff {
    fn new(opts: &RemoteOptions) -> Self {
        Backoff { wait: opts.backoff, retried: 0 }
    }

    /// Wait before sending again (counted in `target`'s stats); `false` once the retries are spent.
    async fn again(&mut self, target: &RemoteTarget) -> bool {
        if self.retried >= target.opts.retries {
            return false;
        }
        target.link.update(|s| s.retries += 1);
        target.transport.sleep(self.wait).await;
        self.wait = self.wait.saturating_mul(2);
        self.retried += 1;
        true
    }

    fn tries(&self) -> u32 {
        self.retried + 1
    }
}

impl RemoteTarget {
    /// Ask the server at `opts.url` what it serves, over ureq.
    #[cfg(feature = "native")]
    pub async fn connect(opts: RemoteOptions, draft: &ModelConfig) -> Result<RemoteTarget> {
        Self::connect_with(opts, Arc::new(super::transport::Ureq::default()), draft).await
    }

    /// Ask the server at `opts.url` what it serves, sending requests through `transport`.
    /// `draft` is the local draft's shape: a remote target's shape is its server's business, so
    /// it stands in where one is needed, with the server's vocabulary size and context length
    /// when the server says them.
    pub async fn connect_with(opts: RemoteOptions, transport: Arc<dyn Transport>, draft: &ModelConfig) -> Result<RemoteTarget> {
        if opts.top_n == 0 {
            return Err(Error::option("server_top_n", "must be at least 1"));
        }
        if !opts.url.starts_with("http://") {
            return Err(Error::option("target", format!("'{}': a server is given as http://HOST:PORT", opts.url)));
        }
        let mut target = RemoteTarget {
            transport,
            opts,
            info: ModelInfo::default(),
            config: draft.clone(),
            committed: Vec::new(),
            written: Vec::new(),
            link: RemoteLink::default(),
        };
        let info: ModelInfo = target.call("/get_model_info", None, SMALL_ANSWER).await?;
        if let Some(v) = info.vocab_size {
            target.config.vocab_size = v;
        }
        if let Some(c) = info.context_length {
            target.config.context_length = c;
        }
        target.info = info;
        Ok(target)
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn options(&self) -> &RemoteOptions {
        &self.opts
    }

    /// A second handle on the same server, counting into the same [`RemoteLink`].
    pub fn fork(&self) -> RemoteTarget {
        RemoteTarget {
            transport: self.transport.clone(),
            opts: self.opts.clone(),
            info: self.info.clone(),
            config: self.config.clone(),
            committed: Vec::new(),
            written: Vec::new(),
            link: self.link.clone(),
        }
    }

    /// Remote AR: the server generates `req` on its own in one request, with its own sampling
    /// (the whole distribution, so any top-k and top-p), its tokens streamed to `sink` as server-
    /// sent events as the server draws them. Sent again after a failure only while no token has
    /// arrived: streamed tokens cannot be taken back.
    pub async fn generate_on_server(&mut self, req: &Request, sink: Sink<'_>) -> Result<Generation> {
        let room = req.validate(self, 0)?;
        if req.grammar.is_some() {
            return Err(Error::InvalidArgument("a server target generating on its own takes no grammar here: send it to the server's own API".into()));
        }
        let p = &req.sampling;
        let wire = GenerateRequest {
            input_ids: req.prompt.clone(),
            sampling_params: WireSampling {
                max_new_tokens: req.max_tokens.min(room),
                temperature: p.temperature,
                top_k: if p.top_k == 0 { -1 } else { i64::try_from(p.top_k).unwrap_or(i64::MAX) },
                top_p: p.top_p,
                stop_token_ids: req.stop.clone(),
                sampling_seed: Some(p.seed),
                ..WireSampling::default()
            },
            return_logprob: false,
            logprob_start_len: -1,
            top_logprobs_num: 0,
            rid: None,
            stream: true,
        };
        let body = serde_json::to_vec(&wire).map_err(|e| Error::server(format!("request not encoded: {e}")))?;
        // An event is a token and an empty meta_info; the last one, the whole meta_info.
        let limit = (64 * 1024 + wire.sampling_params.max_new_tokens * 512) as u64;
        let url = format!("{}/generate", self.opts.url);
        let t = Instant::now();
        let mut events = Events::new(Output::new(req, room, sink, None), self.config.vocab_size);
        let mut backoff = Backoff::new(&self.opts);
        let failure = loop {
            let on_piece = &mut |piece: &[u8]| events.feed(piece);
            let http = HttpRequest { url: &url, body: Some(&body), limit, timeout: self.opts.timeout, on_piece: Some(on_piece) };
            let failure = match self.transport.request(http).await {
                Ok(r) if (200..300).contains(&r.status) => {
                    self.link.update(|s| {
                        s.bytes_sent += body.len() as u64;
                        s.bytes_received += r.body.len() as u64;
                    });
                    break events.failure.take().or_else(|| {
                        (!events.done && !events.out.done()).then(|| "the event stream ended before [DONE]".to_string())
                    });
                }
                Ok(r) => refused(r.status, &r.body),
                Err(m) => Attempt::Transient(m),
            };
            let (message, transient) = match failure {
                Attempt::Transient(m) => (m, true),
                Attempt::Permanent(m) => (m, false),
            };
            if !(transient && events.out.tokens.is_empty() && backoff.again(self).await) {
                break Some(format!("{message} (after {} attempts)", backoff.tries()));
            }
        };
        let ms = elapsed_ms(t);
        let meta = events.meta.take().unwrap_or_default();
        self.link.update(|s| {
            s.round_trips += 1;
            s.round_trip_ms += ms;
            s.server_ms += meta.e2e_latency.map_or(ms, |secs| secs * 1000.0);
            s.cached_tokens += meta.cached_tokens;
            s.input_tokens += req.prompt.len();
        });
        if let Some(m) = failure {
            return Err(Error::server(format!("{url}: {m}")));
        }
        // The server ran a forward per token after the first, as local AR does.
        let rounds = events.out.tokens.len().saturating_sub(1);
        let mut stats = Stats { mode: "ar".into(), prompt_tokens: req.prompt.len(), rounds, ..Stats::default() };
        stats.target_busy_ms = ms;
        stats.finish(events.out.tokens.len(), ms);
        Ok(events.out.into_generation(stats))
    }

    /// Remote AR's time per token: `tokens` generated on the server in one request, the round
    /// trip included once, as in a generation.
    pub async fn server_decode_ms(&mut self, tokens: usize) -> Result<f64> {
        let prompt = crate::decode::probe(self.config.vocab_size, 4);
        let req = Request { prompt, max_tokens: tokens, ..Request::default() };
        let t = Instant::now();
        let g = self.generate_on_server(&req, &mut |_| true).await?;
        Ok(elapsed_ms(t) / g.tokens.len().max(1) as f64)
    }

    /// The counters of this target's requests.
    pub fn link(&self) -> RemoteLink {
        self.link.clone()
    }

    /// Refuse a draft whose vocabulary differs from the server's: its tokenizer's fingerprint,
    /// when the server says its own (SGLang does not), and its logits' width `draft_vocab`.
    pub fn check_vocab(&self, draft_vocab: usize, draft_fingerprint: &str) -> Result<()> {
        match (&self.info.vocab_fingerprint, self.info.vocab_size) {
            (Some(f), _) if f != draft_fingerprint => Err(Error::IncompatibleDraft(format!(
                "the server's vocabulary (fingerprint {f}) differs from the draft's ({draft_fingerprint})"
            ))),
            (_, Some(n)) if n != draft_vocab => Err(Error::IncompatibleDraft(format!(
                "the server's model scores {n} tokens, the draft {draft_vocab}"
            ))),
            _ => Ok(()),
        }
    }

    /// One request (a POST of `body`, or a GET), sent again on a transient failure up to
    /// `retries` times with a doubling wait.
    async fn call<T: DeserializeOwned>(&self, path: &str, body: Option<&[u8]>, limit: u64) -> Result<T> {
        let mut backoff = Backoff::new(&self.opts);
        loop {
            let m = match self.attempt(path, body, limit).await {
                Ok(v) => return Ok(v),
                Err(Attempt::Permanent(m)) => return Err(Error::server(format!("{} {path}: {m}", self.opts.url))),
                Err(Attempt::Transient(m)) => m,
            };
            if !backoff.again(self).await {
                return Err(Error::server(format!("{} {path}: {m} (after {} attempts)", self.opts.url, backoff.tries())));
            }
        }
    }

    async fn attempt<T: DeserializeOwned>(&self, path: &str, body: Option<&[u8]>, limit: u64) -> Result<T, Attempt> {
        let url = format!("{}{path}", self.opts.url);
        let t = Instant::now();
        let req = HttpRequest { url: &url, body, limit, timeout: self.opts.timeout, on_piece: None };
        let resp = self.transport.request(req).await.map_err(Attempt::Transient)?;
        let status = resp.status;
        if !(200..300).contains(&status) {
            return Err(refused(status, &resp.body));
        }
        let value = serde_json::from_slice(&resp.body).map_err(|e| Attempt::Transient(format!("unreadable answer: {e}")))?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let sent = body.map_or(0, |b| b.len()) as u64;
        self.link.update(|s| {
            s.bytes_sent += sent;
            s.bytes_received += resp.body.len() as u64;
            s.round_trip_ms += ms;
        });
        Ok(value)
    }

    /// Run `tokens` after the committed sequence and return, for each of `rows` (indices into
    /// `tokens`), the server's `n` most likely next tokens after that row, most likely first.
    async fn score(&mut self, batch: &Batch, rows: &[u32], n: usize) -> Result<Vec<Vec<TokenLogprob>>> {
        // A failed forward leaves nothing for `advance` to commit.
        self.written.clear();
        let len = self.committed.len();
        check_causal(batch, len)?;
        let m = batch.len();
        if rows.iter().any(|&r| r as usize >= m) {
            return Err(Error::InvalidArgument(format!("row out of a {m}-token batch")));
        }
        let input: Vec<u32> = self.committed.iter().chain(&batch.tokens).copied().collect();
        let total = input.len();
        // The distribution after input position p is the one over the token at p + 1: an input
        // position's while p + 1 < total, the first output token's after the last.
        let first = len + rows.iter().copied().min().unwrap_or(0) as usize + 1;
        let start = first.min(total - 1);
        let req = GenerateRequest {
            input_ids: input,
            sampling_params: WireSampling { max_new_tokens: 1, temperature: 0.0, ..WireSampling::default() },
            return_logprob: true,
            logprob_start_len: start as i64,
            top_logprobs_num: n,
            rid: None,
            stream: false,
        };
        let body = serde_json::to_vec(&req).map_err(|e| Error::server(format!("request not encoded: {e}")))?;
        // Each position's entries are a few dozen bytes; the text field is null.
        let limit = (64 * 1024 + (total - start + 1) * n * 96) as u64;
        let t = Instant::now();
        let resp: GenerateResponse = self.call("/generate", Some(&body), limit).await?;
        let round_trip = t.elapsed().as_secs_f64() * 1000.0;
        let meta = &resp.meta_info;
        self.link.update(|s| {
            s.round_trips += 1;
            s.server_ms += meta.e2e_latency.map_or(round_trip, |secs| secs * 1000.0);
            s.cached_tokens += meta.cached_tokens;
            s.input_tokens += total;
        });
        self.written = batch.tokens.clone();
        let vocab = self.config.vocab_size;
        rows.iter()
            .map(|&r| {
                let predicted = len + r as usize + 1;
                let entry = if predicted < total {
                    meta.input_top_logprobs.get(predicted - start)
                } else {
                    meta.output_top_logprobs.first()
                };
                let top = entry.and_then(Option::as_ref).filter(|t| !t.is_empty()).ok_or_else(|| {
                    Error::server(format!("the answer lacks the top logprobs of position {predicted}"))
                })?;
                if let Some(bad) = top.iter().find(|t| t.1 as usize >= vocab) {
                    return Err(Error::server(format!("the answer names token {} outside the vocabulary of {vocab}", bad.1)));
                }
                Ok(top.iter().take(n).cloned().collect())
            })
            .collect()
    }
}

/// Remote AR's answer as it streams in: server-sent events, `data: {GenerateResponse}` per token
/// (all output ids so far, as SGLang sends them, or only the new ones, as `saguaro serve` does:
/// `meta_info.completion_tokens` tells which), then `data: [DONE]`.
struct Events<'a> {
    out: Output<'a>,
    vocab: usize,
    /// The bytes of a line not yet complete.
    line: Vec<u8>,
    /// Output ids the server has sent so far.
    seen: usize,
    /// The last event's meta_info (the whole answer's, once it ends).
    meta: Option<MetaInfo>,
    done: bool,
    failure: Option<String>,
}

impl<'a> Events<'a> {
    fn new(out: Output<'a>, vocab: usize) -> Self {
        Events { out, vocab, line: Vec::new(), seen: 0, meta: None, done: false, failure: None }
    }

    /// Take the next piece of the body; `false` once nothing more is wanted from it.
    fn feed(&mut self, piece: &[u8]) -> bool {
        for &b in piece {
            if b != b'\n' {
                self.line.push(b);
                continue;
            }
            let line = std::mem::take(&mut self.line);
            if let Some(data) = line.strip_prefix(b"data:") {
                self.event(data.trim_ascii());
            }
            if self.done || self.failure.is_some() || self.out.done() {
                return false;
            }
        }
        true
    }

    fn event(&mut self, data: &[u8]) {
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        if let Ok(e) = serde_json::from_slice::<ErrorBody>(data) {
            self.failure = Some(format!("the server failed midway: {}", e.error.message));
            return;
        }
        let resp: GenerateResponse = match serde_json::from_slice(data) {
            Ok(r) => r,
            Err(e) => {
                self.failure = Some(format!("unreadable event: {e}"));
                return;
            }
        };
        let total = resp.meta_info.completion_tokens;
        let ids = &resp.output_ids;
        let new = if total == self.seen + ids.len() {
            &ids[..]
        } else if total == ids.len() && total >= self.seen && ids.len() >= self.seen {
            &ids[self.seen..]
        } else {
            self.failure = Some(format!("an event of {} ids after {} does not add up to its {total} tokens", ids.len(), self.seen));
            return;
        };
        if let Some(t) = new.iter().find(|&&t| t as usize >= self.vocab) {
            self.failure = Some(format!("the answer names token {t} outside the vocabulary of {}", self.vocab));
            return;
        }
        self.seen += new.len();
        // Without a grammar (refused above) committing cannot fail.
        let _ = self.out.push(new);
        self.meta = Some(resp.meta_info);
    }
}

/// A remote target runs only what verification and AR run: a causal batch right after the
/// committed sequence (SSD's tree batches are the draft's, which stays local).
fn check_causal(batch: &Batch, len: usize) -> Result<()> {
    let causal = !batch.is_empty()
        && batch.mask.extra.is_empty()
        && batch.positions.iter().enumerate().all(|(i, &p)| p as usize == len + i && batch.mask.prefix[i] == p + 1);
    if batch.allowed.is_some() {
        Err(Error::InvalidArgument("a remote target does not take a grammar's masks: constrain the generation on the server".into()))
    } else if causal {
        Ok(())
    } else {
        Err(Error::Unsupported("a remote target runs only causal batches at the end of its sequence".into()))
    }
}

/// Mode AR with this target: the server generates on its own.
impl SelfGenerating for RemoteTarget {
    fn generate<'a>(&'a mut self, req: &'a Request, sink: Sink<'a>) -> LocalBoxFuture<'a, Result<Generation>> {
        Box::pin(self.generate_on_server(req, sink))
    }
}

impl Lm for RemoteTarget {
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn backend_name(&self) -> String {
        format!("server {}", self.opts.url)
    }
    fn len(&self) -> usize {
        self.committed.len()
    }
    fn capacity(&self) -> usize {
        self.config.context_length
    }
    fn truncate(&mut self, len: usize) {
        self.committed.truncate(len);
    }
    fn advance(&mut self, n: usize) -> Result<()> {
        if n > self.written.len() {
            return Err(Error::InvalidArgument(format!("advance by {n} after a {}-token forward", self.written.len())));
        }
        self.committed.extend_from_slice(&self.written[..n]);
        self.written.clear();
        Ok(())
    }
    /// Logits rebuilt from the top `top_n` logprobs (log-softmax differs from the logits by a
    /// constant per row, which softmax ignores); the tokens not returned get -inf.
    fn logits<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<f32>>> {
        Box::pin(async move {
            let top = self.score(batch, out_rows, self.opts.top_n).await?;
            let vocab = self.config.vocab_size;
            let mut logits = vec![f32::NEG_INFINITY; top.len() * vocab];
            for (row, entries) in logits.chunks_exact_mut(vocab).zip(&top) {
                for TokenLogprob(lp, id, _) in entries {
                    row[*id as usize] = lp.unwrap_or(f32::NEG_INFINITY);
                }
            }
            Ok(logits)
        })
    }
    fn argmax<'a>(&'a mut self, batch: &'a Batch, out_rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<u32>>> {
        Box::pin(async move { Ok(self.score(batch, out_rows, 1).await?.iter().map(|t| t[0].1).collect()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(ids: &[u32], total: usize) -> String {
        let meta = MetaInfo { completion_tokens: total, ..MetaInfo::default() };
        let resp = GenerateResponse { text: String::new(), output_ids: ids.to_vec(), meta_info: meta };
        format!("data: {}\n\n", serde_json::to_string(&resp).unwrap())
    }

    /// The events of one answer, fed in pieces of `cut` bytes; the tokens the sink saw.
    fn read(events: &[String], cut: usize) -> (Vec<u32>, Option<String>, bool) {
        let req = Request { max_tokens: 16, ..Request::default() };
        let mut seen = Vec::new();
        let mut sink = |t: &[u32]| {
            seen.extend_from_slice(t);
            true
        };
        let mut e = Events::new(Output::new(&req, 16, &mut sink, None), 100);
        let body = events.concat() + "data: [DONE]\n\n";
        for piece in body.as_bytes().chunks(cut) {
            if !e.feed(piece) {
                break;
            }
        }
        let (failure, done) = (e.failure.take(), e.done);
        drop(e);
        (seen, failure, done)
    }

    #[test]
    fn events_with_new_ids_or_all_ids_so_far_stream_the_same_tokens() {
        let incremental = [event(&[5], 1), event(&[6, 7], 3), event(&[], 3)];
        let cumulative = [event(&[5], 1), event(&[5, 6, 7], 3), event(&[5, 6, 7], 3)];
        for cut in [1, 7, 4096] {
            assert_eq!(read(&incremental, cut), (vec![5, 6, 7], None, true), "cut {cut}");
            assert_eq!(read(&cumulative, cut), (vec![5, 6, 7], None, true), "cut {cut}");
        }
    }

    #[test]
    fn inconsistent_or_foreign_events_fail_the_stream() {
        let (seen, failure, _) = read(&[event(&[5], 1), event(&[9], 5)], 4096);
        assert_eq!(seen, vec![5]);
        assert!(failure.unwrap().contains("does not add up"));
        let (_, failure, _) = read(&[event(&[500], 1)], 4096);
        assert!(failure.unwrap().contains("outside the vocabulary"));
        let (_, failure, _) = read(&["data: {\"error\": {\"message\": \"boom\", \"code\": 500}}\n\n".to_string()], 4096);
        assert!(failure.unwrap().contains("boom"));
    }
}
