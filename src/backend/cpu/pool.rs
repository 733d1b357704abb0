//! Row-parallel work: a rayon pool natively, the calling thread in the browser.

#[cfg(feature = "native")]
pub struct Pool(rayon::ThreadPool);

#[cfg(not(feature = "native"))]
pub struct Pool;

impl Pool {
    /// A pool of `threads` workers (0 = one per available core).
    pub fn new(threads: usize) -> crate::Result<Pool> {
        #[cfg(feature = "native")]
        {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .map(Pool)
                .map_err(|e| crate::Error::Worker(format!("cannot start CPU threads: {e}")))
        }
        #[cfg(not(feature = "native"))]
        {
            let _ = threads;
            Ok(Pool)
        }
    }

    pub fn threads(&self) -> usize {
        #[cfg(feature = "native")]
        return self.0.current_num_threads();
        #[cfg(not(feature = "native"))]
        1
    }

    /// Run `f(chunk_index)` for every chunk in `0..n_chunks`, spread over the pool.
    pub fn for_each(&self, n_chunks: usize, f: impl Fn(usize) + Send + Sync) {
        #[cfg(feature = "native")]
        {
            use rayon::prelude::*;
            if n_chunks <= 1 || self.0.current_num_threads() == 1 {
                (0..n_chunks).for_each(f);
            } else {
                self.0.install(|| (0..n_chunks).into_par_iter().for_each(f));
            }
        }
        #[cfg(not(feature = "native"))]
        (0..n_chunks).for_each(f);
    }
}

/// A raw output pointer shared by workers that write disjoint ranges.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T>(pub *mut T);
unsafe impl<T> Send for SharedMut<T> {}
unsafe impl<T> Sync for SharedMut<T> {}
