//! Weights on the GPU: the raw ggml bytes, decoded by the kernels that read them. A matrix larger
//! than one storage binding (a large vocabulary's output head) is split by rows into parts, each
//! its own buffer, and every op over it runs once per part. Weights loaded together (a layer's Q,
//! K and V, and their biases; its gate and up projections) share one buffer, one after the other,
//! so that one dispatch can take them all.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use crate::error::{Error, Result};
use crate::storage::quant::DType;
use crate::storage::Weight as HostWeight;

use super::buffers::{upload, upload_weight};
use super::GpuBackend;

/// A weight on the GPU; clones share the buffers.
#[derive(Clone)]
pub struct Weight(pub(super) Arc<Parts>);

pub(super) struct Parts {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub parts: Vec<Part>,
}

/// Rows `row0..row0 + rows` of a weight, stored from row `at` of `buf` on (0 unless the buffer
/// holds weights loaded together, one after the other: see [`GpuBackend::upload_together`]). A
/// vector's `at` counts values.
pub(super) struct Part {
    pub buf: wgpu::Buffer,
    pub row0: u32,
    pub rows: u32,
    pub at: u32,
}

impl Part {
    pub fn bind(&self) -> (&wgpu::Buffer, u64) {
        (&self.buf, self.buf.size())
    }
}

impl Weight {
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    pub fn rows(&self) -> usize {
        self.0.rows
    }
    pub fn cols(&self) -> usize {
        self.0.cols
    }
    /// How many buffers the weight is split into.
    pub fn parts(&self) -> usize {
        self.0.parts.len()
    }

    /// The buffer holding a vector's values (norm weights and biases are stored as one f32
    /// part), and where in it they start.
    pub(super) fn vector(&self, len: usize, what: &str) -> Result<(&wgpu::Buffer, u32)> {
        match &self.0.parts[..] {
            [p] if self.0.dtype == DType::F32 && self.0.rows * self.0.cols == len => Ok((&p.buf, p.at)),
            _ => Err(Error::InvalidArgument(format!(
                "{what} needs a vector of {len} values, got a {}x{} {:?} weight",
                self.0.rows, self.0.cols, self.0.dtype
            ))),
        }
    }
}

/// Identifies the bytes of a host weight: where they are and a checksum of them, so that a tied
/// embedding and output head upload once, while a different weight that happens to reuse freed
/// memory never matches.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct WeightKey {
    addr: usize,
    len: usize,
    dtype: DType,
    rows: usize,
    checksum: u64,
}

impl WeightKey {
    fn of(w: &HostWeight) -> WeightKey {
        let b = w.data.as_slice();
        // FNV-1a over 8-byte words: far cheaper than the upload it saves, and enough to tell
        // weights apart (it is not guarding against adversaries).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let words = b.chunks_exact(8);
        let tail = words.remainder();
        for c in words {
            h = (h ^ u64::from_le_bytes(c.try_into().unwrap())).wrapping_mul(0x100_0000_01b3);
        }
        for &x in tail {
            h = (h ^ x as u64).wrapping_mul(0x100_0000_01b3);
        }
        WeightKey { addr: b.as_ptr() as usize, len: b.len(), dtype: w.dtype, rows: w.rows, checksum: h }
    }
}

pub(super) type WeightCache = HashMap<WeightKey, Weak<Parts>>;

impl GpuBackend {
    pub(super) fn upload_weight(&self, w: &HostWeight) -> Result<Weight> {
        // Vectors (norm weights, biases) are tiny and read by element-wise kernels: plain f32.
        if w.rows == 1 || w.cols == 1 {
            let v = w.to_f32();
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            let buf = upload(&self.device, &bytes, bytes.len().max(4) as u64, wgpu::BufferUsages::STORAGE, "weight")?;
            let part = Part { buf, row0: 0, rows: w.rows as u32, at: 0 };
            return Ok(Weight(Arc::new(Parts { dtype: DType::F32, rows: w.rows, cols: w.cols, parts: vec![part] })));
        }
        let key = WeightKey::of(w);
        let mut cache = self.weights.lock().unwrap();
        cache.retain(|_, p| p.strong_count() > 0);
        if let Some(parts) = cache.get(&key).and_then(Weak::upgrade) {
            return Ok(Weight(parts));
        }
        let parts = Arc::new(self.split_upload(w)?);
        cache.insert(key, Arc::downgrade(&parts));
        Ok(Weight(parts))
    }

    /// `ws` in one buffer, one after the other, where they are all matrices of one storage type
    /// and width that fit one part, or all vectors: a layer's Q, K and V projections (or their
    /// biases), which [`GpuBackend::matmul_together`] then runs as one dispatch, or its gate and
    /// up projections, which [`GpuBackend::gated_together`] does. Where only the leading ones
    /// share a type (a Q and K whose V is stored in another), those go together and the rest
    /// apart. Else (or where one of them is already on the GPU) each is uploaded as
    /// [`GpuBackend::upload_weight`] does.
    pub(super) fn upload_together(&self, ws: &[&HostWeight]) -> Result<Vec<Weight>> {
        let vector = |w: &HostWeight| w.rows == 1 || w.cols == 1;
        let Some(first) = ws.first() else { return Ok(Vec::new()) };
        let vectors = ws.iter().all(|w| vector(w));
        let alike = ws.iter().take_while(|w| !vector(w) && w.dtype == first.dtype && w.cols == first.cols).count();
        if (2..ws.len()).contains(&alike) {
            let mut loaded = self.upload_together(&ws[..alike])?;
            for w in &ws[alike..] {
                loaded.push(self.upload_weight(w)?);
            }
            return Ok(loaded);
        }
        let bytes: u64 = ws.iter().map(|w| if vectors { 4 * w.rows * w.cols } else { w.data.as_slice().len() } as u64).sum();
        let matrices = alike == ws.len()
            && bytes + 8 <= self.max_weight_part
            && ws.iter().map(|w| w.rows).sum::<usize>() <= (u32::MAX as usize - 4) / first.cols;
        // Matrices are found again by their bytes (vectors are never cached): checksummed once here.
        let keys: Vec<WeightKey> = if matrices { ws.iter().map(|w| WeightKey::of(w)).collect() } else { Vec::new() };
        let cached = {
            let cache = self.weights.lock().unwrap();
            keys.iter().any(|k| cache.get(k).is_some_and(|p| p.strong_count() > 0))
        };
        if ws.len() < 2 || !(vectors || matrices) || cached {
            return ws.iter().map(|w| self.upload_weight(w)).collect();
        }
        let data: Vec<u8> = match vectors {
            true => ws.iter().flat_map(|w| w.to_f32()).flat_map(|x| x.to_le_bytes()).collect(),
            false => ws.iter().flat_map(|w| w.data.as_slice().iter().copied()).collect(),
        };
        let buf = match vectors {
            true => upload(&self.device, &data, data.len() as u64, wgpu::BufferUsages::STORAGE, "weights")?,
            // One spare word, as for any part.
            false => upload_weight(&self.device, &self.queue, &data, (data.len() as u64).div_ceil(4) * 4 + 4)?,
        };
        let mut at = 0;
        let mut cache = self.weights.lock().unwrap();
        Ok(ws
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let part = Part { buf: buf.clone(), row0: 0, rows: w.rows as u32, at };
                at += if vectors { w.rows * w.cols } else { w.rows } as u32;
                let dtype = if vectors { DType::F32 } else { w.dtype };
                let parts = Arc::new(Parts { dtype, rows: w.rows, cols: w.cols, parts: vec![part] });
                if let Some(&key) = keys.get(i) {
                    cache.insert(key, Arc::downgrade(&parts));
                }
                Weight(parts)
            })
            .collect())
    }

    fn split_upload(&self, w: &HostWeight) -> Result<Parts> {
        let row_bytes = w.row_bytes() as u64;
        // One spare word per part: the kernels read 4 bytes at unaligned offsets near the end.
        // Kernels index a part's values with u32.
        let fit = ((self.max_weight_part.saturating_sub(8) / row_bytes) as usize).min((u32::MAX as usize - 4) / w.cols);
        if fit == 0 {
            return Err(Error::OutOfMemory(format!(
                "a weight row of {row_bytes} bytes exceeds the largest GPU weight buffer of {} bytes",
                self.max_weight_part
            )));
        }
        let n_parts = w.rows.div_ceil(fit);
        let per_part = w.rows.div_ceil(n_parts);
        let data = w.data.as_slice();
        let parts = (0..w.rows)
            .step_by(per_part)
            .map(|row0| {
                let rows = per_part.min(w.rows - row0);
                let bytes = &data[row0 * row_bytes as usize..(row0 + rows) * row_bytes as usize];
                let size = (bytes.len() as u64).div_ceil(4) * 4 + 4;
                let buf = upload_weight(&self.device, &self.queue, bytes, size)?;
                Ok(Part { buf, row0: row0 as u32, rows: rows as u32, at: 0 })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Parts { dtype: w.dtype, rows: w.rows, cols: w.cols, parts })
    }
}
