//! The threads build's compute pool: Web Workers (worker threads in Node) sharing this module's
//! memory, installed into the CPU backend ([`pool::install`]) for its
//! [`Pool`](crate::backend::cpu::pool::Pool) to spread its chunks on.
//!
//! A forward makes hundreds of short parallel calls, so the pool is a plain fork-join made for
//! them rather than rayon's scheduler: the thread that owns the pool (the engine's) publishes a
//! job and works its chunks itself, the other threads claim chunks from one shared counter as
//! they come. Between calls they spin a while before they park (`memory.atomic.wait32`), so that
//! within a forward no call waits for a thread to wake up, and an idle engine burns no CPU.
//!
//! The JS side (pkg-config/core.js) starts the pool: [`threads_start`] on the engine's thread,
//! then one worker per other thread, each instantiating this module on the same memory and
//! calling [`threads_worker`], which never returns. A thread that stops (a panic, a trap) makes
//! the job in progress panic on the owner's thread, whose panic hook then ends the engine as
//! any panic does (src/wasm/mod.rs).

use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use wasm_bindgen::prelude::*;
use web_time::Instant;

use crate::backend::cpu::pool;
use crate::contract::MAX_THREADS;

/// How long a waiting thread spins before it parks: longer than the gaps between a forward's
/// parallel calls (a parked thread takes tens of microseconds to wake), short enough that an idle
/// engine stops using the CPU at once.
const SPIN: Duration = Duration::from_millis(1);

/// A spin-wait's budget: `more()` says whether to keep spinning, reading the clock (a call out
/// to `performance.now()`) once every 1024 turns.
struct Spin {
    turns: u32,
    start: Option<Instant>,
}

impl Spin {
    fn new() -> Self {
        Spin { turns: 0, start: None }
    }

    fn more(&mut self) -> bool {
        self.turns = self.turns.wrapping_add(1);
        if !self.turns.is_multiple_of(1024) {
            std::hint::spin_loop();
            return true;
        }
        self.start.get_or_insert_with(Instant::now).elapsed() < SPIN
    }
}

/// One parallel call: `f(i)` for every `i` in `0..n`. It lives on the owner's stack until every
/// chunk is done.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    n: u32,
}

/// `(epoch << 32) | chunks not yet claimed` of the job in progress. A thread claims a chunk by
/// decrementing it in place; the epoch makes a claim on a job that ended fail.
static CLAIM: AtomicU64 = AtomicU64::new(0);
/// The job in progress (published before its `CLAIM`).
static JOB: AtomicPtr<Job<'static>> = AtomicPtr::new(std::ptr::null_mut());
/// Chunks of the job in progress that are done.
static DONE: AtomicU32 = AtomicU32::new(0);
/// Workers parked until the next job, and the workers to unpark then.
static SLEEPERS: AtomicU32 = AtomicU32::new(0);
static WORKERS: Mutex<Vec<Thread>> = Mutex::new(Vec::new());
/// The owner's thread, and 1 while it is parked until the job's chunks are done.
static OWNER: OnceLock<Thread> = OnceLock::new();
static OWNER_WAITING: AtomicU32 = AtomicU32::new(0);
/// Threads in the pool, the owner's included (0 before [`threads_start`]).
static SIZE: AtomicUsize = AtomicUsize::new(0);
/// Set once a thread of the pool has stopped, with why.
static FAILED: AtomicU32 = AtomicU32::new(0);
static FAILURE: Mutex<Option<String>> = Mutex::new(None);

#[derive(Clone, Copy, PartialEq)]
enum Role {
    Other,
    /// The thread that started the pool (the engine's), not inside a parallel call.
    Owner,
    /// The owner inside a parallel call: a nested call runs inline.
    Busy,
    Worker,
}

thread_local! {
    static ROLE: Cell<Role> = const { Cell::new(Role::Other) };
}

/// This pool, as the CPU backend's pools see it.
struct Workers;

impl pool::Threads for Workers {
    /// The caller's included: 1 before the pool is started, and on any thread but the one that
    /// started it.
    fn size(&self) -> usize {
        match ROLE.with(Cell::get) {
            Role::Owner | Role::Busy => SIZE.load(Relaxed).max(1),
            _ => 1,
        }
    }

    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) -> bool {
        for_each(n, f)
    }
}

/// Start a pool of `threads` threads on this thread (once per module instance; later calls keep
/// the first size). Returns `{module, memory, size}`: the JS side starts `size - 1` workers, each
/// instantiating `module` on `memory` and calling [`threads_worker`].
#[wasm_bindgen(js_name = threadsStart)]
pub fn threads_start(threads: usize) -> Result<JsValue, JsValue> {
    if !(1..=MAX_THREADS).contains(&threads) {
        return Err(super::js_error_with(crate::error::ErrorCode::InvalidArgument, &format!("threads: must be 1 to {MAX_THREADS}, got {threads}")));
    }
    if SIZE.compare_exchange(0, threads, AcqRel, Acquire).is_ok() {
        ROLE.with(|r| r.set(Role::Owner));
        let _ = OWNER.set(std::thread::current());
        pool::install(&Workers);
    }
    let out = js_sys::Object::new();
    js_sys::Reflect::set(&out, &"module".into(), &wasm_bindgen::module())?;
    js_sys::Reflect::set(&out, &"memory".into(), &wasm_bindgen::memory())?;
    js_sys::Reflect::set(&out, &"size".into(), &(SIZE.load(Relaxed) as u32).into())?;
    Ok(out.into())
}

/// A worker's life: wait for jobs, work their chunks. Never returns.
#[wasm_bindgen(js_name = threadsWorker)]
pub fn threads_worker() {
    ROLE.with(|r| r.set(Role::Worker));
    WORKERS.lock().unwrap_or_else(|e| e.into_inner()).push(std::thread::current());
    loop {
        let mut spin = Spin::new();
        let claim = loop {
            let c = CLAIM.load(Acquire);
            if c as u32 != 0 {
                break c;
            }
            if spin.more() {
                continue;
            }
            SLEEPERS.fetch_add(1, SeqCst);
            if CLAIM.load(SeqCst) as u32 == 0 {
                std::thread::park();
            }
            SLEEPERS.fetch_sub(1, SeqCst);
            spin = Spin::new();
        };
        work(claim);
    }
}

/// A worker's JS side saw it stop without a panic (a trap): the job in progress fails.
#[wasm_bindgen(js_name = threadsFailed)]
pub fn threads_failed() {
    fail(None);
}

/// From the panic hook: a worker's panic fails the job in progress (on the owner's thread).
pub fn on_panic(msg: &str) {
    if ROLE.with(Cell::get) == Role::Worker {
        fail(Some(msg));
    }
}

fn fail(msg: Option<&str>) {
    if let (Some(msg), Ok(mut f)) = (msg, FAILURE.try_lock()) {
        f.get_or_insert_with(|| msg.to_string());
    }
    FAILED.store(1, SeqCst);
    if let Some(owner) = OWNER.get() {
        owner.unpark();
    }
}

/// Claim and run chunks of the job whose `CLAIM` word was `claim`, until none is left. A claim
/// takes a share of what is left (guided self-scheduling: large claims first, single chunks at
/// the end), so that a call costs few round trips of the shared counters between the cores.
fn work(mut claim: u64) {
    let job = JOB.load(Acquire);
    let share = 2 * SIZE.load(Relaxed).max(1) as u32;
    loop {
        let left = claim as u32;
        if left == 0 {
            return;
        }
        let take = (left / share).max(1);
        match CLAIM.compare_exchange_weak(claim, claim - take as u64, AcqRel, Acquire) {
            Ok(_) => {
                // SAFETY: the claim succeeded with chunks left in this epoch, so the job is still
                // in progress, `job` is its (published before CLAIM, read after it), and it lives
                // until these chunks count as done below.
                let job = unsafe { &*job };
                let first = job.n - left;
                for i in first..first + take {
                    (job.f)(i as usize);
                }
                DONE.fetch_add(take, SeqCst);
                if OWNER_WAITING.load(SeqCst) != 0 {
                    if let Some(owner) = OWNER.get() {
                        owner.unpark();
                    }
                }
                claim -= take as u64;
            }
            Err(now) if now >> 32 == claim >> 32 => claim = now,
            Err(_) => return,
        }
    }
}

/// Run `f(i)` for `i` in `0..n` on the pool; `false` (nothing run) where this thread cannot use
/// it: not the pool's owner, or already inside a call.
fn for_each(n: usize, f: &(dyn Fn(usize) + Sync)) -> bool {
    if ROLE.with(Cell::get) != Role::Owner || SIZE.load(Relaxed) < 2 || n > u32::MAX as usize {
        return false;
    }
    check_failed();
    ROLE.with(|r| r.set(Role::Busy));
    let job = Job { f, n: n as u32 };
    // SAFETY (of the lifetime change): the job is unpublished below only once all its chunks are
    // done; no thread touches it after its chunk counted.
    let ptr = &job as *const Job<'_> as *mut Job<'static>;
    let epoch = (CLAIM.load(Relaxed) >> 32) + 1;
    DONE.store(0, Relaxed);
    JOB.store(ptr, Release);
    CLAIM.store(((epoch & 0xffff_ffff) << 32) | n as u64, SeqCst);
    if SLEEPERS.load(SeqCst) != 0 {
        for t in WORKERS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            t.unpark();
        }
    }
    work(CLAIM.load(Acquire));
    let mut spin = Spin::new();
    loop {
        let done = DONE.load(Acquire);
        if done == n as u32 {
            break;
        }
        if spin.more() {
            continue;
        }
        check_failed();
        OWNER_WAITING.store(1, SeqCst);
        if DONE.load(SeqCst) == done {
            // Bounded, so that a thread that stopped without a word is noticed too.
            std::thread::park_timeout(Duration::from_millis(100));
        }
        OWNER_WAITING.store(0, SeqCst);
    }
    JOB.store(std::ptr::null_mut(), Relaxed);
    ROLE.with(|r| r.set(Role::Owner));
    true
}

/// A thread of the pool stopped: so does the engine (this panic ends it, src/wasm/mod.rs).
fn check_failed() {
    if FAILED.load(Acquire) != 0 {
        let why = FAILURE.try_lock().ok().and_then(|f| f.clone()).unwrap_or_else(|| "it stopped".into());
        panic!("a compute thread of the pool failed: {why}");
    }
}
