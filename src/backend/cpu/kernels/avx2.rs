//! x86-64 kernels for AVX2 + FMA + F16C: weight values are decoded to 32 bytes in a register. With
//! 8-bit activations they are multiplied with 32 activation bytes by `maddubs` (unsigned weights
//! times signed activations, summed in pairs to i16), then widened by `madd` with the scale or
//! with ones; with 16-bit activations they are widened to i16 and multiplied by their scale once
//! per block, and each activation row costs two `madd`s.

// Kernels index several per-row arrays by the same row.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::*;

/// Both f16 halves of `bits` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16x2(bits: u32) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// 32 unaligned bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// Values 0..16 from the low nibbles and 16..32 from the high nibbles of the 16 bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p as *const __m128i);
    let lo = _mm_and_si128(q, _mm_set1_epi8(0xF));
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0xF));
    _mm256_set_m128i(hi, lo)
}

/// 0x10 in byte `j` where bit `j` of the 32 bits at `p` is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    let bits = _mm256_set1_epi32((p as *const i32).read_unaligned());
    let spread = _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0);
    let bytes = _mm256_shuffle_epi8(bits, spread);
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The 32 values of a 32-value block (signed for Q8_0, unsigned otherwise).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values32<F: Block32>(b: *const u8) -> __m256i {
    if F::SIGNED {
        return load(b.add(F::QS));
    }
    let v = nibbles(b.add(F::QS));
    match F::QH {
        Some(qh) => _mm256_or_si256(v, fifth_bits(b.add(qh))),
        None => v,
    }
}

/// Values `32 t..32 t + 32` (unsigned) of a K-quant block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunk_k<F: BlockK>(b: *const u8, t: usize) -> __m256i {
    let low4 = _mm256_set1_epi8(0xF);
    if F::SIX {
        let (n, u) = (t / 4, t % 4);
        let ql = load(b.add(F::QS + 64 * n + 32 * (u & 1)));
        let ql = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (u as i32 >> 1))), low4);
        let qh = load(b.add(F::QH.unwrap() + 32 * n));
        let qh = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * u as i32)), _mm256_set1_epi8(3));
        return _mm256_or_si256(ql, _mm256_slli_epi16(qh, 4));
    }
    let q = load(b.add(F::QS + 32 * (t / 2)));
    let v = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(4 * (t as i32 & 1))), low4);
    match F::QH {
        Some(qh) => {
            let bit = _mm256_set1_epi8(1 << t);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(load(b.add(qh)), bit), bit);
            _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
        }
        None => v,
    }
}

/// How 32 weight values meet 32 activations of one integer type.
trait Dot: ActInt {
    /// 32 weight values as the dot wants them.
    type W: Copy;
    /// Whether weights are widened to 16 bits (and so may be signed, with any scale applied).
    const WIDE: bool;
    /// `v` holds 32 values as bytes, signed where `signed`; the first 16 take scale `sc.0` and the
    /// last 16 `sc.1`, or none.
    unsafe fn weights(v: __m256i, sc: Option<(i16, i16)>, signed: bool) -> Self::W;
    /// Eight i32 partial sums of the 32 products with the activations at `q`.
    unsafe fn dot(w: Self::W, q: *const Self) -> __m256i;
}

/// Bytes for `maddubs`, which multiplies unsigned by signed: a signed weight's sign moves onto
/// its activation. The scale (or ones) widens the pair sums in `madd`.
#[derive(Clone, Copy)]
struct Bytes {
    v: __m256i,
    sign: Option<__m256i>,
    sc: __m256i,
}

impl Dot for i8 {
    type W = Bytes;
    const WIDE: bool = false;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weights(v: __m256i, sc: Option<(i16, i16)>, signed: bool) -> Bytes {
        let sc = sc.map_or(_mm256_set1_epi16(1), |(lo, hi)| _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)));
        match signed {
            true => Bytes { v: _mm256_sign_epi8(v, v), sign: Some(v), sc },
            false => Bytes { v, sign: None, sc },
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot(w: Bytes, q: *const i8) -> __m256i {
        let q = load(q as *const u8);
        let q = w.sign.map_or(q, |s| _mm256_sign_epi8(q, s));
        _mm256_madd_epi16(_mm256_maddubs_epi16(w.v, q), w.sc)
    }
}

impl Dot for i16 {
    type W = [__m256i; 2];
    const WIDE: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weights(v: __m256i, sc: Option<(i16, i16)>, signed: bool) -> [__m256i; 2] {
        let (lo, hi) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let w = match signed {
            true => [_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi)],
            false => [_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi)],
        };
        match sc {
            Some((lo, hi)) => [_mm256_mullo_epi16(w[0], _mm256_set1_epi16(lo)), _mm256_mullo_epi16(w[1], _mm256_set1_epi16(hi))],
            None => w,
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot(w: [__m256i; 2], q: *const i16) -> __m256i {
        let lo = _mm256_madd_epi16(w[0], load(q as *const u8));
        _mm256_add_epi32(lo, _mm256_madd_epi16(w[1], load(q.add(16) as *const u8)))
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q32_rows<F: Block32, T: Dot, const R: usize>(w: &[u8], x: &[Act32<T>], out: &mut [f32]) {
    let nb = w.len() / F::BYTES;
    debug_assert_eq!(x.len(), R * nb);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut mins = [0.0f32; R];
    for b in 0..nb {
        let p = w.as_ptr().add(b * F::BYTES);
        let (d, m) = f16x2(F::dm_bits(std::slice::from_raw_parts(p, 4)));
        let m = F::min(d, m);
        let v = T::weights(values32::<F>(p), None, F::SIGNED);
        for i in 0..R {
            let a = x.get_unchecked(i * nb + b);
            let dot = T::dot(v, a.qs.as_ptr());
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d * a.d), acc[i]);
            if !F::SIGNED {
                mins[i] += m * a.s;
            }
        }
    }
    for i in 0..R {
        out[i] = hsum(acc[i]) + mins[i];
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_rows<F: BlockK, T: Dot, const R: usize>(w: &[u8], x: &[ActK<T>], out: &mut [f32]) {
    let nb = w.len() / F::BYTES;
    debug_assert_eq!(x.len(), R * nb);
    // Widened Q6_K values can carry their offset of -32, which spares the correction below.
    let signed = F::SIX && T::WIDE;
    // Each i32 lane gathers 4 products per chunk.
    let span = chunks_per_sum(4, F::max_product(signed), T::MAX);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let p = w.as_ptr().add(b * F::BYTES);
        let s = F::scales(std::slice::from_raw_parts(p, F::BYTES));
        let (d, dc) = f16x2(s.dc_bits);
        for t0 in (0..QK_K / 32).step_by(span) {
            let mut sums = [_mm256_setzero_si256(); R];
            for t in t0..t0 + span {
                let v = chunk_k::<F>(p, t);
                let v = if signed { _mm256_sub_epi8(v, _mm256_set1_epi8(32)) } else { v };
                let v = T::weights(v, Some((s.sc[2 * t], s.sc[2 * t + 1])), signed);
                for i in 0..R {
                    let q = x.get_unchecked(i * nb + b).qs.as_ptr().add(32 * t);
                    sums[i] = _mm256_add_epi32(sums[i], T::dot(v, q));
                }
            }
            for i in 0..R {
                let a = x.get_unchecked(i * nb + b);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[i]), _mm256_set1_ps(d * a.d), acc[i]);
            }
        }
        if !signed {
            let c = |h: usize| _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_loadu_si128(s.c.as_ptr().add(8 * h) as *const __m128i)));
            let c = [c(0), c(1)];
            for i in 0..R {
                let a = x.get_unchecked(i * nb + b);
                let bs = a.bsums.as_ptr();
                let corr = _mm256_fmadd_ps(c[0], _mm256_loadu_ps(bs), _mm256_mul_ps(c[1], _mm256_loadu_ps(bs.add(8))));
                acc[i] = _mm256_fnmadd_ps(corr, _mm256_set1_ps(dc * a.d), acc[i]);
            }
        }
    }
    for i in 0..R {
        out[i] = hsum(acc[i]);
    }
}

/// Eight weights from element `j` on, as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float8<F: Float>(w: *const u8, j: usize) -> __m256 {
    let p = w.add(j * F::BYTES);
    match F::DTYPE {
        DType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        DType::BF16 => _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)),
            16,
        )),
        _ => _mm256_loadu_ps(p as *const f32),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_rows<F: Float, const R: usize>(w: &[u8], x: &[f32], out: &mut [f32]) {
    let k = w.len() / F::BYTES;
    debug_assert_eq!(x.len(), R * k);
    let mut acc = [_mm256_setzero_ps(); R];
    let main = k / 8 * 8;
    for c in 0..k / 8 {
        let wv = float8::<F>(w.as_ptr(), 8 * c);
        for i in 0..R {
            acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i * k + 8 * c)), acc[i]);
        }
    }
    for i in 0..R {
        let tail: f32 = (main..k).map(|j| F::value(w, j) * x[i * k + j]).sum();
        out[i] = hsum(acc[i]) + tail;
    }
}

/// `dot(a, b)` of two f32 slices of equal length.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut out = [0.0];
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    // SAFETY: a is n f32 in bytes, and b holds n values for the one row.
    unsafe { float_rows::<F32, 1>(std::slice::from_raw_parts(a.as_ptr() as *const u8, 4 * n), b, &mut out) };
    out[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q32<F: Block32, T: Dot>(w: &[u8], x: &[Act32<T>], rows: usize, out: &mut [f32]) {
    by_rows!(q32_rows::<F, T>(w, x, rows, out))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk<F: BlockK, T: Dot>(w: &[u8], x: &[ActK<T>], rows: usize, out: &mut [f32]) {
    by_rows!(qk_rows::<F, T>(w, x, rows, out))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float<F: Float>(w: &[u8], x: &[f32], rows: usize, out: &mut [f32]) {
    by_rows!(float_rows::<F>(w, x, rows, out))
}

pub(crate) const KERNELS: Kernels = kernels!(q32, qk, |d| select!(float: d, float));

/// Whether this CPU runs these kernels.
pub(crate) fn detected() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}
