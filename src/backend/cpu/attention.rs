//! Attention over the KV cache. A job takes one batch row and the query heads that share one KV
//! head (grouped-query attention): every key and value it loads serves all of them, and their dot
//! products and weighted sums run side by side in registers rather than one head after another,
//! each waiting on its own chain of adds. Each head is still computed exactly as it would be alone,
//! so a row's output does not depend on its batch or on how the heads were grouped: a verification
//! gives the bits of the decodes it stands for.

use super::kernels::MAX_ROWS;
use super::pool::{Pool, SharedMut};
use super::Tensor;
use crate::backend::{AttnShape, Batch};

/// `softmax(q k^T * scale) v` for every row of `q` and every head, over the slots each row attends
/// (see [`Batch::attended`]), with keys and values read from the caches `kc` and `vc`
/// (`[slot, kv_dim]`).
pub(super) fn attend(pool: &Pool, q: &Tensor, kc: &[f32], vc: &[f32], kv_dim: usize, batch: &Batch, s: AttnShape) -> Tensor {
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    // Heads per job: the whole group where the rows and KV heads alone give every thread a job.
    let units = q.rows * s.n_kv_heads;
    let per_job = group.div_ceil(pool.threads().div_ceil(units).clamp(1, group)).min(MAX_ROWS);
    let splits = group.div_ceil(per_job);
    let mut out = vec![0.0; q.rows * q.cols];
    let out_ptr = SharedMut(out.as_mut_ptr());
    pool.for_each(units * splits, |job| {
        let out_ptr = out_ptr;
        let (r, kvh, split) = (job / (s.n_kv_heads * splits), job / splits % s.n_kv_heads, job % splits);
        let h0 = kvh * group + split * per_job;
        let heads = per_job.min((kvh + 1) * group - h0);
        let kvo = kvh * hd;
        let slots: Vec<usize> = batch.attended(r, s.window).collect();
        let n = slots.len();
        let mut w = vec![0.0; heads * n];
        key_dots(&q.row(r)[h0 * hd..(h0 + heads) * hd], &kc[kvo..], kv_dim, &slots, &mut w);
        softmax_rows(&mut w, n, s.scale);
        // SAFETY: job (r, kvh, split) alone writes heads h0..h0 + heads of row r.
        let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(r * q.cols + h0 * hd), heads * hd) };
        weighted_values(&w, &vc[kvo..], kv_dim, &slots, o);
    });
    Tensor::new(q.rows, q.cols, out)
}

/// The dots of the query rows `q` (`out.len() / slots.len()` of them, back to back) with the key of
/// each slot, `k[t * stride..]`: `out[i * slots.len() + j]` for query `i` and slot `j`.
fn key_dots(q: &[f32], k: &[f32], stride: usize, slots: &[usize], out: &mut [f32]) {
    let rows = out.len().checked_div(slots.len()).unwrap_or(0);
    if rows == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::matmul::avx2() {
        use super::kernels::{by_rows, x86::float};
        // SAFETY: AVX2, FMA and F16C were detected.
        return by_rows!(@ rows, |R| unsafe { float::key_dots::<R>(q, k, stride, slots, out) });
    }
    let hd = q.len() / rows;
    for (j, &t) in slots.iter().enumerate() {
        for (i, q) in q.chunks_exact(hd).enumerate() {
            out[i * slots.len() + j] = dot(q, &k[t * stride..t * stride + hd]);
        }
    }
}

/// `out[i] += Σ_j w[i * slots.len() + j] * v[slots[j] * stride..]` for each of the rows of `out`
/// (back to back), adding slot after slot.
fn weighted_values(w: &[f32], v: &[f32], stride: usize, slots: &[usize], out: &mut [f32]) {
    let rows = w.len().checked_div(slots.len()).unwrap_or(0);
    if rows == 0 {
        return;
    }
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if super::matmul::avx2() {
        use super::kernels::{by_rows, x86::float};
        // SAFETY: AVX2, FMA and F16C were detected.
        done = by_rows!(@ rows, |R| unsafe { float::weighted_values::<R>(w, v, stride, slots, out) });
    }
    let hd = out.len() / rows;
    for (i, o) in out.chunks_exact_mut(hd).enumerate() {
        for (j, &t) in slots.iter().enumerate() {
            let a = w[i * slots.len() + j];
            o[done..].iter_mut().zip(&v[t * stride + done..t * stride + hd]).for_each(|(y, x)| *y += a * x);
        }
    }
}

/// Each row of `w` (rows of `n`) times `scale`, turned into softmax weights.
fn softmax_rows(w: &mut [f32], n: usize, scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if super::matmul::avx2() {
        // SAFETY: AVX2, FMA and F16C were detected.
        return unsafe { super::kernels::x86::float::softmax_rows(w, n, scale) };
    }
    for w in w.chunks_exact_mut(n.max(1)) {
        w.iter_mut().for_each(|x| *x *= scale);
        let max = w.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        w.iter_mut().for_each(|x| {
            *x = (*x - max).exp();
            sum += *x;
        });
        w.iter_mut().for_each(|x| *x /= sum);
    }
}

/// `dot(a, b)` of two f32 slices of equal length, in eight interleaved sums.
fn dot(a: &[f32], b: &[f32]) -> f32 {
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
