//! GPU buffers: a pool that recycles activation buffers, uploads, the per-forward cache of batch
//! metadata, and reading results back.
//!
//! Recycling a buffer while commands that use it are still only recorded is safe: WebGPU runs a
//! queue's commands in order, so a later dispatch that overwrites a recycled buffer runs after the
//! earlier ones that read it. What is not safe is `Queue::write_buffer` into such a buffer (it
//! runs before the commands of its submission), so uploads always go to fresh buffers.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

use super::device::scoped;

pub(super) const STORAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

/// Free buffers by size class (a power of two), so that every forward after the first allocates
/// nothing.
pub(super) struct BufferPool {
    free: Mutex<HashMap<u64, Vec<wgpu::Buffer>>>,
}

/// A pool buffer, returned to the pool when dropped.
pub(super) struct Pooled {
    buf: wgpu::Buffer,
    pool: Arc<BufferPool>,
}

impl Pooled {
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.free.lock().unwrap().entry(self.buf.size()).or_default().push(self.buf.clone());
    }
}

fn size_class(bytes: u64) -> u64 {
    bytes.max(256).next_power_of_two()
}

impl BufferPool {
    pub fn new() -> Arc<BufferPool> {
        Arc::new(BufferPool { free: Mutex::new(HashMap::new()) })
    }

    /// A buffer of at least `bytes` bytes, with undefined contents.
    pub fn take(self: &Arc<Self>, device: &wgpu::Device, bytes: u64) -> Result<Pooled> {
        let class = size_class(bytes);
        let reused = self.free.lock().unwrap().get_mut(&class).and_then(|v| v.pop());
        let buf = match reused {
            Some(b) => b,
            None => create(device, class, STORAGE, false, "activation")?,
        };
        Ok(Pooled { buf, pool: self.clone() })
    }

    /// A fresh buffer of `bytes`' size class holding `bytes`, that joins the pool when dropped.
    pub fn upload(self: &Arc<Self>, device: &wgpu::Device, bytes: &[u8]) -> Result<Pooled> {
        let buf = upload(device, bytes, size_class(bytes.len() as u64), STORAGE, "tensor upload")?;
        Ok(Pooled { buf, pool: self.clone() })
    }
}

pub(super) fn create(
    device: &wgpu::Device,
    size: u64,
    usage: wgpu::BufferUsages,
    mapped: bool,
    what: &str,
) -> Result<wgpu::Buffer> {
    let max = device.limits().max_buffer_size;
    if size > max {
        return Err(Error::OutOfMemory(format!(
            "{what} needs a GPU buffer of {size} bytes; the device's largest is {max} bytes"
        )));
    }
    scoped(
        device,
        || format!("allocating {size} bytes of GPU memory for {what}"),
        || device.create_buffer(&wgpu::BufferDescriptor { label: Some(what), size, usage, mapped_at_creation: mapped }),
    )
}

/// A new buffer of `size` bytes holding a weight's `bytes` (zeros after). In a browser through
/// `writeBuffer`, which reads them from wasm memory where they lie: mapping the buffer would copy
/// all of it into wasm memory first, doubling the peak of a model streamed to the GPU. Natively
/// mapped at creation ([`upload`]), which needs no staging buffer.
pub(super) fn upload_weight(device: &wgpu::Device, queue: &wgpu::Queue, bytes: &[u8], size: u64) -> Result<wgpu::Buffer> {
    if cfg!(target_arch = "wasm32") {
        debug_assert!(size >= bytes.len().next_multiple_of(4) as u64);
        let buf = create(device, size, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST, false, "weight")?;
        // Writes are whole words: the last partial one goes padded.
        let whole = bytes.len() / 4 * 4;
        queue.write_buffer(&buf, 0, &bytes[..whole]);
        if whole < bytes.len() {
            let mut tail = [0u8; 4];
            tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            queue.write_buffer(&buf, whole as u64, &tail);
        }
        Ok(buf)
    } else {
        upload(device, bytes, size, wgpu::BufferUsages::STORAGE, "weight")
    }
}

/// A new buffer of `size` bytes starting with `bytes` (zeros after: WebGPU zeroes new buffers),
/// written while mapped at creation: no staging copy, and no ordering against recorded commands.
pub(super) fn upload(
    device: &wgpu::Device,
    bytes: &[u8],
    size: u64,
    usage: wgpu::BufferUsages,
    what: &str,
) -> Result<wgpu::Buffer> {
    debug_assert!(size >= bytes.len() as u64 && size.is_multiple_of(4));
    let buf = create(device, size, usage, true, what)?;
    {
        let mut view = buf.get_mapped_range_mut(..).map_err(|e| Error::Gpu(format!("mapping {what}: {e}")))?;
        view.slice(..bytes.len()).copy_from_slice(bytes);
    }
    buf.unmap();
    Ok(buf)
}

pub(super) fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// What a cached upload holds, so equal keys of different kinds never meet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Meta {
    TokenIds,
    Rope,
    Mask,
    Rows,
    Columns,
}

/// Small host data (token ids, RoPE tables, attention masks) uploaded once and reused while the
/// same values come again: the forward passes the same positions and mask to every layer.
pub(super) struct MetaCache {
    entries: VecDeque<(Meta, Vec<u32>, wgpu::Buffer)>,
}

const META_ENTRIES: usize = 32;

impl MetaCache {
    pub fn new() -> Self {
        MetaCache { entries: VecDeque::new() }
    }

    /// The buffer holding `make(key)`, uploaded on the first request for (`kind`, `key`).
    pub fn get(
        &mut self,
        device: &wgpu::Device,
        kind: Meta,
        key: &[u32],
        make: impl FnOnce(&[u32]) -> Vec<u32>,
    ) -> Result<wgpu::Buffer> {
        if let Some(i) = self.entries.iter().position(|(k, v, _)| *k == kind && v == key) {
            let e = self.entries.remove(i).unwrap();
            let buf = e.2.clone();
            self.entries.push_front(e);
            return Ok(buf);
        }
        let data = u32_bytes(&make(key));
        // A zero-sized binding is invalid; an empty list still gets one word.
        let size = (data.len() as u64).max(4);
        let buf = upload(device, &data, size, wgpu::BufferUsages::STORAGE, "batch metadata")?;
        self.entries.push_front((kind, key.to_vec(), buf.clone()));
        self.entries.truncate(META_ENTRIES);
        Ok(buf)
    }
}
