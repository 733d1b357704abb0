//! Activations quantized once per matmul, so that every weight block is dotted with them in 8-bit
//! integer arithmetic. At [`Precision::Exact`](super::Precision) a row is stored as two rows of
//! symmetric 8-bit blocks, `x ≈ d q + d' q'`: `q = round(x / d)` with `d = max|x| / 127`, and `q'`
//! quantizes the remainder `x - d q` the same way. One 8-bit part alone (`Precision::Fast`) moves
//! logits of real models by up to 0.5 through their activation outliers (measured on the golden
//! cases); the two parts (about 15 bits) keep them within 0.003 of the f32 reference, for one more
//! multiply-add per value per row while the weights are decoded once. A value is off by at most
//! `d' / 2 <= d / 508` with two parts, `d / 2` with one.

use crate::model::quant::{QK, QK_K};

/// 32 activations, for the 32-value weight formats; `s = d * Σ q` serves the formats with an offset.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ8 {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; QK],
}

/// 256 activations, for the K-quants; `bsums[g]` is the sum of `qs[16 g..16 g + 16]`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub bsums: [i16; QK_K / 16],
    pub qs: [i8; QK_K],
}

impl Default for BlockQ8 {
    fn default() -> Self {
        BlockQ8 { d: 0.0, s: 0.0, qs: [0; QK] }
    }
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K { d: 0.0, bsums: [0; QK_K / 16], qs: [0; QK_K] }
    }
}

/// Quantizes `x` into `q`, returning the scale.
#[inline(always)]
fn block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    d
}

/// What the 8-bit values `q` at scale `d` leave of `x`.
#[inline(always)]
fn remainder<const N: usize>(x: &[f32], d: f32, q: &[i8; N]) -> [f32; N] {
    std::array::from_fn(|j| x[j] - d * q[j] as f32)
}

/// `out` holds one or two rows of blocks (the main part, then the remainder if there is room).
#[inline(always)]
fn q8_portable(x: &[f32], out: &mut [BlockQ8]) {
    let (hi, lo) = out.split_at_mut(x.len() / QK);
    let sum = |q: &[i8; QK]| q.iter().map(|&q| q as i32).sum::<i32>() as f32;
    for (b, (x, h)) in x.chunks_exact(QK).zip(hi).enumerate() {
        h.d = block(x, &mut h.qs);
        h.s = h.d * sum(&h.qs);
        if let Some(l) = lo.get_mut(b) {
            l.d = block(&remainder(x, h.d, &h.qs), &mut l.qs);
            l.s = l.d * sum(&l.qs);
        }
    }
}

#[inline(always)]
fn q8k_portable(x: &[f32], out: &mut [BlockQ8K]) {
    let (hi, lo) = out.split_at_mut(x.len() / QK_K);
    let bsums = |b: &mut BlockQ8K| {
        for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = q.iter().map(|&q| q as i16).sum();
        }
    };
    for (b, (x, h)) in x.chunks_exact(QK_K).zip(hi).enumerate() {
        h.d = block(x, &mut h.qs);
        bsums(h);
        if let Some(l) = lo.get_mut(b) {
            l.d = block(&remainder(x, h.d, &h.qs), &mut l.qs);
            bsums(l);
        }
    }
}

/// The same code compiled for AVX2, where the compiler vectorizes it; results are bit-identical.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn q8(x: &[f32], out: &mut [BlockQ8]) {
        q8_portable(x, out)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn q8k(x: &[f32], out: &mut [BlockQ8K]) {
        q8k_portable(x, out)
    }
}

/// `x` (a whole number of 32-value blocks) as one or two rows of [`BlockQ8`]s, as `out` has room
/// for: the main part, then the remainder; `simd` says AVX2 was detected.
pub(crate) fn quantize_q8(x: &[f32], out: &mut [BlockQ8], simd: bool) {
    debug_assert!(out.len() * QK == x.len() || out.len() * QK == 2 * x.len());
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: the caller detected AVX2, FMA and F16C.
        return unsafe { avx2::q8(x, out) };
    }
    let _ = simd;
    q8_portable(x, out)
}

/// `x` (a whole number of 256-value blocks) as one or two rows of [`BlockQ8K`]s, as `out` has room
/// for: the main part, then the remainder; `simd` says AVX2 was detected.
pub(crate) fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K], simd: bool) {
    debug_assert!(out.len() * QK_K == x.len() || out.len() * QK_K == 2 * x.len());
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: the caller detected AVX2, FMA and F16C.
        return unsafe { avx2::q8k(x, out) };
    }
    let _ = simd;
    q8k_portable(x, out)
}
