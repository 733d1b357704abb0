//! `x [m, k] @ W[n, k]^T` with W in its storage type: each chunk of weight rows is dequantized once
//! into a scratch buffer and dotted with all m activation rows, so a batch of m rows reads W once.

use super::pool::{Pool, SharedMut};
use crate::model::weights::Weight;

const ROWS_PER_CHUNK: usize = 16;

#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `out[m * n]` = `x[m * k]` times the transpose of `w`.
pub fn matmul(pool: &Pool, x: &[f32], m: usize, w: &Weight, out: &mut [f32]) {
    let (n, k) = (w.rows, w.cols);
    debug_assert_eq!(x.len(), m * k);
    debug_assert_eq!(out.len(), m * n);
    let out_ptr = SharedMut(out.as_mut_ptr());
    pool.for_each(n.div_ceil(ROWS_PER_CHUNK), |c| {
        let out_ptr = out_ptr;
        let rows = c * ROWS_PER_CHUNK..((c + 1) * ROWS_PER_CHUNK).min(n);
        // Dequantize the chunk's weight rows once; they stay in cache while every activation row
        // streams past them.
        let mut wbuf = vec![0.0f32; rows.len() * k];
        for (r, buf) in rows.clone().zip(wbuf.chunks_exact_mut(k)) {
            w.dequantize_row(r, buf);
        }
        for i in 0..m {
            let xi = &x[i * k..(i + 1) * k];
            for (r, wr) in rows.clone().zip(wbuf.chunks_exact(k)) {
                // SAFETY: each (i, r) is written by exactly one chunk, and out has m * n elements.
                unsafe { *out_ptr.0.add(i * n + r) = dot(wr, xi) };
            }
        }
    });
}
