//! The JS API's Rust side (wasm32 with the `wasm` feature). The npm package's JavaScript
//! (pkg-config/) wraps these classes:
//! - [`ModelBuffer`]: a model file filled piece by piece as it downloads, straight into wasm
//!   memory, so no second copy of the whole file ever exists in JS;
//! - [`ModelStream`]: a target bound for WebGPU, each tensor uploaded to its GPU buffer as soon as
//!   it has downloaded, so wasm memory never holds more than one tensor of it (a model larger than
//!   wasm32's 4 GiB loads);
//! - [`WasmEngine`]: the [`Engine`] in the engine worker (or inline in Node);
//! - [`pool::WasmPool`]: with `parallel` above 1, a [`crate::pool::Pool`] there instead, its calls
//!   joining one batch;
//! - [`WasmDraft`]: the draft in its own Web Worker, answering the engine's jobs over a
//!   `MessagePort`: SSD's speculation, SD's drafting, and the timing of the draft at load (the
//!   engine worker then holds no draft model);
//! - in the threads build (feature `threads`, compiled with atomics), the pool of workers sharing
//!   this module's memory that the CPU backend computes on ([`threads`]).
//!
//! Errors cross as JS `Error`s with a `code` ([`Error::code`]). The options, defaults and limits
//! are the JS API's contract ([`crate::contract`]), which [`defaults`] and [`limits`] export.

mod channel;
mod fetch;
mod options;
mod pool;
mod timer;
#[cfg(all(feature = "threads", target_feature = "atomics"))]
pub(crate) mod threads;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};

use js_sys::{Function, Promise};
use serde::Serialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;
use web_sys::MessagePort;

use crate::decode::ssd::Job;
use crate::decode::{DraftHost, DraftWorker};
use crate::engine::{Device, Engine, Target};
use crate::contract::{self, EngineInfo, LoadOpts, ServerTarget, MAX_MODEL_BYTES};
use crate::error::{Error, ErrorCode};
use crate::model::load::{from_gguf_parts, ModelFile};
use crate::model::runner::BoxedLm;
use crate::remote::RemoteTarget;

/// A JS `Error` with `code` set.
pub(crate) fn js_error(e: &Error) -> JsValue {
    js_error_with(e.code(), &e.to_string())
}

pub(crate) fn js_error_with(code: ErrorCode, message: &str) -> JsValue {
    let err = js_sys::Error::new(message);
    let _ = js_sys::Reflect::set(&err, &"code".into(), &code.to_string().into());
    err.into()
}

/// A generation's result as JS takes it (`GenerateResult`).
fn completion_js(completion: &crate::Completion) -> Result<JsValue, JsValue> {
    let completion = serde_json::to_value(completion).map_err(|e| js_error_with(ErrorCode::Internal, &e.to_string()))?;
    to_js(&contract::camel(completion))
}

/// This instance's wasm memory in bytes.
fn wasm_memory_bytes() -> f64 {
    core::arch::wasm32::memory_size(0) as f64 * 65536.0
}

fn to_js<T: Serialize>(v: &T) -> Result<JsValue, JsValue> {
    v.serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .map_err(|e| js_error_with(ErrorCode::Internal, &e.to_string()))
}

/// What an option left out means ([`contract::defaults`]); the package's `DEFAULTS`, generated
/// from the same function, hold the same.
#[wasm_bindgen]
pub fn defaults() -> Result<JsValue, JsValue> {
    to_js(&contract::defaults())
}

/// The bounds of what the package takes ([`contract::limits`]), as its `LIMITS`.
#[wasm_bindgen]
pub fn limits() -> Result<JsValue, JsValue> {
    to_js(&contract::limits())
}

/// A model file's bytes in wasm memory, written piece by piece as they arrive; a split model's
/// parts one after the other ([`crate::model::split`]).
#[wasm_bindgen]
pub struct ModelBuffer {
    /// Each file's name (for errors) and bytes; the last is being written.
    files: Vec<(String, Vec<u8>)>,
    written: usize,
}

/// Room for a file of `len` bytes beside the `held` bytes of a split model's earlier parts
/// (refused cleanly when memory cannot hold the model, before its next part downloads).
fn file_room(len: f64, held: usize) -> Result<Vec<u8>, JsValue> {
    if !(len.is_finite() && len > 0.0 && held as f64 + len <= MAX_MODEL_BYTES) {
        return Err(js_error_with(
            ErrorCode::BadModel,
            &format!(
                "a model of {} bytes cannot be held in wasm memory (1 byte to {} GiB)",
                held as f64 + len,
                MAX_MODEL_BYTES / (1u64 << 30) as f64
            ),
        ));
    }
    let mut data = Vec::new();
    data.try_reserve_exact(len as usize)
        .map_err(|_| js_error_with(ErrorCode::OutOfMemory, &format!("cannot allocate {len} bytes for the model")))?;
    data.resize(len as usize, 0);
    Ok(data)
}

#[wasm_bindgen]
impl ModelBuffer {
    /// Room for a file of `len` bytes, called `name` in errors.
    #[wasm_bindgen(constructor)]
    pub fn new(len: f64, name: Option<String>) -> Result<ModelBuffer, JsValue> {
        let name = name.unwrap_or_else(|| "the model file".into());
        Ok(ModelBuffer { files: vec![(name, file_room(len, 0)?)], written: 0 })
    }

    /// The next part of a split model, once the previous one is whole.
    #[wasm_bindgen(js_name = nextPart)]
    pub fn next_part(&mut self, len: f64, name: String) -> Result<(), JsValue> {
        self.check_whole()?;
        let held = self.files.iter().map(|(_, data)| data.len()).sum();
        self.files.push((name, file_room(len, held)?));
        self.written = 0;
        Ok(())
    }

    /// Append the next piece of the file.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), JsValue> {
        let (name, data) = self.files.last_mut().expect("a buffer holds a file");
        let end = self.written + chunk.len();
        if end > data.len() {
            return Err(js_error_with(ErrorCode::BadModel, &format!("{name} is longer than its announced {} bytes", data.len())));
        }
        data[self.written..end].copy_from_slice(chunk);
        self.written = end;
        Ok(())
    }

    /// Bytes written into the file being written.
    pub fn written(&self) -> f64 {
        self.written as f64
    }
}

impl ModelBuffer {
    fn check_whole(&self) -> Result<(), JsValue> {
        let (name, data) = self.files.last().expect("a buffer holds a file");
        if self.written != data.len() {
            return Err(js_error_with(
                ErrorCode::BadModel,
                &format!("{name} is truncated: {} of {} bytes arrived", self.written, data.len()),
            ));
        }
        Ok(())
    }

    fn parse(self) -> Result<ModelFile, JsValue> {
        self.check_whole()?;
        let files = self.files.into_iter().map(|(name, data)| (name, Arc::new(data) as crate::storage::Storage)).collect();
        from_gguf_parts(files).map_err(|e| js_error(&e))
    }
}

/// The URLs of every part of the split model whose first part is `url`, or `undefined` when
/// `url` does not name a split model's first part (see [`crate::model::split::part_names`]).
#[wasm_bindgen(js_name = splitParts)]
pub fn split_parts(url: &str) -> Result<Option<Vec<String>>, JsValue> {
    crate::model::split::part_names(url).map_err(|e| js_error(&e))
}

/// A target model streamed onto the GPU as it downloads (see [`crate::model::stream`]).
#[cfg(feature = "gpu")]
#[wasm_bindgen]
pub struct ModelStream {
    stream: crate::model::stream::GgufStream<crate::backend::gpu::GpuBackend>,
}

#[cfg(feature = "gpu")]
#[wasm_bindgen]
impl ModelStream {
    /// Open the GPU that `opts` (as [`WasmEngine::load`] takes them) choose for the target, for
    /// files of `lens` bytes (0: length not announced) called `names`: one file, or a split
    /// model's parts. Resolves to a `ModelStream`.
    pub fn open(lens: Vec<f64>, names: Vec<String>, opts: JsValue) -> Promise {
        install_panic_hook();
        future_to_promise(async move {
            if let Some(len) = lens.iter().find(|len| !(len.is_finite() && (0.0..=MAX_SAFE_INTEGER).contains(*len))) {
                return Err(js_error_with(ErrorCode::BadModel, &format!("a model file of {len} bytes")));
            }
            if lens.len() != names.len() || lens.is_empty() {
                return Err(js_error_with(ErrorCode::Internal, "ModelStream.open: one name per file"));
            }
            let opts: LoadOpts = options::parse(opts)?;
            let Some(options) = opts.engine_options()?.target.gpu_options() else {
                return Err(js_error_with(ErrorCode::InvalidArgument, "a target streamed to the GPU needs backend 'gpu'"));
            };
            let gpu = crate::backend::gpu::GpuBackend::new(options).await.map_err(|e| js_error(&e))?;
            let parts = names.into_iter().zip(lens).map(|(name, len)| (name, (len > 0.0).then_some(len as u64))).collect();
            let stream = crate::model::stream::GgufStream::with_parts(gpu, parts);
            Ok(ModelStream { stream }.into())
        })
    }

    /// The next piece of file `part`: each tensor it completes goes to the GPU now.
    pub fn push(&mut self, part: usize, chunk: &[u8]) -> Result<(), JsValue> {
        self.stream.push_to(part, chunk).map_err(|e| js_error(&e))
    }

    /// Whether file `part`'s header is still to come: every file's first bytes go before any
    /// file's rest.
    #[wasm_bindgen(js_name = needsHeader)]
    pub fn needs_header(&self, part: usize) -> bool {
        self.stream.needs_header(part)
    }
}

/// The largest integer a JS number holds exactly.
#[cfg(feature = "gpu")]
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

thread_local! {
    /// The message of the panic that stopped this wasm instance, if one did.
    static PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
    /// Told of that panic: a call it cut short never settles its promise, so the JS side must
    /// learn of it another way (in Node, where no worker closes).
    static PANIC_LISTENER: RefCell<Option<Function>> = const { RefCell::new(None) };
}

/// Call `f(message)` when a panic stops this wasm instance.
#[wasm_bindgen(js_name = onPanic)]
pub fn on_panic(f: Function) {
    PANIC_LISTENER.with(|l| *l.borrow_mut() = Some(f));
}

/// Record a panic, print it, and close the worker it happened in. On wasm32 a panic aborts the
/// call midway, so the state it was changing cannot be trusted, and the promise of that call may
/// never settle: the worker goes away, which the side holding its lock (index.js for the engine
/// worker, engine-worker.js for the draft worker) sees at once. In Node, later calls fail. In the
/// threads build a panic on a thread of the compute pool closes that thread's worker and fails
/// the job in progress, whose panic on the engine's thread then ends the engine the same way.
fn install_panic_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let msg = info.to_string();
            #[cfg(all(feature = "threads", target_feature = "atomics"))]
            threads::on_panic(&msg);
            let global = js_sys::global();
            let call = |obj: &JsValue, name: &str, arg: &JsValue| {
                if let Ok(f) = js_sys::Reflect::get(obj, &name.into()).and_then(|f| f.dyn_into::<Function>()) {
                    let _ = f.call1(obj, arg);
                }
            };
            if let Ok(console) = js_sys::Reflect::get(&global, &"console".into()) {
                call(&console, "error", &format!("saguaro: {msg}").into());
            }
            PANIC.with(|p| *p.borrow_mut() = Some(msg.clone()));
            if let Some(f) = PANIC_LISTENER.with(|l| l.borrow().clone()) {
                let _ = f.call1(&JsValue::NULL, &msg.into());
            }
            if js_sys::Reflect::has(&global, &"WorkerGlobalScope".into()).unwrap_or(false) {
                call(&global, "close", &JsValue::UNDEFINED);
            }
        }));
    });
}

/// A value that an async call takes out for its whole run and puts back after: no `RefCell`
/// borrow is held across an `await`, where a panic would leave it taken for good.
struct Held<T>(Rc<RefCell<Option<T>>>);

impl<T> Clone for Held<T> {
    fn clone(&self) -> Self {
        Held(self.0.clone())
    }
}

impl<T> Held<T> {
    fn new(v: T) -> Self {
        Held(Rc::new(RefCell::new(Some(v))))
    }

    fn take(&self) -> Result<T, JsValue> {
        self.0.borrow_mut().take().ok_or_else(unavailable)
    }

    fn put(&self, v: T) {
        *self.0.borrow_mut() = Some(v);
    }

    /// Run `f` on the value now (a call that does not await).
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Result<R, JsValue> {
        self.0.borrow_mut().as_mut().map(f).ok_or_else(unavailable)
    }
}

/// Why the value is not there: a call is running, or a panic ended one midway.
fn unavailable() -> JsValue {
    match PANIC.with(|p| p.borrow().clone()) {
        Some(msg) => js_error_with(ErrorCode::Internal, &format!("the engine stopped at an internal error ({msg}): load it again")),
        None => js_error_with(ErrorCode::InvalidArgument, "the engine is busy with another call: await it (or abort it) first"),
    }
}

/// The engine as JS holds it. Calls that compute return Promises; one runs at a time.
#[wasm_bindgen]
pub struct WasmEngine {
    engine: Held<Engine>,
    /// The SSD draft's worker, once one is attached.
    draft: RefCell<Option<channel::DraftLink>>,
    /// Where that worker's draft computes, in words (its backend's name).
    draft_device: RefCell<Option<String>>,
}

#[wasm_bindgen]
impl WasmEngine {
    /// Place the models. `opts`: {backend, draftBackend, context, specK, fanout, modes}
    /// (see pkg-config/index.d.ts). Resolves to a `WasmEngine`.
    pub fn load(target: ModelBuffer, draft: Option<ModelBuffer>, opts: JsValue) -> Promise {
        Self::load_target(|_| Ok(Target::File(target.parse()?)), draft, opts)
    }

    /// Like [`WasmEngine::load`], with the target already streamed onto the GPU.
    #[cfg(feature = "gpu")]
    #[wasm_bindgen(js_name = loadStreamed)]
    pub fn load_streamed(target: ModelStream, draft: Option<ModelBuffer>, opts: JsValue) -> Promise {
        Self::load_target(
            |opts| {
                let streamed = target.stream.finish().map_err(|e| js_error(&e))?;
                let placed = crate::engine::PlacedTarget::new(streamed, opts, |r| Box::new(r)).map_err(|e| js_error(&e))?;
                Ok(Target::Placed(placed))
            },
            draft,
            opts,
        )
    }

    fn load_target(
        target: impl FnOnce(&crate::engine::EngineOptions) -> Result<Target, JsValue> + 'static,
        draft: Option<ModelBuffer>,
        opts: JsValue,
    ) -> Promise {
        install_panic_hook();
        future_to_promise(async move {
            let opts: LoadOpts = options::parse(opts)?;
            let engine_opts = opts.engine_options()?;
            let target = target(&engine_opts)?;
            let draft = draft.map(ModelBuffer::parse).transpose()?;
            let engine = Engine::with_target_wrapper(target, draft, &engine_opts, |lm| {
                Box::new(channel::yielding(lm)) as BoxedLm
            })
            .await
            .map_err(|e| js_error(&e))?;
            Ok(WasmEngine { engine: Held::new(engine), draft: RefCell::new(None), draft_device: RefCell::new(None) }.into())
        })
    }

    /// The target on a server, `target` = {server, topN, timeoutMs, retries}; the draft here
    /// (its tokenizer is the engine's). Resolves to a `WasmEngine`.
    #[wasm_bindgen(js_name = loadRemote)]
    pub fn load_remote(target: JsValue, draft: ModelBuffer, opts: JsValue) -> Promise {
        install_panic_hook();
        future_to_promise(async move {
            let server: ServerTarget = options::parse_named(target, "target")?;
            let remote = server.remote_options()?;
            let opts: LoadOpts = options::parse(opts)?;
            let engine_opts = opts.engine_options()?;
            if opts.parallel()? > 1 {
                return Err(js_error_with(ErrorCode::InvalidArgument, "parallel: a server target batches on its server (saguaro serve --parallel N)"));
            }
            let draft = draft.parse()?;
            let target = RemoteTarget::connect_with(remote, Arc::new(fetch::Fetch), &draft.weights.config)
                .await
                .map_err(|e| js_error(&e))?;
            let engine = Engine::with_remote_target(target, draft, &engine_opts).await.map_err(|e| js_error(&e))?;
            Ok(WasmEngine { engine: Held::new(engine), draft: RefCell::new(None), draft_device: RefCell::new(None) }.into())
        })
    }

    /// Check a server target's fields before any model is fetched.
    #[wasm_bindgen(js_name = checkServer)]
    pub fn check_server(target: JsValue) -> Result<(), JsValue> {
        let server: ServerTarget = options::parse_named(target, "target")?;
        server.remote_options().map(drop).map_err(JsValue::from)
    }

    /// Check load options (as [`WasmEngine::load`] takes them) before any model is fetched.
    #[wasm_bindgen(js_name = checkOptions)]
    pub fn check_options(opts: JsValue) -> Result<(), JsValue> {
        let opts: LoadOpts = options::parse(opts)?;
        opts.engine_options().map(drop).map_err(JsValue::from)
    }

    /// Use the draft answering on `port` (a [`WasmDraft`] in another worker) for SSD, and with
    /// `sd` for SD too (the engine holding no draft of its own). `info` is that draft's
    /// [`WasmDraft::info`]. Where SD comes with it, the engine times the target and, through the
    /// port, the draft, to choose its default mode: this resolves once that is done.
    #[wasm_bindgen(js_name = attachDraft)]
    pub fn attach_draft(&self, port: MessagePort, info: JsValue, sd: bool) -> Promise {
        let engine = self.engine.clone();
        let parsed = options::parse::<options::DraftInfo>(info).and_then(|info| match info.config {
            Some(config) => Ok((config, info.vocab, info.backend, info.device)),
            None => Err(js_error_with(ErrorCode::InvalidArgument, "attachDraft: the draft's info has no config")),
        });
        let (config, vocab, backend, device) = match parsed {
            Ok(p) => p,
            Err(e) => return Promise::reject(&e),
        };
        let (channel, link) = channel::PortChannel::new(port);
        // Reachable at once: an abort or a lost worker during the timing reaches it.
        *self.draft.borrow_mut() = Some(link);
        *self.draft_device.borrow_mut() = device;
        future_to_promise(async move {
            let worker = DraftWorker::remote(Box::new(channel), config);
            let mut held = engine.take()?;
            let attached = held.attach_draft(worker, &vocab, sd, backend.as_deref() != Some("gpu")).await;
            engine.put(held);
            attached.map_err(|e| js_error(&e))?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// An abort: cut the draft worker's speculation short now, rather than when the generation
    /// next reaches it. (The generation itself stops when `on_text` next returns `false`.)
    pub fn interrupt(&self) {
        if let Some(link) = &*self.draft.borrow() {
            link.interrupt();
        }
    }

    /// The draft worker is gone (`why`): a generation waiting on it fails (code `internal`), and
    /// so does SSD from then on.
    #[wasm_bindgen(js_name = draftLost)]
    pub fn draft_lost(&self, why: &str) {
        if let Some(link) = &*self.draft.borrow() {
            link.lose(why);
        }
    }

    /// What was loaded: {targetBackend, draftDevice, hasDraft, defaultMode, vocabSize, contextLength,
    /// wasmMemoryBytes}.
    pub fn info(&self) -> Result<JsValue, JsValue> {
        let attached = self.draft_device.borrow().clone();
        let info = self.engine.with(|engine| {
            let c = engine.target_config();
            EngineInfo {
                target_backend: engine.target_backend(),
                draft_device: engine.draft_backend().or(attached),
                threads: crate::backend::cpu::pool::shared_threads(),
                has_draft: engine.has_draft(),
                default_mode: engine.default_mode().to_string(),
                vocab_size: c.vocab_size,
                context_length: c.context_length,
                stop_texts: engine.tokenizer().eos_texts(),
                wasm_memory_bytes: wasm_memory_bytes(),
                parallel: 1,
            }
        })?;
        to_js(&info)
    }

    /// Generate. `prompt`: a string, or {messages: [{role, content}]}; `opts`: {mode, maxTokens,
    /// temperature, topK, topP, seed, specK, fanout, chat}. `on_text(piece, tokens)` is called once
    /// per round with the new text and the number of tokens it committed; returning `false` stops
    /// the generation (finish "cancelled").
    /// Resolves to {text, tokens, promptTokens, finish, stats} (the generated `GenerateResult`).
    pub fn generate(&self, prompt: JsValue, opts: JsValue, on_text: Function) -> Promise {
        let engine = self.engine.clone();
        future_to_promise(async move {
            let (prompt, gen_opts) = options::generate_call(prompt, opts)?;
            let mut held = engine.take()?;
            let mut callback_error = None;
            let completion = held
                .generate(&prompt, &gen_opts, &mut |piece, n| match on_text.call2(&JsValue::NULL, &piece.into(), &(n as u32).into()) {
                    Ok(v) => v.as_bool() != Some(false),
                    Err(e) => {
                        callback_error = Some(e);
                        false
                    }
                })
                .await;
            engine.put(held);
            let completion = completion.map_err(|e| js_error(&e))?;
            if let Some(e) = callback_error {
                return Err(e);
            }
            completion_js(&completion)
        })
    }
}

/// The draft model in its own worker, serving SSD and SD.
#[wasm_bindgen]
pub struct WasmDraft {
    host: Held<DraftHost>,
    /// The host's abandon flag, set by [`WasmDraft::interrupt`] while a job holds the host.
    abandon: Arc<AtomicBool>,
    vocab: String,
    /// Where the draft computes: "cpu" or "gpu".
    backend: String,
    /// The same in words: its backend's name.
    device: String,
}

#[wasm_bindgen]
impl WasmDraft {
    /// Load the draft on the CPU (or `opts.backend` "gpu"). Resolves to a `WasmDraft`.
    pub fn load(model: ModelBuffer, opts: JsValue) -> Promise {
        install_panic_hook();
        future_to_promise(async move {
            let opts: LoadOpts = options::parse(opts)?;
            let engine_opts = opts.engine_options()?;
            let file = model.parse()?;
            let capacity = Engine::capacity(&file.weights.config, &engine_opts);
            let lm = engine_opts.draft.runner(&file.weights, capacity).await.map_err(|e| js_error(&e))?;
            let vocab = file.tokenizer.vocab_fingerprint();
            let device = lm.backend_name();
            let backend = if matches!(engine_opts.draft, Device::Gpu { .. }) { "gpu" } else { "cpu" }.to_string();
            // Turns of the event loop between forwards let an interrupt arrive mid-tree.
            let host = DraftHost::new(Box::new(channel::yielding(lm)));
            let abandon = host.abandon_flag();
            Ok(WasmDraft { host: Held::new(host), abandon, vocab, backend, device }.into())
        })
    }

    /// Cut the speculation in progress short: the engine's generation ended or was aborted.
    /// Jobs already queued run their cheap parts only, until the next generation starts.
    pub fn interrupt(&self) {
        self.abandon.store(true, Ordering::Relaxed);
    }

    /// {config, vocab, backend, device}: what the engine checks before it accepts this draft,
    /// and where it computes.
    pub fn info(&self) -> Result<JsValue, JsValue> {
        let config = self.host.with(|h| h.config().clone())?;
        let (backend, device) = (Some(self.backend.clone()), Some(self.device.clone()));
        to_js(&options::DraftInfo { config: Some(config), vocab: self.vocab.clone(), backend, device })
    }

    /// Answer one job from the engine: resolves to {reply, q} (see [`channel::encode_reply`]);
    /// post it with `q`'s buffers transferred.
    pub fn handle(&self, job: JsValue) -> Promise {
        let host = self.host.clone();
        future_to_promise(async move {
            let job: Job = serde_wasm_bindgen::from_value(job)
                .map_err(|e| js_error_with(ErrorCode::Internal, &format!("unreadable draft job: {e}")))?;
            let mut held = host.take()?;
            let reply = held.handle(job).await;
            host.put(held);
            channel::encode_reply(reply)
        })
    }
}
