//! A distribution's likeliest entries on the GPU ([`crate::backend::Backend::top_k`]): a
//! speculation's fan-out reads back k (value, column) pairs and two numbers per row instead of
//! the row.

use std::future::Future;

use crate::backend::{check_top_k, TopK, MAX_TOP_K};
use crate::error::Result;

use super::buffers::Meta;
use super::encoder::f;
use super::pipelines::{Kernel, TOPK};
use super::{groups, GpuBackend, Tensor};

/// Entries each workgroup sorts (`CHUNK` in topk.wgsl).
const CHUNK: usize = 1024;
// Each pass must leave fewer survivors than it read.
const _: () = assert!(MAX_TOP_K <= CHUNK / 2);

/// How `chunk_top` reads entry `at`: a value, keyed, in the first pass; a survivor after.
const FROM_VALUES: (&str, &str) = ("LOAD", "vec2<u32>(order_key(x[at]), c)");
const FROM_PAIRS: (&str, &str) = ("LOAD", "pin[at]");

/// The value whose order key (topk.wgsl's `order_key`) is `key`.
fn key_value(key: u32) -> f32 {
    match key {
        0 => f32::NAN,
        k if k >> 31 == 1 => f32::from_bits(k & 0x7fff_ffff),
        k => f32::from_bits(!k),
    }
}

impl GpuBackend {
    pub(super) fn top_k_rows(&self, x: &Tensor, k: usize, temperature: f32, at: &[u32]) -> impl Future<Output = Result<TopK>> {
        let rows = x.rows;
        let checked = check_top_k(rows, k, temperature, at);
        let k = k.min(x.cols);
        let started = checked.and_then(|()| self.record_top_k(x, k, temperature, at));
        async move {
            let words: Vec<u32> =
                started?.await?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
            let stride = 2 * k + 2;
            let mut top = TopK { k, ids: Vec::with_capacity(rows * k), values: Vec::with_capacity(rows * k), lse: vec![], at: vec![] };
            for row in words.chunks_exact(stride).take(rows) {
                for pair in row[..2 * k].chunks_exact(2) {
                    top.values.push(key_value(pair[0]));
                    top.ids.push(pair[1]);
                }
                top.lse.push(f32::from_bits(row[2 * k]));
                top.at.push(f32::from_bits(row[2 * k + 1]));
            }
            Ok(top)
        }
    }

    fn record_top_k(&self, x: &Tensor, k: usize, temperature: f32, at: &[u32]) -> Result<impl Future<Output = Result<Vec<u8>>>> {
        let (rows, stride) = (x.rows, 2 * k + 2);
        let result = self.tensor(rows, stride)?;
        let pass = |kernel: &Kernel, n: usize, chunks: usize, out_stride: usize, binds: &[super::encoder::Bind]| {
            let params = [rows as u32, n as u32, k as u32, chunks as u32, out_stride as u32, f(temperature)];
            self.dispatch(kernel, &params, binds, groups(rows * chunks, 1)?)
        };
        // The first pass reads the values; later ones the survivors of the one before.
        let (mut n, mut survivors) = (x.cols, None::<Tensor>);
        loop {
            let chunks = n.div_ceil(CHUNK);
            let last = chunks == 1;
            let out = if last { None } else { Some(self.tensor(rows, chunks * k * 2)?) };
            let (out_buf, out_stride) = match &out {
                Some(t) => (t, chunks * k * 2),
                None => (&result, stride),
            };
            match &survivors {
                None => pass(&self.kernel(&TOPK, "chunk_top", &[FROM_VALUES])?, n, chunks, out_stride, &[x.bind(1), out_buf.bind(3)])?,
                Some(s) => pass(&self.kernel(&TOPK, "chunk_top", &[FROM_PAIRS])?, n, chunks, out_stride, &[s.bind(2), out_buf.bind(3)])?,
            }
            if last {
                break;
            }
            survivors = out;
            n = chunks * k;
        }
        let cols = self.meta(Meta::Columns, at, |c| c.to_vec())?;
        // row_stats reads no chunk entries; the source needs its placeholder filled all the same.
        let stats = self.kernel(&TOPK, "row_stats", &[FROM_VALUES])?;
        pass(&stats, x.cols, 1, stride, &[x.bind(1), result.bind(3), (4, &cols, cols.size())])?;
        Ok(self.download(result.buf.buffer(), result.bytes()))
    }
}
