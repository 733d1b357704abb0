//! A distribution's likeliest entries on the GPU ([`crate::backend::Backend::top_k`]): a
//! speculation's fan-out reads back k (value, column) pairs and two numbers per row instead of
//! the row.

use std::future::Future;

use crate::backend::{check_top_k, TopK, MAX_TOP_K};
use crate::error::Result;

use super::buffers::Meta;
use super::encoder::f;
use super::pipelines::{wgsl, Shader, ORDER, WORKGROUP_SUM};
use super::{groups, GpuBackend, Tensor};

const TOPK: Shader = Shader { name: "topk", source: wgsl!("topk"), includes: &[ORDER, WORKGROUP_SUM], snippets: &[] };

// topk.wgsl sorts the k entries it keeps in workgroup memory of this many.
const _: () = assert!(MAX_TOP_K == 512);

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
        let params = [rows as u32, x.cols as u32, k as u32, stride as u32, f(temperature)];
        let cols = self.meta(Meta::Columns, at, |c| c.to_vec())?;
        let binds = [x.bind(1), result.bind(3), (4, &cols, cols.size())];
        self.dispatch(&self.kernel(&TOPK, "select_top", &[])?, &params, &binds, groups(rows, 1)?)?;
        Ok(self.download(result.buf.buffer(), result.bytes()))
    }
}
