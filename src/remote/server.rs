//! `saguaro serve`'s HTTP side: SGLang's `/generate` and `/get_model_info`, `/health`, on
//! HTTP/1.1, with CORS for browsers. A few reader threads take requests (so one slow client
//! holds one of them, not the server); the model runs them one at a time on the calling thread.
//! Every limit answers with a JSON error and the server stays up: bodies over the size limit
//! (413), a full queue (503), a request that waited or ran past the time limit (504).

use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiny_http::{Header, Method, Request, Response, Server};

use super::generate::{answer, Limits, Refusal};
use super::prefix::PrefixModel;
use super::protocol::{ErrorBody, ErrorDetail, GenerateRequest, GenerateResponse, ModelInfo};
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
    reply: SyncSender<std::result::Result<GenerateResponse, Refusal>>,
}

/// What `/health` counts.
#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    forwards: AtomicU64,
    sessions: AtomicU64,
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
    pub fn serve(self, model: &mut dyn PrefixModel, info: ModelInfo, opts: &ServeOptions) -> Result<()> {
        let (jobs, queue) = mpsc::sync_channel::<Job>(opts.queue);
        let counters = Arc::new(Counters::default());
        let info = Arc::new(info);
        for i in 0..opts.readers.max(1) {
            let (server, jobs, counters, info, opts) = (self.server.clone(), jobs.clone(), counters.clone(), info.clone(), opts.clone());
            std::thread::Builder::new()
                .name(format!("serve-reader-{i}"))
                .spawn(move || {
                    while let Ok(req) = server.recv() {
                        handle(req, &jobs, &counters, &info, &opts);
                    }
                })
                .map_err(|e| Error::Worker(format!("cannot start a reader thread: {e}")))?;
        }
        drop(jobs);
        run_model(model, queue, &counters, &opts.limits);
        Ok(())
    }
}

fn run_model(model: &mut dyn PrefixModel, queue: Receiver<Job>, counters: &Counters, limits: &Limits) {
    for job in queue {
        let result = if Instant::now() > job.deadline {
            Err(Refusal::Failed("the request waited past the time limit".into()))
        } else {
            let left = job.deadline.saturating_duration_since(Instant::now());
            answer(model, &job.req, &Limits { time: left.min(limits.time), ..limits.clone() })
        };
        counters.forwards.store(model.forwards(), Ordering::Relaxed);
        counters.sessions.store(model.sessions() as u64, Ordering::Relaxed);
        // The reader may have given up on it; nothing is left to do then.
        let _ = job.reply.send(result);
    }
}

fn header(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("ASCII header")
}

fn respond(req: Request, status: u16, body: Vec<u8>) {
    let resp = Response::from_data(body)
        .with_status_code(status)
        .with_header(header("Content-Type", "application/json"))
        .with_header(header("Access-Control-Allow-Origin", "*"))
        .with_header(header("Access-Control-Allow-Methods", "GET, POST, OPTIONS"))
        .with_header(header("Access-Control-Allow-Headers", "Content-Type"))
        .with_header(header("Access-Control-Max-Age", "600"));
    // A client that hung up gets no answer; the server carries on.
    let _ = req.respond(resp);
}

fn json<T: serde::Serialize>(req: Request, status: u16, value: &T) {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    respond(req, status, body);
}

fn error(req: Request, status: u16, message: impl Into<String>) {
    json(req, status, &ErrorBody { error: ErrorDetail { message: message.into(), code: status } });
}

fn handle(mut req: Request, jobs: &SyncSender<Job>, counters: &Counters, info: &ModelInfo, opts: &ServeOptions) {
    counters.requests.fetch_add(1, Ordering::Relaxed);
    let path = req.url().split('?').next().unwrap_or("").to_string();
    match (req.method().clone(), path.as_str()) {
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
            let (reply, answer) = mpsc::sync_channel(1);
            match jobs.try_send(Job { req: parsed, deadline, reply }) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => return error(req, 503, "the server is busy: its queue is full"),
                Err(TrySendError::Disconnected(_)) => return error(req, 503, "the model has stopped"),
            }
            match answer.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Ok(resp)) => json(req, 200, &resp),
                Ok(Err(Refusal::BadRequest(m))) => error(req, 400, m),
                Ok(Err(Refusal::Failed(m))) => error(req, 500, m),
                Err(RecvTimeoutError::Timeout) => error(req, 504, format!("no answer within the time limit of {:?}", opts.timeout)),
                Err(RecvTimeoutError::Disconnected) => error(req, 500, "the model dropped the request"),
            }
        }
        (method, "/health" | "/get_model_info" | "/generate") => error(req, 405, format!("{method} is not allowed on {path}")),
        _ => error(req, 404, format!("no such endpoint: {path}")),
    }
}

/// The body, refused unread when its declared length is over `max` and cut off when it runs
/// over, so no client makes the server hold more than `max` bytes for it.
fn read_body(req: &mut Request, max: usize) -> std::result::Result<Vec<u8>, (u16, String)> {
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
