//! x86-64 kernels for AVX2 + FMA + F16C: weight values are decoded to 32 bytes in a register and
//! multiplied with 32 activation bytes by `maddubs` (unsigned weights times signed activations,
//! summed in pairs to i16), then widened by `madd` with the scale or with ones.

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

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q32_rows<F: Block32, const R: usize>(w: &[u8], x: &[BlockQ8], out: &mut [f32]) {
    let nb = w.len() / F::BYTES;
    debug_assert_eq!(x.len(), R * nb);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut mins = [0.0f32; R];
    for b in 0..nb {
        let p = w.as_ptr().add(b * F::BYTES);
        let (d, m) = f16x2(F::dm_bits(std::slice::from_raw_parts(p, 4)));
        let m = F::min(d, m);
        let v = values32::<F>(p);
        // maddubs wants unsigned weights: Q8_0 moves each weight's sign onto its activation.
        let vu = if F::SIGNED { _mm256_sign_epi8(v, v) } else { v };
        for i in 0..R {
            let a = x.get_unchecked(i * nb + b);
            let q = load(a.qs.as_ptr() as *const u8);
            let q = if F::SIGNED { _mm256_sign_epi8(q, v) } else { q };
            let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(vu, q), ones);
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
unsafe fn qk_rows<F: BlockK, const R: usize>(w: &[u8], x: &[BlockQ8K], out: &mut [f32]) {
    let nb = w.len() / F::BYTES;
    debug_assert_eq!(x.len(), R * nb);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let p = w.as_ptr().add(b * F::BYTES);
        let s = F::scales(std::slice::from_raw_parts(p, F::BYTES));
        let (d, dc) = f16x2(s.dc_bits);
        let mut sums = [_mm256_setzero_si256(); R];
        for t in 0..QK_K / 32 {
            let v = chunk_k::<F>(p, t);
            let sc = _mm256_set_m128i(_mm_set1_epi16(s.sc[2 * t + 1]), _mm_set1_epi16(s.sc[2 * t]));
            for i in 0..R {
                let q = load(x.get_unchecked(i * nb + b).qs.as_ptr().add(32 * t) as *const u8);
                sums[i] = _mm256_add_epi32(sums[i], _mm256_madd_epi16(_mm256_maddubs_epi16(v, q), sc));
            }
        }
        let c = load(s.c.as_ptr() as *const u8);
        for i in 0..R {
            let a = x.get_unchecked(i * nb + b);
            let corr = _mm256_madd_epi16(c, load(a.bsums.as_ptr() as *const u8));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[i]), _mm256_set1_ps(d * a.d), acc[i]);
            acc[i] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(corr), _mm256_set1_ps(dc * a.d), acc[i]);
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
unsafe fn q32<F: Block32>(w: &[u8], x: &[BlockQ8], rows: usize, out: &mut [f32]) {
    by_rows!(q32_rows::<F>(w, x, rows, out))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk<F: BlockK>(w: &[u8], x: &[BlockQ8K], rows: usize, out: &mut [f32]) {
    by_rows!(qk_rows::<F>(w, x, rows, out))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float<F: Float>(w: &[u8], x: &[f32], rows: usize, out: &mut [f32]) {
    by_rows!(float_rows::<F>(w, x, rows, out))
}

pub(crate) const KERNELS: Kernels = Kernels {
    q32: |d| select!(q32: d, q32),
    qk: |d| select!(qk: d, qk),
    float: |d| select!(float: d, float),
};

/// Whether this CPU runs these kernels.
pub(crate) fn detected() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}
