//! Recording dispatches. Ops only record into one open compute pass; the work is submitted when a
//! result is read back (or every few hundred dispatches, so a long prefill starts early), so a
//! forward makes no host round trip between layers.
//!
//! Kernel parameters go into slots (at the device's uniform offset alignment, 256 bytes on most)
//! of per-submission uniform buffers, written with `Queue::write_buffer` just before the
//! submission that uses them.

use std::future::Future;

use futures::channel::oneshot;

use crate::error::{Error, Result};

use super::buffers::create;
use super::pipelines::Kernel;
use super::GpuBackend;

/// Bytes bound per parameter slot: every kernel's `Params` fits.
const PARAM_BYTES: u64 = 64;
const SLOTS_PER_CHUNK: u64 = 256;
/// Dispatches after which the open encoder is submitted without waiting.
const DISPATCHES_PER_SUBMIT: usize = 512;

#[derive(Default)]
pub(super) struct Recorder {
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    params: Vec<(wgpu::Buffer, Vec<u8>)>,
    /// Dispatches in the open encoder.
    dispatches: usize,
    /// Dispatches since the backend opened.
    pub recorded: u64,
    /// Bytes copied back to the host since the backend opened.
    pub read_back: u64,
}

/// A storage buffer bound at `binding`, its first `size` bytes.
pub(super) type Bind<'a> = (u32, &'a wgpu::Buffer, u64);

/// Params as 32-bit words; an f32 parameter goes in as its bits.
pub(super) fn f(x: f32) -> u32 {
    x.to_bits()
}

impl GpuBackend {
    /// Workgroup grid for `n` workgroups: kernels read their linear index as x + y * width, so
    /// counts beyond the per-dimension limit fold into y.
    fn grid(&self, n: u32) -> (u32, u32) {
        let max = self.limits.max_compute_workgroups_per_dimension;
        if n <= max {
            (n, 1)
        } else {
            let y = n.div_ceil(max);
            (n.div_ceil(y), y)
        }
    }

    /// Record `kernel` over `workgroups` workgroups with `params` at binding 0.
    pub(super) fn dispatch(&self, kernel: &Kernel, params: &[u32], binds: &[Bind], workgroups: u32) -> Result<()> {
        self.faults.check_lost()?;
        if workgroups == 0 {
            return Ok(());
        }
        for &(_, buf, size) in binds {
            debug_assert!(size <= buf.size() && size.is_multiple_of(4) && size > 0);
            if size > self.max_binding {
                return Err(Error::OutOfMemory(format!(
                    "{}: a {size}-byte tensor exceeds the device's largest storage binding of {} bytes",
                    kernel.name, self.max_binding
                )));
            }
        }
        let mut rec = self.rec.lock().unwrap();
        let (pbuf, offset) = self.param_slot(&mut rec, params)?;
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &pbuf,
                offset,
                size: wgpu::BufferSize::new(PARAM_BYTES),
            }),
        }];
        entries.extend(binds.iter().map(|&(binding, buffer, size)| wgpu::BindGroupEntry {
            binding,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset: 0,
                size: wgpu::BufferSize::new(size),
            }),
        }));
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&kernel.name),
            layout: &kernel.layout,
            entries: &entries,
        });
        if rec.pass.is_none() {
            let encoder = rec.encoder.get_or_insert_with(|| self.device.create_command_encoder(&Default::default()));
            let pass = encoder.begin_compute_pass(&Default::default()).forget_lifetime();
            rec.pass = Some(pass);
        }
        let (x, y) = self.grid(workgroups);
        let pass = rec.pass.as_mut().unwrap();
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(x, y, 1);
        rec.dispatches += 1;
        rec.recorded += 1;
        if rec.dispatches >= DISPATCHES_PER_SUBMIT {
            self.submit(&mut rec, |_| ());
        }
        Ok(())
    }

    fn param_slot(&self, rec: &mut Recorder, params: &[u32]) -> Result<(wgpu::Buffer, u64)> {
        let stride = (self.limits.min_uniform_buffer_offset_alignment as u64).max(PARAM_BYTES);
        debug_assert!(params.len() * 4 <= PARAM_BYTES as usize);
        let full = rec.params.last().is_none_or(|(_, data)| data.len() as u64 >= stride * SLOTS_PER_CHUNK);
        if full {
            let buf = create(
                &self.device,
                stride * SLOTS_PER_CHUNK,
                wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                false,
                "kernel parameters",
            )?;
            rec.params.push((buf, Vec::new()));
        }
        let (buf, data) = rec.params.last_mut().unwrap();
        let offset = data.len() as u64;
        data.extend(params.iter().flat_map(|p| p.to_le_bytes()));
        data.resize((offset + stride) as usize, 0);
        Ok((buf.clone(), offset))
    }

    /// Submit everything recorded, after `tail` adds its commands to the encoder.
    fn submit(&self, rec: &mut Recorder, tail: impl FnOnce(&mut wgpu::CommandEncoder)) {
        rec.pass = None;
        let mut encoder = rec.encoder.take().unwrap_or_else(|| self.device.create_command_encoder(&Default::default()));
        tail(&mut encoder);
        for (buf, data) in rec.params.drain(..) {
            self.queue.write_buffer(&buf, 0, &data);
        }
        self.queue.submit([encoder.finish()]);
        rec.dispatches = 0;
    }

    /// Submit the recorded work followed by a copy of `src`'s first `bytes` bytes, and resolve to
    /// those bytes once the GPU has produced them.
    pub(super) fn download(&self, src: &wgpu::Buffer, bytes: u64) -> impl Future<Output = Result<Vec<u8>>> {
        let started = self.start_download(src, bytes);
        let (device, faults) = (self.device.clone(), self.faults.clone());
        async move {
            let (staging, done) = started?;
            wait(&device)?;
            let mapped = done.await.map_err(|_| Error::DeviceLost("the GPU dropped a read-back".into()))?;
            faults.check()?;
            mapped.map_err(|e| Error::Gpu(format!("reading back from the GPU: {e}")))?;
            let out = staging.get_mapped_range(..).map_err(|e| Error::Gpu(format!("reading back from the GPU: {e}")))?.to_vec();
            staging.unmap();
            Ok(out)
        }
    }

    #[allow(clippy::type_complexity)]
    fn start_download(
        &self,
        src: &wgpu::Buffer,
        bytes: u64,
    ) -> Result<(wgpu::Buffer, oneshot::Receiver<Result<(), wgpu::BufferAsyncError>>)> {
        self.faults.check_lost()?;
        let staging = create(
            &self.device,
            bytes,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            false,
            "read-back",
        )?;
        let mut rec = self.rec.lock().unwrap();
        rec.read_back += bytes;
        self.submit(&mut rec, |e| e.copy_buffer_to_buffer(src, 0, &staging, 0, bytes));
        drop(rec);
        let (tx, rx) = oneshot::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        Ok((staging, rx))
    }

    /// Submit everything recorded and resolve once the GPU has finished it.
    pub async fn finish(&self) -> Result<()> {
        self.faults.check_lost()?;
        let (tx, rx) = oneshot::channel();
        self.submit(&mut self.rec.lock().unwrap(), |_| ());
        self.queue.on_submitted_work_done(move || {
            let _ = tx.send(());
        });
        wait(&self.device)?;
        rx.await.map_err(|_| Error::DeviceLost("the GPU dropped a submission".into()))?;
        self.faults.check()
    }
}

/// Natively, drive the device until the queue is idle, which runs the callbacks of map_async and
/// on_submitted_work_done. In a browser the event loop does that: blocking would hang the page.
fn wait(device: &wgpu::Device) -> Result<()> {
    #[cfg(not(target_arch = "wasm32"))]
    device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| Error::Gpu(format!("waiting for the GPU: {e}")))?;
    #[cfg(target_arch = "wasm32")]
    let _ = device;
    Ok(())
}
