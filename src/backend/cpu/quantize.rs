//! Activations quantized once per matmul, so that every weight block is dotted with them in integer
//! arithmetic. A block of activations is stored as symmetric integers `q = round(x / d)` with
//! `d = max|x| / T::MAX`, so each value is off by at most `d / 2`:
//! - 16-bit (`i16`, [`Precision::Exact`](super::Precision)): off by `max|x| / 65534`, which keeps
//!   logits within 0.003 of the f32 reference on the golden cases;
//! - 8-bit (`i8`, `Precision::Fast`): off by `max|x| / 254`, which moves logits of real models by
//!   up to 0.5 through their activation outliers (measured on the golden cases): right for a draft.
//!
//! On x86-64 both cost the same two multiply-add instructions per 32 values and activation row
//! (`maddubs` + `madd` at 8 bits, two `madd` at 16 bits); 16 bits adds the widening of the weights
//! to the block decode, which a batch shares.

use crate::storage::quant::{QK, QK_K};

/// An integer type activations are quantized to.
pub trait ActInt: Copy + Default + Send + Sync + 'static {
    /// The largest magnitude a quantized value takes.
    const MAX: i32;
    fn get(self) -> i32;
    /// `v` rounded to the nearest integer, ties to even (|v| <= MAX by construction).
    fn round(v: f32) -> Self;
}

impl ActInt for i8 {
    const MAX: i32 = 127;
    #[inline(always)]
    fn get(self) -> i32 {
        self as i32
    }
    #[inline(always)]
    fn round(v: f32) -> Self {
        v.round_ties_even() as i8
    }
}

impl ActInt for i16 {
    const MAX: i32 = 32767;
    #[inline(always)]
    fn get(self) -> i32 {
        self as i32
    }
    #[inline(always)]
    fn round(v: f32) -> Self {
        v.round_ties_even() as i16
    }
}

/// 32 activations, for the 32-value weight formats; `s = d * Σ q` serves the formats with an offset.
/// The values come first and the blocks are 32-byte aligned, so that no 32-byte load of them
/// straddles two cache lines (a kernel loads each block once per weight row).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub struct Act32<T> {
    pub qs: [T; QK],
    pub d: f32,
    pub s: f32,
}

/// 256 activations, for the K-quants; `bsums[g]` is the sum of values `16 g..16 g + 16` (an integer
/// that f32 holds exactly), which turns a K-quant's per-group offsets into one small dot per block.
/// `bsums32` holds the same sums per 32 values, the groups of Q4_K's and Q5_K's offsets, whose dot
/// then takes a single vector multiply.
/// `qs` holds the values in the [`Order`] of the kernels that read them.
/// The blocks are 64-byte aligned, so that no 64-byte load of them (the AVX-512 kernels') straddles
/// two cache lines; it costs no padding, as both sizes are whole cache lines already. At 32-byte
/// alignment, whether they straddled depended on where the allocator put the batch, which swung
/// five rows of Q4_K by 20% between two builds of the same code.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub struct ActK<T> {
    pub qs: [T; QK_K],
    pub d: f32,
    pub bsums: [f32; QK_K / 16],
    pub bsums32: [f32; QK_K / 32],
}

impl<T: ActInt> Default for Act32<T> {
    fn default() -> Self {
        Act32 { d: 0.0, s: 0.0, qs: [T::default(); QK] }
    }
}

impl<T: ActInt> Default for ActK<T> {
    fn default() -> Self {
        ActK { d: 0.0, bsums: [0.0; QK_K / 16], bsums32: [0.0; QK_K / 32], qs: [T::default(); QK_K] }
    }
}

/// Quantizes `x` into `q`, returning the scale.
#[inline(always)]
fn block<T: ActInt>(x: &[f32], q: &mut [T]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / T::MAX as f32;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, v) in q.iter_mut().zip(x) {
        *q = T::round(v * id);
    }
    d
}

fn sum<T: ActInt>(q: &[T]) -> f32 {
    q.iter().map(|q| q.get()).sum::<i32>() as f32
}

#[inline(always)]
fn act32_portable<T: ActInt>(x: &[f32], out: &mut [Act32<T>]) {
    for (x, b) in x.chunks_exact(QK).zip(out) {
        b.d = block(x, &mut b.qs);
        b.s = b.d * sum(&b.qs);
    }
}

/// The order of the 32 values of each chunk of a K-quant activation block, as the kernels of an
/// instruction set read them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    Natural,
    /// The 16 even-indexed values, then the 16 odd-indexed ones: the AVX2 kernels widen and scale
    /// 32 weight bytes into 16-bit lanes by parity (one `maddubs` each), not by half.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    EvenOdd,
    /// [`Order::EvenOdd`] over each two chunks: the even-indexed values of the first chunk, then of
    /// the second, then the odd-indexed of the first, then of the second. The AVX-512 kernels
    /// decode two chunks into one 512-bit vector and scale them by parity.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    EvenOddPairs,
    /// In each 16 values, the pairs `2k, 2k + 1, 8 + 2k, 9 + 2k` together, for `k` = 0..4: the
    /// relaxed-SIMD kernels' 4-byte dots then gather in each i32 lane what the simd128 kernels'
    /// 16-bit dots gather, so both give the same bits.
    #[cfg_attr(not(target_feature = "relaxed-simd"), allow(dead_code))]
    Pairs,
}

/// Where value `PAIRS[j]` of 16 goes in [`Order::Pairs`]: at `j`.
pub(crate) const PAIRS: [u8; 16] = [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15];

#[inline(always)]
fn actk_portable<T: ActInt>(x: &[f32], out: &mut [ActK<T>], order: Order) {
    for (x, b) in x.chunks_exact(QK_K).zip(out) {
        b.d = block(x, &mut b.qs);
        for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = sum(q);
        }
        for (s, pair) in b.bsums32.iter_mut().zip(b.bsums.chunks_exact(2)) {
            *s = pair[0] + pair[1];
        }
        match order {
            Order::Natural => {}
            Order::EvenOdd => {
                for c in b.qs.chunks_exact_mut(QK) {
                    let v: [T; QK] = std::array::from_fn(|j| c[j]);
                    for j in 0..QK / 2 {
                        c[j] = v[2 * j];
                        c[QK / 2 + j] = v[2 * j + 1];
                    }
                }
            }
            Order::EvenOddPairs => {
                for c in b.qs.chunks_exact_mut(2 * QK) {
                    let v: [T; 2 * QK] = std::array::from_fn(|j| c[j]);
                    for j in 0..QK {
                        // Value 2i of chunk h goes to h * 16 + i, its odd neighbour 32 further.
                        let (h, i) = (j / (QK / 2), j % (QK / 2));
                        c[j] = v[h * QK + 2 * i];
                        c[QK + j] = v[h * QK + 2 * i + 1];
                    }
                }
            }
            Order::Pairs => {
                for c in b.qs.chunks_exact_mut(16) {
                    let v: [T; 16] = std::array::from_fn(|j| c[j]);
                    for (c, &from) in c.iter_mut().zip(&PAIRS) {
                        *c = v[from as usize];
                    }
                }
            }
        }
    }
}

/// The same code compiled for AVX2, where the compiler vectorizes it; results are bit-identical.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn act32<T: ActInt>(x: &[f32], out: &mut [Act32<T>]) {
        act32_portable(x, out)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn actk<T: ActInt>(x: &[f32], out: &mut [ActK<T>], order: Order) {
        actk_portable(x, out, order)
    }
}

/// `x` (a whole number of 32-value blocks) as [`Act32`] blocks; `simd` says AVX2 was detected.
pub(crate) fn quantize_32<T: ActInt>(x: &[f32], out: &mut [Act32<T>], simd: bool) {
    debug_assert_eq!(out.len() * QK, x.len());
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: the caller detected AVX2, FMA and F16C.
        return unsafe { avx2::act32(x, out) };
    }
    let _ = simd;
    act32_portable(x, out)
}

/// `x` (a whole number of 256-value blocks) as [`ActK`] blocks with their values in `order`;
/// `simd` says AVX2 was detected.
pub(crate) fn quantize_k<T: ActInt>(x: &[f32], out: &mut [ActK<T>], simd: bool, order: Order) {
    debug_assert_eq!(out.len() * QK_K, x.len());
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: the caller detected AVX2, FMA and F16C.
        return unsafe { avx2::actk(x, out, order) };
    }
    let _ = simd;
    actk_portable(x, out, order)
}
