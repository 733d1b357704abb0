//! Float-weight kernels and the f32 helpers of the CPU backend, for AVX2 + FMA: every x86 set
//! shares them, since VNNI adds nothing to float arithmetic.

use std::arch::x86_64::*;

use super::super::*;
use super::{hsum, prefetch, PREFETCH_AHEAD};
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

/// How many sums each row's dot runs side by side: the eight values from `8 c` on go to sum
/// `c % CHAINS`, each sum gathering its vectors in the order of `c`, and the sums meet at the end.
/// With one sum a row's fused multiply-adds waited out each other's latency, which held a decode
/// row of float weights to well under the rate its loads allow. Two rather than four so that six
/// rows' sums fit in registers (see [`GROUP`]): four sped a decode row further but slowed a batch
/// of five or nine rows. Every batch size keeps the same sums, so a row gets the same bits in any
/// batch.
const CHAINS: usize = 2;

/// Activation rows whose sums stay in registers while a vector of weights is applied to them:
/// their `GROUP * CHAINS` sums, the weights and an activation vector fit AVX2's 16 registers.
const GROUP: usize = 6;

/// Eight-value vectors of K taken by every group of rows in turn when there are more rows than a
/// [`GROUP`]: 1,024 values, whose weights are read again from L1 for the next group.
const TILE_VECTORS: usize = 128;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_rows<F: Float, const R: usize>(w: &[u8], x: &[f32], out: &mut [f32]) {
    let k = w.len() / F::BYTES;
    debug_assert_eq!(x.len(), R * k);
    let vectors = k / 8;
    let mut acc = [[_mm256_setzero_ps(); CHAINS]; R];
    let tile = if R <= GROUP { vectors.max(1) } else { TILE_VECTORS };
    for t0 in (0..vectors).step_by(tile) {
        let t = t0..(t0 + tile).min(vectors);
        for g0 in (0..R).step_by(GROUP) {
            let (xg, accg) = (x.as_ptr().add(g0 * k), &mut acc[g0..]);
            macro_rules! group {
                ($($n:literal)*) => {
                    match (R - g0).min(GROUP) {
                        $($n => float_group::<F, $n>(w.as_ptr(), xg, k, t.clone(), accg),)*
                        _ => unreachable!("a group holds 1..=GROUP rows"),
                    }
                };
            }
            group!(1 2 3 4 5 6);
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        let sum = acc[1..].iter().fold(acc[0], |s, &a| _mm256_add_ps(s, a));
        let tail: f32 = (8 * vectors..k).map(|j| F::value(w, j) * x[i * k + j]).sum();
        out[i] = hsum(sum) + tail;
    }
}

/// Adds vectors `t` of weight row `w` times those of the `G` activation rows from `x` (rows of
/// `k`) to the first `G` rows' sums of `acc`, held in registers meanwhile.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_group<F: Float, const G: usize>(
    w: *const u8,
    x: *const f32,
    k: usize,
    t: std::ops::Range<usize>,
    acc: &mut [[__m256; CHAINS]],
) {
    debug_assert!(t.start.is_multiple_of(CHAINS));
    let mut sums: [[__m256; CHAINS]; G] = std::array::from_fn(|i| acc[i]);
    let mut step = |c: usize, u: usize| {
        let wv = float8::<F>(w, 8 * c);
        for (i, sums) in sums.iter_mut().enumerate() {
            sums[u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.add(i * k + 8 * c)), sums[u]);
        }
    };
    let mut c = t.start;
    while c + CHAINS <= t.end {
        prefetch(w.add(8 * c * F::BYTES).wrapping_add(PREFETCH_AHEAD), 8 * CHAINS * F::BYTES);
        for u in 0..CHAINS {
            step(c + u, u);
        }
        c += CHAINS;
    }
    for u in 0..CHAINS {
        if c + u < t.end {
            step(c + u, u);
        }
    }
    acc[..G].copy_from_slice(&sums);
}

/// The dots of `R` query rows (`q`, back to back) with the key of each of `slots` (key `t` is
/// `k[t * stride..]`, as long as a query row): `out[i * slots.len() + j]` for query `i` and slot
/// `j`. The queries' sums run side by side, each in its own register, so one key load serves them
/// all and no sum waits on the one before; each is still summed as a lone one would be, so a
/// row's scores do not depend on how many rows shared its keys.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn key_dots<const R: usize>(q: &[f32], k: &[f32], stride: usize, slots: &[usize], out: &mut [f32]) {
    let hd = q.len() / R;
    let main = hd / 8 * 8;
    let n = slots.len();
    assert!(out.len() == R * n && slots.iter().all(|&t| t * stride + hd <= k.len()));
    for (j, &t) in slots.iter().enumerate() {
        let key = &k[t * stride..t * stride + hd];
        let mut acc = [_mm256_setzero_ps(); R];
        for c in (0..main).step_by(8) {
            // SAFETY: c + 8 <= main <= hd, within the key and each query row.
            unsafe {
                let kv = _mm256_loadu_ps(key.as_ptr().add(c));
                for i in 0..R {
                    acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i * hd + c)), kv, acc[i]);
                }
            }
        }
        for i in 0..R {
            let tail: f32 = (main..hd).map(|d| q[i * hd + d] * key[d]).sum();
            out[i * n + j] = hsum(acc[i]) + tail;
        }
    }
}

/// `out[i]`, the `i`-th of `R` rows back to back, plus the values of `slots` (value `t` is
/// `v[t * stride..]`, as long as a row) weighted by `w[i * slots.len() + j]`, added slot after slot;
/// over the common length's whole 8-lane vectors; returns how many values of a row that was,
/// leaving the rest to the caller. Two vectors of every row gather in registers over all the slots
/// (one where more rows leave too few registers), where adding one slot at a time to `out` would
/// load and store them per slot.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn weighted_values<const R: usize>(w: &[f32], v: &[f32], stride: usize, slots: &[usize], out: &mut [f32]) -> usize {
    let hd = out.len() / R;
    let main = hd / 8 * 8;
    let n = slots.len();
    assert!(w.len() == R * n && slots.iter().all(|&t| t * stride + hd <= v.len()));
    let wide = if R <= 6 { 16 } else { 8 };
    let mut c = 0;
    while c < main {
        let vectors = if c + wide <= main { wide / 8 } else { 1 };
        // SAFETY: c + 8 * vectors <= main <= hd, within each row of out and each value; i * n + j < R * n.
        unsafe {
            let o = out.as_mut_ptr().add(c);
            let mut acc: [[__m256; R]; 2] = std::array::from_fn(|u| {
                std::array::from_fn(|i| if u < vectors { _mm256_loadu_ps(o.add(i * hd + 8 * u)) } else { _mm256_setzero_ps() })
            });
            for (j, &t) in slots.iter().enumerate() {
                let x = v.as_ptr().add(t * stride + c);
                let x = [_mm256_loadu_ps(x), if vectors == 2 { _mm256_loadu_ps(x.add(8)) } else { _mm256_setzero_ps() }];
                for i in 0..R {
                    let a = _mm256_set1_ps(*w.get_unchecked(i * n + j));
                    for u in 0..vectors {
                        acc[u][i] = _mm256_fmadd_ps(a, x[u], acc[u][i]);
                    }
                }
            }
            for u in 0..vectors {
                for i in 0..R {
                    _mm256_storeu_ps(o.add(i * hd + 8 * u), acc[u][i]);
                }
            }
        }
        c += 8 * vectors;
    }
    main
}

/// Each row of `w` (rows of `n`) times `scale`, turned into softmax weights: `e^(x - max) / Σ`.
/// The exponentials eight at a time ([`exp8`]) where a call of the C library's per value cost
/// more than the rest of the attention of a slot.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn softmax_rows(w: &mut [f32], n: usize, scale: f32) {
    let main = n / 8 * 8;
    let sv = _mm256_set1_ps(scale);
    for row in w.chunks_exact_mut(n.max(1)) {
        // SAFETY: every vector lies in 0..main <= n, within the row; the tail's in `last`. The
        // pointer is taken afresh after each use of `row` itself.
        unsafe {
            let p = row.as_mut_ptr();
            let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
            for c in (0..main).step_by(8) {
                let x = _mm256_mul_ps(_mm256_loadu_ps(p.add(c)), sv);
                _mm256_storeu_ps(p.add(c), x);
                mv = _mm256_max_ps(mv, x);
            }
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), mv);
            row[main..].iter_mut().for_each(|x| *x *= scale);
            let max = lanes.iter().chain(&row[main..]).cloned().fold(f32::NEG_INFINITY, f32::max);
            let (maxv, mut sum) = (_mm256_set1_ps(max), _mm256_setzero_ps());
            let p = row.as_mut_ptr();
            for c in (0..main).step_by(8) {
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(c)), maxv));
                _mm256_storeu_ps(p.add(c), e);
                sum = _mm256_add_ps(sum, e);
            }
            let mut last = [f32::NEG_INFINITY; 8];
            last[..n - main].copy_from_slice(&row[main..]);
            _mm256_storeu_ps(last.as_mut_ptr(), exp8(_mm256_sub_ps(_mm256_loadu_ps(last.as_ptr()), maxv)));
            row[main..].copy_from_slice(&last[..n - main]);
            let total = row[main..].iter().fold(hsum(sum), |s, x| s + x);
            let inv = _mm256_set1_ps(1.0 / total);
            let p = row.as_mut_ptr();
            for c in (0..main).step_by(8) {
                _mm256_storeu_ps(p.add(c), _mm256_mul_ps(_mm256_loadu_ps(p.add(c)), inv));
            }
            row[main..].iter_mut().for_each(|x| *x /= total);
        }
    }
}

/// `e^x` for eight lanes, to within a few ulp of f32 for `x` in [-87, 88] (clamped there, which
/// keeps `2^n` a normal number): `2^n * e^r` with `r = x - n ln 2` in [-0.35, 0.35], where a
/// degree-7 Taylor polynomial is off by under 1e-8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0)), _mm256_set1_ps(88.0));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)));
    // ln 2 in two parts, so that n * ln 2 is subtracted without rounding away r's low bits.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm256_set1_ps(1.0 / 5040.0);
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127))));
    _mm256_mul_ps(p, two_n)
}

/// `out = g / (1 + e^-(g (a + b g^2))) * u` (see `Activation::sigmoid_coefficients`) over the
/// common length's whole 8-lane vectors; returns how many values that was, leaving the rest to
/// the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn gated_mul(g: &[f32], u: &[f32], out: &mut [f32], (a, b): (f32, f32)) -> usize {
    let main = out.len().min(g.len()).min(u.len()) / 8 * 8;
    let one = _mm256_set1_ps(1.0);
    let (av, bv) = (_mm256_set1_ps(a), _mm256_set1_ps(b));
    for j in (0..main).step_by(8) {
        // SAFETY: j + 8 <= main, within all three slices.
        unsafe {
            let gv = _mm256_loadu_ps(g.as_ptr().add(j));
            let z = _mm256_mul_ps(gv, _mm256_fmadd_ps(bv, _mm256_mul_ps(gv, gv), av));
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), z));
            let s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            _mm256_storeu_ps(out.as_mut_ptr().add(j), _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr().add(j))));
        }
    }
    main
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn float<F: Float>(w: &[u8], x: &[f32], rows: usize, out: &mut [f32]) {
    by_rows!(float_rows::<F>(w, x, rows, out))
}
