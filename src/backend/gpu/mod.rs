//! The WebGPU backend: every op a WGSL compute shader run through wgpu, natively (Vulkan, Metal,
//! DX12, GL) and in the browser (WebGPU).
//!
//! - Weights stay in their storage type (f32, f16, bf16, ggml quant blocks) and are decoded inside
//!   the kernels; no kernel needs `shader-f16`, and the decode matmul uses it only where asked
//!   ([`GpuOptions::shader_f16`]).
//! - Ops are recorded, not run: a whole forward goes into one compute pass, submitted when a result
//!   is read back. [`Backend::read`] and [`Backend::argmax`] are the only waits.
//! - The KV cache lives on the GPU, one `[capacity, kv_dim]` buffer per layer for K and for V, in
//!   f16 by default or in f32 ([`KvCache`]).
//! - Batch metadata (token ids, RoPE tables, masks) is uploaded once per forward and shared by all
//!   layers: uploads are cached by content, and every layer passes the same positions and mask.
//!
//! An op is one kernel file and one host file. Its WGSL is shaders/`op`.wgsl (the product's
//! shaders are in one folder), built with shaders/common.wgsl before it: the `Params` binding, the
//! workgroup every entry point takes (`wg: Workgroup`, beside its thread's `tid`) and its indices
//! (`workgroup_index`, `global_index`). Its host file, src/backend/gpu/`op`.rs, declares the
//! op's [`pipelines::Shader`] (with the shared functions it includes and the snippets it takes)
//! and the `GpuBackend` method that checks the arguments and records the dispatch. A new op also
//! adds its method to [`Backend`] (src/backend/mod.rs), and here the `mod` line and the line of
//! `impl Backend` that calls the host file's method; nothing else lists ops.

mod argmax;
mod attention;
mod buffers;
mod device;
mod draw;
mod elementwise;
mod embed;
mod encoder;
mod matmul;
mod norm;
mod pipelines;
mod rope;
mod topk;
mod weights;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use crate::backend::{all_ok, shape_check, Activation, Allowed, AttnShape, Backend, Batch, Draw, Drawn, KvCache, Rope, TopK};
use crate::error::{Error, Result};
use crate::storage::Weight as HostWeight;

use buffers::{BufferPool, MetaCache, Pooled};
use device::Faults;
use encoder::Recorder;
use matmul::Epilogue;
use pipelines::Pipelines;

pub use device::{list_adapters, AdapterReport};
pub use weights::Weight;

/// How to open the GPU.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Use the first adapter whose name contains this (case-insensitive); by default, the one
    /// wgpu prefers for high performance.
    pub adapter: Option<String>,
    /// Cap the bytes of one weight buffer below the device's storage binding limit (weights
    /// larger than that are split by rows); for testing the split on devices with large limits.
    pub max_binding_bytes: Option<u64>,
    /// Reduce through workgroup memory alone even where the adapter has subgroups: the plain
    /// WebGPU path, for comparing and testing it.
    pub no_subgroups: bool,
    /// Cached slots per workgroup when a decode, verification or tree step attends: `None`
    /// splits every 128 slots on a GPU and not at all on an adapter of type CPU
    /// (lavapipe; a browser's fallback adapter), whose few cores a workgroup per KV head fills;
    /// `Some(0)` never splits; `Some(n)` splits every `n` slots (rounded up to 64). Parts grow past
    /// that length where a full cache would take more than 64 of them.
    pub attention_split: Option<usize>,
    /// Threads of a decode, verification or tree step's matmul workgroup (1-64): `None` takes
    /// one subgroup where the adapter computes on the CPU and reports one fixed subgroup size
    /// (lavapipe's 8 lanes), 4 on a CPU adapter that reports none (a browser's fallback
    /// adapter), 64 on a GPU.
    pub matvec_threads: Option<u32>,
    /// How the KV cache stores K and V (f16 by default).
    pub kv_cache: KvCache,
    /// Decode weights and multiply them by the activations in f16 in the matmul of a decode,
    /// verification or tree step (`shader-f16`; the sums stay f32); opening fails on an adapter
    /// without it. Off by default: its logits lie about 5x further from the fp32 reference than
    /// f32's (greedy speculation still gives exactly the target's tokens), it is slower on
    /// lavapipe, and it has not yet been timed on a GPU.
    pub shader_f16: bool,
}

/// A row-major `[rows, cols]` f32 matrix on the GPU.
pub struct Tensor {
    buf: Pooled,
    rows: usize,
    cols: usize,
}

impl Tensor {
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    fn bytes(&self) -> u64 {
        (self.rows * self.cols * 4).max(4) as u64
    }
    fn bind(&self, binding: u32) -> encoder::Bind<'_> {
        (binding, self.buf.buffer(), self.bytes())
    }
}

/// K and V of every layer, `[capacity, kv_dim]` f32 each.
pub struct Cache {
    k: Vec<wgpu::Buffer>,
    v: Vec<wgpu::Buffer>,
    capacity: usize,
    kv_dim: usize,
    /// How its values are stored (the backend's option when it was made).
    kind: KvCache,
}

pub struct GpuBackend {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    /// The most bytes one storage binding may cover.
    max_binding: u64,
    /// The most bytes of one weight part (`max_binding` unless capped by the options).
    max_weight_part: u64,
    faults: Arc<Faults>,
    pipelines: Pipelines,
    pool: Arc<BufferPool>,
    rec: Mutex<Recorder>,
    meta: Mutex<MetaCache>,
    weights: Mutex<weights::WeightCache>,
    /// Slots per attention part for small batches (0: unsplit); see [`GpuOptions::attention_split`].
    attention_split: usize,
    /// Threads per `matmul_rows` workgroup; see [`GpuOptions::matvec_threads`].
    matvec_threads: u32,
    kv_cache: KvCache,
    /// The decode matmul's arithmetic type, f32 or f16; see [`GpuOptions::shader_f16`].
    arithmetic: &'static str,
    /// Whether the adapter offers `shader-f16`, used or not.
    f16_offered: bool,
}

impl GpuBackend {
    pub async fn new(opts: GpuOptions) -> Result<GpuBackend> {
        let (info, offered, device, queue) = device::open(&opts).await?;
        let cpu_adapter = info.device_type == wgpu::DeviceType::Cpu;
        let attention_split = attention::split_slots(opts.attention_split, cpu_adapter);
        let fixed_subgroup = (info.subgroup_min_size == info.subgroup_max_size).then_some(info.subgroup_min_size);
        let matvec_threads = matmul::matvec_threads(opts.matvec_threads, cpu_adapter, fixed_subgroup)?;
        let limits = device.limits();
        let max_binding = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        Ok(GpuBackend {
            faults: Faults::watch(&device),
            device,
            queue,
            info,
            limits,
            max_binding,
            max_weight_part: max_binding.min(opts.max_binding_bytes.unwrap_or(u64::MAX)),
            pipelines: Pipelines::default(),
            pool: BufferPool::new(),
            rec: Mutex::new(Recorder::default()),
            meta: Mutex::new(MetaCache::new()),
            weights: Mutex::new(HashMap::new()),
            attention_split,
            matvec_threads,
            kv_cache: opts.kv_cache,
            arithmetic: if opts.shader_f16 { "f16" } else { "f32" },
            f16_offered: offered.contains(wgpu::Features::SHADER_F16),
        })
    }

    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// Whether the kernels reduce within subgroups (the device has them and they were not
    /// declined), rather than through workgroup memory alone.
    pub fn subgroups(&self) -> bool {
        self.device.features().contains(wgpu::Features::SUBGROUP)
    }

    /// Whether the decode matmul decodes and multiplies in f16 ([`GpuOptions::shader_f16`]).
    pub fn shader_f16(&self) -> bool {
        self.arithmetic == "f16"
    }

    /// Whether the adapter offers `shader-f16`, so that a backend opened on it with
    /// [`GpuOptions::shader_f16`] would open.
    pub fn f16_offered(&self) -> bool {
        self.f16_offered
    }

    /// The name of every kernel built so far, with the values its placeholders were given.
    pub fn kernels_built(&self) -> Vec<String> {
        self.pipelines.names()
    }

    /// Kernel dispatches recorded since the backend opened: a forward's count is what the
    /// GPU pays per-dispatch overhead on, which fused passes lower.
    pub fn dispatches_recorded(&self) -> u64 {
        self.rec.lock().unwrap().recorded
    }

    /// Bytes read back to the host since the backend opened: what leaves the GPU per token or
    /// per speculation round.
    pub fn bytes_read_back(&self) -> u64 {
        self.rec.lock().unwrap().read_back
    }

    /// Frees the device and its memory now rather than at drop: every later call fails with
    /// [`Error::DeviceLost`], exactly as after a real loss (a driver reset, a GPU removed), so this
    /// is also how that path is tested. Open a new backend to go on.
    pub fn release(&self) {
        // wgpu reports the loss from a later poll; ops between now and then must already fail.
        self.faults.lose("the device was released".into());
        self.device.destroy();
    }

    /// A tensor with undefined contents, for an op to fill.
    fn tensor(&self, rows: usize, cols: usize) -> Result<Tensor> {
        Ok(Tensor { buf: self.pool.take(&self.device, (rows * cols * 4) as u64)?, rows, cols })
    }

    fn kernel(&self, shader: &pipelines::Shader, entry: &str, vars: &[(&str, &str)]) -> Result<pipelines::Kernel> {
        // Every op starts here: on a lost device it fails with the loss, not a validation error.
        self.faults.check_lost()?;
        self.pipelines.get(&self.device, shader, entry, vars)
    }

    fn meta(&self, kind: buffers::Meta, key: &[u32], make: impl FnOnce(&[u32]) -> Vec<u32>) -> Result<wgpu::Buffer> {
        self.meta.lock().unwrap().get(&self.device, kind, key, make)
    }
}

/// Workgroups of `size` threads to cover `n` items.
fn groups(n: usize, size: usize) -> Result<u32> {
    u32::try_from(n.div_ceil(size)).map_err(|_| Error::InvalidArgument(format!("{n} items exceed one GPU dispatch")))
}

impl Backend for GpuBackend {
    type Weight = Weight;
    type Tensor = Tensor;
    type Cache = Cache;

    fn name(&self) -> String {
        // Browsers may withhold the adapter's name.
        let sums = match (self.subgroups(), self.shader_f16()) {
            (false, false) => "",
            (true, false) => ", subgroups",
            (false, true) => ", f16",
            (true, true) => ", subgroups, f16",
        };
        match self.info.name.as_str() {
            "" => format!("gpu ({:?}{sums})", self.info.backend),
            name => format!("gpu ({name}, {:?}{sums})", self.info.backend),
        }
    }

    fn load_weight(&self, w: &HostWeight) -> Result<Weight> {
        self.upload_weight(w)
    }

    fn load_together(&self, ws: &[&HostWeight]) -> Result<Vec<Weight>> {
        self.upload_together(ws)
    }

    fn new_cache(&self, n_layers: usize, capacity: usize, kv_dim: usize) -> Result<Cache> {
        let kind = self.kv_cache;
        let bytes = (capacity.max(1) * kind.stride(kv_dim) * kind.bytes()) as u64;
        if bytes > self.max_binding {
            return Err(Error::OutOfMemory(format!(
                "a KV cache of {capacity} slots x {kv_dim} values needs {bytes} bytes per layer; the device binds at most {}",
                self.max_binding
            )));
        }
        let layer = || buffers::create(&self.device, bytes, buffers::STORAGE, false, "KV cache");
        Ok(Cache {
            k: (0..n_layers).map(|_| layer()).collect::<Result<_>>()?,
            v: (0..n_layers).map(|_| layer()).collect::<Result<_>>()?,
            capacity,
            kv_dim,
            kind,
        })
    }

    fn upload(&self, rows: usize, cols: usize, data: &[f32]) -> Result<Tensor> {
        if data.len() != rows * cols {
            return Err(Error::InvalidArgument(format!("{} values for a {rows}x{cols} tensor", data.len())));
        }
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        Ok(Tensor { buf: self.pool.upload(&self.device, &bytes)?, rows, cols })
    }

    fn embed(&self, table: &Weight, ids: &[u32], scale: f32) -> Result<Tensor> {
        self.embed_rows(table, ids, scale)
    }

    fn rms_norm(&self, x: &Tensor, w: &Weight, eps: f32) -> Result<Tensor> {
        self.rms_norm_rows(x, w, eps)
    }

    fn matmul(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>) -> Result<Tensor> {
        self.matmul_weight(x, w, bias)
    }

    /// Weights loaded together ([`Backend::load_together`]) in one dispatch; where only the first
    /// two of three were (a Q and K whose V is stored in another type), those two in one.
    fn matmuls<const N: usize>(&self, x: &Tensor, ws: [(&Weight, Option<&Weight>); N]) -> Result<[Tensor; N]> {
        if let Some(outs) = self.matmul_together(x, ws)? {
            return Ok(outs);
        }
        if let [q, k, v] = ws[..] {
            if let Some([q, k]) = self.matmul_together(x, [q, k])? {
                let v = self.matmul(x, v.0, v.1)?;
                if let Ok(outs) = <[Tensor; N]>::try_from(vec![q, k, v]) {
                    return Ok(outs);
                }
            }
        }
        all_ok(ws.map(|(w, bias)| self.matmul(x, w, bias)))
    }

    fn matmul_add(&self, x: &Tensor, w: &Weight, into: &mut Tensor) -> Result<()> {
        self.matmul_into(x, w, None, into, Epilogue::Add)
    }

    /// One pass where the gate and up projections were loaded together ([`Backend::load_together`])
    /// and the batch is small; else the gate's pass, then the up projection's, which gates.
    fn gated_matmul(&self, x: &Tensor, gate: &Weight, up: &Weight, act: Activation) -> Result<Tensor> {
        if let Some(out) = self.gated_together(x, gate, up, act)? {
            return Ok(out);
        }
        let g = self.matmul_weight(x, gate, None)?;
        let out = self.tensor(x.rows, up.rows())?;
        self.matmul_into(x, up, None, &out, Epilogue::Gate(&g, act))?;
        Ok(out)
    }

    fn rope(&self, x: &mut Tensor, positions: &[u32], rope: &Rope) -> Result<()> {
        self.rope_rows(x, None, positions, rope)
    }

    fn rope_pair(&self, q: &mut Tensor, k: &mut Tensor, positions: &[u32], rope: &Rope) -> Result<()> {
        self.rope_rows(q, Some(k), positions, rope)
    }

    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        cache: &mut Cache,
        layer: usize,
        batch: &Batch,
        shape: AttnShape,
    ) -> Result<Tensor> {
        self.attend(q, k, v, cache, layer, batch, shape)
    }

    fn glu(&self, gate: &Tensor, up: &Tensor, act: Activation) -> Result<Tensor> {
        self.glu_rows(gate, up, act)
    }

    fn add_assign(&self, x: &mut Tensor, y: &Tensor) -> Result<()> {
        self.add_rows(x, y)
    }

    fn select_rows(&self, x: &Tensor, rows: &[u32]) -> Result<Tensor> {
        self.gather_rows(x, rows)
    }

    fn mask(&self, x: &mut Tensor, allowed: &Allowed) -> Result<()> {
        self.mask_rows(x, allowed)
    }

    fn read(&self, x: &Tensor) -> impl Future<Output = Result<Vec<f32>>> {
        let n = x.rows * x.cols;
        let bytes = self.download(x.buf.buffer(), x.bytes());
        async move {
            let b = bytes.await?;
            Ok(b.chunks_exact(4).take(n).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
        }
    }

    fn argmax(&self, x: &Tensor) -> impl Future<Output = Result<Vec<u32>>> {
        self.argmax_rows(x)
    }

    fn top_k(&self, x: &Tensor, k: usize, temperature: f32, at: &[u32]) -> impl Future<Output = Result<TopK>> {
        self.top_k_rows(x, k, temperature, at)
    }

    fn draw(&self, x: &Tensor, draw: &Draw) -> impl Future<Output = Result<Vec<Drawn>>> {
        self.draw_rows(x, draw)
    }

    fn sync(&self) -> impl Future<Output = Result<()>> {
        self.finish()
    }
}
