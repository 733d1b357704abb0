//! The GPU backends the GPU tests run on, and the one rule by which any of them skips.
//!
//! A GPU test skips only where the machine lacks what it needs: no adapter at all, or an adapter
//! without the feature the test is about (`shader-f16`, subgroups). Each skipped test says so on
//! stderr, written past the test harness's capture so that the note shows for passing tests too.
//! With `SAGUARO_REQUIRE_GPU=1` (set in CI, where lavapipe offers an adapter with both features)
//! every skip is a failure instead, so a broken driver install or a lost feature cannot pass the
//! GPU tests having run nothing.
//!
//! The `open*` functions say what is missing as their error; [`skipped`] turns that into a skip.

use std::sync::OnceLock;

use saguaro::backend::gpu::{GpuBackend, GpuOptions};

/// What a GPU test needs and the machine lacks.
pub type Missing = String;

/// Whether `SAGUARO_REQUIRE_GPU=1`: no GPU test may skip.
pub fn gpu_required() -> bool {
    std::env::var("SAGUARO_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// `Some` of what opened; where something is missing, a failure under `SAGUARO_REQUIRE_GPU=1`,
/// otherwise a note on stderr and `None` (the caller then runs nothing on it).
pub fn skipped<T>(opened: Result<T, Missing>) -> Option<T> {
    let missing = match opened {
        Ok(t) => return Some(t),
        Err(missing) => missing,
    };
    assert!(!gpu_required(), "SAGUARO_REQUIRE_GPU=1, but {missing}");
    use std::io::Write;
    // Straight to stderr: the harness captures eprintln! of passing tests and would hide the note.
    let _ = writeln!(std::io::stderr(), "skipped: {missing} (SAGUARO_REQUIRE_GPU=1 makes this a failure)");
    None
}

/// [`skipped`] of what `open` gave, opened once per test binary: every test that asks is told
/// (each skipped test says so), and the backend is shared.
pub fn cached<T>(cell: &'static OnceLock<Result<T, Missing>>, open: impl FnOnce() -> Result<T, Missing>) -> Option<&'static T> {
    skipped(cell.get_or_init(open).as_ref().map_err(Clone::clone))
}

fn adapter() -> Result<(), Missing> {
    static ANY: OnceLock<bool> = OnceLock::new();
    let any = *ANY.get_or_init(|| !futures::executor::block_on(saguaro::backend::gpu::list_adapters()).is_empty());
    any.then_some(()).ok_or_else(|| "wgpu finds no GPU adapter on this machine".into())
}

/// Whether a GPU test may run: wgpu finds an adapter (else [`skipped`]).
pub fn gpu_available() -> bool {
    skipped(adapter()).is_some()
}

/// A GPU backend opened with `opts`.
pub fn open(opts: GpuOptions) -> Result<GpuBackend, Missing> {
    adapter()?;
    Ok(futures::executor::block_on(GpuBackend::new(opts)).expect("opening the GPU"))
}

/// A GPU backend whose decode matmul computes in f16 (`GpuOptions::shader_f16`), where the
/// adapter offers `shader-f16` (lavapipe does).
pub fn open_f16() -> Result<GpuBackend, Missing> {
    let plain = open(GpuOptions::default())?;
    if !plain.f16_offered() {
        return Err(format!("{} offers no shader-f16, so f16 arithmetic was not tested", plain.adapter_info().name));
    }
    drop(plain);
    open(GpuOptions { shader_f16: true, ..Default::default() })
}

/// A GPU backend that reduces through workgroup memory alone (`GpuOptions::no_subgroups`, plain
/// WebGPU's path), where the shared one reduces within subgroups (where it does not, it is
/// itself the plain path, and the subgroup path is what goes untested).
pub fn open_plain() -> Result<GpuBackend, Missing> {
    let shared = shared()?;
    if !shared.subgroups() {
        let name = &shared.adapter_info().name;
        return Err(format!("{name} has no subgroups at one fixed size, so the subgroup path was not tested"));
    }
    open(GpuOptions { no_subgroups: true, ..Default::default() })
}

fn shared() -> Result<&'static GpuBackend, Missing> {
    static GPU: OnceLock<Result<GpuBackend, Missing>> = OnceLock::new();
    GPU.get_or_init(|| open(GpuOptions::default())).as_ref().map_err(Clone::clone)
}

/// [`open`] with `opts`, or None having [`skipped`].
pub fn open_gpu(opts: GpuOptions) -> Option<GpuBackend> {
    skipped(open(opts))
}

/// [`open_f16`], or None having [`skipped`].
pub fn open_gpu_f16() -> Option<GpuBackend> {
    skipped(open_f16())
}

/// One default GPU backend for the whole test binary, shared by its tests (from several
/// threads), or None having [`skipped`].
pub fn shared_gpu() -> Option<&'static GpuBackend> {
    skipped(shared())
}
