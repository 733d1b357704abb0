//! `saguaro serve`'s HTTP side: SGLang's `/generate` and `/get_model_info`, `/health`, on
//! HTTP/1.1, with CORS for browsers. A few reader threads take requests (so one slow client
//! holds one of them, not the server); the model runs them one at a time on the calling thread.
//! Every limit answers with a JSON error and the server stays up: bodies over the size limit
//! (413), a full queue (503), a request that waited or ran past the time limit (504).
//! A `stream` request is answered as server-sent events, one per token as the model draws it.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiny_http::{Method, Request, Server, StatusCode};

use super::generate::{answer, Limits, Refusal};
use super::prefix::PrefixModel;
use crate::grammar::Vocabulary;
use super::protocol::{ErrorBody, ErrorDetail, GenerateRequest, GenerateResponse, MetaInfo, ModelInfo};
use crate::error::{Error, Result};

#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Largest request body read, in bytes.
    pub max_body: usize,
    /// How long a request may wait for the model and run on it.
    pub timeout: Duration,
    /// Requests read at once (each one a thread); more wait in the listener's backlog.
    pub readers: usize,
    /// Requests queued for the model; beyond it, 503.
    pub queue: usize,
    pub limits: Limits,
}

impl Default for ServeOptions {
    fn default() -> Self {
        let timeout = Duration::from_secs(60);
        ServeOptions {
            max_body: 4 << 20,
            timeout,
            readers: 8,
            queue: 32,
            limits: Limits { max_scored: 64, max_top_logprobs: 1024, max_new_tokens: 4096, time: timeout },
        }
    }
}

/// One `/generate` for the model thread, and where its answer goes.
struct Job {
    req: GenerateRequest,
    deadline: Instant,
    /// Unbounded, so a slow client never holds up the model: a generation's events are bounded
    /// by its token limit.
    events: Sender<Event>,
}

/// What the model thread tells a reader: each token as drawn (streamed requests only), then the
/// whole answer.
// One `Done` per request: boxing it would save nothing worth an allocation.
#[allow(clippy::large_enum_variant)]
enum Event {
    Token(u32),
    Done(std::result::Result<GenerateResponse, Refusal>),
}

/// What `/health` counts.
#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    forwards: AtomicU64,
    sessions: AtomicU64,
}

/// Endpoints served beside SGLang's by a layer above this one (the OpenAI API over a pool of
/// sequences, `crate::openai`), answered on the reader threads.
pub trait Endpoints: Send + Sync {
    /// Answer `req` if its path is one of these endpoints' (`path` without the query), else
    /// hand it back.
    fn answer(&self, req: Request, path: &str) -> Option<Request>;
}

/// A bound server, not yet serving.
pub struct Bound {
    server: Arc<Server>,
    addr: SocketAddr,
}

/// Listen on `addr` (`127.0.0.1:0` picks a free port).
pub fn bind(addr: &str) -> Result<Bound> {
    let server = Server::http(addr).map_err(|e| Error::InvalidArgument(format!("cannot listen on {addr}: {e}")))?;
    let addr = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| Error::InvalidArgument(format!("{addr} is not an IP address")))?;
    Ok(Bound { server: Arc::new(server), addr })
}

impl Bound {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serve `model` until the process ends: readers on their threads, the model on this one.
    /// `vocabulary` compiles the grammars requests ask for (json_schema, regex, ebnf); without
    /// one such requests are refused.
    /// `endpoints` answers the paths it serves before SGLang's are looked up.
    pub fn serve(
        self,
        model: &mut dyn PrefixModel,
        info: ModelInfo,
        opts: &ServeOptions,
        vocabulary: Option<&Vocabulary>,
        endpoints: Option<Arc<dyn Endpoints>>,
    ) -> Result<()> {
        let (jobs, queue) = mpsc::sync_channel::<Job>(opts.queue);
        let counters = Arc::new(Counters::default());
        let info = Arc::new(info);
        for i in 0..opts.readers.max(1) {
            let (server, jobs, counters, info, opts) = (self.server.clone(), jobs.clone(), counters.clone(), info.clone(), opts.clone());
            let endpoints = endpoints.clone();
            std::thread::Builder::new()
                .name(format!("serve-reader-{i}"))
                .spawn(move || {
                    while let Ok(req) = server.recv() {
                        counters.requests.fetch_add(1, Ordering::Relaxed);
                        let path = req.url().split('?').next().unwrap_or("").to_string();
                        let req = match &endpoints {
                            Some(e) => match e.answer(req, &path) {
                                Some(req) => req,
                                None => continue,
                            },
                            None => req,
                        };
                        handle(req, &path, &jobs, &counters, &info, &opts);
                    }
                })
                .map_err(|e| Error::Worker(format!("cannot start a reader thread: {e}")))?;
        }
        drop(jobs);
        run_model(model, queue, &counters, &opts.limits, vocabulary);
        Ok(())
    }
}

fn run_model(model: &mut dyn PrefixModel, queue: Receiver<Job>, counters: &Counters, limits: &Limits, vocabulary: Option<&Vocabulary>) {
    for job in queue {
        let result = if Instant::now() > job.deadline {
            Err(Refusal::Failed("the request waited past the time limit".into()))
        } else {
            let left = job.deadline.saturating_duration_since(Instant::now());
            let limits = Limits { time: left.min(limits.time), ..limits.clone() };
            let stream = job.req.stream;
            // A streaming reader that is gone (its client hung up) stops the generation.
            answer(model, &job.req, &limits, vocabulary, &mut |t| !stream || job.events.send(Event::Token(t)).is_ok())
        };
        counters.forwards.store(model.forwards(), Ordering::Relaxed);
        counters.sessions.store(model.sessions() as u64, Ordering::Relaxed);
        // The reader may have given up on it; nothing is left to do then.
        let _ = job.events.send(Event::Done(result));
    }
}

/// Browsers may call from any origin: the server holds no credentials.
const CORS: [(&str, &str); 4] = [
    ("Access-Control-Allow-Origin", "*"),
    ("Access-Control-Allow-Methods", "GET, POST, OPTIONS"),
    ("Access-Control-Allow-Headers", "Content-Type"),
    ("Access-Control-Max-Age", "600"),
];

/// The status line and headers of an answer, ending in the blank line.
pub(crate) fn head(status: u16, content_type: &str, framing: &str) -> String {
    let reason = StatusCode(status).default_reason_phrase();
    let mut head = format!("HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n{framing}\r\n");
    for (k, v) in CORS {
        head += &format!("{k}: {v}\r\n");
    }
    head + "\r\n"
}

/// Answer with `body`, written in one piece: tiny_http writes its own answers through a 1 KiB
/// buffer, and without TCP_NODELAY the second segment of an answer then waits for the client's
/// delayed ACK, ~40 ms per request on Linux.
pub(crate) fn respond(req: Request, status: u16, body: Vec<u8>) {
    let mut answer = head(status, "application/json", &format!("Content-Length: {}", body.len())).into_bytes();
    answer.extend_from_slice(&body);
    let mut w = req.into_writer();
    // A client that hung up gets no answer; the server carries on.
    let _ = w.write_all(&answer).and_then(|()| w.flush());
}

/// The next event for this reader, or why none came before `deadline`.
fn next_event(events: &Receiver<Event>, deadline: Instant, timeout: Duration) -> std::result::Result<Event, (u16, String)> {
    match events.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(e) => Ok(e),
        Err(RecvTimeoutError::Timeout) => Err((504, format!("no answer within the time limit of {timeout:?}"))),
        Err(RecvTimeoutError::Disconnected) => Err((500, "the model dropped the request".into())),
    }
}

fn refusal(r: Refusal) -> (u16, String) {
    match r {
        Refusal::BadRequest(m) => (400, m),
        Refusal::Failed(m) => (500, m),
    }
}

/// Answer a `stream` request as server-sent events in a chunked body written by hand (tiny_http
/// buffers its own chunks, which would hold tokens back): each token as the model draws it, the
/// whole answer's `meta_info` last, then `[DONE]`. A failure before the first token is a plain
/// error answer; one after it, an error event.
fn stream_events(req: Request, events: &Receiver<Event>, deadline: Instant, timeout: Duration) {
    let first = match next_event(events, deadline, timeout) {
        Ok(Event::Done(Err(r))) => {
            let (status, m) = refusal(r);
            return error(req, status, m);
        }
        Err((status, m)) => return error(req, status, m),
        Ok(e) => e,
    };
    let mut w = req.into_writer();
    let _ = (|| -> std::io::Result<()> {
        w.write_all(sse_head().as_bytes())?;
        let mut sent = 0;
        let mut next = Ok(first);
        loop {
            let data = match next {
                Ok(Event::Token(t)) => {
                    sent += 1;
                    let meta = MetaInfo { completion_tokens: sent, ..MetaInfo::default() };
                    encode(&GenerateResponse { text: String::new(), output_ids: vec![t], meta_info: meta })
                }
                Ok(Event::Done(Ok(resp))) => {
                    event(&mut w, &encode(&GenerateResponse { output_ids: Vec::new(), ..resp }))?;
                    break;
                }
                Ok(Event::Done(Err(r))) => {
                    let (code, message) = refusal(r);
                    event(&mut w, &encode(&ErrorBody { error: ErrorDetail { message, code } }))?;
                    break;
                }
                Err((code, message)) => {
                    event(&mut w, &encode(&ErrorBody { error: ErrorDetail { message, code } }))?;
                    break;
                }
            };
            event(&mut w, &data)?;
            next = next_event(events, deadline, timeout);
        }
        sse_end(&mut w)
    })();
}

/// The head of an answer of server-sent events in a chunked body written by hand.
pub(crate) fn sse_head() -> String {
    head(200, "text/event-stream", "Cache-Control: no-cache\r\nTransfer-Encoding: chunked")
}

/// One server-sent event, in one write for the reason `respond` gives.
pub(crate) fn event(w: &mut dyn Write, data: &[u8]) -> std::io::Result<()> {
    let mut chunk = format!("{:x}\r\ndata: ", data.len() + 8).into_bytes();
    chunk.extend_from_slice(data);
    chunk.extend_from_slice(b"\n\n\r\n");
    w.write_all(&chunk)?;
    w.flush()
}

/// `[DONE]` and the end of the chunked body.
pub(crate) fn sse_end(w: &mut dyn Write) -> std::io::Result<()> {
    event(w, b"[DONE]")?;
    w.write_all(b"0\r\n\r\n")?;
    w.flush()
}

pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec())
}

pub(crate) fn json<T: serde::Serialize>(req: Request, status: u16, value: &T) {
    respond(req, status, encode(value));
}

pub(crate) fn error(req: Request, status: u16, message: impl Into<String>) {
    json(req, status, &ErrorBody { error: ErrorDetail { message: message.into(), code: status } });
}

fn handle(mut req: Request, path: &str, jobs: &SyncSender<Job>, counters: &Counters, info: &ModelInfo, opts: &ServeOptions) {
    match (req.method().clone(), path) {
        (Method::Options, _) => respond(req, 204, Vec::new()),
        (Method::Get, "/health") => {
            let health = serde_json::json!({
                "status": "ok",
                "requests": counters.requests.load(Ordering::Relaxed),
                "forwards": counters.forwards.load(Ordering::Relaxed),
                "sessions": counters.sessions.load(Ordering::Relaxed),
            });
            json(req, 200, &health)
        }
        (Method::Get, "/get_model_info") => json(req, 200, info),
        (Method::Post, "/generate") => {
            let deadline = Instant::now() + opts.timeout;
            let body = match read_body(&mut req, opts.max_body) {
                Ok(b) => b,
                Err((status, m)) => return error(req, status, m),
            };
            let parsed: GenerateRequest = match serde_json::from_slice(&body) {
                Ok(r) => r,
                Err(e) => return error(req, 400, format!("malformed request: {e}")),
            };
            let stream = parsed.stream;
            let (sender, events) = mpsc::channel();
            match jobs.try_send(Job { req: parsed, deadline, events: sender }) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => return error(req, 503, "the server is busy: its queue is full"),
                Err(TrySendError::Disconnected(_)) => return error(req, 503, "the model has stopped"),
            }
            if stream {
                return stream_events(req, &events, deadline, opts.timeout);
            }
            match next_event(&events, deadline, opts.timeout) {
                Ok(Event::Done(Ok(resp))) => json(req, 200, &resp),
                Ok(Event::Done(Err(r))) => {
                    let (status, m) = refusal(r);
                    error(req, status, m)
                }
                Ok(Event::Token(_)) => error(req, 500, "the model streamed an answer nobody asked to stream"),
                Err((status, m)) => error(req, status, m),
            }
        }
        (method, "/health" | "/get_model_info" | "/generate") => error(req, 405, format!("{method} is not allowed on {path}")),
        _ => error(req, 404, format!("no such endpoint: {path}")),
    }
}

/// The body, refused unread when its declared length is over `max` and cut off when it runs
/// over, so no client makes the server hold more than `max` bytes for it.
pub(crate) fn read_body(req: &mut Request, max: usize) -> std::result::Result<Vec<u8>, (u16, String)> {
    let too_large = || (413, format!("the request body exceeds this server's limit of {max} bytes"));
    if req.body_length().is_some_and(|n| n > max) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    req.as_reader()
        .take(max as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| (400, format!("the request body could not be read: {e}")))?;
    if body.len() > max {
        return Err(too_large());
    }
    Ok(body)
}
