//! Weights as they are stored, below both the model and the backends: the ggml block formats
//! ([`quant`]) and their encoders ([`quantize`]), and [`Weight`], a (type, shape, bytes) view shared
//! with the file it came from.

pub mod quant;
pub mod quantize;

use std::ops::Range;
use std::sync::Arc;

use crate::error::{Error, Result};
use quant::DType;

/// The bytes a model was read from: a memory map natively, or a buffer filled from the network.
pub type Storage = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A cheap view of a byte range of shared storage.
#[derive(Clone)]
pub struct Bytes {
    storage: Storage,
    range: Range<usize>,
}

impl Bytes {
    pub fn new(storage: Storage, range: Range<usize>) -> Self {
        debug_assert!(range.end <= (*storage).as_ref().len());
        Bytes { storage, range }
    }
    pub fn from_vec(v: Vec<u8>) -> Self {
        let n = v.len();
        Bytes { storage: Arc::new(v), range: 0..n }
    }
    /// Bytes `range` of this view, sharing its storage.
    pub fn slice(&self, range: Range<usize>) -> Bytes {
        debug_assert!(range.end <= self.len());
        Bytes::new(self.storage.clone(), self.range.start + range.start..self.range.start + range.end)
    }
    pub fn as_slice(&self) -> &[u8] {
        &(*self.storage).as_ref()[self.range.clone()]
    }
    pub fn len(&self) -> usize {
        self.range.len()
    }
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes)", self.len())
    }
}

/// A 1-D vector (`rows == 1`) or a row-major matrix of `rows` rows of `cols` values each, where a
/// matrix multiply computes `y[r] = dot(W[r], x)`.
#[derive(Clone, Debug)]
pub struct Weight {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub data: Bytes,
}

impl Weight {
    pub fn new(dtype: DType, rows: usize, cols: usize, data: Bytes) -> Result<Self> {
        if cols % dtype.block_size() != 0 {
            return Err(Error::invalid_model(format!(
                "a row of {cols} values is not a whole number of {dtype:?} blocks"
            )));
        }
        let need = rows
            .checked_mul(cols)
            .ok_or_else(|| Error::invalid_model("weight size overflows"))
            .and_then(|n| dtype.bytes_for(n))?;
        if need != data.len() {
            return Err(Error::invalid_model(format!(
                "weight of {rows}x{cols} {dtype:?} needs {need} bytes, has {}",
                data.len()
            )));
        }
        Ok(Weight { dtype, rows, cols, data })
    }

    pub fn from_f32(rows: usize, cols: usize, v: &[f32]) -> Self {
        assert_eq!(v.len(), rows * cols);
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Weight { dtype: DType::F32, rows, cols, data: Bytes::from_vec(bytes) }
    }

    pub fn row_bytes(&self) -> usize {
        self.cols / self.dtype.block_size() * self.dtype.block_bytes()
    }

    pub fn row(&self, r: usize) -> &[u8] {
        self.rows_range(r..r + 1)
    }

    /// Rows `rows` of the weight, back to back.
    pub fn rows_range(&self, rows: std::ops::Range<usize>) -> &[u8] {
        let rb = self.row_bytes();
        &self.data.as_slice()[rows.start * rb..rows.end * rb]
    }

    /// Row `r` as f32 values.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        quant::dequantize(self.dtype, self.row(r), &mut out[..self.cols]);
    }

    /// The whole tensor as f32 (tests and small vectors such as norms and biases).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        quant::dequantize(self.dtype, self.data.as_slice(), &mut out);
        out
    }

    /// Rows `rows` as a weight of their own, sharing this one's storage (a fused matrix's parts).
    pub fn rows_view(&self, rows: Range<usize>) -> Weight {
        let rb = self.row_bytes();
        Weight { rows: rows.len(), data: self.data.slice(rows.start * rb..rows.end * rb), ..self.clone() }
    }

    /// Rows reordered so that new row `i` is old row `perm[i]` (GGUF llama Q/K un-permute).
    pub fn permute_rows(&self, perm: &[usize]) -> Weight {
        let rb = self.row_bytes();
        let mut out = Vec::with_capacity(self.data.len());
        for &p in perm {
            out.extend_from_slice(self.row(p));
        }
        debug_assert_eq!(out.len(), rb * self.rows);
        Weight { data: Bytes::from_vec(out), ..self.clone() }
    }
}
