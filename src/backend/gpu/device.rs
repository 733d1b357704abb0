//! Adapter and device selection, and how device failures become [`Error`]s.

use std::fmt;
use std::sync::{Arc, Mutex};

use futures::FutureExt;

use crate::error::{Error, Result};

use super::GpuOptions;

/// An adapter as `saguaro devices` shows it.
#[derive(Clone, Debug)]
pub struct AdapterReport {
    pub info: wgpu::AdapterInfo,
    pub features: wgpu::Features,
    pub limits: wgpu::Limits,
}

impl fmt::Display for AdapterReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (i, l) = (&self.info, &self.limits);
        writeln!(f, "{} ({:?}, {:?})", i.name, i.backend, i.device_type)?;
        if !i.driver.is_empty() || !i.driver_info.is_empty() {
            writeln!(f, "  driver: {} {}", i.driver, i.driver_info)?;
        }
        writeln!(f, "  max_buffer_size: {} MiB", l.max_buffer_size >> 20)?;
        writeln!(f, "  max_storage_buffer_binding_size: {} MiB", l.max_storage_buffer_binding_size >> 20)?;
        writeln!(f, "  max_storage_buffers_per_shader_stage: {}", l.max_storage_buffers_per_shader_stage)?;
        writeln!(f, "  max_compute_workgroup_storage_size: {} B", l.max_compute_workgroup_storage_size)?;
        writeln!(f, "  max_compute_invocations_per_workgroup: {}", l.max_compute_invocations_per_workgroup)?;
        writeln!(f, "  max_compute_workgroups_per_dimension: {}", l.max_compute_workgroups_per_dimension)?;
        if self.features.contains(wgpu::Features::SUBGROUP) {
            let (min, max) = (i.subgroup_min_size, i.subgroup_max_size);
            let sums = match subgroups_exact(min, max) {
                true => "matmul sums within subgroups",
                false => "the size varies: matmul sums through workgroup memory",
            };
            writeln!(f, "  subgroup size: {min}-{max} ({sums})")?;
        }
        if self.features.contains(wgpu::Features::SHADER_F16) {
            writeln!(f, "  shader-f16: offered (--shader-f16 computes the decode matmul in f16)")?;
        }
        write!(f, "  features: {:?}", self.features)
    }
}

fn instance() -> wgpu::Instance {
    // From the environment so that WGPU_BACKEND (e.g. `gl`) and WGPU_DEBUG apply.
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

/// Every adapter wgpu can see (in a browser, the one WebGPU adapter, if any).
pub async fn list_adapters() -> Vec<AdapterReport> {
    instance()
        .enumerate_adapters(wgpu::Backends::all())
        .await
        .into_iter()
        .map(|a| AdapterReport { info: a.get_info(), features: a.features(), limits: a.limits() })
        .collect()
}

async fn pick_adapter(opts: &GpuOptions) -> Result<wgpu::Adapter> {
    let inst = instance();
    match &opts.adapter {
        Some(want) => {
            let want = want.to_lowercase();
            let all = inst.enumerate_adapters(wgpu::Backends::all()).await;
            let names: Vec<String> = all.iter().map(|a| a.get_info().name).collect();
            all.into_iter()
                .find(|a| a.get_info().name.to_lowercase().contains(&want))
                .ok_or_else(|| Error::Gpu(format!("no GPU adapter matches '{want}' (adapters: {names:?})")))
        }
        None => inst
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::Gpu(format!("no GPU adapter: {e}"))),
    }
}

/// The device with the adapter's own limits (the defaults are far smaller: 128 MiB bindings
/// matter for weights), subgroups where [`subgroups_exact`] allows them (unless `opts` says not
/// to) and `shader-f16` where `opts` asks for it; every kernel also runs on plain WebGPU. (wgpu's
/// browser backend offers no subgroups yet.) Also returns the features the adapter offers, asked
/// for or not.
pub(super) async fn open(opts: &GpuOptions) -> Result<(wgpu::AdapterInfo, wgpu::Features, wgpu::Device, wgpu::Queue)> {
    let adapter = pick_adapter(opts).await?;
    let info = adapter.get_info();
    let mut wanted = match !opts.no_subgroups && subgroups_exact(info.subgroup_min_size, info.subgroup_max_size) {
        true => adapter.features() & wgpu::Features::SUBGROUP,
        false => wgpu::Features::empty(),
    };
    if opts.shader_f16 {
        if !adapter.features().contains(wgpu::Features::SHADER_F16) {
            // Browsers may withhold the adapter's name.
            let adapter = if info.name.is_empty() { "the GPU adapter" } else { &info.name };
            return Err(Error::Gpu(format!("{adapter} does not offer shader-f16: load without f16 arithmetic (shaderF16, --shader-f16)")));
        }
        wanted |= wgpu::Features::SHADER_F16;
    }
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("saguaro"),
            required_features: wanted,
            required_limits: adapter.limits(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        })
        .await
        .map_err(|e| Error::Gpu(format!("cannot open a device on {}: {e}", info.name)))?;
    Ok((info, adapter.features(), device, queue))
}

/// Whether the kernels may add up within subgroups on an adapter whose subgroups hold `min` to
/// `max` lanes: only where that size is fixed. A driver that picks the size per pipeline (Intel's
/// 8 to 32 lanes, AMD's 32 or 64) may give a decode's matmul one size and a verification's
/// another, and sums gathered in trees of different shapes round to different bits, where a
/// verification's rows must get their decodes' bits for greedy speculation to equal greedy
/// decoding. There the kernels reduce through workgroup memory, in one order for any pipeline.
pub(super) fn subgroups_exact(min: u32, max: u32) -> bool {
    min > 0 && min == max
}

/// What went wrong on the device outside any call that could return it: a lost device, or an
/// error wgpu reported asynchronously. Ops fail with it from then on (lost) or at the next
/// read (other errors).
#[derive(Default)]
pub(super) struct Faults {
    lost: Mutex<Option<String>>,
    pending: Mutex<Option<(bool, String)>>,
}

impl Faults {
    pub fn watch(device: &wgpu::Device) -> Arc<Faults> {
        let faults = Arc::new(Faults::default());
        let f = faults.clone();
        device.set_device_lost_callback(move |reason, msg| {
            let why = match reason {
                wgpu::DeviceLostReason::Destroyed => "the device was released",
                _ => "the GPU device was lost (driver reset, GPU removed or out of resources)",
            };
            f.lose(if msg.is_empty() { why.to_owned() } else { format!("{why}: {msg}") });
        });
        let f = faults.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let oom = matches!(e, wgpu::Error::OutOfMemory { .. });
            f.pending.lock().unwrap().get_or_insert((oom, e.to_string()));
        }));
        faults
    }

    /// Marks the device lost (the first reason given stays).
    pub fn lose(&self, why: String) {
        self.lost.lock().unwrap().get_or_insert(why);
    }

    /// Fails once the device is lost.
    pub fn check_lost(&self) -> Result<()> {
        match &*self.lost.lock().unwrap() {
            Some(msg) => Err(Error::DeviceLost(msg.clone())),
            None => Ok(()),
        }
    }

    /// Fails with the device loss, or with the first error reported since the last check.
    pub fn check(&self) -> Result<()> {
        self.check_lost()?;
        match self.pending.lock().unwrap().take() {
            Some((true, msg)) => Err(Error::OutOfMemory(format!("on the GPU: {msg}"))),
            Some((false, msg)) => Err(Error::Gpu(msg)),
            None => Ok(()),
        }
    }
}

/// Runs `f`, turning an error the device reports for it into an [`Error`] that says `what` was
/// being done. Natively wgpu reports errors synchronously; in a browser they arrive later through
/// the uncaptured-error handler (see [`Faults`]) and surface at the next read.
pub(super) fn scoped<T>(device: &wgpu::Device, what: impl FnOnce() -> String, f: impl FnOnce() -> T) -> Result<T> {
    if cfg!(target_arch = "wasm32") {
        return Ok(f());
    }
    let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let invalid = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let out = f();
    let invalid = invalid.pop().now_or_never().flatten();
    let oom = oom.pop().now_or_never().flatten();
    match (oom, invalid) {
        (Some(e), _) => Err(Error::OutOfMemory(format!("{}: {e}", what()))),
        (None, Some(e)) => Err(Error::Gpu(format!("{}: {e}", what()))),
        (None, None) => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use super::subgroups_exact;

    #[test]
    fn subgroups_add_up_only_where_their_size_is_fixed() {
        // NVIDIA, lavapipe, SwiftShader: one size.
        assert!(subgroups_exact(32, 32) && subgroups_exact(8, 8) && subgroups_exact(4, 4));
        // Intel, AMD, and an adapter that reports no size.
        assert!(!subgroups_exact(8, 32) && !subgroups_exact(32, 64) && !subgroups_exact(0, 0));
    }
}
