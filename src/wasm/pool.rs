//! [`WasmPool`]: the engine JS loads with `parallel` above 1. Its calls do not wait in line: each
//! joins the [`Pool`]'s batch (as soon as one of its sequences is free), and one driver steps the
//! batch while any call runs, yielding a turn of the event loop between steps so that new calls
//! and aborts arrive. A call that ends, fails or is aborted leaves the others running.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use futures::channel::oneshot;
use js_sys::{Function, Promise};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{future_to_promise, spawn_local};

use super::{channel, completion_js, install_panic_hook, js_error, js_error_with, options, to_js, wasm_memory_bytes, ModelBuffer};
use crate::contract::{EngineInfo, LoadOpts};
use crate::decode::{BoxedSink, FinishReason, Generation, Mode, Stats};
use crate::engine::{GenerateOptions, Prompt};
use crate::error::ErrorCode;
use crate::model::tokenizer::{StreamDecoder, Tokenizer};
use crate::pool::Pool;
use crate::Completion;

/// An engine whose concurrent calls generate in one batch.
#[wasm_bindgen]
pub struct WasmPool {
    state: Rc<State>,
}

struct State {
    /// `None` while a step runs.
    pool: RefCell<Option<Pool>>,
    tokenizer: Rc<Tokenizer>,
    /// Calls waiting for a sequence, oldest first.
    waiting: RefCell<VecDeque<Call>>,
    /// What each running generation's end needs, by its id in the pool.
    running: RefCell<HashMap<u64, Ending>>,
    driving: Cell<bool>,
    /// Set when JS frees the engine: what runs or waits then fails.
    closed: Cell<bool>,
    /// What [`WasmPool::info`] reports, as of the last step (the pool is taken while one runs).
    info: RefCell<EngineInfo>,
}

/// A call before it joins.
struct Call {
    prompt: Prompt,
    opts: GenerateOptions,
    on_text: Function,
    done: oneshot::Sender<Result<JsValue, JsValue>>,
}

/// A joined call's text so far and where its result goes.
struct Ending {
    decoder: Rc<RefCell<StreamDecoder<Rc<Tokenizer>>>>,
    /// An error of the text's decoding or of `on_text`: it ended the generation.
    failure: Rc<RefCell<Option<JsValue>>>,
    on_text: Function,
    prompt_tokens: usize,
    done: oneshot::Sender<Result<JsValue, JsValue>>,
}

fn disposed() -> JsValue {
    js_error_with(ErrorCode::InvalidArgument, "the engine was disposed")
}

#[wasm_bindgen]
impl WasmPool {
    /// Place the models for `opts.parallel` sequences (the load options of
    /// [`super::WasmEngine::load`]; modes AR and SD). Resolves to a `WasmPool`.
    pub fn load(target: ModelBuffer, draft: Option<ModelBuffer>, opts: JsValue) -> Promise {
        install_panic_hook();
        future_to_promise(async move {
            let opts: LoadOpts = options::parse(opts)?;
            let parallel = opts.parallel()?;
            let engine_opts = opts.engine_options()?;
            // A draft serves SD only.
            let draft = draft.filter(|_| engine_opts.modes.contains(&Mode::Sd)).map(ModelBuffer::parse).transpose()?;
            let pool = Pool::load(target.parse()?, draft, &engine_opts, parallel).await.map_err(|e| js_error(&e))?;
            let state = State {
                tokenizer: Rc::new(pool.tokenizer().clone()),
                info: RefCell::new(info_of(&pool)),
                pool: RefCell::new(Some(pool)),
                waiting: RefCell::default(),
                running: RefCell::default(),
                driving: Cell::new(false),
                closed: Cell::new(false),
            };
            Ok(WasmPool { state: Rc::new(state) }.into())
        })
    }

    /// What was loaded ([`super::WasmEngine::info`]'s fields); `defaultMode` is the mode a lone
    /// call takes.
    pub fn info(&self) -> Result<JsValue, JsValue> {
        let mut info = self.state.info.borrow_mut();
        info.wasm_memory_bytes = wasm_memory_bytes();
        to_js(&*info)
    }

    /// Generate, as [`super::WasmEngine::generate`] does, in the batch of every call running.
    pub fn generate(&self, prompt: JsValue, opts: JsValue, on_text: Function) -> Promise {
        let state = self.state.clone();
        future_to_promise(async move {
            let (prompt, opts) = options::generate_call(prompt, opts)?;
            if state.closed.get() {
                return Err(disposed());
            }
            let (done, result) = oneshot::channel();
            state.waiting.borrow_mut().push_back(Call { prompt, opts, on_text, done });
            if !state.driving.replace(true) {
                spawn_local(drive(state.clone()));
            }
            result.await.unwrap_or_else(|_| Err(js_error_with(ErrorCode::Internal, "the engine stopped before the generation ended")))
        })
    }
}

fn info_of(pool: &Pool) -> EngineInfo {
    let config = pool.target_config();
    let (target_backend, draft_device) = pool.backends();
    EngineInfo {
        target_backend,
        draft_device,
        threads: crate::backend::cpu::pool::shared_threads(),
        has_draft: pool.has_draft(),
        default_mode: pool.choose(1).0.to_string(),
        vocab_size: config.vocab_size,
        context_length: config.context_length,
        stop_texts: pool.tokenizer().eos_texts(),
        wasm_memory_bytes: wasm_memory_bytes(),
        parallel: pool.parallel(),
    }
}

impl Drop for WasmPool {
    fn drop(&mut self) {
        self.state.closed.set(true);
    }
}

/// Step the batch until no call runs or waits.
async fn drive(state: Rc<State>) {
    loop {
        let Some(mut pool) = state.pool.borrow_mut().take() else { break };
        if state.closed.get() {
            close(&state, &mut pool);
        }
        join_waiting(&state, &mut pool);
        if pool.running() == 0 {
            *state.pool.borrow_mut() = Some(pool);
            break;
        }
        let done = pool.step().await;
        *state.info.borrow_mut() = info_of(&pool);
        *state.pool.borrow_mut() = Some(pool);
        for (id, result) in done {
            if let Some(ending) = state.running.borrow_mut().remove(&id) {
                ending.finish(result, &state.tokenizer);
            }
        }
        channel::next_task().await;
    }
    state.driving.set(false);
}

/// JS freed the engine: stop every generation and fail every call.
fn close(state: &State, pool: &mut Pool) {
    for (id, ending) in state.running.borrow_mut().drain() {
        pool.cancel(id);
        let _ = ending.done.send(Err(disposed()));
    }
    for call in state.waiting.borrow_mut().drain(..) {
        let _ = call.done.send(Err(disposed()));
    }
}

/// Join the calls waiting, oldest first, as far as sequences are free: together, so the mode is
/// chosen for the batch they make.
fn join_waiting(state: &State, pool: &mut Pool) {
    let calls: Vec<Call> = {
        let mut waiting = state.waiting.borrow_mut();
        let n = pool.free().min(waiting.len());
        waiting.drain(..n).collect()
    };
    let mut arrivals = Vec::new();
    let mut endings = Vec::new();
    for call in calls {
        // A call aborted while it waited for a sequence takes none.
        match call.on_text.call2(&JsValue::NULL, &"".into(), &0.into()) {
            Ok(v) if v.as_bool() == Some(false) => {
                let cancelled = Completion { text: String::new(), tokens: Vec::new(), prompt_tokens: 0, finish: FinishReason::Cancelled, stats: Stats::default(), tool_calls: Vec::new() };
                let _ = call.done.send(completion_js(&cancelled));
                continue;
            }
            Err(e) => {
                let _ = call.done.send(Err(e));
                continue;
            }
            Ok(_) => {}
        }
        let decoder = Rc::new(RefCell::new(StreamDecoder::new(state.tokenizer.clone())));
        let failure = Rc::new(RefCell::new(None));
        let sink = text_sink(decoder.clone(), failure.clone(), call.on_text.clone());
        arrivals.push((call.prompt, call.opts, sink));
        endings.push(Ending { decoder, failure, on_text: call.on_text, prompt_tokens: 0, done: call.done });
    }
    for (joined, mut ending) in pool.join_all(arrivals).into_iter().zip(endings) {
        match joined {
            Ok(j) => {
                ending.prompt_tokens = j.prompt_tokens;
                state.running.borrow_mut().insert(j.id, ending);
            }
            Err(e) => drop(ending.done.send(Err(js_error(&e)))),
        }
    }
}

/// Committed tokens to `on_text(piece, tokens)` as whole characters; `on_text` returning `false`,
/// or failing, stops the generation.
fn text_sink(decoder: Rc<RefCell<StreamDecoder<Rc<Tokenizer>>>>, failure: Rc<RefCell<Option<JsValue>>>, on_text: Function) -> BoxedSink<'static> {
    Box::new(move |tokens: &[u32]| {
        let text = match decoder.borrow_mut().push_all(tokens) {
            Ok(text) => text,
            Err(e) => {
                *failure.borrow_mut() = Some(js_error(&e));
                return false;
            }
        };
        match on_text.call2(&JsValue::NULL, &text.into(), &(tokens.len() as u32).into()) {
            Ok(v) => v.as_bool() != Some(false),
            Err(e) => {
                *failure.borrow_mut() = Some(e);
                false
            }
        }
    })
}

impl Ending {
    fn finish(self, result: crate::error::Result<Generation>, tokenizer: &Tokenizer) {
        let Ending { decoder, failure, on_text, prompt_tokens, done } = self;
        let completion = (|| {
            let g = result.map_err(|e| js_error(&e))?;
            if let Some(e) = failure.borrow_mut().take() {
                return Err(e);
            }
            let rest = decoder.borrow_mut().finish().map_err(|e| js_error(&e))?;
            if !rest.is_empty() {
                on_text.call2(&JsValue::NULL, &rest.into(), &0.into())?;
            }
            let text = tokenizer.decode(&g.tokens).map_err(|e| js_error(&e))?;
            completion_js(&Completion { text, tokens: g.tokens, prompt_tokens, finish: g.finish, stats: g.stats, tool_calls: Vec::new() })
        })();
        let _ = done.send(completion);
    }
}
