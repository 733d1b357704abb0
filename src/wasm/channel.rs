//! What connects the engine to the browser: the draft worker's `MessagePort` as a runtime
//! [`Channel`], and the event-loop turns a long CPU generation needs so that an abort message
//! (or the draft's replies) can be received at all.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use futures::channel::mpsc;
use futures::future::{select, Either, LocalBoxFuture};
use futures::StreamExt;
use js_sys::{Float32Array, Function, Promise};
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{MessageChannel, MessageEvent, MessagePort};
use web_time::{Duration, Instant};

use crate::backend::Batch;
use crate::decode::ssd::{Job, Reply};
use crate::error::{Error, ErrorCode, Result};
use crate::model::runner::{BoxedLm, Hooked, Pause};
use super::timer::sleep;
use crate::runtime::{Channel, RelSpan};

/// A reply as it crosses `postMessage`: `{ok: reply}` or `{error: {code, message}}`.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireReply {
    Ok(Reply<RelSpan>),
    Error { code: ErrorCode, message: String },
}

impl From<Result<Reply<RelSpan>>> for WireReply {
    fn from(r: Result<Reply<RelSpan>>) -> Self {
        match r {
            Ok(reply) => WireReply::Ok(reply),
            Err(e) => WireReply::Error { code: e.code(), message: e.to_string() },
        }
    }
}

/// A reply as the draft worker posts it: `{reply: WireReply, q: Float32Array[]}`. A sampled
/// proposal's distributions (SSD's or SD's: a vocabulary's worth of floats per draft token)
/// travel in `q` as typed arrays, whose buffers the post transfers, not as arrays of numbers in
/// `reply`.
pub fn encode_reply(mut reply: Result<Reply<RelSpan>>) -> std::result::Result<JsValue, JsValue> {
    let q = match reply.as_mut().ok().and_then(Reply::proposal_mut) {
        Some(proposal) => std::mem::take(&mut proposal.q),
        None => Vec::new(),
    };
    let rows: js_sys::Array = q.iter().map(|row| JsValue::from(Float32Array::from(&row[..]))).collect();
    let out = js_sys::Object::new();
    js_sys::Reflect::set(&out, &"reply".into(), &super::to_js(&WireReply::from(reply))?)?;
    js_sys::Reflect::set(&out, &"q".into(), &rows)?;
    Ok(out.into())
}

/// The reply [`encode_reply`] made.
fn decode_reply(v: JsValue) -> Result<Reply<RelSpan>> {
    let unreadable = |e: String| Error::Worker(format!("unreadable reply from the draft worker: {e}"));
    let field = |name: &str| js_sys::Reflect::get(&v, &name.into()).map_err(|e| unreadable(format!("{e:?}")));
    let mut reply = serde_wasm_bindgen::from_value::<WireReply>(field("reply")?)
        .map_err(|e| unreadable(e.to_string()))?
        .into_result()?;
    if let Some(proposal) = reply.proposal_mut() {
        let rows = field("q")?.dyn_into::<js_sys::Array>().map_err(|_| unreadable("q is not an array".into()))?;
        proposal.q = rows
            .iter()
            .map(|row| row.dyn_into::<Float32Array>().map(|a| a.to_vec()).map_err(|_| unreadable("q holds a non-Float32Array".into())))
            .collect::<Result<_>>()?;
    }
    Ok(reply)
}

impl WireReply {
    fn into_result(self) -> Result<Reply<RelSpan>> {
        match self {
            WireReply::Ok(reply) => Ok(reply),
            // The variant whose code the draft sent: codes are written once, in `Error::code`.
            WireReply::Error { code, message } => {
                let variants: [fn(String) -> Error; 6] = [
                    Error::InvalidModel,
                    Error::InvalidArgument,
                    Error::IncompatibleDraft,
                    Error::DeviceLost,
                    Error::OutOfMemory,
                    Error::Gpu,
                ];
                Err(variants
                    .into_iter()
                    .map(|v| v(message.clone()))
                    .find(|e| e.code() == code)
                    .unwrap_or_else(|| Error::Worker(format!("draft worker: {message}"))))
            }
        }
    }
}

/// Longest the draft worker may stay silent while a reply is awaited before the engine gives it
/// up. It says it is alive every second (draft-worker.js), but a single forward (a long
/// prompt's prefill) holds its event loop until it ends.
const SILENCE: Duration = Duration::from_secs(60);
/// How often a pending reply checks that silence.
const CHECK: Duration = Duration::from_secs(1);
/// Sent by the draft worker between its replies.
const ALIVE: &str = "alive";
/// Sent to the draft worker: cut the speculation short (see [`Channel::interrupt`]).
const INTERRUPT: &str = "interrupt";

/// What the engine knows of the draft worker at the far end of the port. The channel reads it;
/// [`DraftLink`] reaches it while a generation holds the channel.
struct Link {
    replies: mpsc::UnboundedSender<Result<Reply<RelSpan>>>,
    heard: Cell<Instant>,
    lost: RefCell<Option<String>>,
}

impl Link {
    /// The draft worker is gone: the reply awaited now, and every later call, fails.
    fn lose(&self, why: String) {
        if self.lost.borrow().is_some() {
            return;
        }
        *self.lost.borrow_mut() = Some(why.clone());
        let _ = self.replies.unbounded_send(Err(Error::Worker(why)));
    }

    fn error(&self) -> Option<Error> {
        self.lost.borrow().clone().map(Error::Worker)
    }
}

/// The engine's hold on its draft worker from outside a generation, which owns the channel.
pub struct DraftLink {
    port: MessagePort,
    link: Rc<Link>,
}

impl DraftLink {
    /// Cut the draft's speculation short now, ahead of the jobs queued on the port.
    pub fn interrupt(&self) {
        let _ = self.port.post_message(&INTERRUPT.into());
    }

    /// The draft worker stopped (`why`): the generation waiting on it ends with an `internal`
    /// error that says so.
    pub fn lose(&self, why: &str) {
        self.link.lose(format!("the draft worker stopped: {why}"));
    }
}

/// The engine's end of the port to a [`super::WasmDraft`].
pub struct PortChannel {
    port: MessagePort,
    link: Rc<Link>,
    replies: mpsc::UnboundedReceiver<Result<Reply<RelSpan>>>,
    _on_message: Closure<dyn FnMut(MessageEvent)>,
    _on_message_error: Closure<dyn FnMut(MessageEvent)>,
}

impl PortChannel {
    pub fn new(port: MessagePort) -> (Self, DraftLink) {
        let (tx, replies) = mpsc::unbounded();
        let link = Rc::new(Link { replies: tx, heard: Cell::new(Instant::now()), lost: RefCell::new(None) });
        let l = link.clone();
        let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |ev: MessageEvent| {
            l.heard.set(Instant::now());
            let data = ev.data();
            if data.as_string().as_deref() == Some(ALIVE) {
                return;
            }
            let _ = l.replies.unbounded_send(decode_reply(data));
        });
        port.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        // A reply that cannot be received leaves every later one answering the wrong job.
        let l = link.clone();
        let on_message_error = Closure::<dyn FnMut(MessageEvent)>::new(move |_: MessageEvent| {
            l.lose("a reply from the draft worker could not be received".into());
        });
        port.set_onmessageerror(Some(on_message_error.as_ref().unchecked_ref()));
        let handle = DraftLink { port: port.clone(), link: link.clone() };
        (PortChannel { port, link, replies, _on_message: on_message, _on_message_error: on_message_error }, handle)
    }
}

impl Channel<Job, Reply<RelSpan>> for PortChannel {
    fn send(&mut self, job: Job) -> Result<()> {
        if let Some(e) = self.link.error() {
            return Err(e);
        }
        let v = job
            .serialize(&serde_wasm_bindgen::Serializer::json_compatible())
            .map_err(|e| Error::Worker(format!("cannot encode a draft job: {e}")))?;
        self.port.post_message(&v).map_err(|e| Error::Worker(format!("cannot reach the draft worker: {e:?}")))
    }

    fn recv(&mut self) -> LocalBoxFuture<'_, Result<Reply<RelSpan>>> {
        Box::pin(async move {
            if let Some(e) = self.link.error() {
                return Err(e);
            }
            let mut next = self.replies.next();
            loop {
                match select(next, Box::pin(sleep(CHECK))).await {
                    Either::Left((reply, _)) => {
                        return reply.unwrap_or_else(|| Err(Error::Worker("the draft worker has stopped".into())))
                    }
                    Either::Right((_, pending)) => {
                        if self.link.heard.get().elapsed() > SILENCE {
                            self.link.lose(format!("the draft worker has not answered for {} s", SILENCE.as_secs()));
                        }
                        next = pending;
                    }
                }
            }
        })
    }

    fn interrupt(&mut self) {
        let _ = self.port.post_message(&INTERRUPT.into());
    }

    fn has_stopped(&self) -> bool {
        self.link.lost.borrow().is_some()
    }
}

impl Drop for PortChannel {
    fn drop(&mut self) {
        self.port.set_onmessage(None);
        self.port.set_onmessageerror(None);
        self.port.close();
    }
}

/// How long a computation may hold the event loop before it yields a turn.
const YIELD_EVERY: Duration = Duration::from_millis(10);

/// The engine's model wrapped so that the event loop runs (at most every [`YIELD_EVERY`]) before
/// each forward: messages such as an abort, or the draft's replies, are delivered between rounds
/// even when every forward computes synchronously on the CPU.
pub fn yielding(inner: BoxedLm) -> Hooked<BoxedLm, impl FnMut(&Batch) -> Pause> {
    let mut last = Instant::now();
    Hooked::new(inner, move |_: &Batch| {
        if last.elapsed() < YIELD_EVERY {
            return None;
        }
        last = Instant::now();
        Some(Box::pin(next_task()) as LocalBoxFuture<'static, ()>)
    })
}

/// One `MessageChannel` per thread whose message resolves the pending turn: unlike a chain of
/// `setTimeout(0)`s it is not clamped to 4 ms.
struct Turns {
    receiver: MessagePort,
    sender: MessagePort,
    pending: Rc<RefCell<Option<Function>>>,
}

thread_local! {
    static TURNS: Option<Turns> = Turns::new();
}

/// In Node an open port keeps the process alive: hold it only while a turn is pending, so a
/// process that is done can exit. (Browsers have no `ref`/`unref`.)
fn node_ref(port: &MessagePort, hold: bool) {
    let name = if hold { "ref" } else { "unref" };
    if let Ok(f) = js_sys::Reflect::get(port, &name.into()) {
        if let Some(f) = f.dyn_ref::<Function>() {
            let _ = f.call0(port);
        }
    }
}

impl Turns {
    fn new() -> Option<Turns> {
        let ch = MessageChannel::new().ok()?;
        let pending: Rc<RefCell<Option<Function>>> = Rc::default();
        let (p, receiver) = (pending.clone(), ch.port1());
        let wake = Closure::<dyn FnMut()>::new(move || {
            node_ref(&receiver, false);
            if let Some(resolve) = p.borrow_mut().take() {
                let _ = resolve.call0(&JsValue::NULL);
            }
        });
        ch.port1().set_onmessage(Some(wake.as_ref().unchecked_ref()));
        // Lives as long as the thread, like the channel.
        wake.forget();
        node_ref(&ch.port1(), false);
        Some(Turns { receiver: ch.port1(), sender: ch.port2(), pending })
    }
}

/// Resolves on a later turn of the event loop.
pub(crate) async fn next_task() {
    let promise = TURNS.with(|t| {
        let t = t.as_ref()?;
        Some(Promise::new(&mut |resolve, _| {
            *t.pending.borrow_mut() = Some(resolve);
            node_ref(&t.receiver, true);
            let _ = t.sender.post_message(&JsValue::NULL);
        }))
    });
    if let Some(p) = promise {
        let _ = JsFuture::from(p).await;
    }
}
