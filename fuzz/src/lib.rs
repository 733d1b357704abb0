//! What every fuzz target shares: an allocator that stops the run on any single allocation over
//! [`LIMIT`]. libFuzzer's own `-malloc_limit_mb` needs a sanitizer's malloc hooks, and the targets
//! are built without one (`--sanitizer none`, see scripts/fuzz.sh). This catches the same bug, a
//! size field read from the input making the loader reserve far more than the input holds, even
//! where the memory is never touched (so `-rss_limit_mb` would not see it).

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;

/// The largest single allocation a loader may make for a fuzz input (inputs are at most 128 kB).
pub const LIMIT: usize = 256 << 20;

/// [`System`], aborting (which libFuzzer reports as a crash, saving the input) on an allocation
/// over [`LIMIT`].
pub struct Bounded;

fn check(size: usize) {
    if size > LIMIT {
        // Formatting an integer into unbuffered stderr allocates nothing.
        let _ = writeln!(std::io::stderr(), "==saguaro-fuzz== allocation of {size} bytes, over the {LIMIT}-byte limit");
        std::process::abort();
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        check(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}
