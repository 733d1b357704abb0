//! wasm32 simd128 kernels. simd128 has no byte multiply-add, so weight values are widened to i16
//! (and, for the K-quants, multiplied by their scale) once per block, and each activation row adds
//! `i32x4_dot_i16x8` products with its activations, widened to i16 where they are 8-bit. Built only
//! when the module is compiled with simd128, which every current browser runs; float weights use
//! the portable kernels, which the compiler vectorizes.

// Kernels index several per-row arrays by the same row.
#![allow(clippy::needless_range_loop)]

use std::arch::wasm32::*;

use super::*;

fn f16(bits: u32) -> f32 {
    half::f16::from_bits(bits as u16).to_f32()
}

fn hsum(v: v128) -> f32 {
    f32x4_extract_lane::<0>(v) + f32x4_extract_lane::<1>(v) + f32x4_extract_lane::<2>(v) + f32x4_extract_lane::<3>(v)
}

/// 32 bytes at `p` as two vectors.
#[inline(always)]
pub(super) unsafe fn load32(p: *const u8) -> [v128; 2] {
    [v128_load(p as *const v128), v128_load(p.add(16) as *const v128)]
}

#[inline(always)]
fn widen(v: [v128; 2], signed: bool) -> [v128; 4] {
    if signed {
        [i16x8_extend_low_i8x16(v[0]), i16x8_extend_high_i8x16(v[0]), i16x8_extend_low_i8x16(v[1]), i16x8_extend_high_i8x16(v[1])]
    } else {
        [u16x8_extend_low_u8x16(v[0]), u16x8_extend_high_u8x16(v[0]), u16x8_extend_low_u8x16(v[1]), u16x8_extend_high_u8x16(v[1])]
    }
}

/// Activations of one integer type, read as i16.
trait Load16: ActInt {
    unsafe fn load16(q: *const Self) -> [v128; 4];
}

impl Load16 for i8 {
    #[inline(always)]
    unsafe fn load16(q: *const i8) -> [v128; 4] {
        widen(load32(q as *const u8), true)
    }
}

impl Load16 for i16 {
    #[inline(always)]
    unsafe fn load16(q: *const i16) -> [v128; 4] {
        let q = q as *const v128;
        [v128_load(q), v128_load(q.add(1)), v128_load(q.add(2)), v128_load(q.add(3))]
    }
}

/// `Σ w16 * q` over 32 values, as four i32 lanes.
#[inline(always)]
unsafe fn dot32<T: Load16>(w16: &[v128; 4], q: *const T) -> v128 {
    let a = T::load16(q);
    let lo = i32x4_add(i32x4_dot_i16x8(w16[0], a[0]), i32x4_dot_i16x8(w16[1], a[1]));
    let hi = i32x4_add(i32x4_dot_i16x8(w16[2], a[2]), i32x4_dot_i16x8(w16[3], a[3]));
    i32x4_add(lo, hi)
}

/// 0x10 in byte `j` where bit `j` of the 32 bits at `p` is set.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> [v128; 2] {
    let bits = u32x4_splat((p as *const u32).read_unaligned());
    let mask = u64x2_splat(0x8040_2010_0804_0201);
    let spread = |lo: u8, hi: u8| {
        let bytes = i8x16_swizzle(bits, u8x16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi));
        v128_and(i8x16_eq(v128_and(bytes, mask), mask), u8x16_splat(0x10))
    };
    [spread(0, 1), spread(2, 3)]
}

#[inline(always)]
unsafe fn values32<F: Block32>(b: *const u8) -> [v128; 2] {
    if F::SIGNED {
        return load32(b.add(F::QS));
    }
    let q = v128_load(b.add(F::QS) as *const v128);
    let v = [v128_and(q, u8x16_splat(0xF)), u8x16_shr(q, 4)];
    match F::QH {
        Some(qh) => {
            let h = fifth_bits(b.add(qh));
            [v128_or(v[0], h[0]), v128_or(v[1], h[1])]
        }
        None => v,
    }
}

#[inline(always)]
pub(super) unsafe fn chunk_k<F: BlockK>(b: *const u8, t: usize) -> [v128; 2] {
    let low = |q: v128, shift: usize, bits: u8| v128_and(u8x16_shr(q, shift as u32), u8x16_splat(bits));
    if F::SIX {
        let (n, u) = (t / 4, t % 4);
        let ql = load32(b.add(F::QS + 64 * n + 32 * (u & 1)));
        let qh = load32(b.add(F::QH.unwrap() + 32 * n));
        return [0, 1].map(|h| v128_or(low(ql[h], 4 * (u >> 1), 0xF), u8x16_shl(low(qh[h], 2 * u, 3), 4)));
    }
    let q = load32(b.add(F::QS + 32 * (t / 2)));
    let v = q.map(|q| low(q, 4 * (t & 1), 0xF));
    match F::QH {
        Some(qh) => {
            let h = load32(b.add(qh));
            [0, 1].map(|i| v128_or(v[i], u8x16_shl(low(h[i], t, 1), 4)))
        }
        None => v,
    }
}

unsafe fn q32_rows<F: Block32, T: Load16, const R: usize>(w: &[u8], x: &[Act32<T>], out: &mut [f32]) {
    let nb = w.len() / F::BYTES;
    debug_assert_eq!(x.len(), R * nb);
    let mut acc = [f32x4_splat(0.0); R];
    let mut mins = [0.0f32; R];
    for b in 0..nb {
        let p = w.as_ptr().add(b * F::BYTES);
        let bits = F::dm_bits(std::slice::from_raw_parts(p, 4));
        let d = f16(bits);
        let m = F::min(d, if F::MIN.is_none() { f16(bits >> 16) } else { 0.0 });
        let w16 = widen(values32::<F>(p), F::SIGNED);
        for i in 0..R {
            let a = x.get_unchecked(i * nb + b);
            let dot = f32x4_convert_i32x4(dot32(&w16, a.qs.as_ptr()));
            acc[i] = f32x4_add(acc[i], f32x4_mul(dot, f32x4_splat(d * a.d)));
            if !F::SIGNED {
                mins[i] += m * a.s;
            }
        }
    }
    for i in 0..R {
        out[i] = hsum(acc[i]) + mins[i];
    }
}

/// How a chunk of 32 K-quant weights meets a row of activations. Every implementation gathers the
/// same integers in each i32 lane, so they give the same bits.
pub(super) trait ChunkDot<T> {
    type W: Copy;
    /// Chunk `t` of the block at `p`, scaled by `sc` (its first 16 values by `sc[0]`, the last 16
    /// by `sc[1]`), less 32 each where `less32`.
    unsafe fn weights<F: BlockK>(p: *const u8, t: usize, sc: [i16; 2], less32: bool) -> Self::W;
    /// `Σ w * q` over the chunk as four i32 lanes, lane `k` holding the products of values `2k`,
    /// `2k + 1`, `8 + 2k` and `9 + 2k` of each 16.
    unsafe fn dot(w: &Self::W, q: *const T) -> v128;
}

/// Weights widened to 16 bits and scaled, met by `i32x4_dot_i16x8`.
pub(super) struct Widened;

impl<T: Load16> ChunkDot<T> for Widened {
    type W = [v128; 4];

    #[inline(always)]
    unsafe fn weights<F: BlockK>(p: *const u8, t: usize, sc: [i16; 2], less32: bool) -> [v128; 4] {
        let v = widen(chunk_k::<F>(p, t), false);
        let v = if less32 { v.map(|v| i16x8_sub(v, i16x8_splat(32))) } else { v };
        let (s0, s1) = (i16x8_splat(sc[0]), i16x8_splat(sc[1]));
        [i16x8_mul(v[0], s0), i16x8_mul(v[1], s0), i16x8_mul(v[2], s1), i16x8_mul(v[3], s1)]
    }

    #[inline(always)]
    unsafe fn dot(w: &[v128; 4], q: *const T) -> v128 {
        dot32(w, q)
    }
}

pub(super) unsafe fn qk_rows<F: BlockK, T: ActInt, D: ChunkDot<T>, const R: usize>(w: &[u8], x: &[ActK<T>], out: &mut [f32]) {
    let nb = w.len() / F::BYTES;
    debug_assert_eq!(x.len(), R * nb);
    // Q6_K's values carry their offset of -32, which spares the correction below; each i32 lane
    // gathers 8 products per chunk.
    let signed = F::SIX;
    let span = chunks_per_sum(8, F::max_product(signed), T::MAX);
    let mut acc = [f32x4_splat(0.0); R];
    for b in 0..nb {
        let p = w.as_ptr().add(b * F::BYTES);
        let s = F::scales(std::slice::from_raw_parts(p, F::BYTES));
        let (d, dc) = (f16(s.dc_bits), f16(s.dc_bits >> 16));
        for t0 in (0..QK_K / 32).step_by(span) {
            let mut sums = [i32x4_splat(0); R];
            for t in t0..t0 + span {
                let wt = D::weights::<F>(p, t, [s.sc[2 * t], s.sc[2 * t + 1]], signed);
                for i in 0..R {
                    let q = x.get_unchecked(i * nb + b).qs.as_ptr().add(32 * t);
                    sums[i] = i32x4_add(sums[i], D::dot(&wt, q));
                }
            }
            for i in 0..R {
                let a = x.get_unchecked(i * nb + b);
                let main = f32x4_mul(f32x4_convert_i32x4(sums[i]), f32x4_splat(d * a.d));
                acc[i] = f32x4_add(acc[i], main);
            }
        }
        if !signed {
            let c: [v128; 4] = std::array::from_fn(|h| {
                let c = v128_load(s.c.as_ptr().add(8 * (h / 2)) as *const v128);
                let c = if h % 2 == 0 { i32x4_extend_low_i16x8(c) } else { i32x4_extend_high_i16x8(c) };
                f32x4_convert_i32x4(c)
            });
            for i in 0..R {
                let a = x.get_unchecked(i * nb + b);
                let bs = a.bsums.as_ptr() as *const v128;
                let corr = (0..4).fold(f32x4_splat(0.0), |s, h| f32x4_add(s, f32x4_mul(c[h], v128_load(bs.add(h)))));
                acc[i] = f32x4_sub(acc[i], f32x4_mul(corr, f32x4_splat(dc * a.d)));
            }
        }
    }
    for i in 0..R {
        out[i] = hsum(acc[i]);
    }
}

unsafe fn q32<F: Block32, T: Load16>(w: &[u8], x: &[Act32<T>], rows: usize, out: &mut [f32]) {
    by_rows!(q32_rows::<F, T>(w, x, rows, out))
}

unsafe fn qk<F: BlockK, T: Load16>(w: &[u8], x: &[ActK<T>], rows: usize, out: &mut [f32]) {
    by_rows!(qk_rows::<F, T, Widened>(w, x, rows, out))
}

pub(crate) const KERNELS: Kernels = kernels!(q32, qk, Order::Natural, |_| None);
