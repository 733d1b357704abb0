//! Memory does not grow from call to call: resident memory before and after 20 generate calls on
//! one engine, with the target on the CPU and on the GPU. One test in this binary, so no other
//! test allocates while it measures.
//! Linux with glibc only: it reads /proc/self/status and sets and trims glibc's malloc.
#![cfg(all(target_os = "linux", target_env = "gnu"))]

mod util;

use futures::executor::block_on;

use saguaro::backend::cpu::{CpuBackend, Precision};
use saguaro::backend::gpu::{GpuBackend, GpuOptions};
use saguaro::decode::{generate_ar, generate_ssd, Backup, DraftWorker, Request, SpecConfig};
use saguaro::model::load::ModelFile;
use saguaro::model::runner::{Lm, Runner};
use saguaro::model::transformer::Transformer;
use saguaro::sampling::SamplingParams;

const CALLS: usize = 20;
/// Calls before the first measurement: caches, pools, pipelines and scratch buffers are created on
/// first use.
const WARM_UP: usize = 3;
/// Readings (one after each call) whose minimum stands for the start and for the end of the
/// measured calls. Even with a fixed mmap threshold, resident memory alternates between two levels
/// 1.2 MB apart from call to call (measured) as glibc reuses or trims an arena's top; a leak raises
/// the minimum, the alternation does not.
const WINDOW: usize = 4;
/// Growth allowed between the two windows (16 calls apart): allocator and driver bookkeeping, far
/// below what keeping one call's KV cache (SmolLM2: 46 KB per token) or logits (192 KB per token)
/// would add.
const BOUND_KB: u64 = 4096;
const CAPACITY: usize = 128;
/// Blocks from this size up are mmapped and unmapped on free. glibc's default threshold moves up
/// as large blocks are freed, after which buffers of a call land in the thread arenas, whose
/// resident size then swung by 7 MB from call to call, leak or no leak (measured).
const MMAP_THRESHOLD: i32 = 128 * 1024;
/// glibc's mallopt parameter number for the mmap threshold (malloc.h).
const M_MMAP_THRESHOLD: i32 = -3;

extern "C" {
    /// glibc: give the free memory of every malloc arena back to the kernel.
    fn malloc_trim(pad: usize) -> i32;
    /// glibc: set one of malloc's tunables.
    fn mallopt(param: i32, value: i32) -> i32;
}

/// This process's resident anonymous memory (Linux): the heap and what the drivers allocate. The
/// memory-mapped model's pages are left out: the kernel maps them in and evicts them as the
/// machine's load changes, which says nothing about leaks. The arenas are trimmed first: glibc
/// keeps freed blocks resident per thread arena, while a leak stays resident.
fn rss_kb() -> u64 {
    // SAFETY: malloc_trim only returns unused pages of glibc's own arenas to the kernel.
    unsafe { malloc_trim(0) };
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status (Linux)");
    let line = status.lines().find(|l| l.starts_with("RssAnon:")).expect("a RssAnon line");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("RssAnon in kB")
}

/// Run `call` `WARM_UP` times, then `CALLS` times reading resident memory after each, and check
/// the minimum of the last `WINDOW` readings is at most `BOUND_KB` above that of the first.
fn assert_no_growth(what: &str, mut call: impl FnMut()) {
    for _ in 0..WARM_UP {
        call();
    }
    let readings: Vec<u64> = (0..CALLS)
        .map(|_| {
            call();
            rss_kb()
        })
        .collect();
    let before = *readings[..WINDOW].iter().min().unwrap();
    let after = *readings[CALLS - WINDOW..].iter().min().unwrap();
    let growth = after as i64 - before as i64;
    eprintln!("{what}: resident {before} kB at the start and {after} kB after {CALLS} calls ({growth:+} kB); all readings {readings:?}");
    assert!(growth <= BOUND_KB as i64, "{what}: resident memory grew by {growth} kB over {CALLS} calls (minimum of the first and of the last {WINDOW} readings)");
}

fn request(m: &ModelFile, max_tokens: usize) -> Request {
    Request {
        prompt: m.tokenizer.encode("def fibonacci(n):").unwrap(),
        max_tokens,
        sampling: SamplingParams { temperature: 0.8, seed: 5, ..SamplingParams::default() },
        ..Request::default()
    }
}

fn cpu(m: &ModelFile, capacity: usize) -> Runner<CpuBackend> {
    let backend = CpuBackend::new(0).unwrap().with_precision(Precision::Fast);
    Runner::new(Transformer::new(backend, &m.weights).unwrap(), capacity).unwrap()
}

#[test]
fn resident_memory_does_not_grow_over_calls() {
    // SAFETY: sets a malloc tunable before this test's threads allocate; no other test runs in this
    // binary.
    assert_eq!(unsafe { mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) }, 1, "mallopt(M_MMAP_THRESHOLD)");
    let m = util::model(util::SMOLLM2);
    let spec = SpecConfig::new(3, "uniform:2".parse().unwrap(), 1.0, Backup::Jit);
    let req = request(&m, 16);

    let mut target = cpu(&m, CAPACITY);
    let mut worker = DraftWorker::new(Box::new(cpu(&m, CAPACITY + spec.draft_scratch()))).unwrap();
    assert_no_growth("CPU, AR and SSD", || {
        block_on(generate_ar(&mut target, &req, &mut |_| true)).unwrap();
        block_on(generate_ssd(&mut target, &mut worker, &req, &spec, &mut |_| true)).unwrap();
    });

    if !util::gpu_available() {
        return;
    }
    let gpu = block_on(GpuBackend::new(GpuOptions::default())).unwrap();
    let mut target = Runner::new(Transformer::new(gpu, &m.weights).unwrap(), CAPACITY).unwrap();
    // A GPU forward of SmolLM2 takes about a second on lavapipe: two tokens per call (prefill
    // and one decode) cover both kinds of forward and their read-backs.
    let req = request(&m, 2);
    let what = format!("GPU ({}), AR", target.backend_name());
    assert_no_growth(&what, || {
        block_on(generate_ar(&mut target, &req, &mut |_| true)).unwrap();
    });
}
