//! wasm32 relaxed-SIMD kernels for 8-bit activations on the K-quants: `i32x4.relaxed_dot_i8x16_i7x16_add_s`
//! multiplies 16 signed activation bytes by 16 weight bytes of 0..127 (the K-quants' values, 0..63,
//! taken unsigned) and sums each four into an i32 lane in one instruction, where simd128 widens both
//! to 16 bits and takes two `i32x4_dot_i16x8`. A lane's sum is then multiplied by its 16 values'
//! scale. Q6_K's offset of 32 comes off as a second dot with 32s. Activations are laid out in
//! [`Order::Pairs`], and the weights shuffled to match, so each lane gathers what the simd128
//! kernels' lane gathers: both give the same bits. The other formats and 16-bit activations take
//! the simd128 kernels. Built only when the module is compiled with relaxed SIMD; the package
//! ships a second build with it, which a browser that validates relaxed SIMD loads.

use std::arch::wasm32::*;

use super::super::quantize::PAIRS;
use super::wasm::{chunk_k, load32, qk_rows, ChunkDot};
use super::*;

/// Shuffled weight bytes, their scales and, where the values are taken less 32, 32s.
#[derive(Clone, Copy)]
struct Bytes {
    v: [v128; 2],
    sc: [v128; 2],
    less32: Option<v128>,
}

struct Relaxed;

/// Activations of one byte each, which the byte dot takes: the 8-bit ones.
trait Byte: ActInt {}
impl Byte for i8 {}

impl<T: Byte> ChunkDot<T> for Relaxed {
    type W = Bytes;

    #[inline(always)]
    unsafe fn weights<F: BlockK>(p: *const u8, t: usize, sc: [i16; 2], less32: bool) -> Bytes {
        let order = v128_load(PAIRS.as_ptr() as *const v128);
        let v = chunk_k::<F>(p, t).map(|v| i8x16_swizzle(v, order));
        let sc = sc.map(|s| i32x4_splat(s as i32));
        Bytes { v, sc, less32: less32.then(|| u8x16_splat(32)) }
    }

    #[inline(always)]
    unsafe fn dot(w: &Bytes, q: *const T) -> v128 {
        let q = load32(q as *const u8);
        let zero = i32x4_splat(0);
        let d: [v128; 2] = std::array::from_fn(|h| {
            let d = i32x4_relaxed_dot_i8x16_i7x16_add(q[h], w.v[h], zero);
            match w.less32 {
                Some(c) => i32x4_sub(d, i32x4_relaxed_dot_i8x16_i7x16_add(q[h], c, zero)),
                None => d,
            }
        });
        i32x4_add(i32x4_mul(d[0], w.sc[0]), i32x4_mul(d[1], w.sc[1]))
    }
}

unsafe fn qk<F: BlockK, T: Byte>(w: &[u8], x: &[ActK<T>], rows: usize, out: &mut [f32]) {
    by_rows!(qk_rows::<F, T, Relaxed>(w, x, rows, out))
}

pub(crate) const KERNELS: Kernels = Kernels { qk: |d| select!(qk<i8>: d, qk), qk_order: Order::Pairs, ..wasm::KERNELS };
