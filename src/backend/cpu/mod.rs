//! The CPU backend: the reference every other backend is tested against, and the fallback where
//! there is no GPU (natively multi-threaded; single-threaded wasm in the browser).

mod attention;
mod kernels;
mod matmul;
pub(crate) mod pool;
mod quantize;

use std::future::{ready, Future};

use crate::backend::draw::{self, Draw, Drawn};
use crate::backend::{
    Allowed,
    all_ok, check_attention, check_top_k, rope_table, shape_check, Activation, AttnShape, Backend, Batch, CacheDims, Rope,
    TopK,
};
use crate::error::{Error, Result};
use crate::storage::Weight;
use pool::{Pool, SharedMut};

pub use matmul::{matmul, matmul_with, matmuls_with, KernelSet, Precision};
pub use pool::Pool as CpuPool;

/// A row-major `[rows, cols]` f32 matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), rows * cols, "tensor data does not match its shape");
        Tensor { rows, cols, data }
    }
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// K and V of every layer, `[slot, kv_dim]` each, grown on demand up to `capacity` slots.
pub struct Cache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    kv_dim: usize,
    capacity: usize,
}

/// `n` zeros, allocated zeroed (so the OS maps their pages only as they are written); `None`
/// where the allocator has no room for them.
fn zeroed(n: usize) -> Option<Vec<f32>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<f32>(n).ok()?;
    // SAFETY: the layout is non-zero in size; a non-null pointer from `alloc_zeroed` with it holds
    // `n` f32s whose all-zero bits are 0.0, owned by the Vec with that capacity from here on.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<f32>();
        (!p.is_null()).then(|| Vec::from_raw_parts(p, n, n))
    }
}

pub struct CpuBackend {
    pool: Pool,
    precision: Precision,
    kernels: KernelSet,
}

impl CpuBackend {
    /// A backend computing on `threads` threads (0 = all available cores), at [`Precision::Exact`],
    /// on the [`KernelSet::best`] kernels.
    pub fn new(threads: usize) -> Result<Self> {
        Ok(CpuBackend { pool: Pool::new(threads)?, precision: Precision::Exact, kernels: KernelSet::best() })
    }
    /// The same backend on the kernel set `kernels`, if this machine runs it.
    pub fn with_kernels(self, kernels: KernelSet) -> Result<Self> {
        if !kernels.supported() {
            return Err(Error::InvalidArgument(format!("this CPU cannot run the {} kernels", kernels.name())));
        }
        Ok(CpuBackend { kernels, ..self })
    }
    /// The same backend with activations quantized at `precision` (see [`Precision`]).
    pub fn with_precision(self, precision: Precision) -> Self {
        CpuBackend { precision, ..self }
    }
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }
}

/// `x` with zeros appended to each row up to `cols` values.
fn pad_cols(x: &Tensor, cols: usize) -> Tensor {
    let mut data = vec![0.0; x.rows * cols];
    for (to, from) in data.chunks_exact_mut(cols).zip(x.data.chunks_exact(x.cols)) {
        to[..x.cols].copy_from_slice(from);
    }
    Tensor::new(x.rows, cols, data)
}

impl Backend for CpuBackend {
    type Weight = Weight;
    type Tensor = Tensor;
    type Cache = Cache;

    fn name(&self) -> String {
        match self.precision {
            Precision::Exact => format!("cpu ({} threads, {})", self.threads(), self.kernels.name()),
            Precision::Fast => format!("cpu ({} threads, {}, fast 8-bit activations)", self.threads(), self.kernels.name()),
        }
    }

    fn host_memory(&self) -> bool {
        true
    }

    fn load_weight(&self, w: &Weight) -> Result<Weight> {
        Ok(w.clone())
    }

    fn new_cache(&self, n_layers: usize, capacity: usize, kv_dim: usize) -> Result<Cache> {
        // Natively the whole cache is allocated zeroed at once: the OS maps its pages as they are
        // first written, so unused slots cost nothing, and a sequence in a far region of a shared
        // cache never makes it grow mid-generation (which zeroed every region below and copied the
        // cache: seconds at the first use of a pool's last regions). In wasm memory, which never
        // shrinks and counts toward its 4 GiB, the cache grows with the slots written.
        let slots = if cfg!(target_arch = "wasm32") { 0 } else { capacity };
        let layer = || {
            zeroed(slots.saturating_mul(kv_dim)).ok_or_else(|| {
                Error::OutOfMemory(format!("a KV cache of {capacity} slots x {kv_dim} values per layer does not fit in memory"))
            })
        };
        Ok(Cache {
            k: (0..n_layers).map(|_| layer()).collect::<Result<_>>()?,
            v: (0..n_layers).map(|_| layer()).collect::<Result<_>>()?,
            kv_dim,
            capacity,
        })
    }

    fn upload(&self, rows: usize, cols: usize, data: &[f32]) -> Result<Tensor> {
        shape_check(data.len() == rows * cols, "upload")?;
        Ok(Tensor::new(rows, cols, data.to_vec()))
    }

    fn embed(&self, table: &Weight, ids: &[u32], scale: f32) -> Result<Tensor> {
        let d = table.cols;
        let mut out = vec![0.0; ids.len() * d];
        for (i, &id) in ids.iter().enumerate() {
            if id as usize >= table.rows {
                return Err(Error::InvalidArgument(format!(
                    "token id {id} is outside the vocabulary of {} tokens",
                    table.rows
                )));
            }
            let row = &mut out[i * d..(i + 1) * d];
            table.dequantize_row(id as usize, row);
            if scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(Tensor::new(ids.len(), d, out))
    }

    fn rms_norm(&self, x: &Tensor, w: &Weight, eps: f32) -> Result<Tensor> {
        let n = w.rows * w.cols;
        shape_check(n > 0 && x.cols.is_multiple_of(n), "rms_norm")?;
        let w = w.to_f32();
        let mut out = x.clone();
        for row in out.data.chunks_exact_mut(n) {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
            let s = 1.0 / (ms + eps).sqrt();
            row.iter_mut().zip(&w).for_each(|(v, g)| *v *= s * g);
        }
        Ok(out)
    }

    fn matmul(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>) -> Result<Tensor> {
        // A draft requantized for the CPU may have rows padded with zeros to whole blocks
        // (`Slimming::pad_rows`): its input gets zeros alike.
        let padded;
        let x = match w.cols > x.cols && w.cols - x.cols < w.dtype.block_size() {
            true => {
                padded = pad_cols(x, w.cols);
                &padded
            }
            false => x,
        };
        shape_check(w.cols == x.cols, "matmul")?;
        let mut out = vec![0.0; x.rows * w.rows];
        matmul_with(&self.pool, self.kernels, self.precision, &x.data, x.rows, w, &mut out);
        if let Some(b) = bias {
            let b = b.to_f32();
            shape_check(b.len() == w.rows, "matmul bias")?;
            out.chunks_exact_mut(w.rows).for_each(|r| r.iter_mut().zip(&b).for_each(|(y, b)| *y += b));
        }
        Ok(Tensor::new(x.rows, w.rows, out))
    }

    fn matmuls<const N: usize>(&self, x: &Tensor, ws: [(&Weight, Option<&Weight>); N]) -> Result<[Tensor; N]> {
        // Weights padded wider than their input (a slimmed draft's) pad it one by one.
        if ws.iter().any(|(w, _)| w.cols != x.cols) {
            return all_ok(ws.map(|(w, bias)| self.matmul(x, w, bias)));
        }
        let biases = ws.map(|(_, bias)| bias.map(|b| b.to_f32()));
        let fits = biases.iter().zip(&ws).all(|(b, (w, _))| b.as_ref().is_none_or(|b| b.len() == w.rows));
        shape_check(fits, "matmul bias")?;
        let mut outs = ws.map(|(w, _)| vec![0.0; x.rows * w.rows]);
        let weights = ws.map(|(w, _)| w);
        let mut views = outs.each_mut().map(|o| o.as_mut_slice());
        matmuls_with(&self.pool, self.kernels, self.precision, &x.data, x.rows, &weights, &mut views);
        for (out, bias) in outs.iter_mut().zip(&biases) {
            if let Some(b) = bias {
                out.chunks_exact_mut(b.len()).for_each(|r| r.iter_mut().zip(b).for_each(|(y, b)| *y += b));
            }
        }
        let mut cols = weights.iter().map(|w| w.rows);
        Ok(outs.map(|o| Tensor::new(x.rows, cols.next().expect("one per output"), o)))
    }

    fn rope(&self, x: &mut Tensor, positions: &[u32], rope: &Rope) -> Result<()> {
        shape_check(positions.len() == x.rows && rope.valid() && x.cols.is_multiple_of(rope.head_dim), "rope")?;
        let half = rope.rotary_dim / 2;
        let table = rope_table(positions, rope);
        for (row, cs) in x.data.chunks_exact_mut(x.cols).zip(table.chunks_exact(half)) {
            for head in row.chunks_exact_mut(rope.head_dim) {
                for (i, &(cos, sin)) in cs.iter().enumerate() {
                    let (a, b) = (head[i], head[i + half]);
                    head[i] = a * cos - b * sin;
                    head[i + half] = b * cos + a * sin;
                }
            }
        }
        Ok(())
    }

    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        cache: &mut Cache,
        layer: usize,
        batch: &Batch,
        s: AttnShape,
    ) -> Result<Tensor> {
        let kv_dim = cache.kv_dim;
        let dims = CacheDims { layers: cache.k.len(), capacity: cache.capacity, kv_dim };
        check_attention([(q.rows, q.cols), (k.rows, k.cols), (v.rows, v.cols)], dims, layer, batch, &s)?;
        let extent = batch.slot_extent();
        let (kc, vc) = (&mut cache.k[layer], &mut cache.v[layer]);
        if kc.len() < extent * kv_dim {
            kc.resize(extent * kv_dim, 0.0);
            vc.resize(extent * kv_dim, 0.0);
        }
        for (r, &slot) in batch.slots.iter().enumerate() {
            let at = slot as usize * kv_dim;
            kc[at..at + kv_dim].copy_from_slice(k.row(r));
            vc[at..at + kv_dim].copy_from_slice(v.row(r));
        }
        Ok(attention::attend(&self.pool, q, kc, vc, kv_dim, batch, s))
    }

    fn glu(&self, gate: &Tensor, up: &Tensor, act: Activation) -> Result<Tensor> {
        shape_check(gate.data.len() == up.data.len(), "glu")?;
        let coefficients = act.sigmoid_coefficients();
        // Chunks of whole 8-lane vectors, enough for the threads to share.
        const CHUNK: usize = 4096;
        let n = gate.data.len();
        let mut out = vec![0.0; n];
        let out_ptr = SharedMut(out.as_mut_ptr());
        self.pool.for_each(n.div_ceil(CHUNK), |c| {
            let out_ptr = out_ptr;
            let span = c * CHUNK..((c + 1) * CHUNK).min(n);
            // SAFETY: chunk c alone writes out[span], which lies within out's n elements.
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(span.start), span.len()) };
            matmul::gated_mul(&gate.data[span.clone()], &up.data[span], o, coefficients);
        });
        Ok(Tensor::new(gate.rows, gate.cols, out))
    }

    fn add_assign(&self, x: &mut Tensor, y: &Tensor) -> Result<()> {
        shape_check(x.data.len() == y.data.len(), "add")?;
        x.data.iter_mut().zip(&y.data).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn select_rows(&self, x: &Tensor, rows: &[u32]) -> Result<Tensor> {
        shape_check(rows.iter().all(|&r| (r as usize) < x.rows), "select_rows")?;
        let data = rows.iter().flat_map(|&r| x.row(r as usize).iter().copied()).collect();
        Ok(Tensor::new(rows.len(), x.cols, data))
    }

    fn mask(&self, x: &mut Tensor, allowed: &Allowed) -> Result<()> {
        shape_check(allowed.rows() == x.rows && allowed.cols() == x.cols, "mask")?;
        allowed.apply(&mut x.data);
        Ok(())
    }

    fn read(&self, x: &Tensor) -> impl Future<Output = Result<Vec<f32>>> {
        ready(Ok(x.data.clone()))
    }

    fn argmax(&self, x: &Tensor) -> impl Future<Output = Result<Vec<u32>>> {
        ready(Ok((0..x.rows).map(|r| crate::sampling::argmax(x.row(r))).collect()))
    }

    fn top_k(&self, x: &Tensor, k: usize, temperature: f32, at: &[u32]) -> impl Future<Output = Result<TopK>> {
        ready(check_top_k(x.rows, k, temperature, at).map(|()| TopK::of(&x.data, x.cols, k, temperature, at)))
    }

    fn draw(&self, x: &Tensor, draw: &Draw) -> impl Future<Output = Result<Vec<Drawn>>> {
        ready(draw::on_host(&x.data, x.cols, draw))
    }

    /// Every op has finished when it returns.
    fn sync(&self) -> impl Future<Output = Result<()>> {
        ready(Ok(()))
    }
}
