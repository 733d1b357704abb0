//! The CPU matmul kernels of every weight format against the f32 reference (`quant::dequantize`,
//! dotted in f64), on random blocks, odd shapes and batch sizes 1 to 64, for both the portable and
//! the best kernels of this machine.
//!
//! Tolerance. Quantized weights are dotted with activations quantized to two 8-bit parts per block,
//! `x ≈ d q + d' q'` (`d = max|x| / 127` over the 32 or 256 activations of the block, `q'` the
//! remainder quantized the same way), so each activation is off by at most `d' / 2 <= d / 508` and a
//! dot product by at most `Σ_j |w_j| d_j / 508`. The test allows exactly that bound plus
//! `2e-5 Σ_j |w_j x_j|` for f32 rounding. Float weights see no activation quantization and are
//! allowed `1e-5 Σ_j |w_j x_j|`. The portable and best kernels compute the same integer sums, so
//! they must agree to `1e-5 Σ_j |w_j x_j|`. At `Precision::Fast` (one 8-bit part) each activation is
//! off by at most `d / 2`, and the bound is scaled accordingly.

use half::{bf16, f16};
use saguaro::backend::cpu::{matmul_with, CpuPool, KernelPath, Precision};
use saguaro::model::quant::{self, DType};
use saguaro::model::weights::{Bytes, Weight};

/// splitmix64: a reproducible stream of random numbers without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// Heavy-tailed like real activations: mostly small, some up to 20x larger.
    fn activation(&mut self) -> f32 {
        let v = self.uniform();
        if self.next().is_multiple_of(64) {
            20.0 * v
        } else {
            v
        }
    }
}

/// Offsets of the f16 scale fields of each format's block, set to sane values after random bytes.
fn scale_fields(dtype: DType) -> &'static [usize] {
    match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
        DType::Q6K => &[208],
        _ => &[],
    }
}

fn random_weight(dtype: DType, n: usize, k: usize, rng: &mut Rng) -> Weight {
    let mut data = vec![0u8; dtype.bytes_for(n * k).unwrap()];
    match dtype {
        DType::F32 => data
            .chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&rng.uniform().to_le_bytes())),
        DType::F16 => data
            .chunks_exact_mut(2)
            .for_each(|c| c.copy_from_slice(&f16::from_f32(rng.uniform()).to_le_bytes())),
        DType::BF16 => data
            .chunks_exact_mut(2)
            .for_each(|c| c.copy_from_slice(&bf16::from_f32(rng.uniform()).to_le_bytes())),
        _ => {
            data.iter_mut().for_each(|b| *b = rng.next() as u8);
            for block in data.chunks_exact_mut(dtype.block_bytes()) {
                for &at in scale_fields(dtype) {
                    let s = rng.uniform() * 0.05;
                    block[at..at + 2].copy_from_slice(&f16::from_f32(s).to_le_bytes());
                }
            }
        }
    }
    Weight::new(dtype, n, k, Bytes::from_vec(data)).unwrap()
}

/// The reference dot product and the error it allows (see the module doc).
fn reference(dtype: DType, precision: Precision, w: &[f32], x: &[f32]) -> (f64, f64) {
    let act_block = match dtype {
        DType::F32 | DType::F16 | DType::BF16 => None,
        DType::Q4K | DType::Q5K | DType::Q6K => Some(quant::QK_K),
        _ => Some(quant::QK),
    };
    let exact: f64 = w.iter().zip(x).map(|(&w, &x)| w as f64 * x as f64).sum();
    let magnitude: f64 = w.iter().zip(x).map(|(&w, &x)| (w as f64 * x as f64).abs()).sum();
    let Some(bs) = act_block else {
        return (exact, 1e-5 * magnitude + 1e-6);
    };
    let per_d = match precision {
        Precision::Exact => 508.0,
        Precision::Fast => 2.0,
    };
    let rounding: f64 = w
        .chunks(bs)
        .zip(x.chunks(bs))
        .map(|(w, x)| {
            let d = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
            w.iter().map(|&w| (w as f64).abs()).sum::<f64>() * d / per_d
        })
        .sum();
    (exact, rounding + 2e-5 * magnitude + 1e-6)
}

const FORMATS: [DType; 11] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::F16,
    DType::BF16,
    DType::F32,
];

fn check_format(dtype: DType, precision: Precision, pool: &CpuPool) {
    let mut rng = Rng(dtype.block_bytes() as u64 * 7919 + 1);
    let n = 37;
    // Odd block counts; float rows also get lengths that leave a SIMD tail.
    let ks: Vec<usize> = match dtype.block_size() {
        1 => vec![43, 117],
        bs => vec![3 * bs, 5 * bs],
    };
    for k in ks {
        let w = random_weight(dtype, n, k, &mut rng);
        let wf = w.to_f32();
        for m in [1, 5, 16, 64] {
            let mut x: Vec<f32> = (0..m * k).map(|_| rng.activation()).collect();
            // An all-zero activation block must not turn into NaNs.
            x[..dtype.block_size().max(32).min(k)].fill(0.0);
            let mut got = [vec![0.0; m * n], vec![0.0; m * n]];
            matmul_with(pool, KernelPath::Scalar, precision, &x, m, &w, &mut got[0]);
            matmul_with(pool, KernelPath::Best, precision, &x, m, &w, &mut got[1]);
            for i in 0..m {
                for r in 0..n {
                    let (wr, xi) = (&wf[r * k..(r + 1) * k], &x[i * k..(i + 1) * k]);
                    let (want, tol) = reference(dtype, precision, wr, xi);
                    let (scalar, best) = (got[0][i * n + r] as f64, got[1][i * n + r] as f64);
                    let at = format!("{dtype:?} {precision:?} k={k} m={m} row {i} col {r}");
                    assert!((scalar - want).abs() <= tol, "{at}: scalar {scalar} vs {want} (tol {tol})");
                    assert!((best - want).abs() <= tol, "{at}: best {best} vs {want} (tol {tol})");
                    let magnitude: f64 = wr.iter().zip(xi).map(|(&w, &x)| (w as f64 * x as f64).abs()).sum();
                    let agree = 1e-5 * magnitude + 1e-6;
                    assert!((scalar - best).abs() <= agree, "{at}: scalar {scalar} vs best {best}");
                }
            }
        }
    }
}

#[test]
fn every_format_matches_the_reference() {
    let pool = CpuPool::new(3).unwrap();
    for dtype in FORMATS {
        check_format(dtype, Precision::Exact, &pool);
    }
}

#[test]
fn fast_precision_stays_within_its_bound() {
    let pool = CpuPool::new(2).unwrap();
    for dtype in FORMATS {
        check_format(dtype, Precision::Fast, &pool);
    }
}

#[test]
fn single_thread_and_wide_rows() {
    // One thread, and rows long enough that activation blocks vary widely in scale.
    let pool = CpuPool::new(1).unwrap();
    let mut rng = Rng(42);
    for dtype in [DType::Q4K, DType::Q6K, DType::Q8_0, DType::Q5_0, DType::Q4_1] {
        let (n, k, m) = (9, 15 * dtype.block_size().max(256), 3);
        let w = random_weight(dtype, n, k, &mut rng);
        let wf = w.to_f32();
        let x: Vec<f32> = (0..m * k).map(|j| rng.activation() * (1 + j % 97) as f32).collect();
        let mut out = vec![0.0; m * n];
        matmul_with(&pool, KernelPath::Best, Precision::Exact, &x, m, &w, &mut out);
        for i in 0..m {
            for r in 0..n {
                let (want, tol) = reference(dtype, Precision::Exact, &wf[r * k..(r + 1) * k], &x[i * k..(i + 1) * k]);
                let got = out[i * n + r] as f64;
                assert!((got - want).abs() <= tol, "{dtype:?} row {i} col {r}: {got} vs {want} (tol {tol})");
            }
        }
    }
}
