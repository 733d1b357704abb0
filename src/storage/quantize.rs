//! f32 values into the block formats of [`quant`](super::quant) (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K),
//! each block's scale (and min) derived from the block's own values, as ggml's reference
//! quantizers derive them.
//!
//! The stored f16 scales are rounded outward (away from zero, the min down) before the values are
//! quantized against them, so the levels always span the block and every value dequantizes within
//! half a step of itself. The one exception is the sign of Q4_0 and of Q6_K's sub-blocks: their
//! levels are -8..7 (-32..31) and the largest magnitude takes -8 (-32), so the other sign reaches
//! one step less and may be off by up to one step.

use half::f16;

use crate::error::{Error, Result};
use crate::storage::quant::{DType, QK, QK_K};

/// The formats [`quantize`] writes.
pub const QUANTIZERS: [DType; 5] = [DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4K, DType::Q6K];

/// Quantize `x` (a whole number of blocks) into `out`, which must hold exactly those blocks.
pub fn quantize(dtype: DType, x: &[f32], out: &mut [u8]) -> Result<()> {
    if !QUANTIZERS.contains(&dtype) {
        return Err(Error::Unsupported(format!("quantizing to {}", dtype.name())));
    }
    let need = dtype.bytes_for(x.len())?;
    if out.len() != need {
        return Err(Error::InvalidArgument(format!("{} values of {} take {need} bytes, not {}", x.len(), dtype.name(), out.len())));
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA were detected.
        unsafe { blocks_avx2(dtype, x, out) };
        return Ok(());
    }
    blocks(dtype, x, out);
    Ok(())
}

/// The same code compiled for AVX2, where rounding is inline rather than a call per value and the
/// loops vectorize; results are bit-identical.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn blocks_avx2(dtype: DType, x: &[f32], out: &mut [u8]) {
    blocks(dtype, x, out)
}

/// Every block of `x` into `out` (checked by [`quantize`]). Direct calls in plain loops, so that
/// the quantizers inline into [`blocks_avx2`] and compile for AVX2 there.
#[inline(always)]
fn blocks(dtype: DType, x: &[f32], out: &mut [u8]) {
    let pairs = x.chunks_exact(dtype.block_size()).zip(out.chunks_exact_mut(dtype.block_bytes()));
    match dtype {
        DType::Q8_0 => {
            for (x, b) in pairs {
                q8_0(x, b)
            }
        }
        DType::Q4_0 => {
            for (x, b) in pairs {
                q4_0(x, b)
            }
        }
        DType::Q4_1 => {
            for (x, b) in pairs {
                q4_1(x, b)
            }
        }
        DType::Q4K => {
            for (x, b) in pairs {
                q4_k(x, b)
            }
        }
        _ => {
            for (x, b) in pairs {
                q6_k(x, b)
            }
        }
    }
}

#[inline(always)]
fn f16_up(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.to_f32() < v {
        f16::from_bits(h.to_bits() + 1)
    } else {
        h
    }
}

/// The largest f16 at most `v`.
#[inline(always)]
fn f16_down(v: f32) -> f16 {
    if v < 0.0 {
        return -f16_up(-v);
    }
    let h = f16::from_f32(v);
    if h.to_f32() > v {
        f16::from_bits(h.to_bits() - 1)
    } else {
        h
    }
}

/// `v` rounded to the nearest integer, halves away from zero, as `f32::round` does, but without
/// its library call: the truncation is one instruction where SSE4.1 is available, and `v - t` is
/// exact.
#[inline(always)]
fn round(v: f32) -> f32 {
    let t = v.trunc();
    if (v - t).abs() >= 0.5 {
        t + v.signum()
    } else {
        t
    }
}

#[inline(always)]
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

#[inline(always)]
fn q8_0(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = f16_up(amax / 127.0);
    let id = inverse(d.to_f32());
    b[..2].copy_from_slice(&d.to_le_bytes());
    for (o, &v) in b[2..2 + QK].iter_mut().zip(x) {
        *o = round(v * id).clamp(-127.0, 127.0) as i8 as u8;
    }
}

#[inline(always)]
fn q4_0(x: &[f32], b: &mut [u8]) {
    // The value of largest magnitude, with its sign, maps to level -8 (d = max / -8, its
    // magnitude rounded up).
    let max = x.iter().fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = if max > 0.0 { -f16_up(max / 8.0) } else { f16_up(-max / 8.0) };
    let id = inverse(d.to_f32());
    b[..2].copy_from_slice(&d.to_le_bytes());
    let q = |v: f32| (round(v * id) + 8.0).clamp(0.0, 15.0) as u8;
    for j in 0..QK / 2 {
        b[2 + j] = q(x[j]) | (q(x[j + QK / 2]) << 4);
    }
}

#[inline(always)]
fn q4_1(x: &[f32], b: &mut [u8]) {
    let lo = x.iter().fold(f32::INFINITY, |m, &v| m.min(v));
    let hi = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let m = f16_down(lo);
    let d = f16_up((hi - m.to_f32()) / 15.0);
    let (m, id) = (m.to_f32(), inverse(d.to_f32()));
    b[..2].copy_from_slice(&d.to_le_bytes());
    b[2..4].copy_from_slice(&f16::from_f32(m).to_le_bytes());
    let q = |v: f32| round((v - m) * id).clamp(0.0, 15.0) as u8;
    for j in 0..QK / 2 {
        b[4 + j] = q(x[j]) | (q(x[j + QK / 2]) << 4);
    }
}

/// Packs the 6-bit scales and mins of a Q4_K/Q5_K block's eight sub-blocks into its 12 bytes (the
/// inverse of [`quant::scale_min_k4`](super::quant::scale_min_k4)).
pub fn pack_scale_min_k4(sc: [u8; 8], m: [u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
    q
}

/// Eight sub-blocks of 32 values, each `y = d * sc * q - dmin * m` with 4-bit `q` and 6-bit `sc`
/// and `m`. The mins are rounded up first (each sub-block's lowest level at or below its lowest
/// value, never above 0), then each sub-block's scale is the smallest multiple of `d` whose 16
/// levels reach its highest value.
#[inline(always)]
fn q4_k(x: &[f32], b: &mut [u8]) {
    const SUB: usize = 32;
    let mut lo = [0.0f32; 8];
    let mut hi = [0.0f32; 8];
    for (j, s) in x.chunks_exact(SUB).enumerate() {
        lo[j] = s.iter().fold(0.0f32, |m, &v| m.min(v));
        hi[j] = s.iter().fold(lo[j], |m, &v| m.max(v));
    }
    let dmin = f16_up(lo.iter().fold(0.0f32, |m, &v| m.max(-v)) / 63.0);
    let idmin = inverse(dmin.to_f32());
    let mins: [u8; 8] = std::array::from_fn(|j| (-lo[j] * idmin).ceil().clamp(0.0, 63.0) as u8);
    let offset: [f32; 8] = std::array::from_fn(|j| dmin.to_f32() * mins[j] as f32);
    let need: [f32; 8] = std::array::from_fn(|j| (hi[j] + offset[j]) / 15.0);
    let d = f16_up(need.iter().fold(0.0f32, |m, &v| m.max(v)) / 63.0);
    let id = inverse(d.to_f32());
    let scales: [u8; 8] = std::array::from_fn(|j| (need[j] * id).ceil().clamp(0.0, 63.0) as u8);
    b[..2].copy_from_slice(&d.to_le_bytes());
    b[2..4].copy_from_slice(&dmin.to_le_bytes());
    b[4..16].copy_from_slice(&pack_scale_min_k4(scales, mins));
    let steps: [f32; 8] = std::array::from_fn(|j| inverse(d.to_f32() * scales[j] as f32));
    let q = |v: f32, j: usize| round((v + offset[j]) * steps[j]).clamp(0.0, 15.0) as u8;
    for pair in 0..QK_K / 64 {
        let qs = &mut b[16 + 32 * pair..16 + 32 * pair + 32];
        for (l, o) in qs.iter_mut().enumerate() {
            let (a, c) = (64 * pair + l, 64 * pair + SUB + l);
            *o = q(x[a], 2 * pair) | (q(x[c], 2 * pair + 1) << 4);
        }
    }
}

/// Sixteen sub-blocks of 16 values, each `y = d * sc * q` with 6-bit `q` in -32..31 and a signed
/// 8-bit `sc`. As in Q4_0, each sub-block's value of largest magnitude, with its sign, takes level
/// -32; its scale is rounded away from zero to a multiple of `d`, so the levels span the sub-block.
#[inline(always)]
fn q6_k(x: &[f32], b: &mut [u8]) {
    const SUB: usize = 16;
    let want: [f32; 16] = std::array::from_fn(|j| {
        let max = x[SUB * j..SUB * j + SUB].iter().fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        max / -32.0
    });
    let d = f16_up(want.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0);
    let id = inverse(d.to_f32());
    let scales: [i8; 16] = std::array::from_fn(|j| ((want[j].abs() * id).ceil().min(127.0) * want[j].signum()) as i8);
    let steps: [f32; 16] = std::array::from_fn(|j| inverse(d.to_f32() * scales[j] as f32));
    // 128 values per half: the low 4 bits of value 32t + l in byte l (+ 32 when t is odd) of
    // `ql`, the low nibble for t < 2; its high 2 bits at bit 2t of byte l of `qh`.
    b[..192].fill(0);
    for (i, &v) in x.iter().enumerate() {
        let q = (round(v * steps[i / SUB]).clamp(-32.0, 31.0) as i32 + 32) as u8;
        let (n, t, l) = (i / 128, i % 128 / 32, i % 32);
        b[64 * n + 32 * (t & 1) + l] |= (q & 0xF) << (4 * (t >> 1));
        b[128 + 32 * n + l] |= (q >> 4) << (2 * t);
    }
    for (o, s) in b[192..208].iter_mut().zip(scales) {
        *o = s as u8;
    }
    b[208..210].copy_from_slice(&d.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::quant::{dequantize, f16_at, scale_min_k4};
    use crate::sampling::Rng;

    #[test]
    fn rounding_is_f32_round() {
        let below_half = 0.5f32.next_down();
        for v in [0.0f32, -0.0, 0.5, below_half, 1.5, 2.5, 7.499_999_5, 1e9, f32::MAX, f32::NAN, f32::INFINITY] {
            for v in [v, -v] {
                assert_eq!(round(v).to_bits(), v.round().to_bits(), "{v}");
            }
        }
    }

    #[test]
    fn the_dispatched_quantizers_write_the_portable_bytes() {
        let mut rng = Rng::new(3);
        let x: Vec<f32> = (0..16 * QK_K).map(|i| (rng.uniform() - 0.5) * if i % 97 == 0 { 40.0 } else { 2.0 }).collect();
        for dtype in QUANTIZERS {
            let n = dtype.bytes_for(x.len()).unwrap();
            let (mut got, mut want) = (vec![0u8; n], vec![0u8; n]);
            quantize(dtype, &x, &mut got).unwrap();
            blocks(dtype, &x, &mut want);
            assert!(got == want, "{dtype:?}");
        }
    }

    fn roundtrip(dtype: DType, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let mut b = vec![0u8; dtype.bytes_for(x.len()).unwrap()];
        quantize(dtype, x, &mut b).unwrap();
        let mut y = vec![0.0; x.len()];
        dequantize(dtype, &b, &mut y);
        (b, y)
    }

    /// One f16 unit of relative rounding, doubled for the f32 arithmetic around it.
    const F16_ROUNDING: f32 = 1.0 / 1024.0;

    /// The error each value of block `b` may have: half of its step (Q4_0: a whole step on the
    /// sign opposite the block's largest magnitude); and checks that the steps are no larger than
    /// the block's values need.
    fn allowed(dtype: DType, x: &[f32], b: &[u8]) -> Vec<f32> {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (lo, hi) = x.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
        let tight = |step: f32, need: f32, what: &str| {
            assert!(step <= need * (1.0 + F16_ROUNDING) + 1e-7, "{dtype:?} {what}: step {step} where {need} suffices");
        };
        match dtype {
            DType::Q8_0 => {
                let d = f16_at(b, 0);
                tight(d, amax / 127.0, "d");
                vec![d / 2.0; QK]
            }
            DType::Q4_0 => {
                let d = f16_at(b, 0);
                tight(d.abs(), amax / 8.0, "d");
                // The largest magnitude is at level -8, so its sign is -sign(d).
                x.iter().map(|&v| if v * d <= 0.0 { d.abs() / 2.0 } else { d.abs() }).collect()
            }
            DType::Q4_1 => {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                assert!(m <= lo, "Q4_1 min {m} above the lowest value {lo}");
                tight(d, (hi - lo + lo.abs() * F16_ROUNDING) / 15.0, "d");
                vec![d / 2.0; QK]
            }
            DType::Q4K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let lo: Vec<f32> = x.chunks(32).map(|s| s.iter().fold(0.0f32, |m, &v| m.min(v))).collect();
                let hi: Vec<f32> = x.chunks(32).zip(&lo).map(|(s, &l)| s.iter().fold(l, |m, &v| m.max(v))).collect();
                tight(dmin, lo.iter().fold(0.0f32, |m, &v| m.max(-v)) / 63.0, "dmin");
                let need = |j: usize| (hi[j] - lo[j] + dmin) / 15.0;
                tight(d, (0..8).map(need).fold(0.0, f32::max) / 63.0, "d");
                (0..QK_K)
                    .map(|i| {
                        let step = d * scale_min_k4(i / 32, &b[4..16]).0 as f32;
                        tight(step, need(i / 32) + d, "sub-block step");
                        step / 2.0
                    })
                    .collect()
            }
            DType::Q6K => {
                let d = f16_at(b, 208);
                let amax: Vec<f32> = x.chunks(16).map(|s| s.iter().fold(0.0f32, |m, v| m.max(v.abs()))).collect();
                tight(d, amax.iter().fold(0.0f32, |m, &v| m.max(v)) / 32.0 / 127.0, "d");
                (0..QK_K)
                    .map(|i| {
                        let step = d * (b[192 + i / 16] as i8) as f32;
                        tight(step.abs(), amax[i / 16] / 32.0 + d, "sub-block step");
                        // The sub-block's largest magnitude is at level -32, so its sign is -sign(step).
                        if x[i] * step <= 0.0 {
                            step.abs() / 2.0
                        } else {
                            step.abs()
                        }
                    })
                    .collect()
            }
            _ => unreachable!(),
        }
    }

    /// Blocks of uniform values at magnitudes from 1e-4 to 10, some all of one sign, some with an
    /// outlier 30 times larger, some with all but a few values zero.
    fn random_block(rng: &mut Rng, n: usize, kind: u64) -> Vec<f32> {
        let scale = 10f32.powf(-4.0 + 5.0 * rng.uniform());
        let mut x: Vec<f32> = (0..n).map(|_| scale * (2.0 * rng.uniform() - 1.0)).collect();
        match kind % 5 {
            1 => x.iter_mut().for_each(|v| *v = v.abs()),
            2 => x.iter_mut().for_each(|v| *v = -v.abs()),
            3 => x[(rng.next_u64() % n as u64) as usize] *= 30.0,
            4 => x.iter_mut().enumerate().filter(|(i, _)| i % 7 != 0).for_each(|(_, v)| *v = 0.0),
            _ => {}
        }
        x
    }

    #[test]
    fn random_blocks_dequantize_within_half_a_step() {
        let mut rng = Rng::new(7);
        for dtype in QUANTIZERS {
            let bs = dtype.block_size();
            for kind in 0..400 {
                let x = random_block(&mut rng, bs, kind);
                let (b, y) = roundtrip(dtype, &x);
                let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                for (i, ((&v, &got), tol)) in x.iter().zip(&y).zip(allowed(dtype, &x, &b)).enumerate() {
                    let err = (v - got).abs();
                    assert!(err <= tol + 1e-6 * amax, "{dtype:?} block {kind} value {i}: {v} -> {got}, error {err} > {tol}");
                }
            }
        }
    }

    #[test]
    fn values_on_the_levels_come_back_exactly() {
        let mut rng = Rng::new(3);
        for _ in 0..200 {
            let d = f16::from_f32(2f32.powi(-12) + rng.uniform() / 8.0).to_f32();
            let m = f16::from_f32(-rng.uniform()).to_f32();
            let level = |lo: i32, hi: i32, rng: &mut Rng| lo + (rng.next_u64() % (hi - lo + 1) as u64) as i32;
            // Each block holds its extreme level, so the scale the quantizer derives is `d`.
            let mut q8: Vec<f32> = (0..QK).map(|_| level(-127, 127, &mut rng) as f32 * d).collect();
            q8[5] = -127.0 * d;
            let mut q40: Vec<f32> = (0..QK).map(|_| level(-8, 7, &mut rng) as f32 * d).collect();
            q40[9] = -8.0 * d;
            let mut q41: Vec<f32> = (0..QK).map(|_| m + level(0, 15, &mut rng) as f32 * d).collect();
            (q41[0], q41[31]) = (m, m + 15.0 * d);
            for (dtype, x) in [(DType::Q8_0, q8), (DType::Q4_0, q40), (DType::Q4_1, q41)] {
                let (b, y) = roundtrip(dtype, &x);
                assert_eq!(f16_at(&b, 0).abs(), d, "{dtype:?} scale");
                assert_eq!(y, x, "{dtype:?}");
            }
        }
    }

    #[test]
    fn zero_blocks_stay_zero() {
        for dtype in QUANTIZERS {
            let (_, y) = roundtrip(dtype, &vec![0.0; 2 * dtype.block_size()]);
            assert!(y.iter().all(|&v| v == 0.0), "{dtype:?}");
        }
    }

    #[test]
    fn sizes_and_formats_are_checked() {
        assert!(quantize(DType::Q4_0, &[0.0; 32], &mut [0u8; 17]).is_err());
        assert!(quantize(DType::Q4_0, &[0.0; 33], &mut [0u8; 18]).is_err());
        let err = quantize(DType::Q5K, &[0.0; 256], &mut [0u8; 176]).unwrap_err().to_string();
        assert!(err.contains("q5_k"), "{err}");
    }

    #[test]
    fn scale_min_packing_roundtrips() {
        let sc = [1, 2, 63, 4, 33, 17, 63, 0];
        let m = [5, 0, 7, 62, 48, 1, 31, 63];
        let q = pack_scale_min_k4(sc, m);
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &q), (sc[j], m[j]), "sub-block {j}");
        }
    }
}
