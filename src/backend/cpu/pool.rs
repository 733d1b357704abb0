//! Row-parallel work: rayon natively; in wasm, the [`Threads`] the front-end installed (the
//! threads build's workers sharing memory), else the calling thread alone.
//!
//! A forward makes hundreds of short parallel calls (one per matmul), so handing each to a pool
//! from outside would put the caller to sleep and wake a worker every time, which costs as much
//! as a small model's matmul. Instead the calling thread joins a pool of its own (kept per thread,
//! built on first use) and works the first share itself while the other workers steal the rest.

#[cfg(feature = "native")]
pub struct Pool {
    threads: usize,
    /// For calls from a thread that already belongs to a pool of another size (`None` if its
    /// threads could not be started: the work then runs on the caller alone).
    outside: std::sync::OnceLock<Option<rayon::ThreadPool>>,
}

#[cfg(not(feature = "native"))]
pub struct Pool {
    threads: usize,
}

/// Threads from outside the backend that a [`Pool`] spreads its chunks on where rayon cannot run
/// (wasm): the front-end that starts them hands them over with [`install`], so that the backend
/// never calls up into it.
#[cfg(not(feature = "native"))]
pub trait Threads: Sync {
    /// Threads the calling thread may use, its own included (1: none).
    fn size(&self) -> usize;
    /// `f(i)` for every `i` in `0..n`, spread over the threads; `false` (nothing run) where the
    /// calling thread cannot use them.
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) -> bool;
}

#[cfg(not(feature = "native"))]
static THREADS: std::sync::OnceLock<&'static dyn Threads> = std::sync::OnceLock::new();

/// Hands every pool `threads` to compute on (the first call wins; pools made before it keep to
/// the calling thread). Only the threads build has threads to hand over.
#[cfg(all(not(feature = "native"), feature = "threads"))]
pub fn install(threads: &'static dyn Threads) {
    let _ = THREADS.set(threads);
}

#[cfg(feature = "native")]
thread_local! {
    /// This thread's own pool, the thread being one of its workers. rayon never frees a pool that
    /// borrows a thread, so there is one per thread, shared by every backend used on it.
    static OWN: std::cell::OnceCell<Option<rayon::ThreadPool>> = const { std::cell::OnceCell::new() };
}

impl Pool {
    /// A pool of `threads` workers counting the caller (0 = one per available core; in wasm, all the
    /// threads of the pool the JS side started on this thread, at most).
    pub fn new(threads: usize) -> crate::Result<Pool> {
        #[cfg(feature = "native")]
        {
            let threads = match threads {
                0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
                n => n,
            };
            Ok(Pool { threads, outside: std::sync::OnceLock::new() })
        }
        #[cfg(not(feature = "native"))]
        {
            let available = shared_threads();
            Ok(Pool { threads: if threads == 0 { available } else { threads.min(available) } })
        }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Run `f(chunk_index)` for every chunk in `0..n_chunks`, spread over the pool.
    pub fn for_each(&self, n_chunks: usize, f: impl Fn(usize) + Send + Sync) {
        #[cfg(feature = "native")]
        {
            use rayon::prelude::*;
            if n_chunks <= 1 || self.threads == 1 {
                return (0..n_chunks).for_each(f);
            }
            let run = |pool: &rayon::ThreadPool| pool.install(|| (0..n_chunks).into_par_iter().for_each(&f));
            let own = OWN.with(|own| {
                let pool = own.get_or_init(|| {
                    rayon::ThreadPoolBuilder::new().num_threads(self.threads).use_current_thread().build().ok()
                });
                match pool {
                    Some(pool) if pool.current_num_threads() == self.threads => {
                        run(pool);
                        true
                    }
                    _ => false,
                }
            });
            if !own {
                // A thread whose own pool has another size, or that could not build one (it belongs
                // to a pool already): hand the work to a separate pool.
                match self.outside.get_or_init(|| rayon::ThreadPoolBuilder::new().num_threads(self.threads).build().ok()) {
                    Some(pool) => run(pool),
                    None => (0..n_chunks).for_each(f),
                }
            }
        }
        #[cfg(not(feature = "native"))]
        {
            if n_chunks > 1 && self.threads > 1 && THREADS.get().is_some_and(|t| t.for_each(n_chunks, &f)) {
                return;
            }
            (0..n_chunks).for_each(f);
        }
    }
}

/// Threads of the installed [`Threads`] this thread may use (1 without them).
#[cfg(not(feature = "native"))]
pub(crate) fn shared_threads() -> usize {
    THREADS.get().map_or(1, |t| t.size())
}

/// A raw output pointer shared by workers that write disjoint ranges.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T>(pub *mut T);
unsafe impl<T> Send for SharedMut<T> {}
unsafe impl<T> Sync for SharedMut<T> {}
