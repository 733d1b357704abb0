//! `saguaro serve`'s OpenAI-compatible endpoints, `/v1/completions`, `/v1/chat/completions`
//! and `/v1/models`, over a [`Pool`]: every client's request joins one batch (continuous
//! batching) on the pool's own thread, with speculation where the pool has a draft. A reader
//! thread per request turns the pool's tokens into text (stop strings cut there), streamed as
//! server-sent events or answered whole.
//!
//! Limits answer with a JSON error and leave the others running: a full queue (503), a bad
//! request (400), a request past the time limit (504, its sequences stopped). A client that
//! hangs up mid-stream stops its sequences at the next step.

mod protocol;
mod schedule;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tiny_http::{Method, Request};

use crate::decode::FinishReason;
use crate::engine::{GenerateOptions, Prompt, DEFAULT_MAX_TOKENS};
use crate::error::{Error, Result};
use crate::grammar::GrammarSpec;
use crate::model::tokenizer::Tokenizer;
use crate::pool::Pool;
use crate::remote::server::{encode, event, json, read_body, respond, sse_end, sse_head};
use crate::remote::Endpoints;
use crate::sampling::SamplingParams;
use protocol::{Answer, ChatRequest, Choice, CompletionRequest, ErrorBody, ErrorDetail, Message, Params, Stop, Usage};
use schedule::{Event, Work};

/// Most stop strings a request may give, as OpenAI allows.
const MAX_STOPS: usize = 4;

/// How the endpoints answer.
#[derive(Clone, Debug)]
pub struct OpenAiOptions {
    /// The model's name in answers and `/v1/models`.
    pub model: String,
    /// Requests waiting for a sequence; beyond it, 503.
    pub queue: usize,
    pub max_body: usize,
    /// How long a request may wait and run.
    pub timeout: Duration,
    /// Most tokens one request may generate.
    pub max_tokens: usize,
}

/// The endpoints, answering on the server's reader threads.
pub struct OpenAi {
    work: SyncSender<Work>,
    tokenizer: Tokenizer,
    parallel: usize,
    opts: OpenAiOptions,
}

impl OpenAi {
    /// Start the pool that `load` builds on a thread of its own (a pool, like the models it
    /// holds, stays on the thread that made it) and wait until it is loaded.
    pub fn start(load: impl FnOnce() -> Result<Pool> + Send + 'static, opts: OpenAiOptions) -> Result<Arc<OpenAi>> {
        let (work, queue) = mpsc::sync_channel(opts.queue);
        let (loaded, ready) = mpsc::channel();
        std::thread::Builder::new()
            .name("serve-pool".into())
            .spawn(move || match load() {
                Ok(pool) => {
                    let _ = loaded.send(Ok((pool.tokenizer().clone(), pool.parallel())));
                    schedule::run(pool, queue);
                }
                Err(e) => drop(loaded.send(Err(e))),
            })
            .map_err(|e| Error::Worker(format!("cannot start the pool's thread: {e}")))?;
        let (tokenizer, parallel) = ready.recv().map_err(|_| Error::Worker("the pool's thread ended while loading".into()))??;
        Ok(Arc::new(OpenAi { work, tokenizer, parallel, opts }))
    }

    /// The prompt and options of a request, checked; or a 400's message.
    fn options(&self, params: &Params) -> std::result::Result<(GenerateOptions, usize, Vec<String>), String> {
        let sampling = SamplingParams {
            temperature: params.temperature.unwrap_or(1.0),
            top_k: 0,
            top_p: params.top_p.unwrap_or(1.0),
            seed: params.seed.unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)),
        };
        sampling.validate().map_err(|e| e.to_string())?;
        let max_tokens = params.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        if max_tokens == 0 || max_tokens > self.opts.max_tokens {
            return Err(format!("max_tokens must be in 1..={}, got {max_tokens}", self.opts.max_tokens));
        }
        let n = params.n.unwrap_or(1);
        if n == 0 || n > self.parallel {
            return Err(format!("n must be in 1..={} (the sequences this server runs at once), got {n}", self.parallel));
        }
        let stops = match &params.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stops.len() > MAX_STOPS || stops.iter().any(String::is_empty) {
            return Err(format!("stop takes up to {MAX_STOPS} non-empty strings"));
        }
        let grammar = params.response_format.as_ref().map(response_format).transpose()?.flatten();
        Ok((GenerateOptions { max_tokens, sampling, grammar, ..GenerateOptions::default() }, n, stops))
    }

    fn model_list(&self, req: Request) {
        let list = serde_json::json!({"object": "list", "data": [{"id": self.opts.model, "object": "model", "owned_by": "saguaro"}]});
        json(req, 200, &list)
    }

    /// Answer one generation request.
    fn generate(&self, mut req: Request, chat: bool) {
        let deadline = Instant::now() + self.opts.timeout;
        let body = match read_body(&mut req, self.opts.max_body) {
            Ok(b) => b,
            Err((status, m)) => return fail(req, status, m),
        };
        let parsed = if chat {
            serde_json::from_slice::<ChatRequest>(&body).map(|r| (Prompt::Chat(r.messages), r.params))
        } else {
            serde_json::from_slice::<CompletionRequest>(&body).map(|r| (Prompt::Text(r.prompt), r.params))
        };
        let (prompt, params) = match parsed {
            Ok(p) => p,
            Err(e) => return fail(req, 400, format!("malformed request: {e}")),
        };
        let (opts, n, stops) = match self.options(&params) {
            Ok(o) => o,
            Err(m) => return fail(req, 400, m),
        };
        let (events, answers) = mpsc::channel();
        let stopped: Vec<Arc<AtomicBool>> = (0..n).map(|_| Arc::default()).collect();
        match self.work.try_send(Work { prompt, opts, n, events, stopped: stopped.clone() }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return fail(req, 503, "the server is busy: its queue is full"),
            Err(TrySendError::Disconnected(_)) => return fail(req, 503, "the model has stopped"),
        }
        let mut run = Run {
            choices: stopped.into_iter().map(|stop| Text { stop, ..Text::default() }).collect(),
            stops,
            tokenizer: &self.tokenizer,
            answers,
            deadline,
            prompt_tokens: 0,
        };
        let head = Head {
            id: format!("{}-{}", if chat { "chatcmpl" } else { "cmpl" }, SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())),
            created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            model: params.model.clone().unwrap_or_else(|| self.opts.model.clone()),
            chat,
        };
        if params.stream {
            let usage = params.stream_options.as_ref().is_some_and(|o| o["include_usage"] == true);
            stream(req, &mut run, &head, usage)
        } else {
            whole(req, &mut run, &head)
        }
    }
}

/// `response_format` as a grammar: `text` (none), `json_object`, or `json_schema`.
fn response_format(f: &serde_json::Value) -> std::result::Result<Option<GrammarSpec>, String> {
    match f["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonObject)),
        Some("json_schema") => match &f["json_schema"]["schema"] {
            serde_json::Value::Null => Err("response_format json_schema needs json_schema.schema".into()),
            schema => Ok(Some(GrammarSpec::JsonSchema(schema.clone()))),
        },
        _ => Err(format!("response_format type must be text, json_object or json_schema, got {}", f["type"])),
    }
}

impl Endpoints for OpenAi {
    fn answer(&self, req: Request, path: &str) -> Option<Request> {
        match (req.method(), path) {
            (Method::Post, "/v1/completions") => self.generate(req, false),
            (Method::Post, "/v1/chat/completions") => self.generate(req, true),
            (Method::Get, "/v1/models") => self.model_list(req),
            (method, "/v1/completions" | "/v1/chat/completions" | "/v1/models") => {
                let m = format!("{method} is not allowed on {path}");
                fail(req, 405, m)
            }
            _ => return Some(req),
        }
        None
    }
}

fn fail(req: Request, status: u16, message: impl Into<String>) {
    let kind = if status < 500 { "invalid_request_error" } else { "server_error" };
    json(req, status, &ErrorBody { error: ErrorDetail { message: message.into(), kind, code: status } })
}

/// What names an answer and its chunks.
struct Head {
    id: String,
    created: u64,
    model: String,
    chat: bool,
}

impl Head {
    fn answer(&self, choices: Vec<Choice>, usage: Option<Usage>, chunk: bool) -> Answer {
        let object = match (self.chat, chunk) {
            (true, true) => "chat.completion.chunk",
            (true, false) => "chat.completion",
            (false, _) => "text_completion",
        };
        Answer { id: self.id.clone(), object, created: self.created, model: self.model.clone(), choices, usage }
    }

    /// A choice carrying `text`: as text, a message, or a delta.
    fn choice(&self, index: usize, text: String, finish: Option<&'static str>, chunk: bool) -> Choice {
        let message = || Message { role: "assistant", content: text.clone() };
        Choice {
            index,
            text: (!self.chat).then(|| text.clone()),
            message: (self.chat && !chunk).then(message),
            delta: (self.chat && chunk).then(message),
            finish_reason: finish,
        }
    }
}

/// One choice's output as it arrives.
#[derive(Default)]
struct Text {
    tokens: Vec<u32>,
    text: String,
    /// Bytes of `text` already streamed.
    sent: usize,
    finish: Option<&'static str>,
    /// Whether the chunk with its finish reason went out.
    closed: bool,
    /// Set to stop its sequence (a stop string matched, the client went away).
    stop: Arc<AtomicBool>,
}

/// A request's choices, fed by the pool's events.
struct Run<'a> {
    choices: Vec<Text>,
    stops: Vec<String>,
    tokenizer: &'a Tokenizer,
    answers: Receiver<Event>,
    deadline: Instant,
    prompt_tokens: usize,
}

impl Run<'_> {
    fn done(&self) -> bool {
        self.choices.iter().all(|c| c.finish.is_some())
    }

    /// Stop every sequence of the request.
    fn abandon(&self) {
        for c in &self.choices {
            c.stop.store(true, Ordering::Relaxed);
        }
    }

    /// Take the next event in; `Err((status, message))` where the request fails.
    fn next(&mut self) -> std::result::Result<(), (u16, String)> {
        let event = match self.answers.recv_timeout(self.deadline.saturating_duration_since(Instant::now())) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => return Err((504, "no answer within the time limit".into())),
            Err(RecvTimeoutError::Disconnected) => return Err((500, "the model dropped the request".into())),
        };
        match event {
            Event::Joined { prompt_tokens } => self.prompt_tokens = prompt_tokens,
            Event::Tokens { index, tokens } => {
                let eos = self.tokenizer.eos_ids();
                let c = &mut self.choices[index];
                if c.finish.is_some() {
                    return Ok(());
                }
                c.tokens.extend_from_slice(&tokens);
                let shown: Vec<u32> = c.tokens.iter().copied().filter(|t| !eos.contains(t)).collect();
                c.text = self.tokenizer.decode(&shown).map_err(|e| (500, e.to_string()))?;
                if let Some(at) = self.stops.iter().filter_map(|s| c.text.find(s.as_str())).min() {
                    c.text.truncate(at);
                    c.finish = Some("stop");
                    c.stop.store(true, Ordering::Relaxed);
                }
            }
            Event::Done { index, result } => {
                let c = &mut self.choices[index];
                let finish = result?;
                c.finish.get_or_insert(match finish {
                    FinishReason::MaxTokens | FinishReason::ContextFull => "length",
                    FinishReason::Eos | FinishReason::Cancelled => "stop",
                });
            }
        }
        Ok(())
    }

    fn usage(&self) -> Usage {
        let completion_tokens = self.choices.iter().map(|c| c.tokens.len()).sum();
        Usage { prompt_tokens: self.prompt_tokens, completion_tokens, total_tokens: self.prompt_tokens + completion_tokens }
    }
}

fn whole(req: Request, run: &mut Run, head: &Head) {
    while !run.done() {
        if let Err((status, message)) = run.next() {
            run.abandon();
            return fail(req, status, message);
        }
    }
    let choices = run.choices.iter().enumerate().map(|(i, c)| head.choice(i, c.text.clone(), c.finish, false)).collect();
    respond(req, 200, encode(&head.answer(choices, Some(run.usage()), false)))
}

/// The end of `text` up to which it can be sent: short of what a stop string may yet match
/// (`hold` bytes) and of a character still arriving, unless it is `finished`.
fn sendable(text: &str, hold: usize, finished: bool) -> usize {
    if finished {
        return text.len();
    }
    let mut end = text.len().saturating_sub(hold);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    match text[..end].char_indices().next_back() {
        Some((i, char::REPLACEMENT_CHARACTER)) => i,
        _ => end,
    }
}

fn stream(req: Request, run: &mut Run, head: &Head, usage: bool) {
    // A failure before anything is sent is a plain error answer.
    let mut failed = None;
    while failed.is_none() && !run.done() && run.choices.iter().all(|c| c.tokens.is_empty()) {
        failed = run.next().err();
    }
    if let Some((status, message)) = failed {
        run.abandon();
        return fail(req, status, message);
    }
    let hold = run.stops.iter().map(|s| s.len().saturating_sub(1)).max().unwrap_or(0);
    let mut w = req.into_writer();
    let sent = (|| -> std::io::Result<()> {
        w.write_all(sse_head().as_bytes())?;
        loop {
            for (i, c) in run.choices.iter_mut().enumerate().filter(|(_, c)| !c.closed) {
                let end = sendable(&c.text, hold, c.finish.is_some()).max(c.sent);
                if end > c.sent || c.finish.is_some() {
                    let text = c.text[c.sent..end].to_string();
                    (c.sent, c.closed) = (end, c.finish.is_some());
                    event(&mut w, &encode(&head.answer(vec![head.choice(i, text, c.finish, true)], None, true)))?;
                }
            }
            if run.done() {
                break;
            }
            if let Err((code, message)) = run.next() {
                let kind = if code < 500 { "invalid_request_error" } else { "server_error" };
                event(&mut w, &encode(&ErrorBody { error: ErrorDetail { message, kind, code } }))?;
                break;
            }
        }
        if usage {
            event(&mut w, &encode(&head.answer(Vec::new(), Some(run.usage()), true)))?;
        }
        sse_end(&mut w)
    })();
    // A client that hung up (or a request that failed midway) stops its sequences.
    if sent.is_err() || !run.done() {
        run.abandon();
    }
}

#[cfg(test)]
mod tests {
    use super::sendable;

    #[test]
    fn text_is_held_back_where_a_stop_string_or_a_character_may_still_arrive() {
        assert_eq!(sendable("hello wor", 3, false), 6);
        assert_eq!(sendable("hello wor", 3, true), 9);
        assert_eq!(sendable("ab\u{FFFD}", 0, false), 2);
        assert_eq!(sendable("aé", 1, false), 1, "never inside a character");
    }
}
